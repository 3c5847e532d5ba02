"""Mirrors Fiber's ``fiber.experimental`` (``from fiberrl.experimental import Ring``): ``runtime.primitives.ring``."""
from .runtime.primitives.ring import Ring, RingError, RingNode

__all__ = ["Ring", "RingError", "RingNode"]
