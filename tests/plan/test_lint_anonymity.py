"""Anonymity criteria in plans (issue 37): the loader reads a [[criteria]] entry with an attack `measure`, and
lint refuses an unknown measure (KX701), a margin that is not a non-negative number (KX702), a false-positive
rate the plan's [simulation] cannot resolve (KX703), a plan that is not simulated (KX704) and a comparison on
the side that is not leakier (KX705), each naming the key and what would work."""

from __future__ import annotations

import datetime as dt

import pytest

from kistexp.errors import PlanError
from kistexp.metrics import catalogue
from kistexp.plan.lint import RULES, lint_paths
from kistexp.plan.lint_anonymity import check_anonymity
from kistexp.plan.lint_findings import _Collector
from kistexp.plan.loader import parse_plan
from kistexp.plan.model import AnonymityCriterion
from tests.plan_helpers import VALID_PLAN

NOW = dt.datetime(2029, 12, 1, tzinfo=dt.timezone.utc)
SIMULATION = '\n[simulation]\npopulation_scale = 0.02\nseeds = [1, 2, 3]\nduration = "60s"\n'
# VALID_PLAN's one criterion is criteria[0]; the anonymity criterion below is criteria[1]
ANON = """
[[criteria]]
name = "flow correlation"
measure = "attack_flow_tpr_at_fpr_0.001"
comparison = "absolute-increase"
threshold = 0.02
on_fail = "step-back"
"""


def _lint(tmp_path, text):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return lint_paths([str(path)], now=NOW)


def _only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.findings
    return found[0]


def test_the_loader_reads_an_anonymity_criterion_beside_metric_ones():
    plan = parse_plan(VALID_PLAN + ANON + SIMULATION)
    assert [c.metric for c in plan.criteria] == ["client_ttlb_1mib_s"]
    (a,) = plan.anonymity
    assert a == AnonymityCriterion(measure="attack_flow_tpr_at_fpr_0.001", comparison="absolute-increase",
                                   threshold=0.02, on_fail="step-back", name="flow correlation", index=1)
    assert a.margin == 0.02 and a.label == "flow correlation"
    # the key paths of metric criteria are their places in the file, anonymity entries between them or not
    text = VALID_PLAN.replace("[[criteria]]", ANON.strip() + "\n\n[[criteria]]", 1)
    moved = parse_plan(text)
    assert moved.anonymity[0].index == 0 and moved.criterion_keys() == ("criteria[1]",)


def test_a_plan_with_a_clean_anonymity_criterion_lints_clean(tmp_path):
    report = _lint(tmp_path, VALID_PLAN + ANON + SIMULATION)
    assert report.findings == ()


def test_kx701_unknown_measure_names_the_closest(tmp_path):
    f = _only(_lint(tmp_path, VALID_PLAN + ANON.replace("fpr_0.001", "fpr_0.0001x") + SIMULATION), "KX701")
    assert f.severity == "error" and f.key == "criteria[1].measure" and f.line is not None
    assert f.message == ("no attack measure 'attack_flow_tpr_at_fpr_0.0001x'; "
                         "did you mean attack_flow_tpr_at_fpr_0.0001?")
    far = _only(_lint(tmp_path, VALID_PLAN + ANON.replace("attack_flow_tpr_at_fpr_0.001", "leakage") + SIMULATION),
                "KX701")
    assert far.message.endswith("known: " + ", ".join(catalogue.attack_measure_names()))


@pytest.mark.parametrize(("threshold", "problem"), [
    ('"2%"', "expected a number, got a string ('2%')"),
    ("true", "expected a number, got a boolean"),
    ("-0.02", "-0.02 is negative"),
    ("nan", "expected a finite number"),
])
def test_kx702_margin_that_is_not_a_non_negative_number(tmp_path, threshold, problem):
    text = VALID_PLAN + ANON.replace("threshold = 0.02", f"threshold = {threshold}") + SIMULATION
    report = _lint(tmp_path, text)
    f = _only(report, "KX702")
    line = text.count("\n", 0, text.index("threshold = " + threshold)) + 1
    assert f.key == "criteria[1].threshold" and f.line == line
    assert f.message.startswith(problem) and "e.g. threshold = 0.02" in f.message
    assert "KX001" not in {x.code for x in report.findings} and report.exit_code == 1
    with pytest.raises(PlanError):  # the dry run and the run refuse it too
        parse_plan(text)


def test_kx703_a_rate_the_simulated_flows_cannot_resolve(tmp_path):
    # the bundled consensus at scale 0.02 and 60 s gives about 2,100 flows a network: 1e-4 needs 10,000
    f = _only(_lint(tmp_path, VALID_PLAN + ANON.replace("fpr_0.001", "fpr_0.0001") + SIMULATION), "KX703")
    assert f.key == "criteria[1].measure" and f.severity == "error"
    assert f.message.startswith("a false-positive rate of 0.0001 needs 10,000 flows and false pairs per simulated "
                                "network; the plan's [simulation] (population_scale 0.02, duration 60s) gives at most ")
    assert "use FPR 0.001 (attack_flow_tpr_at_fpr_0.001), or raise population_scale (about 0.0" in f.message


def test_kx703_names_what_the_capacity_allows():
    plan = parse_plan(VALID_PLAN + ANON + SIMULATION, "plan.toml")
    out = _Collector(plan, "")
    asked = []

    def capacity(runs):
        asked.append(runs.population_scale)
        return 400, 150_000

    check_anonymity(plan, out, capacity)
    (f,) = out.findings
    assert f.code == "KX703" and asked == [0.02]
    assert "gives at most 400 flows and 150,000 false pairs: use FPR 0.01 (attack_flow_tpr_at_fpr_0.01)" in f.message
    enough = _Collector(plan, "")
    check_anonymity(plan, enough, lambda runs: (1000, 999_000))
    assert enough.findings == []


def test_kx704_anonymity_criterion_without_a_simulation_table(tmp_path):
    f = _only(_lint(tmp_path, VALID_PLAN + ANON), "KX704")
    assert f.key == "criteria[1].measure"
    assert f.message.startswith("anonymity criterion 'flow correlation' is judged from kistexp simulate's attack "
                                "measures, but the plan has no [simulation] table")
    assert "KX703" not in {x.code for x in _lint(tmp_path, VALID_PLAN + ANON).findings}


def test_kx705_the_comparison_must_guard_the_leakier_side(tmp_path):
    entropy = ANON.replace("attack_flow_tpr_at_fpr_0.001", "attack_guard_entropy_after_bits")
    f = _only(_lint(tmp_path, VALID_PLAN + entropy + SIMULATION), "KX705")
    assert f.key == "criteria[1].comparison"
    assert 'a lower value is leakier' in f.message and 'use comparison = "absolute-decrease"' in f.message
    fixed = entropy.replace("absolute-increase", "absolute-decrease")
    assert _lint(tmp_path, VALID_PLAN + fixed + SIMULATION).findings == ()
    g = _only(_lint(tmp_path, VALID_PLAN + ANON.replace("absolute-increase", "absolute-decrease") + SIMULATION),
              "KX705")
    assert 'use comparison = "absolute-increase"' in g.message


def test_only_anonymity_criteria_count_as_rollback_criteria(tmp_path):
    only = VALID_PLAN.partition("[[criteria]]")[0] + ANON + SIMULATION
    assert "KX302" not in {f.code for f in _lint(tmp_path, only).findings}


def test_a_signal_anonymity_criterion_naming_a_rollback_is_warned(tmp_path):
    text = VALID_PLAN + ANON.replace('on_fail = "step-back"', 'on_fail = "step-back"\nrole = "signal"') + SIMULATION
    f = _only(_lint(tmp_path, text), "KX304")
    assert f.key == "criteria[1].on_fail" and "criterion 'flow correlation' is a signal" in f.message


@pytest.mark.parametrize(("change", "problem"), [
    ('measure = "attack_flow_auc"\nmetric = "client_ttlb_1mib_s"', "criteria[1].metric: a criterion names a metric "
     "or an attack measure, not both"),
    ('measure = "attack_flow_auc"\nstatistic = "median"', "criteria[1].statistic: an anonymity criterion "
     "(measure = ...) takes no statistic"),
    ('measure = "attack_flow_auc"\ncomparison = "relative-increase"', "'relative-increase' is not one of "
     "absolute-increase, absolute-decrease"),
])
def test_the_loader_refuses_what_an_anonymity_criterion_cannot_mean(change, problem):
    text = VALID_PLAN + ANON.replace('measure = "attack_flow_tpr_at_fpr_0.001"', change, 1)
    if "comparison" in change:
        text = text.replace('comparison = "absolute-increase"\n', "", 1)
    with pytest.raises(PlanError) as err:
        parse_plan(text)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_anonymity_rules_are_listed():
    assert {"KX701", "KX702", "KX703", "KX704", "KX705"} <= set(RULES)
