"""Bandwidth-weighted per-relay comparisons (spec judge.md §2.5)."""

from __future__ import annotations

import numpy as np
import pytest

from kistexp.judge import CriterionSpec, judge
from kistexp.judge import estimators as est


def _relays(seed: int = 0, r: int = 40, big_change: float = 2.0, small_change: float = 1.0):
    """Relays whose bandwidth spans ~100x; only the fastest quarter change."""
    rng = np.random.default_rng(seed)
    bw = np.exp(rng.normal(np.log(5e6), 1.15, r))
    big = bw >= np.quantile(bw, 0.75)
    base, stage, weights = {}, {}, {}
    for i in range(r):
        level = bw[i]
        f = big_change if big[i] else small_change
        base[f"R{i:02d}"] = level * np.exp(rng.normal(0, 0.05, 48))
        stage[f"R{i:02d}"] = level * f * np.exp(rng.normal(0, 0.05, 48))
        weights[f"R{i:02d}"] = float(level)
    return base, stage, weights


def test_bandwidth_metric_is_decided_by_the_average_byte():
    base, stage, weights = _relays()
    crit = CriterionSpec("mean", "relative-increase", 0.25, 100, metric="relay_bandwidth_bytes_per_s")
    weighted = judge(crit, base, stage, relay_weights=weights)
    plain = judge(crit, base, stage)
    assert plain.outcome != "fail" and plain.effect < 1.05  # the typical relay did not change
    assert weighted.method.startswith("bandwidth-weighted") and weighted.effect > 1.4
    assert weighted.outcome == "fail" and "unweighted (typical relay)" in weighted.detail


def test_cpu_reports_the_weighted_change_beside_the_unweighted_decision():
    base, stage, weights = _relays()
    crit = CriterionSpec("mean", "relative-increase", 0.25, 100, metric="relay_cpu_utilization")
    v = judge(crit, base, stage, relay_weights=weights)
    assert "paired per-relay" in v.method and v.outcome != "fail" and v.effect < 1.05
    assert "bandwidth-weighted (average byte)" in v.detail and "Kish n_eff" in v.detail


def test_weighted_estimate_and_kish_size():
    y = np.array([0.0, 0.0, 0.3, 0.3])
    e = est.weighted_paired(y, np.array([1.0, 1.0, 2.0, 2.0]))
    assert e.theta == pytest.approx(0.2) and e.df == pytest.approx(est.kish_n(np.array([1, 1, 2, 2.0])) - 1)
    # spec §2.5: n_eff ≈ e^(−σ²)·R = 0.26 R for a bandwidth log-SD of 1.15
    w = np.exp(np.random.default_rng(0).normal(0, 1.15, 200_000))
    assert est.kish_n(w) / w.size == pytest.approx(0.266, abs=0.01)


def test_weights_for_too_few_relays_are_a_data_problem():
    base, stage, _ = _relays()
    crit = CriterionSpec("mean", "relative-increase", 0.25, 100, metric="relay_bandwidth_bytes_per_s")
    v = judge(crit, base, stage, relay_weights={"R00": 1.0})
    assert (v.outcome, v.reason) == ("inconclusive", "data_quality")
