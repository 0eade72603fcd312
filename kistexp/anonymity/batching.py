"""Batching: the gaps between a circuit's cells as an observer at its exit sees them leave.

KIST releases cells per scheduler run, so the run period shapes the inter-cell gaps an observer next to
the exit sees (the spec, §4).  The trace holds, per exit, the histogram of gaps between consecutive
cells of one circuit leaving that exit toward the middle, in the simulator's log-spaced delay bins
(40 per decade from 1 us; bin 0 is [0, 1 us): cells of one TCP segment leave together).  Reported:

* the pooled distribution over the exits (``GapDistribution``);
* its Kolmogorov-Smirnov distance to another one (the baseline's), ``ks_distance``: the largest
  difference of the two empirical distribution functions.  The histograms share their bins, so this
  is the two-sample KS statistic (``scipy.stats.ks_2samp``) of the gaps rounded to their bins' edges;
  scipy has no binned form, hence the two numpy lines;
* the share of gaps "equal to the run period": within ``tolerance`` (relative) of the period the exit's
  scheduler runs at under backlog, ``kistexp.population.kernels.effective_interval_ms`` (the interval
  quantised to the kernel tick, kist-ewma.md §5.2), a bin counting when its geometric centre falls in
  the band (for an exit on Vanilla, the period KIST would run at there).
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from kistexp.errors import AnonymityError
from kistexp.population.kernels import effective_interval_ms
from kistexp.sim import CircuitTrace


@attrs.frozen(eq=False)
class GapDistribution:
    counts: np.ndarray  # [bin] gaps, pooled over exits
    edges_s: np.ndarray  # [bin + 1]; the last edge is inf
    share_at_period: float  # nan: no gaps at an exit with a run period
    median_gap_ms: float

    @property
    def total(self) -> int:
        return int(self.counts.sum())


def _centres_s(edges: np.ndarray) -> np.ndarray:
    lo, hi = edges[:-1], edges[1:].copy()
    hi[-1] = lo[-1] * (edges[2] / edges[1])  # the open last bin: one more log step
    out = np.sqrt(np.maximum(lo, 1e-12) * hi)
    out[0] = hi[0] / 2
    return out


def exit_periods_ms(trace: CircuitTrace) -> np.ndarray:
    """Each traced exit's KIST run period under backlog in ms, from the interval it holds and its kernel
    tick; for an exit running Vanilla, the period KIST would run at there (what its gaps are compared
    with when a stage moves it off KIST); 0 for an interval of 1 ms (back-to-back runs)."""
    return np.array([effective_interval_ms(int(i), 1000.0 / t) for i, t in
                     zip(trace.exit_interval_ms, trace.exit_tick_ms, strict=True)], np.float64)


def gap_distribution(trace: CircuitTrace, tolerance: float = 0.1) -> GapDistribution:
    """The exits' pooled gap distribution and the share of gaps at their run period."""
    h = trace.gap_hist
    counts = h.sum(axis=0)
    centres = _centres_s(trace.gap_bin_edges_s)
    periods = exit_periods_ms(trace) / 1e3
    at = total = 0
    for slot, p in enumerate(periods):
        if not math.isfinite(p) or p <= 0:
            continue
        band = (centres >= p * (1 - tolerance)) & (centres <= p * (1 + tolerance))
        at += int(h[slot, band].sum())
        total += int(h[slot].sum())
    n = int(counts.sum())
    median = math.nan
    if n:
        b = int(np.searchsorted(np.cumsum(counts), n / 2))
        median = float(centres[b] * 1e3)
    return GapDistribution(counts, trace.gap_bin_edges_s.copy(), at / total if total else math.nan, median)


def ks_distance(a: GapDistribution, b: GapDistribution) -> float:
    """The largest difference between the two distributions' empirical CDFs (on their shared bins)."""
    return ks_distance_counts(a.counts, b.counts)


def ks_distance_counts(a, b) -> float:
    """``ks_distance`` of two gap histograms given as counts per bin (the same bins): what a prediction's
    runs send back, so that each stage is compared with its network's baseline where they meet."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AnonymityError("KS distance: gap histograms with different bins")
    na, nb = a.sum(), b.sum()
    if not na or not nb:
        raise AnonymityError("KS distance: a gap distribution without gaps")
    return float(np.max(np.abs(np.cumsum(a) / na - np.cumsum(b) / nb)))
