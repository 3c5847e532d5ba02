"""A channel that deals its items to its readers in turn, as Fiber's
``SimpleQueuePush`` did: with 4 readers, each gets every fourth item, so
2,400 items go 600 to each however unevenly the readers are scheduled.

A reader is a process that has asked for an item (its connection; the
owner itself is ``LOCAL``).  Unlike Fiber's push socket, nothing is lost or
stuck with a reader: what was dealt to a reader whose connection closes is
dealt again to the others, and a reader that has not asked for
``IDLE_SECONDS`` gives up its items to a reader that waits.
"""
from __future__ import annotations

import queue
import time
from collections import deque

from ..net.transport import CLOSED, EMPTY, OK, Request
from ..processes.hub import get_hub
from .channel import LOCAL, Channel, ChannelClosed

IDLE_SECONDS = 1.0


class DealingChannel(Channel):
    def __init__(self):
        super().__init__(0)
        self._dealt: dict[int, deque] = {}  # reader -> its items, readers in the order they came
        self._last_ask: dict[int, float] = {}  # when it last asked or was answered
        self._turn = 0

    # --- under self._lock ---------------------------------------------------
    def _join(self, reader: int) -> None:
        self._last_ask[reader] = time.monotonic()
        if reader not in self._dealt:
            self._dealt[reader] = deque()

    def _offer(self, data):
        if not self._dealt:  # no reader yet: the first to ask takes it
            return super()._offer(data)
        readers = list(self._dealt)
        reader = readers[self._turn % len(readers)]
        self._turn += 1
        for request in self._parked_gets:
            if request.pipe_id == reader and request.claim():
                self._parked_gets.remove(request)
                self._last_ask[reader] = time.monotonic()
                return [(request, OK, data)]
        self._dealt[reader].append(data)
        if reader == LOCAL:
            self._not_empty.notify_all()
        return []

    def _next_for(self, reader: int):
        """The next item ``reader`` may take, or None."""
        mine = self._dealt[reader]
        if mine:
            return mine.popleft()
        if self._items:
            return self._items.popleft()
        idle_since = time.monotonic() - IDLE_SECONDS
        for other, items in self._dealt.items():
            if items and other != reader and self._last_ask[other] < idle_since:
                return items.popleft()
        return None

    def _others_hold_items(self, reader: int) -> bool:
        return any(items for other, items in self._dealt.items() if other != reader)

    # --- in the owner's process -------------------------------------------
    def get(self, timeout: float | None):
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._join(LOCAL)
            while True:
                data = self._next_for(LOCAL)
                if data is not None:
                    return data
                if self._closed:
                    raise ChannelClosed
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                if self._others_hold_items(LOCAL):  # wake to take an idle reader's items
                    left = IDLE_SECONDS if left is None else min(left, IDLE_SECONDS)
                self._not_empty.wait(left)
                self._last_ask[LOCAL] = time.monotonic()

    def qsize(self) -> int:
        return len(self._items) + sum(len(items) for items in self._dealt.values())

    # --- requests from other processes ------------------------------------
    def _remote_get(self, request: Request, timeout: float) -> None:
        reader = request.pipe_id
        with self._lock:
            self._join(reader)
            data = self._next_for(reader)
            if data is not None:
                reply = (OK, data) if request.claim() else None
            elif self._closed:
                reply = (CLOSED, b"") if request.claim() else None
            elif timeout == 0:
                reply = (EMPTY, b"") if request.claim() else None
            else:
                reply = None
                self._parked_gets.append(request)
                hub = get_hub()
                if timeout > 0:
                    hub.call_at(time.monotonic() + timeout, lambda: self._expire(request, EMPTY))
                if self._others_hold_items(reader):
                    hub.call_at(time.monotonic() + IDLE_SECONDS, lambda: self._retry(request))
        if reply is not None:
            request.reply(*reply, claimed=True)

    def _retry(self, request: Request) -> None:
        """A parked get looks again for an idle reader's items."""
        with self._lock:
            if request not in self._parked_gets:
                return
            data = self._next_for(request.pipe_id)
            if data is None:
                if self._others_hold_items(request.pipe_id):
                    get_hub().call_at(time.monotonic() + IDLE_SECONDS, lambda: self._retry(request))
                return
            if not request.claim():  # expired meanwhile: the item stays with this reader
                self._dealt[request.pipe_id].appendleft(data)
                return
            self._parked_gets.remove(request)
            self._last_ask[request.pipe_id] = time.monotonic()
        request.reply(OK, data, claimed=True)

    def drop_requests_of(self, pipe_id: int) -> None:
        super().drop_requests_of(pipe_id)
        with self._lock:
            left = self._dealt.pop(pipe_id, None)
            self._last_ask.pop(pipe_id, None)
            replies = [reply for data in left or () for reply in self._offer(data)]
        self._send(replies)
