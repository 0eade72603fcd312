"""The rollout's spec: what the plan asks for, laid on a voting cadence (rollout.md §0, §2).

A ``RolloutSpec`` is derived from a ``Plan`` once and never changes while a run lasts
(an edit is a new spec, refused until acknowledged, §3.8). It fixes the time base (the plan's
start, or a rebased start for an accelerated run, and the scale: one plan hour = ``hour_s``
seconds), the voting cadence of the authorities, every stage's values and the per-criterion
limits of the verdict aggregation (§1.3).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math

import attrs

from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.dirauth.schedule import (
    AcceleratedSchedule,
    RoundTimes,
    VotingSchedule,
    first_valid_after_voting_from,
    start_of_interval_after,
)
from kistexp.dirauth.voting import Vote, compute_consensus_params
from kistexp.errors import KistexpError
from kistexp.judge.switchback import appendable_cycles
from kistexp.metrics import catalogue
from kistexp.plan.model import DEFAULT_CORRECTION, DEFAULT_ON_INCONCLUSIVE, UNSET, AnonymityCriterion, Criterion, Plan

Values = tuple[tuple[str, "int | str"], ...]  # (param, int or "unset") in plan order

# Argo's defaults (rollout.md §1.3)
FAILURE_LIMIT = 0
CONSECUTIVE_ERROR_LIMIT = 4
CONSECUTIVE_SUCCESS = 1
CONSENSUS_ROUNDS_LIVE = 3  # rounds a transition may miss before PAUSED(not-in-consensus)
CONSENSUS_ROUNDS_INSTRUCTIONS = 24


class RolloutError(KistexpError):
    """A rollout cannot be started, resumed or commanded as asked."""


@attrs.frozen
class Cadence:
    """The authorities' voting rhythm (rollout.md §2.1): interval, effective delays, alignment.

    Covers both tor's ``VotingSchedule`` and the fake authorities' ``AcceleratedSchedule``;
    instants are aware UTC datetimes, POSIX float seconds inside.
    """

    interval_s: float
    vote_s: float
    dist_s: float
    n_valid: int = 3
    offset_s: int = 0
    margin_override_s: float | None = None  # a wider margin for slow hosts driving fast networks

    @classmethod
    def of(cls, schedule: VotingSchedule | AcceleratedSchedule, margin_s: float | None = None) -> Cadence:
        if isinstance(schedule, VotingSchedule):
            vote, dist = schedule.effective_delays_s
            return cls(schedule.interval_s, vote, dist, schedule.n_intervals_valid, schedule.start_offset_s,
                       margin_s)
        return cls(schedule.interval_s, schedule.vote_delay_s, schedule.dist_delay_s, schedule.n_intervals_valid,
                   0, margin_s)

    @property
    def lead_s(self) -> float:
        """Vote + Dist: a reload must come before VA - lead to reach the consensus of VA."""
        return self.vote_s + self.dist_s

    @property
    def margin_s(self) -> float:
        """Engine deadline margin: 120 s live, min(120 s, interval/20) in fast networks (§2.1)."""
        if self.margin_override_s is not None:
            return self.margin_override_s
        return min(120.0, self.interval_s / 20)

    @property
    def check_delay_s(self) -> float:
        """δ after voting_starts / VA before checking (30 s / 60 s live, 1 s test; §2.4)."""
        return 60.0 if self.interval_s >= 3600 else min(1.0, self.interval_s / 10)

    def round(self, va: dt.datetime) -> RoundTimes:
        return RoundTimes.compute(va.timestamp(), self.interval_s, self.vote_s, self.dist_s, self.n_valid)

    def next_va(self, t: dt.datetime) -> dt.datetime:
        """The first interval start strictly after ``t``."""
        return _utc(start_of_interval_after(t.timestamp(), int(self.interval_s), self.offset_s))

    def va_at_or_after(self, t: dt.datetime) -> dt.datetime:
        return _utc(start_of_interval_after(math.ceil(t.timestamp()) - 1, int(self.interval_s), self.offset_s))

    def deadline(self, va: dt.datetime) -> dt.datetime:
        """The engine's last instant to act for consensus ``va``."""
        return va - dt.timedelta(seconds=self.lead_s + self.margin_s)

    def window_opens(self, va: dt.datetime) -> dt.datetime:
        """A reload before the previous round's vote lands an interval early (§2.1)."""
        return va - dt.timedelta(seconds=self.interval_s + self.lead_s)

    def next_feasible_va(self, now: dt.datetime) -> dt.datetime:
        """The first consensus a change decided ``now`` can still reach."""
        return _utc(first_valid_after_voting_from(now.timestamp() + self.margin_s, int(self.interval_s),
                                                  self.lead_s, self.offset_s))

    def schedule(self) -> VotingSchedule:
        """The hourly-equivalent ``VotingSchedule`` for the propagation model."""
        if self.interval_s >= 300 and float(self.interval_s).is_integer():
            return VotingSchedule(int(self.interval_s), max(2, int(self.vote_s)), max(2, int(self.dist_s)),
                                  self.n_valid, lenient=True)
        return VotingSchedule(3600, 300, 300, self.n_valid)


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


LIVE_CADENCE = Cadence.of(VotingSchedule())


@attrs.frozen
class RolloutCriterion:
    """A plan criterion as the rollout aggregates its looks: its name and the limits of §1.3 (what the
    judge itself is asked is ``kistexp.judge.CriterionSpec``)."""

    name: str
    base: Criterion
    failure_limit: int = FAILURE_LIMIT
    consecutive_error_limit: int = CONSECUTIVE_ERROR_LIMIT
    consecutive_success: int = CONSECUTIVE_SUCCESS
    shadow: bool = False  # dry_run = true: journaled, never aggregated (§1.3)
    on_error: str = "hold"
    max_extension: dt.timedelta | None = None  # in run time, like the stages; None: the stage's own length

    metric = property(lambda self: self.base.metric)
    role = property(lambda self: getattr(self.base, "role", "guardrail"))
    on_inconclusive = property(lambda self: getattr(self.base, "on_inconclusive", DEFAULT_ON_INCONCLUSIVE))
    statistic = property(lambda self: self.base.statistic)
    comparison = property(lambda self: self.base.comparison)
    threshold = property(lambda self: self.base.threshold)
    min_samples = property(lambda self: self.base.min_samples)
    on_fail = property(lambda self: self.base.on_fail)


@attrs.frozen
class RolloutAnonymity:
    """An anonymity criterion as the rollout takes it: judged once per stage from the predictions, when the
    stage is about to be entered and before its values are voted in (docs/rollouts.md "Anonymity criteria")."""

    name: str
    base: AnonymityCriterion
    shadow: bool = False

    measure = property(lambda self: self.base.measure)
    comparison = property(lambda self: self.base.comparison)
    threshold = property(lambda self: self.base.threshold)
    margin = property(lambda self: self.base.margin)
    on_fail = property(lambda self: self.base.on_fail)
    role = property(lambda self: self.base.role)
    on_inconclusive = property(lambda self: self.base.on_inconclusive)


@attrs.frozen
class StageSpec:
    index: int  # 1-based
    name: str
    values: Values
    duration: dt.timedelta  # already scaled
    gate: str


@attrs.frozen
class RolloutSpec:
    plan_name: str
    kind: str  # staged | switchback
    parameters: tuple[str, ...]
    baseline_start: dt.datetime
    baseline_duration: dt.timedelta
    baseline_values: Values
    stages: tuple[StageSpec, ...]
    criteria: tuple[RolloutCriterion, ...]
    authorities: tuple[str, ...]  # configured nicknames
    participating: tuple[str, ...]
    others: str
    cadence: Cadence
    hour: dt.timedelta  # one plan hour in run time
    washout: dt.timedelta
    tor_versions: str
    consensus_rounds: int = CONSENSUS_ROUNDS_LIVE
    # a switchback's periods past the planned ones, appended a cycle at a time while its analysis is
    # undecided (rollout.md §1.6): cycles/2 cycles at most
    appendable: tuple[StageSpec, ...] = ()
    burnout: dt.timedelta = dt.timedelta(0)  # a switchback's samples dropped before each switch
    correction: str = DEFAULT_CORRECTION  # how a stage's criteria share the FAIL error (docs/judge.md)
    # anonymity criteria: judged from the predictions at each stage's entry, never collected
    anonymity: tuple[RolloutAnonymity, ...] = ()

    @property
    def start(self) -> dt.datetime:
        return self.baseline_start + self.baseline_duration

    @property
    def n_stages(self) -> int:
        """The planned stages (a switchback's planned periods); ``last_stage`` counts appendable ones too."""
        return len(self.stages)

    @property
    def last_stage(self) -> int:
        return len(self.stages) + len(self.appendable)

    @property
    def max_appended_cycles(self) -> int:
        return len(self.appendable) // 2

    def stage(self, i: int) -> StageSpec:
        return self.stages[i - 1] if i <= len(self.stages) else self.appendable[i - len(self.stages) - 1]

    def cycle_end(self, i: int) -> bool:
        """Stage ``i`` is a switchback's control period: the end of a cycle, where its analysis looks."""
        return self.kind == "switchback" and 1 <= i <= self.last_stage and self.stage(i).name.startswith("control")

    def control_period(self, i: int) -> int:
        """The control period of stage ``i``'s cycle: ``i`` itself, or the period after a treatment one."""
        return i if i == 0 or self.cycle_end(i) else i + 1

    def may_end(self, i: int) -> bool:
        """Whether the run may complete after stage ``i``: a staged plan's last stage; a switchback's planned
        end or the end of an appended cycle (§1.6)."""
        return i >= self.n_stages and (self.kind != "switchback" or self.cycle_end(i))

    def values_of(self, i: int) -> Values:
        return self.baseline_values if i == 0 else self.stage(i).values

    def criterion(self, name: str) -> RolloutCriterion:
        for c in self.criteria:
            if c.name == name:
                return c
        raise RolloutError(f"no criterion named {name!r}")

    def max_extensions(self, i: int) -> int:
        """Default: the stage may grow to double its length, one hour at a time (§1.3)."""
        duration = self.baseline_duration if i == 0 else self.stage(i).duration
        return max(1, round(duration / self.hour))

    def extensions_for(self, i: int, c: RolloutCriterion) -> int:
        """Hourly extensions stage ``i`` may take for criterion ``c``: its ``max_extension``, else the
        stage's own length (§1.3)."""
        if c.max_extension is None:
            return self.max_extensions(i)
        return max(0, math.floor(c.max_extension / self.hour + 1e-9))

    def others_vote(self) -> dict[str, int]:
        """What the non-participating authorities list: the baseline's values, or nothing."""
        if self.others != "listing":
            return {}
        return {k: v for k, v in self.baseline_values if v != UNSET}

    def votes_for(self, values: Values, participants: tuple[str, ...] | None = None) -> list[Vote]:
        acting = set(self.participating if participants is None else participants)
        mine = {k: v for k, v in values if v != UNSET}
        rest = self.others_vote()
        return [Vote(a, mine if a in acting else rest) for a in self.authorities]

    def expected_consensus(self, values: Values) -> dict[str, int | None]:
        """The consensus value of each plan parameter once the participants vote ``values`` (§1.7)."""
        return dict(_expected(self, tuple(values)))

    def canonical(self) -> str:
        # a plan without anonymity criteria keeps the digest it had before they existed (journals pin it)
        return json.dumps(attrs.asdict(self, value_serializer=json_value, filter=_canonical_field), sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()


@functools.lru_cache(maxsize=256)
def _expected(spec: RolloutSpec, values: Values) -> tuple[tuple[str, int | None], ...]:
    # asked for every collection window of a dry run: the rule over nine votes costs ~0.3 ms
    params = dict(compute_consensus_params(spec.votes_for(values), len(spec.authorities)))
    return tuple((k, params.get(k)) for k in spec.parameters)


def _canonical_field(field: attrs.Attribute, value: object) -> bool:
    # a plan without anonymity criteria keeps the digest it had before they existed (journals pin it)
    return field.name != "anonymity" or bool(value)


def json_value(_inst, _field, value):
    """attrs value serializer: datetimes as ISO text, durations as seconds."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def washout_for(criteria: tuple[RolloutCriterion, ...], cadence: Cadence) -> dt.timedelta:
    """Time until 99 % of the criteria's populations run a new consensus, in whole cadence
    intervals (§2.3: ≥ 35 min for relay metrics, ≥ 2 h for client metrics live)."""
    model = PropagationModel(schedule=cadence.schedule())
    pops = {catalogue.get(c.metric).population for c in criteria if catalogue.get(c.metric)}
    klass = NodeClass.CLIENT if "clients" in pops else NodeClass.CACHE
    seconds = model.time_until(0.99, klass) * cadence.interval_s / model.interval_s
    return dt.timedelta(seconds=math.ceil(seconds / cadence.interval_s) * cadence.interval_s)


def spec_from_plan(plan: Plan, cadence: Cadence = LIVE_CADENCE, *, start: dt.datetime | None = None,
                   consensus_rounds: int = CONSENSUS_ROUNDS_LIVE) -> RolloutSpec:
    """Lay ``plan`` on ``cadence``. One plan hour lasts one voting interval, so an accelerated
    network (10 s rounds) runs the plan 360 times faster; ``start`` rebases the stages' start
    (default: the plan's) and is moved to the next interval boundary."""
    scale = cadence.interval_s / 3600.0
    stage_start = plan.start if start is None else start
    stage_start = cadence.va_at_or_after(stage_start)
    criteria = tuple(
        RolloutCriterion(c.name or c.metric, c,
                      failure_limit=getattr(c, "failure_limit", FAILURE_LIMIT),
                      consecutive_error_limit=getattr(c, "consecutive_error_limit", CONSECUTIVE_ERROR_LIMIT),
                      consecutive_success=getattr(c, "consecutive_success", CONSECUTIVE_SUCCESS),
                      shadow=bool(getattr(c, "dry_run", False)),
                      on_error=getattr(c, "on_error", "hold"),
                      max_extension=None if getattr(c, "max_extension", None) is None else c.max_extension * scale)
        for c in plan.criteria)
    anonymity = tuple(RolloutAnonymity(a.label, a) for a in getattr(plan, "anonymity", ()))
    names = [c.name for c in criteria] + [a.name for a in anonymity]
    if len(set(names)) != len(names):
        twice = sorted(n for n in names if names.count(n) > 1)[0]
        raise RolloutError(f"{plan.path}: two criteria share the name {twice!r}")
    stages = tuple(StageSpec(i, s.name, s.values, s.duration * scale, s.gate)
                   for i, s in enumerate(plan.stages, start=1))
    appendable: tuple[StageSpec, ...] = ()
    sb = plan.switchback
    if sb is not None:
        # named and ordered as the loader expands the planned cycles: treatment-8, control-8, ...
        first = sb.cycles + 1
        appendable = tuple(
            StageSpec(len(stages) + 2 * (c - first) + j + 1, f"{arm}-{c}", values, sb.period * scale, sb.gate)
            for c in range(first, first + appendable_cycles(sb.cycles))
            for j, (arm, values) in enumerate((("treatment", sb.treatment), ("control", sb.control))))
    washout = (plan.switchback.washout * scale if plan.switchback is not None
               else washout_for(criteria, cadence))
    return RolloutSpec(
        plan_name=plan.name, kind=plan.kind, parameters=plan.parameters,
        baseline_start=stage_start - plan.baseline.duration * scale,
        baseline_duration=plan.baseline.duration * scale,
        baseline_values=plan.baseline.values,
        stages=stages, criteria=criteria,
        authorities=tuple(a.nickname for a in plan.authorities.authorities),
        participating=plan.authorities.participating, others=plan.authorities.others,
        cadence=cadence, hour=dt.timedelta(seconds=cadence.interval_s), washout=washout,
        tor_versions=plan.tor_versions_text, consensus_rounds=consensus_rounds,
        appendable=appendable, burnout=sb.burnout * scale if sb is not None else dt.timedelta(0),
        correction=getattr(plan, "correction", DEFAULT_CORRECTION), anonymity=anonymity,
    )
