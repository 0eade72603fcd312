"""Flow correlation: a windowed cell-count correlator between the guard and the exit of every circuit.

Source: RAPTOR (Sun et al., USENIX Security 2015): an observer of both ends of a circuit correlates the
byte counts it sees per time window with Spearman's rank correlation, asymmetric traffic (one direction
at one end, the other at the other) included.  DeepCorr (Nasr et al., CCS 2018) and DeepCoFFEA (Oh et
al., S&P 2022) are learned correlators, out of scope: this statistical correlator is the reproducible
baseline (the spec, /work/shared/spec/anonymity.md §3).

Flows: each traced circuit's series over ``[t0, t1)`` of the trace, cut into segments of ``segment_s``
(``None``: one segment, the whole span).  A flow is (circuit, segment); the guard side is the cells
entering the guard, the exit side the cells leaving the exit, per 100 ms window (the trace's), in the
direction(s) asked: ``down`` (toward the client), ``up``, or ``both`` (the two concatenated, one
vector per side).  Every flow of a segment is scored against every flow of the same segment: the
true pair (same circuit) and all false pairs (different circuits, same time span).  A flow whose guard
or exit vector is constant (no cells, or a perfectly steady count) has no rank correlation and is left
out (counted in ``excluded_flows``).

TPR at FPR ``a``: the threshold is the ``(floor(a N_f) + 1)``-th largest false score (``N_f`` false
pairs), so at most ``a N_f`` false pairs score above it; the TPR is the share of true pairs scoring
above it (ties at the threshold count as negatives).  An FPR is *resolvable* when the trace has at least
``1 / a`` flows and ``1 / a`` false pairs (the spec: "at least 1,000 flows so 1e-3 is measurable");
asking for one that is not raises :class:`FprResolutionError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
from scipy import stats

from kistexp.errors import AnonymityError
from kistexp.sim import CircuitTrace

DEFAULT_FPRS = (1e-2, 1e-3, 1e-4)
#: false scores the AUC is computed from, at most (drawn at random, seeded, when there are more)
AUC_FALSE_MAX = 100_000
DIRECTIONS = ("down", "up", "both")


class FprResolutionError(AnonymityError):
    """A false-positive rate finer than the number of flows (or false pairs) can resolve."""


@attrs.frozen
class FlowCorrelation:
    """Scores of true and false guard/exit pairs and the TPR at each FPR asked for."""

    direction: str
    segment_s: float
    n_flows: int  # true pairs scored
    n_false_pairs: int
    excluded_flows: int  # (circuit, segment) pairs left out: a constant series at one end
    tpr: dict[float, float]  # FPR -> TPR
    auc: float  # P(true score > false score), ties half (Mann-Whitney; from AUC_FALSE_MAX false scores at most)
    median_true: float
    median_false: float  # of the false scores the AUC used
    true_scores: np.ndarray = attrs.field(repr=False, eq=False)


def min_flows(fpr: float) -> int:
    """Flows (and false pairs) a trace needs for ``fpr`` to be resolvable."""
    return math.ceil(1.0 / fpr - 1e-9)


def resolvable_fprs(n_flows: int, n_false_pairs: int, fprs: Sequence[float] = DEFAULT_FPRS) -> tuple[float, ...]:
    """The rates of ``fprs`` that ``n_flows`` true and ``n_false_pairs`` false pairs can resolve."""
    return tuple(a for a in fprs if min(n_flows, n_false_pairs) >= min_flows(a))


def check_resolvable(fpr: float, n_flows: int, n_false_pairs: int) -> None:
    if not 0 < fpr < 1:
        raise AnonymityError(f"false-positive rate {fpr!r} must be in (0, 1)")
    need = min_flows(fpr)
    if n_flows < need or n_false_pairs < need:
        raise FprResolutionError(
            f"false-positive rate {fpr:g} cannot be resolved: it needs at least {need:,} flows and {need:,} false "
            f"pairs, the traces give {n_flows:,} flows and {n_false_pairs:,} false pairs (trace more circuits, "
            "longer spans or shorter segments, or ask for a coarser rate)")


def tpr_at_fpr(true_scores: np.ndarray, false_scores: np.ndarray, fpr: float) -> float:
    """True-positive rate at false-positive rate ``fpr`` (see the module docstring); refuses an
    unresolvable rate (:class:`FprResolutionError`)."""
    t = np.asarray(true_scores, np.float64)
    f = np.asarray(false_scores, np.float64)
    check_resolvable(fpr, len(t), len(f))
    k = int(math.floor(fpr * len(f) + 1e-9))
    threshold = -np.partition(-f, k)[k]  # the (k + 1)-th largest false score
    return float(np.mean(t > threshold))


def rank_correlation_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation of every row of ``a`` with every row of ``b`` ([n, m] x [k, m] ->
    [n, k]): the Pearson correlation of the rows' average ranks (``scipy.stats.rankdata``), as
    ``scipy.stats.spearmanr`` computes it, for all pairs in one matrix product."""
    za = stats.zscore(stats.rankdata(a, axis=1), axis=1)
    zb = stats.zscore(stats.rankdata(b, axis=1), axis=1)
    return za @ zb.T / a.shape[1]


def _sides(trace: CircuitTrace, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """Guard-side and exit-side series [circuit, direction part, window] for ``direction``."""
    if direction not in DIRECTIONS:
        raise AnonymityError(f"flow correlation direction {direction!r}: one of {', '.join(DIRECTIONS)}")
    pick = {"up": [0], "down": [1], "both": [0, 1]}[direction]
    return trace.guard_in[:, pick].astype(np.float64), trace.exit_out[:, pick].astype(np.float64)


def flow_correlation(trace: CircuitTrace, *, circuits: Sequence[int] | None = None, direction: str = "both",
                     segment_s: float | None = None, fprs: Sequence[float] = DEFAULT_FPRS,
                     skip_unresolvable: bool = False) -> FlowCorrelation:
    """Score every (circuit, segment) flow of ``trace`` (``circuits``: the circuit ids to use, by
    default every traced one whose guard is not its exit) against all flows of its segment; TPR at
    ``fprs`` (a rate the flows cannot resolve raises ``FprResolutionError``, or with
    ``skip_unresolvable`` is left out of ``tpr``: a prediction reports the rates its runs resolve)."""
    if circuits is None:
        rows = np.array([i for i, p in enumerate(trace.paths) if len(p) >= 3], np.int64)
    else:
        rows = np.array([trace.index(int(c)) for c in circuits], np.int64)
    if len(rows) < 2:
        raise AnonymityError(f"flow correlation: {len(rows)} circuit(s) to correlate, at least 2 are needed")
    guard, exit_ = _sides(trace, direction)
    guard, exit_ = guard[rows], exit_[rows]
    n_win = trace.n_windows
    per = n_win if segment_s is None else int(round(segment_s / trace.window_s))
    if per < 3 or per > n_win or (segment_s is not None and abs(per * trace.window_s - segment_s) > 1e-9):
        raise AnonymityError(f"flow correlation segment_s={segment_s!r}: a whole number of the trace's "
                             f"{trace.window_s:g}-s windows, at least 3 and at most the trace's {n_win}")
    true_parts, false_parts = [], []
    excluded = 0
    for s0 in range(0, n_win - per + 1, per):
        g = guard[:, :, s0:s0 + per].reshape(len(rows), -1)
        x = exit_[:, :, s0:s0 + per].reshape(len(rows), -1)
        ok = (np.ptp(g, axis=1) > 0) & (np.ptp(x, axis=1) > 0)
        excluded += int((~ok).sum())
        if ok.sum() < 1:
            continue
        c = rank_correlation_matrix(g[ok], x[ok])
        diag = np.eye(len(c), dtype=bool)
        true_parts.append(c[diag])
        false_parts.append(c[~diag])
    t = np.concatenate(true_parts) if true_parts else np.zeros(0)
    f = np.concatenate(false_parts) if false_parts else np.zeros(0)
    if len(t) == 0 or len(f) == 0:
        raise AnonymityError(f"flow correlation: no two flows with cells at both ends in [{trace.t0_s:g}, "
                             f"{trace.t1_s:g}) s ({excluded} left out)")
    if skip_unresolvable:
        fprs = resolvable_fprs(len(t), len(f), fprs)
    tpr = {float(a): tpr_at_fpr(t, f, a) for a in fprs}
    # the AUC from at most AUC_FALSE_MAX false scores (a fixed draw): ranking tens of millions of them
    # would cost more than the run
    fs = f if len(f) <= AUC_FALSE_MAX else np.random.default_rng(0).choice(f, AUC_FALSE_MAX, replace=False)
    auc = float(stats.mannwhitneyu(t, fs).statistic / (len(t) * len(fs)))
    return FlowCorrelation(direction, per * trace.window_s, len(t), len(f), excluded, tpr, auc,
                           float(np.median(t)), float(np.median(fs)), t)
