"""Thousands of pool workers on one master, by simulation: what the master spends as the cluster grows.

    python experiments/micro/sim_many_workers.py [--workers 16,256,1024,4096,10000] [--task-s 0.2]
                                           [--zero-tasks 20000] [--rounds 3] [--simulators 2]

A real ``Pool`` in this process starts W workers on a backend of the bench's own (``simulated``):
each job is handed to a simulator process, where it does what a real worker's job does, over real
authenticated TCP streams with a MAC on every frame (the path jobs on other hosts take, not the
local Unix sockets): it connects to the master's hub, fetches its task (LAUNCH: the pickled
``Process`` whose target is the pool's worker loop; its arguments name the pool and the worker),
beats over that link as its lifeline does (every ``lifeline.beat_interval()``, one beat in
``heartbeat_timeout / ANSWER_EVERY`` asking for an answer, and, where the runtime has
``lifeline.spoke``, no unanswered beat within a beat's interval of sending results, and where it has
``lifeline.heard_from_parent``, none asking for an answer within that quarter of getting work),
connects to the pool and speaks the pool's worker protocol (``fiberrl.runtime.pool.protocol``) message for message, as
``pool.worker.run_worker`` does: hello, asking for work, saying when it loads a function and
starts a chunk, sending results, asking for its next batch as it starts the last chunk of one
that said more was waiting.  Only running a task is simulated: a task ``(value, seconds)`` of
``simulated_task`` takes ``seconds`` of the simulator's clock and returns ``value``, so every
result is checked.  Thousands of workers share one simulator (an epoll loop and a heap of
timers); their connections are set up by a few threads.

For each W, on a fresh pool: the time for all W to connect; the master's resident memory per
connected worker; the master's CPU per second with the pool idle (the heartbeats) and the
heartbeats per second, idle and during the unchunked zero-cost tasks (and how many the simulators sent
over a second late, and how many workers
the master gave up for silence: on this small machine the simulators and the master share the
cores); ES-shaped maps (2W tasks of ``--task-s`` seconds, chunks as the pool
chooses): their time against the ideal (2 tasks a worker) and the master's CPU per task; and
``--zero-tasks`` tasks of no time unchunked (chunksize 1), and ten times as many chunked (the
pool's chunksize), ``--rounds`` times each in turn, the medians:
tasks per second and the master's CPU per task, and the simulators' CPU per task beside it.  The
master's CPU is this process's (every thread: ``time.process_time``), and of it, per unchunked task, the
kernel's part (``kernel us``: system calls and the TCP work they do); the simulators run beside it
on the same cores, so on a small machine the tasks per second are the pair's.  Also per W: the
workers whose stream broke (the first few say why on stderr), that the pool retired or the backend
stopped before the pool closed, and the packets the kernel dropped meanwhile (every simulated
worker's traffic crosses the loopback's one backlog), and the time and master CPU to close the
pool (``close`` and ``join``: every worker retired).  One set of simulators serves every W, or
a new one each W with ``--fresh-simulators``.  ``--repeat N`` runs the list of W N times in turn, so
that each ratio below is of rows run minutes apart (this machine's speed moves by more than the
ratio's margin within an hour), and the last line gives the medians over the passes (memory a
worker: the first pass's, whose pools grew a fresh process).  Its last line:
``sim_many_workers: W=<largest> connect_s=<s> rss_per_worker_kib=<KiB> cpu_per_task_ratio=<at
largest W / at the smallest> tasks_per_s=<n>``: the ratio is of the master's CPU per unchunked
zero-cost task (the same tasks at every W, so only what grows with W can move it: heartbeats
included), the tasks per second are the chunked ones at the largest W.

The master holds one stream a worker, its job's link, which carries the pool's messages too
(``parent_link.CARRY``; on the commits before it, two: the link and a pool stream): W is bounded
here by the open-files limit (``ulimit -n``), which this script raises to its hard limit.
"""
from __future__ import annotations

import argparse
import heapq
import math
import os
import pickle
import queue
import random
import resource
import selectors
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import cloudpickle

import fiberrl.runtime as mp
from fiberrl.runtime import backends
from fiberrl.runtime.backends import Backend, Job, JobStatus
from fiberrl.runtime.net import auth, wire
from fiberrl.runtime.net import stream as streams
from fiberrl.runtime.net.dial import connect
from fiberrl.runtime.net.errors import LinkError
from fiberrl.runtime.net.transport import OK
from fiberrl.runtime.pool.protocol import (CHUNK, CHUNK_ID, REPORT, W_GET, W_HELLO, W_LOAD, W_RESULT, W_RESULT_GET,
                                           W_START, WORKER_ID)
from fiberrl.runtime.processes import hub, lifeline, parent_link
from fiberrl.runtime.processes.hub import LAUNCH, PING

# as the runtime's lifeline beats (getattr: the bench also measures the commits before a beat
# could go unanswered, when every beat was an answered PING)
BEAT = getattr(hub, "BEAT", PING)
ANSWER_EVERY = getattr(lifeline, "ANSWER_EVERY", math.inf)
# as its workers do since their pool counts their results as hearing from them: a beat that asks for no
# answer is left out by a worker that sent results within a beat's interval
QUIET_WHILE_SPEAKING = hasattr(lifeline, "spoke")
# as its workers do since work from their pool counts as an answer from it: a beat asks for one only once a
# quarter of heartbeat_timeout has passed without either
WORK_ANSWERS = hasattr(lifeline, "heard_from_parent")
# as its workers do since a job's link carries its pool: one stream, the link's replies marked (getattr:
# the bench also measures the commits before, a link and a pool stream a worker)
CARRY = getattr(parent_link, "CARRY", None)
REPLY = getattr(parent_link, "REPLY", None)

PAGE = os.sysconf("SC_PAGE_SIZE")


def simulated_task(task):
    """What a simulated task stands for (a real worker would run it): ``task`` is (value, seconds)."""
    value, seconds = task
    time.sleep(seconds)
    return value


# --- the master's side: a backend whose jobs are simulated ------------------------------------
class SimulatedJobState:
    __slots__ = ("ended", "code")

    def __init__(self):
        self.ended = threading.Event()
        self.code: int | None = None


class SimulatedBackend(Backend):
    """Jobs handed to simulator processes, round robin, over their stdin; they say on stdout when one ended."""

    name = "simulated"
    simulators = 1

    def __init__(self):
        self._jobs: dict[str, SimulatedJobState] = {}
        self._ids = iter(range(1, 1 << 62))
        self._lock = threading.Lock()
        self._counts: queue.Queue = queue.Queue()
        self._sims: list[subprocess.Popen] = []
        self.start_simulators()

    def start_simulators(self) -> None:
        """New simulator processes for the jobs created from now on (the old ones end with their jobs)."""
        env = dict(os.environ, **{auth.SECRET_ENV: auth.run_secret().hex()})
        config = mp.get_config()
        # getattr: before beat_interval(), a job beat every heartbeat_interval
        every = getattr(lifeline, "beat_interval", lambda: config.heartbeat_interval)()
        beats = [str(every), str(config.heartbeat_timeout)]
        self.close()
        self._sims = [subprocess.Popen([sys.executable, __file__, "--simulator", *beats], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
                      for _ in range(self.simulators)]
        for sim in self._sims:
            threading.Thread(target=self._read_ends, args=(sim,), daemon=True).start()

    def simulators_cpu_s(self) -> float:
        """The simulator processes' CPU seconds, all of them together."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for sim in self._sims:
            with open(f"/proc/{sim.pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def listen_host(self) -> str:
        return "127.0.0.1"

    def create_job(self, spec) -> Job:
        from fiberrl.runtime import env_names
        with self._lock:
            n = next(self._ids)
            job_id = f"sim-{n}"
            self._jobs[job_id] = state = SimulatedJobState()
            self._tell(self._sims[n % len(self._sims)],
                       f"start {job_id} {spec.env[env_names.PARENT_ADDRESS]} {spec.env[env_names.PROCESS_ID]}")
        return Job(id=job_id, spec=spec, host="127.0.0.1", handle=state)

    def _tell(self, sim, line: str) -> None:
        sim.stdin.write(line + "\n")

    def status(self, job):
        state = job.handle
        return (JobStatus.EXITED, state.code) if state.ended.is_set() else (JobStatus.RUNNING, None)

    def wait(self, job, timeout=None):
        return job.handle.code if job.handle.ended.wait(timeout) else None

    def terminate(self, job, force: bool = False) -> None:
        if not job.handle.ended.is_set():
            with self._lock:
                for sim in self._sims:
                    self._tell(sim, f"stop {job.id} {-9 if force else -15}")

    def counters(self) -> dict:
        """The simulators' heartbeat counts and such, summed."""
        with self._lock:
            for sim in self._sims:
                self._tell(sim, "count")
        totals: dict = {}
        for _ in self._sims:
            for key, value in self._counts.get().items():
                totals[key] = totals.get(key, 0) + value
        return totals

    def _read_ends(self, sim) -> None:
        for line in sim.stdout:
            kind, *rest = line.split()
            if kind == "exit":
                state = self._jobs.pop(rest[0], None)
                if state is not None:
                    state.code = int(rest[1])
                    state.ended.set()
            elif kind == "count":
                self._counts.put({k: int(v) for k, v in (item.split("=") for item in rest)})

    def close(self) -> None:
        for sim in self._sims:
            try:
                sim.stdin.close()
            except OSError:
                pass
            sim.wait(30)


# --- the simulator: thousands of workers' jobs on one epoll loop --------------------------------
class SimWorker:
    __slots__ = ("job_id", "link", "pool", "chunks", "busy", "ended", "beat_due", "asked", "spoke", "heard")

    def __init__(self, job_id: str, link, pool):
        self.job_id, self.link, self.pool = job_id, link, pool
        self.chunks: deque = deque()  # (chunk id, loads a function, values, seconds, asks for more as it starts)
        self.busy = False
        self.ended = False
        self.beat_due = 0.0
        self.asked = time.monotonic()  # when its lifeline last asked for an answer
        self.spoke = -math.inf  # when it last sent results
        self.heard = -math.inf  # when it last got work


class Simulator:
    def __init__(self, heartbeat_s: float, heartbeat_timeout: float):
        streams.LOCAL_SOCKETS = False  # as a job on another host: TCP, a MAC on every frame
        self.heartbeat_s, self.heartbeat_timeout = heartbeat_s, heartbeat_timeout
        self.selector = selectors.EpollSelector()
        self.timers: list = []
        self.seq = 0
        self.workers: dict[str, SimWorker] = {}
        self.ready: deque = deque()  # workers whose connections a setup thread made
        # beats_late: sent over a second after they were due (the simulator behind, not the master)
        self.counts = {"heartbeats": 0, "beats_late": 0, "beats_left_out": 0, "chunks": 0, "tasks": 0, "workers": 0,
                       "streams_lost": 0, "retired": 0,
                       "stopped": 0}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, ("control", None))
        self.control_buffer = b""
        self.setup = ThreadPoolExecutor(8)
        self.out_lock = threading.Lock()

    def say(self, line: str) -> None:
        with self.out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    # -- a job starting: what pool workers' jobs do before their loop (on a setup thread) ------
    def start(self, job_id: str, parent: str, process_id: str) -> None:
        try:
            link = connect(parent)
            link.send([bytes((LAUNCH,)), bytes.fromhex(process_id)])
            status, payload = link_reply(link.recv())
            if status != OK:
                raise RuntimeError(f"{job_id}: its parent had no task for it")
            _prep, body = pickle.loads(payload)
            process = cloudpickle.loads(body)
            master, worker_id = process._args[0], process._args[1]
            if CARRY is not None:  # as pool.worker.stream_to: the link carries the pool
                link.send([bytes((CARRY,)), master.encode()])
                if link_reply(link.recv())[0] != OK:
                    raise RuntimeError(f"{job_id}: its parent's link would not carry the pool")
                pool = link
            else:
                pool = connect(master)
            pool.send([bytes((W_HELLO,)), WORKER_ID.pack(worker_id)])
            if pool.recv()[0] != OK:
                raise RuntimeError(f"{job_id}: the pool did not want it")
        except (LinkError, OSError, RuntimeError) as exc:
            sys.stderr.write(f"simulated job {job_id} failed to start: {exc}\n")
            self.say(f"exit {job_id} 1")
            return
        self.ready.append(SimWorker(job_id, link, pool))
        os.write(self.wake_w, b"w")

    def adopt(self, worker: SimWorker) -> None:
        self.workers[worker.job_id] = worker
        self.counts["workers"] += 1
        self.selector.register(worker.link.sock, selectors.EVENT_READ, ("link", worker))
        if worker.pool is not worker.link:
            self.selector.register(worker.pool.sock, selectors.EVENT_READ, ("pool", worker))
        worker.beat_due = time.monotonic() + random.random() * self.heartbeat_s
        self.at(worker.beat_due, self.beat, worker)
        self.send(worker, [bytes((W_GET,))])

    # -- the loop ----------------------------------------------------------------------------
    def at(self, when: float, callback, worker) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (when, self.seq, callback, worker))

    def run(self) -> None:
        while True:
            timeout = max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else None
            for key, _ in self.selector.select(timeout):
                kind, worker = key.data
                if kind == "wake":
                    os.read(self.wake_r, 4096)
                    while self.ready:
                        self.adopt(self.ready.popleft())
                elif kind == "control":
                    data = os.read(0, 1 << 16)
                    if not data:
                        return
                    *lines, self.control_buffer = (self.control_buffer + data).split(b"\n")
                    for line in lines:
                        self.control(line.decode().split())
                elif not worker.ended:
                    self.readable(kind, worker)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, callback, worker = heapq.heappop(self.timers)
                if not worker.ended:
                    callback(worker)

    def control(self, words: list[str]) -> None:
        if words[0] == "start":
            self.setup.submit(self.start, *words[1:])
        elif words[0] == "stop":
            self.counts["stopped"] += 1
            worker = self.workers.get(words[1])
            if worker is not None:
                self.end(worker, int(words[2]))
        elif words[0] == "count":
            self.say("count " + " ".join(f"{k}={v}" for k, v in self.counts.items()))

    def lost(self, worker: SimWorker, code: int, exc: LinkError, where: str) -> None:
        """A stream of the worker's broke: the first few say why on stderr."""
        self.counts["streams_lost"] += 1
        if self.counts["streams_lost"] <= 5:
            sys.stderr.write(f"simulated job {worker.job_id}: its {where} broke: {exc!r}\n")
        self.end(worker, code)

    def end(self, worker: SimWorker, code: int) -> None:
        if worker.ended:
            return
        worker.ended = True
        for stream in {worker.link, worker.pool}:
            try:
                self.selector.unregister(stream.sock)
            except (KeyError, ValueError):
                pass
            stream.close()
        del self.workers[worker.job_id]
        self.say(f"exit {worker.job_id} {code}")

    def send(self, worker: SimWorker, parts) -> None:
        try:
            worker.pool.send(parts)
        except LinkError as exc:
            self.lost(worker, 0, exc, "pool stream (sending)")  # the master is gone, or gave it up

    def readable(self, kind: str, worker: SimWorker) -> None:
        stream = worker.link if kind == "link" else worker.pool
        try:
            frames = stream.recv_ready()
        except LinkError as exc:
            self.lost(worker, 0 if kind == "pool" else 75, exc, f"{kind} stream")
            return
        for frame in frames:  # over the link: the pool's frames, and replies to its PINGs (dropped)
            if kind == "pool" or (REPLY is not None and frame[0] != REPLY):
                worker.heard = time.monotonic()
                self.batch(worker, frame)

    # -- the lifeline (processes.lifeline): a beat every heartbeat_s, one in heartbeat_timeout /
    # ANSWER_EVERY asking for an answer (read and dropped when it comes) ------------------------
    def beat(self, worker: SimWorker) -> None:
        now = time.monotonic()
        op = BEAT
        last_word = max(worker.asked, worker.heard) if WORK_ANSWERS else worker.asked
        if now - last_word >= self.heartbeat_timeout / ANSWER_EVERY:
            op, worker.asked = PING, now
        if op == BEAT and QUIET_WHILE_SPEAKING and now - worker.spoke < self.heartbeat_s:
            self.counts["beats_left_out"] += 1
        else:
            try:
                worker.link.send([bytes((op,)), b""])
            except LinkError as exc:
                self.lost(worker, 75, exc, "link (beating)")
                return
            self.counts["heartbeats"] += 1
            self.counts["beats_late"] += now - worker.beat_due > 1.0
        worker.beat_due = now + self.heartbeat_s
        self.at(worker.beat_due, self.beat, worker)

    # -- the pool's worker loop, message for message -----------------------------------------
    def batch(self, worker: SimWorker, frame) -> None:
        if frame[0] != OK:  # retired
            self.counts["retired"] += 1
            if worker.chunks or worker.busy:
                sys.stderr.write(f"simulated job {worker.job_id}: retired (status {frame[0]}) holding "
                                 f"{len(worker.chunks)} chunk(s)\n")
            self.end(worker, 0)
            return
        parts = wire.split(memoryview(frame)[1:])
        backlog = bool(parts[0][0])
        batch = list(CHUNK.iter_unpack(parts[0][1:]))
        blobs = iter(parts[1:])
        for i, (chunk_id, _func_id, has_func, _star) in enumerate(batch):
            if has_func:
                next(blobs)  # the function: a real worker loads it
            tasks = wire.loads(next(blobs))
            last = i + 1 == len(batch)
            worker.chunks.append((chunk_id, has_func, [t[0] for t in tasks], sum(t[1] for t in tasks),
                                  last and backlog, last and not backlog))
        if not worker.busy:
            self.next_chunk(worker)

    def next_chunk(self, worker: SimWorker) -> None:
        if not worker.chunks:
            return
        chunk_id, has_func, values, seconds, asks_more, asks_after = worker.chunks[0]
        if has_func:
            self.send(worker, [bytes((W_LOAD,)), CHUNK_ID.pack(chunk_id)])
        self.send(worker, [bytes((W_GET if asks_more else W_START,)), CHUNK_ID.pack(chunk_id)])
        worker.busy = True
        if seconds > 0:
            self.at(time.monotonic() + seconds, self.chunk_done, worker)
        else:
            self.chunk_done(worker)

    def chunk_done(self, worker: SimWorker) -> None:
        chunk_id, _, values, seconds, _, asks_after = worker.chunks.popleft()
        report = wire.frames([REPORT.pack(chunk_id, True, seconds, math.nan), wire.encode(values)])
        self.counts["chunks"] += 1
        self.counts["tasks"] += len(values)
        worker.busy = False
        self.send(worker, [bytes((W_RESULT_GET if asks_after else W_RESULT,)), *report])
        worker.spoke = time.monotonic()
        if not worker.ended:
            self.next_chunk(worker)


def link_reply(frame) -> tuple[int, memoryview]:
    """A reply over a job's link: (status, payload), past the REPLY byte where the runtime marks them."""
    body = memoryview(frame)
    if REPLY is not None:
        if body[0] != REPLY:
            raise RuntimeError("a reply over the link did not begin with REPLY")
        body = body[1:]
    return body[0], body[1:]


# --- measuring ----------------------------------------------------------------------------------
def cpu_s() -> float:
    """This process's CPU seconds, every thread's."""
    return time.process_time()


def kernel_cpu_s() -> float:
    """The part of ``cpu_s`` spent in the kernel (system calls, and the TCP work they do): what grows there
    with W is the kernel's, not the pool's."""
    return os.times().system


def packets_dropped() -> int:
    """Packets this machine's kernel dropped for want of room in its per-core backlog (the loopback's
    queue: every simulated worker's traffic crosses it, where real hosts would each have their own)."""
    try:
        with open("/proc/net/softnet_stat") as fh:
            return sum(int(line.split()[1], 16) for line in fh)
    except OSError:
        return 0


def rss_kib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE / 1024


def measure(w: int, args, backend: SimulatedBackend) -> dict:
    figures: dict = {"W": w}
    counts0, dropped0 = backend.counters(), packets_dropped()
    rss0, started = rss_kib(), time.monotonic()
    pool = mp.Pool(w)
    try:
        while pool.statistics().workers_alive < w:
            if time.monotonic() - started > args.connect_timeout:
                raise SystemExit(f"W={w}: {pool.statistics().workers_alive} of {w} workers connected in "
                                 f"{args.connect_timeout} s")
            time.sleep(0.1)
        figures["connect_s"] = time.monotonic() - started
        figures["cut_off_connecting"] = pool.statistics().workers_cut_off
        figures["rss_per_worker_kib"] = (rss_kib() - rss0) / w

        # idle: the heartbeats alone
        time.sleep(2)
        beats0, cpu0, t0 = backend.counters()["heartbeats"], cpu_s(), time.monotonic()
        time.sleep(args.idle_s)
        wall = time.monotonic() - t0
        figures["idle_cpu_per_s"] = (cpu_s() - cpu0) / wall
        figures["heartbeats_per_s"] = (backend.counters()["heartbeats"] - beats0) / wall

        # ES-shaped maps: 2W tasks of task_s each, chunks as the pool chooses
        tasks = [(i, args.task_s) for i in range(2 * w)]
        times, cpus = [], []
        for _ in range(args.rounds):
            cpu0, t0 = cpu_s(), time.monotonic()
            assert pool.map(simulated_task, tasks) == list(range(2 * w))
            times.append(time.monotonic() - t0)
            cpus.append(cpu_s() - cpu0)
        figures["map_s"] = statistics.median(times)
        figures["map_ideal_s"] = 2 * args.task_s
        figures["map_cpu_per_task_ms"] = statistics.median(cpus) / (2 * w) * 1e3

        # zero-cost tasks, unchunked and chunked (ten times as many: each chunk holds many), --rounds
        # times each in turn, the median of each figure
        runs: dict = {}
        for _ in range(args.rounds):
            for name, chunksize, n in (("unchunked", 1, args.zero_tasks), ("chunked", None, 10 * args.zero_tasks)):
                zero = [(i, 0.0) for i in range(n)]
                cpu0, kernel0, sim0, t0 = cpu_s(), kernel_cpu_s(), backend.simulators_cpu_s(), time.monotonic()
                beats0 = backend.counters()["heartbeats"]
                assert pool.map(simulated_task, zero, chunksize=chunksize) == list(range(n))
                wall = time.monotonic() - t0
                runs.setdefault(f"{name}_beats_per_s", []).append((backend.counters()["heartbeats"] - beats0) / wall)
                runs.setdefault(f"{name}_tasks_per_s", []).append(n / wall)
                runs.setdefault(f"{name}_cpu_per_task_us", []).append((cpu_s() - cpu0) / n * 1e6)
                runs.setdefault(f"{name}_kernel_per_task_us", []).append((kernel_cpu_s() - kernel0) / n * 1e6)
                runs.setdefault(f"{name}_sim_cpu_per_task_us", []).append(
                    (backend.simulators_cpu_s() - sim0) / n * 1e6)
        figures.update({key: statistics.median(values) for key, values in runs.items()})
        counts = backend.counters()
        figures["cut_off"] = pool.statistics().workers_cut_off
        figures["beats_late"] = counts["beats_late"] - counts0["beats_late"]
        # workers whose stream broke, or that the pool retired, before the pool closed
        figures["streams_lost"] = counts["streams_lost"] - counts0["streams_lost"]
        figures["retired_early"] = counts["retired"] - counts0["retired"]
        figures["stopped"] = counts["stopped"] - counts0["stopped"]
        figures["packets_dropped"] = packets_dropped() - dropped0
        cpu0, t0 = cpu_s(), time.monotonic()
        pool.close()
        pool.join()
        figures["close_s"], figures["close_cpu_s"] = time.monotonic() - t0, cpu_s() - cpu0
    finally:
        pool.terminate()
    return figures


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="16,256,1024,4096,10000")
    parser.add_argument("--task-s", type=float, default=0.2)
    parser.add_argument("--zero-tasks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--simulators", type=int, default=2)
    parser.add_argument("--connect-timeout", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the list of W this many times in turn (16, 10000, 16, 10000, ...): each "
                             "ratio is of neighbours in time, and the last line gives their median")
    parser.add_argument("--fresh-simulators", action="store_true",
                        help="new simulator processes for each W (default: one set serves every W)")
    args = parser.parse_args()
    sizes = [int(w) for w in args.workers.split(",")]
    limit = raise_open_files()
    per_worker = 1 if CARRY is not None else 2
    if per_worker * max(sizes) + 200 > limit:
        most = (limit - 200) // per_worker
        raise SystemExit(f"--workers {max(sizes)}: the master holds {per_worker} stream(s) a worker, and this machine "
                         f"lets a process open {limit} files (ulimit -Hn): at most {most} workers")
    SimulatedBackend.simulators = args.simulators
    backends.register("simulated", "__main__:SimulatedBackend")
    mp.configure(backend="simulated", start_timeout=args.connect_timeout, cpu_per_job=0, mem_per_job=0)
    backend = backends.get_backend()
    rows = []
    try:
        for i, w in enumerate(sizes * args.repeat):
            if args.fresh_simulators and i:
                backend.start_simulators()
            row = measure(w, args, backend)
            rows.append(row)
            print(f"W={w}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in row.items() if k != "W"), flush=True)
    finally:
        backend.close()
    passes = [rows[i:i + len(sizes)] for i in range(0, len(rows), len(sizes))]
    print()
    print("".join(f"{name:>{width}}" for name, _, width, _ in COLUMNS))
    for row in rows:
        print("".join(f"{value(row):>{width}{fmt}}" for _, value, width, fmt in COLUMNS))
    # the machine's speed moves within an hour: a ratio is of one pass's rows, run one after the other
    ratios = [one[-1]["unchunked_cpu_per_task_us"] / one[0]["unchunked_cpu_per_task_us"] for one in passes]
    if len(passes) > 1:
        print(f"master us/task at W={sizes[-1]} / at W={sizes[0]}, pass by pass: "
              + ", ".join(f"{r:.2f}" for r in ratios))
    tops = [one[-1] for one in passes]

    def median(key):
        return statistics.median(row[key] for row in tops)
    # memory a worker: the first pass's, the only one whose pool grew a fresh process (later pools reuse its heap)
    print(f"sim_many_workers: W={sizes[-1]} connect_s={median('connect_s'):.2f} "
          f"rss_per_worker_kib={tops[0]['rss_per_worker_kib']:.1f} "
          f"cpu_per_task_ratio={statistics.median(ratios):.2f} "
          f"tasks_per_s={median('chunked_tasks_per_s'):.0f}")


# the table's columns: heading, value, width, format
COLUMNS = [
    ("W", lambda r: r["W"], 6, ""),
    ("cut off", lambda r: r["cut_off"], 8, ""),
    ("late beats", lambda r: r["beats_late"], 11, ""),
    ("lost", lambda r: r["streams_lost"] + r["retired_early"] + r["stopped"], 6, ""),
    ("dropped", lambda r: r["packets_dropped"], 8, ""),
    ("connect s", lambda r: r["connect_s"], 10, ".2f"),
    ("KiB/worker", lambda r: r["rss_per_worker_kib"], 11, ".1f"),
    ("idle CPU/s", lambda r: r["idle_cpu_per_s"], 11, ".3f"),
    ("beats/s", lambda r: r["heartbeats_per_s"], 8, ".0f"),
    ("busy beats/s", lambda r: r["unchunked_beats_per_s"], 13, ".0f"),
    ("map s", lambda r: r["map_s"], 7, ".2f"),
    ("x ideal", lambda r: r["map_s"] / r["map_ideal_s"], 8, ".2f"),
    ("map us/task", lambda r: r["map_cpu_per_task_ms"] * 1e3, 12, ".0f"),
    ("unchunked/s", lambda r: r["unchunked_tasks_per_s"], 12, ".0f"),
    ("us/task", lambda r: r["unchunked_cpu_per_task_us"], 8, ".0f"),
    ("kernel us", lambda r: r["unchunked_kernel_per_task_us"], 10, ".0f"),
    ("sims us/task", lambda r: r["unchunked_sim_cpu_per_task_us"], 13, ".0f"),
    ("chunked/s", lambda r: r["chunked_tasks_per_s"], 10, ".0f"),
    ("us/task", lambda r: r["chunked_cpu_per_task_us"], 8, ".1f"),
    ("close s", lambda r: r["close_s"], 8, ".2f"),
    ("CPU s", lambda r: r["close_cpu_s"], 6, ".2f"),
]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--simulator":
        Simulator(float(sys.argv[2]), float(sys.argv[3])).run()
    else:
        main()
