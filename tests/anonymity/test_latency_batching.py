"""Latency leakage (mutual information, RTT variation) and batching (exit gaps) with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kistexp.anonymity import gap_distribution, ks_distance, latency_leakage, mutual_information_bits
from kistexp.anonymity.batching import GapDistribution, exit_periods_ms
from kistexp.anonymity.latency import equal_frequency_bins, rtt_cv
from kistexp.errors import AnonymityError
from tests.anonymity.anon_traces import trace


def test_mi_of_independent_region_and_rtt_is_near_zero_after_the_correction():
    rng = np.random.default_rng(1)
    n = 3000
    regions = rng.choice(["DE", "US", "NL", "FR", "SE"], n)
    rtt = rng.lognormal(4, 0.5, n)
    mi = mutual_information_bits(regions, rtt, bins=8, seed=1)
    # the plug-in estimate is biased up by about (5 - 1)(8 - 1) / (2 N ln 2) = 0.0067 bits
    assert mi.plugin_bits > 0.003
    assert abs(mi.bits) < 0.003
    assert abs(mi.shuffle_corrected_bits) < 0.003
    assert mi.plugin_bits == pytest.approx(mi.shuffled_bits, abs=0.004)
    assert (mi.samples, mi.regions, mi.bins) == (n, 5, 8)


def test_mi_of_a_region_that_fixes_the_rtt_is_the_regions_entropy():
    rng = np.random.default_rng(2)
    n = 4000
    regions = rng.permutation(np.repeat(["EU", "NA"], n // 2))  # one bit; each region fills four bins
    rtt = np.where(regions == "EU", 40.0, 120.0) + rng.normal(0, 2, n)
    mi = mutual_information_bits(regions, rtt, bins=8)
    assert mi.plugin_bits == pytest.approx(1.0, abs=1e-12)
    assert mi.bits == pytest.approx(1.0, abs=0.002)  # Miller-Madow's term: (2 - 1 + 8 - 1 - 8 + 1) / 2N nats
    assert mi.shuffled_bits < 0.01


def test_mi_refuses_too_few_samples_and_bins_by_rank():
    with pytest.raises(AnonymityError, match="samples"):
        mutual_information_bits(["a"] * 10, np.arange(10.0), bins=8)
    b = equal_frequency_bins(np.array([5.0, 1.0, 1.0, 3.0, 9.0, 7.0, 2.0, 8.0]), 4)
    assert b.tolist() == [2, 0, 0, 1, 3, 2, 1, 3]  # equal values share a bin


def test_latency_leakage_reads_rtt_blocks_and_ttfb_with_client_regions():
    rng = np.random.default_rng(3)
    n, w = 200, 100  # 10 blocks
    paths = [(i % 2, 100 + i, 200 + i, 300 + i) for i in range(n)]  # client node 0 in DE, 1 in US
    base = np.where(np.arange(n) % 2 == 0, 30.0, 90.0)[:, None]
    rtt = base + rng.normal(0, 3, (n, 10))
    idx = np.repeat(np.arange(n), 3)
    ttfb = (base[idx, 0] * 3 + rng.normal(0, 10, len(idx))) / 1e3
    tr = trace(guard_down=np.zeros((n, w), np.int32), exit_down=np.zeros((n, w), np.int32), paths=paths,
               rtt_blocks=rtt, transfer_index=idx, transfer_ttfb_s=ttfb)
    lat = latency_leakage(tr, {0: "DE", 1: "US"})
    assert lat.rtt.samples == n * 10 and lat.rtt.bits == pytest.approx(1.0, abs=0.02)
    assert lat.ttfb.samples == 3 * n and lat.ttfb.bits > 0.9
    # one sample per block, ten per circuit: each circuit's CV is its ten blocks' std / mean
    expect = [stats.variation(rtt[i], ddof=1) for i in range(n)]
    assert lat.rtt_cv_circuits == n and lat.rtt_cv_median == pytest.approx(np.median(expect))
    unknown = latency_leakage(tr, {})  # no client with a region: nothing to estimate
    assert unknown.rtt is None and unknown.ttfb is None


def test_rtt_cv_pools_a_circuits_samples_from_streamed_moments():
    rtt = np.array([[10.0, 20.0, np.nan], [5.0, 5.0, 5.0]])
    count = np.array([[4, 6, 0], [10, 10, 10]])
    tr = trace(guard_down=np.zeros((2, 30), np.int32), exit_down=np.zeros((2, 30), np.int32), rtt_blocks=rtt,
               rtt_count=count)
    samples = np.repeat([10.0, 20.0], [4, 6])
    assert rtt_cv(tr).tolist() == pytest.approx([stats.variation(samples, ddof=1), 0.0])
    assert len(rtt_cv(tr, min_samples=11)) == 1


def _gaps(samples_s: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.histogram(samples_s, bins=edges)[0]


def test_ks_of_identical_gap_distributions_is_zero_and_of_disjoint_ones_one():
    edges = trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32)).gap_bin_edges_s
    rng = np.random.default_rng(4)
    a = GapDistribution(_gaps(rng.lognormal(-6, 1, 5000), edges), edges, math.nan, math.nan)
    assert ks_distance(a, a) == 0.0
    far = GapDistribution(_gaps(rng.uniform(1.0, 2.0, 100), edges), edges, math.nan, math.nan)
    assert ks_distance(a, far) == 1.0


def test_binned_ks_is_scipys_two_sample_statistic_on_the_binned_gaps():
    edges = trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32)).gap_bin_edges_s
    rng = np.random.default_rng(5)
    x, y = rng.lognormal(-6, 1, 3000), rng.lognormal(-5.8, 1.2, 2000)
    hx, hy = _gaps(x, edges), _gaps(y, edges)
    d = ks_distance(GapDistribution(hx, edges, 0, 0), GapDistribution(hy, edges, 0, 0))
    bx, by = np.digitize(x, edges) - 1, np.digitize(y, edges) - 1  # each gap at its bin
    assert d == pytest.approx(stats.ks_2samp(bx, by).statistic, abs=1e-12)
    assert d == pytest.approx(stats.ks_2samp(x, y).statistic, abs=0.02)  # the bins are 6 % wide


def test_share_of_gaps_at_the_run_period():
    base = trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32))
    edges = base.gap_bin_edges_s
    # KIST at 10 ms on a 4 ms tick runs every 12 ms: 300 gaps there, 700 within a segment (20 us)
    hist = _gaps(np.concatenate([np.full(300, 0.0121), np.full(700, 20e-6)]), edges)[None, :]
    tr = trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32), gap_hist=hist)
    assert exit_periods_ms(tr).tolist() == [12.0]
    g = gap_distribution(tr)
    assert g.share_at_period == pytest.approx(0.3) and g.total == 1000
    assert g.median_gap_ms == pytest.approx(0.02, rel=0.04)
    # at 2 ms the period is 4 ms: none of these gaps
    assert gap_distribution(trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32),
                                  gap_hist=hist, exit_interval_ms=2)).share_at_period == 0.0
    # an exit on Vanilla is compared with the period KIST would run at there
    van = trace(guard_down=np.zeros((1, 10), np.int32), exit_down=np.zeros((1, 10), np.int32), gap_hist=hist,
                exit_scheduler="vanilla")
    assert gap_distribution(van).share_at_period == pytest.approx(0.3)
