"""The lint's power forecast against the spec's sample sizes and the judge's measured rates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm, t

from kistexp.judge import simulate
from kistexp.metrics import catalogue
from kistexp.stats import power
from kistexp.stats.sequential import fixed_boundary

Z = fixed_boundary(0.05)


def test_every_catalogue_metric_has_a_variability():
    assert set(power.METRIC_VARIABILITY) == set(catalogue.names())


def test_spec_sample_sizes_for_80_percent():
    # spec §4.1: the median needs 770/side to PASS at true 0 with thr 10 % (sigma 0.6, DEFF 1)
    var = power.Variability("continuous", 0.6, 1.0)
    p_pass, _ = power.decision_power("median", "relative-increase", 0.10, var, 770, 770, Z)
    assert p_pass == pytest.approx(0.80, abs=0.005)
    # and 924/side to FAIL at +20 %
    _, p_fail = power.decision_power("median", "relative-increase", 0.10, var, 924, 924, Z)
    assert p_fail == pytest.approx(0.80, abs=0.005)


@pytest.mark.parametrize(("statistic", "n", "ratio"), [("median", 200, 1.15), ("mean", 300, 1.10),
                                                       ("p90", 500, 1.15), ("median", 500, 1.05)])
def test_forecast_matches_measured_power(statistic, n, ratio):
    measured, _ = simulate.one_look(np.random.default_rng(1), 4000, n, statistic, 0.6, ratio, 0.0)
    var = power.Variability("continuous", 0.6, 1.0)
    # threshold 0: FAIL at `ratio` is power against any rise; the forecast's "twice the threshold"
    # is not used here, so compute it from the same standard error
    se = power.end_se(statistic, "relative-increase", var, n, n)
    forecast = norm.cdf(np.log(ratio) / se - Z)
    assert measured == pytest.approx(forecast, abs=0.03)


def test_relay_forecast_matches_measured_paired_power():
    rng = np.random.default_rng(3)
    var = power.Variability("relay", sigma_log=0.3, deff=1.0, spread=0.2, relays=20)
    measured, _ = simulate.paired_relays(rng, 4000, 20, 25, 1.10, 0.0, spread=0.2, noise_sd=0.3)
    # thr 0: P(FAIL at +10 %) is the forecast's PASS-side formula with the bound at 0
    forecast, _ = power.decision_power("mean", "relative-increase", 0.0, var, 20 * 25, 20 * 25, Z)
    # 20 relays: the signed-rank interval, whose SE is the paired t's over sqrt(3/pi), at the t_19 quantile
    se = power.end_se("mean", "relative-increase", var, 20 * 25, 20 * 25) / np.sqrt(3 / np.pi)
    c = t.isf(0.05, 19)
    assert measured == pytest.approx(norm.cdf(np.log(1.10) / se - c), abs=0.04)
    assert forecast == pytest.approx(norm.cdf(0 - c), abs=1e-9)
