"""Which metrics exist, who provides them, and how fast samples arrive.

A rollback criterion may only name a metric some collector provides. The sample model
below (``instances``, ``samples_in``, ``collections_needed``) is the one definition of
how many samples a run gathers: the rollout engine collects each criterion's metric once
a plan hour, a dry run draws that many samples per collection, and the linter uses the
same numbers to tell whether a stage is long enough for a criterion's ``min_samples``.
"""

from __future__ import annotations

import math

import attrs

COLLECTORS = {
    "onionperf": "OnionPerf / tgen analysis JSON (client transfers of 50 KiB, 1 MiB, 5 MiB)",
    "metricsport": "a relay's MetricsPort (Prometheus text: tor_relay_* families)",
    "prometheus": "any Prometheus endpoint beside a relay (node or process exporter: CPU, memory)",
    "proc": "/proc/PID of a local tor process (CPU time, VmRSS)",
    "operator-report": "operator report CSV (kistexp-operator-report/1) sent in by relay operators",
    "consensus-archive": "consensus documents (CollecTor archives or DirPort fetches)",
    "simulator": "kistexp's relay-scheduling simulator",
    "interactive": "a measurement client's low-rate interactive stream (echo round trips on a quiet circuit)",
}


@attrs.frozen
class Metric:
    name: str
    unit: str
    population: str  # "clients" or "relays": whose adoption of the value the metric reflects
    collectors: tuple[str, ...]
    samples_per_hour: float  # from one measuring instance, in normal operation
    higher_is_worse: bool
    meaning: str


# Who measures a relay's tor process (CPU, RSS) and its traffic.
_RELAY_PROCESS = ("prometheus", "proc", "operator-report", "simulator")
_RELAY_TRAFFIC = ("metricsport", "operator-report", "simulator")

METRICS: tuple[Metric, ...] = (
    # OnionPerf runs one transfer every 5 minutes per instance and records the time at
    # which 50 KiB, 1 MiB and 5 MiB have arrived.
    Metric("client_ttfb_s", "s", "clients", ("onionperf", "simulator"), 12.0, True,
           "time to first byte of a client transfer"),
    Metric("client_ttlb_50kib_s", "s", "clients", ("onionperf", "simulator"), 12.0, True,
           "time to last byte of a 50 KiB client transfer"),
    Metric("client_ttlb_1mib_s", "s", "clients", ("onionperf", "simulator"), 12.0, True,
           "time to last byte of a 1 MiB client transfer"),
    Metric("client_ttlb_5mib_s", "s", "clients", ("onionperf", "simulator"), 12.0, True,
           "time to last byte of a 5 MiB client transfer"),
    Metric("client_throughput_mbytes_per_s", "MB/s", "clients", ("onionperf", "simulator"), 12.0, False,
           "client transfer throughput (bytes between 1 MiB and 5 MiB over their time)"),
    Metric("client_transfer_failure_ratio", "ratio", "clients", ("onionperf",), 12.0, True,
           "share of client transfers that failed or timed out"),
    # OnionPerf's tor client logs every circuit it builds: about 1,000 a day on op-hk5
    # (2021-01-01), 7,000 on op-hk6a (2021-06-01); 40/h is the lower, 5-minute-cadence rate.
    Metric("circuit_build_time_s", "s", "clients", ("onionperf",), 40.0, True,
           "time from launching a client circuit to its being built (LAUNCHED to BUILT)"),
    # No public source measures this one: OnionPerf times whole transfers, not cell queues.
    Metric("quiet_circuit_latency_ms", "ms", "relays", ("simulator", "interactive"), 12.0, True,
           "queueing delay of cells on quiet (interactive) circuits sharing channels with bulk ones"),
    Metric("relay_cpu_utilization", "ratio", "relays", _RELAY_PROCESS, 60.0, True,
           "tor process CPU time per wall second, a share of one core (stored as 1.0 = one core)"),
    Metric("relay_rss_bytes", "bytes", "relays", _RELAY_PROCESS, 60.0, True,
           "tor process resident memory"),
    Metric("relay_bandwidth_bytes_per_s", "bytes/s", "relays", _RELAY_TRAFFIC, 60.0, False,
           "relay traffic (read + written) per second"),
    Metric("relay_global_rate_limit_reached", "events/h", "relays", ("metricsport",), 60.0, True,
           "times a relay hit its global token-bucket limit (tor_relay_load_global_rate_limit_reached_total)"),
    Metric("relay_oom_bytes", "bytes", "relays", ("metricsport",), 60.0, True,
           "bytes freed by tor's out-of-memory handler (tor_relay_load_oom_bytes_total)"),
    Metric("relay_kernel_queue_bytes", "bytes", "relays", ("simulator",), 3600.0, True,
           "bytes waiting in kernel socket send buffers"),
)

_BY_NAME = {m.name: m for m in METRICS}


def get(name: str) -> Metric | None:
    return _BY_NAME.get(name)


#: How people read a metric in tables, plots and announcements: (unit shown, factor from the
#: catalogue's unit). CPU is "% of one core" everywhere (100 = one core kept busy), as operators
#: read it in top; bytes in MB (10^6) because tor's own logs and MetricsPort use decimal units.
CPU_UNIT = "% of one core"
_DISPLAY = {
    "relay_cpu_utilization": (CPU_UNIT, 100.0),
    "relay_rss_bytes": ("MB", 1e-6),
    "relay_bandwidth_bytes_per_s": ("MB/s", 1e-6),
    "relay_kernel_queue_bytes": ("KB", 1e-3),
    "relay_oom_bytes": ("MB", 1e-6),
    "client_transfer_failure_ratio": ("%", 100.0),
}


def display(name: str) -> tuple[str, float]:
    """(unit shown, factor) for ``name``: the value in the catalogue's unit times the factor is
    what a table, plot or announcement prints next to the unit."""
    if name in _DISPLAY:
        return _DISPLAY[name]
    m = _BY_NAME.get(name)
    return (m.unit if m else "", 1.0)


#: A few words naming each metric where its identifier would read as code (plot titles, legends);
#: the meaning above is the full sentence, too long for a panel's title.
_LABELS = {
    "client_ttfb_s": "client time to first byte",
    "client_ttlb_50kib_s": "client time to last byte, 50 KiB",
    "client_ttlb_1mib_s": "client time to last byte, 1 MiB",
    "client_ttlb_5mib_s": "client time to last byte, 5 MiB",
    "client_throughput_mbytes_per_s": "client throughput",
    "client_transfer_failure_ratio": "failed client transfers",
    "circuit_build_time_s": "circuit build time",
    "quiet_circuit_latency_ms": "cell delay on quiet circuits",
    "relay_cpu_utilization": "relay CPU",
    "relay_rss_bytes": "relay memory (RSS)",
    "relay_bandwidth_bytes_per_s": "relay traffic (read + written)",
    "relay_global_rate_limit_reached": "relay global rate limit reached",
    "relay_oom_bytes": "bytes freed by tor's OOM handler",
    "relay_kernel_queue_bytes": "bytes in kernel send buffers",
}


def label(name: str) -> str:
    """A short name for ``name`` in words (plot titles, legends); the identifier itself if unknown."""
    return _LABELS.get(name, name)


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


# --- the sample model shared by the engine's dry run and the linter --------------------------

#: Relays whose exporters are scraped per collection (one instance per sampled relay). 30: the
#: judge compares relay CPU relay by relay (paired log ratios), and at a relay-to-relay spread of the
#: change of 0.2 fewer than about 28 relays cannot decide a +25 % limit at any stage length (lint
#: KX201 names the count); 30 operators exposing MetricsPort to an experiment is what it asks for.
RELAY_INSTANCES = 30
#: OnionPerf vantage points measuring client metrics.
ONIONPERF_INSTANCES = 2
#: The engine collects each criterion's metric once a plan hour.
COLLECTION_HOURS = 1.0


def instances(metric: Metric) -> int:
    """Measuring instances a collection of ``metric`` draws from."""
    return RELAY_INSTANCES if metric.population == "relays" else ONIONPERF_INSTANCES


def instances_text(metric: Metric) -> str:
    return (f"{RELAY_INSTANCES} relays" if metric.population == "relays"
            else f"{ONIONPERF_INSTANCES} OnionPerf vantage points")


def samples_in(metric: Metric, hours: float = COLLECTION_HOURS) -> int:
    """Samples of ``metric`` gathered over ``hours`` of plan time from every instance."""
    return int(round(metric.samples_per_hour * instances(metric) * hours))


def collections_needed(metric: Metric, min_samples: int) -> int:
    """Hourly collections until ``min_samples`` samples of ``metric`` are in."""
    return max(1, math.ceil(min_samples / max(samples_in(metric), 1)))


def simulated() -> tuple[str, ...]:
    """Metrics the population simulator predicts (``kistexp simulate``), in catalogue order."""
    return tuple(m.name for m in METRICS if "simulator" in m.collectors)


# --- attack measures (docs/anonymity.md) -------------------------------------------------------


@attrs.frozen
class AttackMeasure:
    """A figure of what a traffic-analysis attack achieves on the simulated network: computed by
    ``kistexp.anonymity`` from a run's circuit trace, compared stage against baseline per network.
    Not a metric: nothing on the real network measures it, so no rollback criterion can collect it;
    an anonymity criterion judges it from the stage predictions."""

    name: str
    unit: str
    attack: str  # flow correlation | throughput fingerprinting | latency leakage | batching
    leakier: int  # +1: a higher value means the attack does better; -1: a lower value does
    label: str
    meaning: str
    fpr: float | None = None  # for a TPR at a false-positive rate: that rate


_FLOW = "flow correlation"
_FINGERPRINT = "throughput fingerprinting"
_LATENCY = "latency leakage"
_BATCHING = "batching"

ATTACK_MEASURES: tuple[AttackMeasure, ...] = (
    *(AttackMeasure(f"attack_flow_tpr_at_fpr_{a:g}", "ratio", _FLOW, +1, f"flow correlation TPR at FPR {a:g}",
                    f"share of circuits whose guard and exit flows a windowed rank correlator links, at a "
                    f"false-positive rate of {a:g}", fpr=a) for a in (1e-2, 1e-3, 1e-4)),
    AttackMeasure("attack_flow_auc", "ratio", _FLOW, +1, "flow correlation AUC",
                  "probability that a true guard/exit pair scores above a false one"),
    AttackMeasure("attack_fingerprint_auc", "ratio", _FINGERPRINT, +1, "throughput fingerprinting AUC",
                  "probability that a probe through a target's guard correlates with the target above a probe "
                  "through another relay"),
    AttackMeasure("attack_guard_entropy_after_bits", "bits", _FINGERPRINT, -1, "guard entropy left",
                  "entropy of the target's guard among the candidates after ranking them by probe correlation "
                  "(median over targets)"),
    AttackMeasure("attack_guard_entropy_drop_bits", "bits", _FINGERPRINT, +1, "guard entropy removed",
                  "bits of the guard's entropy the probes remove (median over targets)"),
    AttackMeasure("attack_guard_ranked_first", "ratio", _FINGERPRINT, +1, "guard ranked first",
                  "share of targets whose guard's probe correlates best"),
    AttackMeasure("attack_mi_region_rtt_bits", "bits", _LATENCY, +1, "region leaked by RTT",
                  "mutual information between a client's region and its circuits' round-trip time"),
    AttackMeasure("attack_mi_region_ttfb_bits", "bits", _LATENCY, +1, "region leaked by TTFB",
                  "mutual information between a client's region and its time to first byte"),
    AttackMeasure("attack_rtt_cv", "ratio", _LATENCY, -1, "RTT coefficient of variation",
                  "coefficient of variation of one circuit's round-trip times (median over circuits): steadier "
                  "RTTs locate a client better"),
    AttackMeasure("attack_gap_share_at_run_period", "ratio", _BATCHING, +1, "exit gaps at the run period",
                  "share of inter-cell gaps at an exit equal to its KIST run period"),
    AttackMeasure("attack_gap_ks_distance", "ratio", _BATCHING, +1, "exit gap KS distance to baseline",
                  "Kolmogorov-Smirnov distance between the exit gap distributions of the stage and the baseline"),
)

_ATTACK_BY_NAME = {m.name: m for m in ATTACK_MEASURES}


def attack_measure(name: str) -> AttackMeasure | None:
    return _ATTACK_BY_NAME.get(name)


def attack_measure_names() -> tuple[str, ...]:
    return tuple(_ATTACK_BY_NAME)


def flow_tpr_measure(fpr: float) -> str:
    """The measure name of the flow-correlation TPR at ``fpr`` (any rate, catalogued or not)."""
    return f"attack_flow_tpr_at_fpr_{fpr:g}"
