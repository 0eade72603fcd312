"""Attack measures of a stage prediction (docs/anonymity.md): which circuits a run traces and how many
flows the flow correlator gets from them.

A flow is one traced circuit over one segment of the stage window (``kistexp.anonymity.flowcorr``):
every circuit of three hops or more that is not a fingerprinting probe, cut into ``FLOW_SEGMENT_S``
segments. A false-positive rate of ``a`` needs ``1 / a`` flows (and false pairs) to be resolvable,
so a plan asking for one its runs cannot give is refused by lint before anything runs
(``plan_flow_capacity``). The capacity counts every such circuit; a circuit idle for a whole segment
gives no flow (its series is constant), so the flows measured are at most this many.
"""

from __future__ import annotations

import math
from pathlib import Path

from kistexp.population.geoip import load_geoip
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import SimNetwork, TrafficModel, build_network
from kistexp.population.stageruns import StageRuns

#: flow-correlation segment in seconds: a whole number of the circuit trace's 100-ms windows
FLOW_SEGMENT_S = 4.0
#: the warm-up simulate_plan uses when the caller gives no traffic model
DEFAULT_WARMUP_S = 10.0


def flow_circuits(sn: SimNetwork) -> list[int]:
    """Circuit ids whose guard and exit an observer can watch apart: three hops or more."""
    return [c for c, (path, _kind) in enumerate(sn.network.circuits) if len(path) >= 4]


def stage_window_s(duration_s: float, warmup_s: float) -> float:
    """Length of a prediction run's stage window (the last third after the warm-up,
    ``kistexp.population.predict``'s layout)."""
    return (duration_s - warmup_s) / 3


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
    warmup = min(DEFAULT_WARMUP_S, duration / 6) if warmup_s is None else warmup_s
    full = load_population(consensus)
    geoip = load_geoip()
    best: tuple[int, int] | None = None
    for seed in runs.seeds:
        sn = build_network(sample(full, runs.population_scale, seed), duration_s=duration, seed=seed,
                           interval_ms=10, traffic=TrafficModel(warmup_s=warmup), geoip=geoip)
        cap = flow_capacity(len(flow_circuits(sn)), stage_window_s(duration, warmup))
        best = cap if best is None else min(best, cap)
    return best if best is not None else (0, 0)
