"""Switchback designs judged as experimentation platforms judge them (spec judge.md §6).

Treatment and control alternate in periods. Samples within a period share its hours, its
load and its network weather, so the unit of analysis is a *time bucket*, never a sample:

* **burn-in and burn-out**: each period's first ``washout`` seconds (the new consensus is
  still propagating, judge.md §5.3) and its last ``burnout`` seconds (the window before the
  next switch) are dropped and counted;
* **buckets**: each clock hour of a period is one observation, the log-statistic of its
  samples (an hour too thin for the statistic joins the next hour of the same period); when
  the samples are too sparse for hourly statistics, or have no times, the whole period is one
  bucket (§6.2: one post-washout log-statistic per period);
* **regression**: OLS of the bucket log-statistics on the treatment indicator with cycle
  fixed effects (a cycle is an adjacent treatment and control period: the pair design of
  §6.2, which removes slow drift) and, for hour buckets, hour-of-day fixed effects (§6.1:
  periods that do not balance the hours of the day need them). θ̂ is the indicator's slope;
* **standard error**: clustered by cycle (the two periods of a cycle share its fixed effect,
  so their scores are not separable), with a Newey–West term over the cycle sequence
  (Bartlett weights, lag 1 by default) taken when the cycles' scores are positively
  autocorrelated (§6.3); df = cycles − 1, i.e. periods less the cycle effects and θ. With one
  bucket per period this is exactly the t interval over per-cycle differences;
* **decision**: θ̂ and its interval go to the judge's three-way rule; sequential looks are at
  cycle ends with information t = completed / planned cycles (§6.4), through the same
  Lan–DeMets spending and t boundaries as stages.

Simulated coverage of the 90 % interval (14 × 24 h periods, AR(1) hour effects φ 0.8, SD
0.06; tests/judge/test_switchback_analysis.py) is within 3 points of 90 %, where the per-sample
interval covers 79 % (§6.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
from scipy import stats

from kistexp.judge import estimators as est
from kistexp.judge.core import _TAIL_SAMPLES, HOURS_OF_DAY, JudgeError, _Context, _criterion, _Orientation
from kistexp.judge.model import SequentialState, SequentialStateError, Verdict, _floats, _opt_floats, check_alpha

ARMS = ("treatment", "control")
# Below 4 cycles the t quantile (df <= 2: 2.92 at one-sided 5 %) leaves intervals too wide
# to decide anything a plan would threshold; 7 daily cycles (14 days) is the spec's design.
MIN_CYCLES = 4
# Each period's own statistic needs enough samples to be a statistic at all.
MIN_PERIOD_SAMPLES = 20
# An hour bucket's median or mean needs this many samples (a quantile p, this many times
# 0.5/min(p, 1 − p)): below it the hour joins the next one of its period. 12 OnionPerf
# transfers an hour make hour buckets; 4 an hour leave one bucket per period.
BUCKET_SAMPLES = 10
# Newey–West lag over cycles: lag 1 covers the carry-over from one cycle into the next;
# judge.md §6.3 suggests 1-2 when periods are autocorrelated.
NW_LAGS = 1
BUCKETS = ("auto", "hour", "period")
HOUR_S = 3600.0


def appendable_cycles(cycles: int) -> int:
    """Cycles a run may append to a switchback left undecided at its planned end (rollout.md §1.6)."""
    return cycles // 2


def horizon_cycles(cycles: int) -> int:
    """Every cycle a run may take: the planned ones and the appendable ones. The engine plans its
    sequential analysis over them, so an appended cycle is a later look of the same analysis
    rather than a new one with fresh error (docs/judge.md, "Switchback plans")."""
    return cycles + appendable_cycles(cycles)


@attrs.frozen(eq=False)
class Period:
    """One switchback period: its arm, its samples, and its UTC start and end (epoch s).

    ``times`` (epoch s, one per value) let ``judge_switchback`` drop the burn-in after the
    switch and the burn-out before the next one, and bucket the samples by hour; without
    them the values are taken as already trimmed and the period is one bucket.
    """

    arm: str
    values: np.ndarray = attrs.field(converter=_floats)
    start: float
    end: float
    times: np.ndarray | None = attrs.field(default=None, converter=_opt_floats)

    def __attrs_post_init__(self) -> None:
        if self.arm not in ARMS:
            raise JudgeError(f"switchback period arm {self.arm!r} is not one of {', '.join(ARMS)}")
        if not self.end > self.start:
            raise JudgeError(f"switchback period ends ({self.end}) before it starts ({self.start})")
        if self.times is not None and self.times.size != self.values.size:
            raise JudgeError(f"switchback period has {self.values.size} values but {self.times.size} times")


@attrs.frozen
class Regression:
    """θ̂ of the bucket regression and how its standard error was made."""

    theta: float
    se: float
    df: float
    se_cluster: float  # clustered by cycle, no autocorrelation term
    se_newey_west: float  # with the Bartlett-weighted autocovariances of the cycles' scores
    r1: float  # lag-1 autocorrelation of the cycles' scores
    lags: int
    n_buckets: int
    n_cycles: int

    @property
    def newey_west(self) -> bool:
        """Whether the Newey–West term widened the SE (positively autocorrelated cycles)."""
        return self.se_newey_west > self.se_cluster


def bucket_regression(y, treated, cycle, hour=None, lags: int = NW_LAGS) -> Regression | None:
    """OLS of bucket values ``y`` on the 0/1 ``treated`` indicator with a fixed effect for each
    ``cycle`` (0 .. m−1 in time order) and, when ``hour`` is given, for each hour of the day.

    The SE is clustered by cycle with the small-sample factor m/(m−1); a Newey–West term over
    the cycle sequence (lag ``lags``, Bartlett weights) is added when it widens the SE, i.e.
    when the cycles' scores are positively autocorrelated: it never narrows an interval on
    what is, over a handful of cycles, mostly noise in the autocovariance (judge.md §6.3).
    None when the fixed effects absorb the treatment (arms locked to hours of the day).
    """
    y = np.asarray(y, dtype=float)
    d = np.asarray(treated, dtype=float)
    cyc = np.asarray(cycle, dtype=np.int64)
    m = int(cyc.max()) + 1 if cyc.size else 0
    if m < 2:
        raise JudgeError(f"a switchback regression needs 2 cycles or more, got {m}")
    cols = [np.eye(m)[cyc]]
    if hour is not None:
        hod = np.asarray(hour, dtype=np.int64)
        levels = np.unique(hod)
        if levels.size > 1:
            cols.append((hod[:, None] == levels[None, 1:]).astype(float))
    rest = np.hstack(cols)
    # Frisch–Waugh–Lovell: θ̂ is the slope of y on the indicator once both have the fixed effects taken out
    coef, *_ = np.linalg.lstsq(rest, np.column_stack([d, y]), rcond=None)
    resid = np.column_stack([d, y]) - rest @ coef
    xt, yt = resid[:, 0], resid[:, 1]
    sxx = float(xt @ xt)
    if sxx <= 1e-9 * max(float(d @ d), 1.0):
        return None
    theta = float(xt @ yt) / sxx
    scores = np.bincount(cyc, weights=xt * (yt - theta * xt), minlength=m)
    g0 = float(scores @ scores)
    lags = max(0, min(int(lags), m - 1))
    nw = g0 + 2.0 * sum((1.0 - lag / (lags + 1.0)) * float(scores[lag:] @ scores[:-lag])
                        for lag in range(1, lags + 1))
    small = m / (m - 1.0)
    v_cluster = small * g0 / sxx ** 2
    v_nw = small * max(nw, 0.0) / sxx ** 2
    r1 = float(scores[1:] @ scores[:-1]) / g0 if g0 > 0 else 0.0
    return Regression(theta, math.sqrt(max(v_cluster, v_nw)), float(m - 1), math.sqrt(v_cluster), math.sqrt(v_nw),
                      r1, lags, int(y.size), m)


def _group_statistic(x: np.ndarray, groups: np.ndarray, n_groups: int, statistic: str) -> np.ndarray:
    """The statistic of the values of each group 0 .. n_groups−1 (every group non-empty), in one pass:
    thousands of buckets per call in the coverage simulations."""
    counts = np.bincount(groups, minlength=n_groups).astype(float)
    if statistic == "mean":
        return np.bincount(groups, weights=x, minlength=n_groups) / counts
    p = est.quantile_level(statistic)
    order = np.lexsort((x, groups))
    xs = x[order]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    pos = p * (counts - 1.0)  # linear interpolation between order statistics, as np.quantile and np.median
    lo = np.floor(pos).astype(np.int64)
    frac = pos - lo
    hi = np.minimum(lo + 1, counts.astype(np.int64) - 1)
    return xs[starts + lo] * (1.0 - frac) + xs[starts + hi] * frac


def _hour_buckets(times: np.ndarray, need: int) -> tuple[np.ndarray, np.ndarray]:
    """(bucket of each sample 0 .. k−1, hour of day of each bucket) for one period: clock hours,
    an hour with fewer than ``need`` samples joined to the next, a thin last one to the previous."""
    clock = np.floor(times / HOUR_S).astype(np.int64)
    hours, counts = np.unique(clock, return_counts=True)
    ids = np.empty(hours.size, dtype=np.int64)
    firsts: list[int] = []
    run, k = 0, -1
    for j, (h, c) in enumerate(zip(hours, counts, strict=True)):
        if run == 0:
            k += 1
            firsts.append(int(h))
        ids[j] = k
        run += int(c)
        if run >= need:
            run = 0
    if 0 < run < need and k > 0:
        ids[ids == k] = k - 1  # the period's thin last hours join the bucket before them
        firsts.pop()
    return ids[np.searchsorted(hours, clock)], np.asarray(firsts, dtype=np.int64) % HOURS_OF_DAY


def _hours(p: Period) -> set[int]:
    first = int(math.floor(p.start / HOUR_S))
    last = int(math.ceil(p.end / HOUR_S))
    return {h % HOURS_OF_DAY for h in range(first, max(last, first + 1))}


@attrs.frozen(eq=False)
class _Kept:
    period: Period
    values: np.ndarray
    times: np.ndarray | None


def judge_switchback(criterion, periods: Sequence[Period], *, washout: float = 0.0, burnout: float = 0.0,
                     planned_cycles: int | None = None, sequential_state: SequentialState | None = None,
                     alpha_fail: float = 0.05, alpha_pass: float = 0.05, final: bool = False,
                     min_cycles: int = MIN_CYCLES, bucket: str = "auto", lags: int = NW_LAGS) -> Verdict:
    """Judge one criterion on the completed periods of a switchback plan.

    ``periods``: completed periods in any order (sorted by start here). ``washout`` and
    ``burnout``: seconds after each period's start and before its end whose samples are
    dropped (burn-in and burn-out; they need ``times``). ``bucket``: "hour", "period" or
    "auto" (hour buckets when the periods have times and most hours hold ``BUCKET_SAMPLES``).
    ``lags``: the Newey–West lag over cycles. ``planned_cycles`` with
    ``sequential_state=None`` makes a sequential look (OBF spending at t = cycles/planned);
    pass the previous verdict's ``state`` to the next look. Without either it is one
    fixed-horizon look. The verdict's ``n_stage`` and ``n_baseline`` are the treatment and
    control samples used, ``excluded`` the burn-in and burn-out samples dropped; ``effect`` is
    the regression's ratio (or difference) treatment/control.
    """
    spec = _criterion(criterion)
    orient = _Orientation(spec.comparison, spec.threshold)
    if orient.one_sample:
        raise JudgeError(f"switchback compares arms; {spec.comparison!r} has no control side")
    if spec.statistic == "shift":
        raise JudgeError("statistic 'shift' has no per-period value; use median or mean in a switchback")
    if bucket not in BUCKETS:
        raise JudgeError(f"bucket {bucket!r} is not one of {', '.join(BUCKETS)}")
    if not (math.isfinite(washout) and math.isfinite(burnout)) or washout < 0 or burnout < 0:
        raise JudgeError(f"washout {washout} and burnout {burnout} must be finite seconds >= 0")
    if sequential_state is None and planned_cycles is not None:
        if planned_cycles < 1:
            raise JudgeError(f"planned_cycles {planned_cycles} must be at least 1")
        try:
            sequential_state = SequentialState.plan(planned_stage=float(planned_cycles), alpha_fail=alpha_fail,
                                                    alpha_pass=alpha_pass)
        except SequentialStateError as exc:
            raise JudgeError(str(exc)) from None
    if sequential_state is not None:
        alpha_fail, alpha_pass = sequential_state.alpha_fail, sequential_state.alpha_pass
    try:
        alpha_fail, alpha_pass = check_alpha(alpha_fail, "alpha_fail"), check_alpha(alpha_pass, "alpha_pass")
    except SequentialStateError as exc:
        raise JudgeError(str(exc)) from None
    ctx = _Context(spec, orient, sequential_state, alpha_fail, alpha_pass, None, None, final)
    per_period = MIN_PERIOD_SAMPLES
    per_bucket = BUCKET_SAMPLES
    if spec.statistic not in ("mean", "median"):
        p = est.quantile_level(spec.statistic)
        per_period = max(per_period, int(math.ceil(_TAIL_SAMPLES / min(p, 1 - p))))
        per_bucket = int(math.ceil(BUCKET_SAMPLES * 0.5 / min(p, 1 - p)))

    # burn-in and burn-out (judge.md §5.3 washout; docs/judge.md "Switchback plans" for the burn-out)
    kept: list[_Kept] = []
    burn_in = burn_out = dropped_short = 0
    for per in sorted(periods, key=lambda q: q.start):
        x, t = per.values, per.times
        if t is not None and (washout > 0 or burnout > 0):
            early = t < per.start + washout
            late = ~early & (t >= per.end - burnout)
            burn_in += int(early.sum())
            burn_out += int(late.sum())
            keep = ~(early | late)
            x, t = x[keep], t[keep]
        if not np.isfinite(x).all() or (t is not None and not np.isfinite(t).all()):
            ctx.excluded = burn_in + burn_out
            return ctx.inconclusive("data_quality", f"{per.arm} period starting {per.start:.0f} has non-finite "
                                    "values or times", 0, 0)
        if orient.relative and ((x < 0).any() if spec.statistic == "mean" else (x <= 0).any()):
            ctx.excluded = burn_in + burn_out
            return ctx.inconclusive("data_quality", f"{per.arm} period starting {per.start:.0f} has "
                                    f"{'negative' if spec.statistic == 'mean' else 'non-positive'} values: a "
                                    "relative comparison needs positive statistics", 0, 0)
        if x.size < per_period:
            dropped_short += 1
            continue
        kept.append(_Kept(per, x, t))
    ctx.excluded = burn_in + burn_out

    # Cycles: adjacent periods of opposite arms, in time order (a lone period waits for its partner).
    cycles: list[tuple[_Kept, _Kept]] = []
    i = 0
    while i + 1 < len(kept):
        a, b = kept[i], kept[i + 1]
        if a.period.arm == b.period.arm:
            i += 1  # a missing partner (dropped or not run): skip to the next switch
            continue
        cycles.append((a, b) if a.period.arm == "treatment" else (b, a))
        i += 2
    m = len(cycles)
    n_t = sum(t.values.size for t, _ in cycles)
    n_c = sum(c.values.size for _, c in cycles)
    if dropped_short:
        ctx.warnings.append(f"{dropped_short} period(s) with fewer than {per_period} samples after burn-in and "
                            "burn-out left out")
    if m < max(2, min_cycles):
        return ctx.inconclusive("insufficient_samples", f"{m} complete cycles < {max(2, min_cycles)} needed "
                                "(one treatment and one control period each)", n_c, n_t)
    if n_t < spec.min_samples or n_c < spec.min_samples:
        return ctx.inconclusive("insufficient_samples", f"treatment {n_t}, control {n_c} samples < "
                                f"{spec.min_samples} needed per arm", n_c, n_t)
    used = [k for pair in cycles for k in pair]
    hours_t = set().union(*(_hours(k.period) for k in used if k.period.arm == "treatment"))
    hours_c = set().union(*(_hours(k.period) for k in used if k.period.arm == "control"))
    if not hours_t & hours_c:
        # periods that lock each arm to its own hours alias the effect with the time of day (§6.1)
        return ctx.inconclusive("coverage", "treatment and control periods share no hour of the day: the "
                                "effect is aliased with the time of day", n_c, n_t)

    timed = all(k.times is not None for k in used)
    if bucket == "hour" and not timed:
        raise JudgeError("hour buckets need sample times in every period")
    if bucket == "auto":
        per_hour = [np.unique(np.floor(k.times / HOUR_S), return_counts=True)[1] for k in used] if timed else []
        bucket = "hour" if timed and float(np.median(np.concatenate(per_hour))) >= per_bucket else "period"

    # one observation per bucket: the statistic of its samples, on logs for relative comparisons
    values = np.concatenate([k.values for k in used])
    groups, treated, cycle_of, hour_of, period_of = [], [], [], [], []
    n_groups = 0
    for j, k in enumerate(used):
        if bucket == "hour":
            assert k.times is not None
            ids, hod = _hour_buckets(k.times, per_bucket)
        else:
            ids, hod = np.zeros(k.values.size, dtype=np.int64), np.zeros(1, dtype=np.int64)
        groups.append(ids + n_groups)
        n_groups += hod.size
        hour_of.append(hod)
        treated.append(np.full(hod.size, float(k.period.arm == "treatment")))
        cycle_of.append(np.full(hod.size, j // 2))
        period_of.append(np.full(k.values.size, j))
    g = np.concatenate(groups)
    y = _group_statistic(values, g, n_groups, spec.statistic)
    per_stat = _group_statistic(values, np.concatenate(period_of), len(used), spec.statistic)
    if orient.relative:
        if not (y > 0).all():
            return ctx.inconclusive("data_quality", f"a {bucket} bucket's {spec.statistic} is 0: a relative "
                                    "comparison needs positive statistics", n_c, n_t)
        y, per_stat = np.log(y), np.log(per_stat)
    reg = bucket_regression(y, np.concatenate(treated), np.concatenate(cycle_of),
                            np.concatenate(hour_of) if bucket == "hour" else None, lags)
    if reg is None:
        return ctx.inconclusive("coverage", "the hour-of-day effects absorb the treatment: each arm keeps to its "
                                "own hours of the day", n_c, n_t)
    theta, se, df = reg.theta, reg.se, reg.df
    effects = "cycle and hour-of-day fixed effects" if bucket == "hour" else "cycle fixed effects"
    e = est.Estimate(theta, se, lambda c, th=theta, s=se: (th - c * s, th + c * s),
                     f"switchback regression over {reg.n_buckets} {bucket} buckets ({effects}; SE clustered by "
                     f"cycle{', Newey-West' if reg.newey_west else ''}; t over {m} cycles)", df=df)
    look = ctx.look(float(m), 0.0)
    if look.kind == "fixed":
        # the fixed-horizon look takes the t quantile at the normal boundary's tail level
        e = attrs.evolve(e, bounds=_t_bounds(theta, se, df))
    nw = (f"Newey-West lag {reg.lags} widened the SE from {reg.se_cluster:.4g}" if reg.newey_west
          else f"Newey-West lag {reg.lags} not needed (SE {reg.se_newey_west:.4g})")
    extra = (f"{m} cycles, {reg.n_buckets} {bucket} buckets, df {df:.0f}; cycle scores lag-1 autocorrelation "
             f"{reg.r1:.2f}: {nw}; burn-in {burn_in}, burn-out {burn_out} samples excluded; "
             + _welch_check(used, per_stat, orient))
    return ctx.decide(e, look, n_c, n_t, extra=extra)


def _t_bounds(theta: float, se: float, df: float):
    def bounds(c: float) -> tuple[float, float]:
        q = float(stats.t.isf(stats.norm.sf(c), df))
        return theta - q * se, theta + q * se
    return bounds


def _welch_check(used: list[_Kept], per_stat: np.ndarray, orient: _Orientation) -> str:
    arm = np.array([k.period.arm == "treatment" for k in used])
    a, b = per_stat[arm], per_stat[~arm]
    if a.size < 2 or b.size < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return "Welch over periods not computed"
    res = stats.ttest_ind(a, b, equal_var=False)
    lo, hi = res.confidence_interval(0.90)
    return (f"Welch over periods {orient.to_effect(float(a.mean() - b.mean())):.4g} "
            f"[{orient.to_effect(float(lo)):.4g}, {orient.to_effect(float(hi)):.4g}] (90 %)")
