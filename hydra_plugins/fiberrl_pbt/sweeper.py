"""``hydra/sweeper=pbt``: Population Based Training (Jaderberg et al. 2017) of a fiberrl algorithm.

``population`` members train at the same time, each a run of ``python -m fiberrl`` that pauses every
``interval`` env steps (``until_timesteps``). A paused member is ready: ranked by its metric against
the others as they are now, it goes on from its own checkpoint, or, in the bottom ``quantile``, from a copy of
a top-quantile member's newest (weights, optimizer, normalisers, env states, counters: what an exact resume
restores) with that member's settings explored (perturbed or resampled). With ``selection=ttest`` it copies
instead another member drawn at random whose last values Welch's t-test finds better than its own. With
``ranking=ready`` each member is ranked as it stood at its own last ready point, and copied only from one at
which it ranked on top (Ray Tune's rules). With ``explore=pb2`` a copy's settings are chosen by PB2's Gaussian-process
bandit (``bandit.py``) instead of perturbed at random. Each
stretch a member runs between ready points is a segment: a Hydra job of the launcher (``hydra/launcher=fiberrl``)
in ``member_<m>/segment_<s>`` of the sweep's folder, which goes on from the checkpoint copied into it.

Asynchronous by default (a ready member never waits); ``synchronous=true`` is generational. Every
decision is appended to ``pbt.jsonl`` before it is acted on, so a sweep killed and run again on the
same folder replays it and goes on; the launcher retries a segment whose job died from its own last
checkpoint. Only settings the algorithm declares tunable (``Algorithm.tunable``) may be mutated.
"""

import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, Optional

import numpy as np
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from fiberrl.algorithm import LOOP_METRICS, algorithm
from fiberrl.run import CHECKPOINT, DamagedFile, atomic_write, load_npz, metrics_row, upgrade_checkpoint

from ..fiberrl_launcher.launcher import FiberrlLauncher, SweepError
from ..fiberrl_launcher.run_in_job import RETURN_FILE
from .bandit import MIN_OBSERVATIONS, Observation, suggest
from .mutations import Mutation, MutationError, parse
from .population import Member, Segment, choose_donor, choose_donor_by_ttest, quantile_size, ranking

log = logging.getLogger(__name__)
LINEAGE = "pbt.jsonl"


class PBTError(Exception):
    """Bad input, found before any member started: one line that says what and what to do."""


class PBTSweeper(Sweeper):
    def __init__(self, population: int, interval: int, burn_in: int, metric: str, mode: str, window: int,
                 quantile: float, params: Any, resample_probability: float, perturb_factors: Any,
                 sample_initial: bool, synchronous: bool, seed: Optional[int], selection: str = "truncation",
                 significance: float = 0.05, final_episodes: int = 0, final_seed: int = 1_000_000,
                 ranking: str = "now", explore: str = "perturb", pb2_radius: float = 0.25) -> None:
        self.population, self.interval, self.burn_in = population, interval, burn_in
        self.metric, self.mode, self.window, self.quantile = metric, mode, window, quantile
        self.selection, self.significance, self.ranking = selection, significance, ranking
        self.explore, self.pb2_radius = explore, pb2_radius
        self.final_episodes, self.final_seed = final_episodes, final_seed
        self.params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else dict(params or {})
        self.resample_probability, self.perturb_factors = resample_probability, list(perturb_factors)
        self.sample_initial, self.synchronous, self.seed = sample_initial, synchronous, seed
        self.launcher: Any = None
        self.members: list[Member] = []
        self._next_job = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # --- the sweep ------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir))
        try:
            self._prepare(arguments)
            self.launcher.open(self.population)
        except (PBTError, SweepError, MutationError) as exc:
            _refuse(exc)
        try:  # the launcher is open: closed however the sweep ends, a refused resume too
            try:
                resumed = self._replay()
            except (PBTError, SweepError, MutationError) as exc:
                _refuse(exc)
            print(self._first_line(resumed), flush=True)
            self._started = time.time()
            self._pending: dict[Any, Segment] = {}
            done_while_stopped = []
            for member in self.members:
                if not member.segments:
                    self._begin(member)
                elif member.current.state == "running":
                    self._launch(member.current, done_while_stopped)
            if not self.synchronous:
                for member in self.members:  # ready before the sweep was stopped, not yet decided on
                    if member.current.state == "ended" and member.current.paused:
                        self._go_on(member)
            # ended while the sweep was stopped: taken in the order their jobs ended, not in member order, each
            # ranked against the others as they stood when its job ended, as the sweep running would have ranked it
            ends = [(_ended_at(run), segment, run) for segment, run in done_while_stopped]
            for ended_at, segment, run in sorted(ends, key=lambda end: (end[0] or 0, end[1].member)):
                self._ended(segment, run, as_of=ended_at)
            if self.synchronous:
                self._finish_generation()
            self._run()
        finally:
            self.launcher.close()
        return self._report()

    def _run(self) -> None:
        while True:
            if self.synchronous and not self._pending:
                waiting = [m for m in self.members if m.current.state == "ended" and m.current.paused]
                # its decisions all rank the generation as it ended: every member at this ready point, whichever
                # the ranking
                generation = self._standings("now")
                for member in waiting:  # in member order, each from its own generator: reproducible
                    self._go_on(member, generation)
            if not self._pending and not self.launcher.busy():
                return
            for run in self.launcher.poll():
                self._ended(self._pending.pop(id(run)), run)

    def _finish_generation(self) -> None:
        """A generational sweep stopped between two members' decisions at one ready point: those not yet decided
        decide now, against the generation as it ended (each member's segment that ended there), in member order,
        as the sweep running went on to do; left to the next generation they would decide a generation late."""
        waiting = [m for m in self.members if m.segments and m.current.state == "ended" and m.current.paused]
        if not waiting:
            return
        ready = min(m.current.index for m in waiting)
        if not any(m.segments and m.current.index > ready for m in self.members):
            return  # no member decided yet at this ready point: the generation is decided whole in _run
        then = [Member(m.index, m.segments[:ready + 1]) for m in self.members if m.segments]
        generation = {m.index: m.standing(self.window) for m in then}
        finished = frozenset(m.index for m in then if m.finished)  # not those that finished while it was stopped
        for member in waiting:
            if member.current.index == ready:  # one that decided there may have ended its next segment already
                self._go_on(member, generation, finished=finished)

    def _begin(self, member: Member) -> None:
        rng = self._rng(member.index, 0)
        settings = {m.key: (m.sample(rng) if self.sample_initial else self.start[m.key]) for m in self.mutations}
        segment = Segment(member.index, 0, self._job(), self._folder(member.index, 0), self.base_seed + member.index,
                          settings, until=self.interval)
        member.segments.append(segment)
        self._record({"event": "segment", **self._segment_record(segment)})
        self._launch(segment)

    def _launch(self, segment: Segment, done_while_stopped: Optional[list] = None) -> None:
        """Start ``segment``'s job. One the sweep ran before it was stopped is taken as ended now, or, given
        ``done_while_stopped``, put there as (segment, run) for the caller to take in the order they ended."""
        overrides = self.fixed + [f"seed={segment.seed}"] + [f"{k}={_value(v)}" for k, v in segment.settings.items()]
        overrides.append(f"until_timesteps={segment.until}")
        label = f"member {segment.member}: " + " ".join(f"{k.split('.')[-1]}={_value(v)}"
                                                         for k, v in segment.settings.items())
        run = self.launcher.plan(segment.job, overrides, label, subdir=str(segment.folder.relative_to(self.sweep_dir)))
        self.launcher.submit(run)
        if run.state == "done" and done_while_stopped is not None:
            done_while_stopped.append((segment, run))
        elif run.state == "done":  # the sweep ran it before it was stopped
            self._ended(segment, run)
        else:
            self._pending[id(run)] = segment

    def _ended(self, segment: Segment, run, as_of: Optional[int] = None) -> None:
        """Take ``segment``'s job as ended; a ready member goes on, ranked against the others as they stood at
        ``as_of`` (ns since the epoch; None: now)."""
        member = self.members[segment.member]
        if run.state == "failed":
            segment.state, segment.why = "failed", run.why
            self._record({"event": "failed", "member": segment.member, "segment": segment.index, "why": run.why})
            print(f"pbt: member {segment.member} failed ({run.why}); the others go on", flush=True)
            return
        segment.values = self._metric_values(segment.folder)
        segment.checkpoint, values = self._last_checkpoint(segment)
        segment.timesteps = values.get("timesteps", self._last_timesteps(segment.folder))
        segment.paused = bool(values.get("paused", segment.checkpoint is None))
        segment.state = "ended"
        self._record({"event": "ended", "member": segment.member, "segment": segment.index,
                      "timesteps": segment.timesteps, "score": segment.score(self.window), "values": segment.values,
                      "checkpoint": segment.checkpoint, "paused": segment.paused})
        if not segment.paused:
            print(f"pbt: member {member.index} finished at {segment.timesteps:,} env steps, "
                  f"{self.metric} {_score(segment.score(self.window))}", flush=True)
        elif not self.synchronous:
            self._go_on(member, as_of=as_of)

    def _go_on(self, member: Member, standings: Optional[dict] = None, as_of: Optional[int] = None,
               finished: Optional[frozenset] = None) -> None:
        """A ready member's next segment: from its own checkpoint, or a top member's, explored. Ranked
        against ``standings`` (a generation's, taken before its decisions), or the population as it is now
        (as it stood at ``as_of``, ns since the epoch, when given); ``finished``: the members that had finished
        then (None: those that have now)."""
        current = member.current
        rng = self._rng(member.index, current.index + 1)
        damaged = self._damage(current)
        if standings is None:  # a damaged member takes the best copy there is now, past a ready point or not
            standings = self._standings("now" if damaged else None, as_of)
        standings = {**standings, member.index: member.standing(self.window) if damaged else self._standing(member)}
        donor, passed_over = None, set()
        rays_rules = self.ranking == "ready" and self.selection == "truncation"
        if not damaged:
            # a member that has finished is not copied: its last checkpoint leaves the copy no env steps to explore
            # in, and would only stand in the population as a second copy of it (Ray Tune's PBT drops them too)
            passed_over = set(finished if finished is not None else (m.index for m in self.members if m.finished))
            if not rays_rules:
                # a member copies only a point past where its own segment began: each exploit moves it forward,
                # so two members cannot copy each other's last ready points back and forth for ever. Under Ray's
                # rules they cannot anyway (a point is copied only where its member ranked on top and went on
                # from it, and a copy keeps none until it ranks on top at a ready point of its own); there the
                # guard would keep the member that is ready first, often the worst, since its evaluation
                # episodes end soonest, from ever copying the others' ready points: its own segment began there
                passed_over |= {i for i, s in standings.items()
                                if s is not None and s.timesteps <= current.start_timesteps}
        folder = self._folder(member.index, current.index + 1)
        p_value, ranked_top = None, False
        if rays_rules and not damaged:
            # Ray Tune keeps a checkpoint of a member that ranks on top at its ready point, and of no other
            ranked = ranking(standings, self.mode == "max")
            ranked_top = member.index in ranked[:quantile_size(len(ranked), self.quantile)]
        if damaged or current.timesteps >= self.burn_in:
            while True:  # a donor whose checkpoint is damaged is passed over
                if self.selection == "ttest" and not damaged:
                    donor, p_value = choose_donor_by_ttest(member.index, standings, self.mode == "max",
                                                           self.significance, rng, passed_over=frozenset(passed_over))
                else:
                    donor = choose_donor(member.index, standings, self.mode == "max", self.quantile, rng,
                                         must=bool(damaged), passed_over=frozenset(passed_over))
                if donor is None:
                    break
                running = self.members[donor].current
                if running.state == "running" and standings[donor].checkpoint and \
                        (self.sweep_dir / standings[donor].checkpoint).is_relative_to(running.folder):
                    kept = self._keep(standings[donor].checkpoint)  # its run drops its old checkpoints
                    standings[donor] = replace(standings[donor], checkpoint=kept)
                # the copy is what is checked
                donor_damage = self._take_copy(standings[donor].checkpoint, folder) if standings[donor].checkpoint \
                    else "its run dropped it as it was copied"
                if not donor_damage:
                    break
                passed_over.add(donor)
                print(f"pbt: member {donor}'s checkpoint cannot be copied ({donor_damage}); member {member.index} "
                      f"copies another", flush=True)
        if damaged and donor is None:
            current.state = "failed"
            current.why = f"its checkpoint is damaged ({damaged}) and no member has one to copy"
            self._record({"event": "failed", "member": member.index, "segment": current.index, "why": current.why})
            print(f"pbt: member {member.index} stops: {current.why}", flush=True)
            return
        source = standings[donor] if donor is not None else member.standing(self.window)
        ranked_top = ranked_top and donor is None  # a copy's checkpoint there is the donor's, not one it kept
        settings = dict(source.settings)
        events = []
        if donor is not None:
            settings, said = self._explore(member, source, rng)
            if damaged:
                print(f"pbt: member {member.index}'s checkpoint is damaged ({damaged}); it goes on from a copy of "
                      f"member {donor}'s", flush=True)
            events.append({"event": "exploit", "time": time.time(), "elapsed_s": round(time.time() - self._started, 3),
                           "timesteps": current.timesteps, "from_timesteps": source.timesteps,
                           "from": donor, "to": member.index, "from_score": self._donor_score(source, p_value),
                           "to_score": current.ranked_at(self.window), "old": current.settings, "new": settings,
                           "checkpoint": source.checkpoint, "damaged": damaged or None,
                           **({"explored": "perturbed" if "fallback" in said else "pb2", "pb2": said}
                              if self.explore == "pb2" else {}),
                           # what the t-test compared: the donor's values up to the point copied, and its own
                           **({"p_value": p_value, "from_values": source.history,
                               "to_values": standings[member.index].history} if p_value is not None else {})})
        segment = Segment(member.index, current.index + 1, self._job(), folder, source.seed, settings,
                          until=source.timesteps + self.interval, start_from=source.checkpoint,
                          start_timesteps=source.timesteps, carried=list(source.history),
                          stands_at=current.ranked_at(self.window) if donor is not None else None,
                          ranked_top=ranked_top)
        if donor is None:
            self._copy_checkpoint(self.sweep_dir / source.checkpoint, segment.folder)
        member.segments.append(segment)
        self._record(*events, {"event": "segment", **self._segment_record(segment)})
        self._launch(segment)

    def _explore(self, member: Member, source, rng) -> tuple[dict, Optional[dict]]:
        """The donor's settings explored: each perturbed or resampled; with ``explore=pb2``, the intervals' chosen by
        PB2's process from every segment ended so far (the choices' perturbed), or all perturbed where it chooses
        none. Returns them and, with ``explore=pb2``, what the process said (its ``fallback``: why it chose none)."""
        settings = dict(source.settings)
        intervals = [m for m in self.mutations if not m.choices]
        said = None
        if self.explore == "pb2" and not source.history:
            said = {"fallback": "the donor has no score to begin from"}
        elif self.explore == "pb2":
            # the settings others go on with: generational, those decided at this ready point (begun, or ended while
            # a stopped sweep was away); asynchronous, those running
            running = [tuple(m.unit(other.current.settings[m.key]) for m in intervals) for other in self.members
                       if other.index != member.index and other.segments and
                       (other.current.index > member.current.index if self.synchronous
                        else other.current.state == "running")]
            # generational: the segments of this ready point and before (not those a stopped sweep's jobs ended since)
            seen = self._observations(intervals, member.current.index if self.synchronous else None)
            shares, said = suggest(seen, source.timesteps + self.interval,
                                   sum(source.history) / len(source.history), running,
                                   tuple(m.unit(settings[m.key]) for m in intervals), self.pb2_radius, rng)
            if shares is not None:
                chosen = {m.key: m.from_unit(float(share)) for m, share in zip(intervals, shares)}
                return {m.key: chosen[m.key] if m.key in chosen else m.explore(settings[m.key], rng)
                        for m in self.mutations}, said
        return {m.key: m.explore(settings[m.key], rng) for m in self.mutations}, said

    def _observations(self, intervals: list[Mutation], up_to: Optional[int] = None) -> list[Observation]:
        """PB2's data: each ended segment (up to each member's ``up_to``-th) that began from a score, with the change
        of its score per env step (the better, the larger)."""
        sign = 1.0 if self.mode == "max" else -1.0
        found = []
        for member in self.members:
            for segment in member.segments[:None if up_to is None else up_to + 1]:
                if segment.state != "ended" or not segment.carried or not segment.values or \
                        not segment.timesteps or segment.timesteps <= segment.start_timesteps:
                    continue
                carried = segment.carried[-self.window:]
                before = sum(carried) / len(carried)
                change = sign * (segment.score(self.window) - before) / (segment.timesteps - segment.start_timesteps)
                if not math.isfinite(change):  # a run gone to NaN, scored as the worst there is: no rate of change
                    continue
                found.append(Observation(segment.timesteps, before,
                                         tuple(m.unit(segment.settings[m.key]) for m in intervals), change))
        return found

    @staticmethod
    def _donor_score(source, p_value: Optional[float]) -> Optional[float]:
        """The donor's score as the choice saw it: truncation ranked it at ``score`` (a fresh copy at its own score
        before it copied), the t-test compared the values up to the point copied, whose mean this is."""
        if p_value is None:
            return source.score
        return sum(source.history) / len(source.history)

    def _standings(self, ranking: Optional[str] = None, as_of: Optional[int] = None) -> dict:
        """Every member's standing now: a running segment's metric as it has logged it so far, and its newest
        checkpoint (those of them there were at ``as_of``, ns since the epoch, when given); with
        ``ranking=ready``, where each stood at its own last ready point past the burn-in."""
        if (ranking or self.ranking) == "ready":
            return {member.index: member.ready_standing(self.window, self.burn_in)
                    for member in self.members if member.segments}
        for member in self.members:
            if member.segments and member.current.state == "running":
                segment = member.current
                segment.logged = self._metric_logged(segment.folder, as_of)
                segment.values = [value for _, value in segment.logged]
                segment.newest = self._newest_checkpoint(segment, as_of)
        return {member.index: member.standing(self.window) for member in self.members if member.segments}

    def _standing(self, member: Member):
        if self.ranking == "ready":
            return member.ready_standing(self.window, self.burn_in)
        return member.standing(self.window)

    # --- before anything starts ------------------------------------------------------------------
    def _prepare(self, arguments: list[str]) -> None:
        if not isinstance(self.launcher, FiberrlLauncher):
            raise PBTError(f"hydra/sweeper=pbt runs its members on hydra/launcher=fiberrl (it starts each as "
                           f"another ends, from a checkpoint); this sweep has {type(self.launcher).__name__}")
        self._check_numbers()
        parser = OverridesParser.create()
        overrides = parser.parse_overrides(list(arguments))
        swept = {o.key_or_group: o.input_line.split("=", 1)[1] for o in overrides if o.is_sweep_override()}
        self.fixed = [o.input_line for o in overrides if not o.is_sweep_override() and o.key_or_group != "seed"]
        base = self.hydra_context.config_loader.load_sweep_config(self.config, list(self.fixed))
        # member i runs with seed + i: the command line's seed, else the config's
        seeds = [o for o in overrides if o.key_or_group == "seed" and not o.is_sweep_override()]
        self.base_seed = int(seeds[-1].value()) if seeds else int(base.seed)
        self.decision_seed = self.seed if self.seed is not None else self.base_seed
        record = algorithm(base.algo.name)
        self.record = record
        if not record.tunable:
            raise PBTError(f"algo={record.name} declares no setting a resume may change, so PBT has nothing to "
                           f"mutate; it works with algo=ppo and algo=es")
        if self.final_episodes and record.load_policy is None:
            raise PBTError(f"hydra.sweeper.final_episodes={self.final_episodes}: algo={record.name} saves no policy "
                           f"that can be run alone; set it to 0")
        specs = {**_flatten(self.params), **swept}
        self.defaults = not specs
        if self.defaults:
            specs = {f"algo.{name}": space for name, space in record.mutations.items()}
        self.mutations = [self._mutation(key, spec, base) for key, spec in specs.items()]
        if self.explore == "pb2" and all(m.choices for m in self.mutations):
            raise PBTError(f"hydra.sweeper.explore=pb2 chooses values within intervals, and "
                           f"{', '.join(m.describe() for m in self.mutations)} holds none; give an interval(...) or "
                           f"explore=perturb")
        self.start = {m.key: OmegaConf.select(base, m.key) for m in self.mutations}
        for mutation in self.mutations:
            start = self.start[mutation.key]
            if not self.sample_initial and not mutation.choices and not _number(start):
                raise PBTError(f"hydra.sweeper.params: {mutation.key} starts at {_value(start)}, which cannot be "
                               f"perturbed within {mutation.describe()}; give it a start ({mutation.key}=...) or "
                               f"hydra.sweeper.sample_initial=true")
        if self.metric not in LOOP_METRICS | record.metrics:
            raise PBTError(f"hydra.sweeper.metric={self.metric}: algo={record.name} does not write it; it writes "
                           f"{', '.join(sorted(LOOP_METRICS | record.metrics))}")
        if self.metric == "eval_reward" and (base.algo.get("eval_episodes", 1) == 0
                                             or base.algo.get("eval_every", 1) == 0):
            raise PBTError("hydra.sweeper.metric=eval_reward, but the runs do not evaluate (algo.eval_episodes or "
                           "algo.eval_every is 0); evaluate, or rank by another metric")
        for mutation in self.mutations:  # every value a member may take must be a setting that runs
            ends = mutation.choices or (mutation.fit(mutation.low), mutation.fit(mutation.high))
            for value in ends:
                try:
                    self.launcher.check_overrides(self.fixed + [f"{mutation.key}={_value(value)}"])
                except SweepError as exc:
                    raise PBTError(f"hydra.sweeper.params: {mutation.describe()} reaches {mutation.key}="
                                   f"{_value(value)}, which no run takes: {exc}") from None
        try:
            self.launcher.check_overrides(self.fixed + [f"seed={self.base_seed}"])
        except SweepError as exc:
            raise PBTError(str(exc)) from None

    def _check_numbers(self) -> None:
        bad = [("population", self.population, self.population >= 2, "at least 2 (PBT copies one member to another)"),
               ("interval", self.interval, self.interval >= 1, "at least 1 env step"),
               ("burn_in", self.burn_in, self.burn_in >= 0, "0 or more env steps"),
               ("window", self.window, self.window >= 1, "at least 1 value"),
               ("quantile", self.quantile, 0 < self.quantile <= 0.5, "in (0, 0.5]: the bottom and top quantiles "
                                                                     "must not overlap"),
               ("mode", self.mode, self.mode in ("max", "min"), "max or min"),
               ("selection", self.selection, self.selection in ("truncation", "ttest"), "truncation or ttest"),
               ("ranking", self.ranking, self.ranking in ("now", "ready"), "now (the others as they are now) or "
                                                                           "ready (as at their own ready points)"),
               ("explore", self.explore, self.explore in ("perturb", "pb2"), "perturb (PBT's random perturbations) "
                                                                             "or pb2 (PB2's Gaussian-process bandit)"),
               ("pb2_radius", self.pb2_radius, 0 < self.pb2_radius <= 1, "in (0, 1]: how far, as a share of each "
                                                                          "space, PB2 looks from the donor's settings"),
               ("significance", self.significance, 0 < self.significance < 1, "in (0, 1): the p-value below "
                                                                               "which a t-test copies"),
               ("final_episodes", self.final_episodes, self.final_episodes >= 0,
                "0 (name the best member by the ranking metric) or more episodes of each final policy"),
               ("final_seed", self.final_seed, self.final_seed >= 0, "0 or more (episode i is reset with "
                                                                      "final_seed + i, and a seed is never negative)")]
        for name, value, ok, rule in bad:
            if not ok:
                raise PBTError(f"hydra.sweeper.{name}={value}: must be {rule}")
        if self.selection == "ttest" and self.window < 2:
            raise PBTError(f"hydra.sweeper.window={self.window}: selection=ttest compares two members' last "
                           f"`window` values with Welch's t-test, which needs at least 2 of each; set window>=2")

    def _mutation(self, key: str, spec: Any, base: DictConfig) -> Mutation:
        name = key[len("algo."):] if key.startswith("algo.") else None
        if name is None or OmegaConf.select(base, key, default="__missing__") == "__missing__":
            raise PBTError(f"hydra.sweeper.params: {key} is not a setting of algo={self.record.name}; it may "
                           f"mutate {_names(self.record.tunable)}")
        if name not in self.record.tunable:
            raise PBTError(f"hydra.sweeper.params: {key} is not a setting algo={self.record.name} lets a resume "
                           f"change (a run's result would no longer follow from its checkpoint); it may mutate "
                           f"{_names(self.record.tunable)}")
        value = OmegaConf.select(base, key)
        return parse(key, spec, self.resample_probability, self.perturb_factors,
                     integer=isinstance(value, int) and not isinstance(value, bool))

    def _first_line(self, resumed: bool) -> str:
        mode = "generational" if self.synchronous else "asynchronous"
        usual = f" (algo={self.record.name}'s usual set)" if self.defaults else ""
        if self.selection == "ttest":
            chooses = (f"a ready member copies another drawn at random when Welch's t-test on their last "
                       f"{self.window} values says it is better (p < {self.significance:g})")
        else:
            chooses = f"bottom {self.quantile:g} copies top {self.quantile:g}"
        if self.ranking == "ready":
            chooses += (", each member ranked as it stood at its own last ready point"
                        + (" and copied only from one where it ranked on top (Ray Tune's rules)"
                           if self.selection == "truncation" else ""))
        return (f"pbt: {self.population} members, ready every {self.interval:,} env steps"
                + (f" after {self.burn_in:,}" if self.burn_in else "") + f", {mode}; ranked by {self.metric} "
                f"({self.mode}, mean of the last {self.window}), {chooses}; "
                f"mutating {', '.join(m.describe() for m in self.mutations)}{usual}"
                + (f"; the best named by {self.final_episodes} episodes of each final policy"
                   if self.final_episodes else "")
                + (f"; a copy's settings chosen by PB2's bandit within {self.pb2_radius:g} of its donor's (perturbed "
                   f"until {MIN_OBSERVATIONS} segments have ended from a score)" if self.explore == "pb2" else "")
                + f"; lineage in {self.sweep_dir / LINEAGE}" + (" (resumed)" if resumed else ""))

    # --- the lineage file -------------------------------------------------------------------------
    def _settings_record(self) -> dict:
        return {"population": self.population, "interval": self.interval, "burn_in": self.burn_in,
                "metric": self.metric, "mode": self.mode, "window": self.window, "quantile": self.quantile,
                "synchronous": self.synchronous, "seed": self.decision_seed, "base_seed": self.base_seed,
                "mutations": [m.describe() + m.exploration() for m in self.mutations], "fixed": self.fixed,
                # only when not the default, so that a sweep begun before t-test selection existed resumes
                **({"selection": self.selection, "significance": self.significance}
                   if self.selection != "truncation" else {}),
                **({"ranking": self.ranking} if self.ranking != "now" else {}),
                **({"explore": self.explore, "pb2_radius": self.pb2_radius} if self.explore != "perturb" else {}),
                **({"sample_initial": True} if self.sample_initial else {})}

    def _replay(self) -> bool:
        """The members as ``pbt.jsonl`` left them; a new sweep writes its header. True when resumed."""
        self.members = [Member(i) for i in range(self.population)]
        self.finals: dict = {}  # (member, segment, episodes, seed) -> its "final" record
        path = self.sweep_dir / LINEAGE
        events = _read_lineage(path)
        if events and events[0].get("settings") != json.loads(json.dumps(self._settings_record())):
            raise PBTError(f"{self.sweep_dir} holds a PBT sweep with other settings ({path}'s first line); choose "
                           f"another hydra.sweep.dir, or run that sweep's own command to resume it")
        _drop_cut_line(path)
        if not events:
            self._record({"event": "sweep", "time": time.time(), "settings": self._settings_record()})
            return False
        try:
            self._replay_events(events)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PBTError(f"{path}: a record does not fit the ones before it ({type(exc).__name__}: {exc}); the "
                           f"file is damaged, so the sweep cannot be resumed from it: choose another "
                           f"hydra.sweep.dir") from None
        for member in self.members:  # a next segment begun but not recorded: its folder is begun again
            if member.segments:
                following = self._folder(member.index, member.current.index + 1)
                if following.exists():
                    shutil.rmtree(following)
        return True

    def _replay_events(self, events: list[dict]) -> None:
        """The members as the records after the header left them."""
        for event in events[1:]:
            kind = event.get("event")
            if kind == "segment":
                segment = Segment(event["member"], event["segment"], event["job"], self.sweep_dir / event["folder"],
                                  event["seed"], event["settings"], event["until"], event["start_from"],
                                  event.get("start_timesteps", 0), event["carried"], event.get("stands_at"),
                                  ranked_top=event.get("ranked_top", False))
                self.members[segment.member].segments.append(segment)
                self._next_job = max(self._next_job, segment.job + 1)
            elif kind == "ended":
                segment = self.members[event["member"]].segments[event["segment"]]
                segment.state, segment.timesteps, segment.values = "ended", event["timesteps"], event["values"]
                segment.checkpoint, segment.paused = event["checkpoint"], event["paused"]
            elif kind == "failed":
                segment = self.members[event["member"]].segments[event["segment"]]
                segment.state, segment.why = "failed", event["why"]
            elif kind == "final":
                self.finals[(event["member"], event["segment"], event["episodes"], event["seed"])] = event

    def _record(self, *events: dict) -> None:
        """Appended and synced before what they say is done: a sweep killed at any point replays them."""
        text = "".join(json.dumps(event) + "\n" for event in events)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        with open(self.sweep_dir / LINEAGE, "a") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def _segment_record(self, segment: Segment) -> dict:
        return {"member": segment.member, "segment": segment.index, "job": segment.job,
                "folder": str(segment.folder.relative_to(self.sweep_dir)), "seed": segment.seed,
                "settings": segment.settings, "until": segment.until, "start_from": segment.start_from,
                "start_timesteps": segment.start_timesteps, "carried": segment.carried,
                "stands_at": segment.stands_at, "time": time.time(),
                **({"ranked_top": segment.ranked_top} if self.ranking == "ready" else {})}

    # --- a segment's files -----------------------------------------------------------------------
    @property
    def _worst(self) -> float:
        return -math.inf if self.mode == "max" else math.inf

    def _metric_values(self, folder: Path) -> list[float]:
        return [value for _, value in self._metric_logged(folder)]

    def _metric_logged(self, folder: Path, as_of: Optional[int] = None) -> list[tuple[int, float]]:
        """The metric's values with the env steps of the row that logged each; given ``as_of`` (ns since the
        epoch), those of rows logged by then (a row without its ``wall_time``, logged before rows had one, counts
        as logged by then)."""
        logged = []
        for row in _rows(folder / "metrics.jsonl"):
            if as_of is not None and _number(logged_at := row.get("wall_time")) and logged_at > as_of / 1e9:
                continue
            value = row.get(self.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                # a run gone to NaN (or infinity) ranks last, so that it copies a top member instead of staying
                # at its last finite score, and is never copied
                logged.append((int(row.get("timesteps", 0)), float(value) if math.isfinite(value) else self._worst))
        return logged

    def _newest_checkpoint(self, segment: Segment, as_of: Optional[int] = None) -> Optional[tuple[str, int]]:
        """A running segment's newest checkpoint (relative to the sweep's folder) and its env steps, read from its
        values alone (a copy is checked whole): one it has written, else the one it went on from, copied into
        its folder; None if there is none yet (a member's first segment). Given ``as_of`` (ns since the epoch),
        the newest written by then that its run still keeps, else the one it went on from."""
        folder = segment.folder / "checkpoints"
        try:
            found = sorted(((int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT.match(p.name))),
                           reverse=True)
        except FileNotFoundError:
            return None
        for _, path in found:  # the newest may be dropped by the run as it is read: then the one before
            try:
                if as_of is not None and path.stat().st_mtime_ns > as_of:
                    continue
                timesteps = int(upgrade_checkpoint(load_npz(path, values_only=True)[1]).get("timesteps", 0))
            except (DamagedFile, OSError, ValueError, TypeError):
                continue
            if timesteps == segment.start_timesteps and segment.start_from:  # the copy it began from: the original
                return segment.start_from, timesteps
            return str(path.relative_to(self.sweep_dir)), timesteps
        return None

    def _keep(self, checkpoint: str) -> Optional[str]:
        """A running segment's checkpoint under a second name in its folder, ``copied/``, which its run does not
        drop: what an exploit records stays (a hard link, else a copy). None if the run dropped it first."""
        source = self.sweep_dir / checkpoint
        if source.parent.name != "checkpoints":  # kept already
            return checkpoint
        kept = source.parent.parent / "copied" / source.name
        kept.parent.mkdir(exist_ok=True)
        try:
            if not kept.exists():
                self._link_or_copy(source, kept)
        except FileNotFoundError:
            return None
        return str(kept.relative_to(self.sweep_dir))

    @staticmethod
    def _link_or_copy(source: Path, target: Path) -> None:
        try:
            os.link(source, target)
        except FileNotFoundError:
            raise
        except OSError:  # a file system without hard links
            with open(source, "rb") as src:
                atomic_write(target, lambda dst: shutil.copyfileobj(src, dst))

    def _last_timesteps(self, folder: Path) -> int:
        rows = _rows(folder / "metrics.jsonl")
        return int(rows[-1].get("timesteps", 0)) if rows else 0

    def _last_checkpoint(self, segment: Segment) -> tuple[Optional[str], dict]:
        """(its newest checkpoint relative to the sweep's folder, its values), or (None, {}) if it is damaged."""
        folder = segment.folder / "checkpoints"
        found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT.match(p.name))) \
            if folder.is_dir() else []
        if not found:
            segment.damage = f"no checkpoint in {folder}"
            return None, {}
        path = found[-1][1]
        try:
            _, values = load_npz(path)
            values = upgrade_checkpoint(values)
        except (DamagedFile, OSError) as exc:
            segment.damage = f"{path}: {exc}"
            return None, {}
        return str(path.relative_to(self.sweep_dir)), values

    def _damage(self, segment: Segment) -> str:
        """What is wrong with ``segment``'s checkpoint now ("": it reads whole); a damaged one is forgotten."""
        if segment.checkpoint is None:
            return segment.damage or "there is none"
        segment.damage = self._damage_of(segment.checkpoint)
        if segment.damage:
            segment.checkpoint = None
        return segment.damage

    def _damage_of(self, checkpoint: str) -> str:
        path = self.sweep_dir / checkpoint
        return f"{path}: {why}" if (why := _unreadable(path)) else ""

    def _copy_checkpoint(self, source: Path, folder: Path) -> None:
        if folder.exists():  # begun before the sweep was stopped, never recorded, or a copy passed over
            shutil.rmtree(folder)
        (folder / "checkpoints").mkdir(parents=True)
        with open(source, "rb") as src:
            atomic_write(folder / "checkpoints" / source.name, lambda dst: shutil.copyfileobj(src, dst))

    def _take_copy(self, checkpoint: str, folder: Path) -> str:
        """Copy ``checkpoint`` into a next segment's ``folder``; what is wrong with the copy ("": it reads whole)."""
        source = self.sweep_dir / checkpoint
        try:
            self._copy_checkpoint(source, folder)
        except FileNotFoundError:
            return f"{source}: gone, its run dropped it as it was copied"
        return f"{source}: {why}" if (why := _unreadable(folder / "checkpoints" / source.name)) else ""

    def _folder(self, member: int, index: int) -> Path:
        return self.sweep_dir / f"member_{member}" / f"segment_{index:03d}"

    def _job(self) -> int:
        self._next_job += 1
        return self._next_job - 1

    def _rng(self, member: int, index: int):
        return np.random.default_rng([self.decision_seed, member, index])

    # --- the end ------------------------------------------------------------------------------
    def _report(self) -> list:
        standings = {m.index: m.standing(self.window) for m in self.members}
        ranked = ranking(standings, self.mode == "max")
        lines = []
        for member in self.members:
            ended = [s for s in member.segments if s.state == "ended"]
            last = ended[-1] if ended else None
            state = ("failed: " + member.current.why if member.failed else
                     "finished" if member.finished else "paused")
            steps = f"{last.timesteps:,} env steps" if last is not None else "no segment ended"
            score = _score(last.score(self.window)) if last is not None else "-"
            exploits = sum(1 for s in member.segments if s.start_from and not s.start_from.startswith(
                f"member_{member.index}/"))
            settings = " ".join(f"{k}={_value(v)}" for k, v in (last or member.current).settings.items())
            lines.append(f"  member {member.index}: {state}, {steps}, {self.metric} {score}, {exploits} exploits; "
                         f"{settings}")
        print("pbt: the members at the end:\n" + "\n".join(lines), flush=True)
        best = self.members[ranked[0]].current if ranked else None
        finals = self._final_selection() if self.final_episodes else {}
        chosen = sorted((-e["mean"], index) for index, e in finals.items() if "mean" in e)
        if chosen:
            best = self.members[chosen[0][1]].current
            final = finals[best.member]
            print(f"pbt: best member {best.member}, {final['mean']:.2f} ± {final['std']:.2f} over its final "
                  f"{self.final_episodes} episodes ({self.metric} {_score(best.score(self.window))}), in {best.folder}",
                  flush=True)
        elif best is not None:
            print(f"pbt: best member {best.member}, {self.metric} {_score(best.score(self.window))}, in {best.folder}",
                  flush=True)
        if best is not None:
            print(f"evaluate it: python -m fiberrl.evaluate {best.folder} --episodes 100 --checkpoint latest",
                  flush=True)
        print(f"plot it:     python -m fiberrl.plot {self.sweep_dir} -o pbt.png", flush=True)
        failed = [m for m in self.members if m.failed]
        if failed:
            print(f"{len(failed)} of {self.population} members failed", file=sys.stderr)
            raise SystemExit(1)
        return [best.folder] if best is not None else []

    def _final_selection(self) -> dict:
        """{member: its "final" record}: each finished member's final policy over ``final_episodes`` episodes,
        episode i reset with seed ``final_seed + i``, in this process. Recorded in pbt.jsonl as it is measured, so a
        sweep run again names the same best without running them again (``_replay`` reads the records back)."""
        from fiberrl.evaluate import RunError, evaluate
        from fiberrl.rl.envs import UnknownEnvironment

        def key(member: Member) -> tuple:
            return member.index, member.current.index, self.final_episodes, self.final_seed

        finished = [m for m in self.members if m.finished]
        if any(key(m) not in self.finals for m in finished):
            print(f"pbt: the final selection: each finished member's final policy over {self.final_episodes} episodes "
                  f"(seeds {self.final_seed} to {self.final_seed + self.final_episodes - 1})", flush=True)
        finals = {}
        for member in finished:
            segment = member.current
            event = self.finals.get(key(member))
            if event is None:
                event = {"event": "final", "member": member.index, "segment": segment.index,
                         "checkpoint": segment.checkpoint, "episodes": self.final_episodes, "seed": self.final_seed}
                try:
                    returns = np.array([r for r, _ in evaluate(segment.folder, self.final_episodes, self.final_seed,
                                                               "latest")])
                    event.update(mean=float(returns.mean()), std=float(returns.std()))
                except (RunError, UnknownEnvironment) as exc:
                    event["why"] = str(exc)
                self._record(event)
                self.finals[key(member)] = event
            if "why" in event:
                print(f"pbt: member {member.index}'s final policy cannot be run ({event['why']}); it is left out of "
                      f"the final selection", flush=True)
            finals[member.index] = event
        scored = [f"member {i} {e['mean']:.2f} ± {e['std']:.2f}" for i, e in finals.items() if "mean" in e]
        if scored:
            print(f"pbt: final policies over {self.final_episodes} episodes: {', '.join(scored)}", flush=True)
        return finals


def _refuse(exc: Exception) -> NoReturn:
    """A sweep that cannot start or resume: its reason in one line, and Hydra's usage exit status."""
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def _unreadable(path: Path) -> str:
    """Why the checkpoint at ``path`` cannot be resumed from ("": it reads whole)."""
    try:
        upgrade_checkpoint(load_npz(path)[1])
        return ""
    except (DamagedFile, OSError) as exc:
        return str(exc)


def _ended_at(run) -> Optional[int]:
    """When ``run``'s job ended, in ns since the epoch: the time its return file was written (None if it cannot be
    read)."""
    try:
        return (run.folder / RETURN_FILE).stat().st_mtime_ns
    except OSError:
        return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_lineage(path: Path) -> list[dict]:
    """The events of ``pbt.jsonl``; a last line cut short by a kill is dropped, any other bad line is an error."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line.decode())
        except ValueError:  # UnicodeDecodeError too
            if number == len(lines):
                continue
            event = None
        if not isinstance(event, dict):
            raise PBTError(f"{path}: line {number} is not a lineage record; the file is damaged, so the sweep "
                           f"cannot be resumed from it: choose another hydra.sweep.dir")
        events.append(event)
    if events and events[0].get("event") != "sweep":
        raise PBTError(f"{path}: it does not begin with the sweep's settings; choose another hydra.sweep.dir")
    return events


def _drop_cut_line(path: Path) -> None:
    """A last line cut short by a kill taken off ``path``, so that what the resumed sweep appends starts a line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)
            os.fsync(fh.fileno())


def _rows(path: Path) -> list[dict]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [row for line in text.split("\n") if (row := metrics_row(line)) is not None]


def _flatten(tree: dict, prefix: str = "") -> dict:
    """``{"algo": {"learning_rate": "..."}}`` (as ``+hydra.sweeper.params.algo.learning_rate=`` makes it) ->
    ``{"algo.learning_rate": "..."}``; a mapping with a ``space`` is one setting's mutation."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and "space" not in value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _value(value) -> str:
    return repr(value) if isinstance(value, str) else "null" if value is None else str(value)


def _names(names) -> str:
    return ", ".join(f"algo.{n}" for n in sorted(names))


def _score(score: Optional[float]) -> str:
    return "-" if score is None else f"{score:.2f}"
