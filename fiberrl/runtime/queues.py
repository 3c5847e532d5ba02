"""Mirrors ``multiprocessing.queues`` and Fiber's ``fiber.queues``: re-exports ``primitives.queues`` (and ``Pipe``)."""
from .primitives.connection import Pipe
from .primitives.queues import Empty, Full, Queue, SimpleQueue, SimpleQueuePull, SimpleQueuePush

__all__ = ["Empty", "Full", "Pipe", "Queue", "SimpleQueue", "SimpleQueuePull", "SimpleQueuePush"]
