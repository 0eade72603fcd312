"""judge(): one criterion, a baseline window and a stage window -> a Verdict.

The decision rule (spec judge.md §1): the criterion becomes an effect θ with a bound b
(log scale for relative comparisons). FAIL when the lower bound at the FAIL level
exceeds b, PASS when the upper bound at the PASS level is below b and the data-quality
gates hold, INCONCLUSIVE otherwise, always with a reason. These are the two one-sided
tests of equivalence testing (Schuirmann 1987); a point estimate is never compared with
the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from scipy import stats

from kistexp.errors import KistexpError
from kistexp.judge import estimators as est
from kistexp.judge.model import (
    Counts,
    CriterionSpec,
    SequentialState,
    SequentialStateError,
    Verdict,
    Window,
    check_alpha,
)
from kistexp.metrics import catalogue
from kistexp.stats import power
from kistexp.stats import sequential as seq

STATISTICS = ("mean", "median", "p10", "p25", "p75", "p90", "p95", "p99", "shift")
COMPARISONS = ("relative-increase", "relative-decrease", "absolute-increase", "absolute-decrease",
               "above", "below")
# Spec §5.1: counts need 30 events; relay series need 10 relays present in both windows; more
# than 20 % relay churn is a coverage problem. A quantile p of a window needs
# est.QUANTILE_TAIL (5) samples beyond it, where its Woodruff interval is calibrated (p90:
# 50); a switchback period's point statistic keeps n·min(p, 1 − p) >= 20 (_TAIL_SAMPLES).
_TAIL_SAMPLES = 20
# A quantile interval wider than this factor (ratio scale) tells nothing a plan could threshold:
# at early sequential looks on few samples the t boundary of a 3-df Woodruff SE gave intervals
# like [0.000004, 6531]; such a look is INCONCLUSIVE "cannot be estimated", with no interval.
MAX_QUANTILE_SPAN = 100.0
MIN_EVENTS = 30
MIN_RELAYS = 10
MAX_RELAY_CHURN = 0.20
# Paired relay comparisons over fewer relays use the paired t interval (see _Context.paired); the
# linter's forecast models the same rule.
PAIRED_T_RELAYS = power.PAIRED_T_RELAYS
HOURS_OF_DAY = 24
ESTIMATORS = ("default", "bootstrap")


class JudgeError(KistexpError):
    """A criterion the judge cannot evaluate (unknown statistic or comparison, bad input)."""


class _Orientation:
    """Where θ lives and which side is bad; "decrease"/"below" are mirrored internally."""

    def __init__(self, comparison: str, threshold: float) -> None:
        if comparison not in COMPARISONS:
            raise JudgeError(f"comparison {comparison!r} is not one of {', '.join(COMPARISONS)}")
        if not math.isfinite(threshold):
            raise JudgeError(f"threshold {threshold!r} is not a finite number")
        self.comparison = comparison
        self.relative = comparison.startswith("relative")
        self.one_sample = comparison in ("above", "below")
        self.mirror = comparison in ("relative-decrease", "absolute-decrease", "below")
        if self.relative:
            if threshold < 0 or (comparison == "relative-decrease" and threshold >= 1):
                raise JudgeError(f"{comparison} threshold {threshold} must be in [0, 1) "
                                 "(a fraction: 0.10 = 10 %)" if comparison == "relative-decrease"
                                 else f"{comparison} threshold {threshold} must be >= 0")
            self.b = math.log1p(threshold) if comparison == "relative-increase" else math.log1p(-threshold)
        elif self.one_sample:
            self.b = threshold
        else:
            if threshold < 0:
                raise JudgeError(f"{comparison} threshold {threshold} must be >= 0")
            self.b = threshold if comparison == "absolute-increase" else -threshold

    def to_effect(self, theta: float) -> float:
        if not self.relative:
            return theta
        return math.exp(theta) if theta < 700 else math.inf

    @property
    def effect_name(self) -> str:
        if self.relative:
            return "ratio stage/baseline"
        return "stage value" if self.one_sample else "difference stage - baseline"


def _as_window(data: Any, label: str) -> Window:
    if isinstance(data, Window):
        return data
    try:
        return Window(data)
    except (TypeError, ValueError) as exc:
        raise JudgeError(f"{label}: not a sequence of numbers ({exc})") from None


def _criterion(criterion: Any) -> CriterionSpec:
    try:
        spec = CriterionSpec(statistic=str(criterion.statistic), comparison=str(criterion.comparison),
                             threshold=float(criterion.threshold), min_samples=int(criterion.min_samples),
                             metric=str(getattr(criterion, "metric", "") or ""),
                             name=str(getattr(criterion, "name", "") or ""))
    except AttributeError as exc:
        raise JudgeError(f"not a criterion: {exc}") from None
    if spec.statistic in ("min", "max"):
        raise JudgeError(f"statistic {spec.statistic!r} has no sampling interval; use a quantile such as "
                         "p99 or p10 instead")
    if spec.statistic not in STATISTICS:
        raise JudgeError(f"statistic {spec.statistic!r} is not one of {', '.join(STATISTICS)}")
    if spec.min_samples < 0:
        raise JudgeError(f"min_samples {spec.min_samples} must be 0 or more")
    return spec


class _Look:
    """Critical values of this look, and the state for the next one."""

    def __init__(self, state: SequentialState | None, alpha_fail: float, alpha_pass: float,
                 n_stage: float, n_baseline: float, final: bool) -> None:
        self.state_in = state
        self.n_stage, self.n_baseline = n_stage, n_baseline  # for the boundary a longer stage would have
        if state is None:
            self.kind, self.fraction = "fixed", 1.0
            self.c_fail, self.c_pass = seq.fixed_boundary(alpha_fail), seq.fixed_boundary(alpha_pass)
            self.state_out = None
            return
        self.kind = state.method
        n_base = n_baseline if n_baseline > 0 else math.inf  # one-sample: information ∝ n_S
        t = float(seq.information_fraction(n_stage, n_base, state.planned_stage))
        if state.method in ("obf", "pocock"):
            if state.fractions:
                t = max(t, state.fractions[-1])
            if final:
                t = 1.0  # the planned end spends what is left (spec §3.3)
            t = max(t, 1e-9)
            fractions = (*state.fractions, t)
            self.c_fail = float(seq.spending_boundaries(fractions, state.alpha_fail, state.method)[-1])
            self.c_pass = float(seq.spending_boundaries(fractions, state.alpha_pass, state.method)[-1])
        else:
            inv_target = 1.0 / state.target_stage + 1.0 / n_base
            of_target = inv_target / (1.0 / max(n_stage, 1e-12) + 1.0 / n_base)
            fractions = (*state.fractions, t)
            self.c_fail = float(seq.mixture_boundary(of_target, state.alpha_fail))
            self.c_pass = float(seq.mixture_boundary(of_target, state.alpha_pass))
        self.fraction = t
        self.state_out = SequentialState(state.method, state.planned_stage, state.alpha_fail, state.alpha_pass,
                                         state.target_stage, fractions)

    @property
    def look(self) -> int:
        return 1 if self.state_in is None else self.state_in.looks + 1

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed horizon, c_fail {self.c_fail:.3f}, c_pass {self.c_pass:.3f}"
        name = {"obf": "Lan-DeMets O'Brien-Fleming-type alpha spending (repeated confidence intervals)",
                "pocock": "Lan-DeMets Pocock-type alpha spending (repeated confidence intervals)"}.get(
                    self.kind, "normal-mixture confidence sequence")
        return (f"{name}, look {self.look} at information {self.fraction:.3f}: "
                f"c_fail {self.c_fail:.3f}, c_pass {self.c_pass:.3f}")


def judge(criterion: Any, baseline: Any, stage: Any, *, sequential_state: SequentialState | None = None,
          alpha_fail: float = 0.05, alpha_pass: float = 0.05, now: float | None = None,
          stale_after: float | None = None, washout_until: float | None = None, final: bool = False,
          min_relays: int = MIN_RELAYS, estimator: str = "default",
          relay_weights: Mapping[str, float] | None = None) -> Verdict:
    """Judge one criterion at one look.

    ``criterion``: anything with statistic, comparison, threshold, min_samples (a plan
    Criterion or a CriterionSpec). ``baseline``/``stage``: sequences of numbers or
    Windows; Counts for rare events; or mappings relay -> samples for per-relay paired
    comparisons (each relay against its own baseline, then across relays). For
    "above"/"below" the baseline is ignored (pass None).

    ``sequential_state``: None for one fixed-horizon look; else the state from
    SequentialState.plan() or the previous verdict (its alphas override the keywords).
    ``now``, ``stale_after``, ``washout_until``: epoch seconds; staleness defaults to
    3 x the metric's nominal sample interval when the criterion names a catalogue metric.
    ``estimator``: "default" (order statistics, spec §2) or "bootstrap" (bootstrap SEs of
    the mean or quantile, hour blocks when times are known).
    ``relay_weights``: relay -> baseline bandwidth for paired comparisons; the
    bandwidth-weighted change (the average byte) decides bandwidth metrics and is reported
    beside the unweighted one (the typical relay) for the others (spec §2.5).
    """
    if estimator not in ESTIMATORS:
        raise JudgeError(f"estimator {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    spec = _criterion(criterion)
    orient = _Orientation(spec.comparison, spec.threshold)
    if sequential_state is not None:
        alpha_fail, alpha_pass = sequential_state.alpha_fail, sequential_state.alpha_pass
    try:
        alpha_fail, alpha_pass = check_alpha(alpha_fail, "alpha_fail"), check_alpha(alpha_pass, "alpha_pass")
    except SequentialStateError as exc:
        raise JudgeError(str(exc)) from None
    if stale_after is None and spec.metric and (metric := catalogue.get(spec.metric)) is not None:
        stale_after = 3.0 * 3600.0 / metric.samples_per_hour
    ctx = _Context(spec, orient, sequential_state, alpha_fail, alpha_pass, now, stale_after, final, estimator)
    if isinstance(stage, Counts) or isinstance(baseline, Counts):
        return ctx.counts(baseline, stage)
    if isinstance(stage, Mapping) or isinstance(baseline, Mapping):
        if not (isinstance(stage, Mapping) and isinstance(baseline, Mapping)):
            raise JudgeError("paired relay comparison needs a mapping relay -> samples on both sides")
        return ctx.paired(baseline, stage, min_relays, relay_weights)
    s = _as_window(stage, "stage")
    b = None if orient.one_sample else _as_window(baseline, "baseline")
    return ctx.windows(b, s, washout_until)


class _Context:
    def __init__(self, spec: CriterionSpec, orient: _Orientation, state: SequentialState | None,
                 alpha_fail: float, alpha_pass: float, now: float | None, stale_after: float | None,
                 final: bool, estimator: str = "default") -> None:
        self.spec, self.orient, self.state = spec, orient, state
        self.estimator = estimator
        self.alpha_fail, self.alpha_pass = alpha_fail, alpha_pass
        self.now, self.stale_after, self.final = now, stale_after, final
        self.warnings: list[str] = []
        self.excluded = 0

    # -- verdict construction ------------------------------------------------------------------
    def _rule(self, method: str, look: _Look | None) -> str:
        o = self.orient
        bound = o.to_effect(o.b)
        worse = "below" if o.mirror else "above"
        better = "above" if o.mirror else "below"
        what = f"{self.spec.statistic} {o.effect_name}"
        seqtext = look.describe() if look else "no look (data gate)"
        return (f"FAIL if the {'upper' if o.mirror else 'lower'} bound of the {what} is {worse} {bound:.4g}, "
                f"PASS if the {'lower' if o.mirror else 'upper'} bound is {better} it; {method}; {seqtext}")

    def inconclusive(self, reason: str, detail: str, n_b: int, n_s: int, method: str = "",
                     look: _Look | None = None, theta: float | None = None) -> Verdict:
        o = self.orient
        return Verdict(
            outcome="inconclusive", reason=reason,
            effect=None if theta is None or not math.isfinite(theta) else o.to_effect(theta),
            ci_low=None, ci_high=None, bound=o.to_effect(o.b), n_baseline=n_b, n_stage=n_s,
            rule=self._rule(method or "not estimated", look), detail=detail, statistic=self.spec.statistic,
            comparison=self.spec.comparison, threshold=self.spec.threshold, method=method,
            sequential=look.kind if look else ("fixed" if self.state is None else self.state.method),
            look=look.look if look else (1 if self.state is None else self.state.looks + 1),
            information=look.fraction if look else 0.0,
            c_fail=look.c_fail if look else math.nan, c_pass=look.c_pass if look else math.nan,
            excluded=self.excluded, warnings=tuple(self.warnings),
            state=self.state, criterion=self.spec.name or self.spec.metric, alpha_fail=self.alpha_fail)

    def decide(self, e: est.Estimate, look: _Look, n_b: int, n_s: int, pass_gate: str = "",
               scale: float = 1.0, extra: str = "", fail_pass: tuple[bool, bool] | None = None,
               deff: est.DesignEffect | None = None) -> Verdict:
        """Bounds at both levels, then the three-way rule. ``scale`` (or ``deff``, which sets it to
        √DEFF) widens for the design effect."""
        o = self.orient
        c_fail, c_pass = look.c_fail, look.c_pass
        df = e.df if look.kind != "fixed" else math.inf
        if deff is not None and deff.value > 1.0:
            # the design effect is an estimate too (spec §5.4 rule 3): se² = DEFF·se_iid² has the
            # df of both, 1/ν = 1/ν_SE + 1/ν_DEFF, at a fixed look as well (it keeps A/A false
            # alarms under AR(1) hours near 5 %; docs/judge.md "Correlated hours")
            scale = math.sqrt(deff.value)
            df = 1.0 / (1.0 / df + 1.0 / deff.df)
        if math.isfinite(df):
            # Group-sequential t-tests (Jennison & Turnbull 2000, ch. 11): an estimated SE
            # takes the t quantile at each boundary's own tail probability. Far-out early
            # boundaries are where a noisy SE would otherwise leak error.
            c_fail, c_pass = t_boundary(c_fail, df), t_boundary(c_pass, df)
            extra = (extra + "; " if extra else "") + (f"t boundaries (df {df:.0f}): c_fail {c_fail:.3f}, "
                                                       f"c_pass {c_pass:.3f}")
        lo_f, hi_f = e.bounds(c_fail * scale)
        lo_p, hi_p = e.bounds(c_pass * scale)
        theta = e.theta
        if o.mirror:
            # bad = low: FAIL on the upper bound at the FAIL level; PASS on the lower at the PASS level
            bad_bound, good_bound = -hi_f, -lo_p
            theta_m, b_m = -theta, -o.b
            ci = (lo_p, hi_f)
        else:
            bad_bound, good_bound = lo_f, hi_p
            theta_m, b_m = theta, o.b
            ci = (lo_f, hi_p)
        if fail_pass is not None:
            is_fail, is_pass = fail_pass
        else:
            is_fail, is_pass = bad_bound > b_m, good_bound < b_m
        if theta_m == b_m and e.se == 0:
            is_fail = is_pass = False
        if is_fail:
            outcome, reason = "fail", ""
        elif is_pass and not pass_gate:
            outcome, reason = "pass", ""
        elif is_pass:
            outcome, reason = "inconclusive", pass_gate
        else:
            outcome, reason = "inconclusive", "undecided"
        floor_fail, floor_pass = self._floor(e, look, scale)
        # the side the estimate is on decides which bound a longer stage would have to clear
        floor = floor_fail if theta_m > b_m else floor_pass
        limited = "baseline" if outcome == "inconclusive" and reason == "undecided" and abs(theta_m - b_m) <= floor \
            else ""
        detail = (f"{o.effect_name} {o.to_effect(theta):.4g} [{o.to_effect(ci[0]):.4g}, {o.to_effect(ci[1]):.4g}] "
                  f"vs bound {o.to_effect(o.b):.4g}; theta {theta:.5g}, se {e.se:.4g}")
        if deff is not None and deff.value > 1.0:
            detail += f", {deff.describe()}"
        elif scale != 1.0:
            detail += f", design effect {scale * scale:.2f}"
        if limited:
            detail += (f"; no longer stage can decide: with this baseline the interval stays at least ±{floor:.3g} "
                       f"wide on theta's scale, and theta is {abs(theta_m - b_m):.3g} from the bound")
        if reason and reason != "undecided":
            detail += f"; would PASS but {reason}: {pass_gate_text(reason)}"
        if extra:
            detail += "; " + extra
        notes = [*self.warnings, *e.notes]
        return Verdict(
            outcome=outcome, reason=reason, effect=o.to_effect(theta),
            ci_low=o.to_effect(ci[0]), ci_high=o.to_effect(ci[1]), bound=o.to_effect(o.b),
            n_baseline=n_b, n_stage=n_s, rule=self._rule(e.method, look), detail=detail,
            statistic=self.spec.statistic, comparison=self.spec.comparison, threshold=self.spec.threshold,
            method=e.method, sequential=look.kind, look=look.look, information=look.fraction,
            c_fail=look.c_fail, c_pass=look.c_pass, excluded=self.excluded, warnings=tuple(notes),
            state=look.state_out if look.state_out is not None else self.state,
            criterion=self.spec.name or self.spec.metric,
            se_stage=math.sqrt(max(e.se * e.se - e.se_baseline ** 2, 0.0)) * scale, se_baseline=e.se_baseline * scale,
            halfwidth_floor=floor, limited_by=limited, design_effect=scale * scale, alpha_fail=self.alpha_fail)

    def _floor(self, e: est.Estimate, look: _Look, scale: float) -> tuple[float, float]:
        """The narrowest half-widths (FAIL level, PASS level; θ's scale) any longer stage could reach with
        this baseline, its spread staying as it is: at stage size n' >= n_S, se² = se_S²·n_S/n' + se_B²
        times the boundary the look would have there (spec §3.2: the baseline's se_B bounds it). NaN where
        the estimator does not separate the sides, and for alpha spending, whose boundaries past the planned
        end are not defined: such a verdict never claims that extending cannot help."""
        se_b = e.se_baseline
        if (not (math.isfinite(e.se) and math.isfinite(se_b)) or look.kind not in ("fixed", "mixture")
                or not look.n_stage > 0):
            return math.nan, math.nan
        n_s = float(look.n_stage)
        grown = n_s * np.append(2.0 ** np.arange(41), np.inf)  # this stage up to 10^12 times as long, and the limit
        half = np.sqrt(max(e.se * e.se - se_b * se_b, 0.0) * n_s / grown + se_b * se_b) * scale
        if look.kind == "fixed":
            return float(look.c_fail * half.min()), float(look.c_pass * half.min())
        n_base = look.n_baseline if look.n_baseline > 0 else math.inf
        if self.state is None or not self.state.target_stage > 0:
            return math.nan, math.nan
        # the mixture's boundary at each size, as _Look computes it; normal, not t: the narrower boundary
        # errs towards extending, never towards calling a stage stuck
        of_target = (1.0 / self.state.target_stage + 1.0 / n_base) / (1.0 / grown + 1.0 / n_base)
        c_fail = np.asarray(seq.mixture_boundary(of_target, self.alpha_fail))
        c_pass = np.asarray(seq.mixture_boundary(of_target, self.alpha_pass))
        return float((c_fail * half).min()), float((c_pass * half).min())

    def look(self, n_s: float, n_b: float) -> _Look:
        return _Look(self.state, self.alpha_fail, self.alpha_pass, n_s, n_b, self.final)

    # -- plain windows -----------------------------------------------------------------------
    def windows(self, b: Window | None, s: Window, washout_until: float | None) -> Verdict:
        spec, o = self.spec, self.orient
        self.excluded = s.excluded + (b.excluded if b is not None else 0)
        if washout_until is not None and s.times is not None:
            keep = s.times >= washout_until
            dropped = int((~keep).sum())
            if dropped:
                self.excluded += dropped
                s = Window(s.values[keep], s.times[keep], s.excluded)
        n_b = b.n if b is not None else 0
        n_s = s.n
        sides = [("stage", s)] + ([("baseline", b)] if b is not None else [])
        for label, w in sides:
            bad = ~np.isfinite(w.values)
            if bad.any():
                return self.inconclusive("data_quality", f"{label} has {int(bad.sum())} non-finite values",
                                         n_b, n_s)
            if o.relative and w.n and spec.statistic == "mean":
                # the ratio of means needs a positive mean, not positive samples: an idle
                # relay's CPU share is a legitimate 0
                if (w.values < 0).any() or not w.values.mean() > 0:
                    return self.inconclusive("data_quality", f"{label} has negative values or a mean <= 0: a "
                                             "relative comparison of means needs a positive mean", n_b, n_s)
            elif o.relative and w.n and (w.values <= 0).any():
                return self.inconclusive("data_quality", f"{label} has values <= 0: a relative comparison "
                                         "needs positive samples", n_b, n_s)
        if self.now is not None and self.stale_after is not None and s.times is not None and s.n:
            age = self.now - float(s.times.max())
            if age > self.stale_after:
                return self.inconclusive("stale", f"newest stage sample is {age / 60:.0f} min old "
                                         f"(stale after {self.stale_after / 60:.0f} min)", n_b, n_s)
        need = spec.min_samples
        if spec.statistic not in ("mean", "median", "shift"):
            tail = est.quantile_samples_needed(est.quantile_level(spec.statistic))
            few = min(w.n for _, w in sides)
            if few < tail:
                return self.inconclusive("insufficient_samples", _not_estimable(spec.statistic, few, tail), n_b, n_s)
            need = max(need, tail)
        need = max(need, 2)
        short = [f"{label} {w.n}" for label, w in sides if w.n < need]
        if short:
            return self.inconclusive("insufficient_samples", f"{', '.join(short)} samples < {need} needed per side",
                                     n_b, n_s)
        if b is not None and b.times is not None and s.times is not None:
            hb = set(np.flatnonzero(np.bincount(_hour_of_day(b.times), minlength=HOURS_OF_DAY)).tolist())
            hs = set(np.flatnonzero(np.bincount(_hour_of_day(s.times), minlength=HOURS_OF_DAY)).tolist())
            if not hb & hs:
                return self.inconclusive("coverage", "the baseline has no hour of day in common with the stage "
                                         f"(baseline hours {_hours_text(hb)}, stage {_hours_text(hs)})", n_b, n_s)
        weights = None
        if (b is not None and b.times is not None and s.times is not None and self.estimator == "default"
                and spec.statistic != "shift"):
            weights, s = self._post_stratify(b, s)
            n_s = s.n
            if n_s < need:
                return self.inconclusive("insufficient_samples", f"stage {n_s} samples in hours of day the "
                                         f"baseline covers < {need} needed per side", n_b, n_s)
        if (spec.statistic == "mean" and not o.one_sample and b is not None
                and np.isin(s.values, (0.0, 1.0)).all() and np.isin(b.values, (0.0, 1.0)).all()):
            self.warnings.append("0/1 samples judged as event counts")
            return self.counts(Counts(float(b.values.sum()), float(b.n)), Counts(float(s.values.sum()), float(s.n)))
        look = self.look(n_s, n_b)
        log_scale = o.relative
        if spec.statistic == "shift":
            if b is None:
                raise JudgeError("statistic 'shift' compares two windows; above/below need another statistic")
            e = est.hodges_lehmann(s.values, b.values, log_scale)
            extra = self._mann_whitney(s.values, b.values, log_scale)
        else:
            e = est.two_sample(s.values, b.values if b is not None else None, spec.statistic, log_scale, weights)
            extra = ""
            if weights is not None:
                extra = (f"baseline re-weighted to the stage's hours of day (Kish n_eff {est.kish_n(weights):.0f} "
                         f"of {b.n})")
            if spec.statistic == "mean":
                share = est.tail_share(s.values)
                if share > 0.2:
                    self.warnings.append(f"top 1 % of stage samples carry {share:.0%} of the sum: the mean is "
                                         "fragile, consider the median")
                if not log_scale and b is not None:
                    df = est.welch_df(s.values, b.values)
                    # Welch: the t quantile at the same one-sided level as c
                    e = _t_adjusted(e, df)
            elif spec.statistic == "median" and b is not None and s.n * b.n <= 1_000_000:
                hl = est.hodges_lehmann(s.values, b.values, log_scale)
                lo, hi = hl.bounds(look.c_fail)
                extra = (extra + "; " if extra else "") + (f"Hodges-Lehmann check {o.to_effect(hl.theta):.4g} "
                         f"[{o.to_effect(lo):.4g}, {o.to_effect(hi):.4g}]")
            if np.ptp(s.values) == 0 and b is not None and np.ptp(b.values) == 0:
                if s.values[0] != b.values[0]:
                    self.warnings.append("constant_series: both windows are constant")
                e = est.Estimate(e.theta, 0.0, lambda c, t=e.theta: (t, t), e.method)
        blocks = False
        if self.estimator == "bootstrap" and spec.statistic != "shift":
            for label, w in sides:
                if w.n > est.MAX_BOOTSTRAP_SAMPLES:
                    raise JudgeError(f"estimator bootstrap: {label} has {w.n} samples, over the "
                                     f"{est.MAX_BOOTSTRAP_SAMPLES} it resamples in bounded time (2,000 resamples); "
                                     "the default estimator's order statistics are exact at this size")
            blocks = s.times is not None and (b is None or b.times is not None)
            e = est.bootstrap_two_sample(s.values, b.values if b is not None else None, spec.statistic, log_scale,
                                         s.times if blocks else None, b.times if blocks and b else None,
                                         seed=n_s * 1_000_003 + n_b)
        deff = None
        if b is not None and b.times is not None and s.times is not None and not blocks:
            deff = est.design_effect(b.values, b.times, log_scale)
        gate = ""
        if s.times is not None:
            covered = int(np.count_nonzero(np.bincount(_hour_of_day(s.times), minlength=HOURS_OF_DAY)))
            if covered < HOURS_OF_DAY:
                gate = "coverage"
        else:
            self.warnings.append("no sample times: staleness, coverage and design effect not checked")
        v = self.decide(e, look, n_b, n_s, pass_gate=gate, extra=extra, deff=deff)
        return self._estimable(v, min(n_s, n_b) if b is not None else n_s)

    def _estimable(self, v: Verdict, n: int) -> Verdict:
        """A quantile whose interval spans more than MAX_QUANTILE_SPAN (ratio scale) cannot be
        estimated from the samples at hand: INCONCLUSIVE, with the estimate but no interval
        (docs/judge.md "Quantiles on few samples")."""
        st = self.spec.statistic
        if (st in ("mean", "median", "shift") or not self.orient.relative or v.ci_low is None
                or v.ci_high is None):
            return v
        span = v.ci_high / v.ci_low if v.ci_low > 0 else math.inf
        if span <= MAX_QUANTILE_SPAN:
            return v
        detail = (f"{st} cannot be estimated from {n} samples at this look: its interval "
                  f"[{v.ci_low:.3g}, {v.ci_high:.3g}] spans a factor of {span:.3g} (more than "
                  f"{MAX_QUANTILE_SPAN:g}); estimate {v.effect:.4g}")
        return attrs.evolve(v, outcome="inconclusive", reason="insufficient_samples", ci_low=None, ci_high=None,
                            detail=detail + "; " + v.detail, limited_by="")

    def _post_stratify(self, b: Window, s: Window) -> tuple[np.ndarray | None, Window]:
        """Hour-of-day weights for the baseline when the stage covers the hours of the day
        differently (spec §5.4 rule 2); None when the mixes agree within 10 % in every hour
        (whole days on both sides), so full-day stages keep the plain estimators. Stage
        samples in hours the baseline never saw have no counterpart and are left out."""
        assert b.times is not None and s.times is not None
        w = est.hour_weights(b.times, s.times)
        seen = np.bincount(est.hour_of_day(b.times), minlength=HOURS_OF_DAY) > 0
        in_base = seen[est.hour_of_day(s.times)]
        if not in_base.all():
            dropped = int((~in_base).sum())
            self.excluded += dropped
            self.warnings.append(f"{dropped} stage samples in hours of day the baseline never saw left out")
            s = Window(s.values[in_base], s.times[in_base], s.excluded)
            w = est.hour_weights(b.times, s.times)
        if np.all(np.abs(w - 1.0) <= 0.10):
            return None, s
        return w, s

    def _mann_whitney(self, xs: np.ndarray, xb: np.ndarray, log_scale: bool) -> str:
        ys = np.log(xs) if log_scale else xs
        yb = np.log(xb) if log_scale else xb
        shifted = ys - self.orient.b
        alt = "less" if self.orient.mirror else "greater"
        p = stats.mannwhitneyu(shifted, yb, alternative=alt).pvalue
        return f"Mann-Whitney U p = {p:.3g} for a shift beyond the bound ({alt})"

    # -- counts ------------------------------------------------------------------------------------
    def counts(self, b: Any, s: Any) -> Verdict:
        if not isinstance(b, Counts) or not isinstance(s, Counts):
            raise JudgeError("a count comparison needs Counts on both sides")
        o = self.orient
        if o.one_sample:
            raise JudgeError("above/below compare a statistic with a level; use a rate comparison for counts")
        n_b, n_s = int(b.exposure), int(s.exposure)
        for label, c in (("baseline", b), ("stage", s)):
            if not (math.isfinite(c.events) and math.isfinite(c.exposure)) or c.events < 0 or c.exposure <= 0:
                return self.inconclusive("data_quality", f"{label} counts {c.events}/{c.exposure} are not "
                                         "events >= 0 over a positive exposure", n_b, n_s)
        if self.now is not None and self.stale_after is not None and s.newest is not None:
            age = self.now - s.newest
            if age > self.stale_after:
                return self.inconclusive("stale", f"newest stage exposure is {age / 60:.0f} min old", n_b, n_s)
        phi = max(b.dispersion, 1.0)
        k_b, e_b, k_s, e_s = b.events, b.exposure, s.events, s.exposure
        if phi > 1.5:
            # quasi-Poisson: overdispersed counts carry the information of k/φ events
            k_b, e_b, k_s, e_s = k_b / phi, e_b / phi, k_s / phi, e_s / phi
            self.warnings.append(f"overdispersion {phi:.2f}: counts and exposures divided by it")
        short = [f"{label} exposure {int(c.exposure)}" for label, c in (("baseline", b), ("stage", s))
                 if c.exposure < self.spec.min_samples]
        if short:
            return self.inconclusive("insufficient_samples", f"{', '.join(short)} < {self.spec.min_samples}",
                                     n_b, n_s)
        events = k_b + k_s
        if events < MIN_EVENTS:
            return self.inconclusive("insufficient_samples", f"{events:g} events in both windows < {MIN_EVENTS} "
                                     "needed for a rate comparison", n_b, n_s)
        look = self.look(e_s, e_b)
        if o.relative:
            e = est.rate_ratio(k_s, e_s, k_b, e_b)
            return self.decide(e, look, n_b, n_s, extra=f"events stage {s.events:g}, baseline {b.events:g}")
        e = est.rate_difference(k_s, e_s, k_b, e_b)
        # the E-test (scipy poisson_means_test) decides; its diff must be >= 0, so mirror decreases
        thr = self.spec.threshold
        a_fail, a_pass = float(stats.norm.sf(look.c_fail)), float(stats.norm.sf(look.c_pass))
        k1, n1, k2, n2 = (k_s, e_s, k_b, e_b) if not o.mirror else (k_b, e_b, k_s, e_s)
        p_fail = stats.poisson_means_test(int(round(k1)), n1, int(round(k2)), n2, diff=thr,
                                          alternative="greater").pvalue
        p_pass = stats.poisson_means_test(int(round(k1)), n1, int(round(k2)), n2, diff=thr,
                                          alternative="less").pvalue
        extra = (f"events stage {s.events:g}, baseline {b.events:g}; E-test p(FAIL) {p_fail:.3g} vs {a_fail:.3g}, "
                 f"p(PASS) {p_pass:.3g} vs {a_pass:.3g}")
        return self.decide(e, look, n_b, n_s, extra=extra, fail_pass=(p_fail < a_fail, p_pass < a_pass))

    # -- per-relay pairs ---------------------------------------------------------------------------
    def paired(self, base: Mapping[str, Any], stage: Mapping[str, Any], min_relays: int,
               relay_weights: Mapping[str, float] | None = None) -> Verdict:
        spec, o = self.spec, self.orient
        if o.one_sample or spec.statistic == "shift":
            raise JudgeError(f"{spec.comparison}/{spec.statistic} is not a paired relay comparison")
        windows_b = {r: _as_window(v, f"baseline relay {r}") for r, v in base.items()}
        windows_s = {r: _as_window(v, f"stage relay {r}") for r, v in stage.items()}
        both = sorted(r for r in windows_b if r in windows_s and windows_b[r].n >= 2 and windows_s[r].n >= 2)
        n_b = sum(windows_b[r].n for r in both)
        n_s = sum(windows_s[r].n for r in both)
        lost = [r for r in windows_b if r not in both]
        if windows_b and len(lost) / len(windows_b) > MAX_RELAY_CHURN:
            return self.inconclusive("coverage", f"{len(lost)} of {len(windows_b)} baseline relays have no stage "
                                     f"samples (> {MAX_RELAY_CHURN:.0%} churn)", n_b, n_s)
        if len(both) < min_relays:
            return self.inconclusive("insufficient_samples", f"{len(both)} relays in both windows < {min_relays}",
                                     n_b, n_s)
        if min(n_b, n_s) < spec.min_samples:
            return self.inconclusive("insufficient_samples", f"baseline {n_b}, stage {n_s} samples over relays < "
                                     f"{spec.min_samples}", n_b, n_s)
        if spec.statistic not in ("mean", "median"):
            # each relay's own quantile is the paired unit: from fewer samples than it needs it is
            # noise (quiet circuits: 12 samples per relay and hour), and the Walsh interval over such
            # ratios gave [0.000004, 6531]
            tail = est.quantile_samples_needed(est.quantile_level(spec.statistic))
            few = min(min(windows_s[r].n, windows_b[r].n) for r in both)
            if few < tail:
                return self.inconclusive("insufficient_samples",
                                         _not_estimable(spec.statistic, few, tail, " of a relay"), n_b, n_s)
        ys = []
        for r in both:
            vs, vb = windows_s[r].values, windows_b[r].values
            if not (np.isfinite(vs).all() and np.isfinite(vb).all()):
                return self.inconclusive("data_quality", f"relay {r} has non-finite samples", n_b, n_s)
            stat_s, _ = est.side_statistic(vs, spec.statistic, False)
            stat_b, _ = est.side_statistic(vb, spec.statistic, False)
            if o.relative:
                if stat_s <= 0 or stat_b <= 0:
                    return self.inconclusive("data_quality", f"relay {r}: {spec.statistic} <= 0, no ratio",
                                             n_b, n_s)
                ys.append(math.log(stat_s / stat_b))
            else:
                ys.append(float(stat_s - stat_b))
        y = np.array(ys)
        med = float(np.median(y))
        mad = 1.4826 * float(np.median(np.abs(y - med)))
        if mad > 0:
            far = [r for r, v in zip(both, y, strict=True) if abs(v - med) > 5 * mad]
            if far:
                self.warnings.append(f"outlier relays (> 5 MAD from the median change): {', '.join(far[:10])}")
        look = self.look(n_s, n_b)
        walsh, paired_t = est.walsh_hodges_lehmann(y), est.paired_t(y)
        lo_w, hi_w = walsh.bounds(max(look.c_fail, look.c_pass))
        # Below PAIRED_T_RELAYS relays, or where the k-th Walsh average does not exist at this look's
        # boundary (10 relays: none beyond c = 2.70, and the mixture's boundary is >= 2.76), the
        # signed-rank interval cannot bound anything however large the change: the paired t
        # interval over the per-relay log ratios decides (spec §4.3: paired t power, Wilcoxon within
        # 0.03 of it), with df R − 1 and the t quantile at each boundary's tail probability.
        use_t = y.size < PAIRED_T_RELAYS or not (math.isfinite(lo_w) and math.isfinite(hi_w))
        e, check = (paired_t, walsh) if use_t else (walsh, paired_t)
        if np.ptp(y) == 0:
            e = est.Estimate(e.theta, 0.0, lambda c, t=e.theta: (t, t), e.method)
        c_check = (t_boundary(look.c_fail, check.df), t_boundary(look.c_pass, check.df)) \
            if math.isfinite(check.df) else (look.c_fail, look.c_pass)
        p = stats.wilcoxon(y - o.b, zero_method="pratt", alternative="less" if o.mirror else "greater").pvalue \
            if np.ptp(y) > 0 else float("nan")
        extra = (f"{len(both)} relays; {'Wilcoxon / Hodges-Lehmann' if use_t else 'paired t'} check "
                 f"{o.to_effect(check.theta):.4g} [{o.to_effect(check.bounds(c_check[0])[0]):.4g}, "
                 f"{o.to_effect(check.bounds(c_check[1])[1]):.4g}]; "
                 f"Wilcoxon signed-rank p = {p:.3g} beyond the bound")
        if relay_weights is not None:
            w = np.array([max(float(relay_weights.get(r, 0.0)), 0.0) for r in both])
            missing = int((w == 0).sum())
            if missing:
                self.warnings.append(f"{missing} relays without a bandwidth weight count 0 in the weighted change")
            if w.sum() <= 0 or est.kish_n(w) < 2:
                return self.inconclusive("data_quality", "bandwidth weights give fewer than 2 effective relays",
                                         n_b, n_s)
            ew = est.weighted_paired(y, w)
            if _is_bandwidth(spec.metric):
                # the average byte is what a bandwidth criterion is about: the weighted change decides
                c_e = (t_boundary(look.c_fail, e.df), t_boundary(look.c_pass, e.df)) if math.isfinite(e.df) \
                    else (look.c_fail, look.c_pass)
                extra += (f"; unweighted (typical relay) {o.to_effect(e.theta):.4g} "
                          f"[{o.to_effect(e.bounds(c_e[0])[0]):.4g}, {o.to_effect(e.bounds(c_e[1])[1]):.4g}]")
                e = ew
            else:
                lo, hi = ew.bounds(t_boundary(look.c_fail, ew.df))[0], ew.bounds(t_boundary(look.c_pass, ew.df))[1]
                extra += (f"; bandwidth-weighted (average byte) {o.to_effect(ew.theta):.4g} "
                          f"[{o.to_effect(lo):.4g}, {o.to_effect(hi):.4g}], Kish n_eff {est.kish_n(w):.1f}")
        if look.kind == "fixed" and math.isfinite(e.df):
            e = _t_adjusted(e, e.df)  # the weighted change or the paired t: decide() adds t only to sequential looks
        return self.decide(e, look, n_b, n_s, extra=extra)


def _is_bandwidth(metric: str) -> bool:
    m = catalogue.get(metric) if metric else None
    return m is not None and m.unit == "bytes/s"


def t_boundary(c: float, df: float) -> float:
    """The t_df quantile with the tail probability of the normal boundary c (at most 1e6:
    early looks spend almost nothing and their bounds are effectively unbounded). scipy's
    inverse fails far out (t.isf(Φ(−37), 3.4) is −inf, which inverted an interval into a
    FAIL): a quantile that is not finite or not beyond c is taken as unbounded."""
    q = float(stats.t.isf(stats.norm.sf(c), df))
    if c > 0 and not (math.isfinite(q) and q >= c):
        return 1e6
    return float(min(q, 1e6))


def _not_estimable(statistic: str, n: int, tail: int, where: str = "") -> str:
    return (f"{statistic} cannot be estimated from {n} samples{where} (needs >= {tail}: {est.QUANTILE_TAIL} "
            "beyond the quantile)")


def pass_gate_text(reason: str) -> str:
    return {"coverage": f"the stage must cover all {HOURS_OF_DAY} hours of the day before it can PASS"}.get(
        reason, reason)


def _t_adjusted(e: est.Estimate, df: float) -> est.Estimate:
    if not math.isfinite(df):
        return e

    def bounds(c: float, th=e.theta, se=e.se) -> tuple[float, float]:
        q = t_boundary(c, df)
        return th - q * se, th + q * se

    return est.Estimate(e.theta, e.se, bounds, e.method, e.notes, se_baseline=e.se_baseline)


_hour_of_day = est.hour_of_day


def _hours_text(hours: set[int]) -> str:
    h = sorted(hours)
    return f"{h[0]:02d}-{h[-1]:02d} UTC" if h else "none"
