"""Mirrors ``multiprocessing.connection``: re-exports :mod:`fiberrl.runtime.primitives.connection`."""
from .primitives.connection import (Client, Connection, Listener, Pipe, answer_challenge, deliver_challenge, families,
                                    wait)

__all__ = ["Client", "Connection", "Listener", "Pipe", "answer_challenge", "deliver_challenge", "families", "wait"]
