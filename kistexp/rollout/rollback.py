"""Rollback kinds of consensus parameters (rollout.md §1.7).

Each kind yields the participants' target values, the consensus that follows by the voting
rule, the fewest authorities that must act (``kistexp.dirauth.whatif``), the value tors run
when the key leaves the consensus (tor's compiled default, which depends on the version:
``kistexp.params``) and when 50 % / 99 % of relays and clients run it
(``kistexp.dirauth.propagation``).
"""

from __future__ import annotations

import datetime as dt

import attrs

from kistexp import jsonout
from kistexp import params as tor_params
from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.dirauth.whatif import solve_target
from kistexp.params import parse_version_range
from kistexp.plan.model import UNSET
from kistexp.rollout.spec import RolloutSpec, Values
from kistexp.rollout.state import ABORT_TO_BASELINE, HOLD, REMOVE_PARAM, REVERT_DEFAULT, STEP_BACK


def target_values(spec: RolloutSpec, kind: str, current: Values, stage: int) -> Values:
    """The set the participants vote after a rollback of ``kind`` from ``stage``."""
    if spec.kind == "switchback" and kind in (HOLD, STEP_BACK):
        # rollout.md §1.6: a switchback's hold or step-back stops the alternation on its control values
        return spec.values_of(spec.control_period(stage))
    if kind == HOLD:
        return current
    if kind == STEP_BACK:
        return spec.values_of(max(0, stage - 1))
    if kind in (REVERT_DEFAULT, ABORT_TO_BASELINE):
        # the baseline's values; a parameter the baseline leaves unset is removed (§1.7)
        base = dict(spec.baseline_values)
        return tuple((k, base.get(k, UNSET)) for k in spec.parameters)
    if kind == REMOVE_PARAM:
        return tuple((k, UNSET) for k in spec.parameters)
    raise ValueError(f"unknown rollback kind {kind!r}")


@attrs.frozen
class CompiledDefault:
    versions: str
    value: int


@attrs.frozen
class ParamOutcome:
    param: str
    consensus_before: int | None
    consensus_after: int | None  # None: absent, each tor runs its compiled default
    compiled_defaults: tuple[CompiledDefault, ...]  # what tors run when absent, by version


# `rollback --dry-run --json`, a dry run's rollbacks: each param's consensus value and compiled defaults by name
@jsonout.shape(rename={"must_act": "authorities_must_act", "deadline": "act_before", "relays_50": "relays_50pct",
                       "relays_99": "relays_99pct", "clients_50": "clients_50pct", "clients_99": "clients_99pct"},
               omit=("params",),
               derived={"consensus": lambda r: {p.param: p.consensus_after for p in r.params},
                        "compiled_defaults": lambda r: {p.param: p.compiled_defaults for p in r.params}},
               order=("kind", "from_stage", "targets", "consensus", "compiled_defaults"))
@attrs.frozen
class RollbackPlan:
    kind: str
    from_stage: int
    targets: Values
    params: tuple[ParamOutcome, ...]
    must_act: tuple[str, ...]  # the minimal set of authorities that must change their vote
    possible: bool
    valid_after: dt.datetime  # earliest consensus that can carry it
    deadline: dt.datetime  # act before this
    relays_50: dt.datetime
    relays_99: dt.datetime
    clients_50: dt.datetime
    clients_99: dt.datetime
    note: str


def compiled_defaults(spec: RolloutSpec, param: str) -> tuple[CompiledDefault, ...]:
    entry = tor_params.get(param)
    if entry is None:
        return ()
    try:
        versions = parse_version_range(spec.tor_versions)
    except ValueError:
        return tuple(CompiledDefault(str(b.versions), b.default) for b in entry.bounds)
    return tuple(CompiledDefault(str(b.versions), b.default) for b in entry.bounds_in(versions))


def eta(spec: RolloutSpec, valid_after: dt.datetime, fraction: float, population: NodeClass) -> dt.datetime:
    """When ``fraction`` of ``population`` holds consensus ``valid_after`` (§2.3), in run time."""
    model = PropagationModel(schedule=spec.cadence.schedule())
    seconds = model.time_until(fraction, population) * spec.cadence.interval_s / model.interval_s
    return valid_after + dt.timedelta(seconds=round(seconds))


def plan_rollback(spec: RolloutSpec, kind: str, current: Values, stage: int, now: dt.datetime,
                  unreachable: tuple[str, ...] = ()) -> RollbackPlan:
    targets = target_values(spec, kind, current, stage)
    n = len(spec.authorities)
    votes_now = spec.votes_for(current)
    before = spec.expected_consensus(current)
    after = spec.expected_consensus(targets)
    outcomes, acting, possible = [], set(), True
    for param in spec.parameters:
        solved = solve_target(votes_now, n, param, after[param],
                              frozen=[a for a in unreachable if a in spec.authorities])
        possible &= solved.possible
        acting.update(c.authority for c in solved.changes)
        outcomes.append(ParamOutcome(param, before[param], after[param], compiled_defaults(spec, param)))
    va = spec.cadence.next_feasible_va(now)
    notes = []
    for o in outcomes:
        if o.consensus_after is None and o.compiled_defaults:
            values = sorted({d.value for d in o.compiled_defaults})
            words = ", ".join(f"{d.value} for tor {d.versions}" for d in o.compiled_defaults)
            mixed = "; mixed versions run mixed values" if len(values) > 1 else ""
            notes.append(f"{o.param} leaves the consensus: tors run their compiled default ({words}){mixed}")
    if kind == HOLD and targets == current:
        notes.append("no change on the network: exposure continues, the stage clock stops")
    notes.append("a relay with a non-zero torrc value never reads the consensus; no rollback reaches it")
    return RollbackPlan(
        kind=kind, from_stage=stage, targets=targets, params=tuple(outcomes),
        must_act=tuple(a for a in spec.authorities if a in acting), possible=possible,
        valid_after=va, deadline=spec.cadence.deadline(va),
        relays_50=eta(spec, va, 0.5, NodeClass.CACHE), relays_99=eta(spec, va, 0.99, NodeClass.CACHE),
        clients_50=eta(spec, va, 0.5, NodeClass.CLIENT), clients_99=eta(spec, va, 0.99, NodeClass.CLIENT),
        note="; ".join(notes),
    )


def with_health(plan: dict, spec: RolloutSpec, current: Values, stage: int, now: dt.datetime,
                down: dict[str, dt.datetime], fmt: str = "%Y-%m-%d %H:%M") -> dict:
    """``plan`` (a ``RollbackPlan`` as ``jsonout.to_json`` writes it) with what the authorities' health adds,
    as new keys only: ``authorities_down`` (each authority it names that served no vote in the last round seen, with
    the round it has been down since) and, when one of them is, ``without_down``: the authorities
    that must act if the down ones cannot be changed (they vote what they have when they return)."""
    named = {a: down[a] for a in plan["authorities_must_act"] if a in down}
    out = {**plan, "authorities_down": jsonout.to_json(named)}
    out["authorities_must_act_marked"] = [f"{a} (down since {named[a]:{fmt}})" if a in named else a
                                          for a in plan["authorities_must_act"]]
    if named:
        alt = plan_rollback(spec, plan["kind"], current, stage, now, unreachable=tuple(down))
        out["without_down"] = {"authorities_must_act": list(alt.must_act), "possible": alt.possible}
    return out
