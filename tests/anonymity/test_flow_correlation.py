"""Flow correlation (RAPTOR's windowed Spearman correlator) on synthetic traces with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from kistexp.anonymity import FprResolutionError, flow_correlation, resolvable_fprs, tpr_at_fpr
from kistexp.anonymity.flowcorr import rank_correlation_matrix
from kistexp.errors import AnonymityError
from tests.anonymity.anon_traces import bursty, trace


def test_identical_guard_and_exit_series_give_tpr_one():
    rng = np.random.default_rng(1)
    g = bursty(rng, 1200, 60)
    fc = flow_correlation(trace(guard_down=g, exit_down=g.copy()), direction="down", fprs=(1e-2, 1e-3))
    assert fc.n_flows == 1200 and fc.n_false_pairs == 1200 * 1199
    assert fc.tpr == {1e-2: 1.0, 1e-3: 1.0}
    assert fc.median_true == pytest.approx(1.0) and fc.auc == pytest.approx(1.0)


def test_independent_series_give_tpr_near_the_fpr():
    rng = np.random.default_rng(2)
    n = 2000
    fc = flow_correlation(trace(guard_down=bursty(rng, n, 50), exit_down=bursty(rng, n, 50)), direction="down",
                          fprs=(1e-2, 1e-3))
    sd = np.sqrt(0.01 * 0.99 / n)
    assert abs(fc.tpr[1e-2] - 0.01) < 4 * sd  # true pairs are just more pairs of independent flows
    assert fc.tpr[1e-3] < 0.005
    assert fc.auc == pytest.approx(0.5, abs=0.03)


def test_noisy_copies_sit_between_the_two():
    rng = np.random.default_rng(3)
    g = bursty(rng, 1100, 40)
    x = rng.binomial(g, 0.6) + rng.poisson(3, g.shape)  # the exit sees a thinned, noisier copy
    fc = flow_correlation(trace(guard_down=g, exit_down=x.astype(np.int32)), direction="down", fprs=(1e-2, 1e-3))
    assert 0.5 < fc.tpr[1e-3] <= fc.tpr[1e-2] <= 1.0


def test_an_fpr_the_flows_cannot_resolve_is_refused_with_what_it_needs():
    rng = np.random.default_rng(4)
    g = bursty(rng, 500, 30)
    tr = trace(guard_down=g, exit_down=g.copy())
    with pytest.raises(FprResolutionError, match=r"1,000 flows.*500 flows"):
        flow_correlation(tr, direction="down", fprs=(1e-2, 1e-3))
    assert flow_correlation(tr, direction="down", fprs=(1e-2,)).tpr == {1e-2: 1.0}
    assert issubclass(FprResolutionError, AnonymityError)
    assert resolvable_fprs(500, 500 * 499) == (1e-2,)
    assert resolvable_fprs(1000, 999_000) == (1e-2, 1e-3)
    assert resolvable_fprs(10_000, 10_000) == (1e-2, 1e-3, 1e-4)
    with pytest.raises(FprResolutionError):  # enough flows, too few false pairs
        tpr_at_fpr(np.ones(2000), np.zeros(500), 1e-3)


def test_threshold_counts_at_most_the_fpr_of_false_pairs_above_it():
    false = np.arange(1000, dtype=float)  # 0 .. 999
    # FPR 1e-2: ten false scores (990 .. 999) may score above the threshold, 989
    true = np.concatenate([np.full(50, 995.0), np.full(30, 989.0), np.full(20, 100.0)])
    assert tpr_at_fpr(true, false, 1e-2) == 0.5  # a tie with the threshold is a negative
    assert tpr_at_fpr(np.full(100, 989.5), false, 1e-2) == 1.0
    assert np.mean(false > 989) == 1e-2


def test_rank_correlation_matrix_is_scipys_spearman_ties_included():
    rng = np.random.default_rng(5)
    a = rng.poisson(1.0, (6, 25))  # many ties
    b = rng.poisson(1.0, (4, 25))
    m = rank_correlation_matrix(a, b)
    for i in range(6):
        for j in range(4):
            assert m[i, j] == pytest.approx(stats.spearmanr(a[i], b[j]).statistic, abs=1e-12)


def test_segments_make_flows_and_constant_series_are_left_out():
    rng = np.random.default_rng(6)
    g = bursty(rng, 50, 60)
    g[:5] = 0  # five idle circuits
    fc = flow_correlation(trace(guard_down=g, exit_down=g.copy()), direction="down", segment_s=2.0, fprs=())
    assert fc.segment_s == pytest.approx(2.0)
    assert fc.n_flows + fc.excluded_flows == 50 * 3
    assert fc.excluded_flows >= 5 * 3
    with pytest.raises(AnonymityError, match="whole number"):
        flow_correlation(trace(guard_down=g, exit_down=g), segment_s=0.25, fprs=())


def test_both_directions_are_one_vector_per_side():
    rng = np.random.default_rng(7)
    down = bursty(rng, 40, 30)
    up = rng.poisson(1.0, down.shape).astype(np.int32)
    tr = trace(guard_down=down, exit_down=down.copy(), guard_up=up,
               exit_up=rng.poisson(1.0, down.shape).astype(np.int32))
    both = flow_correlation(tr, direction="both", fprs=())
    only_down = flow_correlation(tr, direction="down", fprs=())
    assert only_down.median_true == pytest.approx(1.0)
    assert both.median_true < only_down.median_true  # the independent upstream halves dilute it
    with pytest.raises(AnonymityError, match="direction"):
        flow_correlation(tr, direction="sideways", fprs=())
