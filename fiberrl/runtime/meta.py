"""``@meta(cpu=, gpu=, mem=)`` (``memory=`` as Fiber spells it): the resources a function's job needs.

Recorded on the function and copied into the JobSpec of the process (or
pool worker) that runs it; each backend turns it into its own request.
"""
from __future__ import annotations

import functools

_ATTR = "__fiberrl_meta__"
_KEYS = ("cpu", "gpu", "mem")


def meta(*, cpu: float | None = None, gpu: int | None = None, mem: int | None = None, memory: int | None = None):
    """Declare what the decorated function needs: ``cpu`` cores, ``gpu``
    devices, ``mem`` (or Fiber's ``memory``) MiB of memory."""
    if memory is not None:
        if mem is not None:
            raise ValueError("meta(): give mem= or memory= (the same setting), not both")
        mem = memory
    for key, value in (("cpu", cpu), ("gpu", gpu), ("mem", mem)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"meta({key}={value!r}): expected a number >= 0")
    if gpu is not None and int(gpu) != gpu:
        raise ValueError(f"meta(gpu={gpu!r}): GPUs come whole; use an integer")
    resources = {k: v for k, v in (("cpu", cpu), ("gpu", None if gpu is None else int(gpu)), ("mem", mem))
                 if v is not None}

    def decorate(fn):
        setattr(fn, _ATTR, resources)
        return fn

    return decorate


def resources_of(fn) -> dict:
    """The resources declared on ``fn`` (looking through partials and bound methods)."""
    while fn is not None:
        found = getattr(fn, _ATTR, None)
        if found is not None:
            return dict(found)
        fn = fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", None)
    return {}
