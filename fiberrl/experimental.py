"""``from fiberrl.experimental import Ring`` (the import path Fiber's examples use)."""
from .runtime.ring import Ring, RingError, RingNode

__all__ = ["Ring", "RingError", "RingNode"]
