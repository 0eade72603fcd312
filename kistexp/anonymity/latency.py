"""Latency leakage: how much a circuit's round-trip time tells about where its client is.

Source: Hopper, Vasserman, Chan-Tin, "How Much Anonymity does Network Latency Leak?", ACM CCS 2007 /
TISSEC 2010 (the spec, §2): a malicious server measuring a circuit's RTT narrows down the client's
location; lower and steadier queueing delay makes the estimate sharper.

Observations, per traced circuit whose client has a region (``regions``: client node -> region, e.g.
the population's client country or continent):

* **RTT**: one per circuit and trace block (1 s) holding RTT samples of the exit (packaging a cell to
  the circuit SENDME for it arriving, ``kistexp.sim.circuittrace``): the block's mean, what one visit
  of the server observes;
* **TTFB**: one per transfer whose first byte arrived in the trace's span.

``mutual_information_bits`` estimates I(region; value) in bits by binning the value into ``bins``
equal-frequency bins (by rank, ties in one bin) and taking the plug-in estimate of the contingency
table (counted with ``numpy.bincount``; entropies by ``scipy.stats.entropy``), corrected for its upward bias
with Miller and Madow's term (each entropy + (m - 1) / 2N nats, m its non-empty cells; Miller, 1955),
and reports the mean plug-in estimate over ``shuffles`` label permutations as the shuffled-label
baseline (its difference to the plug-in estimate is the second, assumption-free correction).  The
RTT's coefficient of variation for a fixed path is, per circuit (a circuit keeps its path), the
standard deviation over the mean of all its RTT samples in the span; the median over circuits with at
least ``min_samples`` samples is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import numpy as np
from scipy import stats

from kistexp.errors import AnonymityError
from kistexp.sim import CircuitTrace


@attrs.frozen
class MutualInformation:
    bits: float  # Miller-Madow corrected
    plugin_bits: float
    shuffled_bits: float  # mean plug-in estimate with the labels permuted
    samples: int
    regions: int
    bins: int

    @property
    def shuffle_corrected_bits(self) -> float:
        return self.plugin_bits - self.shuffled_bits


@attrs.frozen
class LatencyLeakage:
    rtt: MutualInformation | None  # None: too few RTT samples in the span
    ttfb: MutualInformation | None  # None: no transfer's first byte in the span
    rtt_cv_median: float  # nan: no circuit with min_samples RTT samples
    rtt_cv_circuits: int


def _entropy_mm(counts: np.ndarray, n: int) -> float:
    """Plug-in entropy (bits) of ``counts`` plus Miller and Madow's bias term (m - 1) / 2N nats."""
    m = int(np.count_nonzero(counts))
    return float(stats.entropy(counts.ravel(), base=2) + (m - 1) / (2 * n * math.log(2)))


def _plugin_mi(x: np.ndarray, y: np.ndarray, shape: tuple[int, int]) -> tuple[float, np.ndarray]:
    """Plug-in I(x; y) in bits of two integer codes (0 .. shape - 1), and their contingency table."""
    table = np.bincount(x * shape[1] + y, minlength=shape[0] * shape[1]).reshape(shape)
    n = table.sum()
    h = stats.entropy(table.sum(axis=1), base=2) + stats.entropy(table.sum(axis=0), base=2) \
        - stats.entropy(table.ravel(), base=2)
    return float(max(h, 0.0) if n else math.nan), table


def equal_frequency_bins(values: np.ndarray, bins: int) -> np.ndarray:
    """Bin index 0..bins-1 of each value by rank: equal-frequency bins, equal values in one bin."""
    ranks = stats.rankdata(values, method="min") - 1
    return np.minimum((ranks * bins) // len(values), bins - 1).astype(np.int64)


def mutual_information_bits(labels, values, *, bins: int = 8, shuffles: int = 20,
                            seed: int = 0) -> MutualInformation:
    """I(label; value) in bits, as the module docstring says."""
    labels = np.asarray(labels)
    values = np.asarray(values, np.float64)
    ok = np.isfinite(values)
    labels, values = labels[ok], values[ok]
    n = len(values)
    if n < 2 * bins:
        raise AnonymityError(f"mutual information: {n} samples, at least {2 * bins} needed for {bins} bins")
    _, codes = np.unique(labels, return_inverse=True)
    b = equal_frequency_bins(values, bins)
    shape = (int(codes.max()) + 1, bins)
    plugin, table = _plugin_mi(codes, b, shape)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]  # the rows and columns seen
    mm = _entropy_mm(table.sum(axis=1), n) + _entropy_mm(table.sum(axis=0), n) - _entropy_mm(table, n)
    rng = np.random.default_rng(seed)
    shuffled = float(np.mean([_plugin_mi(rng.permutation(codes), b, shape)[0] for _ in range(shuffles)])) \
        if shuffles else math.nan
    return MutualInformation(float(mm), plugin, shuffled, n, table.shape[0], table.shape[1])


def rtt_observations(trace: CircuitTrace, regions: Mapping[int, str]) -> tuple[np.ndarray, np.ndarray]:
    """(region, block mean RTT in ms) of every traced circuit's blocks holding RTT samples."""
    rows = [i for i, p in enumerate(trace.paths) if p[0] in regions]
    cnt = trace.rtt_count[rows]
    has = cnt > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = trace.rtt_sum_ms[rows] / cnt
    lab = np.repeat([regions[trace.paths[i][0]] for i in rows], cnt.shape[1]).reshape(cnt.shape)
    return lab[has], mean[has]


def ttfb_observations(trace: CircuitTrace, regions: Mapping[int, str]) -> tuple[np.ndarray, np.ndarray]:
    """(region, TTFB in ms) of the traced transfers whose first byte arrived in the span."""
    clients = [trace.paths[i][0] for i in trace.transfer_trace_index]
    keep = np.array([c in regions for c in clients], bool)
    lab = np.array([regions[c] for c in clients if c in regions])
    return lab, trace.transfer_ttfb_s[keep] * 1e3


def rtt_cv(trace: CircuitTrace, min_samples: int = 10) -> np.ndarray:
    """Per traced circuit with a guard (not a one-hop probe) and at least ``min_samples`` RTT samples in
    the span: std / mean of its RTT."""
    n = trace.rtt_count.sum(axis=1).astype(np.float64)
    s = trace.rtt_sum_ms.sum(axis=1)
    ss = trace.rtt_sumsq_ms.sum(axis=1)
    ok = (n >= max(min_samples, 2)) & np.array([len(p) >= 3 for p in trace.paths], bool)
    mean = s[ok] / n[ok]
    var = np.maximum(ss[ok] - n[ok] * mean**2, 0.0) / (n[ok] - 1)  # from the streamed moments
    return np.sqrt(var) / mean


def latency_leakage(trace: CircuitTrace, regions: Mapping[int, str], *, bins: int = 8, shuffles: int = 20,
                    seed: int = 0, min_samples: int = 10) -> LatencyLeakage:
    """The measures of the module docstring for ``trace``; ``regions`` maps client nodes to regions."""
    out = []
    for lab, val in (rtt_observations(trace, regions), ttfb_observations(trace, regions)):
        out.append(mutual_information_bits(lab, val, bins=bins, shuffles=shuffles, seed=seed)
                   if len(val) >= 2 * bins and len(set(lab.tolist())) > 1 else None)
    cv = rtt_cv(trace, min_samples)
    return LatencyLeakage(out[0], out[1], float(np.median(cv)) if len(cv) else math.nan, len(cv))
