"""Anonymity criteria in a rollout (docs/rollouts.md "Anonymity criteria"; docs/anonymity.md).

Nothing on the live network measures what an attacker gains, so an anonymity criterion is judged from the
attack measures ``kistexp simulate`` stored in the experiment (``AttackValue`` per stage, measure and sampled
network): the paired difference stage minus baseline over the networks
(``kistexp.anonymity.stage_differences``), read as a non-inferiority test against the criterion's margin.
The engine asks for a stage's verdicts when it is about to enter the stage, before its values are voted in,
in a dry run and a live run alike; the verdicts are journaled like any other.

For ``absolute-increase`` (higher is leakier) the margin is +threshold: PASS when the interval's upper end is
below it, FAIL when its lower end is at or above it, INCONCLUSIVE otherwise; ``absolute-decrease`` (lower is
leakier) mirrors it at -threshold.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable

import attrs

from kistexp.anonymity import AttackFigure, stage_differences
from kistexp.metrics import catalogue
from kistexp.metrics.series import AttackValue
from kistexp.metrics.store import MetricStore
from kistexp.rollout.spec import RolloutAnonymity, RolloutError, RolloutSpec
from kistexp.rollout.state import ERROR, FAIL, INCONCLUSIVE, PASS, MachineVerdict

JUDGED_ON = "predictions"  # the verdict's limited_by: more stage time cannot decide it
UNDECIDED = "undecided"  # as the judge's reason for an interval straddling the limit
FEW_UNITS = "insufficient_samples"  # fewer than two networks: no interval
RULE = "non-inferiority on the predicted paired difference: PASS when the 95 % interval lies wholly on the safe " \
       "side of the margin, FAIL when wholly beyond it"


class NoAttackPredictions(RolloutError):
    """A plan with anonymity criteria on an experiment without stored attack measures."""


def predicted_stage(spec: RolloutSpec, stage: int) -> str:
    """The stage name ``kistexp simulate`` stored stage ``stage``'s predictions under (a switchback's periods
    under their arm: treatment-3 is "treatment")."""
    if stage == 0:
        return "baseline"
    name = spec.stage(stage).name
    return name.rsplit("-", 1)[0] if spec.kind == "switchback" else name


@attrs.frozen
class PredictedAnonymity:
    """The experiment's stored attack measures as paired stage-minus-baseline figures."""

    figures: tuple[AttackFigure, ...]

    @classmethod
    def of(cls, values: Iterable[AttackValue]) -> PredictedAnonymity:
        return cls(tuple(stage_differences(values)))

    def figure(self, stage: str, measure: str) -> AttackFigure | None:
        return next((f for f in self.figures if f.stage == stage and f.measure == measure), None)

    def verdicts(self, spec: RolloutSpec, stage: int) -> tuple[MachineVerdict, ...]:
        """Stage ``stage``'s anonymity verdicts, in plan order."""
        key = predicted_stage(spec, stage)
        return tuple(judge_anonymity(c, self.figure(key, c.measure), key) for c in spec.anonymity)


def load_predicted_anonymity(conn: sqlite3.Connection, spec: RolloutSpec, plan_path: str,
                             where: str) -> PredictedAnonymity | None:
    """The stored attack measures for ``spec``'s anonymity criteria (None when it has none); refused in one
    line when the experiment at ``where`` has none stored."""
    if not spec.anonymity:
        return None
    values = MetricStore(conn).load_attack_values()
    measures = {v.measure for v in values}
    if not values or not measures & {c.measure for c in spec.anonymity}:
        names = ", ".join(repr(c.name) for c in spec.anonymity)
        raise NoAttackPredictions(f"{where}: no stored attack measures for the anonymity criteria {names}: run "
                                  f"kistexp simulate {plan_path} --dir EXP first")
    return PredictedAnonymity.of(values)


def judge_anonymity(c: RolloutAnonymity, figure: AttackFigure | None, stage: str) -> MachineVerdict:
    """One anonymity criterion on one stage's predicted figure (see the module docstring)."""
    m = catalogue.attack_measure(c.measure)
    label = m.label if m is not None else c.measure
    unit = "" if m is None or m.unit == "ratio" else f" {m.unit}"
    if figure is None:
        return MachineVerdict(c.name, ERROR, detail=f"no predicted {c.measure} for {stage!r} and the baseline in the "
                                                    "experiment (run kistexp simulate again)", reason=FEW_UNITS)
    d = figure.difference
    margin = c.margin
    record = {"judged_on": JUDGED_ON, "measure": c.measure, "stage": stage, "comparison": c.comparison,
              "threshold": c.threshold, "bound": margin, "units": d.units, "baseline_mean": _num(d.baseline_mean),
              "stage_mean": _num(d.stage_mean), "mean_difference": _num(d.mean_difference), "low": _num(d.low),
              "high": _num(d.high), "confidence": d.confidence, "limited_by": JUDGED_ON}
    common = {"effect": _num(d.mean_difference), "ci_low": _num(d.low), "ci_high": _num(d.high),
              "n_baseline": d.units, "n_stage": d.units, "rule": RULE, "bound": margin}
    head = f"{label} {_signed(d.mean_difference)}{unit} over {_networks(d.units)}"
    if not (math.isfinite(d.low) and math.isfinite(d.high)):
        return MachineVerdict(c.name, INCONCLUSIVE, detail=f"{head}: no interval from {_networks(d.units)} "
                              "([simulation] needs two seeds or more)", reason=FEW_UNITS,
                              record=json.dumps(record, sort_keys=True), **common)
    interval = f"[{_signed(d.low)}, {_signed(d.high)}]"
    text = f"{head}, {d.confidence * 100:g} % interval {interval} vs margin {_signed(margin)}{unit}"
    up = c.comparison != "absolute-decrease"
    safe = d.high < margin if up else d.low > margin
    beyond = d.low >= margin if up else d.high <= margin
    outcome, reason = (PASS, "") if safe else (FAIL, "") if beyond else (INCONCLUSIVE, UNDECIDED)
    word = {PASS: "non-inferior", FAIL: "leakier beyond the margin", INCONCLUSIVE: "interval straddles the margin"}
    return MachineVerdict(c.name, outcome, detail=f"{text}: {word[outcome]}", reason=reason,
                          record=json.dumps(record, sort_keys=True),
                          limited_by=JUDGED_ON if outcome == INCONCLUSIVE else "", **common)


def _networks(n: int) -> str:
    return f"{n} simulated network{'' if n == 1 else 's'}"


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _signed(x: float) -> str:
    return f"{x:+.3g}" if math.isfinite(x) else "n/a"
