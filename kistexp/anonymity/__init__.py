"""Anonymity guardrails (issue 37): simple, published traffic-analysis attacks measured on the simulated
network, per stage, against the baseline (docs/anonymity.md; the spec, /work/shared/spec/anonymity.md).

A consensus parameter such as ``KISTSchedRunInterval`` changes no path, only timing; what can move is
what the timing attacks read.  Each measure is computed from a run's circuit trace (``kistexp.sim``'s
``RunConfig(circuit_trace=CircuitTraceConfig())`` and ``Simulation.circuit_trace``), which records what
an observer at every circuit's guard and exit sees:

* ``flowcorr.flow_correlation``: RAPTOR's windowed Spearman correlator between each circuit's guard
  and exit; TPR at FPR 1e-2, 1e-3, 1e-4 over all true and false pairs of the same span (an FPR the
  flows cannot resolve is refused, ``FprResolutionError``);
* ``fingerprint.fingerprinting`` with ``fingerprint.add_probes``: Mittal et al.'s throughput
  fingerprinting, AUC of on-path vs off-path probe correlation and the guard candidates' entropy;
* ``latency.latency_leakage``: Hopper et al.'s latency leakage, mutual information between the
  client's region and RTT / TTFB (binned, Miller-Madow corrected), RTT coefficient of variation;
* ``batching.gap_distribution`` / ``batching.ks_distance``: exit inter-cell gaps, KS distance to
  the baseline's, share of gaps at the run period;
* ``measures.attack_measures`` / ``measures.scalars`` all four of one trace, and
  ``paired.paired_differences`` stage minus baseline over networks x seeds with 95 % intervals;
* ``stages.stage_differences``: the stored measures of ``kistexp simulate`` (``AttackValue`` per stage
  and network) as paired stage-minus-baseline figures, what reports and anonymity criteria read;
* ``scenarios.isolate_circuits``: the leaky control (one circuit per channel, nothing else on the
  relays) that must move the measures, or a measure is blind in this model.

Uses the simulator through its public API only (``kistexp.sim``); the run period of a KIST exit
comes from ``kistexp.population.kernels``.
"""

from __future__ import annotations

from kistexp.anonymity.batching import GapDistribution, gap_distribution, ks_distance, ks_distance_counts
from kistexp.anonymity.fingerprint import Fingerprinting, add_probes, fingerprinting
from kistexp.anonymity.flowcorr import (
    DEFAULT_FPRS,
    FlowCorrelation,
    FprResolutionError,
    flow_correlation,
    resolvable_fprs,
    tpr_at_fpr,
)
from kistexp.anonymity.latency import LatencyLeakage, MutualInformation, latency_leakage, mutual_information_bits
from kistexp.anonymity.measures import AttackMeasures, attack_measures, scalars
from kistexp.anonymity.paired import PairedDifference, paired_difference, paired_differences
from kistexp.anonymity.scenarios import Isolated, isolate_circuits
from kistexp.anonymity.stages import AttackFigure, stage_differences

__all__ = [
    "DEFAULT_FPRS",
    "AttackFigure",
    "AttackMeasures",
    "Fingerprinting",
    "FlowCorrelation",
    "FprResolutionError",
    "GapDistribution",
    "Isolated",
    "LatencyLeakage",
    "MutualInformation",
    "PairedDifference",
    "add_probes",
    "attack_measures",
    "fingerprinting",
    "flow_correlation",
    "gap_distribution",
    "isolate_circuits",
    "ks_distance",
    "ks_distance_counts",
    "latency_leakage",
    "mutual_information_bits",
    "paired_difference",
    "paired_differences",
    "resolvable_fprs",
    "scalars",
    "stage_differences",
    "tpr_at_fpr",
]
