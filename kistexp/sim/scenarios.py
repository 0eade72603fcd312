"""Registry of the simulator's path scenarios: name -> builder of a :class:`Network` and its
:class:`RunConfig`, plus the figures the fidelity harness compares with real tor.

A scenario's inputs are one frozen :class:`PathScenario`; a builder takes exactly that object,
so a caller that spells a field the registry does not know fails at once with a ``TypeError``
instead of having the argument silently dropped (the fidelity harness used to pick arguments by
the names an experiment function happened to declare).

* ``circuit``: one download over client-guard-middle-exit, possibly split over several streams
  of the one circuit (real tor: several SOCKS connections with the same username, which
  IsolateSOCKSAuth puts on one circuit);
* ``ceiling-path``: `circuits` downloads started together over the same path, so they share one
  channel per hop (real tor: one SOCKS username per circuit).

Both run on a loopback link as measured on the test machine (10 µs RTT, 64 KiB mss, no NIC
limit, Nagle and Linux's delayed-ACK rules: tor never sets ``TCP_NODELAY``), every node running
the scheduler; the client's interval is ``KISTSchedRunIntervalClient`` (kist-ewma.md §5.1) and
``cc_alg`` 2 means Vegas, 0 the fixed SENDME windows (§13).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import numpy as np

from kistexp.errors import SimConfigError
from kistexp.sim import workloads as wl
from kistexp.sim.config import LOOPBACK_MSS, FlowControlConfig, LinkConfig, NodeConfig, RunConfig
from kistexp.sim.network import Network, Transfer
from kistexp.sim.result import SimResult
from kistexp.sim.simulation import run as sim_run

CELL_BYTES = 514
MB = 1e6
#: The loopback link of the real test network: 64 KiB mss, no NIC limit, and a 10 µs round trip,
#: the median ``minrtt`` (``tcpi_min_rtt``) that ``ss -ti`` reported for 120 of tor's loopback
#: connections during a fidelity run (2026-12-01; 3-13 µs on the busy ones). Nagle is on: tor never
#: sets ``TCP_NODELAY`` (its only ``setsockopt`` calls, in core/mainloop/connection.c, are
#: SO_REUSEADDR, SO_EXCLUSIVEADDRUSE, IP_TRANSPARENT, IPV6_V6ONLY, IP_BIND_ADDRESS_NO_PORT and
#: SO_SNDBUF/SO_RCVBUF), so Linux's Nagle and delayed-ACK rules apply (``LinkConfig.nagle``, tcp.py).
#: The receive window is the one a busy OR connection of the real network advertises once
#: receive-buffer autotuning has grown it: the harness's downloads run over connections that
#: have carried the earlier repetitions. ``ss -tin`` on the busy connections during 20 MB
#: downloads (KIST at 2 and 10 ms, 2026-12-02 08:58 UTC, Linux 6.18, ``tcp_rmem`` max 32 MiB)
#: reported ``snd_wnd`` medians of 798 and 831 KB (86 KB at a connection's start, up to 2.4 MB)
#: and an mss of 65,483 B; the model's figures are the same for any window from 300 KB up
#: except 8 circuits under KIST at 10 ms (docs/simulator.md, "Design choices").
LOOPBACK_RECEIVE_WINDOW = 800_000
LOOPBACK_LINK = LinkConfig(rtt_ms=0.01, mss=LOOPBACK_MSS, nagle=True,
                           receive_window_bytes=LOOPBACK_RECEIVE_WINDOW)
#: tor's ``cc_alg`` consensus parameter (congestion_control_common.c): 0 = fixed SENDME windows,
#: 2 = Vegas (the default since 0.4.8.2-alpha).
CC_ALG_FLOW_CONTROL = {0: "sendme", 2: "vegas"}


@attrs.frozen(kw_only=True)
class PathScenario:
    """Inputs of one path scenario; every field has the meaning real tor's harness gives it."""

    scheduler: str = "kist"
    interval_ms: int = 10
    """``KISTSchedRunInterval`` of the guard, middle and exit."""
    client_interval_ms: int | None = None
    """``KISTSchedRunIntervalClient`` of the client (None: the relays' interval)."""
    circuits: int = 1
    streams: int = 1
    """Streams per circuit; each carries an equal share of its circuit's bytes."""
    cc_alg: int = 2
    transfer_bytes: int = 20 * wl.MIB
    """All bytes of the scenario, split evenly over circuits and streams."""
    kernel_tick_ms: float = 4.0
    rtt_ms: float = LOOPBACK_LINK.rtt_ms
    max_duration_s: float = 60.0
    seed: int = 1
    nagle: bool = LOOPBACK_LINK.nagle
    """Model Nagle and Linux's delayed ACKs on every connection (``LinkConfig.nagle``; tor never
    sets TCP_NODELAY). On by default; False gives the older model that acknowledges every flight
    one RTT after it left (docs/simulator.md, "Design choices")."""
    receive_window_bytes: int = LOOPBACK_LINK.receive_window_bytes
    """Every receiver's first window (``LinkConfig.receive_window_bytes``)."""
    receive_window_max_bytes: int = LOOPBACK_LINK.receive_window_max_bytes
    """The clamp up to which ``tcp_grow_window`` raises it (``LinkConfig``; 0: fixed)."""
    read_share: bool = True
    """Tor's read share on every connection (``RunConfig.read_share``)."""
    wake_rebase: bool = True
    """libevent's timeout measured from each pass of the loop (``RunConfig.wake_rebase``)."""
    edge_write_cells: int = 32
    """The edges' outbufs toward their applications and stream SENDMEs held while they are full
    (``FlowControlConfig.edge_write_cells``; 32 is tor's share on a rate-limited connection; 0: off)."""

    @property
    def client_interval(self) -> int:
        return self.interval_ms if self.client_interval_ms is None else self.client_interval_ms

    @property
    def flow_control(self) -> str:
        return CC_ALG_FLOW_CONTROL[self.cc_alg]

    def validate(self) -> None:
        for key, value, hi in (("circuits", self.circuits, 10_000), ("streams", self.streams, 1_000)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise SimConfigError(f"scenario: {key}={value!r} must be an integer in [1, {hi}]")
        if self.cc_alg not in CC_ALG_FLOW_CONTROL:
            raise SimConfigError(f"scenario: cc_alg={self.cc_alg!r} must be 0 (SENDME windows) or 2 (Vegas)")
        need = self.circuits * self.streams
        tb = self.transfer_bytes
        if isinstance(tb, bool) or not isinstance(tb, int) or tb < need:
            raise SimConfigError(f"scenario: transfer_bytes={tb!r} must be an integer >= {need}")


@attrs.frozen
class BuiltScenario:
    """A scenario ready to run: the network, its run configuration and its topology."""

    network: Network
    run_config: RunConfig
    topology: wl.Topology
    scenario: PathScenario
    payload_bytes: int
    """Bytes the downloads carry (transfer_bytes rounded down to whole streams)."""


@attrs.frozen
class PathFigures:
    """What the fidelity harness measures on real tor, from one simulator run."""

    throughput_mbytes_per_s: float
    """All bytes / time from the requests to the last byte (what the download clients see)."""
    elapsed_s: float
    finished: bool
    run_period_ms: float | None
    """Median gap between the middle relay's scheduler runs that moved cells."""
    cells_per_run_median: float | None
    """Median cells the middle relay moved per run that moved any."""


def _node(scheduler: str, interval_ms: int, role: str, tick_ms: float) -> NodeConfig:
    node = NodeConfig(role=role, scheduler=scheduler, kist_interval_ms=interval_ms, kernel_tick_ms=tick_ms)
    node.validate(role)
    return node


#: The fractional part of the golden ratio: seeds 1, 2, 3, ... give start phases spread evenly over
#: the tick for any number of seeds (a low-discrepancy sequence), seed 1 at the tick itself.
_PHASE_STEP = (5 ** 0.5 - 1) / 2


def start_phase_ms(seed: int, tick_ms: float) -> float:
    """When the downloads start, within the kernel tick, for run ``seed`` (ms).

    A real download's request leaves at an arbitrary time relative to the jiffies tick that every
    node's coarse clock and timer follow (kist-ewma.md §5.2), and the wake-up phases the nodes
    then carry from run to run are set by when the first cells arrive, so a figure from one start
    phase is one draw: on the loopback path KIST at 2 ms moves 7.6-10.9 MB/s depending on it
    (docs/simulator.md, "Design choices"). The seeds sample that phase instead of repeating one run.
    """
    return ((seed - 1) * _PHASE_STEP) % 1.0 * tick_ms


def build_path(s: PathScenario) -> BuiltScenario:
    """`circuits` x `streams` simultaneous downloads over one client-guard-middle-exit path."""
    s.validate()
    link = attrs.evolve(LOOPBACK_LINK, rtt_ms=s.rtt_ms, nagle=s.nagle,
                        receive_window_bytes=s.receive_window_bytes,
                        receive_window_max_bytes=s.receive_window_max_bytes)
    link.validate("link")
    tick = s.kernel_tick_ms
    topo = wl.three_hop_path(
        client=_node(s.scheduler, s.client_interval, "client", tick),
        guard=_node(s.scheduler, s.interval_ms, "guard", tick),
        middle=_node(s.scheduler, s.interval_ms, "middle", tick),
        exit=_node(s.scheduler, s.interval_ms, "exit", tick),
        link=link, circuits=s.circuits, labels=["bulk"] * s.circuits)
    per_stream = s.transfer_bytes // (s.circuits * s.streams)
    start_s = start_phase_ms(s.seed, tick) / 1000.0
    for c in topo.circuits:
        for _ in range(s.streams):
            topo.network.add_transfer(Transfer(circuit=c, response_bytes=per_stream, start_s=start_s))
    # the middle relay's runs are logged with the cells they move toward the guard: the download's
    # data, the channel the harness counts on real tor (its busiest, localnet.schedlog)
    guard, middle = topo.relays[0], topo.relays[1]
    fcc = FlowControlConfig(kind=s.flow_control, edge_write_cells=s.edge_write_cells)
    rc = RunConfig(duration_s=s.max_duration_s, seed=s.seed, flow_control=fcc,
                   sample_interval_s=s.max_duration_s / 100, read_share=s.read_share, wake_rebase=s.wake_rebase,
                   run_log_chan=topo.network.directed_channel(middle, guard))
    rc.validate()
    return BuiltScenario(topo.network, rc, topo, s, per_stream * s.circuits * s.streams)


def build_circuit(s: PathScenario) -> BuiltScenario:
    if s.circuits != 1:
        raise SimConfigError(f"scenario circuit: circuits={s.circuits} (it uses one circuit; see ceiling-path)")
    return build_path(s)


def path_figures(res: SimResult, built: BuiltScenario) -> PathFigures:
    """The harness's figures: bytes over the time to the last byte of the last stream (the run's
    length and the bytes delivered by then if one did not finish), and the middle relay's runs that
    moved cells toward the guard, with the cells they moved there (as real tor's are counted)."""
    s, topo = built.scenario, built.topology
    ttlb = res.transfer_ttlb_s
    finished = not bool(np.isnan(ttlb).any())
    if finished:
        elapsed, delivered = float(ttlb.max()), built.payload_bytes
    else:
        # the payload of the cells that reached the client (all DATA on this channel)
        wire = int(res.chan_bytes_sent[-1, res.chan_between(topo.relays[0], topo.clients[0])])
        elapsed, delivered = s.max_duration_s, wire // CELL_BYTES * wl.RELAY_DATA_BYTES
    middle = topo.relays[1]
    periods = res.run_periods_ms(middle, on_logged_chan=True)
    cells = res.cells_per_run(middle, on_logged_chan=True)
    cells = cells[cells > 0]
    return PathFigures(
        throughput_mbytes_per_s=delivered / elapsed / MB, elapsed_s=elapsed, finished=finished,
        run_period_ms=float(np.median(periods)) if len(periods) else None,
        cells_per_run_median=float(np.median(cells)) if len(cells) else None)


@attrs.frozen
class Scenario:
    name: str
    build: Callable[[PathScenario], BuiltScenario]
    figures: Callable[[SimResult, BuiltScenario], PathFigures]
    doc: str


REGISTRY: Mapping[str, Scenario] = {
    s.name: s for s in (
        Scenario("circuit", build_circuit, path_figures,
                 "one download over a pinned 3-hop path, split over `streams` streams of one circuit"),
        Scenario("ceiling-path", build_path, path_figures,
                 "`circuits` downloads started together over one pinned 3-hop path"),
    )
}


def get(name: str) -> Scenario:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SimConfigError(f"unknown scenario {name!r} (known: {', '.join(REGISTRY)})") from None


def run_scenario(name: str, scenario: PathScenario,
                 run: Callable[[Network, RunConfig], SimResult] | None = None) -> tuple[PathFigures, SimResult]:
    """Build scenario `name`, run it (with `run`, default :func:`kistexp.sim.run`) and measure it."""
    entry = get(name)
    built = entry.build(scenario)
    res = (run or sim_run)(built.network, built.run_config)
    return entry.figures(res, built), res
