"""Forecast power of a criterion: will a stage gather enough evidence to PASS or FAIL?

The approximation (spec judge.md §4.1, §4.3, §4.4), fast enough for the linter:

* Continuous metrics, judged on logs: se² = κ·σ²·DEFF·(1/n_S + 1/n_B) with κ = π/2
  (median, Bonett–Price), p(1−p)/φ(z_p)² (quantile p), (e^{σ²} − 1)/σ² (arithmetic mean,
  delta method), π/3 (Hodges–Lehmann shift). For absolute thresholds the log SE is
  scaled by the metric's typical level.
* Event ratios (failures per transfer): binomial, se² = p(1 − p)(1/n_S + 1/n_B), or on
  the log rate ratio 1/(p·n_S) + 1/(p·n_B).
* Relay metrics, paired per relay: se² = (s² + v_relay)/(R·0.955), with s the
  relay-to-relay spread of the change, v_relay the within-relay noise of a log mean and
  0.955 Wilcoxon's efficiency against the t-test; the critical value grows by
  t_{R−1}/z for the few relays.
* P(PASS | no change) = Φ(|b|/se − c_end) and P(FAIL | 2·thr) = Φ(|δ − b|/se − c_end),
  c_end the final boundary of the sequential design (1.95 for hourly looks with a fixed
  baseline of the stage's size, 1.645 for one look).

bench/judge_error_rates.py prints this forecast beside the measured rates.
"""

from __future__ import annotations

import math

import attrs
from scipy.stats import norm
from scipy.stats import t as t_dist

from kistexp.stats import sequential as seq

WILCOXON_EFFICIENCY = 3.0 / math.pi  # 0.955 for normal data
TARGET_POWER = 0.8


@attrs.frozen
class Variability:
    """How noisy a metric is: the lint's default when no baseline history is at hand."""

    kind: str  # "continuous", "events" or "relay"
    sigma_log: float = 0.6  # log-SD of samples
    deff: float = 2.0  # time-correlation design effect
    level: float = 1.0  # typical value (metric units), for absolute thresholds
    event_rate: float = 0.0  # events per sample, for kind "events"
    spread: float = 0.2  # relay-to-relay SD of the per-relay log change
    relays: int = 30  # relays measured
    note: str = ""


# Keys are catalogue names (kistexp/metrics/catalogue.py); tests check they match.
METRIC_VARIABILITY: dict[str, Variability] = {
    "client_ttfb_s": Variability("continuous", 0.6, 2.0, 1.0, note="assumed: OnionPerf tgen records are truncated"),
    "client_ttlb_50kib_s": Variability("continuous", 0.6, 2.0, 1.5, note="assumed (spec §5.4)"),
    "client_ttlb_1mib_s": Variability("continuous", 0.6, 2.0, 3.0, note="assumed (spec §5.4)"),
    "client_ttlb_5mib_s": Variability("continuous", 0.6, 2.0, 11.0, note="assumed (spec §5.4); hk6a median 10.8 s"),
    "client_throughput_mbytes_per_s": Variability("continuous", 0.6, 2.0, 0.5, note="assumed"),
    "client_transfer_failure_ratio": Variability("events", event_rate=0.02, note="assumed 2 % of transfers fail"),
    "circuit_build_time_s": Variability("continuous", 0.285, 12.0, 0.9,
                                        note="op-hk6a 2021-06-01: sigma_log 0.285, hourly-block DEFF 12"),
    "quiet_circuit_latency_ms": Variability("continuous", 0.6, 2.0, 50.0, note="assumed"),
    "relay_cpu_utilization": Variability("relay", 0.3, 2.0, 0.3, spread=0.2, note="spread assumed (spec §4.3)"),
    "relay_rss_bytes": Variability("relay", 0.1, 2.0, 5e8, spread=0.1, note="assumed"),
    "relay_bandwidth_bytes_per_s": Variability("relay", 0.5, 2.0, 5e6, spread=0.2, note="assumed"),
    "relay_global_rate_limit_reached": Variability("relay", 1.0, 2.0, 1.0, spread=0.5, note="assumed"),
    "relay_oom_bytes": Variability("relay", 1.5, 2.0, 1e6, spread=1.0, note="assumed"),
    "relay_kernel_queue_bytes": Variability("relay", 0.6, 2.0, 1e5, spread=0.3, note="assumed"),
}
DEFAULT_VARIABILITY = Variability("continuous")


def kappa(statistic: str, sigma_log: float) -> float:
    """Variance factor of a statistic on log scale relative to the mean of logs (spec §2)."""
    if statistic == "median":
        return math.pi / 2.0
    if statistic == "mean":
        return math.expm1(sigma_log**2) / sigma_log**2 if sigma_log > 0 else 1.0
    if statistic == "shift":
        return math.pi / 3.0
    if len(statistic) == 3 and statistic[0] == "p" and statistic[1:].isdigit():
        p = int(statistic[1:]) / 100.0
        return p * (1 - p) / norm.pdf(norm.ppf(p)) ** 2
    raise ValueError(f"no variance factor for statistic {statistic!r}")


def end_se(statistic: str, comparison: str, var: Variability, n_stage: float, n_baseline: float) -> float:
    """Forecast standard error of θ̂ at the stage's end."""
    inv = 1.0 / max(n_stage, 1e-9) + (0.0 if comparison in ("above", "below") else 1.0 / max(n_baseline, 1e-9))
    relative = comparison.startswith("relative")
    if var.kind == "events":
        p = max(var.event_rate, 1e-6)
        return math.sqrt(inv / p) if relative else math.sqrt(p * (1 - p) * inv)
    if var.kind == "relay":
        per_relay_s = n_stage / var.relays
        per_relay_b = n_baseline / var.relays
        noise = math.expm1(var.sigma_log**2) * var.deff * (1 / max(per_relay_s, 1e-9) + 1 / max(per_relay_b, 1e-9))
        se = math.sqrt((var.spread**2 + noise) / (var.relays * WILCOXON_EFFICIENCY))
    else:
        se = math.sqrt(kappa(statistic, var.sigma_log) * var.sigma_log**2 * var.deff * inv)
    return se if relative else se * var.level


def bound_and_bad(comparison: str, threshold: float) -> tuple[float, float]:
    """(b, θ at twice the threshold) on the judge's scale, oriented so that larger is worse."""
    if comparison == "relative-increase":
        return math.log1p(threshold), math.log1p(2 * threshold)
    if comparison == "relative-decrease":
        worse = max(1.0 - 2 * threshold, 1e-3)
        return -math.log1p(-threshold), -math.log(worse)
    return threshold, 2 * threshold  # absolute and above/below: one threshold further on


def decision_power(statistic: str, comparison: str, threshold: float, var: Variability, n_stage: float,
                   n_baseline: float, c_end: float) -> tuple[float, float]:
    """(P(PASS | no change), P(FAIL | twice the threshold)) at the stage's end."""
    se = end_se(statistic, comparison, var, n_stage, n_baseline)
    if var.kind == "relay":
        # R relays are R observations: small-sample (t, R − 1 df) critical value
        c_end *= float(t_dist.isf(0.05, var.relays - 1) / norm.isf(0.05))
    b, bad = bound_and_bad(comparison, threshold)
    if comparison in ("above", "below"):
        # no-change point: the level is `threshold`; the forecast uses the typical level
        gap = abs(threshold - var.level)
        p = float(norm.cdf(gap / se - c_end)) if se > 0 else 1.0
        return p, p
    p_pass = float(norm.cdf(abs(b) / se - c_end)) if se > 0 else 1.0
    p_fail = float(norm.cdf(abs(bad - b) / se - c_end)) if se > 0 else 1.0
    return p_pass, p_fail


def final_boundary(looks: int, n_stage_end: float, n_baseline: float, alpha: float = 0.05) -> float:
    """c at the last of ``looks`` equally spaced looks (OBF spending, fixed baseline)."""
    if looks <= 1:
        return seq.fixed_boundary(alpha)
    ratio = round(n_baseline / max(n_stage_end, 1e-9), 2)
    return _final_boundary(int(looks), max(ratio, 0.01), alpha)


def _final_boundary(looks: int, ratio: float, alpha: float) -> float:
    key = (looks, ratio, alpha)
    if key not in _FINAL_CACHE:
        fractions = seq.information_fraction([k / looks for k in range(1, looks + 1)], ratio, 1.0)
        fractions[-1] = 1.0
        _FINAL_CACHE[key] = float(seq.spending_boundaries(fractions, alpha)[-1])
    return _FINAL_CACHE[key]


_FINAL_CACHE: dict[tuple[int, float, float], float] = {}
