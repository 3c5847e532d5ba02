"""This process's started children that have not ended: what
``active_children()`` lists, what the process stops as it exits
(``stop_children``) and what its lifeline kills when its parent is gone.

``Process.start`` adds a child and its exit takes it out; a job's start-up
(``child``, ``lifeline``) reaches them here, without ``process``.
"""
from __future__ import annotations

import threading

_children: set = set()  # of processes.process.Process
_lock = threading.Lock()


def add(process) -> None:
    with _lock:
        _children.add(process)


def discard(process) -> None:
    with _lock:
        _children.discard(process)


def forget_all() -> None:
    """In a new child: its parent's children are not its own."""
    global _children
    with _lock:
        _children = set()


def active_children() -> list:
    """Started children that have not exited yet (reaping those that have)."""
    with _lock:
        children = list(_children)
    return [p for p in children if p.is_alive()]


def stop_children(join_timeout: float | None = None) -> None:
    """multiprocessing's exit rule: terminate daemonic children, join the others.  A child
    that serves the others (the manager of module-level Lock, Value...: in multiprocessing
    they are shared memory, which outlives every process) is stopped after them, its own way."""
    serving = [p for p in active_children() if p._stop_after_children is not None]
    for p in active_children():
        if p.daemon and p not in serving:
            p.terminate()
    for p in active_children():
        if p not in serving:
            p.join(None if not p.daemon else 1.0)
    for p in serving:
        p._stop_after_children()
    for p in active_children():
        p.kill()
        p.join(join_timeout)
