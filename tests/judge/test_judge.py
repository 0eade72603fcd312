"""The judge against the spec's test oracles (spec judge.md §8) and published examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import mstats, norm

from kistexp.jsonout import to_json
from kistexp.judge import Counts, CriterionSpec, JudgeError, SequentialState, Window, judge
from kistexp.judge import estimators as est
from kistexp.plan.model import Criterion

MEDIAN_10 = CriterionSpec("median", "relative-increase", 0.10, 200)
DAY = 86400.0


def quantile_sample(n: int) -> np.ndarray:
    """y_i = exp(0.6 Φ⁻¹((i − ½)/n)): a deterministic log-normal sample (spec §8)."""
    return np.exp(0.6 * norm.ppf((np.arange(1, n + 1) - 0.5) / n))


def _ci(v):
    return round(v.ci_low, 3), round(v.ci_high, 3)


def test_o1_below_min_samples_is_inconclusive_even_at_ratio_2():
    v = judge(MEDIAN_10, quantile_sample(2000), quantile_sample(50) * 2.0)
    assert (v.outcome, v.reason) == ("inconclusive", "insufficient_samples")
    assert v.n_stage == 50 and "50 samples < 200" in v.detail


def test_o2_identical_windows_pass():
    v = judge(MEDIAN_10, quantile_sample(2000), quantile_sample(2000))
    assert v.outcome == "pass" and v.effect == pytest.approx(1.0)
    assert _ci(v) == (0.962, 1.040)
    assert v.n_baseline == v.n_stage == 2000 and "Bonett-Price" in v.rule


def test_o3_factor_125_fails():
    v = judge(MEDIAN_10, quantile_sample(2000), quantile_sample(2000) * 1.25)
    assert v.outcome == "fail" and _ci(v) == (1.202, 1.300)


def test_o4_factor_105_n400_inconclusive_with_hl_check():
    v = judge(MEDIAN_10, quantile_sample(400), quantile_sample(400) * 1.05)
    assert (v.outcome, v.reason) == ("inconclusive", "undecided")
    assert _ci(v) == (0.962, 1.146)
    assert "Hodges-Lehmann check 1.05 [0.9774, 1.128]" in v.detail


def test_o4b_factor_105_n2000_passes():
    v = judge(MEDIAN_10, quantile_sample(2000), quantile_sample(2000) * 1.05)
    assert v.outcome == "pass" and _ci(v) == (1.010, 1.092)


def test_o5_point_rule_would_fire_but_interval_is_inconclusive():
    crit = CriterionSpec("median", "relative-increase", 0.10, 100)
    v = judge(crit, quantile_sample(100), quantile_sample(100) * 1.12)
    assert v.effect > 1.10 and v.outcome == "inconclusive" and _ci(v) == (0.939, 1.336)


@pytest.mark.parametrize(("stage", "base", "outcome"), [
    ((30, 2016), (40, 4032), "inconclusive"),  # O7
    ((60, 2016), (40, 4032), "fail"),  # O8
    ((0, 2016), (40, 4032), "pass"),  # O9
])
def test_o7_o8_o9_rate_ratio(stage, base, outcome):
    crit = CriterionSpec("mean", "relative-increase", 1.0, 300)  # FAIL when the rate at least doubles
    v = judge(crit, Counts(*base), Counts(*stage))
    assert v.outcome == outcome
    expected = {"inconclusive": (1.50, 0.976, 2.291), "fail": (3.00, 2.107, 4.299)}.get(outcome)
    if expected:
        assert (round(v.effect, 2), round(v.ci_low, 3), round(v.ci_high, 3)) == expected
    else:
        assert round(v.ci_high, 3) == 0.156


def test_o10_few_events_inconclusive():
    v = judge(CriterionSpec("mean", "relative-increase", 1.0, 300), Counts(3, 4032), Counts(5, 2016))
    assert (v.outcome, v.reason) == ("inconclusive", "insufficient_samples") and "8 events" in v.detail


def test_o11_paired_relays_pass_and_flag_outlier():
    rng = np.random.default_rng(11)
    base, stage = {}, {}
    for r in range(50):
        level = math.exp(rng.normal(0, 1.15))  # relays differ ~100x
        base[f"R{r:02d}"] = np.full(60, level)
        stage[f"R{r:02d}"] = np.full(60, level * math.exp(math.log(1.02) + rng.uniform(-0.01, 0.01)))
    base["OUTLIER"] = np.full(60, 0.5)
    stage["OUTLIER"] = np.full(60, 5.0)
    crit = CriterionSpec("mean", "relative-increase", 0.25, 500)
    v = judge(crit, base, stage)
    assert v.outcome == "pass", v.detail
    assert 1.01 < v.effect < 1.03 and v.ci_high < 1.05
    assert any("OUTLIER" in w for w in v.warnings)
    assert "51 relays" in v.detail and "Wilcoxon" in v.method


def test_paired_relays_detect_a_cpu_rise():
    rng = np.random.default_rng(5)
    levels = np.exp(rng.normal(0, 1.15, 40))  # relays ~100x apart
    change = np.exp(np.log(1.6) + rng.normal(0, 0.2, 40))  # relay-to-relay spread of the rise
    base = {f"R{i}": lv * np.exp(rng.normal(0, 0.3, 120)) for i, lv in enumerate(levels)}
    stage = {f"R{i}": lv * ch * np.exp(rng.normal(0, 0.3, 120))
             for i, (lv, ch) in enumerate(zip(levels, change, strict=True))}
    crit = CriterionSpec("mean", "relative-increase", 0.25, 500)
    v = judge(crit, base, stage)
    assert v.outcome == "fail" and 1.45 < v.effect < 1.75
    assert v.n_baseline == v.n_stage == 40 * 120


def test_paired_relays_need_ten_relays_and_little_churn():
    crit = CriterionSpec("mean", "relative-increase", 0.25, 10)
    base = {f"R{i}": np.ones(50) for i in range(12)}
    few = {f"R{i}": np.ones(50) for i in range(9)}
    v = judge(crit, {k: base[k] for k in few}, few)
    assert (v.outcome, v.reason) == ("inconclusive", "insufficient_samples")
    v = judge(crit, base, few)  # 3 of 12 relays lost: 25 % churn
    assert (v.outcome, v.reason) == ("inconclusive", "coverage")


def test_o12_constant_windows_pass_without_exception():
    v = judge(MEDIAN_10, np.ones(500), np.ones(500))
    assert v.outcome == "pass" and v.effect == 1.0 and v.ci_low == v.ci_high == 1.0
    v = judge(MEDIAN_10, np.ones(500), np.full(500, 2.0))
    assert v.outcome == "fail" and any("constant_series" in w for w in v.warnings)


def test_o14_worked_example_sequential():
    # 36 samples/h, baseline 14 days (12,096), sigma_log 0.6, DEFF 2: v = 1.131 per sample
    state = SequentialState.plan(planned_stage=12096)
    n_b = 12096
    # a stage with median ratio 1.22 and Bonett-Price SEs as in the spec: build quantile samples
    # whose spread gives se = sqrt(1.131 (1/n_S + 1/n_B)) (sigma 0.6 * sqrt(DEFF 2) = 0.8485)
    def sample(n, factor):
        return np.exp(0.6 * math.sqrt(2) * norm.ppf((np.arange(1, n + 1) - 0.5) / n)) * factor

    base = sample(n_b, 1.0)
    verdicts = {}
    for hour in range(1, 73):
        v = judge(MEDIAN_10, base, sample(36 * hour, 1.22), sequential_state=state)
        state = v.state
        verdicts[hour] = v
    h48, h72 = verdicts[48], verdicts[72]
    assert h48.c_fail == pytest.approx(3.85, abs=0.02) and h48.information == pytest.approx(0.25, abs=0.001)
    assert h72.c_fail == pytest.approx(3.25, abs=0.02)
    # the spec's intervals use the normal boundaries ([1.098, 1.356] at h48, lower 1.132 at h72);
    # the judge widens them by the t quantile of the estimated SE's degrees of freedom
    assert h48.outcome == "inconclusive" and 1.07 < h48.ci_low < 1.098
    assert h72.outcome == "fail" and 1.10 < h72.ci_low < 1.132
    assert "t boundaries (df" in h72.detail
    # looks before 200 stage samples (hours 1-5) do not test and spend nothing
    assert h72.look == 67 and len(h72.state.fractions) == 67
    # the mixture confidence sequence tuned at the planned end decides at h48 already
    # (spec: tau^2 I = 6.329 * 0.25, c = 3.01, [1.124, 1.325])
    mix = SequentialState.plan(planned_stage=12096, method="mixture", target_stage=12096)
    v = judge(MEDIAN_10, base, sample(36 * 48, 1.22), sequential_state=mix)
    assert v.c_fail == pytest.approx(3.01, abs=0.01) and v.outcome == "fail"
    assert 1.10 < v.ci_low < 1.124 and v.ci_high > 1.325


def test_o15_stale_onionperf_data_inconclusive():
    crit = Criterion("client_ttlb_1mib_s", "median", "relative-increase", 0.10, 200, "hold")
    t_b = np.arange(0, 14 * DAY, 300.0)
    t_s = t_b[-400:] + 14 * DAY
    now = float(t_s.max()) + 50 * 60
    rng = np.random.default_rng(3)
    base = Window(np.exp(rng.normal(0, 0.6, t_b.size)), t_b)
    stage = Window(np.exp(rng.normal(0, 0.6, t_s.size)), t_s)
    v = judge(crit, base, stage, now=now)
    assert (v.outcome, v.reason) == ("inconclusive", "stale") and "50 min old" in v.detail
    assert judge(crit, base, stage, now=float(t_s.max()) + 600).reason != "stale"


def test_o16_washout_samples_excluded_and_reported():
    rng = np.random.default_rng(16)
    t_b = np.arange(0, 7 * DAY, 300.0)
    t_s = np.arange(7 * DAY, 9 * DAY, 300.0)
    values = np.exp(rng.normal(0, 0.6, t_s.size))
    values[t_s < 7 * DAY + 3 * 3600] *= 4.0  # +300 % only while the consensus propagates
    base = Window(np.exp(rng.normal(0, 0.6, t_b.size)), t_b)
    v = judge(MEDIAN_10, base, Window(values, t_s), washout_until=7 * DAY + 3 * 3600)
    assert v.outcome != "fail" and v.excluded == 36 and v.n_stage == t_s.size - 36
    assert judge(MEDIAN_10, base, Window(values, t_s)).n_stage == t_s.size


def test_pass_needs_every_hour_of_day():
    rng = np.random.default_rng(4)
    t_b = np.arange(0, 7 * DAY, 300.0)
    base = Window(np.exp(rng.normal(0, 0.6, t_b.size)), t_b)
    t_s = np.arange(7 * DAY, 7 * DAY + 12 * 3600, 30.0)  # half a day, plenty of samples
    v = judge(MEDIAN_10, base, Window(np.exp(rng.normal(0, 0.6, t_s.size)), t_s))
    assert (v.outcome, v.reason) == ("inconclusive", "coverage")
    t_s = np.arange(7 * DAY, 8 * DAY, 30.0)
    assert judge(MEDIAN_10, base, Window(np.exp(rng.normal(0, 0.6, t_s.size)), t_s)).outcome == "pass"


@pytest.mark.parametrize(("comparison", "factor", "outcome"), [
    ("relative-decrease", 0.80, "fail"), ("relative-decrease", 1.0, "pass"),
    ("absolute-increase", 1.0, "pass"), ("absolute-decrease", 0.5, "fail"),
])
def test_mirrored_and_absolute_comparisons(comparison, factor, outcome):
    thr = 0.10 if comparison.startswith("relative") else 0.2
    crit = CriterionSpec("median", comparison, thr, 200)
    v = judge(crit, quantile_sample(2000), quantile_sample(2000) * factor)
    assert v.outcome == outcome
    assert v.ci_low <= v.effect <= v.ci_high


def test_above_and_below_compare_with_a_level():
    crit = CriterionSpec("p90", "above", 2.5, 200)
    sample = quantile_sample(2000)  # p90 = exp(0.6 * 1.2816) = 2.16
    assert judge(crit, None, sample).outcome == "pass"
    assert judge(crit, None, sample * 1.4).outcome == "fail"
    assert judge(CriterionSpec("median", "below", 0.8, 200), None, sample).outcome == "pass"


def test_absolute_rate_difference_uses_the_e_test():
    crit = CriterionSpec("mean", "absolute-increase", 0.02, 300)
    assert judge(crit, Counts(120, 4032), Counts(60, 2016)).outcome == "pass"
    v = judge(crit, Counts(120, 4032), Counts(180, 2016))  # 8.9 % vs 3.0 %
    assert v.outcome == "fail" and "E-test" in v.method and v.effect == pytest.approx(180 / 2016 - 120 / 4032)


def test_zero_one_samples_become_counts():
    base = np.zeros(4032)
    base[:120] = 1
    stage = np.zeros(2016)
    stage[:180] = 1
    v = judge(CriterionSpec("mean", "absolute-increase", 0.02, 300), base, stage)
    assert v.outcome == "fail" and any("counts" in w for w in v.warnings)


def test_overdispersion_widens_the_rate_interval():
    crit = CriterionSpec("mean", "relative-increase", 1.0, 300)
    plain = judge(crit, Counts(400, 40000), Counts(500, 20000))
    dispersed = judge(crit, Counts(400, 40000, dispersion=9.0), Counts(500, 20000))
    assert plain.outcome == "fail" and dispersed.outcome == "inconclusive"
    assert dispersed.ci_low < plain.ci_low


def test_shift_statistic_is_hodges_lehmann_with_mann_whitney():
    crit = CriterionSpec("shift", "relative-increase", 0.10, 200)
    v = judge(crit, quantile_sample(400), quantile_sample(400) * 1.05)
    assert v.method.startswith("Hodges-Lehmann") and _ci(v) == (0.977, 1.128)
    assert "Mann-Whitney U p =" in v.detail


def test_quantiles_need_tail_samples():
    # five samples beyond the quantile, where its Woodruff interval is calibrated
    # (tests/judge/test_judge_corrections.py)
    v = judge(CriterionSpec("p99", "relative-increase", 0.2, 200), quantile_sample(400), quantile_sample(400))
    assert v.reason == "insufficient_samples" and v.ci_low is None
    assert "p99 cannot be estimated from 400 samples (needs >= 500" in v.detail
    assert judge(CriterionSpec("p99", "relative-increase", 0.2, 200), quantile_sample(1000),
                 quantile_sample(1000)).outcome == "pass"


def test_bad_data_is_inconclusive_never_pass():
    bad = quantile_sample(500).copy()
    bad[3] = math.nan
    assert judge(MEDIAN_10, quantile_sample(500), bad).reason == "data_quality"
    bad = quantile_sample(500) - 1.0  # negative values: no ratio
    assert judge(MEDIAN_10, quantile_sample(500), bad).reason == "data_quality"
    assert judge(MEDIAN_10, [], []).reason == "insufficient_samples"


def test_unknown_statistic_or_comparison_is_an_error():
    with pytest.raises(JudgeError, match="statistic 'max'"):
        judge(CriterionSpec("max", "relative-increase", 0.1), [1.0], [1.0])
    with pytest.raises(JudgeError, match="comparison 'sideways'"):
        judge(CriterionSpec("median", "sideways", 0.1), [1.0], [1.0])


def test_verdict_is_frozen_and_serialisable():
    import json

    import attrs

    v = judge(MEDIAN_10, quantile_sample(300), quantile_sample(300), sequential_state=SequentialState.plan(4000))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        v.outcome = "fail"  # type: ignore[misc]
    data = json.loads(json.dumps(to_json(v)))
    assert data["outcome"] == v.outcome and data["state"]["fractions"] == [pytest.approx(v.information)]


# --- the estimators against published implementations --------------------------------------

def test_bonett_price_reproduces_statpsych_example():
    # statpsych ci.ratio.median2(.05, y1, y2): 1.162162 [0.927667, 1.455933]
    y1 = np.array([36, 44, 47, 42, 49, 39, 46, 31, 33, 48], float)
    y2 = np.array([32, 39, 26, 35, 43, 27, 40, 37, 34, 29, 49, 42, 40], float)
    e = est.two_sample(y1, y2, "median", log_scale=True)
    lo, hi = e.bounds(norm.isf(0.025))
    assert math.exp(e.theta) == pytest.approx(1.162162, abs=1e-6)
    assert (math.exp(lo), math.exp(hi)) == (pytest.approx(0.927667, abs=1e-6), pytest.approx(1.455933, abs=1e-6))


def test_maritz_jarrett_matches_scipy():
    rng = np.random.default_rng(2)
    x = np.exp(rng.normal(0, 0.6, 333))
    for p in (0.1, 0.5, 0.9):
        _, se = est.quantile_mj(x, p)
        assert se == pytest.approx(float(mstats.mjci(x, prob=[p])[0]), rel=1e-12)
    batch = np.exp(rng.normal(0, 0.6, (4, 250)))
    _, ses = est.quantile_mj(batch, 0.9)
    assert ses == pytest.approx([float(mstats.mjci(row, prob=[0.9])[0]) for row in batch], rel=1e-12)


def test_bootstrap_estimator_agrees_with_order_statistics():
    crit = CriterionSpec("median", "relative-increase", 0.10, 200)
    v = judge(crit, quantile_sample(2000), quantile_sample(2000) * 1.25, estimator="bootstrap")
    assert v.outcome == "fail" and "bootstrap SE" in v.method
    assert v.ci_low == pytest.approx(1.202, abs=0.01)
    p90 = judge(CriterionSpec("p90", "relative-increase", 0.10, 200), quantile_sample(2000),
                quantile_sample(2000), estimator="bootstrap")
    assert p90.outcome == "pass"
    with pytest.raises(JudgeError, match="estimator 'jackknife'"):
        judge(crit, [1.0], [1.0], estimator="jackknife")
