"""What a prediction asks of the measures (issue 37): the false-positive rates the flows resolve and no
error for the rest, measures a short span cannot give left out, the KS distance from gap counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kistexp.anonymity import (
    FprResolutionError,
    attack_measures,
    flow_correlation,
    ks_distance,
    ks_distance_counts,
    scalars,
)
from kistexp.errors import AnonymityError
from kistexp.sim.circuittrace import gap_bin_edges_s
from tests.anonymity.anon_traces import bursty, trace


def _trace(n: int, w: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    g = bursty(rng, n, w)
    x = g + rng.poisson(1.0, (n, w)).astype(np.int32)  # the exit sees the guard's cells plus noise
    gaps = np.zeros((1, len(gap_bin_edges_s()) - 1), np.int64)  # one exit: 50 gaps over 10 bins
    gaps[0, 100:110] = 5
    return trace(guard_down=g, exit_down=x, paths=[(1000 + i, 2000 + i, 3000 + i, 4000) for i in range(n)],
                 gap_hist=gaps)


def test_unresolvable_rates_are_left_out_when_asked_else_refused():
    tr = _trace(300, 40)  # 300 flows: 1e-2 resolves, 1e-3 and 1e-4 do not
    with pytest.raises(FprResolutionError, match="needs at least 1,000 flows"):
        flow_correlation(tr, segment_s=4.0)
    fc = flow_correlation(tr, segment_s=4.0, skip_unresolvable=True)
    assert list(fc.tpr) == [0.01] and fc.n_flows == 300
    assert fc.tpr[0.01] > 0.9  # the exit's counts follow the guard's


def test_partial_measures_leave_out_what_the_span_cannot_give():
    tr = _trace(50, 30)  # 3 s: shorter than a 4-s segment
    with pytest.raises(AnonymityError, match="segment_s=4.0"):
        attack_measures(tr, regions={}, segment_s=4.0)
    m = attack_measures(tr, regions={}, segment_s=4.0, partial=True)
    assert m.flow is None and m.fingerprint is None
    figures = scalars(m)
    assert not any(k.startswith("attack_flow") for k in figures)
    assert figures["attack_gap_ks_distance"] == 0.0 and m.gaps.total == 50
    # the KS distance to a reference without gaps is unknown, not an error
    empty = attack_measures(trace(guard_down=np.zeros((2, 30), np.int32), exit_down=np.zeros((2, 30), np.int32)),
                            regions={}, segment_s=4.0, partial=True)
    assert math.isnan(scalars(m, empty)["attack_gap_ks_distance"])


def test_ks_distance_from_counts_is_the_distributions_ks_distance():
    a, b = _trace(20, 40, seed=1), _trace(20, 40, seed=2)
    ma = attack_measures(a, regions={}, segment_s=4.0, partial=True)
    assert ks_distance_counts(ma.gaps.counts, ma.gaps.counts) == 0.0
    shifted = np.roll(ma.gaps.counts, 5)  # half of the 10 bins move past the others
    assert ks_distance_counts(ma.gaps.counts, shifted) == pytest.approx(0.5)
    mb = attack_measures(b, regions={}, segment_s=4.0, partial=True)
    assert ks_distance(ma.gaps, mb.gaps) == ks_distance_counts(ma.gaps.counts, mb.gaps.counts)
    with pytest.raises(AnonymityError, match="different bins"):
        ks_distance_counts([1, 2], [1, 2, 3])
    with pytest.raises(AnonymityError, match="without gaps"):
        ks_distance_counts([0, 0], [1, 2])
