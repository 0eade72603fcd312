"""The judge on real OnionPerf circuit build times (op-hk6a, 2021-06-01, 5,841 build times)."""

from __future__ import annotations

import numpy as np
import pytest

from kistexp.judge import CriterionSpec, Window, judge
from kistexp.judge.inputs import read_samples

HK6A = "onionperf/2021-06-01.op-hk6a.onionperf.analysis.json.xz"


@pytest.fixture(scope="module")
def build_times(shared_data):
    window = read_samples(f"{shared_data / HK6A}@build-time")
    order = np.argsort(window.times, kind="stable")
    times, values = window.times[order], window.values[order]
    assert values.size == 5841 and np.median(values) == pytest.approx(0.88, abs=0.005)
    return times, values


@pytest.mark.parametrize("statistic", ["median", "mean", "p90", "shift"])
def test_two_halves_of_one_day_do_not_fail_and_a_20_percent_rise_does(build_times, statistic):
    times, values = build_times
    crit = CriterionSpec(statistic, "relative-increase", 0.10, 200)
    # the halves interleave in time (alternate circuits), so both cover every hour of the day
    base = Window(values[0::2], times[0::2])
    same = judge(crit, base, Window(values[1::2], times[1::2]))
    assert same.outcome != "fail" and same.ci_low < 1.0 < same.ci_high
    risen = judge(crit, base, Window(values[1::2] * 1.2, times[1::2]))
    assert risen.outcome == "fail" and risen.ci_low > 1.10
    assert risen.n_baseline == 2921 and risen.n_stage == 2920


def test_o6_afternoon_against_morning_is_a_coverage_problem(build_times):
    times, values = build_times
    hour = (times // 3600) % 24
    crit = CriterionSpec("median", "relative-increase", 0.10, 200)
    v = judge(crit, Window(values[hour < 12], times[hour < 12]), Window(values[hour >= 12], times[hour >= 12]))
    assert (v.outcome, v.reason) == ("inconclusive", "coverage")
    # without times the judge sees the 10.7 % drift between day halves (spec §5.4) and cannot clear it
    naive = judge(crit, values[hour < 12], values[hour >= 12])
    assert naive.effect == pytest.approx(1.107, abs=0.002) and naive.outcome != "pass"


def test_design_effect_from_hourly_blocks_widens_the_interval(build_times):
    times, values = build_times
    crit = CriterionSpec("median", "relative-increase", 0.10, 200)
    with_times = judge(crit, Window(values[0::2], times[0::2]), Window(values[1::2], times[1::2]))
    without = judge(crit, values[0::2], values[1::2])
    assert "design effect" in with_times.detail
    assert (with_times.ci_high - with_times.ci_low) > 2 * (without.ci_high - without.ci_low)


def test_hour_block_bootstrap_on_real_build_times(build_times):
    times, values = build_times
    crit = CriterionSpec("p90", "relative-increase", 0.10, 200)
    base = Window(values[0::2], times[0::2])
    same = judge(crit, base, Window(values[1::2], times[1::2]), estimator="bootstrap")
    risen = judge(crit, base, Window(values[1::2] * 1.2, times[1::2]), estimator="bootstrap")
    assert same.outcome == "pass" and risen.outcome == "fail"
    assert same.method == "hour-block bootstrap SE of the p90"
