"""Glue between the engine and the project's judge, kistexp.judge (rollout.md §1.2, docs/judge.md).

The judge decides every verdict; this module only turns the engine's journaled metric
batches into the judge's inputs and its answer into the state machine's ``Verdict``:

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

from kistexp.judge import JudgeError, SequentialState, Window, judge
from kistexp.metrics import catalogue
from kistexp.rollout.spec import CriterionSpec, RolloutSpec
from kistexp.rollout.state import ERROR, Verdict

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
    return spec.stages[stage_index - 1].duration < 24 * spec.hour


def size(data: Window | Mapping[str, Window]) -> int:
    return sum(w.n for w in data.values()) if isinstance(data, Mapping) else data.n


def planned_state(spec: RolloutSpec, stage_index: int, n_stage: int, measured_hours: float) -> SequentialState:
    """A new sequential test for a stage: the planned stage size is the rate seen so far
    times the stage's planned measuring hours (its duration less the washout)."""
    st = spec.stages[stage_index - 1]
    planned_hours = max(1.0, (st.duration - spec.washout) / spec.hour)
    rate = n_stage / max(measured_hours, 1.0)
    return SequentialState.plan(planned_stage=max(1.0, rate * planned_hours), method=SEQUENTIAL_METHOD)


def judge_criterion(criterion: CriterionSpec, baseline, stage, state: SequentialState | None,
                    now_s: float) -> tuple[Verdict, SequentialState | None]:
    """One look of the judge at one criterion -> (the machine's Verdict, the state for the next look)."""
    try:
        v = judge(criterion, baseline, stage, sequential_state=state, now=now_s, stale_after=STALE_AFTER_S)
    except JudgeError as exc:
        return Verdict(criterion.name, ERROR, detail=f"the judge cannot evaluate it: {exc}"), state
    record = json.dumps(v.to_dict(), default=float, sort_keys=True)
    return (Verdict(criterion.name, v.outcome, v.effect, v.ci_low, v.ci_high, v.n_baseline, v.n_stage,
                    v.detail, v.reason, v.rule, record), v.state)
