"""What an app tells the sweep launcher (``hydra/launcher=fiberrl``) about itself, on its task
function: how to check a run's config before any run starts, how to set up the runtime from the
sweep's config, how a run goes on from its own folder, what a run imports as it starts, and what to
say when the sweep ends.  Settings of the same names (``hydra.launcher.check=module:function``, ...)
take precedence.

    @sweepable(check=validate, resume_key="resume", resume_needs="checkpoints/*.npz")
    def main(cfg): ...
    main = hydra.main(...)(main)   # the task function Hydra hands the launcher is the undecorated one
"""
from typing import Callable, Optional

_ATTRIBUTE = "__fiberrl_sweep__"


def sweepable(*, check: Optional[Callable] = None, configure: Optional[Callable] = None,
              resume_key: Optional[str] = None, resume_needs: str = "*",
              next_steps: Optional[Callable] = None, preload: Optional[Callable] = None):
    """``check(cfg)`` raises on a bad value; ``configure(cfg)`` sets up the runtime (its backend) from
    the sweep's config; a run started again gets ``<resume_key>=<its folder>`` when the folder holds
    ``resume_needs`` (a glob); ``next_steps(sweep_dir)`` gives the lines (commands that look at the
    sweep's runs) printed after the sweep's folder when it ends; ``preload(cfg)`` names the modules a run
    of ``cfg`` imports beyond the task's own module, which local run jobs are then forked with already
    imported (a run that imports torch when it starts pays ~2 s of CPU for it otherwise)."""
    def mark(task):
        setattr(task, _ATTRIBUTE, dict(check=check, configure=configure, resume_key=resume_key,
                                       resume_needs=resume_needs, next_steps=next_steps,
                                       preload=preload))
        return task
    return mark


def hooks_of(task) -> dict:
    return dict(getattr(task, _ATTRIBUTE, {}))
