"""What every algorithm's run does around its iterations, so that ES, PPO and
POET each keep only what is their own::

    loop = TrainingLoop(run, algo, iterations=algo.iterations)
    checkpoint = loop.resume(check)            # (arrays, values) to restore, or None
    for iteration in loop:
        ...                                    # the algorithm; loop.timesteps += its env steps
        if loop.end(iteration, metrics, eval_reward=..., best=..., state=..., on_iteration=...):
            break

``end`` logs the iteration under the names every algorithm shares
(``iteration``, ``timesteps``, ``time_s``, ``iteration_s``, ``eval_reward``,
and ``wall_time``: when the row was logged, in seconds since the epoch, so a
reader can tell where several runs each stood at one moment),
saves the best policy when ``eval_reward`` beats it, checkpoints every
``algo.checkpoint_every`` iterations, at the last one and when the run stops,
calls ``on_iteration`` and says whether to stop: ``algo.stop_reward`` reached,
the run's ``until_timesteps`` reached (it pauses: a resume goes on from that
checkpoint, which says ``paused``), or the algorithm's own reason.  A run
told to stop (SIGTERM: its host taken back) checkpoints at the end of the
iteration it is in and exits with ``RunPreempted`` (exit code 143), or
exits ``preempt_grace`` seconds after it was told if the iteration has not
ended by then; ``hydra/launcher=fiberrl`` starts it again from its
checkpoint, and that costs none of its retries.  A checkpoint's values always hold
``iteration``, ``timesteps``, ``time_s`` and ``best``, which ``resume`` reads
back, so a resumed run goes on counting where the checkpoint left off.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from .run import RunDirectory, require
from .runtime.processes import stop_signal

# what a checkpoint holds of the loop itself, beside the algorithm's state
LOOP_VALUES = ("iteration", "timesteps", "time_s", "best")


class RunPreempted(SystemExit):
    """The run was told to stop and checkpointed: its process exits as one told to stop."""

    def __init__(self):
        super().__init__(stop_signal.PREEMPTED_EXIT)


class TrainingLoop:
    def __init__(self, run: RunDirectory, algo, iterations: int, until_timesteps: int | None = None):
        self.run, self.algo, self.iterations, self.until_timesteps = run, algo, iterations, until_timesteps
        self.start, self.timesteps, self.best = 0, 0, -math.inf
        self._elapsed = 0.0                  # seconds the run had trained before this process went on with it
        self._began = self._t0 = self._session_start = time.perf_counter()
        self._session_steps = 0
        self.done, self.eval_reward = 0, None  # iterations run (over all resumes), and the last eval reward
        self.checkpointed = False              # whether the last end() wrote a checkpoint
        self.paused = False                    # whether it stopped at until_timesteps

    def resume(self, check: Callable | None = None) -> tuple[dict, dict] | None:
        """The run directory's newest whole checkpoint, ``check``-ed as ``RunDirectory.resume`` does,
        with the loop's counters taken from it; None for a run that starts from its first iteration."""
        def checked(arrays: dict, values: dict) -> None:
            require(arrays, values, value_names=LOOP_VALUES)
            if check is not None:
                check(arrays, values)
        checkpoint = self.run.resume(checked)
        if checkpoint is not None:
            values = checkpoint[1]
            self.start = self.done = values["iteration"] + 1
            self.timesteps = values["timesteps"]
            self._elapsed, self.best = values["time_s"], values["best"]
            self.run.console.print(f"resumed {self.run.path} after iteration {values['iteration']} "
                                   f"({self.timesteps:,} env steps)")
        return checkpoint

    def __iter__(self):
        stop_signal.watch(stop_signal.exit_after_grace)
        self._began = time.perf_counter() - self._elapsed
        self._session_start, self._session_steps = time.perf_counter(), self.timesteps
        if self._until_reached() and self.start < self.iterations:
            self.paused = True
            self.run.console.print(f"the run has {self.timesteps:,} env steps, until_timesteps="
                                   f"{self.until_timesteps:,}: nothing to do until it is resumed with a later one")
            return
        for iteration in range(self.start, self.iterations):
            self._t0 = time.perf_counter()
            yield iteration

    @property
    def time_s(self) -> float:
        """Seconds the run has trained, over all its resumes."""
        return time.perf_counter() - self._began

    def steps_per_second(self) -> int:
        """Env steps a second since this process started or resumed the run."""
        return int((self.timesteps - self._session_steps) / (time.perf_counter() - self._session_start))

    def end(self, iteration: int, metrics: dict, *, eval_reward: float | None = None,
            best: Callable[[], tuple[dict, dict]] | None = None, state: Callable[[], tuple[dict, dict]] | None = None,
            stop: bool = False, line: Callable[[dict], str] | None = None,
            on_iteration: Callable[[], None] | None = None, checkpoint_now: bool = False) -> bool:
        """Log ``metrics`` as iteration ``iteration``'s; save ``best()`` (arrays, values) as the best policy when
        ``eval_reward`` beats every earlier one; checkpoint ``state()`` when it is time (or ``checkpoint_now``: a
        process the run depends on was told to stop); call ``on_iteration()``.
        True when the run stops here: ``algo.stop_reward`` or ``until_timesteps`` reached, or ``stop`` (the
        algorithm's own end)."""
        now = time.perf_counter()
        metrics = {"iteration": iteration, "timesteps": self.timesteps, **metrics, "eval_reward": eval_reward,
                   "time_s": now - self._began, "iteration_s": now - self._t0, "wall_time": time.time()}
        self.done, self.eval_reward = iteration + 1, eval_reward
        if eval_reward is not None and eval_reward > self.best:
            self.best = eval_reward
            if best is not None:
                self.run.save_best(*best())
        self.run.log(metrics, line=(line or self.progress_line)(metrics))
        stop_reward = getattr(self.algo, "stop_reward", None)
        solved = stop_reward is not None and eval_reward is not None and eval_reward >= stop_reward
        last = iteration + 1 == self.iterations
        self.paused = not (last or solved or stop) and self._until_reached()
        told = stop_signal.told() and not (last or solved or stop or self.paused)
        self.checkpointed = state is not None and ((iteration + 1) % self.algo.checkpoint_every == 0 or last
                                                   or solved or stop or self.paused or told or checkpoint_now)
        if self.checkpointed:
            arrays, values = state()
            values.update(iteration=iteration, timesteps=self.timesteps, time_s=metrics["time_s"], best=self.best,
                          paused=self.paused)
            self.run.save_checkpoint(iteration, arrays, values)
        if on_iteration is not None:
            on_iteration()
        if solved:
            self.run.console.print(f"eval reward {eval_reward:.1f} reached algo.stop_reward={stop_reward}")
        if self.paused:
            self.run.console.print(f"paused at {self.timesteps:,} env steps (until_timesteps="
                                   f"{self.until_timesteps:,}); resume={self.run.path} goes on")
        if told:
            self.run.console.print(f"told to stop (SIGTERM): checkpointed after iteration {iteration}; "
                                   f"resume={self.run.path} goes on")
            raise RunPreempted()
        return solved or stop or self.paused

    def _until_reached(self) -> bool:
        return self.until_timesteps is not None and self.timesteps >= self.until_timesteps

    def summary(self, **more) -> dict:
        """What ``train`` returns: the loop's counters and the algorithm's ``more``."""
        return dict(iterations=self.done, timesteps=self.timesteps, eval_reward=self.eval_reward,
                    best_eval_reward=self.best, paused=self.paused, **more)

    def progress_line(self, metrics: dict) -> str:
        return progress_line(metrics, self.iterations)


def progress_line(m: dict, iterations: int | None = None) -> str:
    """One iteration on the console: what every algorithm logs, and what this one logs of the rest."""
    def num(key, fmt):
        value = m.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"
    of = f"/{iterations}" if iterations is not None else ""
    parts = [f"[bold]iter {m['iteration'] + 1:>5}{of}[/]", f"steps {num('timesteps', ',')}"]
    if "reward_mean" in m:
        parts.append(f"reward mean {num('reward_mean', '.2f')} max {num('reward_max', '.2f')}")
    if "charts/episodic_return" in m:
        parts.append(f"return {num('charts/episodic_return', '.2f')}")
    parts.append(f"eval [bold]{num('eval_reward', '.2f')}[/]")
    if "charts/SPS" in m:
        parts.append(f"SPS {m['charts/SPS']}")
    if "charts/env_server_restarts" in m:
        parts.append(f"restarts {m['charts/env_server_restarts']}")
    parts += [f"{num('iteration_s', '.2f')} s/iter", f"{num('time_s', '.0f')} s"]
    return "  ".join(parts)
