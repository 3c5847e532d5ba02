"""The per-process hub: one authenticated server that hosts this process's
queues and pipes, the links its children fetch their launch payloads,
send heartbeats, error reports and output over (:mod:`.parent_link`), plus
a cache of client connections to other hubs.

Started on first use -- importing fiberrl opens no socket and starts no
thread -- and closed at interpreter exit.
"""
from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import multiprocessing.util
import os
import threading
import time

from ..backends import listen_host
from ..config import get_config
from ..net.errors import PeerGone
from ..net.transport import ERROR, MISSING, OK, Client, Request, Server
from .output import write_forwarded
from .parent_link import ChildLink, ChildLinks
from .startup import prepare_process

log = logging.getLogger("fiberrl")

# a job's requests over its link; BEAT, its word that it lives, is not answered (8 is the link's
# own: parent_link.CARRY)
PING, LAUNCH, REPORT, OUTPUT, BEAT = 3, 4, 5, 6, 7
# requests to hosted objects (Q_CLOSE releases one writer handle; a pipe closes with its last)
Q_PUT, Q_GET, Q_SIZE, Q_CLOSE, Q_HOLD, Q_PEND, Q_UNPEND = 10, 11, 12, 13, 14, 15, 16


class Deadlines:
    """One thread that runs callbacks at given monotonic times."""

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fiberrl-deadlines", daemon=True)
        self._thread.start()

    def at(self, when: float, callback) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), callback))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._heap)
            try:
                callback()
            except Exception:
                log.exception("deadline callback failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)


class Hub:
    def __init__(self):
        self.pid = os.getpid()
        self._objects: dict[bytes, object] = {}
        self._orphans: set[bytes] = set()  # let go of by their creator, still used by other processes
        self._launches: dict[bytes, bytes] = {}
        self._clients: dict[str, Client] = {}
        self._lock = threading.Lock()
        self._deadlines: Deadlines | None = None
        self._server: Server | None = None
        self._addresses: dict[str, str] = {}
        self._child_links: ChildLinks | None = None
        self._child_addresses: dict[str, str] = {}

    @property
    def address(self) -> str:
        """Where the jobs of the configured backend reach this hub (the server
        starts on first use).  A process that switches backends listens on
        each one's host: queues made before the switch keep their address."""
        return self._listening(self._addresses, self._listen_for_objects)

    @property
    def child_address(self) -> str:
        """Where the jobs of the configured backend open their link to this process."""
        return self._listening(self._child_addresses, self._listen_for_children)

    def _listening(self, addresses: dict[str, str], listen) -> str:
        host = listen_host()
        address = addresses.get(host)
        if address is None:
            with self._lock:
                address = addresses.get(host)
                if address is None:
                    address = addresses[host] = listen(host)
        return address

    def _listen_for_objects(self, host: str) -> str:
        if self._server is None:
            self._server = Server(host, self._handle, self._forget_requests_of)
            return self._server.address
        return self._server.listen(host)

    def _listen_for_children(self, host: str) -> str:
        if self._child_links is None:
            self._child_links = ChildLinks(host, self._serve_child)
            return self._child_links.address
        return self._child_links.listen(host)

    def owns(self, address: str) -> bool:
        return address in self._addresses.values()

    # --- hosted objects -------------------------------------------------
    def host(self, obj_id: bytes, obj) -> None:
        self._objects[obj_id] = obj

    def unhost(self, obj_id: bytes) -> None:
        """Its creator let go of it: it goes now, or once the last process using it is gone."""
        obj = self._objects.get(obj_id)
        if getattr(obj, "users", None):
            self._orphans.add(obj_id)
        else:
            self._objects.pop(obj_id, None)

    def hosted(self, obj_id: bytes):
        return self._objects.get(obj_id)

    def offer_launch(self, process_id: bytes, payload: bytes) -> None:
        self._launches[process_id] = payload

    def withdraw_launch(self, process_id: bytes) -> None:
        self._launches.pop(process_id, None)

    def heard_from(self, process_id: bytes) -> float | None:
        """When the job of ``process_id`` last spoke over its link (``time.monotonic``); None
        before it fetched its task and once its link has ended."""
        return None if self._child_links is None else self._child_links.heard(process_id)

    def unheard_since(self, when: float) -> set[bytes]:
        """The processes whose jobs have not spoken since ``when`` (``time.monotonic``)."""
        return set() if self._child_links is None else self._child_links.unheard_since(when)

    def hang_up_on(self, process_id: bytes) -> None:
        """End the link of ``process_id``'s job (see ChildLinks.hang_up)."""
        if self._child_links is not None:
            self._child_links.hang_up(process_id)

    def carry(self, address: str, take) -> None:
        """Let this process's jobs speak to its service at ``address`` over their links
        (``ChildLinks.carry``)."""
        self.child_address  # noqa: B018 -- the links are read from here on
        self._child_links.carry(address, take)

    def stop_carrying(self, address: str) -> None:
        if self._child_links is not None:
            self._child_links.stop_carrying(address)

    def answer_link(self, stream, link: ChildLink, frames) -> None:
        """Answer requests read from a link a service carries (``ChildLinks.answer``)."""
        self._child_links.answer(stream, link, frames)

    def link_ended(self, link: ChildLink) -> None:
        self._child_links.ended(link)

    def _serve_child(self, op: int, body: memoryview, link: ChildLink) -> tuple[int, bytes] | None:
        """A request over a job's link; None: it wants no answer."""
        if op == BEAT:
            return None
        if op == PING:
            return OK, b""
        if op == LAUNCH:
            process_id = bytes(body)
            payload = self._launches.pop(process_id, None)
            if payload is None:
                return MISSING, b""
            self._child_links.name(link, process_id)
            return OK, payload
        if op == REPORT:
            log.error("%s", bytes(body).decode(errors="replace"))
            return OK, b""
        if op == OUTPUT:
            write_forwarded(body)
            return OK, b""
        return ERROR, f"unknown request {op} on a job's link".encode()

    def _handle(self, request: Request) -> None:
        obj = self._objects.get(request.obj_id)
        if obj is None:
            request.reply(MISSING)
        else:
            obj.handle(request)

    def _forget_requests_of(self, pipe_id: int) -> None:
        # a reply to a process that is gone would be lost with whatever it carries
        for obj_id, obj in list(self._objects.items()):
            obj.drop_requests_of(pipe_id)
            if obj_id in self._orphans and not getattr(obj, "users", None):
                self._orphans.discard(obj_id)
                self._objects.pop(obj_id, None)

    # --- outgoing -------------------------------------------------------
    def client(self, address: str) -> Client:
        """A live, authenticated connection to the hub at ``address``."""
        client = self._clients.get(address)
        if client is not None and client.alive:
            return client
        with self._lock:
            client = self._clients.get(address)
            if client is None or not client.alive:
                if client is not None:
                    client.close()
                client = Client(address, connect_timeout=get_config().start_timeout)
                self._clients[address] = client
            return client

    def call_at(self, when: float, callback) -> None:
        if self._deadlines is None:
            with self._lock:
                if self._deadlines is None:
                    self._deadlines = Deadlines()
        self._deadlines.at(when, callback)

    def flush(self) -> None:
        """Wait until every request posted to other hubs has been served."""
        for client in list(self._clients.values()):
            try:
                client.flush()
            except Exception as exc:
                log.warning("could not deliver everything to %s: %s", client.address, exc)

    def close(self) -> None:
        self.flush()
        if self._server is not None:
            self._server.close()
        if self._child_links is not None:
            self._child_links.close()
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
        if self._deadlines is not None:
            self._deadlines.close()


_hub: Hub | None = None
_hub_lock = threading.Lock()


def get_hub() -> Hub:
    global _hub
    hub = _hub
    if hub is not None and hub.pid == os.getpid():
        return hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():
            prepare_process()
            # a forked child cannot use its parent's listeners and threads: start afresh
            _hub = Hub()
            atexit.register(shutdown_hub)
            # a child of multiprocessing's fork or forkserver ends in os._exit, past atexit, but runs
            # multiprocessing's finalizers: there too its puts reach their queues before it ends
            # (exitpriority -100: after the other finalizers, which may still put)
            multiprocessing.util.Finalize(None, shutdown_hub, exitpriority=-100)
        return _hub


def current_hub() -> Hub | None:
    hub = _hub
    return hub if hub is not None and hub.pid == os.getpid() else None


def shutdown_hub() -> None:
    global _hub
    with _hub_lock:
        hub, _hub = _hub, None
    if hub is not None and hub.pid == os.getpid():
        hub.close()


__all__ = ["Hub", "get_hub", "current_hub", "shutdown_hub", "PeerGone"]
