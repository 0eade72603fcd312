"""Throughput fingerprinting on synthetic probes, and the paired stage-minus-baseline statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kistexp.anonymity import fingerprinting, paired_difference, paired_differences
from kistexp.errors import AnonymityError
from tests.anonymity.anon_traces import trace

RELAYS = list(range(100, 116))  # 16 probed guard candidates


def _probe_trace(rng, n_targets: int, coupling: float, w: int = 300):
    """Targets on guards RELAYS[i % 16]; each relay's probe throughput falls when its targets send
    (by ``coupling``), plus noise.  One-hop probe circuits come after the targets."""
    tp = rng.poisson(30, (n_targets, w)) * (rng.random((n_targets, w)) < 0.5)
    guard = [RELAYS[i % 16] for i in range(n_targets)]
    probe = np.zeros((16, w))
    for i, g in enumerate(guard):
        probe[RELAYS.index(g)] -= coupling * tp[i]
    probe += 400 + rng.normal(0, 20, probe.shape)
    counts = np.vstack([tp, probe]).astype(np.int32)
    paths = [(1000 + i, guard[i], 2000 + i, 3000 + i) for i in range(n_targets)]
    paths += [(5000 + k, r) for k, r in enumerate(RELAYS)]
    tr = trace(guard_down=counts, exit_down=counts.copy(), client_in=counts.copy(), paths=paths)
    probes = {r: n_targets + k for k, r in enumerate(RELAYS)}
    return tr, probes


def test_a_probe_sharing_the_guard_separates_and_shrinks_the_guard_entropy():
    tr, probes = _probe_trace(np.random.default_rng(1), 48, coupling=1.0)
    fp = fingerprinting(tr, probes, window_s=1.0)
    assert fp.targets == 48 and fp.candidates == 16
    assert fp.auc > 0.9
    assert fp.median_r_on < -0.3 < 0.0  # the target takes the probe's throughput
    assert fp.entropy_before_bits == pytest.approx(4.0)
    assert fp.entropy_after_bits < 2.0 and fp.guard_top1 > 0.8


def test_unrelated_probes_leave_the_attacker_where_it_was():
    tr, probes = _probe_trace(np.random.default_rng(2), 48, coupling=0.0)
    fp = fingerprinting(tr, probes, window_s=1.0)
    assert 0.3 < fp.auc < 0.7
    assert fp.entropy_after_bits == pytest.approx(4.0, abs=0.3)
    assert fp.guard_top1 < 0.3


def test_a_prior_by_weight_and_too_few_targets():
    tr, probes = _probe_trace(np.random.default_rng(3), 48, coupling=0.0)
    w = {r: (8.0 if r == RELAYS[0] else 1.0) for r in RELAYS}
    fp = fingerprinting(tr, probes, window_s=1.0, prior_weights=w)
    p = np.array([8.0] + [1.0] * 15)
    assert fp.entropy_before_bits == pytest.approx(stats.entropy(p / p.sum(), base=2))
    with pytest.raises(AnonymityError, match="at least 5"):
        fingerprinting(tr, probes, targets=[0, 1, 2], window_s=1.0)


def test_paired_difference_is_the_t_interval_of_the_unit_differences():
    base = [0.10, 0.20, 0.15, 0.30, 0.25]
    stage = [0.12, 0.21, 0.19, 0.33, 0.26]
    d = paired_difference("x", base, stage)
    diffs = np.subtract(stage, base)
    ci = stats.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=stats.sem(diffs))
    assert (d.units, d.mean_difference) == (5, pytest.approx(diffs.mean()))
    assert (d.low, d.high) == (pytest.approx(ci[0]), pytest.approx(ci[1]))
    assert d.significant and d.noninferior(0.05) and not d.noninferior(0.03)


def test_paired_difference_edges():
    same = paired_difference("x", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.mean_difference, same.low, same.high, same.significant) == (0.0, 0.0, 0.0, False)
    shifted = paired_difference("x", [1.0, 2.0], [1.5, 2.5])
    assert (shifted.low, shifted.high) == (0.5, 0.5)  # every unit moved by the same amount
    partial = paired_difference("x", [1.0, math.nan, 3.0], [2.0, 5.0, math.nan])
    assert partial.units == 1 and math.isnan(partial.low)
    with pytest.raises(AnonymityError, match="paired"):
        paired_difference("x", [1.0], [1.0, 2.0])
    rows = paired_differences([{"a": 1.0, "b": 2.0}, {"a": 2.0}], [{"a": 2.0, "b": 2.5}, {"a": 2.5}])
    assert [(r.measure, r.units) for r in rows] == [("a", 2), ("b", 1)]
