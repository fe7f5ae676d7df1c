"""The values each numeric setting may take, declared on the field's type next to the setting:
`attempts: Count = 4`, where `Count = Annotated[int, Ge(1)]`.

The bounds are annotated_types' markers (`Ge`, `Gt`, `Le`, `Lt`, `Interval`: PEP 593 metadata, which pydantic
reads too, and which `sandbox`, below `pipeline`, uses without importing it); `Also` adds sentinel values outside
them. To everything else the field is still a plain int. pipeline/core/config_tree.py checks the range whenever
settings load (a YAML file, `--set`, the launchpad's run config, the training subprocess's settings) and
`handhold config` prints it; tests/test_setting_ranges.py fails for a numeric setting declared without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt, Interval, Le, Lt


@dataclass(frozen=True, init=False)
class Also:
    """Exact values a setting takes besides its bounds: sentinels, e.g. `Also(-1)`: 'as many as the epochs make'."""

    values: tuple[float, ...]

    def __init__(self, *values: float) -> None:
        object.__setattr__(self, "values", values)


Count = Annotated[int, Ge(1)]
"""How many, where none makes no sense: attempts, workers, runs, tokens, steps."""
CountOrZero = Annotated[int, Ge(0)]
"""How many, where 0 means what the field's doc says (all, none, no limit) or counts as none (retries)."""
Seed = Annotated[int, Ge(0)]
"""A random seed (numpy's and torch's generators take no negative one)."""
Fraction = Annotated[float, Interval(ge=0, le=1)]
"""A share or a rate, 0 to 1 (inclusive)."""
Seconds = Annotated[float, Gt(0)]
"""A duration or a timeout, in seconds; 0 would end every wait before it starts."""
Positive = Annotated[float, Gt(0)]
"""A size or a factor where 0 makes no sense: a learning rate, an epoch count, a norm."""
NonNegative = Annotated[float, Ge(0)]
"""A price, a weight or a temperature, where 0 means free, off or greedy."""
StepLimit = Annotated[int, Ge(1), Also(-1)]
"""Optimizer steps, or -1: as many as the epochs make (0 would train nothing)."""


@dataclass(frozen=True)
class Range:
    """The markers of one field read together: from `low` to `high` (either None: unbounded; `low_open`,
    `high_open`: that end excluded), plus the exact values in `also`."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[float, ...] = ()

    def allows(self, value: float) -> bool:
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or (value < self.high if self.high_open else value <= self.high))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None and not (self.low_open or self.high_open):
            bounds = f"from {self.low:g} to {self.high:g}"
        else:
            bounds = " and ".join(filter(None, (
                None if self.low is None else f"{'above' if self.low_open else 'at least'} {self.low:g}",
                None if self.high is None else f"{'below' if self.high_open else 'at most'} {self.high:g}")))
        return ", or ".join(filter(None, (", ".join(f"{v:g}" for v in self.also), bounds or "any number")))


def range_of(kind: Any) -> Range | None:
    """The Range a field's type (with extras) declares, or the items' of a tuple setting; None if it declares none."""
    args = getattr(kind, "__args__", ())
    if getattr(kind, "__origin__", None) is tuple and args:
        return range_of(args[0])
    markers = [m for meta in getattr(kind, "__metadata__", ())
               for m in (meta if isinstance(meta, Interval) else [meta])]  # an Interval yields its Ge, Lt, ...
    found: dict[str, Any] = {}
    for m in markers:
        if isinstance(m, (Ge, Gt)):
            found.update(low=m.ge if isinstance(m, Ge) else m.gt, low_open=isinstance(m, Gt))
        elif isinstance(m, (Le, Lt)):
            found.update(high=m.le if isinstance(m, Le) else m.lt, high_open=isinstance(m, Lt))
        elif isinstance(m, Also):
            found.update(also=m.values)
    return Range(**found) if found else None


def out_of_range(value: Any, kind: Any) -> str:
    """Why `value` is outside the range `kind` declares (e.g. 'it must be at least 1'); '' when it fits."""
    allowed = range_of(kind)
    if allowed is None or not isinstance(value, (int, float)) or allowed.allows(value):
        return ""
    finite = "" if value in allowed.also or math.isfinite(value) else "a finite number, "
    return f"it must be {finite}{allowed}"
