"""Anonymity criteria in a rollout (issue 37): judged from the stored attack measures of `kistexp simulate`
when a stage is about to be entered, before its values are voted in; a leakier stage takes on_fail without
ever reaching the consensus, a non-inferior one is entered, and a run without stored attack measures is
refused in one line."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from kistexp.anonymity import stage_differences
from kistexp.errors import KistexpError
from kistexp.metrics.series import AttackValue
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import parse_plan
from kistexp.rollout.anonymity import PredictedAnonymity, judge_anonymity, predicted_stage
from kistexp.rollout.dryrun import dry_run
from kistexp.rollout.journal import Journal
from kistexp.rollout.machine import initial_status, step
from kistexp.rollout.spec import spec_from_plan
from kistexp.rollout.state import PAUSED, Command, DecisionDue, MachineVerdict, Start
from tests.plan_helpers import short_plan
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

KIST = "KISTSchedRunInterval"
TPR = "attack_flow_tpr_at_fpr_0.001"
ENTROPY = "attack_guard_entropy_after_bits"
SIMULATION = '\n[simulation]\npopulation_scale = 0.02\nseeds = [1, 2, 3]\nduration = "60s"\n'
# per network (baseline, stage "two", stage "eight"): "two" within 0.02 of the baseline, "eight" ~0.09 above
TPRS = [(0.30, 0.305, 0.40), (0.29, 0.296, 0.38), (0.31, 0.312, 0.40)]


def anonymity_criterion(measure: str = TPR, comparison: str = "absolute-increase", threshold: float = 0.02,
                        extra: str = 'on_fail = "step-back"\n') -> str:
    return (f'\n[[criteria]]\nname = "flow correlation"\nmeasure = "{measure}"\ncomparison = "{comparison}"\n'
            f"threshold = {threshold}\n{extra}")


def plan_text(criterion: str | None = None) -> str:
    return short_plan("anon", {"two": 2, "eight": 8},
                      RELAY_CPU_CRITERION + (anonymity_criterion() if criterion is None else criterion)) + SIMULATION


def experiment(tmp_path, values=TPRS, measure: str = TPR):
    """Predictions of relay CPU (no change anywhere) and the attack measure per stage and network."""
    exp = write_predictions(tmp_path / "e", {"baseline": {}, "two": {}, "eight": {}})
    rows = [AttackValue(stage, measure, n, v)
            for n, per in enumerate(values) for stage, v in zip(("baseline", "two", "eight"), per, strict=True)]
    MetricStore(exp.db).save_attack_values(rows)
    exp.db.commit()
    exp.close()
    return tmp_path / "e"


def rehearse(tmp_path, text: str, values=TPRS, measure: str = TPR):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return dry_run(parse_plan(text, str(path)), experiment(tmp_path, values, measure))


def entered(result) -> list[int]:
    return [d["stage"] for d in result.decisions if d["decision"].startswith("in-consensus:")]


# --- the dry run --------------------------------------------------------------------------------------------


def test_a_leakier_stage_takes_on_fail_before_its_values_are_voted_in(tmp_path):
    r = rehearse(tmp_path, plan_text())
    assert entered(r) == [1]  # stage 2 never reached the consensus
    assert [c["params"][KIST] for c in r.consensus_changes] == [10, 2]
    refusal = r.decisions[-1]
    assert refusal["decision"] == "rollback:step-back" and refusal["stage"] == 1
    message = refusal["message"]
    assert message.startswith("stage 2 (eight) not voted in: judged on the predictions before its values are")
    assert "anonymity criterion 'flow correlation': flow correlation TPR at FPR 0.001 +0.0" in message
    assert "vs margin +0.02: leakier beyond the margin: step-back as on_fail; stage 1 (two) stays in force" in message
    assert r.final_state == PAUSED and "stepped-back" in r.status and "stage 1" in r.status
    assert r.rollbacks == ()  # nothing changed on the network
    # the entry of stage 1 passed, and says on what
    first = next(d for d in r.decisions if d["decision"] == "stage:1")
    assert "anonymity criterion 'flow correlation' passes on the predictions of stage 1 (two)" in first["message"]
    # both verdicts are journaled like any other, under the stage they judged
    journal = Journal(r.journal)
    try:
        looks = [v for v in journal.verdicts() if v["criterion"] == "flow correlation"]
    finally:
        journal.close()
    assert [(v["stage"], v["outcome"]) for v in looks] == [(1, "pass"), (2, "fail")]
    fail = looks[1]
    assert fail["ci_low"] >= 0.02 and fail["record"]["judged_on"] == "predictions"
    assert fail["record"]["bound"] == 0.02 and fail["n_stage"] == 3


def test_a_non_inferior_plan_advances_through_every_stage(tmp_path):
    flat = [(b, b + 0.002, b + 0.004) for b, _, _ in TPRS]
    r = rehearse(tmp_path, plan_text(), values=flat)
    assert r.final_state == "COMPLETED" and entered(r) == [1, 2]
    assert r.verdict_counts["flow correlation"] == {"pass": 2}


def test_revert_default_on_the_predictions_rolls_the_network_back(tmp_path):
    r = rehearse(tmp_path, plan_text(anonymity_criterion(extra='on_fail = "revert-default"\n')))
    assert r.final_state == "ABORTED" and entered(r) == [1]
    (rollback,) = r.rollbacks
    assert "stage 2 (eight) not voted in" in rollback["cause"]
    assert r.consensus_changes[-1]["params"][KIST] == 10


def test_a_measure_lower_is_leakier_fails_on_a_fall(tmp_path):
    # guard entropy left: 3.6 bits at the baseline, stage "eight" removes half a bit
    bits = [(3.6, 3.61, 3.1), (3.7, 3.69, 3.2), (3.5, 3.52, 3.05)]
    text = plan_text(anonymity_criterion(ENTROPY, "absolute-decrease", 0.2))
    r = rehearse(tmp_path, text, values=bits, measure=ENTROPY)
    assert entered(r) == [1] and r.decisions[-1]["decision"] == "rollback:step-back"
    assert "vs margin -0.2 bits: leakier beyond the margin" in r.decisions[-1]["message"]


@pytest.mark.parametrize(("action", "decision", "stages"), [
    ("hold", "pause:inconclusive", [1]),
    ("extend", "pause:inconclusive", [1]),
    ("advance", "complete", [1, 2]),
    ("revert-default", "rollback:revert-default", [1]),
])
def test_an_undecided_stage_follows_on_inconclusive(tmp_path, action, decision, stages):
    # stage "eight": +0.015 on average, but the networks disagree: the interval straddles the margin
    wide = [(0.30, 0.30, 0.33), (0.29, 0.29, 0.29), (0.31, 0.31, 0.325)]
    text = plan_text(anonymity_criterion(extra=f'on_fail = "step-back"\non_inconclusive = "{action}"\n'))
    r = rehearse(tmp_path, text, values=wide)
    last = r.decisions[-1] if action != "revert-default" else next(
        d for d in r.decisions if d["decision"].startswith("rollback:"))
    assert last["decision"] == decision and entered(r) == stages
    if action in ("hold", "extend"):
        assert "interval straddles the margin: paused for an operator as on_inconclusive" in last["message"]
        assert "more time changes no prediction" in last["message"]


def test_a_dry_run_without_stored_attack_measures_is_refused_in_one_line(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(plan_text())
    write_predictions(tmp_path / "e", {"baseline": {}, "two": {}, "eight": {}}).close()
    with pytest.raises(KistexpError) as err:
        dry_run(parse_plan(plan_text(), str(path)), tmp_path / "e")
    message = str(err.value)
    assert "\n" not in message and "no stored attack measures for the anonymity criteria 'flow correlation'" in message
    assert message.endswith(f"run kistexp simulate {path} --dir EXP first")


def test_the_cli_dry_run_refuses_without_attack_measures(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "plan.toml"
    path.write_text(plan_text())
    write_predictions(tmp_path / "e", {"baseline": {}, "two": {}, "eight": {}}).close()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-m", "kistexp", "dry-run", str(path), "--dir", str(tmp_path / "e")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("kistexp: error: ") and out.stderr.count("\n") == 1
    assert out.stderr.rstrip().endswith("run kistexp simulate " + str(path) + " --dir EXP first")


# --- the verdict and the machine -----------------------------------------------------------------------------


def _figure(stage_values, base_values, measure=TPR):
    values = [AttackValue("baseline", measure, n, v) for n, v in enumerate(base_values)]
    values += [AttackValue("two", measure, n, v) for n, v in enumerate(stage_values)]
    (figure,) = stage_differences(values)
    return figure


def _spec(criterion: str | None = None):
    return spec_from_plan(parse_plan(plan_text(criterion)))


def test_the_verdict_is_non_inferiority_on_the_paired_interval():
    c = _spec().anonymity[0]
    passed = judge_anonymity(c, _figure([0.305, 0.296, 0.312], [0.30, 0.29, 0.31]), "two")
    assert passed.outcome == "pass" and passed.ci_high < 0.02 and passed.bound == 0.02
    failed = judge_anonymity(c, _figure([0.40, 0.38, 0.40], [0.30, 0.29, 0.31]), "two")
    assert failed.outcome == "fail" and failed.ci_low >= 0.02
    straddles = judge_anonymity(c, _figure([0.33, 0.29, 0.325], [0.30, 0.29, 0.31]), "two")
    assert straddles.outcome == "inconclusive" and straddles.reason == "undecided"
    assert straddles.limited_by == "predictions" and straddles.ci_low < 0.02 <= straddles.ci_high
    assert json.loads(straddles.record)["judged_on"] == "predictions"
    one = judge_anonymity(c, _figure([0.5], [0.3]), "two")  # one network: no interval, no decision
    assert one.outcome == "inconclusive" and one.reason != "undecided" and math.isclose(one.effect, 0.2)
    missing = judge_anonymity(c, None, "two")
    assert missing.outcome == "error" and "no predicted attack_flow_tpr_at_fpr_0.001 for 'two'" in missing.detail


def test_a_decrease_mirrors_the_margin():
    c = _spec(anonymity_criterion(ENTROPY, "absolute-decrease", 0.2)).anonymity[0]
    base = [3.6, 3.7, 3.5]
    fall = judge_anonymity(c, _figure([3.1, 3.2, 3.05], base, ENTROPY), "two")
    assert fall.outcome == "fail" and fall.bound == -0.2 and fall.ci_high <= -0.2
    rise = judge_anonymity(c, _figure([4.1, 4.2, 4.05], base, ENTROPY), "two")  # harder for the attacker
    assert rise.outcome == "pass"


def test_a_failed_entry_needs_force_to_promote_and_forced_enters():
    spec = _spec()
    st = step(spec, initial_status(spec), Start(spec.baseline_start)).status
    fail = MachineVerdict("flow correlation", "fail", 0.09, 0.05, 0.13, 3, 3, detail="leakier", bound=0.02)
    out = step(spec, st, DecisionDue(st.decision_at, 0, ahead=(fail,)))
    assert out.judged_ahead == 1 and out.transition is None and out.decision == "rollback:step-back"
    assert out.status.state == PAUSED and out.status.counter("flow correlation").latest == "fail"
    at = st.decision_at + dt.timedelta(hours=1)
    refused = step(spec, out.status, Command(at, "promote"))
    assert refused.refused and "flow correlation is FAIL" in refused.message
    forced = step(spec, out.status, Command(at, "promote", (("force", "True"),)))
    assert forced.transition is not None and forced.status.stage == 1 and forced.judged_ahead == 0


def test_a_decision_without_anonymity_criteria_judges_nothing_ahead():
    spec = spec_from_plan(parse_plan(short_plan("plain", {"two": 2}, RELAY_CPU_CRITERION)))
    assert spec.anonymity == ()
    st = step(spec, initial_status(spec), Start(spec.baseline_start)).status
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    assert out.judged_ahead == 0 and out.transition is not None


def test_predicted_stage_names_and_switchback_arms():
    spec = _spec()
    assert [predicted_stage(spec, i) for i in range(3)] == ["baseline", "two", "eight"]
    values = [AttackValue(s, TPR, n, v) for n in range(3) for s, v in (("baseline", 0.3), ("eight", 0.3 + n / 100))]
    got = PredictedAnonymity.of(values).verdicts(spec, 1)
    assert [v.outcome for v in got] == ["error"]  # no prediction for stage "two"
    assert PredictedAnonymity.of(values).verdicts(spec, 2)[0].outcome == "inconclusive"


def test_the_spec_digest_of_a_plan_without_anonymity_criteria_is_unchanged():
    spec = spec_from_plan(parse_plan(short_plan("plain", {"two": 2}, RELAY_CPU_CRITERION)))
    assert '"anonymity"' not in spec.canonical()
    assert '"anonymity"' in _spec().canonical()


def test_an_anonymity_criterion_may_not_share_a_metric_criterion_name():
    from kistexp.rollout.spec import RolloutError

    text = plan_text().replace('name = "flow correlation"', 'name = "relay CPU"')
    with pytest.raises(RolloutError, match="two criteria share the name 'relay CPU'"):
        spec_from_plan(parse_plan(text))
