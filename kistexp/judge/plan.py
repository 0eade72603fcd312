"""Judge every criterion of a plan on the samples stored in an experiment directory.

Windows (spec judge.md §5.3): the baseline is the plan's baseline period before the
first stage; each stage is its planned period, cut at ``now``. Samples are selected by
time **and** by the consensus value in effect where the collector knew it (relay
metrics); where it could not (OnionPerf clients), by time, leaving out the first
``washout`` of the stage while the new consensus propagates. A stage's criteria share one
FAIL error, corrected as the plan says (Holm by default, kistexp.judge.multiple; §5.5); PASS
needs no split.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence

import attrs

from kistexp.judge.core import judge
from kistexp.judge.model import SequentialState, Verdict, Window
from kistexp.judge.multiple import TRIPWIRE_ALPHA, annotate, fail_alphas, step_down
from kistexp.judge.switchback import Period, judge_switchback
from kistexp.metrics import catalogue
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import UNSET, Plan

WASHOUT = dt.timedelta(hours=3)  # spec §5.3 and §7
__all__ = ["TRIPWIRE_ALPHA", "WASHOUT", "StageVerdict", "fail_alphas", "judge_plan"]


def _correction(plan: Plan) -> str:
    return getattr(plan, "correction", "holm")


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
    correction = _correction(plan)
    shares = fail_alphas(plan.criteria, alpha, correction)
    stages = [(stage, t0, t1) for stage, t0, t1 in plan.stage_windows() if t0 < now]
    total = len(stages) * len(plan.criteria)
    out: list[StageVerdict] = []
    for k, (stage, t0, t1) in enumerate(stages):
        end = min(t1, now)
        items, excluded = [], []
        for crit in plan.criteria:
            metric = catalogue.get(crit.metric)
            population = metric.population if metric else "clients"
            base_samples, _ = _select(store, crit.metric, base_t0, plan.start, base_value)
            stage_samples, by_value = _select(store, crit.metric, t0, end, _single_value(stage.values, param))
            baseline = _as_input(base_samples, population)
            staged = _as_input(stage_samples, population)
            dropped = 0
            if not by_value:
                # the value in effect is unknown: leave out the propagation washout by time
                cut = (t0 + WASHOUT).timestamp()
                dropped = sum(1 for s in stage_samples if s.time.timestamp() < cut)
                staged = _after(staged, cut)
            kwargs = dict(now=end.timestamp())  # staleness is judged at the window's end
            if isinstance(baseline, dict):
                weights = _bandwidth_weights(store, base_t0, plan.start)
                if weights:
                    kwargs["relay_weights"] = weights
            items.append((crit, baseline, staged, kwargs))
            excluded.append(dropped)
        if not sequential:
            # one look at the stage's criteria as a family: the plan's correction (spec §5.5)
            judges = [lambda a, label, it=it: annotate(judge(it[0], it[1], it[2], alpha_fail=a, alpha_pass=alpha,
                                                             **it[3]), label) for it in items]
            verdicts = step_down(judges, shares, correction, _failed, shared=_shared(plan.criteria))
        else:
            verdicts = _replay(items, t0, t1, end, plan.baseline.duration, shares, alpha, correction,
                               _shared(plan.criteria))
        for crit, v, dropped in zip(plan.criteria, verdicts, excluded, strict=True):
            assert v is not None
            if dropped:
                v = attrs.evolve(v, excluded=v.excluded + dropped)
            out.append(StageVerdict(stage.name, crit.name or crit.metric, crit.metric, v, t0, end))
        if progress is not None:
            progress((k + 1) * len(plan.criteria), total)
    return out


def _failed(v: Verdict) -> bool:
    return v.outcome == "fail"


def _shared(criteria) -> list[bool]:
    """Which criteria share the FAIL error: all but dry-run ones (spec §5.5)."""
    return [not getattr(c, "dry_run", False) for c in criteria]


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


def _replay(items, t0: dt.datetime, t1: dt.datetime, end: dt.datetime, baseline_duration: dt.timedelta,
            shares: Sequence[float], alpha_pass: float, correction: str, shared: Sequence[bool]) -> list[Verdict]:
    """The hourly looks of a stage's criteria, each stopping at its first FAIL or PASS. At every
    look the criteria still running are judged as a family (kistexp.judge.multiple.step_down);
    under Holm the shares of criteria that FAILed at earlier looks go to the others, whose whole
    spending sequence is re-levelled (Maurer & Bretz 2013)."""
    hours = max(1, math.ceil((end - t0).total_seconds() / 3600.0))
    states = []
    for (crit, baseline, _, _), share in zip(items, shares, strict=True):
        base_rate = _size(baseline) / max(baseline_duration.total_seconds() / 3600.0, 1e-9)
        planned = max(1.0, base_rate * (t1 - t0 - WASHOUT).total_seconds() / 3600.0)
        # a tripwire looks with flat (Pocock-type) boundaries, so severe breakage FAILs in the first hours
        states.append(SequentialState.plan(planned_stage=planned, alpha_fail=share, alpha_pass=alpha_pass,
                                           method="pocock" if getattr(crit, "critical", False) else "obf"))
    def judge_at(h: int, i: int, state: SequentialState | None):
        crit, baseline, staged, kwargs = items[i]
        cut = min(t0 + dt.timedelta(hours=h), end)
        data, args = _cut(staged, cut.timestamp()), dict(kwargs, now=cut.timestamp())
        assert state is not None
        return lambda a, label: annotate(judge(crit, baseline, data, sequential_state=attrs.evolve(state, alpha_fail=a),
                                               final=cut >= t1, **args), label)

    verdicts = _looks_as_a_family(range(1, hours + 1), judge_at, [None] * len(items), states, shares, correction,
                                  shared)
    assert all(v is not None for v in verdicts)
    return verdicts  # type: ignore[return-value]


def _looks_as_a_family(looks, judge_at, verdicts: list[Verdict | None], states: list[SequentialState | None],
                       shares: Sequence[float], correction: str, shared: Sequence[bool]) -> list[Verdict | None]:
    """The sequential looks of a stage's criteria (staged hours or switchback cycles), each criterion
    stopping at its first FAIL or PASS; at every look the criteria still running are judged as a family
    (kistexp.judge.multiple.step_down), the shares of those that FAILed earlier passed on under Holm.
    ``judge_at(look, i, state)`` gives criterion i's judge at that look: a function of (alpha, label)."""
    running = [v is None or v.outcome == "inconclusive" for v in verdicts]
    for look in looks:
        judges = [judge_at(look, i, states[i]) if running[i] else None for i in range(len(verdicts))]
        if not any(judges):
            break
        failed = [i for i, v in enumerate(verdicts) if not running[i] and v is not None and v.outcome == "fail"]
        for i, v in enumerate(step_down(judges, shares, correction, _failed, failed=failed, shared=shared)):
            if v is None:
                continue
            verdicts[i] = v
            if v.state is not None:
                # the next look starts again from the criterion's share; step_down re-levels it
                states[i] = attrs.evolve(v.state, alpha_fail=shares[i])
            running[i] = v.outcome == "inconclusive"
        if not any(running):
            break
    return verdicts


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
    burnout = plan.switchback.burnout.total_seconds()  # the window before each switch, dropped too
    correction = _correction(plan)
    shares = fail_alphas(plan.criteria, alpha, correction)
    shared = _shared(plan.criteria)
    cycles = plan.switchback.cycles
    per_criterion: list[list[Period]] = []
    for crit in plan.criteria:
        periods: list[Period] = []
        for stage, t0, t1 in done:
            samples, by_value = _select(store, crit.metric, t0, t1, _single_value(stage.values, param))
            periods.append(Period(_arm(stage.name), [s.value for s in samples], t0.timestamp(), t1.timestamp(),
                                  # by value in effect, propagation is already accounted for
                                  None if by_value else [s.time.timestamp() for s in samples]))
        per_criterion.append(periods)
    if not sequential:
        judges = [lambda a, label, crit=crit, periods=periods: annotate(
            judge_switchback(crit, periods, washout=washout, burnout=burnout, alpha_fail=a, alpha_pass=alpha), label)
            for crit, periods in zip(plan.criteria, per_criterion, strict=True)]
        verdicts = step_down(judges, shares, correction, _failed, shared=shared)
    else:
        # the looks at each completed cycle, the criteria still running judged as a family each time
        verdicts = [judge_switchback(crit, [], planned_cycles=cycles, washout=washout, burnout=burnout,
                                     alpha_fail=share, alpha_pass=alpha)
                    for crit, share in zip(plan.criteria, shares, strict=True)]
        def judge_at(k: int, i: int, state: SequentialState | None):
            crit, periods = plan.criteria[i], per_criterion[i][:k]
            return lambda a, label: annotate(judge_switchback(
                crit, periods, sequential_state=None if state is None else attrs.evolve(state, alpha_fail=a),
                planned_cycles=None if state else cycles, final=k >= 2 * cycles, washout=washout, burnout=burnout,
                alpha_fail=a, alpha_pass=alpha), label)

        # every criterion runs from the first cycle on (its empty verdict above is inconclusive)
        verdicts = _looks_as_a_family(range(2, len(done) + 1, 2), judge_at, list(verdicts), [None] * len(plan.criteria),
                                      shares, correction, shared)
    out: list[StageVerdict] = []
    end = done[-1][2] if done else plan.start
    for i, (crit, v) in enumerate(zip(plan.criteria, verdicts, strict=True)):
        assert v is not None
        out.append(StageVerdict("switchback", crit.name or crit.metric, crit.metric, v, plan.start, end))
        if progress is not None:
            progress(i + 1, len(plan.criteria))
    return out
