"""The one node's kubelet: it runs each pod's command as a process on this
machine (cwd = ``workingDir``, stdout and stderr into the pod's log) and
reports Pending -> Running -> Succeeded/Failed with the container's
``terminated.exitCode`` (128+signal when a signal killed it).  An image
named ``missing/...`` never pulls; a pod that fits on no node stays Pending."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING

from .container_env import _NotReady, container_env, expand
from .objects import NODE, POD_IP, _now
from .scheduling import unschedulable

if TYPE_CHECKING:
    from .store import Store

UNSCHEDULABLE_IMAGE_PREFIX = "missing/"

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _die_with_server() -> None:
    # PR_SET_PDEATHSIG: a pod's process dies with the server that runs it
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_container(proc: subprocess.Popen, grace: float) -> None:
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        kill_group(proc)


def _set_container(pod: dict, state: dict, ready: bool = False) -> None:
    container = pod["spec"]["containers"][0]
    pod["status"]["containerStatuses"] = [{
        "name": container["name"], "image": container["image"], "imageID": "", "ready": ready,
        "restartCount": 0, "started": "running" in state, "state": state, "lastState": {}}]


def run_pod(store: Store, namespace: str, name: str, uid: str) -> None:
    """The kubelet of one pod: schedule it, pull its image, start its command, report its end."""
    time.sleep(0.005)
    with store.lock:
        pod = store._current(namespace, name, uid)
        if pod is None:
            return
        why = unschedulable(pod, store.capacity)
        if why:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": why, "lastTransitionTime": _now()}]
            store._emit("MODIFIED", pod)
            return
        pod["spec"]["nodeName"] = NODE
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
        _set_container(pod, {"waiting": {"reason": "ContainerCreating"}})
        store._emit("MODIFIED", pod)
        container = pod["spec"]["containers"][0]
    if container["image"].startswith(UNSCHEDULABLE_IMAGE_PREFIX):
        for reason in ("ErrImagePull", "ImagePullBackOff"):
            time.sleep(0.2)
            with store.lock:
                pod = store._current(namespace, name, uid)
                if pod is None:
                    return
                _set_container(pod, {"waiting": {"reason": reason, "message": (
                    f'failed to pull and unpack image "{container["image"]}": not found' if reason == "ErrImagePull"
                    else f'Back-off pulling image "{container["image"]}"')}})
                store._emit("MODIFIED", pod)
        return
    while True:
        with store.lock:
            pod = store._current(namespace, name, uid)
            if pod is None or store.closed:
                return
            try:
                env = container_env(pod, container, store.secrets)
                break
            except _NotReady as exc:
                waiting = pod["status"].get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {})
                if waiting.get("reason") != "CreateContainerConfigError":
                    _set_container(pod, {"waiting": {"reason": "CreateContainerConfigError",
                                                     "message": str(exc)}})
                    store._emit("MODIFIED", pod)
        time.sleep(0.1)
    command = [expand(part, env) for part in (container.get("command") or []) + (container.get("args") or [])]
    cwd = container.get("workingDir") or "/"
    log_path = os.path.join(store.dir, f"{uid}.log")
    proc = None
    failure = None
    if not command:
        failure = "no command specified"
    elif not os.path.isdir(cwd):
        failure = f"chdir to cwd (\"{cwd}\") set in config.json failed: no such file or directory"
    else:
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                        preexec_fn=_die_with_server)
        except OSError as exc:
            failure = f"exec: {exc}"
    started = _now()
    with store.lock:
        pod = store._current(namespace, name, uid)
        if pod is None or store.closed:
            if proc is not None:
                kill_group(proc)
                proc.wait()
            return
        if proc is None:
            pod["status"]["phase"] = "Failed"
            _set_container(pod, {"terminated": {"exitCode": 128, "reason": "StartError", "message": failure,
                                                "startedAt": started, "finishedAt": started}})
            store._emit("MODIFIED", pod)
            return
        store.procs[uid] = proc
        pod["status"].update(phase="Running", podIP=POD_IP, podIPs=[{"ip": POD_IP}], hostIP=POD_IP,
                             startTime=started)
        pod["status"]["conditions"].append({"type": "Ready", "status": "True", "lastTransitionTime": started})
        _set_container(pod, {"running": {"startedAt": started}}, ready=True)
        store._emit("MODIFIED", pod)
    if store.echo_logs:
        threading.Thread(target=_echo, args=(name, log_path, proc), daemon=True).start()
    code = proc.wait()
    kill_group(proc)  # the container ends with its main process
    exit_code = code if code >= 0 else 128 - code
    with store.lock:
        store.procs.pop(uid, None)
        pod = store._current(namespace, name, uid)
        if pod is None:
            store.changed.notify_all()
            return
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        for condition in pod["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "False"
        _set_container(pod, {"terminated": {
            "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started, "finishedAt": _now(), "containerID": f"standin://{uid}"}})
        store._emit("MODIFIED", pod)
        if pod["metadata"].get("deletionTimestamp"):
            store._remove(pod)


def _echo(name: str, path: str, proc: subprocess.Popen) -> None:
    import sys
    with open(path, "rb") as fh:
        while True:
            line = fh.readline()
            if line:
                sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
            elif proc.poll() is not None:
                return
            else:
                time.sleep(0.05)
