"""The judge's value objects: what it is asked, what it is given, what it answers."""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from kistexp import jsonout
from kistexp.errors import KistexpError

OUTCOMES = ("pass", "fail", "inconclusive")
REASONS = ("insufficient_samples", "stale", "coverage", "data_quality", "undecided")
SEQUENTIAL_METHODS = ("obf", "pocock", "mixture")  # pocock: flat boundaries, for tripwires
# What a sequential state may hold, checked whenever one is made (a state file is user input):
# - each error rate in (0, 0.5): 0 made every critical value infinite, NaN every verdict
#   INCONCLUSIVE, 0.6 a negative critical value and a PASS on an inverted interval;
# - the planned stage size positive and finite, at most 10^15 samples or exposures;
# - spending methods compute one boundary per look (about 1 ms each): 10,000 looks (over a
#   year of hourly looks) stay within seconds; a state of 10^7 looks would take hours. The
#   mixture's boundary does not depend on earlier looks, so only memory bounds its count.
MAX_PLANNED = 1e15
MAX_SPENDING_LOOKS = 10_000
MAX_MIXTURE_LOOKS = 1_000_000


class SequentialStateError(KistexpError, ValueError):
    """A sequential state (or the plan of one) that cannot be used; a ValueError too, as before."""


def check_alpha(value: float, name: str) -> float:
    """``value`` as a float if it is an error rate the judge can use, else SequentialStateError."""
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        raise SequentialStateError(f"{name} {value!r} is not a number") from None
    if not 0.0 < alpha < 0.5:
        raise SequentialStateError(f"{name} {value!r} must be above 0 and below 0.5 (the error per direction, "
                                   "e.g. 0.05)")
    return alpha


def _check_state(state: SequentialState) -> None:
    if state.method not in SEQUENTIAL_METHODS:
        raise SequentialStateError(f"sequential method {state.method!r} is not one of {', '.join(SEQUENTIAL_METHODS)}")
    if not (isinstance(state.planned_stage, numbers.Real) and 0 < state.planned_stage <= MAX_PLANNED):
        raise SequentialStateError(f"planned stage size {state.planned_stage!r} must be above 0 and at most "
                                   f"{MAX_PLANNED:g}")
    check_alpha(state.alpha_fail, "alpha_fail")
    check_alpha(state.alpha_pass, "alpha_pass")
    if not (isinstance(state.target_stage, numbers.Real) and 0 <= state.target_stage <= MAX_PLANNED):
        raise SequentialStateError(f"target stage size {state.target_stage!r} must be from 0 to {MAX_PLANNED:g}")
    most = MAX_MIXTURE_LOOKS if state.method == "mixture" else MAX_SPENDING_LOOKS
    if len(state.fractions) > most:
        raise SequentialStateError(f"{len(state.fractions)} looks is over the {most} a {state.method} state may hold")
    if not all(isinstance(t, numbers.Real) and math.isfinite(t) and t >= 0 for t in state.fractions):
        raise SequentialStateError("information fractions must be finite numbers >= 0")
    if state.method != "mixture" and any(not 0 < t <= 1 or t < before
                                         for before, t in itertools.pairwise((0.0, *state.fractions))):
        # alpha spending needs them so; the spending code raised a bare ValueError at the next look
        raise SequentialStateError(f"information fractions of a {state.method} state must be non-decreasing in "
                                   "(0, 1]")


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

    def __attrs_post_init__(self) -> None:
        _check_state(self)

    @classmethod
    def plan(cls, planned_stage: float, method: str = "obf", alpha_fail: float = 0.05,
             alpha_pass: float = 0.05, target_stage: float | None = None) -> SequentialState:
        """A state before its first look; SequentialStateError (a ValueError) for what cannot be one."""
        try:
            planned = float(planned_stage)
        except (TypeError, ValueError):
            raise SequentialStateError(f"planned stage size {planned_stage!r} is not a number") from None
        if not 0 < planned <= MAX_PLANNED:
            raise SequentialStateError(f"planned stage size {planned_stage!r} must be above 0 and at most "
                                       f"{MAX_PLANNED:g}")
        target = planned / 2.0 if target_stage is None else target_stage
        return cls(method, planned, check_alpha(alpha_fail, "alpha_fail"), check_alpha(alpha_pass, "alpha_pass"),
                   float(target))

    @property
    def looks(self) -> int:
        return len(self.fractions)


@jsonout.shape(nan_as_null=True)  # JSON has no infinities: a NaN effect or standard error is null
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
    # What a longer stage could still decide. With a fixed baseline se² = se_S² + se_B² never falls below
    # se_B² (spec §3.2), so an interval can straddle the bound however long the stage runs. se_stage and
    # se_baseline are each side's standard error on θ's scale, design effect included (NaN where the
    # estimator does not separate the sides: shifts, relay pairs); halfwidth_floor is the narrowest
    # half-width any longer stage could reach at the level that decides the estimate's side; limited_by
    # is "baseline" when even that half-width would still straddle the bound (no extension can decide).
    se_stage: float = math.nan
    se_baseline: float = math.nan
    halfwidth_floor: float = math.nan
    limited_by: str = ""
    # The time-correlation design effect that widened the interval (spec §5.4 rule 3: Newey–West
    # over the baseline's hourly means; 1 without sample times or correlation).
    design_effect: float = 1.0
    # The FAIL error this criterion was judged at and how it was reached (spec §5.5, docs/judge.md
    # "Several criteria"): "holm 1/5" is the first of five in Holm's step-down, "bonferroni",
    # "none"; "" when one criterion was judged alone at alpha_fail.
    alpha_fail: float = math.nan
    correction: str = ""


Sample = Sequence[float] | np.ndarray | Window
PairedSamples = Mapping[str, Sample]


def effect_origin(comparison: str) -> float:
    """"No effect" on the judge's effect scale: a ratio of 1, a difference of 0."""
    return 1.0 if comparison.startswith("relative") else 0.0


def effect_limit(comparison: str, threshold: float) -> float:
    """The threshold on the judge's effect scale (``Verdict.bound``): the ratio
    stage/baseline for relative comparisons, the difference for absolute ones, the stage
    value itself for above/below."""
    return {"relative-increase": 1 + threshold, "relative-decrease": 1 - threshold,
            "absolute-decrease": -threshold}.get(comparison, threshold)
