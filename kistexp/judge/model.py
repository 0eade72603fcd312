"""The judge's value objects: what it is asked, what it is given, what it answers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

OUTCOMES = ("pass", "fail", "inconclusive")
REASONS = ("insufficient_samples", "stale", "coverage", "data_quality", "undecided")
SEQUENTIAL_METHODS = ("obf", "pocock", "mixture")  # pocock: flat boundaries, for tripwires


def _floats(values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    arr.setflags(write=False)
    return arr


def _opt_floats(values: Any) -> np.ndarray | None:
    return None if values is None else _floats(values)


@attrs.frozen(eq=False)
class Window:
    """Samples of one metric in one window; ``times`` (UTC epoch seconds) enables the
    staleness, coverage, washout and design-effect checks."""

    values: np.ndarray = attrs.field(converter=_floats)
    times: np.ndarray | None = attrs.field(default=None, converter=_opt_floats)
    excluded: int = 0  # samples already dropped upstream (washout, wrong value in effect)

    def __attrs_post_init__(self) -> None:
        if self.times is not None and self.times.size != self.values.size:
            raise ValueError(f"{self.values.size} values but {self.times.size} times")

    @property
    def n(self) -> int:
        return int(self.values.size)


@attrs.frozen
class Counts:
    """Rare events over exposures (failures per transfer attempt, OOM kills per relay-hour).

    ``dispersion`` is the variance/mean ratio of hourly counts in the baseline (spec
    §2.4): above 1.5 events and exposures are divided by it before the exact test.
    """

    events: float
    exposure: float
    dispersion: float = 1.0
    newest: float | None = None  # epoch seconds of the newest exposure, for staleness


@attrs.frozen
class CriterionSpec:
    """The part of a plan criterion the judge needs (kistexp.plan.model.Criterion fits too)."""

    statistic: str
    comparison: str
    threshold: float
    min_samples: int = 0
    metric: str = ""
    name: str = ""


@attrs.frozen
class SequentialState:
    """What a sequential judgement carries from one look to the next.

    Start with ``SequentialState.plan(planned_stage=...)``; every Verdict returns the
    state for the next look in ``verdict.state``. ``planned_stage`` is the stage size
    (samples, exposures, or samples over all relays) expected at the planned end;
    ``target_stage`` is where the mixture is tuned (default: half of it, i.e. 7 of 14 days).
    """

    method: str
    planned_stage: float
    alpha_fail: float = 0.05
    alpha_pass: float = 0.05
    target_stage: float = 0.0
    fractions: tuple[float, ...] = ()  # information fractions of the looks so far

    @classmethod
    def plan(cls, planned_stage: float, method: str = "obf", alpha_fail: float = 0.05,
             alpha_pass: float = 0.05, target_stage: float | None = None) -> SequentialState:
        if method not in SEQUENTIAL_METHODS:
            raise ValueError(f"sequential method {method!r} is not one of {', '.join(SEQUENTIAL_METHODS)}")
        if not planned_stage > 0:
            raise ValueError("planned_stage must be positive")
        target = planned_stage / 2.0 if target_stage is None else target_stage
        return cls(method, float(planned_stage), alpha_fail, alpha_pass, float(target))

    @property
    def looks(self) -> int:
        return len(self.fractions)


@attrs.frozen
class Verdict:
    """One criterion's judgement at one look: the outcome and everything it rests on.

    ``effect``, ``ci_low`` and ``ci_high`` are on the comparison's own scale: the ratio
    stage/baseline for relative comparisons, the difference (metric units) for absolute
    ones and the stage statistic itself for above/below. The interval is the one the
    decision used: lower bound at the FAIL level, upper at the PASS level (mirrored for
    "decrease" comparisons).
    """

    outcome: str
    reason: str  # "" for pass/fail, else one of REASONS
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    bound: float  # the threshold on the effect's scale (1 + thr for relative-increase)
    n_baseline: int
    n_stage: int
    rule: str
    detail: str
    statistic: str
    comparison: str
    threshold: float
    method: str
    sequential: str  # "fixed", "obf" or "mixture"
    look: int
    information: float  # fraction of planned information (1.0 for a fixed-horizon look)
    c_fail: float
    c_pass: float
    excluded: int = 0
    warnings: tuple[str, ...] = ()
    state: SequentialState | None = None
    criterion: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=True)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None  # JSON has no infinities
        out["warnings"] = list(self.warnings)
        if self.state is not None:
            out["state"]["fractions"] = list(self.state.fractions)
        return out


Sample = Sequence[float] | np.ndarray | Window
PairedSamples = Mapping[str, Sample]
