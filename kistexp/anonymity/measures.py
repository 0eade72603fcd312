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
from kistexp.errors import AnonymityError
from kistexp.metrics import catalogue
from kistexp.sim import CircuitTrace


@attrs.frozen
class AttackMeasures:
    flow: FlowCorrelation | None  # None only with ``partial``: the trace gives no two flows
    fingerprint: Fingerprinting | None
    latency: LatencyLeakage
    gaps: GapDistribution


def attack_measures(trace: CircuitTrace, *, regions: Mapping[int, str], probes: Mapping[int, int] | None = None,
                    targets: Sequence[int] | None = None, flow_circuits: Sequence[int] | None = None,
                    fprs: Sequence[float] = DEFAULT_FPRS, segment_s: float | None = None,
                    direction: str = "both", seed: int = 0, partial: bool = False) -> AttackMeasures:
    """The four measures of ``trace``: ``regions`` maps client nodes to regions (latency leakage),
    ``probes`` relay nodes to probe circuits (``fingerprint.add_probes``; None: no fingerprinting),
    ``targets`` the fingerprinting targets, ``flow_circuits`` the flows correlated (default: every
    traced circuit but the one-hop probes).

    ``partial``: what a prediction asks for, where a run too short or too small for one attack must
    not lose the others: the false-positive rates the flows cannot resolve are left out, and flow
    correlation or fingerprinting that the trace cannot give (``AnonymityError``: fewer than two
    flows, a span shorter than a segment, fewer than 5 usable targets) is None. Without it each of
    those raises."""
    if flow_circuits is None and probes:
        probe_ids = set(probes.values())
        flow_circuits = [int(c) for c, p in zip(trace.circuits, trace.paths, strict=True)
                         if int(c) not in probe_ids and len(p) >= 3]
    try:
        flow = flow_correlation(trace, circuits=flow_circuits, direction=direction, segment_s=segment_s, fprs=fprs,
                                skip_unresolvable=partial)
    except AnonymityError:
        if not partial:
            raise
        flow = None
    fp = None
    if probes:
        try:
            fp = fingerprinting(trace, probes, targets=targets, seed=seed)
        except AnonymityError:
            if not partial:
                raise
    return AttackMeasures(flow, fp, latency_leakage(trace, regions, seed=seed), gap_distribution(trace))


def scalars(m: AttackMeasures, reference: AttackMeasures | None = None) -> dict[str, float]:
    """``m``'s figures under their catalogue names (``kistexp.metrics.catalogue.ATTACK_MEASURES``);
    ``attack_gap_ks_distance`` is to ``reference``'s gaps (0 without one: a baseline's distance to itself)."""
    out = {}
    if m.flow is not None:
        out.update({catalogue.flow_tpr_measure(a): v for a, v in m.flow.tpr.items()})
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
    if reference is None:
        out["attack_gap_ks_distance"] = 0.0
    elif m.gaps.total and reference.gaps.total:
        out["attack_gap_ks_distance"] = ks_distance(m.gaps, reference.gaps)
    else:
        out["attack_gap_ks_distance"] = math.nan  # no gaps seen in one of the runs: nothing to compare
    return out
