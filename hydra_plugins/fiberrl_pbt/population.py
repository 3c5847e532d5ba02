"""A PBT population as the sweeper sees it, and its one decision: which member a ready one copies.

A member trains in segments of ``interval`` env steps, each a run (a Hydra job) of its own folder that
goes on from a checkpoint: its member's last one, or a top member's when it exploits. A segment's score
is the mean of the metric's last ``window`` values along its lineage (what the run it went on from had
logged, then its own)."""

import math
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
    carried: list[float] = field(default_factory=list)  # the metric's last values before it
    # once it has ended:
    state: str = "running"           # running, ended, failed
    timesteps: Optional[int] = None
    values: list[float] = field(default_factory=list)  # the metric as it logged it
    checkpoint: Optional[str] = None  # its last checkpoint, if whole (relative to the sweep's folder)
    paused: bool = False             # it stopped at `until`: the member goes on; else its run has ended
    why: str = ""                    # a failed one's reason
    damage: str = ""                 # what is wrong with its checkpoint, when it is damaged

    def history(self, window: int) -> list[float]:
        return (self.carried + self.values)[-window:]

    def score(self, window: int) -> Optional[float]:
        values = self.history(window)
        return sum(values) / len(values) if values else None


@dataclass
class Member:
    index: int
    segments: list[Segment] = field(default_factory=list)

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    @property
    def latest(self) -> Optional[Segment]:
        """Its last segment that ended with a whole checkpoint: what a ready member may copy."""
        for segment in reversed(self.segments):
            if segment.state == "ended" and segment.checkpoint is not None:
                return segment
        return None

    @property
    def finished(self) -> bool:
        return self.current.state == "ended" and not self.current.paused

    @property
    def failed(self) -> bool:
        return self.current.state == "failed"


def ranking(members: list[Member], window: int, maximize: bool) -> list[Member]:
    """Members with a score, best first (ties: the lower index first)."""
    scored = [(m.latest.score(window), m.index, m) for m in members
              if m.latest is not None and m.latest.score(window) is not None]
    scored.sort(key=lambda t: (-t[0] if maximize else t[0], t[1]))
    return [m for _, _, m in scored]


def quantile_size(ranked: int, quantile: float) -> int:
    """How many members are in the top (and in the bottom) quantile: Ray Tune's ceil, never overlapping."""
    return min(math.ceil(ranked * quantile), ranked // 2)


def choose_donor(member: Member, members: list[Member], window: int, maximize: bool, quantile: float,
                 rng, must: bool = False) -> Optional[Member]:
    """The top-quantile member ``member`` copies when it ranks in the bottom quantile (or ``must``: its own
    checkpoint is damaged); None: it goes on from its own."""
    ranked = ranking(members, window, maximize)
    size = quantile_size(len(ranked), quantile)
    top = [m for m in ranked[:size] if m is not member]
    bottom = ranked[len(ranked) - size:] if size else []
    if must:
        top = top or [m for m in ranked if m is not member]
    elif member not in bottom:
        return None
    return top[int(rng.integers(len(top)))] if top else None
