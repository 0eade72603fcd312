"""Predicted distributions for rollout tests: log-normal quantile curves per stage, written to the
predictions table as `kistexp simulate` does."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from kistexp.expdir import ExperimentDir
from kistexp.metrics.series import Prediction
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import load_plan
from kistexp.rollout.dryrun import DryRunResult, dry_run

LEVELS = np.round(np.linspace(0, 1, 101), 2)
MEDIANS = {"relay_cpu_utilization": 0.4, "client_ttlb_50kib_s": 0.8, "client_ttlb_1mib_s": 2.5,
           "client_ttlb_5mib_s": 7.0, "quiet_circuit_latency_ms": 30.0}


def curve(median: float, sigma: float = 0.3) -> np.ndarray:
    z = norm.ppf(np.clip(LEVELS, 0.001, 0.999))
    return median * np.exp(sigma * z)


def write_predictions(exp_path, effects: dict[str, dict[str, float]], networks: int = 2, *,
                      medians: dict[str, float] | None = None, classes: tuple[str, ...] = ("middle",),
                      levels: tuple[float, ...] | None = None,
                      effect_scales: tuple[float, ...] | None = None, sigma: float = 0.3) -> ExperimentDir:
    """``effects[stage][metric]`` = relative change of the median against the baseline. Network ``n`` has
    every median times ``levels[n]`` (default 1 + 0.01 n) and its changes times ``effect_scales[n]``
    (default 1); relay metrics are written for each of ``classes``, the k-th class at (1 + 0.1 k) times
    the level. ``sigma`` is the log-normal spread of every curve (0.6: OnionPerf's transfer times)."""
    exp = ExperimentDir.open_or_create(exp_path)
    levels = levels or tuple(1 + 0.01 * n for n in range(networks))
    effect_scales = effect_scales or (1.0,) * networks
    rows = []
    for stage, per_metric in effects.items():
        for metric, median in (medians or MEDIANS).items():
            for k, cls in enumerate([""] if metric.startswith("client") else classes):
                for net in range(networks):
                    change = per_metric.get(metric, 0.0) * effect_scales[net]
                    values = curve(median * (1 + 0.1 * k) * (1 + change) * levels[net], sigma)
                    rows += [Prediction(stage, metric, cls, net, q, v) for q, v in zip(LEVELS, values, strict=True)]
    MetricStore(exp.db).save_predictions(rows)
    return exp


KIST_EFFECTS = {
    "baseline": {},
    "2ms": {"relay_cpu_utilization": 0.12, "client_ttlb_1mib_s": -0.05, "client_ttlb_5mib_s": -0.08},
    "5ms": {"relay_cpu_utilization": 0.05, "client_ttlb_1mib_s": -0.03},
    "back-to-10ms": {},
}

KIST_PLAN = "plans/kist-run-interval-2020.toml"
# +50 % relay CPU in stage 1 fails "relay CPU" (limit +25 %): the dry run steps back to the baseline
STEP_BACK = "stage=1:relay_cpu_utilization=+50%"
# five of the nine authorities, down from day 4: no majority-signed consensus while stage 1 waits
FIVE_DOWN = ("moria1", "tor26", "dizum", "gabelmoo", "dannenberg")


def dry_run_kist(path, injections: list[str]) -> DryRunResult:
    """The dry run of KIST_PLAN in experiment directory ``path`` on KIST_EFFECTS' predictions."""
    write_predictions(path, KIST_EFFECTS).close()
    return dry_run(load_plan(KIST_PLAN), path, injections=injections)


# the relay CPU criterion the rollout tests judge: mean CPU may rise at most 25 % before a step back
RELAY_CPU_CRITERION = """
[[criteria]]
name = "relay CPU"
metric = "relay_cpu_utilization"
statistic = "mean"
comparison = "relative-increase"
threshold = 0.25
min_samples = 100
on_fail = "step-back"
"""
