"""Sequential monitoring: boundaries against published values and hourly looks that keep
the false-alarm rate at the nominal level (spec judge.md §3, oracles O13 and O17)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from kistexp.judge import CriterionSpec, SequentialState, judge
from kistexp.judge.simulate import FAIL, PASS, UNDECIDED, sequential_looks
from kistexp.stats import sequential as seq


def test_obf_two_sided_five_looks_matches_tabulated_values():
    # two-sided 0.05 = 0.025 per side: tabulated 4.88/3.36/2.68/2.29/2.03 (Jennison & Turnbull)
    c = seq.spending_boundaries([0.2, 0.4, 0.6, 0.8, 1.0], 0.025)
    assert c == pytest.approx([4.88, 3.36, 2.68, 2.29, 2.03], abs=0.01)


def test_obf_hourly_fixed_baseline_boundaries():
    # spec §3.3: hourly looks, fixed baseline, t = 2/(336/h + 1): 5.28 / 3.85 / 3.25 / 2.37 / 1.95
    h = np.arange(1, 337)
    c = seq.spending_boundaries(2.0 / (336.0 / h + 1.0), 0.05)
    assert c[[23, 47, 71, 167, 335]] == pytest.approx([5.28, 3.85, 3.25, 2.37, 1.95], abs=0.015)


def test_obf_daily_boundaries_hold_alpha_by_monte_carlo():
    t = np.arange(1, 15) / 14
    c = seq.spending_boundaries(t, 0.05)
    assert c[[0, 1, 2, 13]] == pytest.approx([7.25, 5.06, 4.08, 1.82], abs=0.01)
    rng = np.random.default_rng(14)
    w = np.cumsum(rng.standard_normal((200_000, 14)) * np.sqrt(1 / 14), axis=1)
    crossed = (w / np.sqrt(t) > c).any(axis=1).mean()
    assert crossed == pytest.approx(0.05, abs=0.0025)


def test_boundaries_extend_look_by_look_as_computed_at_once():
    ts = list(np.linspace(0.05, 1.0, 40))
    whole = seq.spending_boundaries(ts, 0.05)
    seq._STATE_CACHE.clear()
    stepwise = [seq.spending_boundaries(ts[: k + 1], 0.05)[-1] for k in range(len(ts))]
    assert stepwise == pytest.approx(list(whole), abs=1e-12)


def test_mixture_boundary_at_target():
    assert float(seq.mixture_boundary(1.0, 0.05)) == pytest.approx(2.764, abs=0.001)
    assert seq.mixture_log_factor(0.10) == pytest.approx(6.329, abs=0.001)
    assert seq.mixture_log_factor(0.05) == pytest.approx(7.936, abs=0.001)


@pytest.mark.slow
def test_simulation_matches_judge_look_by_look():
    """The vectorised Monte Carlo and judge() reach the same first decision at the same look."""
    hours, per_hour, n_b, reps = 60, 12, 720, 4
    rng = np.random.default_rng(77)
    # the draws sequential_looks makes, in its order
    z_base = rng.normal(0.0, 0.6, (reps, n_b))
    z_stage = rng.normal(0.0, 0.6, (reps, hours * per_hour))
    crit = CriterionSpec("median", "relative-increase", 0.10, 200)
    ratio = 1.18
    expected = []
    for rep in range(reps):
        state = SequentialState.plan(planned_stage=hours * per_hour)
        decision: tuple[int, int | None] = (UNDECIDED, None)
        for h in range(1, hours + 1):
            v = judge(crit, np.exp(z_base[rep]), np.exp(z_stage[rep, : h * per_hour]) * ratio,
                      sequential_state=state, final=(h == hours))
            state = v.state
            if v.outcome != "inconclusive":
                decision = (FAIL if v.outcome == "fail" else PASS, h)
                break
        expected.append(decision)
    sim = sequential_looks(np.random.default_rng(77), reps, hours=hours, per_hour=per_hour, baseline_n=n_b,
                           ratios=(ratio,), methods=("obf",), pass_from_hour=0, keep_outcomes=True)
    assert list(sim[0].outcomes) == expected
    assert any(d == FAIL for d, _ in expected)


@pytest.mark.slow
def test_o13_hourly_looks_at_the_bound_keep_false_fail_nominal():
    # true effect exactly at the threshold (+10 %): any FAIL is a false alarm
    res = sequential_looks(np.random.default_rng(13), 1000, ratios=(1.10,), methods=("obf", "mixture", "naive"))
    by = {r.method: r for r in res}
    assert by["obf"].fail <= 0.064
    assert by["mixture"].fail <= 0.064
    assert by["naive"].fail >= 0.20  # peeking hourly with a fixed-horizon interval cries wolf


def test_o17_bonferroni_controls_family_false_fail():
    # five independent criteria, each exactly at its bound, one look, 2,000 reps
    rng = np.random.default_rng(17)
    reps, k, se = 2000, 5, 0.05
    b = np.log(1.10)
    theta = rng.normal(b, se, (reps, k))
    fam = {a: ((theta - norm.isf(a) * se) > b).any(axis=1).mean() for a in (0.05 / k, 0.05)}
    assert fam[0.05 / k] <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / reps)
    assert fam[0.05] == pytest.approx(0.226, abs=0.03)
    # through judge(): alpha_fail split five ways widens the FAIL bound only
    base = np.exp(rng.normal(0, 0.6, 400))
    stage = np.exp(rng.normal(b, 0.6, 400))
    crit = CriterionSpec("median", "relative-increase", 0.10, 200)
    split, plain = judge(crit, base, stage, alpha_fail=0.01), judge(crit, base, stage)
    assert split.c_fail == pytest.approx(norm.isf(0.01)) and split.ci_low < plain.ci_low
    assert split.ci_high == plain.ci_high
