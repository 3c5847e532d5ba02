"""A JobSpec as a Docker container: its image, its mounts, its host config
(network, CPU and memory limits, GPU device requests), and the daemon's
refusals as errors that say what to fix."""
from __future__ import annotations

from ..base import JobSpec, parse_volumes, working_directory
from .common import DockerError, docker_host


class ContainerSpecMixin:
    """How the DockerBackend creates a job's container."""

    def _image(self, spec: JobSpec) -> str:
        from ...config import get_config
        image = spec.image or get_config().image
        if image:
            return image
        me = self._me_container()
        if me is None:
            raise ValueError("the docker backend needs an image for its jobs: set `image` (FIBERRL_IMAGE=..., "
                             "configure(image=...) or image = \"...\" in fiberrl.toml), e.g. one built with "
                             "`docker build -t myproject .`; only a process that itself runs in a container "
                             "defaults to that container's image")
        return me["Image"]

    def _mounts(self, spec: JobSpec, extra: list[tuple[str, str, bool]] = ()):
        """The job's mounts: the working directory, ``spec.volumes``, then the
        ``volumes`` setting (a later one on the same path wins)."""
        from docker.types import Mount

        from ...config import get_config
        by_target: dict[str, Mount] = {}
        cwd = working_directory(spec)
        me = self._me_container()
        if me is None:
            if cwd != "/":
                by_target[cwd] = Mount(cwd, cwd, type="bind")
        else:
            # paths here are this container's: the job gets the mount that holds
            # the working directory, from the same source (else the image has it)
            holder = None
            for mount in me.get("Mounts") or []:
                dest = mount.get("Destination", "")
                holds = cwd == dest or cwd.startswith(dest.rstrip("/") + "/")
                if holds and mount.get("Type") in ("bind", "volume") and (
                        holder is None or len(dest) > len(holder["Destination"])):
                    holder = mount
            if holder is not None:
                source = holder["Source"] if holder["Type"] == "bind" else holder["Name"]
                by_target[holder["Destination"]] = Mount(holder["Destination"], source, type=holder["Type"],
                                                         read_only=not holder.get("RW", True))
        volumes = [(src, *dst.rsplit(":", 1)) if dst.endswith((":ro", ":rw")) else (src, dst, "rw")
                   for src, dst in (spec.volumes or {}).items()]
        mounts = [(src, dst, mode == "ro") for src, dst, mode in volumes]
        mounts += list(extra) + parse_volumes(get_config().volumes)
        for source, target, read_only in mounts:
            kind = "bind" if source.startswith("/") else "volume"
            by_target[target] = Mount(target, source, type=kind, read_only=read_only)
        return list(by_target.values())

    def _host_config(self, spec: JobSpec, auto_remove: bool, extra_mounts=()):
        from docker.types import DeviceRequest
        kwargs = dict(auto_remove=auto_remove, init=True, network_mode=self._network(),
                      mounts=self._mounts(spec, extra_mounts))
        if spec.cpu:
            kwargs["nano_cpus"] = int(round(spec.cpu * 1e9))
        if spec.mem:
            # no swap beyond the limit (Docker's default allows as much again)
            kwargs["mem_limit"] = kwargs["memswap_limit"] = int(spec.mem * 1024 * 1024)
        if spec.gpu:
            kwargs["device_requests"] = [DeviceRequest(count=int(spec.gpu), capabilities=[["gpu"]])]
        return self._client().create_host_config(**kwargs)

    def _create(self, spec: JobSpec, name: str, env: dict, labels: dict, host_config) -> str:
        import docker
        image = self._image(spec)
        try:
            created = self._client().create_container(
                image, command=list(spec.command), environment=env, labels=labels, name=name, detach=True,
                working_dir=working_directory(spec), host_config=host_config)
        except docker.errors.ImageNotFound:
            raise DockerError(
                f"the Docker image {image!r} is not on the Docker daemon at {docker_host()}: build it "
                f"(`docker build -t {image} .`) or pull it (`docker pull {image}`), or set `image` "
                f"(FIBERRL_IMAGE=... or configure(image=...)) to an image the daemon has") from None
        except docker.errors.APIError as exc:
            raise DockerError(f"the Docker daemon would not create a container for {spec.name}: "
                              f"{exc.explanation or exc}{_create_hint(exc)}") from None
        return created["Id"]


def _create_hint(exc) -> str:
    text = str(exc.explanation or exc)
    if "mount" in text or "bind source" in text or "volume" in text:
        return (" (the working directory and each SRC path of the `volumes` setting must exist on the "
                "Docker host)")
    if "network" in text:
        return " (check the docker_network setting: `docker network ls`)"
    return ""


def start_hint(exc) -> str:
    text = str(exc.explanation or exc)
    if "device driver" in text or "gpu" in text.lower() or "nvidia" in text.lower():
        return (" (meta(gpu=...) needs GPUs on the Docker host and the NVIDIA Container Toolkit configured for "
                "Docker: `nvidia-ctk runtime configure --runtime=docker` then restart dockerd)")
    return ""
