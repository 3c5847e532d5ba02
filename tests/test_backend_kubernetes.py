"""The kubernetes backend, against a stand-in API server.

No Kubernetes cluster can run here, so the API server is a stand-in
(tests/helpers/k8s_standin/): it speaks the REST API the official client uses for
pods, logs and secrets, and runs each pod's command as a local process.
These tests check what the backend asked of it (the exact pod specs) and
what the runtime makes of the answers.
"""
import base64
import hashlib
import json
import os
import secrets
import signal
import subprocess
import textwrap
import time

from helpers import kubernetes_backend as kb
import pytest
from conftest import PYTHON, ROOT, pid_alive, wait_until

import fiberrl.runtime as mp
from fiberrl.runtime import config
from fiberrl.runtime.backends import NEVER_RAN_EXIT, OWNER, JobSpec, JobStatus, get_backend
from fiberrl.runtime.backends.kubernetes import KubernetesBackend
from fiberrl.runtime.backends.kubernetes.connection import _Connection, route_source
from fiberrl.runtime.backends.kubernetes.names import label_value
from fiberrl.runtime.net import auth
from fiberrl.runtime.processes.process import CHILD_COMMAND

pytestmark = [pytest.mark.slow, pytest.mark.kubernetes,
              pytest.mark.skipif(kb.available() is not None, reason=kb.available() or "")]


@pytest.fixture(scope="module")
def standin():
    return kb.standin()


@pytest.fixture(autouse=True)
def on_kubernetes(standin):
    mp.configure(**kb.settings())
    yield
    standin.set_quota(None)
    config.reset()


# --- targets (imported by the children) -------------------------------------------
def exits_with(code):
    raise SystemExit(code)


def sleeper(seconds=600):
    time.sleep(seconds)


def wait_then_exit(q, code):
    q.get(timeout=60)
    raise SystemExit(code)


@mp.meta(cpu=1.5, mem=512, gpu=1)
def with_resources():
    pass


@mp.meta(gpu=64)
def needs_many_gpus():
    pass


def square(x):
    return x * x


def parent_in_pod(q):
    mp.configure(image="")  # its child gets the image of this pod
    child = mp.Process(target=sleeper, name="grandchild")
    child.start()
    q.put((os.environ["FIBERRL_POD_NAME"], child._job.id))
    time.sleep(600)


# --- helpers -------------------------------------------------------------------------
def pod_body(standin, name):
    bodies = [b for b in standin.created_pods() if b["metadata"]["name"] == name]
    assert len(bodies) == 1, f"{len(bodies)} creations of pod {name}"
    return bodies[0]


def phase(standin, name):
    pod = standin.pod(name)
    return pod["status"]["phase"] if pod else None


def env_of(body):
    return {e["name"]: e for e in body["spec"]["containers"][0]["env"]}


def run_id_of(secret_hex):
    return hashlib.sha256(b"fiberrl-run-id" + bytes.fromhex(secret_hex)).hexdigest()[:12]


# --- pod specs ---------------------------------------------------------------------------
def test_pod_spec_resources_volumes_labels_and_secret(standin):
    mp.configure(volumes="nfs:/persistent,/srv/data:/data:ro")
    begun = len(standin.received())
    p = mp.Process(target=with_resources, name="Spec:Checker 1")
    p.start()
    p.join(60)
    assert p.exitcode == 0
    run = auth.run_id()
    body = pod_body(standin, p._job.id)
    assert body["metadata"]["name"].startswith(f"fiberrl-{run}-")
    assert body["metadata"]["labels"] == {"fiberrl.run": run, "fiberrl.owner": OWNER,
                                          "fiberrl/process": "Spec-Checker-1"}
    assert "ownerReferences" not in body["metadata"]  # started from a workstation: no parent pod
    spec = body["spec"]
    assert spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    assert container["image"] == "fiberrl-standin"
    assert container["command"] == CHILD_COMMAND
    assert container["workingDir"] == os.getcwd()
    assert container["resources"] == {
        "requests": {"cpu": "1500m", "memory": "512Mi"},
        "limits": {"cpu": "1500m", "memory": "512Mi", "nvidia.com/gpu": "1"}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/persistent"]["name"]]["persistentVolumeClaim"] == {"claimName": "nfs", "readOnly": False}
    assert not mounts["/persistent"]["readOnly"]
    assert volumes[mounts["/data"]["name"]]["hostPath"] == {"path": "/srv/data"}
    assert mounts["/data"]["readOnly"]

    env = env_of(body)
    assert env["FIBERRL_RUN_SECRET"] == {"name": "FIBERRL_RUN_SECRET", "valueFrom": {
        "secretKeyRef": {"name": f"fiberrl-{run}", "key": "secret"}}}
    assert env["FIBERRL_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["FIBERRL_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    secret_hex = auth.run_secret().hex()
    assert all(secret_hex not in e.get("value", "") for e in env.values()), "the run secret is in plain env"
    assert "FIBERRL_PROCESS_ID" in env and "FIBERRL_PARENT_ADDRESS" in env
    assert "HOME" not in env and "PATH" not in env  # only fiberrl's and Python's variables travel

    def secrets_posted(since=0):
        return [r["body"] for r in standin.received("POST", r"/api/v1/namespaces/[^/]+/secrets", since)
                if r["body"]["metadata"]["name"] == f"fiberrl-{run}"]
    # made once per run (an earlier module's cleanup may have removed it, so it may be made again now)
    assert len(secrets_posted(begun)) <= 1 and secrets_posted(), "the run's Secret was never created"
    assert base64.b64decode(secrets_posted()[-1]["data"]["secret"]).decode() == secret_hex
    assert secrets_posted()[-1]["metadata"]["labels"] == {"fiberrl.run": run, "fiberrl.owner": OWNER}
    # the pod of an exited process is removed once its exit is known
    assert wait_until(lambda: p._job.id not in standin.pod_names(), 10)


def test_label_values_are_sanitised():
    assert label_value("ForkPoolWorker-3") == "ForkPoolWorker-3"
    assert label_value("Process-1:2") == "Process-1-2"
    assert label_value("__weird name!!") == "weird-name"
    assert len(label_value("x" * 100)) == 63


def test_pods_do_not_inherit_the_parents_listen_address():
    mp.configure(host="10.9.8.7")
    env = {"FIBERRL_RESOLVED_CONFIG": config.serialize(config.get_config()), "HOME": "/root",
           "FIBERRL_POD_NAME": "the-parents-pod", "FIBERRL_RUN_SECRET": "00" * 32}
    body = get_backend("kubernetes")._pod_body(JobSpec(command=["true"], name="x", env=env, run="abc", owner="d"),
                                               "fiberrl-abc-x", {}, [])
    env = env_of(body)
    inherited = json.loads(env["FIBERRL_RESOLVED_CONFIG"]["value"])
    assert inherited["host"] == "" and inherited["backend"] == "kubernetes"
    assert "HOME" not in env
    assert "value" not in env["FIBERRL_POD_NAME"] and "value" not in env["FIBERRL_RUN_SECRET"]


# --- status from one watch --------------------------------------------------------------
def test_exit_code_comes_from_the_watch_without_a_get_per_pod(standin):
    watches = standin.stats["watch"]
    p = mp.Process(target=exits_with, args=(3,))
    p.start()
    polls = 0
    while p.exitcode is None and polls < 20000:
        polls += 1
        time.sleep(0.002)
    assert p.exitcode == 3
    assert polls > 50  # the pool's way: exitcode over and over
    assert standin.received("GET", rf"/api/v1/namespaces/[^/]+/pods/{p._job.id}") == []
    assert standin.stats["watch"] - watches <= 1  # the same watch (or one re-opened), not one per pod


def test_410_gone_forces_a_relist_and_status_stays_right(standin):
    q = mp.Queue()
    p = mp.Process(target=wait_then_exit, args=(q, 3))
    p.start()
    assert wait_until(lambda: phase(standin, p._job.id) == "Running", 30)
    lists, gone = standin.stats["list"], standin.stats["gone"]
    standin.force_gone()
    q.put("go")
    p.join(30)
    assert p.exitcode == 3
    assert standin.stats["gone"] > gone
    assert standin.stats["list"] > lists
    # the watch goes on after the re-list
    p2 = mp.Process(target=exits_with, args=(4,))
    p2.start()
    p2.join(30)
    assert p2.exitcode == 4


def test_pod_creation_survives_transient_failures(standin):
    pods = r"/api/v1/namespaces/[^/]+/pods"
    standin.inject("POST", pods, code=503)   # refused: tried again
    standin.inject("POST", pods)             # made, but the answer lost: the retry's 409 is success
    p = mp.Process(target=exits_with, args=(5,))
    p.start()
    p.join(30)
    assert p.exitcode == 5
    # the refused try, the one whose answer was lost, the one answered 409
    assert [b["metadata"]["name"] for b in standin.created_pods()].count(p._job.id) == 3


def test_deleted_pod_is_lost(standin):
    p = mp.Process(target=sleeper)
    p.start()
    assert wait_until(lambda: phase(standin, p._job.id) == "Running", 30)
    pid = standin.process_of(p._job.id).pid
    kb.kill_job(p)
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert wait_until(lambda: not pid_alive(pid), 10)


def test_terminate_and_kill(standin):
    a, b = mp.Process(target=sleeper), mp.Process(target=sleeper)
    a.start()
    b.start()
    assert wait_until(lambda: phase(standin, a._job.id) == phase(standin, b._job.id) == "Running", 30)
    a.terminate()
    b.kill()
    a.join(30)
    b.join(30)
    assert (a.exitcode, b.exitcode) == (-signal.SIGTERM, -signal.SIGKILL)
    deletes = {r["path"].rsplit("/", 1)[1]: r for r in standin.received("DELETE", r".*/pods/[^/]+")}
    assert deletes[a._job.id]["query"]["gracePeriodSeconds"] == "30"
    assert deletes[b._job.id]["query"]["gracePeriodSeconds"] == "0"


# --- jobs that never run ---------------------------------------------------------------------
def test_image_pull_error_is_reported_and_the_pod_removed(standin):
    mp.configure(image="missing/nothing:1", schedule_timeout=30)
    p = mp.Process(target=exits_with, args=(0,))
    start = time.monotonic()
    p.start()
    p.join(20)
    assert p.exitcode == NEVER_RAN_EXIT
    assert time.monotonic() - start < 10
    assert "ErrImagePull" in p.job_error and "missing/nothing:1" in p.job_error
    assert wait_until(lambda: p._job.id not in standin.pod_names(), 10)


def test_quota_refusal_is_reported(standin):
    standin.set_quota(pods=0)
    p = mp.Process(target=exits_with, args=(0,))
    p.start()
    assert p.exitcode == NEVER_RAN_EXIT
    assert "exceeded quota" in p.job_error


def test_pending_past_schedule_timeout_is_removed(standin):
    mp.configure(schedule_timeout=1.5)
    p = mp.Process(target=needs_many_gpus)
    start = time.monotonic()
    p.start()
    p.join(20)
    assert p.exitcode == NEVER_RAN_EXIT
    assert 1.5 <= time.monotonic() - start < 10
    assert "schedule_timeout" in p.job_error and "Insufficient nvidia.com/gpu" in p.job_error
    assert wait_until(lambda: p._job.id not in standin.pod_names(), 10)


# --- nested: a process in a pod ---------------------------------------------------------------
def test_pods_started_in_a_pod_are_owned_by_it(standin):
    mp.configure(image="fiberrl-standin:outer")
    q = mp.Queue()
    p = mp.Process(target=parent_in_pod, args=(q,))
    p.start()
    parent_pod, child_pod = q.get(timeout=60)
    assert parent_pod == p._job.id
    assert wait_until(lambda: phase(standin, child_pod) == "Running", 30)
    uid = standin.pod(parent_pod)["metadata"]["uid"]
    body = pod_body(standin, child_pod)
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": parent_pod, "uid": uid}]
    assert body["spec"]["containers"][0]["image"] == "fiberrl-standin:outer"  # the parent pod's image
    assert body["metadata"]["labels"]["fiberrl.run"] == auth.run_id()
    assert body["metadata"]["labels"]["fiberrl.owner"] != OWNER
    assert standin.secret_names(f"fiberrl.run={auth.run_id()}") == [f"fiberrl-{auth.run_id()}"]
    grandchild = standin.process_of(child_pod).pid

    kb.kill_job(p)  # deleting the parent pod deletes its child's
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert wait_until(lambda: child_pod not in standin.pod_names(), 15)
    assert wait_until(lambda: not pid_alive(grandchild), 10)


# --- cleanup and the reaper -------------------------------------------------------------------
def test_cleanup_removes_an_owners_pods_and_secret(standin):
    backend = get_backend("kubernetes")
    secret = secrets.token_hex(32)
    run = run_id_of(secret)
    owner = "cleanup" + secrets.token_hex(3)

    def spec(**extra):
        return JobSpec(command=[PYTHON, "-c", "import time; time.sleep(600)"], name="stray",
                       env={"FIBERRL_RUN_SECRET": secret}, cwd=os.getcwd(), run=run, owner=owner, **extra)

    running = backend.create_job(spec())
    pending = backend.create_job(spec(gpu=64))
    assert wait_until(lambda: backend.status(running)[0] is JobStatus.RUNNING, 30)
    assert backend.status(pending)[0] is JobStatus.PENDING
    assert standin.secret_names(f"fiberrl.owner={owner}") == [f"fiberrl-{run}"]
    # an account without the deletecollection verb: a list and one delete each
    standin.inject("DELETE", r"/api/v1/namespaces/[^/]+/pods", code=403)
    standin.inject("DELETE", r"/api/v1/namespaces/[^/]+/secrets", code=403)
    backend.cleanup(owner)
    one_by_one = {r["path"].rsplit("/", 1)[1] for r in standin.received("DELETE", r".*/(pods|secrets)/[^/]+")}
    assert {running.id, pending.id, f"fiberrl-{run}"} <= one_by_one
    assert standin.pod_names(f"fiberrl.owner={owner}") == []
    assert standin.secret_names(f"fiberrl.run={run}") == []
    assert backend.wait(running, 10) == -signal.SIGKILL
    assert backend.wait(pending, 10) == NEVER_RAN_EXIT
    assert "deleted before it started" in pending.error
    assert standin.secret_names(f"fiberrl.run={auth.run_id()}")  # this process's run is untouched


KILLED_OWNER = textwrap.dedent("""
    import sys, time
    import fiberrl.runtime as mp
    from fiberrl.runtime.backends import OWNER

    def sleeper():
        time.sleep(600)

    @mp.meta(gpu=64)
    def unschedulable():
        pass

    if __name__ == "__main__":
        mp.configure(backend="kubernetes", kubernetes_config=sys.argv[1], image="fiberrl-standin")
        a = mp.Process(target=sleeper)
        a.start()
        b = mp.Process(target=unschedulable)
        b.start()
        print(OWNER, flush=True)
        time.sleep(600)
""")


def test_reaper_removes_the_pods_of_a_killed_workstation_process(standin, tmp_path, script_env):
    script = tmp_path / "owner.py"
    script.write_text(KILLED_OWNER)
    owner_process = subprocess.Popen([PYTHON, str(script), standin.kubeconfig], env=script_env,
                                     stdout=subprocess.PIPE, text=True)
    try:
        owner = owner_process.stdout.readline().strip()
        assert owner, "the owner script did not start"
        selector = f"fiberrl.owner={owner}"
        assert wait_until(lambda: len(standin.pod_names(selector)) == 2, 30)
        assert wait_until(lambda: "Running" in [phase(standin, n) for n in standin.pod_names(selector)], 30)
        assert standin.secret_names(selector)
    finally:
        owner_process.kill()
        owner_process.wait()
    assert wait_until(lambda: not standin.pod_names(selector) and not standin.secret_names(selector), 20), \
        standin.pod_names(selector) + standin.secret_names(selector)


# --- fiberrl submit ------------------------------------------------------------------------------
MASTER = textwrap.dedent("""
    import time
    import fiberrl.runtime as mp

    def napper():
        time.sleep(600)

    if __name__ == "__main__":
        print("master up", flush=True)
        worker = mp.Process(target=napper)
        worker.start()
        print("worker started", flush=True)
        time.sleep(600)
""")


def test_submit_describe_logs_cancel(standin):
    backend = get_backend("kubernetes")
    secret = secrets.token_hex(32)
    run = run_id_of(secret)
    env = {"FIBERRL_RUN_SECRET": secret, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1",
           "FIBERRL_RESOLVED_CONFIG": config.serialize(config.get_config())}
    job_id = backend.submit(JobSpec(command=[PYTHON, "-c", MASTER], name="master", env=env, cwd=os.getcwd(),
                                    run=run, owner=OWNER))
    body = pod_body(standin, job_id)
    assert body["metadata"]["labels"]["fiberrl.submitted"] == "1"
    assert "fiberrl.owner" not in body["metadata"]["labels"]  # never cleaned up with the submitter
    assert "ownerReferences" not in body["metadata"]
    assert env_of(body)["FIBERRL_RUN_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == f"fiberrl-{run}"

    text = ""
    stream = backend.logs(job_id, follow=True)
    for chunk in stream:
        text += chunk
        if "worker started" in text:
            break
    stream.close()
    assert text.startswith("master up\n")
    described = backend.describe(job_id)
    assert described["id"] == job_id and described["state"] == "running" and described["exit_code"] is None
    assert job_id in described["where"]
    assert "master up" in "".join(backend.logs(job_id))
    run_pods = f"fiberrl.run={run}"
    assert wait_until(lambda: len(standin.pod_names(run_pods)) == 2, 30)  # the master and its worker

    backend.cancel(job_id)
    assert standin.pod_names(run_pods) == []
    assert standin.secret_names(run_pods) == []
    assert backend.describe(job_id)["state"] == "unknown"


def test_submitted_master_that_exits(standin):
    backend = get_backend("kubernetes")
    secret = secrets.token_hex(32)
    run = run_id_of(secret)
    job_id = backend.submit(JobSpec(command=[PYTHON, "-c", "import sys; print('done $(HOME) $$'); sys.exit(7)"],
                                    name="master", env={"FIBERRL_RUN_SECRET": secret}, cwd=os.getcwd(),
                                    run=run, owner=OWNER))
    text = "".join(backend.logs(job_id, follow=True))  # ends with the pod
    assert text == "done $(HOME) $$\n"  # no $(VAR) expansion of our command
    assert wait_until(lambda: backend.describe(job_id)["state"] == "exited", 10)
    assert backend.describe(job_id)["exit_code"] == 7
    backend.cancel(job_id)
    assert standin.pod_names(f"fiberrl.run={run}") == [] and standin.secret_names(f"fiberrl.run={run}") == []


# --- a pool ------------------------------------------------------------------------------------------
def test_pool_map_on_kubernetes(standin):
    created = len(standin.created_pods())
    with mp.Pool(2) as pool:
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
    names = [b["metadata"]["name"] for b in standin.created_pods()[created:]]
    assert len(names) == 2
    assert wait_until(lambda: not set(names) & set(standin.pod_names()), 10)  # terminate() removed them


# --- configuration ---------------------------------------------------------------------------------
def test_connection_settings(standin, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("FIBERRL_POD_NAMESPACE", raising=False)
    assert _Connection(standin.kubeconfig, "").namespace == "fiberrl-test"  # the kubeconfig context's
    assert _Connection(standin.kubeconfig, "elsewhere").namespace == "elsewhere"
    with pytest.raises(RuntimeError, match="found no cluster"):
        _Connection(str(tmp_path / "nothing"), "")
    assert route_source("127.0.0.1", 6443) == "127.0.0.1"
    assert get_backend("kubernetes").listen_host() == "127.0.0.1"  # the stand-in listens on loopback


def test_image_is_required_outside_a_pod(monkeypatch):
    monkeypatch.delenv("FIBERRL_POD_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    mp.configure(image="")
    with pytest.raises(RuntimeError, match="needs an image"):
        KubernetesBackend()._image(JobSpec(command=["true"], name="x"), config.get_config())


def test_a_pod_someone_else_started_owns_its_jobs(standin, monkeypatch):
    """A process in a pod fiberrl did not start finds its pod by hostname."""
    user_pod = "user-pod-" + secrets.token_hex(3)
    standin.create_pod(standin.namespace, {
        "metadata": {"name": user_pod},
        "spec": {"serviceAccountName": "fiberrl-runner", "imagePullSecrets": [{"name": "regcred"}],
                 "containers": [{"name": "main", "image": "user/image:1", "command": ["sleep", "600"]}]}})
    try:
        assert wait_until(lambda: phase(standin, user_pod) == "Running", 30)
        for name in ("FIBERRL_POD_NAME", "FIBERRL_POD_IP", "FIBERRL_POD_NAMESPACE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
        monkeypatch.setenv("HOSTNAME", user_pod)
        mp.configure(image="")
        backend = KubernetesBackend()
        assert not backend.needs_reaper()
        assert backend.listen_host() == "127.0.0.1"  # the pod's IP
        uid = standin.pod(user_pod)["metadata"]["uid"]
        assert backend._owner_references() == [{"apiVersion": "v1", "kind": "Pod", "name": user_pod, "uid": uid}]
        body = backend._pod_body(JobSpec(command=["true"], name="w", run="abc", owner="def"), "fiberrl-abc-x",
                                 {}, backend._owner_references())
        assert body["spec"]["containers"][0]["image"] == "user/image:1"
        assert body["spec"]["serviceAccountName"] == "fiberrl-runner"
        assert body["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    finally:
        standin.delete_pod(standin.namespace, user_pod, 0)


def test_nothing_left_behind_and_no_pod_was_polled(standin):
    """Every pod of this module's processes is gone, and every Secret but this
    run's; in all these tests no pod this process started was read by name
    (but by the process in it that started pods of its own, once)."""
    assert kb.leftovers() == []
    parents = {ref["name"] for b in standin.created_pods() for ref in b["metadata"].get("ownerReferences", [])}
    mine = {b["metadata"]["name"] for b in standin.created_pods()
            if b["metadata"]["labels"].get("fiberrl.owner") == OWNER} - parents
    assert len(mine) > 10
    polled = [r["path"] for r in standin.received("GET", r"/api/v1/namespaces/[^/]+/pods/[^/]+")
              if r["path"].rsplit("/", 1)[1] in mine]
    assert polled == []
