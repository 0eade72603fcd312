"""Tripwire criteria (`critical = true`, spec judge.md §5.2 and §7)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from scipy.stats import norm

from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.judge import CriterionSpec, SequentialState, judge
from kistexp.judge.plan import TRIPWIRE_ALPHA, fail_alphas, judge_plan
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore
from kistexp.plan import load_plan
from tests.plan_helpers import VALID_PLAN

TRIPWIRE = """
[[criteria]]
name = "download tripwire"
metric = "client_ttlb_1mib_s"
statistic = "mean"
comparison = "relative-increase"
threshold = 1.0
min_samples = 30
on_fail = "revert-default"
critical = true
"""


def _plan(tmp_path, extra=TRIPWIRE):
    path = tmp_path / "plan.toml"
    path.write_text(VALID_PLAN + extra)
    return load_plan(str(path))


def test_critical_key_is_a_boolean(tmp_path):
    plan = _plan(tmp_path)
    assert [c.critical for c in plan.criteria] == [False, True]
    assert "(tripwire)" in plan.criteria[1].describe()
    with pytest.raises(KistexpError, match=r"critical.*expected true or false"):
        _plan(tmp_path, TRIPWIRE.replace("critical = true", 'critical = "yes"'))


def test_tripwires_take_their_own_slice_of_alpha(tmp_path):
    plan = _plan(tmp_path)
    assert fail_alphas(plan.criteria, 0.05) == pytest.approx([0.049, TRIPWIRE_ALPHA])


def test_pocock_boundaries_let_severe_breakage_fail_at_the_first_look():
    rng = np.random.default_rng(4)
    base = np.exp(rng.normal(0, 0.6, 4032))
    stage = np.exp(rng.normal(np.log(4.0), 0.6, 36))  # downloads 4x slower in the first hour
    crit = CriterionSpec("mean", "relative-increase", 1.0, 30)
    trip = judge(crit, base, stage, sequential_state=SequentialState.plan(4032, method="pocock", alpha_fail=0.001))
    obf = judge(crit, base, stage, sequential_state=SequentialState.plan(4032, alpha_fail=0.001))
    assert trip.outcome == "fail" and trip.sequential == "pocock" and trip.c_fail < 5.5
    assert obf.outcome == "inconclusive" and obf.c_fail > 10


def test_judge_plan_uses_the_tripwire_alpha(tmp_path):
    plan = _plan(tmp_path)
    exp = ExperimentDir.create(tmp_path / "exp")
    store = MetricStore(exp.db)
    rng = np.random.default_rng(9)
    samples = []
    for minutes in range(-7 * 24 * 60, 24 * 60, 5):
        t = plan.start + dt.timedelta(minutes=minutes)
        value = float(np.exp(rng.normal(0.0, 0.6))) * (5.0 if minutes >= 0 else 1.0)
        samples.append(Sample(t, value, {"source": "op-test"}))
    store.add_samples("client_ttlb_1mib_s", samples)
    results = judge_plan(plan, store, now=plan.start + dt.timedelta(hours=13))
    trip = [r for r in results if r.criterion == "download tripwire" and r.stage == "two"][0]
    assert trip.verdict.c_fail == pytest.approx(norm.isf(TRIPWIRE_ALPHA)) and trip.verdict.outcome == "fail"
    other = [r for r in results if r.criterion != "download tripwire" and r.stage == "two"][0]
    assert other.verdict.c_fail == pytest.approx(norm.isf(0.049))
    seq = judge_plan(plan, store, now=plan.start + dt.timedelta(hours=13), sequential=True)
    trip = [r for r in seq if r.criterion == "download tripwire" and r.stage == "two"][0]
    assert trip.verdict.sequential == "pocock" and trip.verdict.outcome == "fail"
    exp.close()
