"""The pool's workers' lifecycle, on one manager thread per pool: starts
workers up to the pool's size (lower in priority while they outnumber the
cores), replaces those lost (those unheard for ``silence_timeout``, on
another host, given up as lost), gives up on a pool whose workers never connect
within the startup deadline, pulls lazy (imap) input as workers can take it,
and ends the workers of a closed pool once its work is done.

It works on the scheduler's policy under the scheduler's lock, and starts,
waits for and kills processes, runs the caller's iterators and sends
replies with the lock released.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

from ..backends import resolve_name
from ..config import get_config
from ..processes.hub import get_hub
from ..processes.process import Process, cpu_count, silence_limit
from .dispatch import CLOSE, TERMINATE, Worker
from .protocol import send_replies
from .results import WorkerLostError
from .worker import run_worker

log = logging.getLogger("fiberrl.pool")
# how much lower local pool workers run while they outnumber the cores (see WorkerLifecycle.worker_nice)
OVERSUBSCRIBED_NICE = 10


class WorkerLifecycle:
    """The manager thread of ``scheduler``'s pool, and the starting and losing of its workers."""

    def __init__(self, scheduler, initializer, initargs, worker_resources: dict, local: bool):
        self._scheduler = scheduler
        self._policy, self._lock, self._wake = scheduler.policy, scheduler.lock, scheduler.wake_condition
        self._initializer, self._initargs = initializer, initargs
        self._worker_resources, self._local = worker_resources, local
        self._worker_ids = itertools.count()
        self._silence_timeout = silence_limit()
        # how often the links are looked over for silent workers: a pass costs O(workers) with the pool's
        # lock held, and the manager wakes for every worker that ends (a pool of 9,000 closing looked them
        # over 2,723 times, 0.49 s of CPU)
        self._silence_every = min(1.0, self._silence_timeout / 4)
        self._silence_looked = 0.0
        self._thread = threading.Thread(target=self._manage, name="fiberrl-pool-manager", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # --- the manager thread ---------------------------------------------------
    def _manage(self) -> None:
        policy = self._policy
        while True:
            with self._lock:
                starting = policy.starting()
                if not policy.needs_attention():
                    self._wake.wait(self._next_check(starting))
                if policy.state == TERMINATE:
                    return
                replies = policy.release_stalled()
                silent = self._silent_workers()
                lost = policy.take_lost()
                unreachable = self._none_connected_in_time(starting)
            for worker in silent:
                self._give_up(worker)
            # workers that died before connecting: the backend's status is the only witness (asked
            # with the lock released; one already handled is skipped by _handle_loss)
            lost += [w for w in starting if w.process.exitcode is not None]
            for worker in lost:
                self._handle_loss(worker)
            send_replies(replies)
            if unreachable:
                self._scheduler.fail_everything(RuntimeError(policy.broken))
            self._start_missing_workers()
            self._feed()
            with self._lock:
                replies = policy.retire_all_if_done()
                if policy.state == CLOSE and not policy.workers:
                    return
            send_replies(replies)

    def _next_check(self, starting: list[Worker]) -> float | None:
        """How long the manager may sleep unwoken: it watches starting workers, and a gate holding chunks."""
        waits = [0.5] if starting else []
        policy = self._policy
        if self._silence_timeout and len(starting) < len(policy.workers):
            waits.append(self._silence_every)
        if policy.gate.is_holding() and policy.pending:
            waits.append(policy.gate.patience(policy.pending[0].func_id))
        return min(waits, default=None)

    # --- starting ---------------------------------------------------------------
    def startup_limit(self) -> float:
        """Seconds a started worker may take to connect before it counts as unable to start."""
        config = get_config()
        # a job on a cluster may first wait to be scheduled, which the backend bounds itself
        return config.start_timeout + (0 if self._local else config.schedule_timeout)

    def _none_connected_in_time(self, starting: list[Worker]) -> bool:
        """Whether no worker runs and none of those started has connected within the
        time a job may take (with the lock held): the pool is then broken, not slow."""
        if not starting:  # the common case, and no settings to read
            return False
        limit = self.startup_limit()
        if not self._policy.startup_overdue(starting, limit, time.monotonic()):
            return False
        self._policy.broken = (f"no pool worker has connected to this process at {self._scheduler.address} in "
                               f"{limit:.0f} s (start_timeout): the workers cannot start or cannot reach it; "
                               f"see the log above")
        return True

    def worker_nice(self) -> int:
        """How much lower than this process local workers run when they outnumber the cores:
        the master, the run's servers and connections being set up then get the CPU at once.
        Measured: 1024 ES workers on 2 cores at the same priority starved the parameter
        server, whose handshakes then outlasted their 10 s."""
        if self._policy.target_size <= cpu_count() or resolve_name(get_config().backend) != "local":
            return 0
        return OVERSUBSCRIBED_NICE

    def _start_missing_workers(self) -> None:
        policy = self._policy
        with self._lock:
            missing = policy.missing_workers()  # counted once: a count per start made 10,000 starts O(W^2)
        for _ in range(missing):
            with self._lock:
                if not policy.may_start_workers():
                    return
                worker_id = next(self._worker_ids)
                process = Process(target=run_worker, name=f"PoolWorker-{worker_id}", daemon=True,
                                  args=(self._scheduler.address, worker_id, self._initializer,
                                        self._initargs, self.worker_nice()))
                process._resources = self._worker_resources
                policy.add_worker(Worker(worker_id, process, time.monotonic()))
            try:
                process.start()
            except Exception as exc:
                with self._lock:
                    policy.forget_worker(worker_id)
                    policy.broken = f"cannot start pool workers: {exc}"
                self._scheduler.fail_everything(RuntimeError(policy.broken))
                return

    # --- losing -------------------------------------------------------------------
    def _silent_workers(self) -> list[Worker]:
        """Connected workers unheard for ``silence_timeout`` (with the lock held), marked cut off."""
        now = time.monotonic()
        if not self._silence_timeout or now - self._silence_looked < self._silence_every:
            return []
        self._silence_looked = now
        # one pass over the links heard (the usual answer: none is quiet), not a lookup a worker
        since = now - self._silence_timeout
        quiet = get_hub().unheard_since(since)
        silent = []
        if quiet:
            for worker in self._policy.workers.values():  # one sending results skips its beats: heard on its stream
                if worker.stream_id is not None and not worker.cut_off and worker.process.link_id in quiet \
                        and self._scheduler.unheard_since(worker.stream_id, since):
                    worker.cut_off = True
                    silent.append(worker)
        return silent

    def _give_up(self, worker: Worker) -> None:
        """A worker cut off (its host partitioned or stalled) is lost: its stream ended here, so that
        nothing it sends after is read, its work rerun elsewhere uncharged, its job killed and its
        link ended, so that it cannot come back once its host does."""
        log.warning("pool worker %s (job %s) has not been heard for over %.0f s (silence_timeout): its host "
                    "is cut off or stalled; giving it up and rerunning its tasks elsewhere",
                    worker.process.name, worker.process.job_id, self._silence_timeout)
        self._scheduler.hang_up(worker.stream_id)
        try:
            worker.process.cut_off()
        except Exception as exc:  # the backend cannot reach it either: its lifeline ends it
            log.warning("could not kill the job of cut-off pool worker %s: %s", worker.process.name, exc)

    def _handle_loss(self, worker: Worker) -> None:
        process = worker.process
        exitcode = process.exitcode
        if exitcode is None:
            process.join(2.0)
            exitcode = process.exitcode
        lost, job_error = process.job_lost, process.job_error
        with self._lock:
            loss = self._policy.lose(worker, exitcode, lost, job_error, time.monotonic())
            if loss is None:
                return
            replies = self._policy.dispatch()
        if worker.cut_off:
            pass  # said when it was given up
        elif loss.preempted:
            log.info("pool worker %s (pid %s) was told to stop and left (exit code %s)%s", process.name, process.pid,
                     exitcode, f"; rerunning {sum(c.count for c in loss.resubmitted)} task(s) it could not finish"
                     if loss.resubmitted else "")
        elif not loss.expected:
            log.warning("pool worker %s (pid %s) died with exit code %s%s", process.name, process.pid, exitcode,
                        f"; resubmitting {sum(c.count for c in loss.resubmitted)} task(s)"
                        if loss.resubmitted else "")
        for chunk, why in loss.failed:
            chunk.submission.fail(chunk.start, chunk.count, WorkerLostError(
                f"{chunk.name()} {why} (last exit code {exitcode}); not retried again"))
        if self._policy.broken:
            self._scheduler.fail_everything(RuntimeError(self._policy.broken))
        send_replies(replies)

    # --- lazy input -------------------------------------------------------------------
    def _feed(self) -> None:
        """Pull lazy input while workers could use more (runs the caller's iterators, so not under the lock)."""
        policy, tasks = self._policy, self._scheduler.tasks
        for lazy in list(policy.lazy):
            while policy.wants_input(lazy):
                chunks, exhausted = lazy.pull(tasks)
                with self._lock:
                    replies = policy.fed(lazy, chunks, exhausted)
                send_replies(replies)
                if exhausted:
                    break
