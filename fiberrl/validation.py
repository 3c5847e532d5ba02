"""What a setting may hold, said on its config dataclass field, beside its
default and its comment (``Config`` in ``algos/*.py``, ``EnvConfig``... in
``fiberrl/app_config.py``), and checked by ``fiberrl.app.validate`` before a run
starts anything::

    sigma: float = setting(0.02, positive())  # noise standard deviation
    hidden: list[int] = setting(rule=layer_sizes(), factory=lambda: [64, 64])
    check_fields(cfg.algo, Config, "algo.")

A value its rule refuses is reported in one line that names the key as the
user writes it, the value, and what is allowed::

    algo.sigma=-1.0: must be a finite number > 0

Hydra has already checked each value's type against the schema, so a rule
says only what the type cannot.  This module imports nothing of the app, so
every algorithm module may use it without Hydra's import cost in its workers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


class UsageError(ValueError):
    """A setting the run cannot start with; reported as one line."""


@dataclass(frozen=True)
class Rule:
    allows: Callable[[Any], bool]
    requirement: str  # what is allowed, the end of the line "key=value: <requirement>"

    def because(self, reason: str) -> Rule:
        return Rule(self.allows, f"{self.requirement} ({reason})")


# for a field whose type is all there is to check, or that a check of its own sees to (the comment says which)
ANY = Rule(lambda value: True, "anything")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def at_least(low: int) -> Rule:
    return Rule(lambda value: _integer(value) and value >= low, f"must be an integer >= {low}")


def positive() -> Rule:
    return Rule(lambda value: _number(value) and value > 0, "must be a finite number > 0")


def non_negative() -> Rule:
    return Rule(lambda value: _number(value) and value >= 0, "must be a finite number >= 0")


def finite() -> Rule:
    return Rule(_number, "must be a finite number")


def between(low: float, high: float, include_high: bool = True, include_low: bool = True) -> Rule:
    """A number from ``low`` to ``high``; ``include_high=False`` leaves ``high`` out, ``include_low=False`` ``low``."""
    def allows(value) -> bool:
        return (_number(value) and (low <= value if include_low else low < value)
                and (value <= high if include_high else value < high))
    return Rule(allows, f"must be a number in {'[' if include_low else '('}{low}, {high}{']' if include_high else ')'}")


def one_of(*choices: str) -> Rule:
    listed = choices[0] if len(choices) == 1 else f"one of {', '.join(choices)}"
    return Rule(lambda value: value in choices, f"must be {listed}")


def layer_sizes() -> Rule:
    def allows(value) -> bool:
        return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
                and all(_integer(width) and width > 0 for width in value))
    return Rule(allows, "must be a non-empty list of positive layer widths, e.g. [64,64]")


def non_empty() -> Rule:
    return Rule(lambda value: isinstance(value, str) and value.strip() != "", "must be a non-empty string")


def optional(rule: Rule, none_means: str) -> Rule:
    """``rule``, or null, which means ``none_means``."""
    return Rule(lambda value: value is None or rule.allows(value), f"{rule.requirement}, or null for {none_means}")


def setting(default: Any = MISSING, rule: Rule | None = None, *, factory: Callable[[], Any] | None = None):
    """A config dataclass field that says what it may hold: its ``default`` (or a ``factory`` making it) and
    its ``rule``, which every field states (``ANY`` where its type is all there is to check)."""
    if rule is None:
        raise TypeError("a setting states its rule (ANY where its type is all there is to check)")
    if factory is not None:
        return field(default_factory=factory, metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def rules_of(schema: type) -> dict[str, Rule]:
    r"""Each field's rule, of a dataclass whose fields are ``setting``\s."""
    return {f.name: f.metadata["rule"] for f in fields(schema)}


def check_fields(section: Mapping, schema: type, prefix: str = "") -> None:
    """Raise UsageError for the first field of ``section`` that its rule (on ``schema``'s field) refuses;
    ``prefix`` makes the field's key the one the user writes (``algo.``)."""
    for key, rule in rules_of(schema).items():
        value = section[key]
        if not rule.allows(value):
            raise UsageError(f"{prefix}{key}={shown(value)}: {rule.requirement}")


def shown(value) -> str:
    """``value`` as a command line writes it: true, null, [64, 64]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(shown(item) for item in value) + "]"
    return str(value)
