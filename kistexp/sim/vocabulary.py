"""The simulator's measurements in the metric vocabulary of ``kistexp/metrics/catalogue.py``.

``window_samples(window)`` turns a :class:`~kistexp.sim.simulation.RunWindow` into
``{metric name: numpy array of samples}`` for every catalogue metric the simulator provides, so a
stage window and a baseline window of the same run are judged with the names plans use;
``relay_values(window)`` gives the relay metrics per node.  What each metric is made of:

* ``client_ttfb_s``: time to first byte of every transfer finished in the window;
* ``client_ttlb_50kib_s`` / ``_1mib_s`` / ``_5mib_s``: time to last byte of the finished transfers
  of exactly that size (OnionPerf's three sizes);
* ``client_throughput_mbytes_per_s``: finished transfers of at least 1 MiB, bytes after the first
  one over (ttlb - ttfb), in MB/s;
* ``quiet_circuit_latency_ms``: the per-hop circuit-queue delay of cells on circuits labelled
  ``quiet_labels`` (the queueing the scheduler and EWMA decide), as ``delay_samples`` representative
  values drawn from the window's histogram (its quantiles, so the distribution is kept and memory
  stays bounded);
* per relay (roles other than ``client``): ``relay_cpu_utilization`` (the cost model of
  ``costmodel.py`` over the window's counts, CPU seconds per simulated second),
  ``relay_rss_bytes`` (the peak of cells held in tor's queues and outbufs: the part of the RSS
  that scheduling changes, not the process total), ``relay_bandwidth_bytes_per_s`` (wire bytes sent
  plus received per second) and ``relay_kernel_queue_bytes`` (mean bytes in the relay's socket send
  buffers at the window's sample times).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kistexp.metrics import catalogue
from kistexp.sim.costmodel import DEFAULT_COST_MODEL, CostModel, NodeWork, estimate_node_cpu
from kistexp.sim.result import _bin_edges_ns
from kistexp.sim.simulation import RunWindow

KIB = 1024
MIB = 1024 * 1024
TTLB_SIZES = {"client_ttlb_50kib_s": 50 * KIB, "client_ttlb_1mib_s": MIB, "client_ttlb_5mib_s": 5 * MIB}
CLIENT_METRICS = ("client_ttfb_s", *TTLB_SIZES, "client_throughput_mbytes_per_s", "quiet_circuit_latency_ms")
RELAY_METRICS = ("relay_cpu_utilization", "relay_rss_bytes", "relay_bandwidth_bytes_per_s",
                 "relay_kernel_queue_bytes")
METRICS = CLIENT_METRICS + RELAY_METRICS
DEFAULT_QUIET_LABELS = ("interactive", "quiet")
DEFAULT_DELAY_SAMPLES = 1000

# the vocabulary is the catalogue's (the linter's KX303 names catalogue.simulated()): a renamed or added
# metric must fail here, not silently vanish
assert set(METRICS) == set(catalogue.simulated()), sorted(set(METRICS) ^ set(catalogue.simulated()))


def histogram_samples(counts: np.ndarray, n: int = DEFAULT_DELAY_SAMPLES) -> np.ndarray:
    """``min(n, total)`` values (ns) at evenly spaced quantiles of a delay histogram."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0)
    m = min(n, total)
    edges = _bin_edges_ns()
    upper = np.append(edges[1:], edges[-1] * 10 ** (1 / 40))
    target = (np.arange(m) + 0.5) / m * total
    cum = np.cumsum(counts)
    b = np.minimum(np.searchsorted(cum, target), len(counts) - 1)
    before = np.where(b > 0, cum[b - 1], 0)
    inside = (target - before) / np.maximum(counts[b], 1)
    lo, hi = edges[b], upper[b]
    geo = lo * (hi / np.where(lo > 0, lo, 1.0)) ** inside
    return np.where(b == 0, hi * inside, geo)


def relay_nodes(window: RunWindow) -> list[int]:
    return [i for i, r in enumerate(window.node_roles) if r != "client"]


def node_cpu_utilization(window: RunWindow, node: int | str, model: CostModel = DEFAULT_COST_MODEL) -> float:
    counts = window.node_counts(node)
    work = NodeWork(node=window.node_names[window.node_index(node)], **counts)
    return estimate_node_cpu(work, window.duration_s, model).core_fraction


def relay_values(window: RunWindow, model: CostModel = DEFAULT_COST_MODEL) -> dict[str, dict[str, float]]:
    """Each relay metric per relay: ``{metric: {node name: value}}``."""
    out: dict[str, dict[str, float]] = {m: {} for m in RELAY_METRICS}
    kern = window.node_levels["kernel_bytes"]
    for i in relay_nodes(window):
        name = window.node_names[i]
        out["relay_cpu_utilization"][name] = node_cpu_utilization(window, i, model)
        out["relay_rss_bytes"][name] = float(window.node_peaks["peak_app_bytes"][i])
        out["relay_bandwidth_bytes_per_s"][name] = window.node_bytes_per_s(i)
        out["relay_kernel_queue_bytes"][name] = float(kern[:, i].mean()) if len(kern) else float("nan")
    return out


def window_samples(window: RunWindow, *, quiet_labels: Sequence[str] = DEFAULT_QUIET_LABELS,
                   delay_samples: int = DEFAULT_DELAY_SAMPLES,
                   model: CostModel = DEFAULT_COST_MODEL) -> dict[str, np.ndarray]:
    """``{metric name: samples}`` of the window (see the module docstring); relay metrics have one
    sample per relay."""
    out: dict[str, np.ndarray] = {"client_ttfb_s": window.transfer_ttfb_s.astype(float)}
    size = window.transfer_response_bytes
    for name, want in TTLB_SIZES.items():
        out[name] = window.transfer_ttlb_s[size == want].astype(float)
    big = size >= MIB
    span = window.transfer_ttlb_s[big] - window.transfer_ttfb_s[big]
    with np.errstate(divide="ignore", invalid="ignore"):
        thr = (size[big] - 498) / span / 1e6
    out["client_throughput_mbytes_per_s"] = thr[np.isfinite(thr)]
    hist = sum((window.delay_hist_for("app", lbl) for lbl in quiet_labels if lbl in window.labels),
               np.zeros(window.delay_hist.shape[2], np.int64))
    out["quiet_circuit_latency_ms"] = histogram_samples(hist, delay_samples) / 1e6
    for metric, per_node in relay_values(window, model).items():
        out[metric] = np.array(list(per_node.values()), float)
    return out
