"""Experiment plans as frozen attrs value objects (the format: docs/plan-format.md)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

import attrs

from kistexp.dirauth.authorities import DirectoryAuthority
from kistexp.params import VersionRange
from kistexp.population.stageruns import StageRun, StageRuns

# A stage value: an int the authorities put in ConsensusParams, or UNSET (the
# authorities drop the key, so relays fall back to tor's compiled default).
UNSET = "unset"
ParamValue = int | Literal["unset"]

GATES = ("auto", "manual")
ON_FAIL_ACTIONS = ("hold", "step-back", "revert-default", "remove-param")
# What an INCONCLUSIVE criterion does at its stage's end (when its estimate is not beyond the limit:
# then its on_fail is taken): extend the stage hour by hour up to max_extension, hold (pause for an
# operator), or one of the rollback kinds.
ON_INCONCLUSIVE_ACTIONS = ("extend", "advance", "hold", "step-back", "revert-default", "remove-param")
DEFAULT_ON_INCONCLUSIVE = "extend"
# A guardrail's FAIL rolls back (its on_fail); a signal's FAIL pauses and asks an operator.
ROLES = ("guardrail", "signal")
# How a stage's criteria share one FAIL error (kistexp.judge.multiple, docs/judge.md "Several criteria").
CORRECTIONS = ("holm", "bonferroni", "none")
DEFAULT_CORRECTION = "holm"
STATISTICS = ("mean", "median", "p10", "p25", "p75", "p90", "p95", "p99", "max", "min")
COMPARISONS = ("relative-increase", "relative-decrease", "absolute-increase", "absolute-decrease",
               "above", "below")
# An anonymity criterion limits the paired change of an attack measure, stage minus baseline, in the
# measure's own unit: "absolute-increase" for a measure where higher is leakier, "absolute-decrease"
# for one where lower is (docs/plan-format.md "Anonymity criteria").
ANONYMITY_COMPARISONS = ("absolute-increase", "absolute-decrease")
PLAN_KINDS = ("staged", "switchback")


@attrs.frozen
class Stage:
    """One step of a staged rollout: the values authorities vote for, and for how long."""

    name: str
    values: tuple[tuple[str, ParamValue], ...]
    duration: dt.timedelta
    gate: str = "auto"  # auto: the engine moves on; manual: an operator approves
    note: str = ""

    def value_of(self, param: str) -> ParamValue | None:
        return dict(self.values).get(param)


@attrs.frozen
class Criterion:
    """A rollback criterion: stage statistic compared to the baseline's."""

    metric: str
    statistic: str
    comparison: str
    threshold: float
    min_samples: int
    on_fail: str
    name: str = ""
    critical: bool = False  # a tripwire: its own small FAIL error, flat boundaries (judge spec §5.2)
    role: str = "guardrail"
    # resolved by the loader: the criterion's own key, else [experiment]'s, else the default
    on_inconclusive: str = DEFAULT_ON_INCONCLUSIVE
    max_extension: dt.timedelta | None = None  # None: as long as the stage itself

    @property
    def signal(self) -> bool:
        return self.role == "signal"

    def describe(self) -> str:
        unit = "%" if self.comparison.startswith("relative") else ""
        value = self.threshold * 100 if unit else self.threshold
        tripwire = " (tripwire)" if self.critical else ""
        # a signal's failure pauses for an operator whatever its on_fail says
        then = "pause (signal)" if self.signal else self.on_fail
        return f"{self.statistic}({self.metric}) {self.comparison} {value:g}{unit}{tripwire} -> {then}"


@attrs.frozen
class AnonymityCriterion:
    """An anonymity criterion: the change of an attack measure (``kistexp.metrics.catalogue.ATTACK_MEASURES``)
    from the baseline to a stage on the simulated networks may not exceed ``threshold`` with 95 % confidence
    (non-inferiority). Judged from ``kistexp simulate``'s stored predictions, before a stage's values are voted
    in: nothing on the live network measures an attack."""

    measure: str
    comparison: str  # absolute-increase: the stage may not raise it by more than threshold; -decrease: lower it
    threshold: float  # the margin, in the measure's unit
    on_fail: str
    name: str = ""
    role: str = "guardrail"
    on_inconclusive: str = DEFAULT_ON_INCONCLUSIVE  # resolved by the loader, as a Criterion's
    index: int = 0  # its place in the plan's [[criteria]] (key paths: criteria[index])

    @property
    def signal(self) -> bool:
        return self.role == "signal"

    @property
    def label(self) -> str:
        return self.name or self.measure

    @property
    def margin(self) -> float:
        """The limit on the paired difference's scale: +threshold for an increase, -threshold for a decrease."""
        return -self.threshold if self.comparison == "absolute-decrease" else self.threshold

    def describe(self) -> str:
        then = "pause (signal)" if self.signal else self.on_fail
        return f"{self.measure} {self.comparison} {self.threshold:g} (non-inferiority, predicted) -> {then}"


@attrs.frozen
class Baseline:
    """Window before the first stage whose metrics are the reference."""

    duration: dt.timedelta
    values: tuple[tuple[str, ParamValue], ...] = ()  # the values in force during the baseline


@attrs.frozen
class AuthoritySet:
    """The configured authorities and which of them will change their votes."""

    authorities: tuple[DirectoryAuthority, ...]
    participating: tuple[str, ...]  # nicknames that apply the plan's values
    others: str = "listing"  # "listing": the others list the parameter; "silent": they do not


@attrs.frozen
class SimulationSettings:
    """The plan's ``[simulation]`` table: how its rollout is predicted and rehearsed in the simulator."""

    population_scale: float = 0.01
    seeds: tuple[int, ...] = (1,)
    duration: dt.timedelta = dt.timedelta(seconds=60)
    declared: bool = False  # the plan has a [simulation] table: it is meant to be predicted and rehearsed


@attrs.frozen
class Switchback:
    """Alternate treatment and control every `period`, ignoring `washout` after each switch (burn-in)
    and `burnout` before the next one."""

    treatment: tuple[tuple[str, ParamValue], ...]
    control: tuple[tuple[str, ParamValue], ...]
    period: dt.timedelta
    washout: dt.timedelta
    cycles: int
    gate: str = "auto"
    # 0 by default: no tor runs a consensus before its valid-after, so nothing switches early
    # (docs/plan-format.md "Switchback plans")
    burnout: dt.timedelta = dt.timedelta(0)


@attrs.frozen
class Plan:
    path: str
    name: str
    kind: str
    owner: str
    contact: str
    description: str
    start: dt.datetime
    tor_versions: VersionRange
    tor_versions_text: str
    parameters: tuple[str, ...]
    stages: tuple[Stage, ...]  # for switchback plans: the expanded treatment/control periods
    baseline: Baseline
    authorities: AuthoritySet
    criteria: tuple[Criterion, ...]
    simulation: SimulationSettings
    switchback: Switchback | None = None
    correction: str = DEFAULT_CORRECTION  # how a stage's criteria share the FAIL error
    # the [[criteria]] that name an attack `measure` instead of a `metric`, judged from the predictions
    anonymity: tuple[AnonymityCriterion, ...] = ()

    def criterion_keys(self) -> tuple[str, ...]:
        """The key path of each of ``criteria`` in the file (``criteria[i]``): anonymity criteria share the
        [[criteria]] array, so a metric criterion's place there is not its place in ``criteria``."""
        taken = {a.index for a in self.anonymity}
        places = [i for i in range(len(self.criteria) + len(self.anonymity)) if i not in taken]
        return tuple(f"criteria[{i}]" for i in places[:len(self.criteria)])

    @property
    def end(self) -> dt.datetime:
        return self.start + sum((s.duration for s in self.stages), dt.timedelta())

    def stage_windows(self) -> tuple[tuple[Stage, dt.datetime, dt.datetime], ...]:
        """Each stage with its UTC start and end."""
        out = []
        t = self.start
        for stage in self.stages:
            out.append((stage, t, t + stage.duration))
            t += stage.duration
        return tuple(out)

    def stage_runs(self) -> StageRuns:
        """The plan as its stage prediction runs it (``kistexp simulate``): the baseline held constant,
        then each change of values in order (a switchback plan: one cycle, baseline -> treatment ->
        control), on the networks of its ``[simulation]`` table."""
        base = _concrete(self.baseline.values)
        out = [StageRun("baseline", base, "baseline", base)]
        if self.switchback is not None:
            t, c = _concrete(self.switchback.treatment), _concrete(self.switchback.control)
            out += [StageRun("baseline", base, "treatment", t), StageRun("treatment", t, "control", c)]
        else:
            prev_name, prev = "baseline", base
            for stage in self.stages:
                vals = _concrete(stage.values)
                out.append(StageRun(prev_name, prev, stage.name, vals))
                prev_name, prev = stage.name, vals
        sim = self.simulation
        return StageRuns(name=self.name, source=self.path, transitions=tuple(out), seeds=sim.seeds,
                         population_scale=sim.population_scale, duration=sim.duration)


def _concrete(values: tuple[tuple[str, ParamValue], ...]) -> tuple[tuple[str, int], ...]:
    # UNSET: the authorities drop the key and tors use their compiled default (a key absent from the run)
    return tuple((k, int(v)) for k, v in values if v != UNSET)
