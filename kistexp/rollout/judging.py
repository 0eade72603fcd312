"""How the engine turns samples into a criterion's verdict (rollout.md §1.2: PASS, FAIL, INCONCLUSIVE).

The engine calls a ``Judge``: ``(criterion, baseline values, stage values) -> Verdict``.
``interval_judge`` compares the stage statistic with the baseline's through 95 % confidence
intervals: the normal interval of a mean, the binomial order-statistic interval of a quantile;
the effect's interval combines the two conservatively. FAIL when the whole interval is past
the threshold, PASS when it is wholly within, INCONCLUSIVE when it straddles it or either side
has fewer than ``min_samples`` samples. kistexp's judge package replaces it where installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kistexp.rollout.spec import CriterionSpec
from kistexp.rollout.state import FAIL, INCONCLUSIVE, PASS, Verdict

Z95 = 1.959964
_QUANTILES = {"median": 0.5, "p10": 0.10, "p25": 0.25, "p75": 0.75, "p90": 0.90, "p95": 0.95, "p99": 0.99,
              "max": 1.0, "min": 0.0}

Judge = Callable[[CriterionSpec, np.ndarray, np.ndarray], Verdict]


def statistic_interval(values: np.ndarray, statistic: str) -> tuple[float, float, float]:
    """(estimate, low, high) of ``statistic`` over ``values`` at 95 %."""
    n = values.size
    if statistic == "mean":
        m = float(values.mean())
        se = float(values.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf
        return m, m - Z95 * se, m + Z95 * se
    q = _QUANTILES[statistic]
    half = Z95 * math.sqrt(n * q * (1 - q))
    ks = sorted({min(n - 1, max(0, round(n * q - half))), min(n - 1, max(0, round(q * (n - 1)))),
                 min(n - 1, max(0, round(n * q + half)))})
    part = np.partition(values, ks)
    lo, est, hi = (float(part[k]) for k in (ks[0], ks[len(ks) // 2], ks[-1]))
    return est, lo, hi


def _effect(comparison: str, base: tuple[float, float, float], stage: tuple[float, float, float]
            ) -> tuple[float, float, float]:
    (b, bl, bh), (s, sl, sh) = base, stage
    if comparison == "relative-increase":
        return s / b - 1, sl / bh - 1 if bh > 0 else math.inf, sh / bl - 1 if bl > 0 else math.inf
    if comparison == "relative-decrease":
        return 1 - s / b, 1 - sh / bl if bl > 0 else -math.inf, 1 - sl / bh if bh > 0 else math.inf
    if comparison == "absolute-increase":
        return s - b, sl - bh, sh - bl
    if comparison == "absolute-decrease":
        return b - s, bl - sh, bh - sl
    if comparison == "above":
        return s, sl, sh
    if comparison == "below":
        return -s, -sh, -sl
    raise ValueError(f"unknown comparison {comparison!r}")


def interval_judge(criterion: CriterionSpec, baseline: np.ndarray, stage: np.ndarray) -> Verdict:
    nb, ns = int(baseline.size), int(stage.size)
    if nb < criterion.min_samples or ns < criterion.min_samples:
        return Verdict(criterion.name, INCONCLUSIVE, n_baseline=nb, n_stage=ns,
                       detail=f"{min(nb, ns)} of {criterion.min_samples} samples")
    effect, lo, hi = _effect(criterion.comparison, statistic_interval(baseline, criterion.statistic),
                             statistic_interval(stage, criterion.statistic))
    threshold = -criterion.threshold if criterion.comparison == "below" else criterion.threshold
    outcome = FAIL if lo > threshold else PASS if hi <= threshold else INCONCLUSIVE
    rel = criterion.comparison.startswith("relative")

    def show(x: float) -> str:
        return f"{x * 100:+.1f}%" if rel else f"{x:.4g}"

    detail = (f"{criterion.statistic} {show(effect)} [{show(lo)}, {show(hi)}] vs limit "
              f"{show(threshold)}")
    return Verdict(criterion.name, outcome, effect, lo, hi, nb, ns, detail)


def default_judge() -> Judge:
    return interval_judge
