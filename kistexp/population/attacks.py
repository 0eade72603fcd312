"""Attack measures of a stage prediction (docs/anonymity.md): which circuits a run traces, over which
span, how many flows the flow correlator gets from them, and the measures of one run.

A flow is one traced circuit over one segment of the stage window (``kistexp.anonymity.flowcorr``):
every circuit of three hops or more that is not a fingerprinting probe, cut into ``FLOW_SEGMENT_S``
segments. The trace covers the whole seconds of the stage window (``trace_window``: the trace's
blocks are 1 s), which is what ``stage_window_s`` counts. A false-positive rate of ``a`` needs
``1 / a`` flows (and false pairs) to be resolvable, so a plan asking for one its runs cannot give is
refused by lint before anything runs (``plan_flow_capacity``). The capacity counts every such circuit;
a circuit idle for a whole segment gives no flow (its series is constant), so the flows measured are
at most this many.

``measure_run`` computes the measures of one run (``kistexp.population.predict``'s cells, a plan's
stage or a sweep's values) from its circuit trace: the scalars of ``kistexp.anonymity.scalars`` but
the KS distance of the exit gaps, which needs the baseline's run and is computed where both meet
(``predict.simulate_plan``), from the gap histogram sent back.

Throughput fingerprinting needs probes (``plan_probes``, ``kistexp.anonymity.add_probes``): attacker
clients whose backlogged downloads load the relays they measure, so they change every performance
figure of the run. They are added only when asked for (``kistexp simulate --probes N``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp.population.geoip import load_geoip
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import SimNetwork, TrafficModel, build_network
from kistexp.population.stageruns import StageRuns, default_warmup_s, run_windows

#: flow-correlation segment in seconds: a whole number of the circuit trace's 100-ms windows
FLOW_SEGMENT_S = 4.0


def flow_circuits(sn: SimNetwork) -> list[int]:
    """Circuit ids whose guard and exit an observer can watch apart: three hops or more."""
    return [c for c, (path, _kind) in enumerate(sn.network.circuits) if len(path) >= 4]


#: the circuit trace's count window and block (what ``CircuitTraceConfig`` defaults to)
TRACE_WINDOW_MS = 100.0
TRACE_BLOCK_S = 1.0
#: the fingerprinting correlation window (``kistexp.anonymity.fingerprinting``'s default)
FINGERPRINT_WINDOW_S = 1.0


def trace_window(start_s: float, end_s: float) -> tuple[float, float]:
    """The span a run's trace measures for the window ``[start_s, end_s)``: its whole trace blocks
    (``Simulation.circuit_trace`` takes block boundaries only). Empty (t0 >= t1) when none fits."""
    t0 = math.ceil(start_s / TRACE_BLOCK_S - 1e-9) * TRACE_BLOCK_S
    t1 = math.floor(end_s / TRACE_BLOCK_S + 1e-9) * TRACE_BLOCK_S
    return float(t0), float(t1)


def stage_trace_window(duration_s: float, warmup_s: float) -> tuple[float, float]:
    """The traced span of a prediction run's stage window ``[b, end)`` (``stageruns.run_windows``)."""
    return trace_window(run_windows(duration_s, warmup_s)[2], duration_s)


def stage_window_s(duration_s: float, warmup_s: float) -> float:
    """Length of the traced part of a prediction run's stage window (``stage_trace_window``)."""
    t0, t1 = stage_trace_window(duration_s, warmup_s)
    return max(0.0, t1 - t0)


def flow_segments(window_s: float, segment_s: float = FLOW_SEGMENT_S) -> int:
    return int(math.floor(window_s / segment_s + 1e-9))


def flow_capacity(circuits: int, window_s: float, segment_s: float = FLOW_SEGMENT_S) -> tuple[int, int]:
    """(flows, false pairs) at most from ``circuits`` traced circuits over a ``window_s`` stage window."""
    k = flow_segments(window_s, segment_s)
    return circuits * k, circuits * (circuits - 1) * k


def plan_flow_capacity(runs: StageRuns, consensus: str | Path | None = None,
                       warmup_s: float | None = None) -> tuple[int, int]:
    """The fewest (flows, false pairs) any of ``runs``' sampled networks can give (see the module
    docstring): each seed's network is sampled and built as the prediction builds it, no run made."""
    duration = runs.duration.total_seconds()
    warmup = default_warmup_s(duration) if warmup_s is None else warmup_s
    full = load_population(consensus)
    geoip = load_geoip()
    best: tuple[int, int] | None = None
    for seed in runs.seeds:
        sn = build_network(sample(full, runs.population_scale, seed), duration_s=duration, seed=seed,
                           interval_ms=10, traffic=TrafficModel(warmup_s=warmup), geoip=geoip)
        cap = flow_capacity(len(flow_circuits(sn)), stage_window_s(duration, warmup))
        best = cap if best is None else min(best, cap)
    return best if best is not None else (0, 0)


# --- the measures of one run -------------------------------------------------------------------------


@attrs.frozen
class ProbePlan:
    """Fingerprinting probes of one network: the target circuits and the relays probed (the targets'
    guards first, then other guards), the same for every run of the network (common random numbers)."""

    targets: tuple[int, ...]
    relays: tuple[int, ...]


def plan_probes(sn: SimNetwork, count: int, t0_s: float, t1_s: float, seed: int) -> ProbePlan:
    """``count`` targets among the flow circuits with a transfer starting in ``[t0_s, t1_s - 2)`` (one
    that does not end at once; interactive flows, whose few cells say little about throughput, left
    out) and ``count`` probed relays: the targets' guards, then other guards at random."""
    rng = np.random.default_rng(seed)
    circ, _, _, start = sn.network.transfer_arrays()
    busy = set(circ[(start >= t0_s) & (start < t1_s - 2.0)].tolist())
    pool = [c for c in flow_circuits(sn) if c in busy and sn.network.circuits[c][1] != "interactive"]
    targets = sorted(rng.choice(pool, size=min(count, len(pool)), replace=False).tolist()) if pool else []
    guards = list(dict.fromkeys(sn.network.circuits[c][0][1] for c in targets))
    others = sorted({p[1] for p, _ in sn.network.circuits if len(p) >= 4} - set(guards))
    rng.shuffle(others)
    relays = guards + others[:max(0, count - len(guards))]
    return ProbePlan(tuple(int(c) for c in targets), tuple(int(r) for r in relays))


def trace_config(sn: SimNetwork, t0_s: float, probe_circuits: Sequence[int] = ()):
    """The circuit trace a run of ``sn`` needs for the measures from ``t0_s`` on: the flow circuits and
    the probes, recorded from a second before ``t0_s`` (``CircuitTraceConfig.start_s``)."""
    from kistexp.sim import CircuitTraceConfig

    return CircuitTraceConfig(circuits=tuple(flow_circuits(sn)) + tuple(int(c) for c in probe_circuits),
                              window_ms=TRACE_WINDOW_MS, block_s=TRACE_BLOCK_S, start_s=t0_s)


@attrs.frozen
class RunAttacks:
    """The attack measures of one run over its traced span."""

    values: tuple[tuple[str, float], ...]  # (catalogue measure, value), finite ones only, KS distance left out
    exit_gaps: tuple[int, ...] = attrs.field(repr=False)  # pooled exit inter-cell gaps per bin (trace's bins)
    flows: int  # true pairs the flow correlator scored (0: none)
    false_pairs: int
    cpu_s: float  # CPU seconds spent computing the measures (not recording the trace)


def measure_run(sim, sn: SimNetwork, t0_s: float, t1_s: float, *, probes: dict[int, int] | None = None,
                targets: Sequence[int] | None = None, segment_s: float = FLOW_SEGMENT_S,
                seed: int = 0) -> RunAttacks:
    """The measures of ``sim``'s trace over ``[t0_s, t1_s)`` (``trace_window`` bounds): flow correlation
    at every rate of ``DEFAULT_FPRS`` its flows resolve, fingerprinting when ``probes`` are given, latency
    leakage with the clients' countries as regions, the exit gaps. What the span cannot give (no flows
    in a span shorter than a segment, too few fingerprinting targets) is left out, not an error."""
    from kistexp.anonymity import DEFAULT_FPRS, attack_measures, scalars

    cpu0 = time.process_time()
    trace = sim.circuit_trace(t0_s, t1_s)
    regions = dict(zip((*sn.client_nodes, *sn.perf_nodes), sn.client_countries, strict=True))
    # a span shorter than one segment gives no flow, as flow_capacity counts
    m = attack_measures(trace, regions=regions, probes=probes or None, targets=targets,
                        flow_circuits=flow_circuits(sn), fprs=DEFAULT_FPRS, segment_s=segment_s, seed=seed,
                        partial=True)
    figures = scalars(m)
    figures.pop("attack_gap_ks_distance", None)
    values = tuple((k, float(v)) for k, v in figures.items() if math.isfinite(v))
    return RunAttacks(values, tuple(int(x) for x in m.gaps.counts), m.flow.n_flows if m.flow else 0,
                      m.flow.n_false_pairs if m.flow else 0, time.process_time() - cpu0)
