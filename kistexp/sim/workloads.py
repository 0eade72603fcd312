"""Traffic for the simulator: what each circuit carries, and small topologies to carry it.

Four kinds of circuit traffic (issue 4, point 4), all seeded so a seed gives the same schedule:

* **bulk**: 5 MiB downloads back to back, the "bulk client" of Shadow-based Tor studies
  (Jansen & Hopper, NDSS 2012; "Never Been KIST", USENIX Security 2014);
* **web**: 320 KiB downloads separated by a think time drawn uniformly from [1, 60] s (the
  same studies' "web client"; the think-time range is this model's choice);
* **onionperf**: a 1000-byte request, then a 50 KiB, 1 MiB or 5 MiB download chosen with weights
  12 : 2 : 1, a new one started every pause whether or not the last one finished: the perfclient
  graph of tornettools (`generate_tgen.py`), which Shadow uses to mimic OnionPerf. Its pause is
  60 s (OnionPerf/Torperf itself waits 5 minutes: ``pause_s=300``);
* **interactive**: a one-cell request every ~100 ms answered by one or two cells (think
  ssh/IRC-like traffic: what EWMA is meant to favour, kist-ewma.md §11.7).

A :class:`Workload` is the schedule (a tuple of :class:`TransferSpec` and
:class:`InteractiveSpec`); :func:`to_flows` turns it into the simulation core's flow objects on
given circuits.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from kistexp.errors import SimConfigError

KIB = 1024
MIB = 1024 * 1024

BULK_BYTES = 5 * MIB
WEB_BYTES = 320 * KIB
WEB_THINK_S = (1.0, 60.0)
ONIONPERF_SIZES_BYTES = (50 * KIB, 1 * MIB, 5 * MIB)
ONIONPERF_WEIGHTS = (12.0, 2.0, 1.0)
ONIONPERF_PAUSE_S = 60.0
ONIONPERF_REQUEST_BYTES = 1000
INTERACTIVE_PERIOD_S = 0.1
RELAY_DATA_BYTES = 498
"""Payload of one DATA cell (kist-ewma.md §1, v0 relay header)."""

KINDS = ("bulk", "web", "onionperf", "interactive")


@attrs.frozen
class TransferSpec:
    """One download on a circuit: the client asks at `start_s`, the exit sends `size_bytes`."""

    circuit: int
    kind: str
    start_s: float
    size_bytes: int
    request_bytes: int = ONIONPERF_REQUEST_BYTES


@attrs.frozen
class InteractiveSpec:
    """Request/response traffic on a circuit: every ~`period_s` (jittered ±50 %) from `start_s`
    to `stop_s` the client sends `request_cells` cells and the exit answers with 1 or 2 cells."""

    circuit: int
    start_s: float
    stop_s: float
    period_s: float = INTERACTIVE_PERIOD_S
    request_cells: int = 1
    response_cells: tuple[int, int] = (1, 2)


@attrs.frozen
class WorkloadMix:
    """Proportions of circuit kinds; they need not sum to 1 (they are normalised)."""

    bulk: float = 1.0
    web: float = 0.0
    onionperf: float = 0.0
    interactive: float = 0.0

    def __attrs_post_init__(self) -> None:
        values = attrs.asdict(self)
        for kind, share in values.items():
            if not share >= 0:
                raise SimConfigError(f"workload mix: {kind} must be >= 0, got {share!r}")
        if sum(values.values()) <= 0:
            raise SimConfigError("workload mix: at least one of bulk, web, onionperf, interactive must be > 0")

    def counts(self, circuits: int) -> dict[str, int]:
        """Circuits per kind for `circuits` circuits (largest remainder, ties in KINDS order)."""
        shares = attrs.asdict(self)
        total = sum(shares.values())
        exact = {kind: circuits * shares[kind] / total for kind in KINDS}
        counts = {kind: int(exact[kind]) for kind in KINDS}
        left = circuits - sum(counts.values())
        for kind in sorted(KINDS, key=lambda k: (-(exact[k] - counts[k]), KINDS.index(k)))[:left]:
            counts[kind] += 1
        return counts


@attrs.frozen
class Workload:
    transfers: tuple[TransferSpec, ...]
    interactive: tuple[InteractiveSpec, ...]
    kinds: tuple[str, ...]
    """Kind of each circuit, by circuit index."""

    def circuits_of(self, kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.kinds) if k == kind)


def _check_window(duration_s: float, start_spread_s: float) -> None:
    if not duration_s > 0:
        raise SimConfigError(f"workload: duration_s must be > 0, got {duration_s!r}")
    if not start_spread_s >= 0:
        raise SimConfigError(f"workload: start_spread_s must be >= 0, got {start_spread_s!r}")


def bulk_transfers(circuit: int, start_s: float, duration_s: float, size_bytes: int = BULK_BYTES,
                   count: int | None = None) -> list[TransferSpec]:
    """Back-to-back bulk downloads. The core starts each one when the previous ends (see
    :func:`to_flows`), so only the first start time is real; `count` defaults to enough
    downloads to stay busy for `duration_s` at 1 GB/s."""
    n = count if count is not None else max(1, int(duration_s * 1e9 / size_bytes) + 1)
    return [TransferSpec(circuit, "bulk", start_s, size_bytes) for _ in range(n)]


def web_transfers(circuit: int, start_s: float, duration_s: float, rng: random.Random,
                  size_bytes: int = WEB_BYTES, think_s: tuple[float, float] = WEB_THINK_S) -> list[TransferSpec]:
    """320 KiB downloads with a uniform think time; start times assume each download takes no
    time, the core delays a download until its predecessor on the circuit is done."""
    out: list[TransferSpec] = []
    t = start_s
    while t < duration_s:
        out.append(TransferSpec(circuit, "web", t, size_bytes))
        t += rng.uniform(*think_s)
    return out


def onionperf_transfers(circuit: int, start_s: float, duration_s: float, rng: random.Random,
                        pause_s: float = ONIONPERF_PAUSE_S) -> list[TransferSpec]:
    """OnionPerf-style measurements: one download of 50 KiB / 1 MiB / 5 MiB every `pause_s`."""
    if not pause_s > 0:
        raise SimConfigError(f"workload: onionperf pause_s must be > 0, got {pause_s!r}")
    out: list[TransferSpec] = []
    t = start_s
    while t < duration_s:
        size = rng.choices(ONIONPERF_SIZES_BYTES, weights=ONIONPERF_WEIGHTS)[0]
        out.append(TransferSpec(circuit, "onionperf", t, size))
        t += pause_s
    return out


def build_workload(mix: WorkloadMix, circuits: int, duration_s: float, seed: int, *,
                   start_spread_s: float = 1.0, onionperf_pause_s: float = ONIONPERF_PAUSE_S) -> Workload:
    """A seeded schedule for `circuits` circuits mixed as `mix`; first starts spread uniformly over
    `start_spread_s` so circuits do not all begin in the same scheduler run."""
    if circuits < 1:
        raise SimConfigError(f"workload: circuits must be >= 1, got {circuits!r}")
    _check_window(duration_s, start_spread_s)
    rng = random.Random(seed)
    kinds: list[str] = [kind for kind, n in mix.counts(circuits).items() for _ in range(n)]
    rng.shuffle(kinds)
    transfers: list[TransferSpec] = []
    interactive: list[InteractiveSpec] = []
    for circ, kind in enumerate(kinds):
        start = rng.uniform(0.0, start_spread_s)
        if kind == "bulk":
            transfers += bulk_transfers(circ, start, duration_s)
        elif kind == "web":
            transfers += web_transfers(circ, start, duration_s, rng)
        elif kind == "onionperf":
            transfers += onionperf_transfers(circ, start, duration_s, rng, onionperf_pause_s)
        else:
            interactive.append(InteractiveSpec(circ, start, duration_s))
    return Workload(tuple(transfers), tuple(interactive), tuple(kinds))


def interactive_exchanges(spec: InteractiveSpec, rng: random.Random) -> list[tuple[float, int, int]]:
    """The (time_s, request_cells, response_cells) exchanges of an interactive circuit."""
    out: list[tuple[float, int, int]] = []
    t = spec.start_s
    lo, hi = spec.response_cells
    while t < spec.stop_s:
        out.append((t, spec.request_cells, rng.randint(lo, hi)))
        t += spec.period_s * rng.uniform(0.5, 1.5)
    return out


def cells_for(size_bytes: int) -> int:
    """DATA cells needed to carry `size_bytes` of stream payload."""
    return -(-size_bytes // RELAY_DATA_BYTES)


def spread(values: Sequence[float]) -> float:
    return max(values) - min(values) if values else 0.0
