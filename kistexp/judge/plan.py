"""Judge every criterion of a plan on the samples stored in an experiment directory.

Windows (spec judge.md §5.3): the baseline is the plan's baseline period before the
first stage; each stage is its planned period, cut at ``now``. Samples are selected by
time **and** by the consensus value in effect where the collector knew it (relay
metrics); where it could not (OnionPerf clients), by time, leaving out the first
``washout`` of the stage while the new consensus propagates. FAIL error is split over
the plan's criteria (Bonferroni, §5.5); PASS needs no split.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence

import attrs

from kistexp.judge.core import judge
from kistexp.judge.model import SequentialState, Verdict, Window
from kistexp.judge.switchback import Period, judge_switchback
from kistexp.metrics import catalogue
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import UNSET, Plan

WASHOUT = dt.timedelta(hours=3)  # spec §5.3 and §7
TRIPWIRE_ALPHA = 0.001  # spec §5.2 and §7: a critical criterion's own FAIL error


def fail_alphas(criteria, alpha: float) -> list[float]:
    """FAIL error per criterion: tripwires (critical = true) take 0.001 each, the rest of α
    is split evenly over the other criteria (Bonferroni, spec §5.5)."""
    trips = sum(1 for c in criteria if getattr(c, "critical", False))
    rest = max(alpha - TRIPWIRE_ALPHA * trips, TRIPWIRE_ALPHA)
    others = max(1, len(criteria) - trips)
    return [TRIPWIRE_ALPHA if getattr(c, "critical", False) else rest / others for c in criteria]


@attrs.frozen
class StageVerdict:
    stage: str
    criterion: str
    metric: str
    verdict: Verdict
    window_start: dt.datetime
    window_end: dt.datetime


def _single_value(values: Sequence[tuple[str, object]], param: str | None) -> int | None:
    if param is None:
        return None
    value = dict(values).get(param)
    return None if value is None or value == UNSET else int(value)  # type: ignore[arg-type]


def _select(store: MetricStore, metric: str, t0: dt.datetime, t1: dt.datetime, value: int | None
            ) -> tuple[list[Sample], bool]:
    """Samples of the window; by value in effect when any sample of it knows its value."""
    every = store.select(metric, t0, t1)
    if value is not None and any(s.param_value is not None for s in every):
        return [s for s in every if s.param_value == value], True
    return every, False


def _as_input(samples: Sequence[Sample], population: str):
    """Relay metrics with relay labels -> relay -> Window (paired; {} when a window is empty,
    so the comparison says how many relays it lacks); else one Window."""
    if population == "relays" and all("relay" in s.labels for s in samples):  # none: no relays
        by: dict[str, list[Sample]] = {}
        for s in samples:
            by.setdefault(s.labels["relay"], []).append(s)
        return {r: Window([s.value for s in ss], [s.time.timestamp() for s in ss]) for r, ss in by.items()}
    return Window([s.value for s in samples], [s.time.timestamp() for s in samples])


def _size(data) -> int:
    return sum(w.n for w in data.values()) if isinstance(data, dict) else data.n


def _cut(data, t: float):
    """Only samples before epoch second t."""
    if isinstance(data, dict):
        out = {r: _cut(w, t) for r, w in data.items()}
        return {r: w for r, w in out.items() if w.n}
    keep = data.times < t
    return Window(data.values[keep], data.times[keep], data.excluded)


def judge_plan(plan: Plan, store: MetricStore, *, now: dt.datetime | None = None, sequential: bool = False,
               alpha: float = 0.05, progress: Callable[[int, int], None] | None = None) -> list[StageVerdict]:
    """Every (stage, criterion) whose stage has begun by ``now``.

    With ``sequential`` the hourly looks an engine would have made are replayed from the
    stored samples (Lan–DeMets OBF spending, planned size = the baseline's sample rate
    over the stage), stopping at the first FAIL or PASS; otherwise one fixed-horizon look.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    if plan.kind == "switchback" and plan.switchback is not None:
        return _judge_switchback_plan(plan, store, now, sequential, alpha, progress)
    param = plan.parameters[0] if len(plan.parameters) == 1 else None
    base_t0 = plan.start - plan.baseline.duration
    base_value = _single_value(plan.baseline.values, param)
    alphas = dict(zip(map(id, plan.criteria), fail_alphas(plan.criteria, alpha), strict=True))
    jobs = [(stage, t0, t1, c) for stage, t0, t1 in plan.stage_windows() if t0 < now for c in plan.criteria]
    out: list[StageVerdict] = []
    for i, (stage, t0, t1, crit) in enumerate(jobs):
        metric = catalogue.get(crit.metric)
        population = metric.population if metric else "clients"
        end = min(t1, now)
        base_samples, _ = _select(store, crit.metric, base_t0, plan.start, base_value)
        stage_samples, by_value = _select(store, crit.metric, t0, end, _single_value(stage.values, param))
        baseline = _as_input(base_samples, population)
        staged = _as_input(stage_samples, population)
        excluded = 0
        if not by_value:
            # the value in effect is unknown: leave out the propagation washout by time
            cut = (t0 + WASHOUT).timestamp()
            excluded = sum(1 for s in stage_samples if s.time.timestamp() < cut)
            staged = _after(staged, cut)
        name = crit.name or crit.metric
        alpha_fail = alphas[id(crit)]
        kwargs = dict(now=end.timestamp())  # staleness is judged at the window's end
        if isinstance(baseline, dict):
            weights = _bandwidth_weights(store, base_t0, plan.start)
            if weights:
                kwargs["relay_weights"] = weights
        if not sequential:
            v = judge(crit, baseline, staged, alpha_fail=alpha_fail, alpha_pass=alpha, **kwargs)
        else:
            v = _replay(crit, baseline, staged, t0, t1, end, plan.baseline.duration, alpha_fail, alpha, kwargs)
        if excluded:
            v = attrs.evolve(v, excluded=v.excluded + excluded)
        out.append(StageVerdict(stage.name, name, crit.metric, v, t0, end))
        if progress is not None:
            progress(i + 1, len(jobs))
    return out


def _bandwidth_weights(store: MetricStore, t0: dt.datetime, t1: dt.datetime) -> dict[str, float]:
    """Each relay's mean baseline bandwidth, the weight of its change for the average byte (spec §2.5)."""
    sums: dict[str, list[float]] = {}
    for s in store.select("relay_bandwidth_bytes_per_s", t0, t1):
        if "relay" in s.labels:
            sums.setdefault(s.labels["relay"], []).append(s.value)
    return {r: sum(v) / len(v) for r, v in sums.items()}


def _after(data, t: float):
    """Only samples at or after epoch second t."""
    if isinstance(data, dict):
        out = {r: _after(w, t) for r, w in data.items()}
        return {r: w for r, w in out.items() if w.n}
    keep = data.times >= t
    return Window(data.values[keep], data.times[keep])


def _replay(crit, baseline, staged, t0: dt.datetime, t1: dt.datetime, end: dt.datetime,
            baseline_duration: dt.timedelta, alpha_fail: float, alpha_pass: float, kwargs) -> Verdict:
    hours = max(1, math.ceil((end - t0).total_seconds() / 3600.0))
    base_rate = _size(baseline) / max(baseline_duration.total_seconds() / 3600.0, 1e-9)
    planned = max(1.0, base_rate * (t1 - t0 - WASHOUT).total_seconds() / 3600.0)
    # a tripwire looks with flat (Pocock-type) boundaries, so severe breakage FAILs in the first hours
    state = SequentialState.plan(planned_stage=planned, alpha_fail=alpha_fail, alpha_pass=alpha_pass,
                                 method="pocock" if getattr(crit, "critical", False) else "obf")
    verdict = None
    for h in range(1, hours + 1):
        cut = min(t0 + dt.timedelta(hours=h), end)
        look_now = cut.timestamp()
        data = _cut(staged, look_now)
        args = dict(kwargs, now=look_now)
        verdict = judge(crit, baseline, data, sequential_state=state, final=(cut >= t1), **args)
        state = verdict.state or state
        if verdict.outcome != "inconclusive":
            break
    assert verdict is not None
    return verdict


def _arm(stage_name: str) -> str:
    """The expanded periods are named treatment-N / control-N (kistexp.plan)."""
    return "control" if stage_name.startswith("control") else "treatment"


def _judge_switchback_plan(plan: Plan, store: MetricStore, now: dt.datetime, sequential: bool, alpha: float,
                           progress: Callable[[int, int], None] | None) -> list[StageVerdict]:
    """Switchback plans are judged period against period (spec §6), one verdict per
    criterion over the periods completed by ``now``; with ``sequential`` the looks at each
    completed cycle are replayed (t = cycles / planned cycles), stopping at FAIL or PASS."""
    assert plan.switchback is not None
    param = plan.parameters[0] if len(plan.parameters) == 1 else None
    done = [(stage, t0, t1) for stage, t0, t1 in plan.stage_windows() if t1 <= now]
    washout = plan.switchback.washout.total_seconds()
    out: list[StageVerdict] = []
    for i, (crit, alpha_fail) in enumerate(zip(plan.criteria, fail_alphas(plan.criteria, alpha), strict=True)):
        periods: list[Period] = []
        for stage, t0, t1 in done:
            samples, by_value = _select(store, crit.metric, t0, t1, _single_value(stage.values, param))
            periods.append(Period(_arm(stage.name), [s.value for s in samples], t0.timestamp(), t1.timestamp(),
                                  # by value in effect, propagation is already accounted for
                                  None if by_value else [s.time.timestamp() for s in samples]))
        kwargs = dict(washout=washout, alpha_fail=alpha_fail, alpha_pass=alpha)
        if not sequential:
            v = judge_switchback(crit, periods, **kwargs)
        else:
            state = None
            v = judge_switchback(crit, [], planned_cycles=plan.switchback.cycles, **kwargs)
            for k in range(2, len(periods) + 1, 2):
                final = k >= 2 * plan.switchback.cycles
                v = judge_switchback(crit, periods[:k], sequential_state=state,
                                     planned_cycles=None if state else plan.switchback.cycles,
                                     final=final, **kwargs)
                state = v.state or state
                if v.outcome != "inconclusive":
                    break
        start = plan.start
        end = done[-1][2] if done else plan.start
        out.append(StageVerdict("switchback", crit.name or crit.metric, crit.metric, v, start, end))
        if progress is not None:
            progress(i + 1, len(plan.criteria))
    return out
