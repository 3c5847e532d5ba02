"""How a pool's tasks become bytes for its workers and their results come
back: functions pickled once per pool, tasks cut into chunks whose arguments
are pickled once, a batch of chunks laid out for a worker, a lazy (imap)
input read a chunk at a time, and a chunk's result unpickled into its
submission.
"""
from __future__ import annotations

import itertools

import cloudpickle

from ..net import wire
from .protocol import CHUNK
from .results import Submission, with_remote_traceback


class Chunk:
    """``count`` consecutive tasks of a submission, from its task ``start``, pickled together."""
    __slots__ = ("id", "submission", "start", "count", "func_id", "star", "args", "crashes", "backup", "done")

    def __init__(self, chunk_id, submission, start, count, func_id, star, args):
        self.id, self.submission, self.start, self.count = chunk_id, submission, start, count
        self.func_id, self.star, self.args, self.crashes = func_id, star, args, 0
        self.backup = None  # the worker running a backup copy of it (the pool's backup_tasks), if any
        self.done = False  # its result was delivered: a copy's result that comes after is dropped

    def name(self) -> str:
        tasks = f"task {self.start}" if self.count == 1 else f"tasks {self.start}..{self.start + self.count - 1}"
        return f"{tasks} of {self.submission.description}"


class TaskEncoder:
    """A pool's functions, each pickled once (workers fetch each once), and its chunks' ids."""

    def __init__(self):
        self.blobs: dict[int, bytearray] = {}  # by function id: its pickle
        self._func_ids: dict = {}
        # next() of an itertools.count is atomic under the GIL: callers on any thread need no lock
        self._next_func_id = itertools.count()
        self._chunk_ids = itertools.count()

    def function_id(self, func) -> int:
        """Pickle ``func`` once per pool; workers fetch it once each."""
        try:
            known = self._func_ids.get(func)
        except TypeError:  # unhashable callable: pickle it every time
            known = None
        if known is not None:
            return known
        # by plain pickle where it can (cloudpickle where it cannot, as any message): a
        # classmethod, which cloudpickle sends by value, then runs the module's own code
        # in the worker, so that a task's traceback shows its source lines
        blob = wire.encode(func)
        func_id = next(self._next_func_id)
        self.blobs[func_id] = blob  # before any chunk names it
        try:
            self._func_ids[func] = func_id
        except TypeError:
            pass
        return func_id

    def make_chunks(self, submission: Submission, func_id: int, star: bool, items: list, chunksize: int,
                    first: int = 0) -> list[Chunk]:
        """Serialise ``items`` into chunks; a chunk that cannot be pickled fails its job at once."""
        chunks = []
        for start in range(0, len(items), chunksize):
            batch = items[start:start + chunksize]
            try:
                args = wire.encode(batch)
            except Exception as exc:
                # the pickler's own exception, as multiprocessing gives it: code catches its type
                bad = next((i for i, item in enumerate(batch) if not _picklable(item)), 0)
                exc.add_note(f"task {first + start + bad} of {submission.description}: its arguments cannot be pickled")
                submission.fail(first + start, len(batch), exc)
                continue
            chunks.append(Chunk(next(self._chunk_ids), submission, first + start, len(batch), func_id, star, args))
        return chunks


class LazyInput:
    """An imap job whose input is pulled only as workers can take it."""

    def __init__(self, submission, iterator, chunksize, func_id, star):
        self.submission, self.iterator, self.chunksize = submission, iterator, chunksize
        self.func_id, self.star, self.next_index = func_id, star, 0

    def pull(self, tasks: TaskEncoder) -> tuple[list[Chunk], bool]:
        """Read the input's next chunk (this runs the caller's iterator): its chunks, and whether
        the input is exhausted.  The submission is told how many tasks were read."""
        items, exhausted, error = [], False, None
        try:
            for _ in range(self.chunksize):
                items.append(next(self.iterator))
        except StopIteration:
            exhausted = True
        except Exception as exc:
            exhausted, error = True, exc
        if error is not None:
            # a chunk's results come together, so the input's error takes the place of
            # the chunk it broke off, as in multiprocessing: what that chunk had read is dropped
            items = []
        first = self.next_index
        self.next_index += len(items)
        chunks = tasks.make_chunks(self.submission, self.func_id, self.star, items, self.chunksize, first)
        if error is not None:
            self.submission.fail(self.next_index, 1, error)
            self.next_index += 1
        self.submission.submitted(self.next_index - first, exhausted)
        return chunks, exhausted


def batch_frames(backlog: bytes, chunks: list[Chunk], known: set[int], blobs: dict[int, bytearray]) -> list:
    """The frames of a batch for a worker that has loaded the functions ``known`` (which this
    adds to): ``backlog`` (one byte, whether more work waits), the chunks' headers, then each
    function's pickle the worker has not had and each chunk's arguments."""
    meta, parts = [], []
    for chunk in chunks:
        new_func = chunk.func_id not in known
        if new_func:
            known.add(chunk.func_id)
            parts.append(blobs[chunk.func_id])
        meta.append(CHUNK.pack(chunk.id, chunk.func_id, new_func, chunk.star))
        parts.append(chunk.args)
    return wire.frames([backlog + b"".join(meta), *parts])


def deliver(chunk: Chunk, ok: bool, blob) -> None:
    """Unpickle a chunk's result and hand it, or its error, to its submission."""
    try:
        payload = wire.loads(blob)
    except Exception as exc:
        chunk.submission.fail(chunk.start, chunk.count,
                              TypeError(f"the result of {chunk.name()} could not be unpickled here: {exc!r}"))
        return
    if ok:
        chunk.submission.deliver(chunk.start, payload)
    else:
        exc, tb = payload
        chunk.submission.fail(chunk.start, chunk.count, with_remote_traceback(exc, tb))


def _picklable(obj) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:
        return False
