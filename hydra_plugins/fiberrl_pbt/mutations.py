"""What PBT may do to one setting: its space, in Hydra's sweep syntax (``interval(0.05, 0.5)``,
``tag(log, interval(1e-5, 1e-2))``, ``choice(0.9, 0.95, 0.99)``, ``range(1, 11)``), how it is perturbed
(multiplied by one of ``factors``, kept in the space and always moved; a choice moves to a neighbour) and
how often it is resampled from the space instead (``resample``), as Jaderberg et al.'s and Ray Tune's PBT
explore."""

import math
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep


class MutationError(ValueError):
    """A mutation that cannot be: the message says which and why, in one line."""


@dataclass(frozen=True)
class Mutation:
    key: str                          # the setting, "algo.learning_rate"
    low: float | None = None          # an interval's bounds
    high: float | None = None
    log: bool = False                 # resampled log-uniformly
    choices: tuple = ()               # or the values it may take, in order
    resample: float = 0.25
    factors: tuple[float, ...] = (0.8, 1.2)
    integer: bool = False             # the setting holds an int

    def exploration(self) -> str:
        """How it is explored where that is not the usual (resampled with probability 0.25, else x0.8 or x1.2)."""
        usual = self.resample == 0.25 and (self.choices or self.factors == (0.8, 1.2))
        return "" if usual else (f", resampled with p={self.resample:g}" +
                                 ("" if self.choices else f", else x {' or x '.join(map(_short, self.factors))}"))

    def describe(self) -> str:
        space = (f"{'log ' if self.log else ''}[{_short(self.low)}, {_short(self.high)}]" if not self.choices
                 else "{" + ", ".join(map(_short, self.choices)) + "}")
        return f"{self.key} in {space}"

    def sample(self, rng) -> Any:
        if self.choices:
            return self.choices[int(rng.integers(len(self.choices)))]
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return self.fit(value)

    def explore(self, value, rng) -> Any:
        """``value`` perturbed, or resampled with probability ``resample``.  A perturbation always moves
        the value: at an end of its space it goes the one way left (a start at a range's edge would
        otherwise stay there on every draw of the factor that points out), and a value no factor moves
        (0, say, which multiplying keeps at 0) is resampled."""
        if rng.random() < self.resample:
            return self.sample(rng)
        if self.choices:
            if value not in self.choices:
                return self.sample(rng)
            index, step = self.choices.index(value), (1 if rng.random() < 0.5 else -1)
            if not 0 <= index + step < len(self.choices):
                step = -step
            return self.choices[index + step] if 0 <= index + step < len(self.choices) else value
        drawn, kept = int(rng.integers(len(self.factors))), self.fit(value)
        moves = [(f, new) for f in self.factors if (new := self._perturbed(value, f)) != kept]
        if not moves:
            return self.sample(rng)
        return next((new for f, new in moves if f == self.factors[drawn]), moves[drawn % len(moves)][1])

    def unit(self, value) -> float:
        """An interval's ``value`` as a share of its space, in [0, 1]: of its logarithms where the space is log-scaled
        (what PB2's process compares)."""
        if self.log:
            share = (math.log(max(value, self.low)) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        else:
            share = (value - self.low) / (self.high - self.low)
        return min(max(share, 0.0), 1.0)

    def from_unit(self, share: float):
        """The value at ``share`` of an interval's space: ``unit`` undone, kept in the space as ``fit`` keeps it."""
        if self.log:
            return self.fit(math.exp(math.log(self.low) + share * (math.log(self.high) - math.log(self.low))))
        return self.fit(self.low + share * (self.high - self.low))

    def _perturbed(self, value, factor: float):
        new = value * factor
        if self.integer and round(new) == value and factor != 1:  # 2 x 1.2 rounds back to 2: step by one
            new = value + (1 if factor > 1 else -1)
        return self.fit(new)

    def fit(self, value: float):
        """``value`` kept in the interval, as the setting's type and a command line take it."""
        value = min(max(value, self.low), self.high)
        if self.integer:
            return int(round(value))
        # 6 significant digits: the value goes on a command line and into pbt.jsonl as it is (an end that 6 digits
        # would round out of the space stays as it is)
        return min(max(float(f"{value:.6g}"), self.low), self.high)


def parse(key: str, spec: Any, resample: float, factors, integer: bool) -> Mutation:
    """A mutation from ``spec``: a space in Hydra's sweep syntax, or a mapping ``{space: ..., resample: p,
    factors: [..]}`` for this setting's own resample probability and factors. Raises MutationError."""
    if isinstance(spec, dict) or hasattr(spec, "keys"):
        extra = set(spec.keys()) - {"space", "resample", "factors"}
        if extra or "space" not in spec:
            raise MutationError(f"{key}: give a space in Hydra's sweep syntax, or {{space: ..., resample: p, "
                                f"factors: [..]}} (it has {', '.join(sorted(map(str, spec.keys()))) or 'nothing'})")
        resample = spec.get("resample", resample)
        factors = spec.get("factors", factors)
        spec = spec["space"]
    if not isinstance(resample, (int, float)) or not 0 <= resample <= 1:
        raise MutationError(f"{key}: resample probability {resample!r} must be in [0, 1]")
    try:
        factors = tuple(factors)
    except TypeError:  # one number
        raise MutationError(f"{key}: perturbation factors {factors!r} must be a list of positive numbers, e.g. "
                            f"[0.8, 1.2]") from None
    if not factors or any(not isinstance(f, (int, float)) or f <= 0 for f in factors):
        raise MutationError(f"{key}: perturbation factors {list(factors)} must be positive numbers, at least one")
    try:
        override = OverridesParser.create().parse_overrides([f"{key}={spec}"])[0]
    except Exception as exc:
        raise MutationError(f"{key}={spec}: not a space in Hydra's sweep syntax ({str(exc).splitlines()[0]}); "
                            f"e.g. interval(0.1, 0.3), tag(log, interval(1e-5, 1e-2)), choice(0.9, 0.99)") from None
    space = override.value()
    if not override.is_sweep_override():
        raise MutationError(f"{key}={spec}: one value is no space to mutate in; give interval(low, high), "
                            f"choice(a, b, ...) or range(start, stop)")
    if isinstance(space, IntervalSweep):
        low, high = float(space.start), float(space.end)
        if not low < high:
            raise MutationError(f"{key}={spec}: an empty range (its low end must be below its high end)")
        log = "log" in space.tags
        if log and low <= 0:
            raise MutationError(f"{key}={spec}: a log-scaled range must lie above 0")
        return Mutation(key, low, high, log=log, resample=resample, factors=factors, integer=integer)
    if isinstance(space, RangeSweep):
        choices = tuple(override.sweep_iterator())
    elif isinstance(space, ChoiceSweep):
        choices = tuple(space.list)
    else:
        raise MutationError(f"{key}={spec}: give interval(...), choice(...) or range(...)")
    if not choices:
        raise MutationError(f"{key}={spec}: an empty range (it holds no value)")
    return Mutation(key, choices=choices, resample=resample, factors=factors, integer=integer)


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
