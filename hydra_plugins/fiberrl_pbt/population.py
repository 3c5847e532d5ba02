"""A PBT population as the sweeper sees it, and its one decision: which member a ready one copies.

A member trains in segments of ``interval`` env steps, each a run (a Hydra job) of its own folder that
goes on from a checkpoint: its member's last one, or a top member's when it exploits (a running member's
newest, which its segment may have written since it began). A segment's score is the mean of the
metric's last ``window`` values along its lineage (what the run it went on from had logged, then its
own)."""

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional


@dataclass
class Segment:
    member: int
    index: int                       # the member's how-manieth
    job: int                         # its Hydra job number
    folder: Path
    seed: int
    settings: dict[str, Any]         # the mutated settings' values it runs with
    until: int                       # it pauses at this many env steps
    start_from: Optional[str] = None  # the checkpoint it went on from, relative to the sweep's folder
    start_timesteps: int = 0          # the env steps of that checkpoint
    carried: list[float] = field(default_factory=list)  # the metric's last values before it
    # a copy's member's own score before it copied: what the others rank it by until it logs a value of its own
    # (as Ray Tune keeps a trial's last score). Ranked at its donor's score, a copy would push the next ready
    # member to the bottom, and that one's copy the next: one lucky evaluation took a whole population in a
    # round, a member copying the copy of its own older checkpoint on the way
    stands_at: Optional[float] = None
    # (ranking=ready) its member ranked in the top quantile at the ready point it began from, so that point's
    # checkpoint is one a member may copy until the next: Ray Tune's PBT keeps a checkpoint of a top trial only
    ranked_top: bool = False
    # once it has ended:
    state: str = "running"           # running, ended, failed
    timesteps: Optional[int] = None
    values: list[float] = field(default_factory=list)  # the metric as it logged it
    checkpoint: Optional[str] = None  # its last checkpoint, if whole (relative to the sweep's folder)
    paused: bool = False             # it stopped at `until`: the member goes on; else its run has ended
    why: str = ""                    # a failed one's reason
    damage: str = ""                 # what is wrong with its checkpoint, when it is damaged
    # while it runs, as the sweeper last looked: the metric with the env steps it was logged at, and its
    # newest checkpoint (relative to the sweep's folder, its env steps): one it wrote, else where it began
    logged: list[tuple[int, float]] = field(default_factory=list)
    newest: Optional[tuple[str, int]] = None

    def history(self, window: int) -> list[float]:
        return (self.carried + self.values)[-window:]

    def score(self, window: int) -> Optional[float]:
        values = self.history(window)
        return sum(values) / len(values) if values else None

    def ranked_at(self, window: int) -> Optional[float]:
        """Its score as the others rank it: ``stands_at`` until it has logged a value."""
        if self.stands_at is not None and not self.values:
            return self.stands_at
        return self.score(window)


@dataclass(frozen=True)
class Standing:
    """Where a member stands for the others: its score now, and what a member copying it goes on from."""
    score: Optional[float]
    checkpoint: Optional[str]        # None: nothing to copy yet (its first segment runs), or damaged
    settings: dict
    seed: int
    history: list                    # the metric's last values up to that checkpoint
    timesteps: int
    kept: bool = True                # (ranking=ready) it ranked on top there: a member in the bottom may copy it


@dataclass
class Member:
    index: int
    segments: list[Segment] = field(default_factory=list)

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    @property
    def finished(self) -> bool:
        return self.current.state == "ended" and not self.current.paused

    @property
    def failed(self) -> bool:
        return self.current.state == "failed"

    def standing(self, window: int) -> Optional[Standing]:
        """Its score over its latest ``window`` values (those its running segment has logged so far
        included: a ready member is ranked against the others as they are now, as Jaderberg et al.'s),
        and the point to copy: its running segment's newest checkpoint (else the one it went on from)
        with the settings it runs with, or its ended segment's last. None for a failed member."""
        segment = self.current
        if segment.state == "failed":
            return None
        if segment.state == "ended":
            return Standing(segment.ranked_at(window), segment.checkpoint, segment.settings, segment.seed,
                            segment.history(window), segment.timesteps)
        if segment.newest is not None:  # copied there, a member redoes none of the steps since its start
            checkpoint, timesteps = segment.newest
            before = [value for at, value in segment.logged if at <= timesteps]
            return Standing(segment.ranked_at(window), checkpoint, segment.settings, segment.seed,
                            (segment.carried + before)[-window:], timesteps)
        return Standing(segment.ranked_at(window), segment.start_from, segment.settings, segment.seed,
                        segment.carried[-window:], segment.start_timesteps)

    def ready_standing(self, window: int, burn_in: int) -> Optional[Standing]:
        """Ray Tune's view of it: where it stood at its last ready point past ``burn_in`` (its score there, its
        checkpoint there), even while it runs on since, or from a copy; None before such a point, and once it
        has finished or failed."""
        segment = self.current
        if segment.state == "failed" or self.finished:
            return None
        ready = segment if segment.state == "ended" else self.segments[-2] if len(self.segments) > 1 else None
        if ready is None or not ready.paused or ready.timesteps < burn_in:
            return None
        return Standing(ready.score(window), ready.checkpoint, ready.settings, ready.seed, ready.history(window),
                        ready.timesteps, kept=segment.state == "ended" or segment.ranked_top)


def ranking(standings: dict[int, Standing], maximize: bool) -> list[int]:
    """The members with a score, best first (ties: the lower index first)."""
    scored = [(s.score, index) for index, s in standings.items() if s is not None and s.score is not None]
    scored.sort(key=lambda t: (-t[0] if maximize else t[0], t[1]))
    return [index for _, index in scored]


def quantile_size(ranked: int, quantile: float) -> int:
    """How many members are in the top (and in the bottom) quantile: Ray Tune's ceil, never overlapping."""
    return min(math.ceil(ranked * quantile), ranked // 2)


def choose_donor(member: int, standings: dict[int, Standing], maximize: bool, quantile: float, rng,
                 must: bool = False, passed_over: frozenset = frozenset()) -> Optional[int]:
    """The top-quantile member that ``member`` copies when it ranks in the bottom quantile (or ``must``: its
    own checkpoint is damaged; then the best it can); None: it goes on from its own. Members in
    ``passed_over`` and those with nothing to copy are not chosen; nor, unless ``must``, one drawn whose
    checkpoint is not ``kept``: then it goes on from its own, as Ray Tune skips the exploit."""
    ranked = ranking(standings, maximize)
    size = quantile_size(len(ranked), quantile)
    copyable = [i for i in ranked if i != member and i not in passed_over and standings[i].checkpoint is not None]
    top = [i for i in ranked[:size] if i in copyable]
    if must:
        top = top or copyable[:1]
    elif member not in ranked[len(ranked) - size:] or not size:
        return None
    if not top:
        return None
    donor = top[int(rng.integers(len(top)))]
    return donor if must or standings[donor].kept else None


def choose_donor_by_ttest(member: int, standings: dict[int, Standing], maximize: bool, significance: float, rng,
                          passed_over: frozenset = frozenset()) -> tuple[Optional[int], Optional[float]]:
    """Jaderberg et al.'s t-test selection: another member with something to copy, drawn uniformly, is copied
    when the mean of its last values is better than ``member``'s and Welch's t-test on the two says so at
    ``significance``. Returns (that member or None, the test's one-sided p-value; None if there was no test).
    Unlike truncation it copies no member on a difference its few noisy values cannot tell from chance."""
    own = standings.get(member)
    copyable = [i for i, s in sorted(standings.items())
                if i != member and s is not None and i not in passed_over and s.checkpoint is not None]
    if own is None or not copyable:
        return None, None
    other = copyable[int(rng.integers(len(copyable)))]
    if len(own.history) < 2 or len(standings[other].history) < 2:  # a variance needs two values
        return None, None
    p_value = welch_p_value(standings[other].history, own.history, maximize)
    return (other if p_value < significance else None), p_value


def welch_p_value(candidate: list[float], own: list[float], maximize: bool) -> float:
    """One-sided p-value of Welch's t-test that ``candidate``'s mean is above ``own``'s (below, if not
    ``maximize``). Two samples without spread: 0 if the candidate's mean is better, else 1."""
    from scipy import stats  # only a sweep that selects by t-test needs it
    # a run gone to NaN is logged as the worst value there is (the sweeper's): never better, and worse than any other
    if not all(map(math.isfinite, candidate)):
        return 1.0
    if not all(map(math.isfinite, own)):
        return 0.0
    if len(set(candidate)) == 1 and len(set(own)) == 1:
        better = candidate[0] - own[0]
        return 0.0 if (better > 0 if maximize else better < 0) else 1.0
    with warnings.catch_warnings():  # values nearly alike: scipy warns of lost precision, and its p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(candidate, own, equal_var=False, alternative="greater" if maximize else "less")
    return float(result.pvalue)
