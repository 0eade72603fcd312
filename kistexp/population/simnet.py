"""A sampled population as a simulator network: relays, clients, circuits, links and traffic.

Uses ``kistexp.sim`` through its public API only (``Network``, ``NodeConfig``, ``LinkConfig``,
``InteractiveFlow``). What is built (docs/population.md, "Simulated networks"):

* **relays**: every relay of the sample; scheduler KIST on Linux, KISTLite elsewhere; the kernel tick of
  its class (``kernel_tick_ms = 1000 / HZ``); its tor version; a torrc ``KISTSchedRunInterval`` if its
  class overrides; a NIC at its capacity estimate times ``bandwidth_scale``;
* **clients**: tornettools' TGen processes for the sample (population.md §2.4:
  ``max(round(users * 0.01), min(users, 100))``), each standing for many users, placed in the relays'
  countries by consensus weight (user country shares are not in the shared data), 1 Gbit/s links
  (tornettools' floor for a TGen host); each runs C tor (KIST, ``KISTSchedRunIntervalClient``) or, by the
  ``[clients]`` shares, Arti (``client_node_config``: no scheduler run, so the simulator's Vanilla, taking
  neither KIST run interval nor the EWMA half-life from the consensus; ``kistexp.population.arti``);
  the measurement clients run C tor;
* **paths**: tor's path selection (``kistexp.population.paths``) for port 443, each client keeping its
  primary guards;
* **links**: one channel per node pair on a path, RTT from the latency model
  (``kistexp.population.latency``), packet loss ``loss_rate`` on every link;
* **traffic** (``TrafficModel``): web-like clients fetch 320 KiB with exponential think times, bulk clients
  10 MiB downloads, interactive circuits a small exchange every 100 ms (labelled ``interactive``: the
  quiet-circuit latency), OnionPerf-like measurement clients 50 KiB / 1 MiB / 5 MiB at weights 12:2:1
  (tornettools' perf clients) every ``perf_period_s``. All rates are scaled together so that relays' mean
  utilisation (bytes relayed / capacity) reaches ``load`` (default 0.4: "normal for most relays to be
  loaded at 30 %-80 %", population.md §5), computed from the drawn paths before the run.
"""

from __future__ import annotations

import attrs
import numpy as np

from kistexp.errors import PopulationError
from kistexp.population import arti, latency
from kistexp.population.classes import (
    ClassShares,
    RelayClass,
    assign_classes,
    assign_client_classes,
    client_class_reads,
    load_class_shares,
)
from kistexp.population.geoip import GeoIP, load_geoip
from kistexp.population.paths import pick_paths, sample_primary_guards
from kistexp.population.relays import Population
from kistexp.population.sampling import client_budget
from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig

KIB = 1024
MIB = 1024 * KIB
PERF_SIZES = (50 * KIB, MIB, 5 * MIB)
PERF_WEIGHTS = (12, 2, 1)  # tornettools' perf-client mix
PROCESS_SCALE = 0.01  # tornettools: TGen processes per user
CLIENT_LINK_BYTES_PER_S = 125e6  # 1 Gbit/s: tornettools' floor for a client host
REQUEST_BYTES = 498


@attrs.frozen
class TrafficModel:
    """Client behaviour; ``load`` scales every rate (except the measurement clients')."""

    load: float = 0.4  # target mean relay utilisation (population.md §5: 0.3-0.6)
    web_share: float = 0.90  # client processes by kind (assumption, see docs/population.md)
    bulk_share: float = 0.05
    interactive_share: float = 0.05
    web_bytes: int = 320 * KIB
    bulk_bytes: int = 10 * MIB
    circuits_per_client: int = 3
    perf_clients: int = 24  # tornettools: 100 in 4 countries; enough 5 MiB samples in a short window
    perf_period_s: float = 5.0  # tornettools every 60 s, OnionPerf 300 s: compressed for short runs
    interactive_period_s: float = 0.1
    loss_rate: float = 0.0
    warmup_s: float = 10.0  # excluded from every measurement (tornettools drops its first 1,200 s)
    bandwidth_scale: float = 1.0  # NIC rates x this: smaller keeps large networks tractable

    def validate(self) -> None:
        if not 0 < self.load < 1:
            raise PopulationError(f"traffic load {self.load!r} must be in (0, 1): a mean relay utilisation")
        if abs(self.web_share + self.bulk_share + self.interactive_share - 1) > 1e-6:
            raise PopulationError("traffic shares web + bulk + interactive must sum to 1")
        if not 0 <= self.loss_rate < 0.5:
            raise PopulationError(f"loss_rate {self.loss_rate!r} must be in [0, 0.5)")
        if not 0 < self.bandwidth_scale <= 1:
            raise PopulationError(f"bandwidth_scale {self.bandwidth_scale!r} must be in (0, 1]")
        if self.warmup_s < 0 or self.perf_period_s <= 0 or self.circuits_per_client < 1:
            raise PopulationError("warmup_s >= 0, perf_period_s > 0 and circuits_per_client >= 1 are required")


@attrs.frozen(eq=False)
class SimNetwork:
    """A built network and what the population layer needs to read its results."""

    network: Network
    population: Population
    relay_nodes: tuple[int, ...]  # node id of relay i of the population
    relay_classes: tuple[RelayClass, ...]
    relay_positions: tuple[str, ...]  # D/G/E/M
    relay_countries: tuple[str, ...]
    client_nodes: tuple[int, ...]
    perf_nodes: tuple[int, ...]
    mean_utilisation: float  # expected, from the drawn paths and rates
    offered_bytes_per_s: float  # client bytes per second asked for
    traffic: TrafficModel
    client_countries: tuple[str, ...] = ()  # of client_nodes then perf_nodes (latency leakage, kistexp.anonymity)
    client_classes: tuple[str, ...] = ()  # implementation of client_nodes then perf_nodes: "tor" or "arti"

    def client_class(self, node: int) -> str:
        """The implementation client node ``node`` runs (``kistexp.population.classes.CLIENT_CLASSES``)."""
        clients = self.client_nodes + self.perf_nodes
        if node not in clients:
            raise PopulationError(f"node {node} is not a client of this network")
        return self.client_classes[clients.index(node)] if self.client_classes else "tor"

    def apply(self, sim, nodes, values) -> tuple:
        """``sim.apply(nodes, values)`` as each node's implementation reads the consensus: relays and C tor
        clients take ``values``; Arti clients only the parameters Arti reads (``arti.acts_on``: never a
        KIST run interval), and ``kist-enabled=1``, which the simulator cannot run, is refused
        (``arti.check_simulable``). Returns the ``AppliedConsensus`` of each node in ``nodes``' order."""
        nodes = [int(n) for n in nodes]
        values = dict(values)
        clients = set(self.client_nodes + self.perf_nodes)
        arti_nodes = [n for n in nodes if n in clients and self.client_class(n) == "arti"]
        if arti_nodes:
            arti.check_simulable(values)
        others = [n for n in nodes if n not in set(arti_nodes)]
        applied = {}
        if others:
            applied.update((a.node, a) for a in sim.apply(others, values))
        if arti_nodes:
            read = {k: v for k, v in values.items() if arti.acts_on(k)}
            applied.update((a.node, a) for a in sim.apply(arti_nodes, read))
        return tuple(applied[n] for n in nodes)

    def reached_clients(self, names) -> tuple[int, ...]:
        """The client nodes (``client_nodes`` then ``perf_nodes`` order) whose implementation takes at least
        one of the consensus parameters ``names``: a KISTSchedRunInterval stage leaves the Arti clients out."""
        names = tuple(names)
        return tuple(n for n in self.client_nodes + self.perf_nodes
                     if any(client_class_reads(self.client_class(n), k) for k in names))


def _poisson_starts(rng: np.random.Generator, rate: float, t0: float, t1: float) -> np.ndarray:
    if rate <= 0 or t1 <= t0:
        return np.zeros(0)
    n = rng.poisson(rate * (t1 - t0))
    return np.sort(rng.uniform(t0, t1, n))


def client_node_config(client_class: str, scheduler: str | None = None) -> NodeConfig:
    """The simulator node of a client process of ``client_class``.

    C tor: KIST at ``KISTSchedRunIntervalClient``'s default 2 ms. Arti (``kistexp.population.arti``) runs
    no scheduler and writes cells as soon as the socket takes them: the simulator's Vanilla, alone in its
    ``Schedulers`` list so no run interval can switch it, with the consensus's EWMA half-life ignored
    (Arti has no circuit priority; the simulator still orders its circuits by EWMA at the default
    half-life). Its ``kist-enabled`` is 0 by default and is then this; kist-enabled=1 needs a
    TCP_NOTSENT_LOWAT the simulator lacks (``arti.check_simulable``). ``scheduler`` forces one scheduler
    on every client, as ``build_network`` does for scheduler comparisons."""
    if client_class not in ("tor", "arti"):
        raise PopulationError(f"unknown client implementation {client_class!r}")
    if scheduler is not None or client_class == "tor":
        return NodeConfig(role="client", scheduler=scheduler or "kist", kist_interval_ms=2,
                          nic_rate_bytes_per_s=CLIENT_LINK_BYTES_PER_S)
    return NodeConfig(role="client", scheduler="vanilla", schedulers=("vanilla",), kist_interval_ms=2,
                      nic_rate_bytes_per_s=CLIENT_LINK_BYTES_PER_S, torrc_overrides=("CircuitPriorityHalflife",))


def build_network(pop: Population, *, duration_s: float, seed: int, interval_ms: int,
                  traffic: TrafficModel = TrafficModel(), shares: ClassShares | None = None,
                  geoip: GeoIP | None = None, scale: float | None = None,
                  model: latency.LatencyModel = latency.LatencyModel(),
                  scheduler: str | None = None) -> SimNetwork:
    """The simulator network of ``pop`` with every relay starting at ``interval_ms``.

    ``scheduler`` (kist, kistlite, vanilla) puts every relay and client on that scheduler instead of
    its class's (for scheduler comparisons such as docs/validation.md)."""
    traffic.validate()
    rng = np.random.default_rng(seed)
    shares = shares or load_class_shares()
    geoip = geoip or load_geoip()
    classes = assign_classes([r.version for r in pop.relays], shares, seed)
    countries = geoip.lookup_many([r.address for r in pop.relays])
    net = Network(LinkConfig(rtt_ms=4 * model.relay_access_ms, loss_rate=traffic.loss_rate))
    relay_nodes = []
    for r, cls in zip(pop.relays, classes, strict=True):
        interval = cls.torrc_interval or interval_ms
        relay_nodes.append(net.add_node(NodeConfig(
            role="relay", scheduler=scheduler or ("kist" if cls.scheduler == "KIST" else "kistlite"),
            kist_interval_ms=int(interval), kernel_tick_ms=1000.0 / cls.hz,
            nic_rate_bytes_per_s=r.capacity * traffic.bandwidth_scale, tor_version=cls.tor_version,
            torrc_overrides=("KISTSchedRunInterval",) if cls.torrc_interval else (),
        ), name=f"r{len(relay_nodes)}-{r.nickname}"))
    # clients: tornettools' process count for the network's scale
    scale = scale if scale is not None else min(1.0, len(pop) / 6075)
    users = client_budget(scale).users
    n_clients = max(round(users * PROCESS_SCALE), min(users, 100))
    weights = pop.bandwidth / pop.bandwidth.sum()
    client_cc = [countries[i] for i in rng.choice(len(pop), size=n_clients + traffic.perf_clients, p=weights)]
    kinds = rng.choice(3, size=n_clients, p=[traffic.web_share, traffic.bulk_share, traffic.interactive_share])
    # the implementations come from a stream of their own: every draw above and below is the same with or
    # without Arti clients
    implementations = assign_client_classes(n_clients, shares, seed)
    client_nodes, perf_nodes = [], []
    for i in range(n_clients):
        client_nodes.append(net.add_node(client_node_config(implementations[i], scheduler),
                                         name=f"c{i}-{('web', 'bulk', 'interactive')[kinds[i]]}"))
    for i in range(traffic.perf_clients):
        perf_nodes.append(net.add_node(client_node_config("tor", scheduler), name=f"perf{i}"))
    all_clients = client_nodes + perf_nodes
    cpc = traffic.circuits_per_client
    guards = sample_primary_guards(pop, len(all_clients), rng)
    paths = pick_paths(pop, len(all_clients) * cpc, port=443, seed=int(rng.integers(2**31)),
                       circuits_per_client=cpc, primary_guards=guards)
    # node countries: relays then clients, for the RTT of each channel
    node_cc = {relay_nodes[i]: countries[i] for i in range(len(pop))}
    node_cc.update({n: client_cc[k] for k, n in enumerate(all_clients)})
    is_client = set(all_clients)

    def link(a: int, b: int) -> LinkConfig:
        access = sum(model.client_access_ms if n in is_client else model.relay_access_ms for n in (a, b))
        d = latency.great_circle_km(latency.centroid(node_cc[a]), latency.centroid(node_cc[b]))
        return LinkConfig(rtt_ms=float(2 * model.one_way_ms(d, access)), loss_rate=traffic.loss_rate)

    circuits = []  # (circuit id, client index, kind)
    for k in range(len(paths)):
        client = k // cpc
        hops = [all_clients[client], relay_nodes[paths.guard[k]], relay_nodes[paths.middle[k]],
                relay_nodes[paths.exit[k]]]
        for u, v in zip(hops, hops[1:], strict=False):
            if net.channel_between(u, v) is None:
                net.add_channel(u, v, link(u, v))
        kind = "perf" if client >= n_clients else ("web", "bulk", "interactive")[kinds[client]]
        circuits.append((net.add_circuit(hops, label=kind), client, kind))

    t0, t1 = 0.0, duration_s
    # per-circuit byte rates at unit load, then one factor for the target utilisation
    base_rate = {"web": 1.0 / 10.0, "bulk": 1.0 / 30.0}  # transfers per second per circuit at unit scale
    relay_bytes = np.zeros(len(pop))
    cap = np.array([r.capacity * traffic.bandwidth_scale for r in pop.relays])
    k_of = {c: k for k, (c, _, _) in enumerate(circuits)}

    def add_bytes(circuit: int, bytes_per_s: float) -> None:
        k = k_of[circuit]
        cells_bytes = bytes_per_s * 514 / 498  # cells on the wire
        for idx in (paths.guard[k], paths.middle[k], paths.exit[k]):
            relay_bytes[idx] += 2 * cells_bytes  # read and written

    perf_mean = float(np.dot(PERF_SIZES, PERF_WEIGHTS) / sum(PERF_WEIGHTS))
    for c, _client, kind in circuits:
        if kind in base_rate:
            add_bytes(c, base_rate[kind] * (traffic.web_bytes if kind == "web" else traffic.bulk_bytes))
        elif kind == "perf":
            add_bytes(c, perf_mean / traffic.perf_period_s / cpc)
    # utilisation counts bytes read + written against 2 x capacity (a NIC each way)
    unit_util = float(np.mean(relay_bytes / (2 * cap)))
    if unit_util <= 0:
        raise PopulationError("no traffic crosses the relays: cannot reach a target load")
    factor = traffic.load / unit_util
    offered = 0.0
    for c, _client, kind in circuits:
        if kind in ("web", "bulk"):
            size = traffic.web_bytes if kind == "web" else traffic.bulk_bytes
            starts = _poisson_starts(rng, base_rate[kind] * factor, t0, t1)
            offered += base_rate[kind] * factor * size
            net.add_transfers(np.full(len(starts), c), np.full(len(starts), REQUEST_BYTES),
                              np.full(len(starts), size), starts)
        elif kind == "interactive":
            phase = float(rng.uniform(0, traffic.interactive_period_s))
            net.add_interactive(InteractiveFlow(circuit=c, start_s=phase, stop_s=t1,
                                                period_s=traffic.interactive_period_s))
    # measurement clients: one transfer every perf_period_s per client, rotating over its circuits
    for p in range(traffic.perf_clients):
        own = [c for c, client, kind in circuits if kind == "perf" and client == n_clients + p]
        starts = np.arange(float(rng.uniform(0, traffic.perf_period_s)), t1, traffic.perf_period_s)
        sizes = rng.choice(PERF_SIZES, size=len(starts), p=np.array(PERF_WEIGHTS) / sum(PERF_WEIGHTS))
        circ = np.array([own[j % len(own)] for j in range(len(starts))], dtype=np.int64)
        net.add_transfers(circ, np.full(len(starts), REQUEST_BYTES), sizes, starts)
    mean_util = float(np.mean((relay_bytes - 0) / (2 * cap))) * factor  # perf part scaled too (small)
    return SimNetwork(net, pop, tuple(relay_nodes), tuple(classes), tuple(str(c) for c in pop.classes),
                      tuple(countries), tuple(client_nodes), tuple(perf_nodes), mean_util, offered, traffic,
                      client_countries=tuple(str(c) for c in client_cc),
                      client_classes=(*implementations, *(["tor"] * traffic.perf_clients)))


def bandwidth_band(capacity_bytes_per_s: float) -> str:
    mbit = capacity_bytes_per_s * 8 / 1e6
    return ">100 Mbit/s" if mbit > 100 else "10-100 Mbit/s" if mbit >= 10 else "<10 Mbit/s"


POSITION_NAMES = {"D": "guard+exit", "G": "guard", "E": "exit", "M": "middle"}


def relay_class_label(pos: str, cls: RelayClass, capacity: float) -> str:
    """The label predictions carry per relay, e.g. ``exit linux HZ=250 >100 Mbit/s``."""
    return f"{POSITION_NAMES[pos]} {cls.os} HZ={cls.hz} {bandwidth_band(capacity)}"
