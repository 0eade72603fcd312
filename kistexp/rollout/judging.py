"""Glue between the engine and the project's judge, kistexp.judge (rollout.md §1.2, docs/judge.md).

The judge decides every verdict; this module only turns the engine's journaled metric
batches into the judge's inputs and its answer into the state machine's ``MachineVerdict``:

* each sample gets a time: its batch's window, laid out in *plan* seconds (one plan hour =
  3600 s however fast the run goes) so the judge's staleness, hour-of-day coverage and
  design-effect checks mean the same in a dry run, an accelerated run and a live one;
* relay metrics whose batches all carry relay labels become relay -> Window mappings:
  the judge then compares each relay with its own baseline (per-relay paired comparison);
* the hourly looks are sequential: a normal-mixture confidence sequence, valid at every
  look however many there are, so looking every hour for weeks (and past the planned end
  when a stage is extended) keeps the false-alarm rate at its alpha. The state the judge
  returns is the state of the next look; the engine keeps it in the journal.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from kistexp.jsonout import to_json
from kistexp.judge import JudgeError, Period, SequentialState, Window, judge, judge_switchback
from kistexp.judge.multiple import annotate
from kistexp.judge.switchback import horizon_cycles
from kistexp.metrics import catalogue
from kistexp.rollout.spec import RolloutCriterion, RolloutSpec
from kistexp.rollout.state import ERROR, MachineVerdict

SEQUENTIAL_METHOD = "mixture"  # always valid: any number of looks, extensions included
PLAN_HOUR_S = 3600.0
# batches arrive once a plan hour: a stage side whose newest sample is older than one and a
# half windows missed its last batch, which holds (INCONCLUSIVE "stale")
STALE_AFTER_S = 1.5 * PLAN_HOUR_S


@attrs.frozen(eq=False)
class Batch:
    """One collection window of one metric: its start, the values and, when the collector
    knew them, which relay each run of values came from (in payload order)."""

    t0: dt.datetime
    values: np.ndarray
    relays: tuple[tuple[str, int], ...] | None = None


def plan_seconds(spec: RolloutSpec, t: dt.datetime) -> float:
    """``t`` on the plan's own time axis (epoch seconds, one plan hour = 3600 s)."""
    return spec.baseline_start.timestamp() + (t - spec.baseline_start) / spec.hour * PLAN_HOUR_S


def _times(spec: RolloutSpec, b: Batch) -> np.ndarray:
    # samples spread evenly over their collection window, each at the middle of its share
    n = b.values.size
    return plan_seconds(spec, b.t0) + (np.arange(n) + 0.5) / max(n, 1) * PLAN_HOUR_S


def judge_input(spec: RolloutSpec, metric: str, batches: Sequence[Batch]) -> Window | dict[str, Window]:
    """The judge's input for one side: a Window, or relay -> Window for a relay metric
    whose every batch says which relay each sample came from."""
    m = catalogue.get(metric)
    if m is not None and m.population == "relays" and batches and all(b.relays for b in batches):
        by: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for b in batches:
            times, at = _times(spec, b), 0
            for relay, n in b.relays or ():
                vs, ts = by.setdefault(relay, ([], []))
                vs.append(b.values[at:at + n])
                ts.append(times[at:at + n])
                at += n
        return {r: Window(np.concatenate(vs), np.concatenate(ts)) for r, (vs, ts) in by.items()}
    if not batches:
        return Window(np.zeros(0), np.zeros(0))
    return Window(np.concatenate([b.values for b in batches]), np.concatenate([_times(spec, b) for b in batches]))


def extend(spec: RolloutSpec, metric: str, old, batches: Sequence[Batch], new: Sequence[Batch]):
    """``judge_input`` of ``batches`` given ``old``, the input of all but the ``new`` ones:
    appends instead of rebuilding the weeks already collected each hour."""
    add = judge_input(spec, metric, new)
    if isinstance(old, Window) and isinstance(add, Window):
        return Window(np.concatenate([old.values, add.values]), np.concatenate([old.times, add.times]))
    if isinstance(old, Mapping) and isinstance(add, Mapping) and len(batches) > len(new):
        out = dict(old)
        for r, w in add.items():
            o = out.get(r)
            out[r] = w if o is None else Window(np.concatenate([o.values, w.values]),
                                                np.concatenate([o.times, w.times]))
        return out
    return judge_input(spec, metric, batches)


def untimed(data):
    """The same samples without times, for a stage planned shorter than a day: the judge's PASS
    needs a stage to cover all 24 hours of the day (a time-of-day confound otherwise), which such a
    stage can never do; its plan accepts that confound, and staleness is left to the engine's
    missing-batch check."""
    if isinstance(data, Mapping):
        return {r: Window(w.values) for r, w in data.items()}
    return Window(data.values)


def short_stage(spec: RolloutSpec, stage_index: int) -> bool:
    return spec.stage(stage_index).duration < 24 * spec.hour


def size(data: Window | Mapping[str, Window]) -> int:
    return sum(w.n for w in data.values()) if isinstance(data, Mapping) else data.n


def planned_state(spec: RolloutSpec, stage_index: int, n_stage: int, measured_hours: float,
                  alpha_fail: float = 0.05) -> SequentialState:
    """A new sequential test for a stage: the planned stage size is the rate seen so far
    times the stage's planned measuring hours (its duration less the washout). ``alpha_fail``
    is the criterion's share of the stage's FAIL error (kistexp.judge.multiple.fail_alphas)."""
    st = spec.stage(stage_index)  # a switchback's appended periods too
    planned_hours = max(1.0, (st.duration - spec.washout) / spec.hour)
    rate = n_stage / max(measured_hours, 1.0)
    return SequentialState.plan(planned_stage=max(1.0, rate * planned_hours), method=SEQUENTIAL_METHOD,
                                alpha_fail=alpha_fail)


def judge_criterion(criterion: RolloutCriterion, baseline, stage, state: SequentialState | None,
                    now_s: float, *, alpha_fail: float | None = None, correction: str = ""
                    ) -> tuple[MachineVerdict, SequentialState | None]:
    """One look of the judge at one criterion -> (a MachineVerdict, the state for the next look).

    ``alpha_fail`` is the FAIL error the stage's correction gives it at this look (``correction``
    says how: "holm 2/5"); the state for the next look keeps the criterion's own share."""
    share = state.alpha_fail if state is not None else None
    if alpha_fail is not None and state is not None:
        state = attrs.evolve(state, alpha_fail=alpha_fail)
    try:
        v = judge(criterion, baseline, stage, sequential_state=state, now=now_s, stale_after=STALE_AFTER_S,
                  **({} if alpha_fail is None or state is not None else {"alpha_fail": alpha_fail}))
    except JudgeError as exc:
        return MachineVerdict(criterion.name, ERROR, detail=f"the judge cannot evaluate it: {exc}"), state
    v = annotate(v, correction)
    nxt = v.state if v.state is None or share is None else attrs.evolve(v.state, alpha_fail=share)
    return machine_verdict(criterion.name, v), nxt


def machine_verdict(name: str, v) -> MachineVerdict:
    """The judge's verdict as the state machine's, with the judge's whole record."""
    record = json.dumps(to_json(v), default=float, sort_keys=True)
    return MachineVerdict(name, v.outcome, v.effect, v.ci_low, v.ci_high, v.n_baseline, v.n_stage, v.detail,
                          v.reason, v.rule, record, bound=v.bound, limited_by=v.limited_by)


# --- switchbacks (rollout.md §1.6, judge.md §6) ------------------------------------------------------

SWITCHBACK_PHASE = "switchback"  # the journal's key (rollout_sequential) of a switchback's analysis
SWITCHBACK_ALPHA = 0.05  # a switchback analysis' PASS error: PASS is an intersection, not split (judge.md §5.5)


def switchback_period(spec: RolloutSpec, stage_index: int, metric: str, start: dt.datetime,
                      batches: Sequence[Batch]) -> Period:
    """One period of a switchback for the judge, on the plan's time axis: from the consensus that brought
    it in (``start``) to the end of its last collection window, its samples pooled over relays (docs/judge.md
    "Limits": a period's statistic is over all its relays' samples). Its washout was never collected as
    the period's, so only the burn-out is left for the judge to drop."""
    data = judge_input(spec, metric, batches)
    windows = list(data.values()) if isinstance(data, Mapping) else [data]
    values = np.concatenate([w.values for w in windows]) if windows else np.zeros(0)
    times = np.concatenate([w.times for w in windows]) if windows else np.zeros(0)
    arm = "control" if spec.stage(stage_index).name.startswith("control") else "treatment"
    t0 = plan_seconds(spec, start)
    end = plan_seconds(spec, max(b.t0 for b in batches)) + PLAN_HOUR_S if batches else t0 + PLAN_HOUR_S
    return Period(arm, values, t0, max(end, t0 + 1.0), times)


def judge_switchback_criterion(spec: RolloutSpec, criterion: RolloutCriterion, periods: Sequence[Period],
                               state: SequentialState | None, *, alpha_fail: float, final: bool,
                               correction: str = "", share: float | None = None
                               ) -> tuple[MachineVerdict, SequentialState | None]:
    """One look at a cycle's end: every period so far, period against period (judge.md §6). The sequential
    analysis spans every cycle the run may take, the appendable ones included (``horizon_cycles``), so an
    appended cycle is a later look of the same analysis; the last allowed cycle spends what is left.
    ``alpha_fail`` is the FAIL error the plan's correction gives it at this look (``correction`` says how);
    the state for the next look keeps ``share``, the criterion's own share."""
    cycles = spec.n_stages // 2
    looked = state if state is None else attrs.evolve(state, alpha_fail=alpha_fail)
    try:
        v = judge_switchback(criterion, periods, burnout=spec.burnout / spec.hour * PLAN_HOUR_S,
                             planned_cycles=None if state else horizon_cycles(cycles), sequential_state=looked,
                             alpha_fail=alpha_fail, alpha_pass=SWITCHBACK_ALPHA, final=final)
    except JudgeError as exc:
        return MachineVerdict(criterion.name, ERROR, detail=f"the judge cannot evaluate it: {exc}"), state
    v = annotate(v, correction)
    nxt = v.state if v.state is None or share is None else attrs.evolve(v.state, alpha_fail=share)
    return machine_verdict(criterion.name, v), nxt
