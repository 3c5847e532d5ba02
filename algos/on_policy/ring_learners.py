"""PPO's learners as the members of a Ring (``algo.learners=K``, DD-PPO).

Each member is a job of the backend (with ``algo.device=cuda``, one with a GPU
of its own: ``meta(gpu=1)``, nccl between them; gloo on CPUs) and runs PPO's
``learn`` on its share of the run: ``workers / K`` env servers of its own, its
own rollout, its minibatches of it, and the gradient averaged with the others'
at every minibatch step (``peers.RingPeers``).

The run's own process keeps the run: its ``TrainingLoop`` decides, as for one
learner, when to checkpoint, when a policy is the best, when to stop or pause,
and writes every file.  Rank 0 reports each update to it (metrics, the
evaluation it alone runs) and relays what it says to the others
(``MemberLoop``, what a member sees of the loop): when a checkpoint is due,
every member packs its state, rank 0 merges them (``checkpoint.merge``) and
sends one checkpoint back.  A resumed run hands each member its part
(``checkpoint.share``), so a resume is exact for any K; a checkpoint resumes
with the K that wrote it (``algo.learners`` is refused otherwise, as every
setting that changes what a run computes).

A member that dies (SIGKILL, a lost host) makes the Ring raise ``RingError``
naming its rank; the run says so in one line and starts the Ring again from
its last checkpoint, up to ``algo.ring_restarts`` times.  A member that raises
ends the run with its error: that would happen again.  A member told to stop
(SIGTERM: its host taken back) says so in the Ring's store and goes on; at
the end of that update the run checkpoints and starts the Ring again from
there, which loses nothing and is not counted as a restart (a member whose
update outlasts ``preempt_grace`` leaves, and that is a death).
"""
from __future__ import annotations

import functools
import os
import queue
import threading
import time

import torch
import torch.distributed as dist

from fiberrl.runtime import Queue, Ring, RingError, meta
from fiberrl.runtime.backends import resolve_name
from fiberrl.runtime.primitives.host_sum import HostSumError
from fiberrl.runtime.processes import stop_signal
from fiberrl.training import TrainingLoop
from fiberrl.validation import UsageError

from . import checkpoint
from .envs import remote_envs
from .peers import RingPeers

# how long a member waits in a collective before torch.distributed gives up on the others: rank 0's
# evaluation and the run's checkpoint writes happen while they wait; a member that dies is noticed at once
COLLECTIVE_TIMEOUT_S = 3600.0
# how often the run's process looks at the Ring while it waits for rank 0's report
_POLL_S = 0.2
# in the Ring's store: how many members were told to stop
_TOLD_KEY = "told_to_stop"


class LearnerTold(Exception):
    """A learner was told to stop: the run checkpointed, and its Ring starts again from there."""


def check_learners(cfg) -> None:
    """What ``algo.learners`` needs of the other settings and of the backend; raises UsageError."""
    algo, learners = cfg.algo, cfg.algo.learners
    if learners == 1:
        if algo.preempt_share is not None:
            raise UsageError(f"algo.preempt_share={algo.preempt_share} ends stragglers' rollouts among several "
                             f"learners; with algo.learners=1 there are none (set algo.learners >= 2, or drop it)")
        return
    if cfg.workers % learners:
        raise UsageError(f"algo.learners={learners} does not divide workers={cfg.workers}: each learner steps an "
                         f"equal share of the env servers; use a multiple of {learners} as workers")
    batch = cfg.workers // learners * algo.envs_per_worker * algo.num_steps
    if batch % algo.num_minibatches:
        raise UsageError(f"each learner's batch of {batch} steps (workers/learners={cfg.workers // learners} x "
                         f"algo.envs_per_worker={algo.envs_per_worker} x algo.num_steps={algo.num_steps}) does not "
                         f"split into algo.num_minibatches={algo.num_minibatches} equal minibatches")
    if algo.async_rollouts:
        raise UsageError(f"algo.async_rollouts=true and algo.learners={learners} do not go together (a rollout "
                         f"collected during the update would share the Ring with the update); choose one")
    if resolve_name(cfg.backend.name) != "local":
        return  # a cluster backend queues what it cannot place yet
    if algo.device == "cuda" or (algo.device == "auto" and torch.cuda.is_available()):
        gpus = torch.cuda.device_count()
        if learners > gpus:
            raise UsageError(f"algo.learners={learners} on CUDA needs a GPU per learner (nccl) and this machine has "
                             f"{gpus}; use algo.learners<={gpus}, algo.device=cpu, or a cluster backend")
    cores = os.cpu_count() or 1
    if learners > cores:
        raise UsageError(f"algo.learners={learners}: the local backend gives each learner a core and this machine "
                         f"has {cores}; use algo.learners<={cores}, or a cluster backend (backend=...)")


def train_on_ring(cfg, run, learn, check, on_iteration=None) -> dict:
    """Run PPO with ``cfg.algo.learners`` learners, each running ``learn(cfg, loop, peers, ...)``, in ``run``
    (a RunDirectory); ``check(arrays, values)`` checks a checkpoint of them all.  Returns the summary."""
    algo = cfg.algo
    iterations = algo.total_timesteps // (cfg.workers * algo.envs_per_worker * algo.num_steps)
    restarts = 0
    while True:
        loop = TrainingLoop(run, algo, iterations, until_timesteps=cfg.until_timesteps)
        saved = loop.resume(check)
        try:
            return _drive(cfg, loop, saved, learn, on_iteration)
        except LearnerTold as told:
            run.console.print(f"{told}; starting the Ring again from that checkpoint (not counted as a restart)")
        except RingError as exc:
            if isinstance(exc.__cause__, UsageError):
                raise exc.__cause__ from None
            if not _a_learner_lost(exc) or restarts == algo.ring_restarts:
                raise
            restarts += 1
            run.console.print(f"{exc}; starting the Ring again from the run's last checkpoint "
                              f"(restart {restarts} of algo.ring_restarts={algo.ring_restarts})")


def _a_learner_lost(exc: RingError) -> bool:
    """Whether the Ring ended because a member was lost (it died, or went unheard), which starting again from the
    checkpoint gets past, rather than because one raised, which would happen again.  One that raised in a
    collective (gloo's transport, a HostSumError, torch.distributed's own errors) raised because another was
    lost, whose death the Ring had not seen yet."""
    cause = exc.__cause__
    return cause is None or isinstance(cause, (HostSumError, dist.DistError)) or "gloo/transport" in str(cause)


def _drive(cfg, loop: TrainingLoop, saved, learn, on_iteration) -> dict:
    """One Ring of the run's learners, from ``saved`` (a checkpoint or None) on, driven by ``loop``."""
    reports, commands = Queue(), Queue()
    member = functools.partial(_member, cfg, learn, saved, loop.start, loop.timesteps, reports, commands)
    if cfg.algo.device == "cuda" or (cfg.algo.device == "auto" and torch.cuda.is_available()):
        member = meta(gpu=1)(member)
    ring = Ring(cfg.algo.learners, member, _join)
    outcome: dict = {}
    thread = threading.Thread(target=_run_ring, args=(ring, outcome), name="ppo-ring", daemon=True)
    thread.start()
    finished = False
    try:
        for update in loop:
            commands.put(("update", update))
            _, timesteps, metrics, eval_reward, best, told = _report(reports, thread, outcome, "update", update)
            loop.timesteps = timesteps
            metrics["charts/SPS"] = loop.steps_per_second()
            stop = loop.end(update, metrics, eval_reward=eval_reward, best=lambda: best,
                            state=lambda: _state(commands, reports, thread, outcome, update),
                            on_iteration=on_iteration and (lambda: on_iteration(update, ring)), checkpoint_now=told)
            commands.put(("end", stop or told))
            if told and not stop:
                thread.join()
                if "error" in outcome:
                    raise outcome["error"]
                finished = True
                raise LearnerTold(f"{told} learner(s) were told to stop (SIGTERM) during update {update + 1}: "
                                  f"checkpointed after it")
            if stop:
                break
        else:
            commands.put(("finish",))
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        finished = True
        return loop.summary(**outcome["values"][0])
    finally:
        if not finished:
            commands.put(("abort",))
            thread.join(timeout=30)


def _run_ring(ring, outcome: dict) -> None:
    try:
        outcome["values"] = ring.run()
    except BaseException as exc:  # noqa: BLE001 -- handed to the run's thread
        outcome["error"] = exc


def _report(reports, thread: threading.Thread, outcome: dict, kind: str, update: int) -> tuple:
    """Rank 0's next report, which must be ``kind``; the Ring's error if it ends first."""
    while True:
        try:
            report = reports.get(timeout=_POLL_S)
        except queue.Empty:
            if thread.is_alive():
                continue
            try:  # it may have put its last report just before it ended
                report = reports.get(timeout=_POLL_S)
            except queue.Empty:
                thread.join()
                if "error" in outcome:  # with its cause, which says whether a member raised or was lost
                    outcome["error"].__suppress_context__ = True
                    raise outcome["error"]
                raise RuntimeError(f"the learners' Ring ended without reporting update {update}") from None
        if report[0] != kind:
            raise RuntimeError(f"the learners' Ring reported {report[0]!r} where {kind!r} of update {update} was due")
        return report


def _state(commands, reports, thread, outcome, update: int) -> tuple[dict, dict]:
    commands.put(("state",))
    return _report(reports, thread, outcome, "state", update)[1]


# --- in each member ---------------------------------------------------------------------

_node = None  # this member's RingNode


def _join(node) -> None:
    global _node
    _node = node
    node.init_process_group(timeout=COLLECTIVE_TIMEOUT_S)


def _member(cfg, learn, saved, start: int, timesteps: int, reports, commands, rank: int, size: int) -> dict:
    """What each Ring member runs: PPO's ``learn`` on its share of the envs."""
    if "OMP_NUM_THREADS" not in os.environ:  # learners that share a host share its cores, not spin on all of each
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ["LOCAL_WORLD_SIZE"])))
    peers = RingPeers(rank, size, _node.store, cfg.algo.num_steps, cfg.algo.preempt_share, COLLECTIVE_TIMEOUT_S)
    stop_signal.watch(functools.partial(_tell_the_ring, _node.store))
    loop = MemberLoop(peers, saved, start, timesteps, reports if rank == 0 else None,
                      commands if rank == 0 else None)
    summary = learn(cfg, loop, peers, None, functools.partial(remote_envs, learner=rank, learners=size))
    summary["agent"] = summary["agent"].cpu() if rank == 0 else None
    return summary


def _tell_the_ring(store) -> None:
    """This member was told to stop: rank 0 tells the run at the end of the update (MemberLoop.end)."""
    store.add(_TOLD_KEY, 1)
    stop_signal.exit_after_grace()


class MemberLoop:
    """The training loop as a Ring member sees it: the run's process decides, rank 0 reports to it
    and relays its commands to the others; every member packs its state when a checkpoint is due."""

    def __init__(self, peers, saved, start: int, timesteps: int, reports, commands):
        self.peers, self.saved, self.start, self.timesteps = peers, saved, start, timesteps
        self.reports, self.commands = reports, commands
        self._session_start, self._session_steps = time.perf_counter(), timesteps

    def resume(self, check) -> tuple[dict, dict] | None:
        """This learner's part of the checkpoint the run goes on from (checked in the run's process)."""
        if self.saved is None:
            return None
        arrays, values = checkpoint.share(*self.saved, self.peers.rank, self.peers.size)
        check(arrays, values)
        return arrays, values

    def __iter__(self):
        while True:
            command = self._command()
            if command[0] == "finish":
                return
            yield command[1]

    def end(self, iteration: int, metrics: dict, *, eval_reward=None, best=None, state=None, on_iteration=None,
            **_) -> bool:
        if self.reports is not None:
            told = self.peers.store.add(_TOLD_KEY, 0) if self.peers.store is not None else 0
            self.reports.put(("update", self.timesteps, metrics, eval_reward,
                              best() if eval_reward is not None and best is not None else None, told))
        while True:
            command = self._command()
            if command[0] == "state":
                parts = self.peers.gather(state())
                if self.reports is not None:
                    self.reports.put(("state", checkpoint.merge(parts)))
            elif command[0] == "end":
                return command[1]

    def steps_per_second(self) -> int:
        return int((self.timesteps - self._session_steps) / (time.perf_counter() - self._session_start))

    def summary(self, **more) -> dict:
        return more

    def _command(self) -> tuple:
        """The run's next command: rank 0 gets it and hands it to the others."""
        box = [self.commands.get() if self.commands is not None else None]
        dist.broadcast_object_list(box, src=0)
        if box[0][0] == "abort":
            raise SystemExit("the run ended the learners' Ring")
        return box[0]
