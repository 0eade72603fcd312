"""Paired differences, stage minus baseline, over sampled networks x seeds, with a 95 % interval.

The baseline and a stage run on the same sampled networks, clients, traffic and seeds (common random
numbers), so each (network, seed) unit gives one difference of a measure; the interval is Student's
t interval of their mean (``scipy.stats.ttest_1samp(...).confidence_interval``), the units taken as
independent (each has its own network or its own traffic).  A criterion reads it as a non-inferiority
test: "the increase is below M with 95 % confidence" holds when the upper end of the interval is
below M (``PairedDifference.noninferior``; a one-sided 97.5 % bound for a two-sided 95 % interval).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import numpy as np
from scipy import stats

from kistexp.errors import AnonymityError


@attrs.frozen
class PairedDifference:
    measure: str
    units: int  # (network, seed) pairs with the measure in both runs
    baseline_mean: float
    stage_mean: float
    mean_difference: float
    low: float
    high: float
    confidence: float = 0.95

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.low > 0 or self.high < 0

    def noninferior(self, margin: float) -> bool:
        """The stage's increase over the baseline is below ``margin`` at the interval's confidence."""
        return self.high < margin


def paired_difference(measure: str, baseline: Sequence[float], stage: Sequence[float],
                      confidence: float = 0.95) -> PairedDifference:
    """Stage minus baseline per unit (units where either is nan left out) and the t interval of the mean."""
    b = np.asarray(baseline, np.float64)
    s = np.asarray(stage, np.float64)
    if b.shape != s.shape or b.ndim != 1:
        raise AnonymityError(f"{measure}: {len(b)} baseline and {len(s)} stage values are not paired")
    ok = np.isfinite(b) & np.isfinite(s)
    d = s[ok] - b[ok]
    n = len(d)
    if n == 0:
        return PairedDifference(measure, 0, math.nan, math.nan, math.nan, math.nan, math.nan, confidence)
    mean = float(d.mean())
    if n == 1:
        low = high = math.nan
    elif np.ptp(d) == 0:
        low = high = mean  # every unit moved by exactly the same amount
    else:
        ci = stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
        low, high = float(ci.low), float(ci.high)
    return PairedDifference(measure, n, float(b[ok].mean()), float(s[ok].mean()), mean, low, high, confidence)


def paired_differences(baseline: Sequence[Mapping[str, float]], stage: Sequence[Mapping[str, float]],
                       confidence: float = 0.95) -> list[PairedDifference]:
    """``paired_difference`` of every measure named in the units (baseline[i] pairs with stage[i])."""
    if len(baseline) != len(stage):
        raise AnonymityError(f"{len(baseline)} baseline and {len(stage)} stage units are not paired")
    names = list(dict.fromkeys(k for u in [*baseline, *stage] for k in u))
    return [paired_difference(k, [u.get(k, math.nan) for u in baseline], [u.get(k, math.nan) for u in stage],
                              confidence) for k in names]
