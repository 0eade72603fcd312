"""Critical values that stay valid when a stage is judged again and again.

Two always-valid designs (docs/judge.md, spec judge.md §3):

* **Lan–DeMets alpha spending with O'Brien–Fleming-type shape** (Lan & DeMets,
  Biometrika 70, 1983), applied as repeated confidence intervals (Jennison & Turnbull,
  JRSS-B 51, 1989). The spent error at information fraction t is
  α(t) = 2 − 2Φ(z_{1−α/2}/√t); the boundary c_k of look k makes the probability of a
  first crossing at k equal α(t_k) − α(t_{k−1}) for a Brownian motion observed at the
  t's (Armitage, McPherson & Rowe, JRSS-A 132, 1969: recursive numerical integration).
  Only the observed t's matter, so missed or extra looks are fine.
* **Normal-mixture confidence sequence** (Howard, Ramdas, McAuliffe & Sekhon, Ann.
  Statist. 49, 2021; the mixture SPRT of Johari, Pekelis & Walsh, Oper. Res. 70, 2022):
  c = √((1 + 1/x)(ln(1 + x) + 2 ln(1/α₂))) with x = τ²I, τ² = L(α₂)/I_target and
  L(a) = −2 ln a + ln(1 − 2 ln a) (Waudby-Smith et al., arXiv:2103.06476, as GrowthBook
  uses it). Valid at every look with no schedule at all, for open-ended stages.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import numpy as np
from scipy import signal
from scipy.stats import norm

# Grid for the recursive integration: W(t) has SD <= 1 for t <= 1, so +-10 holds all
# mass that matters; 8,001 points (spacing 0.0025) keeps boundaries within 0.005 of
# 2-million-path Monte Carlo.
_HALF_WIDTH = 10.0
_POINTS = 8001
# Below this per-look spend nothing measurable crosses: use the one-look normal quantile.
_TINY = 1e-12


def obf_spending(t: float | np.ndarray, alpha: float) -> float | np.ndarray:
    """Error spent by information fraction t (one direction, total alpha at t = 1)."""
    t = np.asarray(t, dtype=float)
    with np.errstate(divide="ignore"):
        out = 2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / np.sqrt(t))
    return np.where(t > 0, out, 0.0)


def pocock_spending(t: float | np.ndarray, alpha: float) -> float | np.ndarray:
    """The flatter Pocock-type spending function α·ln(1 + (e − 1)t) (Lan & DeMets 1983)."""
    return alpha * np.log1p((math.e - 1.0) * np.asarray(t, dtype=float))


_SPENDING = {"obf": obf_spending, "pocock": pocock_spending}


def spending_boundaries(fractions: Sequence[float], alpha: float, spending: str = "obf") -> np.ndarray:
    """One-sided critical values c_1..c_K (z units) for looks at information fractions t_k.

    ``fractions`` must be non-decreasing in (0, 1]; a look at t = 1 spends all the rest.
    """
    ts = tuple(float(t) for t in fractions)
    return np.array(_boundaries(ts, float(alpha), spending))


# Recursion state after each computed look, keyed by (fractions, alpha, spending): a
# stage judged hourly extends its own sequence by one look, so each look costs one
# convolution instead of k. Bounded: each entry holds one grid (64 KB).
_STATE_CACHE: collections.OrderedDict = collections.OrderedDict()
_STATE_CACHE_SIZE = 64


def _boundaries(ts: tuple[float, ...], alpha: float, spending: str) -> tuple[float, ...]:
    if spending not in _SPENDING:
        raise ValueError(f"unknown spending function {spending!r}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha {alpha} outside (0, 0.5)")
    key = (ts, alpha, spending)
    if key in _STATE_CACHE:
        _STATE_CACHE.move_to_end(key)
        return _STATE_CACHE[key][0]
    spend = _SPENDING[spending]
    x = np.linspace(-_HALF_WIDTH, _HALF_WIDTH, _POINTS)
    dx = x[1] - x[0]
    out: list[float] = []
    density = None  # sub-density of W(t) over paths that have not crossed yet
    t_prev = 0.0
    spent_prev = 0.0
    start = 0
    prefix = _STATE_CACHE.get((ts[:-1], alpha, spending)) if len(ts) > 1 else None
    if prefix is not None:
        cs, density, t_prev, spent_prev = prefix
        out, start = list(cs), len(cs)
    for t in ts[start:]:
        if not 0.0 < t <= 1.0 or t < t_prev:
            raise ValueError(f"information fractions must be non-decreasing in (0, 1], got {ts}")
        if density is None:
            density = norm.pdf(x, scale=math.sqrt(t))
        elif t > t_prev:
            sd = math.sqrt(t - t_prev)
            if sd > 2 * dx:
                m = int(math.ceil(8.0 * sd / dx))
                kernel = norm.pdf(np.arange(-m, m + 1) * dx, scale=sd) * dx
                density = signal.fftconvolve(density, kernel, mode="same")
        spent = float(spend(t, alpha))
        target = spent - spent_prev
        if target < _TINY:
            # Essentially nothing may cross here; the truncation of earlier looks does
            # not change a tail this far out.
            c = float(norm.isf(max(target, 1e-300)))
        else:
            # tail[i] = P(W(t) >= x[i], no earlier crossing)
            tail = np.cumsum(density[::-1])[::-1] * dx
            if target >= tail[0]:
                c = -_HALF_WIDTH / math.sqrt(t)
            else:
                # tail decreases along x: interpolate on the reversed (increasing) arrays
                w = float(np.interp(target, tail[::-1], x[::-1]))
                c = w / math.sqrt(t)
        out.append(c)
        density = np.where(x < c * math.sqrt(t), density, 0.0)
        spent_prev = spent
        t_prev = t
    result = tuple(out)
    _STATE_CACHE[key] = (result, density, t_prev, spent_prev)
    while len(_STATE_CACHE) > _STATE_CACHE_SIZE:
        _STATE_CACHE.popitem(last=False)
    return result


def mixture_log_factor(alpha_two_sided: float) -> float:
    """L(α) = −2 ln α + ln(1 − 2 ln α): τ²·I_target for the normal mixture (GrowthBook's ρ²·N*)."""
    la = math.log(alpha_two_sided)
    return -2.0 * la + math.log(1.0 - 2.0 * la)


def mixture_boundary(fraction_of_target: float | np.ndarray, alpha: float) -> float | np.ndarray:
    """One-sided critical value of the normal-mixture confidence sequence.

    ``fraction_of_target`` is I_k / I_target; ``alpha`` is the error per direction, so
    the two-sided sequence has level 2·alpha (spec judge.md §3.4: 2.764 at I_target for
    alpha 0.05).
    """
    a2 = 2.0 * alpha
    x = mixture_log_factor(a2) * np.maximum(np.asarray(fraction_of_target, dtype=float), 1e-12)
    return np.sqrt((1.0 + 1.0 / x) * (np.log1p(x) + 2.0 * math.log(1.0 / a2)))


def fixed_boundary(alpha: float) -> float:
    """One look, one direction: z_{1−α} (1.645 for α = 0.05, the 90 % two-sided interval)."""
    return float(norm.isf(alpha))


def information_fraction(n_stage: float | np.ndarray, n_baseline: float, planned_stage: float
                         ) -> float | np.ndarray:
    """t = I(n_stage)/I(planned_stage) with I ∝ 1/(1/n_S + 1/n_B): a fixed baseline, equal variances.

    Counting samples instead of estimating variances keeps t free of noise (spec §3.2:
    t = 2/(n_B/n_S + 1) when n_B equals the planned stage size).
    """
    n_stage = np.asarray(n_stage, dtype=float)
    inv_end = 1.0 / planned_stage + 1.0 / n_baseline
    with np.errstate(divide="ignore"):
        t = inv_end / (1.0 / n_stage + 1.0 / n_baseline)
    return np.clip(t, 0.0, 1.0)
