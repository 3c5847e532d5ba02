"""A child's watch on its parent: if the parent goes away the child exits,
so a parent killed with SIGKILL leaves no orphan behind.

The link to the parent reports its loss at once (the kernel closes a dead
process's sockets and pipes); a heartbeat catches a parent that hangs or a
host that vanished without closing anything.  The child beats as often as
its parent listens for it (``beat_interval``: BEATS_PER_SILENCE times in
``silence_timeout``), and asks for an answer only every ``heartbeat_timeout /
ANSWER_EVERY``: it still finds a hung parent within ``heartbeat_timeout``, and
a master of thousands of workers answers a few beats in each second instead
of all.  A beat that is not asked to be answered is not sent when the child
has just spoken to its parent otherwise (``spoke``: a pool worker's results,
which its pool counts as hearing from it): a master of thousands of busy
workers reads their results, not their beats as well.  Nor does a beat ask
for an answer when the parent has just sent the child something unasked
(``heard_from_parent``: a pool worker's work), which tells it as much: a
master of thousands of busy workers answered a ping from each every 7.5 s.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time

from ..config import get_config
from ..net.errors import PeerGone
from .children import active_children
from .hub import BEAT, PING
from .parent_link import ParentLink
from .process import silence_limit

ORPHAN_EXIT_CODE = 75
# a beat is answered once in this part of heartbeat_timeout: a master of 9,000 simulated workers
# beating every second spent 0.47-0.54 s of CPU a second on them, answering each, and 0.22-0.28
# with this, small frames signed as one buffer and its links read in batches (docs/benchmarks.md)
ANSWER_EVERY = 4
# beats in a silence_timeout: one late by up to three quarters of it is still in time, and a job
# cut off is noticed no later than silence_timeout after its last beat, as with a beat a second;
# a beat every 2.5 s instead of every second took a master's idle CPU with 9,000 simulated
# workers from 0.18-0.20 s a second to 0.105-0.125 (docs/benchmarks.md)
BEATS_PER_SILENCE = 4
# seconds between heartbeats once ``beat_less_often`` was called; None: the configured interval
_slow_interval: float | None = None
# when this process last spoke to its parent otherwise than over its link (``spoke``), when it last heard
# from it otherwise than in answer to a beat (``heard_from_parent``), and the beats it sent
_spoke = _heard = -math.inf
_beats = 0


def spoke() -> None:
    """This process just sent its parent something its parent counts as hearing from it (a pool
    worker's results, heard by its pool): the next beat, unless it asks for an answer, is not needed."""
    global _spoke
    _spoke = time.monotonic()


def heard_from_parent() -> None:
    """This process just got something from its parent that it did not ask its lifeline for (a pool
    worker's next work): the parent lives, and the next beats need not ask it to answer until a quarter
    of ``heartbeat_timeout`` has passed without such word.  A parent that hangs sends nothing more, so
    it is still found within ``heartbeat_timeout`` of the last word."""
    global _heard
    _heard = time.monotonic()


def beats_sent() -> int:
    """The beats this process has sent its parent (answered ones included)."""
    return _beats


def beat_less_often(seconds: float) -> None:
    """Check the parent every ``seconds`` (from the next check on) if that is longer than the configured
    interval.  For one of many processes on a host: the parent's death is seen at once anyway, through
    the link closing, and the heartbeat only catches a parent that hangs."""
    global _slow_interval
    _slow_interval = seconds


def beat_interval() -> float:
    """Seconds between a child's beats: ``heartbeat_interval`` when set, else as often as its parent
    listens (``silence_limit``); where it does not (the local backend), the beats would go unheard
    and only the answered ones, which tell the child its parent lives, are sent."""
    config = get_config()
    if config.heartbeat_interval:
        return config.heartbeat_interval
    silence = silence_limit()
    return silence / BEATS_PER_SILENCE if silence else config.heartbeat_timeout / ANSWER_EVERY


def watch_parent(parent: ParentLink) -> threading.Thread:
    config = get_config()
    thread = threading.Thread(target=_watch, args=(parent, beat_interval(), config.heartbeat_timeout),
                              name="fiberrl-lifeline", daemon=True)
    thread.start()
    return thread


def _watch(parent: ParentLink, interval: float, timeout: float) -> None:
    global _beats
    answered = time.monotonic()
    while True:
        every = max(interval, _slow_interval or 0.0)
        parent.wait_lost(every)
        try:
            now = time.monotonic()
            since = now - max(answered, _heard)
            if since < timeout / ANSWER_EVERY:
                if now - _spoke >= every:  # else heard within a beat's interval already
                    parent.tell(BEAT)
                    _beats += 1
                continue
            _beats += 1
            # the answer is due within heartbeat_timeout of the last one (and a job that was
            # itself stalled, its host paused, still gives its parent a fair time to answer)
            parent.request(PING, timeout=max(timeout / ANSWER_EVERY, timeout - since))
            answered = time.monotonic()
        except (PeerGone, TimeoutError) as exc:
            _die(f"parent at {parent.address} is gone ({exc})")


def _die(reason: str) -> None:
    try:
        sys.stderr.write(f"fiberrl: process {os.getpid()} exits: {reason}\n")
        sys.stderr.flush()
        for child in active_children():
            child.kill()
    finally:
        os._exit(ORPHAN_EXIT_CODE)
