"""The rollout state machine as one pure function: ``step(spec, status, event) -> Outcome``
(rollout.md §1.3 - §1.5).

No clock, no I/O: the engine journals the event, calls ``step``, journals the new status and
carries out the transition. Replaying the journal's events through ``step`` rebuilds the status.
"""

from __future__ import annotations

import datetime as dt
import math

import attrs

from kistexp.metrics import catalogue
from kistexp.rollout.rollback import target_values
from kistexp.rollout.spec import RolloutCriterion, RolloutSpec, Values
from kistexp.rollout.state import (
    ABORT_TO_BASELINE,
    ABORTED,
    BASELINE,
    COMPLETED,
    ERROR,
    FAIL,
    HOLD,
    INCONCLUSIVE,
    MEASURING,
    OPERATOR_REASONS,
    PASS,
    PAUSED,
    PENDING,
    ROLLBACK_KINDS,
    ROLLING_BACK,
    SEVERITY,
    STEP_BACK,
    TRANSITIONING,
    WASHOUT,
    Command,
    ConsensusCheck,
    Counters,
    DecisionDue,
    Drift,
    Evaluate,
    Event,
    MachineVerdict,
    Outcome,
    PlanChanged,
    Start,
    Status,
    Transition,
    WashoutEnd,
)

# rounds without any consensus allowed, as a multiple of the K rounds a published consensus may lack the values
MISSING_ROUNDS_FACTOR = 3
SIGNAL = "signal"  # a criterion's role, and the pause reason its failure gives
PROMOTABLE_REASONS = frozenset({"gate", "inconclusive", "criterion-hold", SIGNAL, "stepped-back"})
EXTEND = "extend"  # on_inconclusive: grow the stage hour by hour, up to max_extension
ADVANCE = "advance"  # on_inconclusive: extend while it can decide, then go on if the estimate is within the limit
UNDECIDED = "undecided"  # the judge's reason for an INCONCLUSIVE whose interval straddles the limit


def initial_status(spec: RolloutSpec) -> Status:
    return Status(values=spec.baseline_values)


def mismatched(spec: RolloutSpec, values: Values, params: tuple[tuple[str, int], ...] | None) -> list[str]:
    """Plan parameters whose consensus value differs from what ``values`` should produce."""
    if params is None:
        return list(spec.parameters)
    seen = dict(params)
    want = spec.expected_consensus(values)
    return [k for k in spec.parameters if seen.get(k) != want[k]]


def _transition(spec: RolloutSpec, st: Status, values: Values, va: dt.datetime, cause: str, kind: str,
                **changes) -> Outcome:
    seq = st.seq + 1
    new = attrs.evolve(st, values=values, target_va=va, rounds_waited=0, rounds_missing=0, seq=seq, **changes)
    return Outcome(new, Transition(seq, values, va, cause, kind), cause,
                   decision=f"{kind}:{changes.get('rollback_kind') or new.stage}")


def _enter_stage(spec: RolloutSpec, st: Status, i: int, now: dt.datetime, cause: str, kind: str = "stage",
                 **changes) -> Outcome:
    va = spec.cadence.next_feasible_va(now)
    return _transition(spec, st, spec.values_of(i), va, cause, kind, state=TRANSITIONING, stage=i,
                       reasons=frozenset(), rollback_kind="", resume_to="", **changes)


def _rollback(spec: RolloutSpec, st: Status, kind: str, now: dt.datetime, cause: str) -> Outcome:
    if spec.kind == "switchback" and kind in (HOLD, STEP_BACK):
        return _stop_alternation(spec, st, kind, now, cause)
    if kind == HOLD:
        reasons = st.reasons | {"criterion-hold"}
        new = attrs.evolve(st, state=PAUSED, reasons=reasons, resume_to=st.resume_to or st.state)
        return Outcome(new, None, cause, decision="rollback:hold")
    stage = st.from_stage if st.state == ROLLING_BACK else st.stage
    values = target_values(spec, kind, st.values, stage)
    va = spec.cadence.next_feasible_va(now)
    return _transition(spec, st, values, va, cause, "rollback", state=ROLLING_BACK, rollback_kind=kind,
                       from_stage=stage, resume_to="")


def _fresh(st: Status) -> Status:
    return attrs.evolve(st, counters=(), extensions=0, promoted=False)


# --- switchbacks (rollout.md §1.6) ------------------------------------------------------------------


def _stop_alternation(spec: RolloutSpec, st: Status, kind: str, now: dt.datetime, cause: str) -> Outcome:
    """A switchback's hold or step-back stops the alternation on the control values (§1.6): the control
    period is the comparison's own reference, and stepping back to the previous period would as often
    bring the treatment back. Already on them, the run pauses where it is; on the treatment's, the
    control values are voted first and it pauses once they are in the consensus (``_stopped``)."""
    stage = st.from_stage if st.state == ROLLING_BACK else st.stage
    values = target_values(spec, kind, st.values, stage)
    if values == st.values and st.state != ROLLING_BACK:
        reason = "criterion-hold" if kind == HOLD else "stepped-back"
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {reason}, resume_to=st.resume_to or st.state)
        return Outcome(new, None, f"{cause}: alternation stops on the control values in force",
                       decision="rollback:hold")  # nothing changes on the network, as a staged hold
    va = spec.cadence.next_feasible_va(now)
    return _transition(spec, st, values, va, f"{cause}: alternation stops on the control values", "rollback",
                       state=ROLLING_BACK, rollback_kind=kind, from_stage=stage, resume_to="")


def _stopped(spec: RolloutSpec, st: Status, va: dt.datetime) -> Outcome:
    """The control values of a stopped switchback are in the consensus: paused in that cycle's control
    period, which is measured as any (``promote`` goes on alternating, ``abort`` ends the run)."""
    control = spec.control_period(st.from_stage)
    reason = "criterion-hold" if st.rollback_kind == HOLD else "stepped-back"
    new = _fresh(attrs.evolve(st, state=PAUSED, stage=control, stage_va=va, target_va=None,
                              reasons=(st.reasons & OPERATOR_REASONS) | {reason}, resume_to=MEASURING))
    return Outcome(new, None, f"alternation stopped on the control values ({spec.stage(control).name}) from "
                   f"{va:%Y-%m-%d %H:%M}", decision=f"stopped:{st.rollback_kind}")


def _switchback_end(spec: RolloutSpec, st: Status, ev: DecisionDue, ok: bool, missing: list[str]) -> Outcome:
    """The end of a switchback period. Alternation is pre-approved exposure: a period is followed by the
    next one unless a criterion's latest verdict is a FAIL. From the planned end on, a cycle's end rests
    on the period-against-period analysis the engine made at this instant (its verdicts are the latest):
    PASS from every criterion completes the run; anything else appends one cycle, up to cycles/2, and
    then pauses (inconclusive). The last period is a control one, so a pause leaves the control values
    in force: no likely regression stays on the network while an operator decides."""
    if not spec.may_end(st.stage):
        failing = [m for m in missing if m.endswith(FAIL)]
        if failing and not st.promoted:
            return _hold(spec, st, ev, failing)
        return _next_stage(spec, st, ev.at, "promoted" if st.promoted else "the period is over", ahead=ev.ahead)
    if ok or st.promoted:
        return _next_stage(spec, st, ev.at, "every criterion passed" if ok else "promoted", ahead=ev.ahead)
    appended = (st.stage - spec.n_stages) // 2
    undecided = "; ".join(missing)
    if appended >= spec.max_appended_cycles:
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {INCONCLUSIVE}, resume_to=st.state)
        return Outcome(new, None, f"still inconclusive after {appended} appended cycle(s), the most the plan's "
                       f"{spec.n_stages // 2} cycles allow: {undecided}", decision="pause:inconclusive")
    # appending is the plan's own rule (cycles/2), so the appended treatment period does not wait at a gate
    nxt = st.stage + 1
    out = _enter_stage(spec, st, nxt, ev.at, f"cycle appended: {appended + 1} of {spec.max_appended_cycles} "
                       f"({spec.stage(nxt).name}, {spec.stage(nxt + 1).name}): {undecided}")
    return attrs.evolve(out, decision=f"cycle-appended:{appended + 1}")


def step(spec: RolloutSpec, st: Status, ev: Event) -> Outcome:
    if isinstance(ev, Command):
        return _command(spec, st, ev)
    if st.terminal:
        return Outcome(st)
    if isinstance(ev, PlanChanged):
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"plan-changed"},
                           resume_to=st.resume_to if st.state == PAUSED else st.state)
        return Outcome(new, None, f"plan changed: {ev.diff}", decision="pause:plan-changed")
    if isinstance(ev, Drift):
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"drift"},
                           resume_to=st.resume_to if st.state == PAUSED else st.state)
        return Outcome(new, None, f"drift: {ev.detail}", decision="pause:drift")
    if isinstance(ev, Start):
        if st.state != PENDING:
            return Outcome(st)
        va = spec.cadence.va_at_or_after(spec.start)
        return Outcome(attrs.evolve(st, state=BASELINE, decision_at=spec.cadence.deadline(va)),
                       message="baseline starts", decision="baseline")
    if isinstance(ev, ConsensusCheck):
        return _consensus(spec, st, ev)
    if isinstance(ev, WashoutEnd):
        if st.state == WASHOUT and ev.stage == st.stage:
            return Outcome(attrs.evolve(st, state=MEASURING), message=f"stage {st.stage}: measuring")
        if st.state == PAUSED and st.resume_to == WASHOUT and ev.stage == st.stage:
            return Outcome(attrs.evolve(st, resume_to=MEASURING))
        return Outcome(st)
    if isinstance(ev, Evaluate):
        return _evaluate(spec, st, ev)
    if isinstance(ev, DecisionDue):
        return _decide(spec, st, ev)
    raise TypeError(f"unknown event {ev!r}")


def _consensus(spec: RolloutSpec, st: Status, ev: ConsensusCheck) -> Outcome:
    if st.state == BASELINE or (st.state == PAUSED and st.resume_to == BASELINE):
        if not spec.baseline_values:
            return Outcome(st)
        off = mismatched(spec, spec.baseline_values, ev.params)
        if off and ev.params is not None:
            seen = dict(ev.params)
            words = ", ".join(f"{k}={seen.get(k, 'absent')}" for k in off)
            new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"drift"},
                               resume_to=st.resume_to or BASELINE)
            return Outcome(new, None, f"consensus {ev.valid_after:%Y-%m-%d %H:%M} has {words}, "
                           "not the baseline's values", decision="pause:drift")
        return Outcome(st)
    pending = st.state in (TRANSITIONING, ROLLING_BACK) or (
        st.state == PAUSED and st.resume_to in (TRANSITIONING, ROLLING_BACK))
    if not pending or st.target_va is None or ev.valid_after != st.target_va:
        return Outcome(st)
    was = st.resume_to if st.state == PAUSED else st.state
    off = mismatched(spec, st.values, ev.params)
    if not off:
        return _arrived(spec, st, was, ev.valid_after)
    # a round whose consensus was never published (the authorities, or the run driving
    # embedded ones, were down) is not one that refused the values: it is counted apart,
    # with a longer limit, so an outage pauses too but a restart does not use up the K rounds;
    # a round checked only after the next one began (after a restart) is not counted at all
    missing = ev.params is None
    unknown = missing and ev.late  # not seen because it was looked for too late: counts as neither
    rounds = st.rounds_waited + (0 if missing else 1)
    absent = st.rounds_missing + (1 if missing and not unknown else 0)
    who = f"; laggards: {', '.join(ev.laggards)}" if ev.laggards else ""
    if rounds >= spec.consensus_rounds or absent >= MISSING_ROUNDS_FACTOR * spec.consensus_rounds:
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"not-in-consensus"}, resume_to=was,
                           rounds_waited=rounds, rounds_missing=absent)
        why = (f"{rounds} consensuses without {', '.join(off)} as planned" if rounds >= spec.consensus_rounds
               else f"no consensus published for {absent} rounds (last awaited {ev.valid_after:%Y-%m-%d %H:%M:%S})")
        return Outcome(new, None, why + who, decision="pause:not-in-consensus")
    # the next round, or (a check made late, after a restart) the first one still feasible
    va = max(st.target_va + dt.timedelta(seconds=spec.cadence.interval_s), spec.cadence.next_feasible_va(ev.at))
    seq = st.seq + 1
    new = attrs.evolve(st, target_va=va, rounds_waited=rounds, rounds_missing=absent, seq=seq)
    lack = ("could not be checked in time" if unknown else "was not published" if missing
            else f"lacks {', '.join(off)}")
    return Outcome(new, Transition(seq, st.values, va, f"consensus {ev.valid_after:%H:%M:%S} {lack}: "
                                   f"act again for {va:%H:%M:%S}", "reassert"),
                   decision="reassert")


def _arrived(spec: RolloutSpec, st: Status, was: str, va: dt.datetime) -> Outcome:
    manual = st.reasons & OPERATOR_REASONS
    if was == ROLLING_BACK:
        if spec.kind == "switchback" and st.rollback_kind in (HOLD, STEP_BACK):
            return _stopped(spec, st, va)
        if st.rollback_kind == STEP_BACK:
            back = max(0, st.from_stage - 1)
            new = _fresh(attrs.evolve(st, state=PAUSED, stage=back, stage_va=va, target_va=None,
                                      reasons=manual | {"stepped-back"}, resume_to=MEASURING if back else BASELINE))
            return Outcome(new, None, f"stepped back to {'baseline' if not back else f'stage {back}'}",
                           decision="stepped-back")
        new = attrs.evolve(st, state=ABORTED, target_va=None, stage_va=va, aborted_stage=st.from_stage,
                           reasons=frozenset())
        return Outcome(new, None, f"aborted: network back at {dict(st.values)} from {va:%Y-%m-%d %H:%M}",
                       decision="aborted")
    if st.stage == 0:
        decision = spec.cadence.deadline(spec.cadence.va_at_or_after(va + spec.baseline_duration))
        new = _fresh(attrs.evolve(st, state=BASELINE, stage_va=va, target_va=None, decision_at=decision))
        return Outcome(new, None, "back at the baseline", decision="baseline")
    end = va + spec.stage(st.stage).duration
    decision = spec.cadence.deadline(spec.cadence.va_at_or_after(end))
    if st.fast:
        decision = spec.cadence.deadline(spec.cadence.next_feasible_va(va))
    state = PAUSED if manual else WASHOUT
    new = _fresh(attrs.evolve(st, state=state, stage_va=va, target_va=None, decision_at=decision,
                              resume_to=WASHOUT if manual else "", reasons=manual, promoted=st.fast, fast=False))
    return Outcome(new, None, f"stage {st.stage} in consensus {va:%Y-%m-%d %H:%M}", decision=f"in-consensus:{st.stage}")


def _count(c: Counters, outcome: str) -> Counters:
    if outcome == PASS:
        return attrs.evolve(c, consecutive_success=c.consecutive_success + 1, consecutive_error=0, latest=PASS)
    if outcome == FAIL:
        return attrs.evolve(c, failed=c.failed + 1, consecutive_success=0, consecutive_error=0, latest=FAIL)
    if outcome == INCONCLUSIVE:
        return attrs.evolve(c, inconclusive=c.inconclusive + 1, consecutive_success=0, consecutive_error=0,
                            latest=INCONCLUSIVE)
    return attrs.evolve(c, consecutive_error=c.consecutive_error + 1, consecutive_success=0, latest=ERROR)


def _evaluate(spec: RolloutSpec, st: Status, ev: Evaluate) -> Outcome:
    measuring = st.state == MEASURING or (st.state == PAUSED and st.resume_to == MEASURING)
    if not measuring or st.stage == 0:
        return Outcome(st)
    new = st
    fails: list[tuple[int, int, str, str]] = []
    errors: list[str] = []
    signals: list[str] = []
    order = {c.name: n for n, c in enumerate(spec.criteria)}
    for v in ev.verdicts:
        crit = spec.criterion(v.criterion)
        c = _count(new.counter(crit.name), v.outcome)
        new = new.with_counter(crit.name, c)
        if crit.shadow:
            continue  # journaled, never aggregated (§1.3)
        if v.outcome == FAIL and c.failed > crit.failure_limit and crit.role == SIGNAL:
            signals.append(crit.name)  # a signal's failure asks an operator; it never rolls back by itself
        elif v.outcome == FAIL and c.failed > crit.failure_limit:
            fails.append((-SEVERITY[crit.on_fail], order[crit.name], crit.on_fail, crit.name))
        if v.outcome == ERROR and c.consecutive_error > crit.consecutive_error_limit:
            if crit.on_error == "rollback":
                fails.append((-SEVERITY[crit.on_fail], order[crit.name], crit.on_fail, crit.name))
            else:
                errors.append(crit.name)
    if fails:
        if "freeze" in st.reasons:
            return Outcome(new, None, f"{fails[0][3]} failed but the rollout is frozen: no rollback",
                           decision="frozen")
        _, _, kind, name = sorted(fails)[0]  # most severe on_fail, ties by plan order
        verdict = next(v for v in ev.verdicts if v.criterion == name)
        cause = f"criterion {name!r} failed ({verdict.detail or 'over its limit'}) -> {kind}"
        return _rollback(spec, new, kind, ev.at, cause)
    if signals and SIGNAL not in new.reasons:  # once paused for a signal, later failures add no decision
        detail = next(v for v in ev.verdicts if v.criterion == signals[0]).detail or "over its limit"
        return _pause(new, SIGNAL, f"signal {', '.join(map(repr, signals))} failed ({detail}): paused for an "
                                   "operator (a signal does not roll back)")
    if errors:
        out = attrs.evolve(new, state=PAUSED, reasons=new.reasons | {"error"},
                           resume_to=new.resume_to if new.state == PAUSED else new.state)
        return Outcome(out, None, f"no data for {', '.join(errors)} past the error limit", decision="pause:error")
    return Outcome(new)


def _all_pass(spec: RolloutSpec, st: Status) -> tuple[bool, list[str]]:
    missing = []
    for c in spec.criteria:
        if c.shadow:
            continue
        k = st.counter(c.name)
        if k.latest != PASS or k.consecutive_success < c.consecutive_success:
            missing.append(f"{c.name}: {k.latest or 'no verdict'}")
    return not missing, missing


def _decide(spec: RolloutSpec, st: Status, ev: DecisionDue) -> Outcome:
    if ev.stage != st.stage:
        return Outcome(st)
    if st.state == BASELINE:
        if ev.short:
            return _hold(spec, st, ev, [f"{n}: too few baseline samples" for n in ev.short])
        return _next_stage(spec, st, ev.at, "baseline complete", ahead=ev.ahead)
    if st.state != MEASURING:
        return Outcome(st)  # paused, washing out, transitioning: no forward motion
    ok, missing = _all_pass(spec, st)
    if spec.kind == "switchback":
        return _switchback_end(spec, st, ev, ok, missing)
    if ok or st.promoted:
        return _next_stage(spec, st, ev.at, "every criterion passed" if ok else "promoted", ahead=ev.ahead)
    return _stage_end(spec, st, ev)


def _hold(spec: RolloutSpec, st: Status, ev: DecisionDue, missing: list[str]) -> Outcome:
    ext = st.extensions + 1
    if ext > spec.max_extensions(st.stage):
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"inconclusive"}, resume_to=st.state,
                           extensions=ext)
        return Outcome(new, None, f"still inconclusive after {ext - 1} extensions: {'; '.join(missing)}",
                       decision="pause:inconclusive")
    new = attrs.evolve(st, extensions=ext, decision_at=st.decision_at + spec.hour)
    return Outcome(new, None, f"hold: {'; '.join(missing)}", decision="hold")


def _pause(st: Status, reason: str, message: str) -> Outcome:
    new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {reason},
                       resume_to=st.resume_to if st.state == PAUSED else st.state)
    return Outcome(new, None, message, decision=f"pause:{reason}")


# --- the end of a stage (docs/rollouts.md "What ends a stage") --------------------------------------


def _stage_end(spec: RolloutSpec, st: Status, ev: DecisionDue) -> Outcome:
    """A stage's decision time without a PASS from every criterion. Each criterion that did not pass says
    what ends the stage, from the judge's look at this instant; a rollback wins over a pause, a pause over
    an extension, and among rollbacks the most severe (ties by plan order), as for simultaneous FAILs."""
    looked = {v.criterion: v for v in ev.verdicts}
    when = "at the stage's end" if not st.extensions else f"after {st.extensions} h of extension"
    rollbacks: list[tuple[int, int, str, str]] = []
    pauses: list[tuple[str, str]] = []
    extend: list[str] = []
    advanced: list[str] = []
    for n, c in enumerate(spec.criteria):
        k = st.counter(c.name)
        if c.shadow or (k.latest == PASS and k.consecutive_success >= c.consecutive_success):
            continue
        v = looked.get(c.name)
        budget = spec.extensions_for(st.stage, c)
        if not _judged(v):
            # missing data (too few samples, stale, an error, exposure short, no look): it never advances,
            # never rolls back and never counts as an estimate beyond the limit; it waits, then asks a person
            what = f"{c.name}: {k.latest or 'no verdict'}" + (f" ({v.reason})" if v is not None and v.reason else "")
            if st.extensions < budget:
                extend.append(what)
            else:
                pauses.append((INCONCLUSIVE, f"still no decision {when}: {what}"))
            continue
        assert v is not None
        interval = f"interval [{_amount(c, v.ci_low)}, {_amount(c, v.ci_high)}]"
        limit = _amount(c, v.bound, limit=True)
        if _beyond(c, v):
            # the likely side of the limit is the failing one: a regression is not left on the network
            # because the interval still straddles it
            head = (f"criterion {c.name!r} failed {when} ({v.detail or 'over its limit'})" if v.outcome == FAIL
                    else f"criterion {c.name!r}: estimate {_amount(c, v.effect)} beyond the limit {limit} {when}, "
                         f"{interval} not conclusive")
            if c.role == SIGNAL:
                pauses.append((SIGNAL, f"{head}: paused for an operator (a signal does not roll back)"))
            else:
                rollbacks.append((-SEVERITY[c.on_fail], n, c.on_fail, f"{head}: {c.on_fail} as on_fail"))
            continue
        head = (f"criterion {c.name!r}: estimate {_amount(c, v.effect)} within the limit {limit} {when}, "
                f"{interval} not conclusive")
        action = c.on_inconclusive
        if action == ADVANCE and (v.limited_by or st.extensions >= budget):
            # the plan chose in advance: once extending cannot help or its budget is spent, an estimate within
            # the limit lets the stage go on (one beyond it rolled back, or paused a signal, above)
            why = (f"the {v.limited_by}'s {_span(spec)} bound the interval" if v.limited_by
                   else "the longest extension its plan allows")
            advanced.append(f"{head}, {why}: advanced as on_inconclusive")
            continue
        if action == ADVANCE:
            action = EXTEND  # extend first, while extending can decide
        if action == EXTEND and v.limited_by:
            pauses.append((INCONCLUSIVE, f"{head}; the {v.limited_by}'s {_span(spec)} bound the interval: "
                                         "extending cannot decide: paused for an operator"))
        elif action == EXTEND and st.extensions >= budget:
            pauses.append((INCONCLUSIVE, f"{head}, the longest extension its plan allows: paused for an operator"))
        elif action == EXTEND:
            extend.append(f"{c.name}: inconclusive, estimate {_amount(c, v.effect)} within the limit {limit}, "
                          f"{interval} (extension {st.extensions + 1} of {budget} h)")
        elif action == HOLD or c.role == SIGNAL:
            # a signal never rolls back by itself: its rollback on_inconclusive pauses too (lint warns)
            pauses.append((INCONCLUSIVE, f"{head}: paused for an operator as on_inconclusive ({action})"))
        else:
            rollbacks.append((-SEVERITY[action], n, action, f"{head}: {action} as on_inconclusive"))
    if rollbacks:
        _, _, kind, cause = sorted(rollbacks)[0]
        return _rollback(spec, st, kind, ev.at, cause)
    if pauses:
        reasons = frozenset(r for r, _ in pauses)
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | reasons, resume_to=st.state)
        return Outcome(new, None, "; ".join(m for _, m in pauses),
                       decision=f"pause:{SIGNAL if SIGNAL in reasons else INCONCLUSIVE}")
    if extend:
        new = attrs.evolve(st, extensions=st.extensions + 1, decision_at=st.decision_at + spec.hour)
        return Outcome(new, None, f"hold: {'; '.join(extend)}", decision="hold")
    return _next_stage(spec, st, ev.at, "; ".join(advanced), ahead=ev.ahead)


def _judged(v: MachineVerdict | None) -> bool:
    """A verdict resting on data: a FAIL, or an INCONCLUSIVE only because its interval straddles the limit."""
    return (v is not None and v.effect is not None and v.bound is not None and math.isfinite(v.effect)
            and (v.outcome == FAIL or (v.outcome == INCONCLUSIVE and v.reason == UNDECIDED)))


def _beyond(c: RolloutCriterion, v: MachineVerdict) -> bool:
    """The point estimate is on the failing side of the limit."""
    assert v.effect is not None and v.bound is not None
    if c.comparison in ("relative-decrease", "absolute-decrease", "below"):
        return v.effect < v.bound
    return v.effect > v.bound


def _amount(c: RolloutCriterion, x: float | None, *, limit: bool = False) -> str:
    """An effect as the plan states its limit: a relative change in % (+17.4 %), else in the metric's
    display unit (a difference signed, a level not)."""
    if x is None or not math.isfinite(x):
        return "unbounded"
    if c.comparison.startswith("relative"):
        pct = (x - 1.0) * 100.0
        return f"{pct:+.3g} %" if limit else f"{pct:+.1f} %"
    unit, factor = catalogue.display(c.metric)
    sign = "" if c.comparison in ("above", "below") else "+"
    return f"{x * factor:{sign}.4g} {unit}".rstrip()


def _span(spec: RolloutSpec) -> str:
    """The baseline's length in plan time: "3 days", "36 h"."""
    hours = round(spec.baseline_duration / spec.hour)
    if hours % 24 == 0:
        return f"{hours // 24} day{'s' if hours != 24 else ''}"
    return f"{hours} h"


def _next_stage(spec: RolloutSpec, st: Status, now: dt.datetime, cause: str, *, full: bool = False,
                ahead: tuple[MachineVerdict, ...] | None = None) -> Outcome:
    nxt = max(spec.n_stages, st.stage + 1) if full else st.stage + 1
    if spec.may_end(st.stage):
        new = attrs.evolve(st, state=COMPLETED, reasons=frozenset(), resume_to="")
        return Outcome(new, None, f"completed: {cause}", decision="complete")
    if ahead is not None and spec.anonymity and not st.promoted and not full:
        # the stage's anonymity criteria, judged on its predictions before its values are voted in
        st, refused, cause = _entry_check(spec, st, now, nxt, ahead, cause)
        out = refused or _next_stage(spec, st, now, cause, full=full)
        return attrs.evolve(out, judged_ahead=nxt)
    if spec.stage(nxt).gate == "manual" and not st.promoted:
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {"gate"}, resume_to=st.state)
        return Outcome(new, None, f"{cause}; stage {nxt} ({spec.stage(nxt).name}) waits for an operator (gate)",
                       decision="pause:gate")
    return _enter_stage(spec, st, nxt, now, f"stage {nxt} ({spec.stage(nxt).name}): {cause}")


# --- anonymity criteria at a stage's entry (docs/rollouts.md "Anonymity criteria") -------------------


def _entry_check(spec: RolloutSpec, st: Status, now: dt.datetime, nxt: int, ahead: tuple[MachineVerdict, ...],
                 cause: str) -> tuple[Status, Outcome | None, str]:
    """Stage ``nxt``'s anonymity criteria, judged on its predicted attack measures before its values are voted
    in (nothing on the live network measures an attack). -> (the status with their counters, the outcome that
    keeps the stage out or None to enter it, the entry's cause). Decided as at a stage's end: a FAIL, or an
    estimate beyond the margin, takes on_fail (a signal pauses); within it, on_inconclusive, where extending
    cannot help (the predictions do not change) so `extend` pauses as `hold` does, and `advance` enters; a
    missing prediction pauses. Before the stage is voted in, `hold` and `step-back` change nothing on the
    network: the stage before it is what step-back returns to, and it is in force."""
    looked = {v.criterion: v for v in ahead}
    where = f"stage {nxt} ({spec.stage(nxt).name})"
    rollbacks: list[tuple[int, int, str, str]] = []
    pauses: list[tuple[str, str]] = []
    advanced: list[str] = []
    for n, c in enumerate(spec.anonymity):
        v = looked.get(c.name) or MachineVerdict(c.name, ERROR, detail="no verdict on the predictions")
        st = st.with_counter(c.name, _count(st.counter(c.name), v.outcome))
        if c.shadow or v.outcome == PASS:
            continue
        head = f"anonymity criterion {c.name!r}: {v.detail}"
        decidable = (v.effect is not None and v.bound is not None and math.isfinite(v.effect)
                     and (v.outcome == FAIL or (v.outcome == INCONCLUSIVE and v.reason == UNDECIDED)))
        if not decidable:
            pauses.append((INCONCLUSIVE, f"{head}: no decision: paused for an operator"))
            continue
        assert v.effect is not None and v.bound is not None
        beyond = v.effect < v.bound if c.comparison == "absolute-decrease" else v.effect > v.bound
        if v.outcome == FAIL or beyond:
            if c.role == SIGNAL:
                pauses.append((SIGNAL, f"{head}: paused for an operator (a signal does not roll back)"))
            else:
                rollbacks.append((-SEVERITY[c.on_fail], n, c.on_fail, f"{head}: {c.on_fail} as on_fail"))
            continue
        action = c.on_inconclusive
        if action == ADVANCE:
            advanced.append(f"{head}: advanced as on_inconclusive")
        elif action in (EXTEND, HOLD) or c.role == SIGNAL:
            pauses.append((INCONCLUSIVE, f"{head}: paused for an operator as on_inconclusive ({action}; more "
                                         "time changes no prediction)"))
        else:
            rollbacks.append((-SEVERITY[action], n, action, f"{head}: {action} as on_inconclusive"))
    refused = (f"{where} not voted in: judged on the predictions before its values are (no network measures an "
               "attack), ")
    if rollbacks:
        _, _, kind, why = sorted(rollbacks)[0]
        if kind in (HOLD, STEP_BACK):
            reason = "criterion-hold" if kind == HOLD else "stepped-back"
            new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | {reason},
                               resume_to=st.resume_to if st.state == PAUSED else st.state)
            here = "baseline" if st.stage == 0 else f"stage {st.stage} ({spec.stage(st.stage).name})"
            return st, Outcome(new, None, f"{refused}{why}; {here} stays in force",
                               decision=f"rollback:{kind}"), cause
        return st, _rollback(spec, st, kind, now, f"{refused}{why}"), cause
    if pauses:
        reasons = frozenset(r for r, _ in pauses)
        new = attrs.evolve(st, state=PAUSED, reasons=st.reasons | reasons,
                           resume_to=st.resume_to if st.state == PAUSED else st.state)
        return st, Outcome(new, None, refused + "; ".join(m for _, m in pauses),
                           decision=f"pause:{SIGNAL if SIGNAL in reasons else INCONCLUSIVE}"), cause
    passed = [c.name for c in spec.anonymity if not c.shadow and looked.get(c.name) is not None
              and looked[c.name].outcome == PASS]
    if passed:
        advanced.insert(0, f"anonymity {_named(passed)} {'passes' if len(passed) == 1 else 'pass'} on the "
                           f"predictions of {where}, judged before its values are voted in")
    return st, None, "; ".join([cause, *advanced])


def _named(names: list[str]) -> str:
    return ("criterion " if len(names) == 1 else "criteria ") + ", ".join(map(repr, names))


# --- operator commands (§1.5) --------------------------------------------------------------------


def _refuse(st: Status, msg: str) -> Outcome:
    return Outcome(st, None, msg, refused=True)


def _command(spec: RolloutSpec, st: Status, ev: Command) -> Outcome:
    kind, now = ev.kind, ev.at
    if kind == "pause":
        if st.terminal:
            return _refuse(st, f"cannot pause: the rollout is {st.state.lower()}")
        reasons = st.reasons | {"manual"} | ({"freeze"} if ev.arg("freeze") else set())
        if st.state in (TRANSITIONING, ROLLING_BACK):
            return Outcome(attrs.evolve(st, reasons=reasons), message="paused; the pending change finishes first",
                           decision="pause:manual")
        resume_to = st.resume_to if st.state == PAUSED else st.state
        warn = " (frozen: automatic rollbacks are suspended too)" if "freeze" in reasons else ""
        return Outcome(attrs.evolve(st, state=PAUSED, reasons=reasons, resume_to=resume_to),
                       message=f"paused{warn}", decision="pause:manual")
    if kind == "resume":
        if not st.reasons & OPERATOR_REASONS:
            return _refuse(st, f"nothing to resume: {st.describe()} was not paused by an operator")
        reasons = st.reasons - OPERATOR_REASONS
        if st.state != PAUSED or reasons:
            left = f"; still held by {', '.join(sorted(reasons))}" if reasons else ""
            return Outcome(attrs.evolve(st, reasons=reasons), message=f"resumed{left}", decision="resume")
        new = attrs.evolve(st, state=st.resume_to or MEASURING, reasons=frozenset(), resume_to="")
        if new.decision_at is not None and new.decision_at < now:
            new = attrs.evolve(new, decision_at=spec.cadence.deadline(spec.cadence.next_feasible_va(now)))
        return Outcome(new, message=f"resumed: {new.describe()}", decision="resume")
    if kind == "promote":
        measuring_pause = st.state == PAUSED and st.reasons and st.reasons <= PROMOTABLE_REASONS
        if not (st.state == MEASURING or measuring_pause):
            return _refuse(st, f"cannot promote from {st.describe()}")
        fails = [c.name for c in (*spec.criteria, *spec.anonymity)
                 if not c.shadow and st.counter(c.name).latest == FAIL]
        if fails and not ev.arg("force"):
            return _refuse(st, f"latest verdict of {', '.join(fails)} is FAIL; use --force to promote anyway")
        promoted = attrs.evolve(st, promoted=True, reasons=frozenset(), state=st.resume_to if st.state == PAUSED
                                else st.state, resume_to="")
        out = _next_stage(spec, promoted, now, f"promoted by {ev.user or 'operator'}", full=bool(ev.arg("full")))
        return attrs.evolve(out, decision=f"promote:{out.decision}")
    if kind == "abort":
        if st.terminal:
            return _refuse(st, f"nothing to abort: the rollout is {st.state.lower()}")
        k = ev.arg("kind") or ABORT_TO_BASELINE
        if k not in ROLLBACK_KINDS + (ABORT_TO_BASELINE,):
            return _refuse(st, f"abort --kind {k!r}: one of step-back, revert-default, remove-param, hold, baseline")
        if k == HOLD:
            # rollout.md "Rollback kinds": hold changes no vote and pauses (criterion-hold) while the stage's
            # exposure and looks go on. A pending change would drop the hold when it arrives, so not then.
            if st.state in (TRANSITIONING, ROLLING_BACK):
                return _refuse(st, f"abort --kind hold: a change is pending ({st.describe()}); hold once it is "
                                   "in the consensus, or pause now")
            return _rollback(spec, st, HOLD, now, f"held by {ev.user or 'operator'} (abort --kind hold)")
        return _rollback(spec, attrs.evolve(st, reasons=frozenset()), k, now,
                         f"aborted by {ev.user or 'operator'} ({k})")
    if kind == "retry":
        if st.state != ABORTED:
            return _refuse(st, f"retry restarts an aborted stage; the rollout is {st.describe()}")
        stage = max(1, st.aborted_stage or 1)
        return _enter_stage(spec, _fresh(st), stage, now, f"retry stage {stage}", kind="retry", aborted_stage=None)
    if kind == "undo":
        if st.state not in (MEASURING, PAUSED, ABORTED, COMPLETED):
            return _refuse(st, f"cannot undo from {st.describe()}")
        raw = ev.arg("to_stage")
        base = st.aborted_stage if st.state == ABORTED and st.aborted_stage else st.stage
        try:
            to = int(raw) if raw not in ("", "baseline") else (0 if raw == "baseline" else max(0, base - 1))
        except ValueError:
            return _refuse(st, f"undo --to-stage {raw!r}: a stage number or 'baseline'")
        if not 0 <= to <= spec.last_stage:
            return _refuse(st, f"undo --to-stage {to}: the plan has stages 1..{spec.last_stage}")
        return _enter_stage(spec, _fresh(st), to, now, f"undo to {'baseline' if to == 0 else f'stage {to}'}",
                            kind="undo", fast=bool(ev.arg("fast")), aborted_stage=None)
    return _refuse(st, f"unknown command {kind!r}")
