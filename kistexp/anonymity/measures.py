"""The four attack measures of one trace, and the scalar figures the paired comparison reads.

``attack_measures(trace, regions=..., probes=...)`` computes flow correlation (``flowcorr``), throughput
fingerprinting (``fingerprint``, when the network has probes), latency leakage (``latency``) and the
exit gap distribution (``batching``) of one run's trace; ``scalars`` turns them into named figures, the
KS distance of the gaps taken to a reference run's (the baseline's, for a stage), so that
``paired.paired_differences`` can compare a stage with its baseline unit by unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kistexp.anonymity.batching import GapDistribution, gap_distribution, ks_distance
from kistexp.anonymity.fingerprint import Fingerprinting, fingerprinting
from kistexp.anonymity.flowcorr import DEFAULT_FPRS, FlowCorrelation, flow_correlation
from kistexp.anonymity.latency import LatencyLeakage, latency_leakage
from kistexp.metrics import catalogue
from kistexp.sim import CircuitTrace


@attrs.frozen
class AttackMeasures:
    flow: FlowCorrelation
    fingerprint: Fingerprinting | None
    latency: LatencyLeakage
    gaps: GapDistribution


def attack_measures(trace: CircuitTrace, *, regions: Mapping[int, str], probes: Mapping[int, int] | None = None,
                    targets: Sequence[int] | None = None, flow_circuits: Sequence[int] | None = None,
                    fprs: Sequence[float] = DEFAULT_FPRS, segment_s: float | None = None,
                    direction: str = "both", seed: int = 0) -> AttackMeasures:
    """The four measures of ``trace``: ``regions`` maps client nodes to regions (latency leakage),
    ``probes`` relay nodes to probe circuits (``fingerprint.add_probes``; None: no fingerprinting),
    ``targets`` the fingerprinting targets, ``flow_circuits`` the flows correlated (default: every
    traced circuit but the one-hop probes)."""
    if flow_circuits is None and probes:
        probe_ids = set(probes.values())
        flow_circuits = [int(c) for c, p in zip(trace.circuits, trace.paths, strict=True)
                         if int(c) not in probe_ids and len(p) >= 3]
    flow = flow_correlation(trace, circuits=flow_circuits, direction=direction, segment_s=segment_s, fprs=fprs)
    fp = fingerprinting(trace, probes, targets=targets, seed=seed) if probes else None
    return AttackMeasures(flow, fp, latency_leakage(trace, regions, seed=seed), gap_distribution(trace))


def scalars(m: AttackMeasures, reference: AttackMeasures | None = None) -> dict[str, float]:
    """``m``'s figures under their catalogue names (``kistexp.metrics.catalogue.ATTACK_MEASURES``);
    ``attack_gap_ks_distance`` is to ``reference``'s gaps (0 without one: a baseline's distance to itself)."""
    out = {catalogue.flow_tpr_measure(a): v for a, v in m.flow.tpr.items()}
    out["attack_flow_auc"] = m.flow.auc
    if m.fingerprint is not None:
        out["attack_fingerprint_auc"] = m.fingerprint.auc
        out["attack_guard_entropy_after_bits"] = m.fingerprint.entropy_after_bits
        out["attack_guard_entropy_drop_bits"] = m.fingerprint.entropy_reduction_bits
        out["attack_guard_ranked_first"] = m.fingerprint.guard_top1
    lat = m.latency
    out["attack_mi_region_rtt_bits"] = lat.rtt.bits if lat.rtt is not None else math.nan
    out["attack_mi_region_ttfb_bits"] = lat.ttfb.bits if lat.ttfb is not None else math.nan
    out["attack_rtt_cv"] = lat.rtt_cv_median
    out["attack_gap_share_at_run_period"] = m.gaps.share_at_period
    out["attack_gap_ks_distance"] = ks_distance(m.gaps, reference.gaps) if reference is not None else 0.0
    return out
