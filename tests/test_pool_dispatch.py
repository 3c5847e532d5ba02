"""The pool's dispatch policy without processes: workers are plain records,
events go in (a worker connects, asks for work, starts or loads a chunk,
sends results, dies; tasks or lazy input come in; the pool closes or
resizes) and the replies it would send come out."""
import threading

import pytest

from fiberrl.runtime.net import wire
from fiberrl.runtime.pool.cpu_gate import CpuGate
from fiberrl.runtime.pool.crashes import MAX_STARTUP_DEATHS
from fiberrl.runtime.pool.dispatch import CLOSE, TERMINATE, DispatchPolicy, Worker
from fiberrl.runtime.pool.protocol import CHUNK, CLOSED, OK
from fiberrl.runtime.pool.tasks import LazyInput, TaskEncoder


class Request:
    """A worker's request for work, as the policy sees it."""

    def __init__(self, stream_id: int):
        self.stream_id = stream_id
        self.claimed = False

    def claim(self) -> bool:
        was, self.claimed = self.claimed, True
        return not was


class Tasks:
    """A submission that records what it is told."""

    def __init__(self):
        self.description = "map(f)"
        self.failed, self.told = [], []
        self.wants_more = True

    def fail(self, start, count, error):
        self.failed.append((start, count, error))

    def submitted(self, count, exhausted):
        self.told.append((count, exhausted))


def batch(reply):
    """(request, whether more work waits, [(chunk id, function id, function sent)]) of a batch."""
    request, status, parts = reply
    assert status == OK
    header, *blobs = wire.split(b"".join(bytes(p) for p in parts))
    chunks = [(c, f, new) for c, f, new, _star in CHUNK.iter_unpack(header[1:])]
    assert len(blobs) == len(chunks) + sum(new for _, _, new in chunks)
    return request, bool(header[0]), chunks


class Pool:
    def __init__(self, size=2, prefetch=2, maxtasks=None, max_crashes=3, gate=None, backups=False):
        self.tasks = TaskEncoder()
        self.wakes = 0
        self.policy = DispatchPolicy(size, prefetch, maxtasks, max_crashes, gate or CpuGate(0), self.tasks.blobs,
                                     self._wake, backups)
        self.now = 0.0
        self.f, self.g = self.tasks.function_id(abs), self.tasks.function_id(len)
        self.submission = Tasks()
        self._ids = iter(range(1000))

    def _wake(self):
        self.wakes += 1

    def start(self) -> Worker:
        self.now += 1
        worker = Worker(next(self._ids), None, self.now)
        self.policy.add_worker(worker)
        return worker

    def connect(self, n: int = 1) -> list[Worker]:
        workers = [self.start() for _ in range(n)]
        for worker in workers:
            assert self.policy.hello(100 + worker.id, worker.id)
        return workers

    def ask(self, worker) -> list:
        return self.policy.park(Request(worker.stream_id))

    def chunks(self, n: int, func=None, chunksize=1) -> list:
        func = self.f if func is None else func
        return self.tasks.make_chunks(self.submission, func, False, list(range(n)), chunksize)

    def submit(self, n: int, func=None) -> tuple[list, list]:
        chunks = self.chunks(n, func)
        return chunks, self.policy.add_chunks(chunks)

    def results(self, worker, chunks, ask=False, ok=True) -> tuple[list, list]:
        delivered = []
        request = Request(worker.stream_id)
        reports = [(c.id, ok, 0.01, float("nan")) for c in chunks]
        replies = self.policy.results(request, reports, [b"x"] * len(chunks), delivered, ask)
        return [c for c, _, _ in delivered], replies

    def lose(self, worker, exitcode=-9, lost=None, job_error=None):
        self.now += 1
        return self.policy.lose(worker, exitcode, lost, job_error, self.now)

    def give(self, worker, n=1, func=None) -> list:
        """``n`` new chunks, all to ``worker`` (asking alone)."""
        chunks = self.chunks(n, func)
        self.policy.pending.extend(chunks)
        [reply] = self.ask(worker)
        request, _, got = batch(reply)
        assert request.stream_id == worker.stream_id and [c for c, _, _ in got] == [c.id for c in chunks]
        return chunks


def test_chunks_go_in_order_to_idle_workers_first_up_to_prefetch():
    pool = Pool(size=2, prefetch=2)
    w0, w1 = pool.connect(2)
    assert pool.ask(w0) == [] and pool.ask(w1) == []  # parked until there is work
    chunks, replies = pool.submit(6)
    got = {request.stream_id: (more, ids) for request, more, ids in map(batch, replies)}
    ids = [c.id for c in chunks]
    assert got == {w0.stream_id: (True, [(ids[0], pool.f, True), (ids[2], pool.f, False)]),
                   w1.stream_id: (True, [(ids[1], pool.f, True), (ids[3], pool.f, False)])}
    assert list(pool.policy.pending) == chunks[4:]
    assert pool.policy.counts["in_flight"] == 4 and pool.policy.working == 2
    # its next batch carries no function it has loaded
    done, replies = pool.results(w0, chunks[0:1] + chunks[2:3], ask=True)
    assert done == [chunks[0], chunks[2]]
    [(_, more, got)] = map(batch, replies)
    assert got == [(ids[4], pool.f, False), (ids[5], pool.f, False)] and not more


def test_a_worker_gets_a_second_chunk_only_while_more_wait_than_workers_without_one():
    """No task waits behind a blocked one while a worker (starting ones included) is free."""
    pool = Pool(size=3, prefetch=2)
    w0 = pool.connect()[0]
    pool.start(), pool.start()  # not connected yet
    pool.ask(w0)
    chunks, replies = pool.submit(3)
    [(_, more, got)] = map(batch, replies)
    assert [c for c, _, _ in got] == [chunks[0].id] and more
    w1, w2 = pool.connect(2)
    assert [batch(r)[2][0][0] for w in (w1, w2) for r in pool.ask(w)] == [chunks[1].id, chunks[2].id]



def test_a_worker_takes_a_second_chunk_while_more_wait_than_workers_without_one():
    pool = Pool(size=3, prefetch=2)
    w0 = pool.connect()[0]
    pool.ask(w0)
    chunks, replies = pool.submit(4)
    [(_, more, got)] = map(batch, replies)
    assert [c for c, _, _ in got] == [chunks[0].id, chunks[1].id] and more


def test_each_result_is_delivered_once_and_a_lost_workers_late_results_are_refused():
    pool = Pool(size=1)
    w0 = pool.connect()[0]
    chunks = pool.give(w0, 2)
    assert pool.results(w0, chunks[:1])[0] == chunks[:1]
    assert pool.results(w0, chunks[:1])[0] == []  # said again: nothing new
    assert pool.policy.counts["done"] == 1 and pool.policy.counts["in_flight"] == 1
    pool.lose(w0)
    done, replies = pool.results(w0, chunks[1:], ask=True)
    assert done == [] and [status for _, status, _ in replies] == [CLOSED]
    assert list(pool.policy.pending) == chunks[1:]  # it runs elsewhere, and is delivered from there
    w1 = pool.connect()[0]
    pool.ask(w1)
    assert pool.results(w1, chunks[1:])[0] == chunks[1:]
    assert pool.policy.counts == dict(done=2, failed=0, resubmitted=1, restarts=1, preempted=0, cut_off=0, in_flight=0,
                                      backups=0, backups_first=0)


def test_a_loss_charges_only_the_chunk_the_worker_said_it_started_and_reruns_all_first():
    pool = Pool(size=1)
    w0 = pool.connect()[0]
    held = pool.give(w0, 2)
    waiting, _ = pool.submit(2)
    pool.policy.started(w0.stream_id, held[0].id)
    loss = pool.lose(w0)
    assert [c.crashes for c in held] == [1, 0] and not loss.failed and not loss.expected
    assert loss.resubmitted == held and list(pool.policy.pending) == held + waiting
    assert pool.policy.counts["resubmitted"] == 2 and pool.policy.counts["in_flight"] == 0
    assert pool.lose(w0) is None  # handled once


def test_chunks_only_held_or_killed_with_others_are_rerun_free():
    pool = Pool(size=1)
    w0 = pool.connect()[0]
    held = pool.give(w0, 2)  # it never said it started one
    pool.lose(w0)
    assert [c.crashes for c in held] == [0, 0] and list(pool.policy.pending) == held
    w1 = pool.connect()[0]
    [reply] = pool.ask(w1)
    assert [c for c, _, _ in batch(reply)[2]] == [c.id for c in held]
    pool.policy.started(w1.stream_id, held[0].id)
    loss = pool.lose(w1, lost="its fork server was killed")
    assert [c.crashes for c in held] == [0, 0] and loss.resubmitted == held
    assert pool.policy.crashes.startup_deaths == 0


def test_a_worker_told_to_stop_keeps_its_running_chunk_and_hands_back_the_rest_uncharged():
    pool = Pool(size=1, prefetch=3)
    w0 = pool.connect()[0]
    held = pool.give(w0, 3)
    pool.policy.started(w0.stream_id, held[0].id)
    wakes = pool.wakes
    assert pool.policy.leave(w0.stream_id) == []  # nobody else asks yet
    assert w0.retiring and pool.wakes > wakes and pool.policy.wants_worker()  # its successor starts
    assert list(w0.inflight) == held[:1] and list(pool.policy.pending) == held[1:]
    assert pool.policy.counts["resubmitted"] == 2 and pool.policy.counts["in_flight"] == 1
    w1 = pool.connect()[0]
    [reply] = pool.ask(w1)
    assert [c for c, _, _ in batch(reply)[2]] == [c.id for c in held[1:]]
    done, replies = pool.results(w0, held[:1], ask=True)  # it finished its chunk in time, and is retired
    assert done == held[:1] and [status for _, status, _ in replies] == [CLOSED]
    loss = pool.lose(w0, exitcode=0)
    assert loss.preempted and not loss.resubmitted and not loss.failed
    assert pool.policy.counts["preempted"] == 1 and pool.policy.counts["restarts"] == 0


def test_a_chunk_a_stopped_worker_could_not_finish_runs_again_uncharged():
    pool = Pool(size=1, max_crashes=1)
    w0 = pool.connect()[0]
    [chunk] = pool.give(w0, 1)
    pool.policy.started(w0.stream_id, chunk.id)
    pool.policy.leave(w0.stream_id)
    loss = pool.lose(w0, exitcode=143)  # the grace ran out
    assert chunk.crashes == 0 and loss.resubmitted == [chunk] and not loss.failed and loss.preempted
    assert list(pool.policy.pending) == [chunk] and pool.policy.counts["restarts"] == 0


def test_a_worker_stopped_before_it_could_say_so_is_no_startup_death():
    pool = Pool(size=1)
    for _ in range(MAX_STARTUP_DEATHS + 1):
        loss = pool.lose(pool.start(), exitcode=143)
        assert loss.preempted
    assert pool.policy.broken is None and pool.policy.crashes.startup_deaths == 0


def test_a_chunk_fails_once_it_was_running_max_task_crashes_times():
    pool = Pool(size=1, max_crashes=2)
    [chunk] = pool.submit(1)[0]
    for crash in (1, 2):
        worker = pool.connect()[0]
        [reply] = pool.ask(worker)
        assert batch(reply)[2][0][0] == chunk.id
        pool.policy.started(worker.stream_id, chunk.id)
        loss = pool.lose(worker)
        assert chunk.crashes == crash
    assert loss.failed == [(chunk, "was running each of the 2 times a worker died")]
    assert not pool.policy.pending and pool.policy.counts["failed"] == 1


def test_deaths_loading_a_function_no_worker_has_loaded_fail_its_chunks_after_max_crashes_times_size():
    pool = Pool(size=2, max_crashes=2)
    bad, _ = pool.submit(3, pool.g)
    good, _ = pool.submit(1, pool.f)
    for death in range(1, 5):
        worker = pool.connect()[0]
        pool.ask(worker)
        pool.policy.loading(worker.stream_id)
        assert worker.loading == pool.g
        loss = pool.lose(worker)
        assert pool.policy.crashes.load_deaths == {pool.g: death}
        if death < 4:
            assert not loss.failed and all(c.crashes == 0 for c in bad)
    why = "needs a function that 4 workers died loading, and none has loaded"
    assert sorted(c.id for c, reason in loss.failed if reason == why) == sorted(c.id for c in bad)
    assert list(pool.policy.pending) == good and pool.policy.counts["failed"] == 3


def test_loading_a_function_some_worker_has_loaded_kills_nobody():
    pool = Pool(size=2, max_crashes=1)
    w0, w1 = pool.connect(2)
    pool.ask(w0), pool.ask(w1)
    chunks, _ = pool.submit(4)
    pool.policy.loading(w0.stream_id)
    pool.policy.started(w0.stream_id, w0.inflight[0].id)  # it loaded the function
    pool.policy.loading(w1.stream_id)
    loss = pool.lose(w1)
    assert not loss.failed and pool.policy.crashes.load_deaths == {} and len(loss.resubmitted) == 2


def test_workers_dying_before_asking_for_work_break_the_pool_counted_once_a_generation():
    pool = Pool(size=2)
    together = [pool.start(), pool.start()]
    for worker in together:
        pool.lose(worker)
    assert pool.policy.crashes.startup_deaths == 1 and not pool.policy.broken  # killed together: once
    for deaths in range(2, MAX_STARTUP_DEATHS + 1):
        pool.lose(pool.start())
        assert pool.policy.crashes.startup_deaths == deaths
    assert "keep dying before taking any task (last exit code -9)" in pool.policy.broken
    assert not pool.policy.wants_worker()


def test_a_worker_asking_for_work_sets_startup_deaths_back_and_killed_ones_are_not_counted():
    pool = Pool(size=2)
    pool.lose(pool.start())
    pool.lose(pool.start())
    pool.ask(pool.connect()[0])
    assert pool.policy.crashes.startup_deaths == 0
    pool.lose(pool.start(), lost="host gone")
    assert pool.policy.crashes.startup_deaths == 0 and not pool.policy.broken


def test_a_backends_job_error_breaks_the_pool_only_while_no_worker_is_connected():
    pool = Pool(size=2)
    pool.connect()
    pool.lose(pool.start(), job_error="no such image")
    assert not pool.policy.broken
    pool2 = Pool(size=2)
    pool2.lose(pool2.start(), job_error="no such image")
    assert pool2.policy.broken == "pool workers cannot start: no such image"


def test_a_worker_retires_after_maxtasksperchild_once_it_holds_nothing():
    pool = Pool(size=1, prefetch=2, maxtasks=1)
    w0 = pool.connect()[0]
    held = pool.give(w0, 2)
    pool.submit(2)
    wakes = pool.wakes
    done, replies = pool.results(w0, held[:1])
    assert done == held[:1] and w0.retiring and pool.wakes > wakes  # its successor is started
    assert pool.policy.wants_worker()
    done, replies = pool.results(w0, held[1:], ask=True)
    assert done == held[1:] and [status for _, status, _ in replies] == [CLOSED]  # no more work for it
    assert len(pool.policy.pending) == 2
    loss = pool.lose(w0, exitcode=0)
    assert loss.expected and pool.policy.counts["restarts"] == 0


def test_lazy_input_is_pulled_below_the_watermark_and_its_error_takes_a_chunks_place():
    pool = Pool(size=1, prefetch=1)
    assert pool.policy.watermark() == 2

    def items():
        yield from range(5)
        raise KeyError("input")

    lazy = LazyInput(pool.submission, items(), 2, pool.f, False)
    pool.policy.lazy.append(lazy)
    assert pool.policy.needs_attention()
    pulled = []
    while pool.policy.wants_input(lazy):
        chunks, exhausted = lazy.pull(pool.tasks)
        pulled += chunks
        assert pool.policy.fed(lazy, chunks, exhausted) == []
    assert len(pool.policy.pending) == 2 and pool.submission.told == [(2, False), (2, False)]
    lazy.submission.wants_more = False  # the caller has not read its results
    w0 = pool.connect()[0]
    [reply] = pool.ask(w0)
    assert batch(reply)[1]  # more is waiting: lazy input
    assert not pool.policy.wants_input(lazy)
    lazy.submission.wants_more = True
    chunks, exhausted = lazy.pull(pool.tasks)
    assert exhausted and [(c.start, c.count) for c in chunks] == []
    pool.policy.fed(lazy, chunks, exhausted)
    assert pool.policy.lazy == [] and pool.submission.told[-1] == (1, True)
    [(start, count, error)] = pool.submission.failed
    assert (start, count, type(error)) == (4, 1, KeyError)  # item 4 was read, and dropped with its chunk


def test_a_closed_pool_retires_its_workers_once_everything_is_done():
    pool = Pool(size=2)
    w0, w1 = pool.connect(2)
    held = pool.give(w0, 1)
    pool.ask(w1)
    pool.policy.state = CLOSE
    assert pool.policy.retire_all_if_done() == []  # w0 still runs a chunk
    wakes = pool.wakes
    done, replies = pool.results(w0, held, ask=True)
    assert pool.wakes > wakes and pool.policy.needs_attention()
    assert pool.policy.retire_all_if_done() and pool.policy.retire_all_if_done() == []
    assert not pool.policy.idle and not pool.policy.busy and w0.parked is None


def test_a_terminating_pool_gives_no_work():
    pool = Pool(size=1)
    w0 = pool.connect()[0]
    pool.submit(2)
    pool.policy.state = TERMINATE
    assert [status for _, status, _ in pool.ask(w0)] == [CLOSED]


def test_shrinking_retires_the_least_busy_workers_first_once_they_hold_nothing():
    pool = Pool(size=3, prefetch=2)
    w0, w1, w2 = pool.connect(3)
    pool.ask(w0)
    chunks, _ = pool.submit(4)
    assert [c.id for c in w0.inflight] == [c.id for c in chunks[:2]]
    pool.ask(w2)
    assert list(w2.inflight) == chunks[2:3] and list(pool.policy.pending) == chunks[3:]
    assert pool.policy.resize(1) == []  # w1 (none) and w2 (one) go; neither waits for an answer
    assert (w0.retiring, w1.retiring, w2.retiring) == (False, True, True) and not pool.policy.wants_worker()
    assert [status for _, status, _ in pool.ask(w1)] == [CLOSED]
    done, replies = pool.results(w2, chunks[2:3], ask=True)
    assert done == chunks[2:3] and [status for _, status, _ in replies] == [CLOSED]
    _, replies = pool.results(w0, chunks[:2], ask=True)
    assert [batch(r)[2][0][0] for r in replies] == [chunks[3].id]


def test_the_cpu_gate_holds_chunks_of_a_cpu_bound_function_back_and_wakes_the_manager():
    gate = CpuGate(1)
    pool = Pool(size=4, prefetch=1, gate=gate)
    for _ in range(3):
        gate.observe(pool.f, 1.0, 1.0)
    workers = pool.connect(4)
    for worker in workers:
        pool.ask(worker)
    chunks, replies = pool.submit(4)
    [(request, _, got)] = map(batch, replies)
    # one at a time, to the worker idle for the shortest time
    assert request.stream_id == workers[-1].stream_id and [c for c, _, _ in got] == [chunks[0].id]
    assert gate.is_holding() and pool.wakes == 1
    _, replies = pool.results(workers[-1], chunks[:1])
    assert [batch(r)[2][0][0] for r in replies] == [chunks[1].id]


def test_a_stream_that_ends_is_a_lost_worker_for_the_manager():
    pool = Pool(size=1)
    w0 = pool.connect()[0]
    pool.policy.stream_ended(w0.stream_id)
    assert pool.wakes == 1 and pool.policy.needs_attention()
    assert pool.policy.take_lost() == [w0] and pool.policy.take_lost() == []


def test_a_pool_none_of_whose_workers_connects_in_time_is_overdue():
    pool = Pool(size=2)
    a, b = pool.start(), pool.start()
    assert not pool.policy.startup_overdue([a, b], 10, a.started_at + 9)
    assert pool.policy.startup_overdue([a, b], 10, a.started_at + 10)
    pool.policy.hello(7, b.id)
    assert not pool.policy.startup_overdue([a], 10, a.started_at + 100)  # one runs: slow, not broken


@pytest.mark.parametrize("chunksize", [1, 3])
def test_a_chunk_of_unpicklable_arguments_fails_at_once_and_the_others_go(chunksize):
    pool = Pool()
    items = [1, 2, 3, 4, 5]
    items[2 if chunksize == 1 else 4] = threading.Lock()
    chunks = pool.tasks.make_chunks(pool.submission, pool.f, False, items, chunksize)
    [(start, count, error)] = pool.submission.failed
    assert (start, count) == ((2, 1) if chunksize == 1 else (3, 2)) and isinstance(error, TypeError)
    assert error.__notes__ == [f"task {2 if chunksize == 1 else 4} of map(f): its arguments cannot be pickled"]
    assert [(c.start, c.count) for c in chunks] == ([(0, 1), (1, 1), (3, 1), (4, 1)] if chunksize == 1 else [(0, 3)])
    assert len({c.id for c in chunks}) == len(chunks)


# --- backup tasks ---------------------------------------------------------------------
def test_without_backups_a_worker_with_nothing_to_do_waits():
    pool = Pool(size=2)
    w0, w1 = pool.connect(2)
    [chunk] = pool.give(w0)
    pool.policy.started(w0.stream_id, chunk.id)
    assert pool.ask(w1) == []


def test_a_backup_copy_runs_on_an_idle_worker_and_the_first_result_is_delivered_once():
    pool = Pool(size=3, backups=True)
    w0, w1, w2 = pool.connect(3)
    pool.ask(w0), pool.ask(w1)
    (first, second), _ = pool.submit(2)
    pool.policy.started(w1.stream_id, second.id)
    pool.policy.started(w0.stream_id, first.id)
    [reply] = pool.ask(w2)
    assert [c for c, _, _ in batch(reply)[2]] == [first.id]  # the one running longest
    assert pool.results(w2, [first], ask=True)[0] == [first]
    assert pool.policy.counts["backups"] == 2  # w2, idle again, took a copy of the other
    assert pool.results(w1, [second])[0] == [second]
    assert pool.results(w0, [first])[0] == []  # the original's result, later: dropped
    assert pool.results(w2, [second])[0] == []
    counts = pool.policy.counts
    assert (counts["done"], counts["in_flight"], counts["backups"], counts["backups_first"]) == (2, 0, 2, 1)
    assert pool.policy.all_done() and pool.policy.working == 0


def test_a_lost_copy_is_rerun_only_when_no_copy_is_left():
    pool = Pool(size=2, backups=True)
    w0, w1 = pool.connect(2)
    [chunk] = pool.give(w0)
    pool.policy.started(w0.stream_id, chunk.id)
    pool.ask(w1)
    loss = pool.lose(w0)
    assert loss.resubmitted == [] and loss.failed == [] and not pool.policy.pending
    assert chunk.crashes == 0  # its copy runs on: nothing was lost
    loss = pool.lose(w1)
    assert loss.resubmitted == [chunk] and list(pool.policy.pending) == [chunk]
    w2 = pool.connect()[0]
    pool.ask(w2)
    assert pool.results(w2, [chunk])[0] == [chunk]
    counts = pool.policy.counts
    assert (counts["done"], counts["in_flight"], counts["resubmitted"]) == (1, 0, 1)
