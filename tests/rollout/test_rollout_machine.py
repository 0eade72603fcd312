"""Each transition of the rollout state machine (rollout.md §1.4, §1.5) and each rollback kind (§1.7)."""

import datetime as dt

import attrs
import pytest

from kistexp.dirauth.propagation import NodeClass
from kistexp.plan.loader import load_plan, parse_plan
from kistexp.rollout.machine import initial_status, step
from kistexp.rollout.rollback import eta, plan_rollback
from kistexp.rollout.spec import spec_from_plan
from kistexp.rollout.state import (
    ABORTED,
    BASELINE,
    COMPLETED,
    MEASURING,
    PAUSED,
    PENDING,
    ROLLING_BACK,
    TRANSITIONING,
    Command,
    ConsensusCheck,
    DecisionDue,
    Evaluate,
    MachineVerdict,
    PlanChanged,
    Start,
    WashoutEnd,
)
from tests.plan_helpers import VALID_PLAN

H = dt.timedelta(hours=1)
TWO_CRITERIA = VALID_PLAN + """
[[criteria]]
name = "cpu"
metric = "relay_cpu_utilization"
statistic = "mean"
comparison = "relative-increase"
threshold = 0.25
min_samples = 100
on_fail = "revert-default"
"""


@pytest.fixture
def spec():
    return spec_from_plan(parse_plan(TWO_CRITERIA))


def verdicts(spec, outcome="pass", **override):
    return tuple(MachineVerdict(c.name, override.get(c.name.replace(" ", "_"), outcome)) for c in spec.criteria)


def run(spec, st, *events):
    for ev in events:
        st = step(spec, st, ev).status
    return st


def consensus_for(spec, values):
    want = spec.expected_consensus(values)
    return tuple((k, v) for k, v in want.items() if v is not None)


def into_measuring(spec, stage=1):
    """Drive a fresh status through baseline into MEASURING(stage 1)."""
    st = initial_status(spec)
    st = run(spec, st, Start(spec.baseline_start))
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    st = out.status
    va = out.transition.target_va
    st = run(spec, st, ConsensusCheck(va, va, consensus_for(spec, st.values)),
             WashoutEnd(va + spec.washout, 1))
    assert st.state == MEASURING and st.stage == 1
    return st


def test_pending_to_baseline_and_the_first_transition_targets_the_stage_start(spec):
    st = initial_status(spec)
    assert st.state == PENDING
    st = step(spec, st, Start(spec.baseline_start)).status
    assert st.state == BASELINE
    # the decision falls at the engine deadline of the stage's first consensus: VA - 10 min - 120 s
    assert st.decision_at == spec.start - dt.timedelta(minutes=12)
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    assert out.status.state == TRANSITIONING and out.status.stage == 1
    assert out.transition.target_va == spec.start
    assert dict(out.transition.values) == {"KISTSchedRunInterval": 2}


def test_baseline_short_of_samples_extends_by_one_hour(spec):
    st = run(spec, initial_status(spec), Start(spec.baseline_start))
    out = step(spec, st, DecisionDue(st.decision_at, 0, short=("cpu",)))
    assert out.decision == "hold" and out.transition is None
    assert out.status.decision_at == st.decision_at + H


def test_baseline_drift_pauses_naming_the_key(spec):
    st = run(spec, initial_status(spec), Start(spec.baseline_start))
    out = step(spec, st, ConsensusCheck(spec.baseline_start, spec.baseline_start, (("KISTSchedRunInterval", 7),)))
    assert out.status.state == PAUSED and "drift" in out.status.reasons
    assert "KISTSchedRunInterval=7" in out.message


def test_consensus_carrying_the_stage_starts_washout_then_measuring(spec):
    st = into_measuring(spec)
    assert st.stage_va == spec.start
    # two weeks later, minus the deadline lead
    assert st.decision_at == spec.start + dt.timedelta(days=14) - dt.timedelta(minutes=12)


def test_consensus_missing_the_value_reasserts_then_pauses_after_three_rounds(spec):
    st = run(spec, initial_status(spec), Start(spec.baseline_start))
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    st, va = out.status, out.transition.target_va
    old = consensus_for(spec, spec.baseline_values)
    out = step(spec, st, ConsensusCheck(va, va, old))
    assert out.transition.kind == "reassert" and out.transition.target_va == va + H
    out = step(spec, out.status, ConsensusCheck(va + H, va + H, old))
    out = step(spec, out.status, ConsensusCheck(va + 2 * H, va + 2 * H, old, laggards=("moria1",)))
    assert out.status.state == PAUSED and "not-in-consensus" in out.status.reasons
    assert "moria1" in out.message


def test_all_pass_at_decision_advances_and_manual_gate_pauses(spec):
    st = into_measuring(spec)
    st = run(spec, st, Evaluate(st.decision_at - H, verdicts(spec)))
    out = step(spec, st, DecisionDue(st.decision_at, 1))
    # stage 2 ("eight") has gate = manual
    assert out.status.state == PAUSED and out.status.reasons == {"gate"}
    assert out.transition is None
    promoted = step(spec, out.status, Command(st.decision_at, "promote"))
    assert promoted.status.state == TRANSITIONING and promoted.status.stage == 2


def test_inconclusive_or_missing_never_advances_and_pauses_past_max_extensions(spec):
    st = into_measuring(spec)
    st = run(spec, st, Evaluate(st.decision_at - H, verdicts(spec, "inconclusive")))
    out = step(spec, st, DecisionDue(st.decision_at, 1))
    assert out.decision == "hold" and out.status.state == MEASURING
    # missing data (no verdict at all) holds too
    st2 = into_measuring(spec)
    assert step(spec, st2, DecisionDue(st2.decision_at, 1)).decision == "hold"
    # one stage length of extensions (14 d = 336 h), then PAUSED(inconclusive)
    st = out.status
    for _ in range(spec.max_extensions(1)):
        st = step(spec, st, DecisionDue(st.decision_at, 1)).status
    assert st.state == PAUSED and "inconclusive" in st.reasons
    assert spec.max_extensions(1) == 336


def test_an_error_counts_as_missing_and_pauses_past_the_error_limit(spec):
    st = into_measuring(spec)
    for n in range(5):
        out = step(spec, st, Evaluate(st.stage_va + (n + 3) * H, verdicts(spec, "error")))
        st = out.status
    assert st.state == PAUSED and "error" in st.reasons  # limit 4: the fifth error pauses


def test_fail_rolls_back_at_once_most_severe_kind_wins(spec):
    st = into_measuring(spec)
    at = st.stage_va + 5 * H
    out = step(spec, st, Evaluate(at, verdicts(spec, "fail")))
    # step-back (first criterion) and revert-default (cpu) fail together: revert-default wins
    assert out.status.state == ROLLING_BACK and out.status.rollback_kind == "revert-default"
    assert out.transition.kind == "rollback"
    assert dict(out.transition.values) == {"KISTSchedRunInterval": 10}  # the baseline's
    # earliest feasible consensus: the next VA whose deadline is still ahead
    assert out.transition.target_va == at + H


def test_shadow_criteria_never_roll_back():
    plan = parse_plan(TWO_CRITERIA)
    spec = spec_from_plan(plan)
    spec = attrs.evolve(spec, criteria=tuple(attrs.evolve(c, shadow=c.name == "cpu") for c in spec.criteria))
    st = into_measuring(spec)
    out = step(spec, st, Evaluate(st.stage_va + 5 * H, verdicts(spec, "pass", cpu="fail")))
    assert out.status.state == MEASURING and out.status.counter("cpu").failed == 1


def test_step_back_rollback_ends_paused_at_the_previous_stage(spec):
    st = into_measuring(spec)
    out = step(spec, st, Evaluate(st.stage_va + 5 * H, verdicts(spec, "pass", client_ttlb_1mib_s="fail")))
    assert out.status.rollback_kind == "step-back"
    va = out.transition.target_va
    back = step(spec, out.status, ConsensusCheck(va, va, consensus_for(spec, out.status.values))).status
    assert back.state == PAUSED and back.reasons == {"stepped-back"} and back.stage == 0


def test_revert_rollback_ends_aborted_and_retry_restarts_the_aborted_stage(spec):
    st = into_measuring(spec)
    out = step(spec, st, Evaluate(st.stage_va + 5 * H, verdicts(spec, "pass", cpu="fail")))
    va = out.transition.target_va
    aborted = step(spec, out.status, ConsensusCheck(va, va, consensus_for(spec, out.status.values)))
    assert aborted.status.state == ABORTED and aborted.status.aborted_stage == 1
    assert "network back" in aborted.message
    retry = step(spec, aborted.status, Command(va + H, "retry"))
    assert retry.status.state == TRANSITIONING and retry.status.stage == 1
    assert retry.status.counters == ()


def test_hold_kind_pauses_without_touching_the_network():
    spec = spec_from_plan(parse_plan(VALID_PLAN.replace('on_fail = "step-back"', 'on_fail = "hold"')))
    st = into_measuring(spec)
    out = step(spec, st, Evaluate(st.stage_va + 5 * H, verdicts(spec, "fail")))
    assert out.transition is None and out.status.state == PAUSED and "criterion-hold" in out.status.reasons
    # promote is allowed from criterion-hold, but not on a latest FAIL without --force
    assert step(spec, out.status, Command(st.stage_va + 6 * H, "promote")).refused
    forced = step(spec, out.status, Command(st.stage_va + 6 * H, "promote", (("force", "1"),)))
    # promote overrides the manual gate of stage 2 too
    assert forced.status.state == TRANSITIONING and forced.status.stage == 2


def test_pause_blocks_decisions_resume_reschedules_overdue_one(spec):
    st = into_measuring(spec)
    paused = step(spec, st, Command(st.stage_va + H, "pause")).status
    assert paused.state == PAUSED and paused.resume_to == MEASURING
    assert step(spec, paused, DecisionDue(paused.decision_at, 1)).status == paused
    late = paused.decision_at + 3 * H
    resumed = step(spec, paused, Command(late, "resume")).status
    assert resumed.state == MEASURING and resumed.decision_at >= late
    assert step(spec, resumed, Command(late, "resume")).refused


def test_pause_still_lets_rollbacks_fire_but_freeze_does_not(spec):
    st = into_measuring(spec)
    paused = step(spec, st, Command(st.stage_va + H, "pause")).status
    assert step(spec, paused, Evaluate(st.stage_va + 2 * H, verdicts(spec, "fail"))).status.state == ROLLING_BACK
    frozen = step(spec, st, Command(st.stage_va + H, "pause", (("freeze", "1"),))).status
    out = step(spec, frozen, Evaluate(st.stage_va + 2 * H, verdicts(spec, "fail")))
    assert out.status.state == PAUSED and out.decision == "frozen"


def test_abort_undo_and_refusals(spec):
    st = into_measuring(spec)
    out = step(spec, st, Command(st.stage_va + H, "abort"))
    assert out.status.state == ROLLING_BACK and out.status.rollback_kind == "baseline"
    assert step(spec, st, Command(st.stage_va, "retry")).refused
    assert step(spec, st, Command(st.stage_va, "undo", (("to_stage", "9"),))).refused
    undo = step(spec, st, Command(st.stage_va + H, "undo")).status
    assert undo.state == TRANSITIONING and undo.stage == 0
    va = undo.target_va
    back = step(spec, undo, ConsensusCheck(va, va, consensus_for(spec, undo.values))).status
    assert back.state == BASELINE
    done = attrs.evolve(st, state=COMPLETED)
    assert step(spec, done, Command(st.stage_va, "pause")).refused
    assert step(spec, done, Command(st.stage_va, "undo", (("to_stage", "1"), ("fast", "1")))).status.fast


def test_plan_change_pauses_before_the_next_actuation(spec):
    st = into_measuring(spec)
    out = step(spec, st, PlanChanged(st.stage_va + H, "stages[1].duration 14d -> 7d"))
    assert out.status.state == PAUSED and "plan-changed" in out.status.reasons
    assert step(spec, out.status, DecisionDue(st.decision_at, 1)).transition is None


def test_last_stage_pass_completes(spec):
    st = into_measuring(spec)
    st = attrs.evolve(st, stage=2)
    st = run(spec, st, Evaluate(st.decision_at - H, verdicts(spec)))
    assert step(spec, st, DecisionDue(st.decision_at, 2)).status.state == COMPLETED


def test_washout_is_the_client_propagation_time(spec):
    # client metrics: 99 % of clients hold a consensus 112 min after VA, so two hours
    assert spec.washout == dt.timedelta(hours=2)


# --- rollback kinds (§1.7) -----------------------------------------------------------------------

KIST = "KISTSchedRunInterval"


@pytest.fixture
def kist():
    return spec_from_plan(load_plan("plans/kist-run-interval-2020.toml"))


def test_rollback_step_back_from_stage_one_returns_to_baseline(kist):
    now = kist.start + dt.timedelta(days=2, minutes=7)
    p = plan_rollback(kist, "step-back", kist.values_of(1), 1, now)
    assert dict(p.targets) == {KIST: 10}
    assert p.params[0].consensus_before == 2 and p.params[0].consensus_after == 10
    # 6 participants at 2 with 3 others at 10: the low median returns to 10 once two of them move
    assert len(p.must_act) == 2 and set(p.must_act) <= set(kist.participating)
    assert p.valid_after == kist.start + dt.timedelta(days=2, hours=1)
    assert p.deadline == p.valid_after - dt.timedelta(minutes=12)
    # caches ~VA+2..32 min, clients VA+45..110.6 min (§2.3)
    assert dt.timedelta(minutes=2) < p.relays_50 - p.valid_after < p.relays_99 - p.valid_after <= dt.timedelta(
        minutes=33)
    assert dt.timedelta(minutes=45) < p.clients_50 - p.valid_after < p.clients_99 - p.valid_after <= dt.timedelta(
        minutes=112)


def test_rollback_step_back_from_stage_two_goes_to_stage_one(kist):
    p = plan_rollback(kist, "step-back", kist.values_of(2), 2, kist.start)
    assert dict(p.targets) == {KIST: 2}


def test_rollback_hold_changes_nothing(kist):
    p = plan_rollback(kist, "hold", kist.values_of(1), 1, kist.start)
    assert dict(p.targets) == {KIST: 2} and p.must_act == ()
    assert "exposure continues" in p.note


def test_rollback_revert_default_uses_baseline_values(kist):
    p = plan_rollback(kist, "revert-default", kist.values_of(2), 2, kist.start)
    assert dict(p.targets) == {KIST: 10} and p.params[0].consensus_after == 10


def test_rollback_remove_param_with_others_listing_keeps_their_value(kist):
    # the three others still list 10: three listers keep the key in (>= 3), at their low median
    p = plan_rollback(kist, "remove-param", kist.values_of(1), 1, kist.start)
    assert dict(p.targets) == {KIST: "unset"} and p.params[0].consensus_after == 10


def test_rollback_remove_param_when_nobody_else_lists_it_falls_to_compiled_defaults():
    text = VALID_PLAN.replace('participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]',
                              'participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]\n'
                              'others = "silent"').replace('tor_versions = ">=0.4.8.2"',
                                                           'tor_versions = ">=0.4.7.1"')
    spec = spec_from_plan(parse_plan(text))
    p = plan_rollback(spec, "remove-param", spec.values_of(1), 1, spec.start)
    assert p.params[0].consensus_after is None
    # 10 ms up to 0.4.8.1, 2 ms from 0.4.8.2-alpha (bug 40808)
    assert sorted(d.value for d in p.params[0].compiled_defaults) == [2, 10]
    assert "mixed versions run mixed values" in p.note
    # all five participants stop listing: it leaves the consensus once fewer than 3 list it
    assert len(p.must_act) == 3


def test_eta_scales_with_an_accelerated_cadence():
    from kistexp.dirauth.schedule import AcceleratedSchedule
    from kistexp.rollout.spec import Cadence

    spec = spec_from_plan(parse_plan(VALID_PLAN), Cadence.of(AcceleratedSchedule.scaled(10)))
    va = spec.start
    live_99 = 112 * 60 * 10 / 3600
    assert abs((eta(spec, va, 0.99, NodeClass.CLIENT) - va).total_seconds() - live_99) <= 2
