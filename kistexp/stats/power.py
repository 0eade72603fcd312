"""Forecast power of a criterion: will a stage gather enough evidence to PASS or FAIL?

The approximation (spec judge.md §4.1, §4.3, §4.4), fast enough for the linter:

* Continuous metrics, judged on logs: se² = κ·σ²·DEFF·(1/n_S + 1/n_B), DEFF from the hour-to-hour
  drift measured in real OnionPerf data (``Variability.design_effect``), with κ = π/2
  (median, Bonett–Price), p(1−p)/φ(z_p)² (quantile p), (e^{σ²} − 1)/σ² (arithmetic mean,
  delta method), π/3 (Hodges–Lehmann shift). For absolute thresholds the log SE is
  scaled by the metric's typical level.
* Event ratios (failures per transfer): binomial, se² = p(1 − p)(1/n_S + 1/n_B), or on
  the log rate ratio 1/(p·n_S) + 1/(p·n_B).
* Relay metrics, paired per relay: se² = (s² + v_relay)/R, with s the relay-to-relay
  spread of the change and v_relay the within-relay noise of a log mean, at the judge's
  interval: below 20 relays, or where the signed-rank interval has
  no bound, the paired t with the t_{R−1} quantile at the boundary's tail probability; else
  the signed-rank interval, se/√0.955 (Wilcoxon's efficiency against the t-test).
* P(PASS | no change) = Φ(|b|/se − c_pass) and P(FAIL | 2·thr) = Φ(|δ − b|/se − c_fail),
  c the boundary of the sequential design at the planned end (``boundary``: 2.76 for the
  engine's normal-mixture sequence at alpha 0.05, 1.95 for hourly OBF looks with a fixed
  baseline of the stage's size, 1.645 for one look), each direction with its own alpha.
* The detectable change (minimum detectable effect) is the true change at which
  P(FAIL) = 0.8: θ = b + (c_fail + z_0.8)·se, shown on the threshold's scale.
* With a fixed baseline se² ≥ se_B² however long the stage runs: ``n_stage = inf`` gives
  the best any stage can do, which tells a baseline too short to decide.

bench/judge_error_rates.py prints this forecast beside the measured rates.
"""

from __future__ import annotations

import math

import attrs
from scipy.stats import norm
from scipy.stats import t as t_dist

from kistexp.stats import sequential as seq

WILCOXON_EFFICIENCY = 3.0 / math.pi  # 0.955 for normal data
# The judge compares fewer relays than this with the paired t interval on the per-relay log ratios
# (spec §4.3: paired t power, Wilcoxon within 0.03 of it); from 20 on with the signed-rank interval,
# which resists an outlying relay, where its k-th Walsh average exists (kistexp/judge/core.py).
PAIRED_T_RELAYS = 20
TARGET_POWER = 0.8
Z_POWER = float(norm.ppf(TARGET_POWER))  # 0.8416
#: Sequential designs ``boundary`` knows: the judge's (kistexp.judge.model.SEQUENTIAL_METHODS) and one look.
METHODS = ("mixture", "obf", "pocock", "fixed")


@attrs.frozen
class Variability:
    """How noisy a metric is: the lint's default when no baseline history is at hand."""

    kind: str  # "continuous", "events" or "relay"
    sigma_log: float = 0.6  # log-SD of samples
    deff: float = 2.0  # time-correlation design effect, the least assumed (see ``design_effect``)
    level: float = 1.0  # typical value (metric units), for absolute thresholds
    event_rate: float = 0.0  # events per sample, for kind "events"
    spread: float = 0.2  # relay-to-relay SD of the per-relay log change
    # relays measured: the linter replaces it with the engine's (kistexp.metrics.catalogue.instances)
    relays: int = 30
    note: str = ""
    # Hour-to-hour drift of the network on the log scale, an AR(1) hour effect: SD 0.06, lag-1 0.8 as
    # measured in real OnionPerf data (spec judge.md §5.4: hourly log-mean SD 0.063 against 0.018 if iid,
    # lag-1 autocorrelation 0.83). Samples of one hour share it, so the more samples an hour holds the
    # more of a statistic's variance it is; ``per_hour`` (the engine's samples an hour, all instances)
    # is filled in by the linter. 0 leaves ``deff`` alone.
    hour_sd: float = 0.06
    hour_phi: float = 0.8
    per_hour: float = 0.0

    def design_effect(self, statistic: str) -> float:
        """Variance of ``statistic`` over many hours relative to iid samples: 1 + (the hour effect's
        long-run variance, sd²(1+φ)/(1−φ), per hour) / (the statistic's iid variance per hour,
        κσ²/m) — 2.8 for the mean, 2.4 for the median and 1.7 for p90 at 24 samples an hour — and
        never less than the assumed or measured ``deff``."""
        if self.per_hour <= 0 or self.hour_sd <= 0 or self.kind != "continuous":
            return self.deff
        long_run = self.hour_sd**2 * (1.0 + self.hour_phi) / (1.0 - self.hour_phi)
        iid_per_hour = kappa(statistic, self.sigma_log) * self.sigma_log**2 / self.per_hour
        return max(self.deff, 1.0 + long_run / iid_per_hour)


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
        se = math.sqrt((var.spread**2 + noise) / var.relays)  # the paired t's; relay_critical scales the rest
    else:
        se = math.sqrt(kappa(statistic, var.sigma_log) * var.sigma_log**2 * var.design_effect(statistic) * inv)
    return se if relative else se * var.level


def bound_and_bad(comparison: str, threshold: float) -> tuple[float, float]:
    """(b, θ at twice the threshold) on the judge's scale, oriented so that larger is worse."""
    if comparison == "relative-increase":
        return math.log1p(threshold), math.log1p(2 * threshold)
    if comparison == "relative-decrease":
        worse = max(1.0 - 2 * threshold, 1e-3)
        return -math.log1p(-threshold), -math.log(worse)
    return threshold, 2 * threshold  # absolute and above/below: one threshold further on


def signed_rank_limit(relays: int) -> float:
    """The largest boundary c at which the judge's paired relay interval is finite.

    The signed-rank interval bounds the per-relay change with the k-th Walsh average,
    k = ⌊R(R+1)/4 − c·√(R(R+1)(2R+1)/24)⌋ (kistexp/judge/estimators.py, walsh_hodges_lehmann);
    below k = 1 it is (−∞, ∞): 2.70 for 10 relays, 3.46 for 16, 3.88 for 20. Beyond it the judge
    takes the paired t interval instead (``paired_t_decides``).
    """
    r = max(int(relays), 1)
    return (r * (r + 1) / 4.0 - 1.0) / math.sqrt(r * (r + 1) * (2 * r + 1) / 24.0)


def paired_t_decides(relays: int, c: float) -> bool:
    """Whether the judge bounds a paired relay change at boundary ``c`` with the paired t interval:
    below PAIRED_T_RELAYS relays, or where the k-th Walsh average does not exist (kistexp/judge/core.py,
    _Context.paired)."""
    return relays < PAIRED_T_RELAYS or c > signed_rank_limit(relays)


def relay_critical(relays: int, c: float) -> tuple[float, float]:
    """The judge's paired relay interval at boundary ``c`` as (critical value, SE factor) against the
    paired t SE (end_se): the t quantile with c's tail probability and R − 1 df, and factor 1 for
    the paired t interval, or √(π/3) for the signed-rank one, whose Hodges–Lehmann SE is the t's
    over Wilcoxon's efficiency 3/π (its discrete k-th Walsh average at R = 20 keeps the t quantile:
    measured power 0.55 at +10 % against 0.59 forecast, 0.60 with the normal one)."""
    q = float(min(t_dist.isf(norm.sf(c), max(relays - 1, 1)), 1e6))
    return q, 1.0 if paired_t_decides(relays, c) else 1.0 / math.sqrt(WILCOXON_EFFICIENCY)


def decision_power(statistic: str, comparison: str, threshold: float, var: Variability, n_stage: float,
                   n_baseline: float, c_end: float, *, c_pass: float | None = None, alpha_fail: float = 0.05,
                   alpha_pass: float = 0.05) -> tuple[float, float]:
    """(P(PASS | no change), P(FAIL | twice the threshold)) at the stage's end.

    ``c_end`` is the FAIL boundary and, unless ``c_pass`` is given, the PASS one too. Relay metrics
    take the judge's paired interval at those boundaries (``relay_critical``); the alphas are kept
    for callers and enter only through the boundaries.
    """
    se = end_se(statistic, comparison, var, n_stage, n_baseline)
    c_fail, c_pass = c_end, c_end if c_pass is None else c_pass
    se_fail = se_pass = se
    if var.kind == "relay":
        (c_fail, f_fail), (c_pass, f_pass) = relay_critical(var.relays, c_fail), relay_critical(var.relays, c_pass)
        se_fail, se_pass = se * f_fail, se * f_pass
    b, bad = bound_and_bad(comparison, threshold)
    if comparison in ("above", "below"):
        # no-change point: the level is `threshold`; the forecast uses the typical level
        gap = abs(threshold - var.level)
        p = float(norm.cdf(gap / se_fail - c_fail)) if se > 0 else 1.0
        return p, p
    p_pass = float(norm.cdf(abs(b) / se_pass - c_pass)) if se > 0 else 1.0
    p_fail = float(norm.cdf(abs(bad - b) / se_fail - c_fail)) if se > 0 else 1.0
    return p_pass, p_fail


def detectable_change(statistic: str, comparison: str, threshold: float, var: Variability, n_stage: float,
                      n_baseline: float, c_fail: float, *, alpha_fail: float = 0.05,
                      target: float = TARGET_POWER) -> float | None:
    """The true change at which P(FAIL) = ``target`` at the stage's end (the minimum detectable
    effect), on the threshold's scale: relative comparisons as a relative change (+0.14 is a
    14 % rise, −0.14 a 14 % fall), absolute ones in the metric's units; ±inf when no change
    can FAIL. None for one-sample level comparisons (``above``/``below``), which compare with
    no baseline change."""
    if comparison in ("above", "below"):
        return None
    se = end_se(statistic, comparison, var, n_stage, n_baseline)
    if var.kind == "relay":
        c_fail, factor = relay_critical(var.relays, c_fail)
        se *= factor
    b, _ = bound_and_bad(comparison, threshold)
    return change_of(comparison, b + (c_fail + float(norm.ppf(target))) * se)


def change_of(comparison: str, theta: float) -> float:
    """An effect θ on the judge's oriented scale (larger is worse) as the change a plan states."""
    if comparison == "relative-increase":
        # a limit near the largest float leaves no room above it: no finite rise is detectable
        return math.expm1(theta) if theta < 709.0 else math.inf
    if comparison == "relative-decrease":
        return math.expm1(-theta)
    return -theta if comparison == "absolute-decrease" else theta


def boundary(method: str, alpha: float, n_stage: float, n_baseline: float, planned_stage: float,
             looks: int = 1) -> float:
    """The judge's critical value (z units, one direction) at a look with ``n_stage`` samples, as
    kistexp/judge/core.py computes it for a stage planned at ``planned_stage`` samples:

    * ``mixture``: the normal-mixture sequence tuned at half the planned stage (SequentialState.plan's
      default target), so c depends on I/I_target only; ``n_stage = planned_stage = inf`` is the
      best any stage length can do (I/I_target = 1);
    * ``obf``/``pocock``: the last of ``looks`` equally spaced hourly looks of the planned stage,
      which spends all the rest (t = 1);
    * ``fixed``: one look, z_{1−α}.
    """
    if method == "fixed" or (method in ("obf", "pocock") and looks <= 1):
        return seq.fixed_boundary(alpha)
    n_base = n_baseline if n_baseline > 0 else math.inf  # one-sample: information ∝ n_S
    if method == "mixture":
        inv_target = 2.0 / planned_stage + 1.0 / n_base
        inv_now = 1.0 / max(n_stage, 1e-12) + 1.0 / n_base
        of_target = inv_target / inv_now if inv_now > 0 else 1.0  # both endless: the limit, 1
        return float(seq.mixture_boundary(of_target, alpha))
    if method in ("obf", "pocock"):
        return final_boundary(looks, n_stage, n_base, alpha, method)
    raise ValueError(f"unknown sequential method {method!r}; known: {', '.join(METHODS)}")


def final_boundary(looks: int, n_stage_end: float, n_baseline: float, alpha: float = 0.05,
                   spending: str = "obf") -> float:
    """c at the last of ``looks`` equally spaced looks (alpha spending, fixed baseline)."""
    if looks <= 1:
        return seq.fixed_boundary(alpha)
    ratio = round(n_baseline / max(n_stage_end, 1e-9), 2) if math.isfinite(n_baseline) else 1e6
    return _final_boundary(int(looks), max(ratio, 0.01), alpha, spending)


def _final_boundary(looks: int, ratio: float, alpha: float, spending: str) -> float:
    key = (looks, ratio, alpha, spending)
    if key not in _FINAL_CACHE:
        fractions = seq.information_fraction([k / looks for k in range(1, looks + 1)], ratio, 1.0)
        fractions[-1] = 1.0
        _FINAL_CACHE[key] = float(seq.spending_boundaries(fractions, alpha, spending)[-1])
    return _FINAL_CACHE[key]


_FINAL_CACHE: dict[tuple[int, float, float, str], float] = {}
