"""The simulator's experiments (issue 4, point 6), as plain functions with keyword arguments.

Each returns a frozen attrs result, whose JSON is ``jsonout.to_json(result)``: keys carry their
units, and a figure with no sample (NaN) is null. Every function validates its arguments through
the core's configuration objects before anything runs, so a bad argument raises
:class:`~kistexp.errors.SimConfigError` at once.

* :func:`ceiling` - KISTLite's 64-cell budget per channel per run over the real run period
  (kist-ewma.md §6, §12.2, §5.2); Vanilla and loopback KIST are not bound by it.
* :func:`ceiling_path` - the fidelity harness's ceiling scenario as real tor runs it: 8
  downloads started together over one client-guard-middle-exit path (Vegas, slow start and tail
  included), against which real tor's figures are compared.
* :func:`circuit` / :func:`circuit_sweep` - one bulk transfer over client-guard-middle-exit on a
  loopback-like path: the circuit window over a round trip that each hop's scheduler inflates
  (§12.2 "latency side effect").
* :func:`kist_first_run` - the §6 table: mss 1448, IW10, idle socket -> 53 cells.
* :func:`ewma` - interactive vs bulk queueing delay on one channel, over run intervals (§11.7,
  §12.1's "grace period" trade-off).
* :func:`kernel_queue` - KIST keeps kernel queues short and queues in the application; Vanilla
  fills the kernel (§9).

``run_experiment(name, ...)`` maps the CLI's common options onto these functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from kistexp import jsonout
from kistexp.errors import SimConfigError
from kistexp.sim import scenarios
from kistexp.sim import workloads as wl
from kistexp.sim.config import (
    LOOPBACK_MSS,
    SCHEDULERS,
    FlowControlConfig,
    LinkConfig,
    NodeConfig,
    RunConfig,
)
from kistexp.sim.costmodel import result_node_cpu
from kistexp.sim.network import Network, Transfer
from kistexp.sim.result import DELAY_KINDS, SimResult
from kistexp.sim.scenarios import CC_ALG_FLOW_CONTROL, LOOPBACK_LINK, PathFigures, PathScenario
from kistexp.sim.simulation import run

EXPERIMENTS = ("ceiling", "ceiling-path", "circuit", "kist-first-run", "ewma", "kernel-queue")
CELL_BYTES = 514
MB = 1e6

Progress = Callable[[int, int], None]
"""Called as progress(done, total) in hundredths of runs while an experiment works."""

# A relay-to-client path across the internet, for the experiments where queues must form at a
# relay: 25 ms RTT, Ethernet mss, 0.1 % loss so that TCP's cwnd settles (about 1.22/sqrt(p) = 40
# segments) instead of growing into an unbounded NIC queue. The RTT is deliberately not a
# multiple of the 4 ms kernel tick, so that timers and ACKs do not all fall on one lattice.
# A modelling choice, not a tor value.
WAN_LINK = LinkConfig(rtt_ms=25.0, mss=1448, loss_rate=0.001)


# -- helpers -------------------------------------------------------------------------------------


class _Runs:
    """Turns the core's per-run fraction callback into progress(done, total) over n runs."""

    def __init__(self, progress: Progress | None, total_runs: int) -> None:
        self.progress = progress
        self.total = 100 * total_runs
        self.done_runs = 0

    def run(self, network: Network, rc: RunConfig) -> SimResult:
        cb = None
        if self.progress is not None:
            base = 100 * self.done_runs
            report = self.progress
            total = self.total

            def cb(fraction: float) -> None:
                report(base + int(round(100 * fraction)), total)

        res = run(network, rc, progress=cb)
        self.done_runs += 1
        return res


def _node(scheduler: str, interval_ms: int, role: str, **extra: Any) -> NodeConfig:
    node = NodeConfig(role=role, scheduler=scheduler, kist_interval_ms=interval_ms, **extra)
    node.validate(role)
    return node


def _run_config(duration_s: float, seed: int, flow_control: str, *, exit_read_cells: int | None = None,
                **extra: Any) -> RunConfig:
    fcc = FlowControlConfig(kind=flow_control)
    if exit_read_cells is not None:
        fcc = attrs.evolve(fcc, exit_read_cells=exit_read_cells)
    rc = RunConfig(duration_s=duration_s, seed=seed, flow_control=fcc, **extra)
    rc.validate()
    return rc


def _positive_int(name: str, value: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise SimConfigError(f"experiment: {name}={value!r} must be an integer in [1, {hi}]")


def _steady_throughput(res: SimResult, chan: int, warmup_s: float) -> float:
    """Mean wire rate of a channel after `warmup_s` (bytes/s), from the cumulative byte series."""
    t = res.sample_times_s
    b = res.chan_bytes_sent[:, chan]
    i = int(np.searchsorted(t, warmup_s))
    if i >= len(t) - 1:
        i = 0
    return float((b[-1] - b[i]) / (t[-1] - t[i]))


def _find(points: Sequence[Any], **match: Any) -> Any:
    """The point of a curve whose attributes equal `match`."""
    for p in points:
        if all(getattr(p, k) == v for k, v in match.items()):
            return p
    raise KeyError(f"no point with {match}")


def _nan_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _hop_delay_ms(res: SimResult, kind: str, label: str, node: int, q: float | None) -> float:
    """Per-cell delay of `kind` at the hop leaving `node` for circuits labelled `label` (percentile
    `q`, or the mean when q is None). Uses the raw samples' sending node (row 4) when the core
    records it; otherwise the label's samples over every hop of the circuits, which also count
    the client's request and SENDME cells."""
    raw = res.raw_delays
    if raw.shape[0] >= 5 and raw.shape[1] > 0:
        labels = np.asarray(res.circuit_labels)
        sel = (raw[0] == DELAY_KINDS[kind]) & (raw[4] == node) & (labels[raw[1]] == label)
        d = raw[2, sel] / 1e6
        if not len(d):
            return math.nan
        return float(np.percentile(d, q)) if q is not None else float(d.mean())
    if q is None:
        return res.delay_mean_ms(kind, label)
    return res.delay_percentile_ms(kind, q, label)


def _relay_delay_ms(res: SimResult, label: str, relay: int, q: float | None) -> float:
    """Time a cell spends at the relay: circuit queue plus kernel. With the core's per-hop total
    ("hop") this is the true percentile; otherwise the sum of the two parts' percentiles."""
    if "hop" in DELAY_KINDS:
        return _hop_delay_ms(res, "hop", label, relay, q)
    return _hop_delay_ms(res, "app", label, relay, q) + _hop_delay_ms(res, "kernel", label, relay, q)


# -- ceiling -------------------------------------------------------------------------------------


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class CeilingResult:
    scheduler: str
    interval_ms: int
    circuits: int
    kernel_tick_ms: float
    mss_bytes: int
    duration_s: float
    throughput_mbytes_per_s: float
    run_period_ms: float | None
    """Mean gap between the relay's busy scheduler runs after warm-up (the real period P, §5.2)."""
    cells_per_run_mode: int | None
    cells_per_run_median: float | None
    runs_per_s: float
    budget_throughput_mbytes_per_s: float | None
    """cells_per_run_mode * 514 B / run_period_ms: what the per-run budget allows."""


def ceiling(*, scheduler: str = "kistlite", interval_ms: int = 10, circuits: int = 8,
            duration_s: float = 2.0, kernel_tick_ms: float = 4.0, mss: int = LOOPBACK_MSS,
            flow_control: str = "vegas", seed: int = 1, progress: Progress | None = None) -> CeilingResult:
    """One relay, one channel to one client, `circuits` bulk circuits on it (so circuit flow
    control does not bind), loopback-like link. KISTLite should move 64 cells per run from an
    empty outbuf (§6), so 32,896 B per real period P (§5.2: 12 ms at 10, 4 ms at 2 with a 4 ms
    tick); Vanilla (§9) and KIST with a 64 KiB mss (§6 table) should not be bound by that."""
    _positive_int("circuits", circuits, 10_000)
    relay = _node(scheduler, interval_ms, "exit", kernel_tick_ms=kernel_tick_ms)
    client = _node(scheduler, interval_ms, "client", kernel_tick_ms=kernel_tick_ms)
    link = attrs.evolve(LOOPBACK_LINK, mss=mss)
    link.validate("link")
    rc = _run_config(duration_s, seed, flow_control, sample_interval_s=duration_s / 20)
    topo = wl.one_relay(1, circuits, relay=relay, client=client, link=link, labels=["bulk"] * circuits)
    for c in topo.circuits:
        topo.network.add_transfer(Transfer(circuit=c, response_bytes=_bulk_bytes(duration_s, 2e9)))
    res = _Runs(progress, 1).run(topo.network, rc)
    r = topo.relays[0]
    chan = res.chan_between(r, topo.clients[0])
    warm = duration_s / 4
    times = res.run_time_s[(res.run_node == r) & (res.run_cells > 0)]
    cells = res.run_cells[(res.run_node == r) & (res.run_cells > 0)]
    steady = times >= warm
    periods = np.diff(times[steady]) * 1e3
    cells = cells[steady]
    period = float(periods.mean()) if len(periods) else None
    mode = int(np.bincount(cells).argmax()) if len(cells) else None
    budget = None
    if scheduler != "vanilla" and period and mode is not None:
        budget = mode * CELL_BYTES / (period / 1e3) / MB
    return CeilingResult(
        scheduler=scheduler, interval_ms=interval_ms, circuits=circuits, kernel_tick_ms=kernel_tick_ms,
        mss_bytes=mss, duration_s=duration_s,
        throughput_mbytes_per_s=_steady_throughput(res, chan, warm) / MB,
        run_period_ms=period, cells_per_run_mode=mode,
        cells_per_run_median=float(np.median(cells)) if len(cells) else None,
        runs_per_s=float(len(cells) / (duration_s - warm)), budget_throughput_mbytes_per_s=budget,
    )


def _bulk_bytes(duration_s: float, rate_bytes_per_s: float) -> int:
    """A response big enough to keep a circuit backlogged for the whole run."""
    return wl.bulk_transfers(0, 0.0, duration_s, rate_bytes_per_s=rate_bytes_per_s)[0].size_bytes


# -- one circuit ---------------------------------------------------------------------------------


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class CircuitResult:
    scheduler: str
    interval_ms: int
    client_interval_ms: int
    flow_control: str
    transfer_bytes: int
    finished: bool
    ttfb_ms: float | None
    ttlb_s: float | None
    throughput_mbytes_per_s: float
    """transfer_bytes / time to last byte (what a download client measures)."""
    max_inflight_cells: int
    cpu_core_fraction_max: float
    """Busiest node's CPU share from the cost model; above 1 the run is CPU-bound in reality."""
    run_period_ms: float | None = None
    """Median gap between the middle relay's scheduler runs that moved cells."""
    cells_per_run_median: float | None = None
    """Median cells the middle relay moved per run that moved any."""
    streams: int = 1
    cc_alg: int = 2


def _path_run(name: str, scenario: PathScenario, runs: _Runs) -> tuple[PathFigures, SimResult, wl.Topology]:
    """Scenario `name` of the registry (:mod:`kistexp.sim.scenarios`), run and measured."""
    entry = scenarios.get(name)
    built = entry.build(scenario)
    res = runs.run(built.network, built.run_config)
    return entry.figures(res, built), res, built.topology


def _cc_alg(flow_control: str | None, cc_alg: int | None) -> int:
    """`cc_alg` from either spelling; the scenario validates the value."""
    if flow_control is not None and cc_alg is not None:
        raise SimConfigError("experiment: give flow_control or cc_alg, not both")
    if flow_control is not None:
        for alg, kind in CC_ALG_FLOW_CONTROL.items():
            if kind == flow_control:
                return alg
        raise SimConfigError(f"experiment: flow_control={flow_control!r} must be one of "
                             f"{', '.join(CC_ALG_FLOW_CONTROL.values())}")
    return 2 if cc_alg is None else cc_alg


def circuit(*, scheduler: str = "kist", interval_ms: int = 10, client_interval_ms: int | None = None,
            transfer_bytes: int = 20 * wl.MIB, streams: int = 1, cc_alg: int | None = None,
            flow_control: str | None = None, kernel_tick_ms: float = 4.0,
            rtt_ms: float = LOOPBACK_LINK.rtt_ms, max_duration_s: float = 60.0, seed: int = 1,
            nagle: bool = LOOPBACK_LINK.nagle, progress: Progress | None = None,
            _runs: _Runs | None = None) -> CircuitResult:
    """One bulk download over client-guard-middle-exit on the measured loopback link
    (``scenarios.LOOPBACK_LINK``: 10 µs RTT, 64 KiB mss, no NIC limit, Nagle), split over
    `streams` streams of the one circuit: every node runs `scheduler`,
    relays at `interval_ms`, the client at `client_interval_ms` (``KISTSchedRunIntervalClient``,
    default: the same). Congestion control is Vegas (``cc_alg=2``) by default, as in tor 0.4.8+
    (§13.2); ``cc_alg=0`` (or ``flow_control="sendme"``) uses the fixed SENDME windows. ``nagle``
    models Nagle and Linux's delayed ACKs on every connection (``LinkConfig.nagle``)."""
    runs = _runs if _runs is not None else _Runs(progress, 1)
    alg = _cc_alg(flow_control, cc_alg)
    scenario = PathScenario(scheduler=scheduler, interval_ms=interval_ms, client_interval_ms=client_interval_ms,
                            circuits=1, streams=streams, cc_alg=alg, transfer_bytes=transfer_bytes,
                            kernel_tick_ms=kernel_tick_ms, rtt_ms=rtt_ms, max_duration_s=max_duration_s, seed=seed,
                            nagle=nagle)
    fig, res, _topo = _path_run("circuit", scenario, runs)
    ttlb = float(np.nanmax(res.transfer_ttlb_s)) if fig.finished else math.nan
    ttfb = float(np.nanmin(res.transfer_ttfb_s))
    # CPU estimate over the transfer's own duration, not the idle rest of the run
    cpu = max(result_node_cpu(res, n).total_s for n in range(len(res.node_names))) / fig.elapsed_s
    return CircuitResult(
        scheduler=scheduler, interval_ms=interval_ms, client_interval_ms=scenario.client_interval,
        flow_control=scenario.flow_control, transfer_bytes=transfer_bytes, finished=fig.finished,
        ttfb_ms=_nan_none(ttfb * 1e3), ttlb_s=_nan_none(ttlb), throughput_mbytes_per_s=fig.throughput_mbytes_per_s,
        max_inflight_cells=int(res.circuit_max_inflight_cells[0].max()), cpu_core_fraction_max=cpu,
        run_period_ms=fig.run_period_ms, cells_per_run_median=fig.cells_per_run_median, streams=streams,
        cc_alg=alg,
    )


# -- the channel ceiling on a real path ------------------------------------------------------------


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class PathCeilingResult:
    scheduler: str
    interval_ms: int
    client_interval_ms: int
    circuits: int
    flow_control: str
    transfer_bytes: int
    finished: bool
    throughput_mbytes_per_s: float
    """All circuits' bytes / time from the requests to the last byte (what the real harness
    measures for its 8 parallel downloads)."""
    max_inflight_cells: int
    """Largest number of DATA cells one circuit had in flight (its Vegas window in use)."""
    run_period_ms: float | None
    """Median gap between the middle relay's scheduler runs that moved cells."""
    cells_per_run_median: float | None
    """Median cells the middle relay moved per run that moved any."""
    cc_alg: int = 2


def ceiling_path(*, scheduler: str = "kist", interval_ms: int = 10, client_interval_ms: int | None = None,
                 circuits: int = 8, transfer_bytes: int = 20 * wl.MIB, cc_alg: int | None = None,
                 flow_control: str | None = None, kernel_tick_ms: float = 4.0, rtt_ms: float = LOOPBACK_LINK.rtt_ms,
                 max_duration_s: float = 60.0, seed: int = 1, nagle: bool = LOOPBACK_LINK.nagle,
                 progress: Progress | None = None) -> PathCeilingResult:
    """The fidelity harness's ``ceiling`` scenario as real tor runs it: `circuits` downloads of
    ``transfer_bytes / circuits`` each, started together over the same client-guard-middle-exit
    path, so they share one channel per hop; Vegas per circuit (§13.2), the client at
    ``KISTSchedRunIntervalClient``. Unlike :func:`ceiling` (one relay, channel kept backlogged,
    steady state) this includes slow start, each circuit's own window over the round trip every
    hop's scheduler inflates (§12.2), and the tail of the transfers. Under KISTLite the channel's
    64 cells per run still bind (§6); under KIST and Vanilla what binds is the circuits' windows."""
    _positive_int("circuits", circuits, 10_000)
    alg = _cc_alg(flow_control, cc_alg)
    scenario = PathScenario(scheduler=scheduler, interval_ms=interval_ms, client_interval_ms=client_interval_ms,
                            circuits=circuits, cc_alg=alg, transfer_bytes=transfer_bytes,
                            kernel_tick_ms=kernel_tick_ms, rtt_ms=rtt_ms, max_duration_s=max_duration_s, seed=seed,
                            nagle=nagle)
    fig, res, _topo = _path_run("ceiling-path", scenario, _Runs(progress, 1))
    return PathCeilingResult(
        scheduler=scheduler, interval_ms=interval_ms, client_interval_ms=scenario.client_interval, circuits=circuits,
        flow_control=scenario.flow_control, transfer_bytes=transfer_bytes, finished=fig.finished,
        throughput_mbytes_per_s=fig.throughput_mbytes_per_s,
        max_inflight_cells=int(res.circuit_max_inflight_cells.max()), run_period_ms=fig.run_period_ms,
        cells_per_run_median=fig.cells_per_run_median, cc_alg=alg,
    )


CIRCUIT_SWEEP = (("kist", 10), ("kist", 5), ("kist", 2), ("kistlite", 10), ("kistlite", 2), ("vanilla", 10))


@attrs.frozen
class CircuitSweepResult:
    points: tuple[CircuitResult, ...]

    def throughput(self, scheduler: str, interval_ms: int) -> float:
        return _find(self.points, scheduler=scheduler, interval_ms=interval_ms).throughput_mbytes_per_s


def circuit_sweep(*, cases: Sequence[tuple[str, int]] = CIRCUIT_SWEEP, client_interval_ms: int | None = None,
                  transfer_bytes: int = 20 * wl.MIB, streams: int = 1, cc_alg: int | None = None, seed: int = 1,
                  progress: Progress | None = None, **kwargs: Any) -> CircuitSweepResult:
    """:func:`circuit` for KIST at 10, 5 and 2 ms, KISTLite at 10 and 2 ms and Vanilla."""
    runs = _Runs(progress, len(cases))
    return CircuitSweepResult(tuple(
        circuit(scheduler=s, interval_ms=iv, client_interval_ms=client_interval_ms, transfer_bytes=transfer_bytes,
                streams=streams, cc_alg=cc_alg, seed=seed, _runs=runs, **kwargs)
        for s, iv in cases))


# -- KIST's first run ----------------------------------------------------------------------------


@attrs.frozen
class FirstRunResult:
    mss_bytes: int
    initial_cwnd_segments: int
    first_run_cells: int
    next_runs_cells: tuple[int, ...]


def kist_first_run(*, mss: int = 1448, initial_cwnd: int = 10, interval_ms: int = 10, rtt_ms: float = 50.0,
                   seed: int = 1, progress: Progress | None = None) -> FirstRunResult:
    """A relay's first KIST run on an idle socket with a backlog waiting: the §6 limit is
    ``2 * cwnd * mss`` (nothing unacked, nothing queued), i.e. floor(28,960 / 543) = 53 cells for
    mss 1448 and IW10. The RTT is long enough that no ACK arrives before the second run.  The
    exit's read share is off here (``exit_read_cells=0``) so that the whole backlog is queued when
    the scheduler first runs, as on a relay fed by a busy upstream; with it, an exit's first run
    after a transfer starts has only the first read's 32 cells."""
    relay = _node("kist", interval_ms, "exit")
    client = _node("kist", interval_ms, "client")
    link = LinkConfig(rtt_ms=rtt_ms, mss=mss, initial_cwnd=initial_cwnd)
    link.validate("link")
    topo = wl.one_relay(1, 1, relay=relay, client=client, link=link, labels=["bulk"])
    topo.network.add_transfer(Transfer(circuit=topo.circuits[0], response_bytes=wl.BULK_BYTES))
    rc = _run_config(max(0.2, 4 * rtt_ms / 1e3), seed, "sendme", exit_read_cells=0, sample_interval_s=0.01)
    res = _Runs(progress, 1).run(topo.network, rc)
    cells = res.cells_per_run(topo.relays[0])
    cells = cells[cells > 0]
    if not len(cells):
        raise SimConfigError("kist-first-run: the relay never ran its scheduler (duration too short)")
    return FirstRunResult(mss_bytes=mss, initial_cwnd_segments=initial_cwnd, first_run_cells=int(cells[0]),
                          next_runs_cells=tuple(int(c) for c in cells[1:5]))


# -- EWMA: interactive vs bulk --------------------------------------------------------------------


@jsonout.shape(derived={"bulk_over_interactive_delay_ratio": lambda p: p.advantage}, nan_as_null=True)
@attrs.frozen
class EwmaPoint:
    """Time a cell spends at the relay (circuit queue + kernel) at one interval. The ``_p50``
    figures add the medians of the two parts (a true median of the sum needs the core's per-hop
    total); the ``_mean`` figures are exact."""

    interval_ms: int
    interactive_delay_ms_p50: float
    bulk_delay_ms_p50: float
    interactive_delay_ms_mean: float
    bulk_delay_ms_mean: float
    interactive_kernel_delay_ms_mean: float
    bulk_kernel_delay_ms_mean: float
    throughput_mbytes_per_s: float

    @property
    def advantage(self) -> float:
        """How many times longer a bulk cell waits than an interactive one (means)."""
        return self.bulk_delay_ms_mean / self.interactive_delay_ms_mean


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class EwmaResult:
    scheduler: str
    bulk_circuits: int
    interactive_circuits: int
    client_interval_ms: int
    duration_s: float
    points: tuple[EwmaPoint, ...]

    def point(self, interval_ms: int) -> EwmaPoint:
        return _find(self.points, interval_ms=interval_ms)


EWMA_INTERVALS_MS = (1, 2, 5, 10, 20)


def ewma(*, intervals_ms: Sequence[int] = EWMA_INTERVALS_MS, scheduler: str = "kist", bulk_circuits: int = 4,
         interactive_circuits: int = 4, client_interval_ms: int = 2, duration_s: float = 10.0,
         link: LinkConfig = WAN_LINK, flow_control: str = "vegas", seed: int = 1,
         progress: Progress | None = None) -> EwmaResult:
    """One relay, one channel to a client over `link`, carrying `bulk_circuits` backlogged bulk
    circuits and `interactive_circuits` interactive ones (a one-cell request every ~100 ms, one
    or two cells back). Per interval: the delay a cell spends at the relay (circuit queue plus
    kernel until it leaves the NIC), interactive vs bulk. EWMA (§11) lets interactive cells
    jump the application queue; what sits in the kernel it cannot reorder. The relay's
    ``KISTSchedRunInterval`` varies; the client keeps ``KISTSchedRunIntervalClient`` (2 ms, the
    default since 0.4.8.2, §5.1), as when only the relays' consensus parameter changes."""
    _positive_int("bulk_circuits", bulk_circuits, 10_000)
    _positive_int("interactive_circuits", interactive_circuits, 10_000)
    link.validate("link")
    for iv in intervals_ms:
        _node(scheduler, iv, "exit")
    _node(scheduler, client_interval_ms, "client")
    rc = _run_config(duration_s, seed, flow_control, sample_interval_s=duration_s / 20,
                     cell_delays_max=2_000_000)
    runs = _Runs(progress, len(intervals_ms))
    points = []
    warm = min(1.0, duration_s / 4)
    for iv in intervals_ms:
        net, relay, client = _shared_channel(scheduler, iv, client_interval_ms, bulk_circuits,
                                             interactive_circuits, duration_s, warm, link, seed)
        res = runs.run(net, rc)
        points.append(EwmaPoint(
            interval_ms=iv,
            interactive_delay_ms_p50=_relay_delay_ms(res, "interactive", relay, 50),
            bulk_delay_ms_p50=_relay_delay_ms(res, "bulk", relay, 50),
            interactive_delay_ms_mean=_relay_delay_ms(res, "interactive", relay, None),
            bulk_delay_ms_mean=_relay_delay_ms(res, "bulk", relay, None),
            interactive_kernel_delay_ms_mean=_hop_delay_ms(res, "kernel", "interactive", relay, None),
            bulk_kernel_delay_ms_mean=_hop_delay_ms(res, "kernel", "bulk", relay, None),
            throughput_mbytes_per_s=_steady_throughput(res, res.chan_between(relay, client), warm) / MB,
        ))
    return EwmaResult(scheduler=scheduler, bulk_circuits=bulk_circuits, interactive_circuits=interactive_circuits,
                      client_interval_ms=client_interval_ms, duration_s=duration_s, points=tuple(points))


def _shared_channel(scheduler: str, interval_ms: int, client_interval_ms: int, bulk: int, interactive: int,
                    duration_s: float, start_s: float, link: LinkConfig, seed: int) -> tuple[Network, int, int]:
    """One relay and one client joined by one channel: bulk circuits backlogged from t=0,
    interactive circuits exchanging from `start_s` (once the bulk queues have formed)."""
    kinds = ["bulk"] * bulk + ["interactive"] * interactive
    topo = wl.one_relay(1, len(kinds), relay=_node(scheduler, interval_ms, "exit"),
                        client=_node(scheduler, client_interval_ms, "client"), link=link, labels=kinds)
    workload = wl.Workload(
        transfers=tuple(t for i in range(bulk) for t in wl.bulk_transfers(i, 0.0, duration_s)),
        interactive=tuple(wl.InteractiveSpec(bulk + j, start_s + 0.1 * j / interactive, duration_s)
                          for j in range(interactive)),
        kinds=tuple(kinds))
    wl.add_workload(topo.network, workload, topo.circuits, seed)
    return topo.network, topo.relays[0], topo.clients[0]


# -- kernel queue vs application queue ------------------------------------------------------------


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class QueuePlacement:
    scheduler: str
    interval_ms: int
    app_delay_ms_p50: float
    kernel_delay_ms_p50: float
    app_delay_ms_mean: float
    kernel_delay_ms_mean: float
    kernel_delay_share: float
    """Share of a cell's time at the relay spent in the kernel (means)."""
    peak_app_bytes: int
    peak_kernel_bytes: int
    mean_kernel_bytes: float
    mean_app_bytes: float
    throughput_mbytes_per_s: float


@jsonout.shape(nan_as_null=True)
@attrs.frozen
class KernelQueueResult:
    channels: int
    circuits: int
    duration_s: float
    points: tuple[QueuePlacement, ...]

    def point(self, scheduler: str) -> QueuePlacement:
        return _find(self.points, scheduler=scheduler)


def kernel_queue(*, schedulers: Sequence[str] = ("kist", "vanilla"), interval_ms: int = 10, channels: int = 4,
                 circuits: int = 16, duration_s: float = 5.0, link: LinkConfig = WAN_LINK,
                 flow_control: str = "vegas", seed: int = 1, progress: Progress | None = None) -> KernelQueueResult:
    """A loaded relay: `circuits` backlogged bulk circuits over `channels` channels across `link`.
    Where do cells wait - in circuit queues (application) or in kernel socket buffers? KIST's
    limit (§6) caps what each socket holds; Vanilla tops the outbuf up whenever it drains
    below 16 KiB (§9), so the kernel send buffer fills."""
    _positive_int("channels", channels, 10_000)
    _positive_int("circuits", circuits, 100_000)
    link.validate("link")
    rc = _run_config(duration_s, seed, flow_control, sample_interval_s=duration_s / 50,
                     cell_delays_max=2_000_000)
    runs = _Runs(progress, len(schedulers))
    warm = duration_s / 5
    points = []
    for sched in schedulers:
        topo = wl.one_relay(channels, circuits, relay=_node(sched, interval_ms, "exit"),
                            client=_node(sched, interval_ms, "client"), link=link, labels=["bulk"] * circuits)
        for c in topo.circuits:
            topo.network.add_transfer(Transfer(circuit=c, response_bytes=_bulk_bytes(duration_s, 100e6)))
        res = runs.run(topo.network, rc)
        r = topo.relays[0]
        counts = res.node_counts(r)
        steady = res.sample_times_s >= warm
        thr = sum(_steady_throughput(res, res.chan_between(r, c), warm) for c in topo.clients)
        app_mean = _hop_delay_ms(res, "app", "bulk", r, None)
        kernel_mean = _hop_delay_ms(res, "kernel", "bulk", r, None)
        points.append(QueuePlacement(
            scheduler=sched, interval_ms=interval_ms,
            app_delay_ms_p50=_hop_delay_ms(res, "app", "bulk", r, 50),
            kernel_delay_ms_p50=_hop_delay_ms(res, "kernel", "bulk", r, 50),
            app_delay_ms_mean=app_mean, kernel_delay_ms_mean=kernel_mean,
            kernel_delay_share=kernel_mean / (app_mean + kernel_mean),
            peak_app_bytes=counts["peak_app_bytes"], peak_kernel_bytes=counts["peak_kernel_bytes"],
            mean_kernel_bytes=float(res.node_series["kernel_bytes"][steady, r].mean()),
            mean_app_bytes=float(res.node_series["app_bytes"][steady, r].mean()),
            throughput_mbytes_per_s=thr / MB,
        ))
    return KernelQueueResult(channels=channels, circuits=circuits, duration_s=duration_s, points=tuple(points))


# -- the CLI's entry point ------------------------------------------------------------------------


def check_experiment_args(name: str, *, scheduler: str | None = None, interval_ms: int | None = None,
                          client_interval_ms: int | None = None, seed: int = 1,
                          circuits: int | None = None, streams: int | None = None,
                          cc_alg: int | None = None) -> None:
    """Validate the CLI's common options for experiment `name` (SimConfigError on the first
    problem); nothing runs."""
    if name not in EXPERIMENTS:
        raise SimConfigError(f"sim experiment: unknown experiment {name!r} (one of {', '.join(EXPERIMENTS)})")
    if scheduler is not None and scheduler not in SCHEDULERS:
        raise SimConfigError(f"sim experiment: unknown scheduler {scheduler!r} (one of {', '.join(SCHEDULERS)})")
    if name == "kist-first-run" and scheduler not in (None, "kist"):
        raise SimConfigError("sim experiment kist-first-run: only the kist scheduler has a first-run limit")
    if interval_ms is not None:
        NodeConfig(kist_interval_ms=interval_ms).validate("sim experiment --interval-ms")
    if client_interval_ms is not None:
        NodeConfig(role="client", kist_interval_ms=client_interval_ms).validate("sim experiment --client-interval-ms")
    if circuits is not None:
        if name in ("circuit", "kist-first-run"):
            raise SimConfigError(f"sim experiment {name}: --circuits does not apply (it uses one circuit)")
        _positive_int("circuits", circuits, 10_000)
    if streams is not None:
        if name != "circuit":
            raise SimConfigError(f"sim experiment {name}: --streams applies only to circuit")
        PathScenario(streams=streams).validate()
    if cc_alg is not None:
        if name not in ("circuit", "ceiling-path"):
            raise SimConfigError(f"sim experiment {name}: --cc-alg applies only to circuit and ceiling-path")
        PathScenario(cc_alg=cc_alg).validate()
    RunConfig(seed=seed).validate("sim experiment --seed")


def run_experiment(name: str, *, scheduler: str | None = None, interval_ms: int | None = None,
                   client_interval_ms: int | None = None, seed: int = 1, circuits: int | None = None,
                   streams: int | None = None, cc_alg: int | None = None,
                   progress: Progress | None = None) -> Any:
    """Run experiment `name` with the CLI's options; unset options keep each experiment's
    defaults (circuit without --scheduler/--interval-ms: the whole sweep; ewma without
    --interval-ms: the whole curve; kernel-queue without --scheduler: KIST against Vanilla)."""
    check_experiment_args(name, scheduler=scheduler, interval_ms=interval_ms,
                          client_interval_ms=client_interval_ms, seed=seed, circuits=circuits,
                          streams=streams, cc_alg=cc_alg)
    common: dict[str, Any] = {"seed": seed, "progress": progress}
    if name == "ceiling":
        return ceiling(scheduler=scheduler or "kistlite", interval_ms=interval_ms or 10,
                       circuits=circuits or 8, **common)
    if name == "ceiling-path":
        return ceiling_path(scheduler=scheduler or "kist", interval_ms=interval_ms or 10,
                            client_interval_ms=client_interval_ms, circuits=circuits or 8, cc_alg=cc_alg, **common)
    if name == "circuit":
        path = {"client_interval_ms": client_interval_ms, "streams": streams or 1, "cc_alg": cc_alg}
        if scheduler is None and interval_ms is None:
            return circuit_sweep(**path, **common)
        return circuit(scheduler=scheduler or "kist", interval_ms=interval_ms or 10, **path, **common)
    if name == "kist-first-run":
        return kist_first_run(interval_ms=interval_ms or 10, **common)
    if name == "ewma":
        return ewma(intervals_ms=(interval_ms,) if interval_ms else EWMA_INTERVALS_MS,
                    scheduler=scheduler or "kist", bulk_circuits=circuits or 4,
                    client_interval_ms=client_interval_ms or 2, **common)
    return kernel_queue(schedulers=(scheduler,) if scheduler else ("kist", "vanilla"),
                        interval_ms=interval_ms or 10, circuits=circuits or 16, **common)
