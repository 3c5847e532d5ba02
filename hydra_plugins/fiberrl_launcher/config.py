"""The launcher's settings, ``hydra.launcher.*`` (``hydra/launcher=fiberrl``)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class FiberrlLauncherConf:
    _target_: str = "hydra_plugins.fiberrl_launcher.launcher.FiberrlLauncher"
    # runs at the same time; None: as many as the local machine's cores and memory fit (cpu and
    # mem below), or on a cluster backend every run of the batch (the cluster queues what it cannot place)
    runs_at_once: Optional[int] = None
    # the backend each run's job starts on (local, docker, kubernetes, slurm); None or auto: the
    # runtime's own choice (FIBERRL_BACKEND, fiberrl.toml); settings: the runtime's (image, ...)
    backend: Optional[str] = None
    backend_settings: Dict[str, Any] = field(default_factory=dict)
    # or "module:function" called with the sweep's config to configure the runtime
    configure: Optional[str] = None
    # what one run's job asks for, as @meta has them: cores, GPUs (each run its own), MiB
    cpu: Optional[float] = 1
    gpu: Optional[int] = None
    mem: Optional[int] = None
    # times a run whose job died (killed, OOM, lost node) is started again before it counts as failed;
    # a run that raises is not retried
    retries: int = 2
    # a retried or resumed run gets `<resume_key>=<its folder>` when its folder holds resume_needs (a glob)
    resume_key: Optional[str] = None
    resume_needs: Optional[str] = None
    # "module:function" called with each run's config before any run starts; it raises on a bad value
    check: Optional[str] = None
    # (an app can give check, configure, resume_key and resume_needs on its task function instead:
    # fiberrl.sweepable.sweepable; these settings take precedence)
    # local run jobs are forked with what their runs import as they start already imported (what the app's
    # sweepable preload hook names: fiberrl's algorithm, torch); false: each job imports it itself, as for an
    # app whose imports start threads, which a forked job would not have
    preload: bool = True
    # the live table: auto (refreshed in place on a terminal, plain lines otherwise), plain, or off
    table: str = "auto"


ConfigStore.instance().store(group="hydra/launcher", name="fiberrl", node=FiberrlLauncherConf,
                             provider="fiberrl")
