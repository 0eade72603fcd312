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
:class:`InteractiveSpec`); :func:`add_workload` puts it on a network's circuits as the core's
transfers. :func:`one_relay`, :func:`three_hop_path` and :func:`small_network` build the
topologies the experiments use.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import attrs

from kistexp.errors import SimConfigError
from kistexp.sim import layout as L
from kistexp.sim.config import LinkConfig, NodeConfig
from kistexp.sim.network import Network

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
RELAY_DATA_BYTES = L.RELAY_PAYLOAD
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
                   rate_bytes_per_s: float = 100e6) -> list[TransferSpec]:
    """Back-to-back bulk downloads, carried as one stream that stays backlogged for the run: as
    many `size_bytes` downloads as `rate_bytes_per_s` could move in `duration_s` (the core runs
    the transfers of a circuit concurrently, so a series would overlap; the gap of a request
    round trip between two real downloads is left out)."""
    count = max(1, math.ceil(duration_s * rate_bytes_per_s / size_bytes))
    return [TransferSpec(circuit, "bulk", start_s, size_bytes * count)]


def web_transfers(circuit: int, start_s: float, duration_s: float, rng: random.Random,
                  size_bytes: int = WEB_BYTES, think_s: tuple[float, float] = WEB_THINK_S) -> list[TransferSpec]:
    """320 KiB downloads separated by a uniform think time (counted start to start: a download
    takes well under the minimum think time except on a congested circuit)."""
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


def add_workload(network: Network, workload: Workload, circuits: Sequence[int], seed: int) -> None:
    """Put `workload` on the network: workload circuit i runs on network circuit `circuits[i]`.

    Transfers become the core's :class:`Transfer` streams; each interactive exchange is a
    transfer of ``request_cells`` and 1-2 response cells of 498 payload bytes (§1)."""
    if len(circuits) < len(workload.kinds):
        raise SimConfigError(
            f"workload: {len(workload.kinds)} circuits needed, {len(circuits)} given")
    if workload.transfers:
        network.add_transfers(
            [circuits[t.circuit] for t in workload.transfers],
            [t.request_bytes for t in workload.transfers],
            [t.size_bytes for t in workload.transfers],
            [t.start_s for t in workload.transfers],
        )
    rng = random.Random(seed)
    for spec in workload.interactive:
        ex = interactive_exchanges(spec, rng)
        if ex:
            network.add_transfers(
                [circuits[spec.circuit]] * len(ex),
                [req * RELAY_DATA_BYTES for _, req, _ in ex],
                [resp * RELAY_DATA_BYTES for _, _, resp in ex],
                [t for t, _, _ in ex],
            )


# -- topologies ----------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class Topology:
    """A network under construction and the ids the experiments need."""

    network: Network
    clients: tuple[int, ...]
    relays: tuple[int, ...]
    circuits: tuple[int, ...]


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return ["default"] * n
    if len(labels) != n:
        raise SimConfigError(f"topology: {len(labels)} labels for {n} circuits")
    return [str(x) for x in labels]


def one_relay(channels: int, circuits: int, *, relay: NodeConfig, client: NodeConfig,
              link: LinkConfig, labels: Sequence[str] | None = None) -> Topology:
    """One relay with `channels` channels, one per client, and `circuits` one-hop circuits
    spread round-robin over them. The relay is the circuits' far edge, so every cell it sends
    comes out of its own circuit queues: its scheduler alone decides what goes on each channel."""
    if channels < 1 or circuits < 1:
        raise SimConfigError(f"topology: channels={channels} and circuits={circuits} must be >= 1")
    net = Network(default_link=link)
    r = net.add_node(relay, "relay")
    clients = tuple(net.add_node(client, f"client{i}") for i in range(channels))
    names = _labels(labels, circuits)
    circs = tuple(net.add_circuit([clients[i % channels], r], names[i]) for i in range(circuits))
    return Topology(net, clients, (r,), circs)


def three_hop_path(*, client: NodeConfig, guard: NodeConfig, middle: NodeConfig, exit: NodeConfig,
                   link: LinkConfig, circuits: int = 1, labels: Sequence[str] | None = None) -> Topology:
    """client - guard - middle - exit, with `circuits` circuits over this one path."""
    if circuits < 1:
        raise SimConfigError(f"topology: circuits={circuits} must be >= 1")
    net = Network(default_link=link)
    c = net.add_node(client, "client")
    g = net.add_node(guard, "guard")
    m = net.add_node(middle, "middle")
    x = net.add_node(exit, "exit")
    names = _labels(labels, circuits)
    circs = tuple(net.add_circuit([c, g, m, x], names[i]) for i in range(circuits))
    return Topology(net, (c,), (g, m, x), circs)


def small_network(relays: int, circuits: int, *, clients: int, seed: int, relay: NodeConfig,
                  client: NodeConfig, link: LinkConfig, labels: Sequence[str] | None = None) -> Topology:
    """`relays` relays and `clients` clients; each circuit (on client i mod `clients`) picks three
    distinct relays uniformly at random (seeded) as guard, middle and exit."""
    if relays < 3:
        raise SimConfigError(f"topology: relays={relays} must be >= 3 for 3-hop circuits")
    if clients < 1 or circuits < 1:
        raise SimConfigError(f"topology: clients={clients} and circuits={circuits} must be >= 1")
    rng = random.Random(seed)
    net = Network(default_link=link)
    rs = tuple(net.add_node(relay, f"relay{i}") for i in range(relays))
    cs = tuple(net.add_node(client, f"client{i}") for i in range(clients))
    names = _labels(labels, circuits)
    circs = tuple(net.add_circuit([cs[i % clients], *rng.sample(rs, 3)], names[i]) for i in range(circuits))
    return Topology(net, cs, rs, circs)


def cells_for(size_bytes: int) -> int:
    """DATA cells needed to carry `size_bytes` of stream payload."""
    return -(-size_bytes // RELAY_DATA_BYTES)
