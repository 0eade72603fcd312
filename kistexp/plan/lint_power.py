"""KX201-KX203: what each stage can detect. The power forecast of every judged criterion under the
engine's own design (sample model, washout, sequential method, alpha shares), the stage length or
baseline that would reach 80 % power, and the switchback forecast (docs/judge.md, "Power and the lint
forecast"). kistexp/plan/lint.py runs these with the other rules."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import attrs

from kistexp.durations import format_duration
from kistexp.judge.plan import fail_alphas
from kistexp.metrics import catalogue as metrics
from kistexp.plan.lint_findings import Detectable, _Collector, _named
from kistexp.plan.model import Plan
from kistexp.plan.timeline import propagation_delay
from kistexp.rollout.judging import SEQUENTIAL_METHOD
from kistexp.rollout.spec import LIVE_CADENCE, washout_for
from kistexp.stats import power


def _label(criterion) -> str:
    return repr(criterion.name or criterion.metric)


def _hours(delta: dt.timedelta) -> int:
    """Whole plan hours (the engine's collection windows) covering ``delta``."""
    return math.ceil(delta.total_seconds() / 3600 - 1e-9)


def _rate_text(metric) -> str:
    return (f"{metrics.samples_in(metric)} a collection: {metric.samples_per_hour:g}/h from each of "
            f"{metrics.instances_text(metric)}")


def _check_stage_lengths(plan: Plan, out: _Collector) -> None:
    """KX201: the engine counts a stage's samples in hourly collections once the criteria's population runs
    the value and its washout has passed (switchback: the plan's washout); it needs ``min_samples`` of each
    criterion's metric, and enough of them to decide (``_check_power``)."""
    judged = [(c, metrics.get(c.metric)) for c in plan.criteria]
    judged = [(c, m) for c, m in judged if m is not None]
    if not judged:
        return
    washout, forecasts = _design(plan, [(c, m) for c, m in judged if _judgeable(c)])
    baseline_h = plan.baseline.duration.total_seconds() / 3600
    for criterion, metric in judged:
        have = metrics.samples_in(metric, baseline_h)
        if have < criterion.min_samples:
            # the engine's judge says insufficient_samples at every look, extensions included
            need = dt.timedelta(hours=metrics.collections_needed(metric, criterion.min_samples))
            out.add("KX201", "baseline.duration",
                    f"{format_duration(need)}: the {format_duration(plan.baseline.duration)} baseline gathers "
                    f"{have} samples of {criterion.metric}, fewer than {criterion.min_samples}, so no stage can "
                    f"be decided ({_rate_text(metric)})", criterion=_label(criterion), verbs=("needs", "need"))
    for i, (stage, start, _end) in enumerate(plan.stage_windows()):
        short = False
        for criterion, metric in judged:
            delay = propagation_delay(start, metric.population)
            settle = max(delay, washout if plan.switchback is None else plan.switchback.washout)
            collections = metrics.collections_needed(metric, criterion.min_samples)
            need = dt.timedelta(hours=_hours(settle) + collections)
            if stage.duration >= need:
                continue
            short = True
            key = f"stages[{i}].duration" if plan.switchback is None else "switchback.period"
            what = "the value" if plan.switchback is None else "a switched value and the washout ends"
            out.add("KX201", key,
                    f"{format_duration(need)}: {format_duration(dt.timedelta(hours=_hours(settle)))} until all "
                    f"{metric.population} run {what}, then {collections} hourly collections for "
                    f"{criterion.min_samples} samples of {criterion.metric} ({_rate_text(metric)})",
                    stage=f"{stage.name!r} ({format_duration(stage.duration)})", criterion=_label(criterion),
                    verbs=("needs", "need"))
        if plan.switchback is None:
            # a stage short of its samples already has its error; its forecast still goes to --json and show
            _check_power(plan, out, i, stage, forecasts, washout, report=not short)
        if short and plan.switchback is not None:
            break  # every period has the same length: one finding is enough
    if plan.switchback is not None:
        _check_switchback_power(plan, out, judged)
        populations = {m.population for _, m in judged}
        for population in sorted(populations):
            delay = propagation_delay(plan.start, population)
            if plan.switchback.washout < delay:
                out.add("KX202", "switchback.washout",
                        f"washout {format_duration(plan.switchback.washout)} is shorter than the "
                        f"{format_duration(delay)} until all {population} run a switched value", "warning")


# How the engine judges a stage (kistexp/rollout): samples from the windows after its washout,
# hourly looks at a sequential boundary of its method, each criterion's FAIL error its share of
# alpha (kistexp/judge/plan.py). The linter forecasts that design, not a textbook one.
ALPHA = 0.05
_MAX_FORECAST = dt.timedelta(days=120)
_MAX_RELAYS = 1000


@attrs.frozen
class _Power:
    p_pass: float
    p_fail: float
    change: float | None
    c_fail: float
    c_pass: float
    n_stage: float
    n_baseline: float

    @property
    def least(self) -> float:
        return min(self.p_pass, self.p_fail)


@attrs.frozen
class _Forecast:
    """One criterion under the engine's design: its samples are the catalogue's sample model
    (rate x instances, the numbers a dry run draws), paired over the engine's relays for relay
    metrics."""

    criterion: object
    metric: metrics.Metric
    var: power.Variability
    alpha_fail: float
    method: str

    def samples(self, hours: float) -> float:
        if math.isinf(hours):
            return math.inf
        return float(metrics.samples_in(self.metric, max(hours, 0.0)))

    def at(self, hours: float, baseline_h: float, *, c: tuple[float, float] | None = None,
           var: power.Variability | None = None, threshold: float | None = None) -> _Power:
        """Power at the planned end of a stage with ``hours`` measuring hours; ``c`` holds the
        boundaries (FAIL, PASS) fixed."""
        crit, var = self.criterion, var or self.var
        threshold = crit.threshold if threshold is None else threshold
        n_s, n_b = self.samples(hours), self.samples(baseline_h)
        if n_s <= 0:
            return _Power(0.0, 0.0, None, math.inf, math.inf, n_s, n_b)
        if c is None:
            # the engine plans the stage at what its measuring hours gather (rollout/judging.py, planned_state)
            looks = max(1, int(min(hours, 1e6)))
            c = (power.boundary(self.method, self.alpha_fail, n_s, n_b, n_s, looks),
                 power.boundary(self.method, ALPHA, n_s, n_b, n_s, looks))
        p_pass, p_fail = power.decision_power(crit.statistic, crit.comparison, threshold, var, n_s, n_b, c[0],
                                              c_pass=c[1], alpha_fail=self.alpha_fail, alpha_pass=ALPHA)
        change = power.detectable_change(crit.statistic, crit.comparison, threshold, var, n_s, n_b, c[0],
                                         alpha_fail=self.alpha_fail)
        return _Power(p_pass, p_fail, change, *c, n_s, n_b)

    def smallest(self, lo: float, hi: float, at) -> float | None:
        """The smallest whole x in [lo, hi] where ``at(x, c)`` reaches 80 % power.

        The mixture's boundary is a formula: bisect with it exactly. A spending boundary costs
        a recursion over every look, so it is held at its value for the current length and the
        bisection repeated with the boundaries of the length found until that length holds.
        """
        exact = self.method in ("mixture", "fixed")
        c = None if exact else (at(lo, None).c_fail, at(lo, None).c_pass)
        found = None
        for _ in range(1 if exact else 6):
            if at(hi, c).least < power.TARGET_POWER:
                return None
            a, b = lo, hi
            while b - a > 0.05:
                mid = (a + b) / 2
                a, b = (a, mid) if at(mid, c).least >= power.TARGET_POWER else (mid, b)
            found = float(math.ceil(b))
            check = at(found, None)
            if check.least >= power.TARGET_POWER:
                return found
            c = (check.c_fail, check.c_pass)
        return found


def _variability(metric: metrics.Metric) -> power.Variability:
    var = power.METRIC_VARIABILITY.get(metric.name, power.DEFAULT_VARIABILITY)
    # a relay metric is compared relay by relay over the relays the engine measures; a client metric's
    # design effect grows with the samples an hour shares (power.Variability.design_effect)
    if var.kind == "relay":
        return attrs.evolve(var, relays=metrics.instances(metric))
    return attrs.evolve(var, per_hour=metric.samples_per_hour * metrics.instances(metric))


def _design(plan: Plan, judged) -> tuple[dt.timedelta, list[_Forecast]]:
    """The engine's washout for the plan's criteria and a forecast per judged criterion."""
    washout = washout_for(plan.criteria, LIVE_CADENCE)
    alphas = dict(zip(map(id, plan.criteria), fail_alphas(plan.criteria, ALPHA), strict=True))
    return washout, [_Forecast(c, m, _variability(m), alphas[id(c)], SEQUENTIAL_METHOD) for c, m in judged]


def _judgeable(criterion) -> bool:
    return criterion.statistic not in ("min", "max")


def change_text(criterion, metric, change: float | None) -> str:
    """A change on the threshold's scale as a plan reader reads it: +14.0 %, or +0.031 in display units."""
    if change is None:
        return "-"
    if math.isinf(change):
        return "nothing"  # the judge's interval has no bound: no change, however large, FAILs
    if criterion.comparison.startswith("relative"):
        return f"{change * 100:+.1f} %"
    unit, factor = metrics.display(metric.name)
    return f"{change * factor:+.3g} {unit}".rstrip()


def limit_text(criterion, metric, threshold: float | None = None) -> str:
    threshold = criterion.threshold if threshold is None else threshold
    sign = -1.0 if criterion.comparison.endswith("decrease") or criterion.comparison == "below" else 1.0
    if criterion.comparison.startswith("relative"):
        return f"{sign * threshold * 100:+g} %"
    unit, factor = metrics.display(metric.name)
    return f"{sign * threshold * factor:+.3g} {unit}".rstrip()


def _twice_text(criterion, metric) -> str:
    if criterion.comparison in ("above", "below"):
        return "a level one limit away"
    return limit_text(criterion, metric, 2 * criterion.threshold)


def _percent(p: float) -> str:
    return f"{p * 100:.0f} %"


def _joined(items: Sequence[str]) -> str:
    """"a / b" for per-criterion values, one value when all agree."""
    return items[0] if len(set(items)) == 1 else " / ".join(items)


def _criteria_text(forecasts: Sequence[_Forecast]) -> str:
    return _named("criterion", "criteria", [_label(f.criterion) for f in forecasts])


def _powers_text(forecasts: Sequence[_Forecast], powers: Sequence[_Power]) -> str:
    fail = _joined([_percent(p.p_fail) for p in powers])
    twice = _joined([_twice_text(f.criterion, f.metric) for f in forecasts])
    text = f"{fail} power to FAIL at {twice}"
    if any(p.p_pass < power.TARGET_POWER for p in powers):
        text += f", {_joined([_percent(p.p_pass) for p in powers])} to PASS at no change"
    return text


def _detects_text(forecasts: Sequence[_Forecast], powers: Sequence[_Power]) -> str:
    changes = _joined([change_text(f.criterion, f.metric, p.change) for f, p in zip(forecasts, powers, strict=True)])
    limits = _joined([limit_text(f.criterion, f.metric) for f in forecasts])
    return f"{_criteria_text(forecasts)} can detect {changes} (limit {limits})"


def _check_power(plan: Plan, out: _Collector, i: int, stage, forecasts: Sequence[_Forecast],
                 washout: dt.timedelta, *, report: bool = True) -> None:
    """KX201 power (spec judge.md §4.4): each criterion's chance to PASS at no change and to FAIL
    at twice its threshold at the stage's planned end. Warn below 80 %, error below 50 %, and an
    error when the baseline alone keeps every stage length below 80 % (se² = se_S² + se_B² ≥ se_B²:
    no extension can decide)."""
    hours = (stage.duration - washout).total_seconds() / 3600
    baseline_h = plan.baseline.duration.total_seconds() / 3600
    top = _MAX_FORECAST.total_seconds() / 3600
    label = f"{stage.name!r} ({format_duration(stage.duration)})"
    key = f"stages[{i}].duration"
    short: dict[str, list[tuple[_Forecast, _Power]]] = {"warning": [], "error": []}
    baseline_bound: list[tuple[_Forecast, _Power, _Power]] = []
    relay_bound: list[tuple[_Forecast, _Power]] = []
    for fc in forecasts:
        now = fc.at(hours, baseline_h)
        out.detectable.append(Detectable(plan.path, stage.name, fc.criterion.name or fc.criterion.metric,
                                         fc.metric.name, fc.criterion.comparison, fc.criterion.threshold,
                                         now.change, now.p_pass, now.p_fail, now.n_stage, now.n_baseline,
                                         fc.alpha_fail))
        if not report or now.n_stage <= 0 or now.least >= power.TARGET_POWER:
            continue
        endless = fc.at(math.inf, baseline_h)
        if endless.least >= power.TARGET_POWER:
            short["error" if now.least < 0.5 else "warning"].append((fc, now))
        elif fc.at(math.inf, math.inf).least >= power.TARGET_POWER:
            baseline_bound.append((fc, now, endless))
        else:
            relay_bound.append((fc, now))
    for severity, found in short.items():
        if not found:
            continue
        needs = [fc.smallest(max(hours, 1.0), top, lambda h, c, fc=fc: fc.at(h, baseline_h, c=c)) for fc, _ in found]
        if any(n is None for n in needs):
            why = f"no stage up to {format_duration(_MAX_FORECAST)} would reach 80 %"
        else:
            need = dt.timedelta(hours=max(n for n in needs if n is not None)) + washout
            why = f"{format_duration(need)} would reach 80 %"
        fcs, powers = [f for f, _ in found], [p for _, p in found]
        out.add("KX201", key, f"{_detects_text(fcs, powers)}; {_powers_text(fcs, powers)}; {why}", severity,
                stage=label)
    if baseline_bound:
        fcs, powers = [f for f, _, _ in baseline_bound], [p for _, p, _ in baseline_bound]
        best = _joined([change_text(f.criterion, f.metric, e.change) for f, _, e in baseline_bound])
        for_stage = [fc.smallest(baseline_h, top, lambda b, c, fc=fc: fc.at(hours, b, c=c)) for fc in fcs]
        if all(b is not None for b in for_stage):
            fix = (f"a {format_duration(dt.timedelta(hours=max(b for b in for_stage if b is not None)))} "
                   "baseline would let the stage reach 80 %")
        else:
            least = [fc.smallest(baseline_h, top, lambda b, c, fc=fc: fc.at(math.inf, b, c=c)) for fc in fcs]
            fix = ("no baseline would let a stage this short reach 80 %" if any(b is None for b in least) else
                   f"the baseline needs {format_duration(dt.timedelta(hours=max(b for b in least if b is not None)))}"
                   " or more, and the stage more time")
        out.add("KX201", key,
                f"{_detects_text(fcs, powers)}; {_powers_text(fcs, powers)}; no extension gets below {best}: "
                f"the {format_duration(plan.baseline.duration)} baseline is too short for any stage length to "
                f"decide (its own samples bound the interval's width); {fix}", "error", stage=label)
    for severity in ("error", "warning"):
        found = [(fc, p) for fc, p in relay_bound if (p.least < 0.5) == (severity == "error")]
        if not found:
            continue
        fcs, powers = [f for f, _ in found], [p for _, p in found]
        relays = [_relays_needed(fc, hours, baseline_h) for fc in fcs]
        limits = [_limit_needed(fc, lambda t, fc=fc: fc.at(hours, baseline_h, threshold=t)) for fc in fcs]
        fixes = [f"{max(relays)} relays would reach 80 %"] if all(relays) else []
        if all(limits):
            wider = _joined([limit_text(f.criterion, f.metric, t) for f, t in zip(fcs, limits, strict=True)])
            fixes.append(f"a limit of {wider}" + ("" if fixes else " would"))
        fix = ", or ".join(fixes) or "nor would more relays or a wider limit"
        # the judge bounds the change with the paired t interval where the signed-rank one has no bound
        # (power.relay_critical), so the relay-to-relay spread is what no length lifts
        relays_now = metrics.RELAY_INSTANCES
        spread = _joined([f"{fc.var.spread:g}" for fc in fcs])
        why = (f"with the engine's {relays_now} relays at a relay-to-relay spread of {spread} no stage or "
               "baseline length reaches 80 %")
        out.add("KX201", key, f"{_detects_text(fcs, powers)}; {_powers_text(fcs, powers)}; {why}: {fix}",
                severity, stage=label)


def _relays_needed(fc: _Forecast, hours: float, baseline_h: float) -> int:
    """Relays that would reach 80 % power in this stage, 0 beyond _MAX_RELAYS."""
    def ok(r: int) -> bool:
        return fc.at(hours, baseline_h, var=attrs.evolve(fc.var, relays=r)).least >= power.TARGET_POWER

    lo, hi = fc.var.relays, fc.var.relays
    while not ok(hi):
        if hi >= _MAX_RELAYS:
            return 0
        lo, hi = hi, min(2 * hi, _MAX_RELAYS)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _limit_needed(fc: _Forecast, at) -> float | None:
    """The threshold ``at(threshold)`` (a stage's power) decides with 80 % power, rounded up to two
    significant digits; None if even 64 times the plan's would not."""
    def ok(t: float) -> bool:
        return at(t).least >= power.TARGET_POWER

    thr = fc.criterion.threshold
    # a relative decrease cannot reach -100 % at twice the limit
    top = 0.499 if fc.criterion.comparison == "relative-decrease" else thr * 64
    if thr <= 0 or not ok(top):
        return None
    lo, hi = thr, top
    while hi / lo > 1.0005:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    step = 10.0 ** (math.floor(math.log10(hi)) - 1)  # up to two significant digits: a limit that still holds
    return round(math.ceil(hi / step - 1e-9) * step, 12)


def _check_switchback_power(plan: Plan, out: _Collector, judged) -> None:
    """Switchback: treatment periods against control periods plus the baseline, judged at each
    cycle's end (kistexp/judge/switchback.py: alpha spending over the planned cycles)."""
    sb = plan.switchback
    assert sb is not None
    usable_h = (sb.period - sb.washout).total_seconds() / 3600
    baseline_h = plan.baseline.duration.total_seconds() / 3600
    alphas = dict(zip(map(id, plan.criteria), fail_alphas(plan.criteria, ALPHA), strict=True))
    for criterion, metric in judged:
        if not _judgeable(criterion):
            continue
        fc = _Forecast(criterion, metric, _variability(metric), alphas[id(criterion)], "obf")

        def at(cycles: int, c=None, fc=fc, threshold=None):
            n_s, n_b = fc.samples(cycles * usable_h), fc.samples(baseline_h + cycles * usable_h)
            if c is None:
                c = (power.final_boundary(cycles, n_s, n_b, fc.alpha_fail),
                     power.final_boundary(cycles, n_s, n_b, ALPHA))
            return fc.at(cycles * usable_h, baseline_h + cycles * usable_h, c=c, threshold=threshold)

        now = at(sb.cycles)
        out.detectable.append(Detectable(plan.path, "switchback", criterion.name or criterion.metric, metric.name,
                                         criterion.comparison, criterion.threshold, now.change, now.p_pass,
                                         now.p_fail, now.n_stage, now.n_baseline, fc.alpha_fail))
        if now.least >= power.TARGET_POWER:
            continue
        c = (now.c_fail, now.c_pass)
        need = next((k for k in range(sb.cycles + 1, 10 * sb.cycles + 1) if at(k, c).least >= power.TARGET_POWER),
                    None)
        if need:
            why = f"{need} cycles ({format_duration(2 * need * sb.period)}) would reach 80 %"
        else:
            limit = _limit_needed(fc, lambda t, c=c, at=at: at(sb.cycles, c, threshold=t))
            why = f"even {10 * sb.cycles} cycles would not reach 80 %" + (
                f"; a limit of {limit_text(criterion, metric, limit)} would" if limit else "")
        out.add("KX201", "switchback.cycles",
                f"{sb.cycles} cycles of {format_duration(sb.period)}: {_detects_text([fc], [now])}; "
                f"{_powers_text([fc], [now])}; {why}", "error" if now.least < 0.5 else "warning")
