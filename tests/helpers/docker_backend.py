"""The docker backend's test helper (imported by the conformance suite and
by test_backend_docker; not a test file).

No image can be pulled in CI, so the tests run in an image made here: only
the host's shared libraries that this interpreter and the extension modules
under ``sys.base_prefix`` and ``sys.prefix`` load (found with ``ldd``), the
ELF interpreter, ``/bin/sh`` and a minimal ``/etc``.  The Python install and
the virtual environment are not copied: the ``volumes`` setting bind-mounts
them read-only at their own paths, and the backend mounts the working
directory, so a job sees the same paths as this process.

The image is tagged by the hash of its content and labelled with a hash of
what it was made from (interpreter, prefixes, the dynamic linker's cache);
a session reuses it while that label matches, so the ``ldd`` scan and the
import run only when something changed or the image was removed.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

REPOSITORY = "fiberrl-test-runtime"
INPUTS_LABEL = "fiberrl.test-inputs"
RECIPE = 1  # bump when the way the image is made changes
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ELF_INTERPRETER = "/lib64/ld-linux-x86-64.so.2"

_settings: dict | None = None


def _client():
    import docker
    return docker.APIClient(**docker.utils.kwargs_from_env(), version="auto", timeout=120)


def available() -> str | None:
    """None when a Docker daemon answers, else why the docker tests cannot run."""
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker Python package is not installed (pip install docker)"
    if sys.platform != "linux":
        return "the test image is made from this machine's Linux libraries"
    try:
        _client().ping()
    except Exception as exc:  # any failure means no daemon
        return f"no Docker daemon at {where}: {exc}"
    return None


# --- the image ----------------------------------------------------------------
def _mounted_prefixes() -> list[str]:
    """The Python install and the venv, each mounted at its own path (nested ones once)."""
    cwd = os.path.realpath(os.getcwd())
    out: list[str] = []
    for prefix in (sys.base_prefix, sys.prefix):
        path = os.path.abspath(prefix)
        if path != sys.base_prefix and _inside(os.path.realpath(path), cwd):
            continue  # a venv inside the working directory comes with it
        if not any(_inside(path, other) for other in out):
            out.append(path)
    return out


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _inputs_key(prefixes: list[str]) -> str:
    """What the image's content follows from, cheaply: a new extension module
    (site-packages changes), new system libraries (ldconfig rewrites its cache)."""
    watched = [sys.executable, os.path.realpath(sys.executable), "/bin/sh", os.path.realpath("/bin/sh"),
               "/etc/ld.so.cache", ELF_INTERPRETER]
    for prefix in prefixes:
        lib = os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
        watched += [prefix, lib, os.path.join(lib, "site-packages"), os.path.join(lib, "lib-dynload")]
    stats = []
    for path in watched:
        try:
            st = os.stat(path)
            stats.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            stats.append((path, None))
    text = json.dumps([RECIPE, sys.version, prefixes, stats])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _shared_objects(prefixes: list[str]) -> list[str]:
    """Extension modules and the libraries they bundle: under the import path
    (not all of a prefix: with a system Python it is /usr)."""
    roots: list[str] = []
    for entry in sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}):
        if any(_inside(entry, os.path.realpath(prefix)) for prefix in prefixes) and \
                not any(_inside(entry, root) for root in roots):
            roots.append(entry)
    found = []
    for root in roots:
        for directory, _dirs, files in os.walk(root):
            found += [os.path.join(directory, f) for f in files if ".so" in f and
                      (f.endswith(".so") or ".so." in f)]
    return found


def _ldd(paths: list[str]) -> set[str]:
    """The libraries (and ELF interpreters) ``paths`` load, as ldd resolves them."""
    def run(batch):
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout
        libs = set()
        for line in out.splitlines():
            match = re.search(r"=>\s+(/\S+)\s+\(", line) or re.match(r"\s+(/\S+)\s+\(0x", line)
            if match:
                libs.add(match.group(1))
        return libs

    batches = [paths[i:i + 64] for i in range(0, len(paths), 64)]
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        return set().union(*pool.map(run, batches))


class _RootFS:
    """A deterministic tar of host files at their own paths, symlinks kept."""

    def __init__(self, skip: list[str]):
        self.buffer = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buffer, mode="w", format=tarfile.PAX_FORMAT)
        self.skip = [os.path.realpath(s) for s in skip]
        self.added: set[str] = set()

    def _info(self, name: str, kind, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
        return info

    def directory(self, path: str, mode: int = 0o755) -> None:
        if path in ("/", "") or path in self.added:
            return
        self.directory(os.path.dirname(path))
        self.added.add(path)
        self.tar.addfile(self._info(path, tarfile.DIRTYPE, mode))

    def text(self, path: str, content: str, mode: int = 0o644) -> None:
        self.directory(os.path.dirname(path))
        data = content.encode()
        info = self._info(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.added.add(path)
        self.tar.addfile(info, io.BytesIO(data))

    def host_path(self, path: str) -> None:
        """``path`` as the host resolves it: every symlink on the way, then the file."""
        parts = [p for p in path.split("/") if p]
        current = "/"
        for _ in range(64):  # symlink hops
            if not parts:
                return
            head, parts = parts[0], parts[1:]
            if head in (".", ".."):  # current is free of symlinks: its parent is physical
                current = os.path.dirname(current) if head == ".." else current
                continue
            candidate = os.path.join(current, head)
            if os.path.islink(candidate):
                target = os.readlink(candidate)
                if candidate not in self.added:
                    self.directory(current)
                    info = self._info(candidate, tarfile.SYMTYPE, 0o777)
                    info.linkname = target
                    self.added.add(candidate)
                    self.tar.addfile(info)
                resolved = os.path.normpath(os.path.join(current, target))
                parts = [p for p in resolved.split("/") if p] + parts
                current = "/"
            elif parts:
                self.directory(candidate)
                current = candidate
            else:
                if candidate in self.added or any(_inside(candidate, s) for s in self.skip):
                    return  # comes with a mounted directory
                self.directory(current)
                st = os.stat(candidate)
                info = self._info(candidate, tarfile.REGTYPE, st.st_mode & 0o7777)
                info.size = st.st_size
                with open(candidate, "rb") as fh:
                    self.tar.addfile(info, fh)
                self.added.add(candidate)
                return
        raise RuntimeError(f"too many symlinks resolving {path}")

    def close(self) -> bytes:
        self.tar.close()
        return self.buffer.getvalue()


def build_rootfs(prefixes: list[str]) -> bytes:
    needed = _ldd([os.path.realpath(sys.executable), os.path.realpath("/bin/sh"), *_shared_objects(prefixes)])
    needed |= {ELF_INTERPRETER, "/bin/sh", os.path.realpath("/bin/sh")}
    rootfs = _RootFS(skip=prefixes)
    for path in sorted(needed):
        rootfs.host_path(path)
    rootfs.text("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n")
    rootfs.text("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
    rootfs.directory("/root", 0o700)
    rootfs.directory("/tmp", 0o1777)
    return rootfs.close()


def image() -> str:
    """The test image's tag, made when no image of these inputs exists."""
    client = _client()
    prefixes = _mounted_prefixes()
    key = _inputs_key(prefixes)
    for found in client.images(filters={"label": f"{INPUTS_LABEL}={key}"}):
        for tag in found.get("RepoTags") or []:
            if tag.startswith(REPOSITORY + ":"):
                return tag
    data = build_rootfs(prefixes)
    tag = hashlib.sha256(data).hexdigest()[:16]
    client.import_image_from_data(data, repository=REPOSITORY, tag=tag,
                                  changes=[f"LABEL {INPUTS_LABEL}={key}"])
    remove_superseded(client, key, f"{REPOSITORY}:{tag}")
    return f"{REPOSITORY}:{tag}"


STALE_AFTER_S = 24 * 3600


def remove_superseded(client, key: str, keep: str) -> None:
    """Remove the test images this one replaces: those made from the same inputs
    (an earlier import of the same tag is untagged by this one, so they are found
    by label, not name), and those of other inputs older than a day.  A fresh
    image of other inputs belongs to another test run on this daemon (another
    checkout or virtual environment), which may be using it now: it stays."""
    now = time.time()
    for old in client.images(filters={"label": INPUTS_LABEL}):
        if keep in (old.get("RepoTags") or []):
            continue
        same_inputs = (old.get("Labels") or {}).get(INPUTS_LABEL) == key
        if same_inputs or now - old.get("Created", now) > STALE_AFTER_S:
            try:
                client.remove_image(old["Id"])
            except Exception:  # in use: stays
                pass


def volumes() -> str:
    """The interpreter and the venv read-only at their own paths, and the
    repository (for ``import fiberrl``) when the working directory does not hold it."""
    mounts = [f"{p}:{p}:ro" for p in _mounted_prefixes()]
    cwd = os.path.realpath(os.getcwd())
    if not _inside(cwd, ROOT) and not _inside(ROOT, cwd):
        mounts.append(f"{ROOT}:{ROOT}:ro")
    elif _inside(cwd, ROOT) and cwd != ROOT:
        mounts.append(f"{ROOT}:{ROOT}:ro")  # the working directory is mounted inside it, writable
    return ",".join(mounts)


def settings() -> dict:
    """``fiberrl.runtime.configure`` arguments that run jobs in the test image."""
    global _settings
    if _settings is None:
        _settings = dict(backend="docker", image=image(), volumes=volumes())
    return dict(_settings)


# --- for the tests --------------------------------------------------------------
def leftovers() -> list[str]:
    """Containers of any fiberrl run still present (auto-removal takes a moment)."""
    return sorted(c["Names"][0].lstrip("/") for c in _client().containers(all=True, filters={"label": "fiberrl.run"}))


def kill_job(process) -> None:
    """Kill the container of a started process as a user would: ``docker kill``."""
    import docker
    try:
        _client().kill(process._job.id)
    except docker.errors.NotFound:
        pass
