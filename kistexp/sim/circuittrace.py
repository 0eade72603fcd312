"""The circuit trace: what an observer at each circuit's guard and at its exit sees (opt-in).

``RunConfig(circuit_trace=CircuitTraceConfig(...))`` asks for it; ``Simulation.circuit_trace(t0_s, t1_s)``
returns a :class:`CircuitTrace` of ``[t0_s, t1_s)``.  Without it nothing is recorded: the run uses the
lean kernel (``layout.is_lean``), whose compiled code has no trace bookkeeping, and its results are the
same bit for bit (the recorders only read the model's state; ``ctrace.py``).

What is recorded, per traced circuit (client first, exit last on its path):

* cells per window (``window_ms``, default 100 ms) **entering the guard** (from the client, upstream;
  from the middle, downstream), **leaving the exit** (toward the middle, downstream: departure from its
  NIC; handed to the server, upstream: arrival at the exit) and **reaching the client** (downstream).
  Cells are timed on the wire (``ctrace.py``), SENDMEs included;
* the **gaps between consecutive cells of a circuit leaving its exit** (downstream), as histograms of
  the delay histograms' log-spaced bins (40 per decade from 1 us; bin 0 is [0, 1 us): cells of one TCP
  segment leave together), per exit and per block (``block_s``, default 1 s);
* the **exit's RTT samples** of the circuit: the time from packaging a cell at the exit to the
  circuit SENDME acknowledging it arriving there, per circuit and block (count, sum, sum of squares
  and minimum, in ms): on Vegas circuits the samples congestion control takes
  (``flowcontrol.vegas_process_sendme``), on fixed SENDME windows the same measurement on every
  ``circ_increment``-th cell, the one the client's circuit SENDME answers (tor takes none there: it is
  what an exit, or a server timing its own cells, can measure);
* the **time to first byte** of each transfer whose first byte arrived in the window (client side).

``build_arrays`` makes the state's trace arrays (``state.build_state``); ``extract`` reads a window.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from kistexp.errors import SimConfigError
from kistexp.sim import layout as L
from kistexp.sim.config import CircuitTraceConfig, RunConfig
from kistexp.sim.network import Network

#: the series of ``S.ctcnt`` by name
SERIES = {"guard_in_up": L.CT_GUARD_IN_UP, "guard_in_down": L.CT_GUARD_IN_DOWN,
          "exit_out_up": L.CT_EXIT_OUT_UP, "exit_out_down": L.CT_EXIT_OUT_DOWN,
          "client_in_down": L.CT_CLIENT_IN_DOWN}


@attrs.frozen
class TraceLayout:
    """Sizes of a run's trace: the circuits traced, their exits' gap-histogram slots, windows, blocks."""

    circuits: np.ndarray  # [traced] circuit ids
    exits: np.ndarray  # [slot] exit node ids
    slot: np.ndarray  # [traced] exit slot
    window_ns: int
    block_ns: int
    n_windows: int
    n_blocks: int
    ts_cap: int  # circuit SENDMEs a direction can have outstanding (circwindow 1000 at most / increment)
    start_ns: int  # the first instant a window may start at (CircuitTraceConfig.start_s)

    @property
    def record_from_ns(self) -> int:
        """Cells sent from then on are recorded: a second before ``start_ns``, for those in flight."""
        return max(0, self.start_ns - 1_000_000_000)

    @property
    def nbytes(self) -> int:
        n = len(self.circuits)
        return (4 * L.CT_SERIES * n * self.n_windows + 8 * self.n_blocks * len(self.exits) * L.HIST_BINS
                + 8 * L.CT_R_FIELDS * n * self.n_blocks + 8 * (L.CT_C_FIELDS + self.ts_cap) * n)


def plan(net: Network, rc: RunConfig) -> TraceLayout | None:
    """The trace's layout for a run, or None when the run asks for none (refusing unknown circuits)."""
    cfg: CircuitTraceConfig | None = rc.circuit_trace
    if cfg is None:
        return None
    n_circ = len(net.circuits)
    if n_circ >= 1 << 23:
        raise SimConfigError(f"run.circuit_trace: {n_circ} circuits; at most {(1 << 23) - 1} can be traced")
    bad = [c for c in cfg.circuits if c >= n_circ]
    if bad:
        raise SimConfigError(f"run.circuit_trace.circuits: circuit {bad[0]} does not exist (the network has "
                             f"{n_circ} circuits)")
    circuits = np.array(cfg.circuits if cfg.circuits else range(n_circ), np.int64)
    exit_nodes = np.array([net.circuits[int(c)][0][-1] for c in circuits], np.int64)
    exits, slot = np.unique(exit_nodes, return_inverse=True)
    window_ns = int(round(cfg.window_ms * 1e6))
    block_ns = int(round(cfg.block_s * 1e9))
    end = int(round(rc.duration_s * 1e9))
    return TraceLayout(circuits, exits.astype(np.int64), slot.astype(np.int64), window_ns, block_ns,
                       -(-end // window_ns), -(-end // block_ns), 1000 // rc.flow_control.circ_increment + 2,
                       int(round(cfg.start_s * 1e9)))


def build_arrays(net: Network, lay: TraceLayout | None, n_cq: int) -> dict[str, np.ndarray]:
    """The state's trace arrays (``layout.FIELDS``: ctq, ctcnt, ctcirc, ctgap, ctrtt, ctts, ctdt, ctnspb);
    empty
    ones when ``lay`` is None.  Queues are numbered as ``state.build_state`` numbers them: circuit
    by circuit, its forward queues hop by hop, then its backward ones."""
    if lay is None:
        return {"ctq": np.zeros(0, np.int64), "ctcnt": np.zeros((0, 0, 0), np.int32),
                "ctcirc": np.zeros((2, 0), np.int64), "ctgap": np.zeros((0, 0, 0), np.int64),
                "ctrtt": np.zeros((L.CT_R_FIELDS, 0, 0), np.float64), "ctdt": np.array([1, 1, 0, 0, 0, 0, 0], np.int64),
                "ctnspb": np.zeros(0, np.float64),
                "ctts": np.zeros((0, 0), np.int64)}
    ctq = np.zeros(max(n_cq, 1), np.int64)
    index = {int(c): i for i, c in enumerate(lay.circuits)}
    base = 0
    for j, (path, _) in enumerate(net.circuits):
        h = len(path) - 1
        i = index.get(j)
        if i is not None:
            tag = (i + 1) << L.CT_IDX_SHIFT
            bits = np.zeros(2 * h, np.int64)
            bits[0] |= 1 << L.CT_GUARD_IN_UP  # client -> guard
            bits[h - 1] |= 1 << L.CT_EXIT_OUT_UP  # middle -> exit (the guard's own on a one-hop path)
            bits[h + h - 1] |= (1 << L.CT_EXIT_OUT_DOWN) | L.CT_GAP  # exit -> middle
            bits[h] |= 1 << L.CT_CLIENT_IN_DOWN  # guard -> client
            if h >= 2:
                bits[h + 1] |= 1 << L.CT_GUARD_IN_DOWN  # middle -> guard
            ctq[base:base + 2 * h] = tag | bits
        base += 2 * h
    n = len(lay.circuits)
    ctcirc = np.zeros((L.CT_C_FIELDS, n), np.int64)
    ctcirc[L.CT_C_SLOT] = lay.slot
    ctcirc[L.CT_C_LAST] = -1
    ctrtt = np.zeros((L.CT_R_FIELDS, n, lay.n_blocks), np.float64)
    ctrtt[L.CT_R_MIN_MS] = np.inf
    return {"ctq": ctq, "ctcnt": np.zeros((L.CT_SERIES, lay.n_windows, n), np.int32), "ctcirc": ctcirc,
            "ctgap": np.zeros((lay.n_blocks, len(lay.exits), L.HIST_BINS), np.int64), "ctrtt": ctrtt,
            "ctdt": np.array([lay.window_ns, lay.block_ns, 0, lay.record_from_ns, 0, 0, 0], np.int64),
            "ctnspb": np.array([1e9 / n.nic_rate_bytes_per_s if n.nic_rate_bytes_per_s else 0.0
                                for n in net.nodes], np.float64),
            "ctts": np.zeros((n, lay.ts_cap), np.int64)}


def gap_bin_edges_s() -> np.ndarray:
    """Edges of the gap histograms' bins in seconds: bin b is [e[b], e[b + 1]); the last is open."""
    k = np.arange(L.HIST_BINS - 1)
    lower = np.concatenate(([0.0], 1e-6 * 10.0 ** (k / L.HIST_PER_DECADE)))
    return np.append(lower, np.inf)


@attrs.frozen(eq=False)
class CircuitTrace:
    """What observers at the traced circuits' guards and exits saw in ``[t0_s, t1_s)`` (frozen copies).

    Per traced circuit ``i`` (``circuits[i]`` its id; path client first, exit last):
    ``guard_in[i, d, w]`` cells entering its guard in window ``w`` (d 0 upstream from the client, 1
    downstream from the middle), ``exit_out[i, d, w]`` cells leaving its exit (0 upstream to the
    server, 1 downstream toward the middle), ``client_in[i, w]`` cells reaching its client;
    ``rtt_count / rtt_sum_ms / rtt_sumsq_ms / rtt_min_ms [i, block]`` the exit's RTT samples
    (min is inf in a block without one).  ``gap_hist[slot, bin]``: gaps between
    consecutive cells of one circuit leaving exit ``exit_nodes[slot]`` (bins ``gap_bin_edges_s``),
    each counted in the block its later cell left in; ``exit_scheduler / exit_interval_ms /
    exit_tick_ms [slot]`` what that exit ran at the end of the window.  ``transfer_*``: transfers of
    traced circuits whose first byte arrived in the window (``transfer_trace_index`` their circuit's
    ``i``).
    """

    t0_s: float
    t1_s: float
    window_s: float
    block_s: float
    circuits: np.ndarray
    labels: tuple[str, ...]
    paths: tuple[tuple[int, ...], ...]
    node_names: tuple[str, ...]
    guard_in: np.ndarray
    exit_out: np.ndarray
    client_in: np.ndarray
    rtt_count: np.ndarray
    rtt_sum_ms: np.ndarray
    rtt_sumsq_ms: np.ndarray
    rtt_min_ms: np.ndarray
    exit_nodes: np.ndarray
    circuit_exit_slot: np.ndarray
    gap_hist: np.ndarray
    gap_bin_edges_s: np.ndarray
    exit_scheduler: tuple[str, ...]
    exit_interval_ms: np.ndarray
    exit_tick_ms: np.ndarray
    transfer_trace_index: np.ndarray
    transfer_start_s: np.ndarray
    transfer_ttfb_s: np.ndarray

    @property
    def duration_s(self) -> float:
        return self.t1_s - self.t0_s

    @property
    def n_windows(self) -> int:
        return int(self.guard_in.shape[2])

    @property
    def client_nodes(self) -> np.ndarray:
        return np.array([p[0] for p in self.paths], np.int64)

    @property
    def guard_nodes(self) -> np.ndarray:
        return np.array([p[1] for p in self.paths], np.int64)

    @property
    def exit_node_of(self) -> np.ndarray:
        return np.array([p[-1] for p in self.paths], np.int64)

    def index(self, circuit: int) -> int:
        """The trace index of circuit id ``circuit``."""
        hit = np.nonzero(self.circuits == circuit)[0]
        if not len(hit):
            raise KeyError(f"circuit {circuit} is not traced")
        return int(hit[0])

    def series(self, name: str) -> np.ndarray:
        """One series by name ([circuit, window]): guard_in_up, guard_in_down, exit_out_up,
        exit_out_down, client_in_down."""
        if name == "client_in_down":
            return self.client_in
        where, _, d = name.rpartition("_")
        arr = {"guard_in": self.guard_in, "exit_out": self.exit_out}.get(where)
        if arr is None or d not in ("up", "down"):
            raise KeyError(f"no series {name!r} (one of {', '.join(SERIES)})")
        return arr[:, 0 if d == "up" else 1]

    def rebinned(self, name: str, seconds: float) -> np.ndarray:
        """Series ``name`` summed over windows of ``seconds`` (a whole number of trace windows;
        a partial last one is dropped): [circuit, new window]."""
        k = seconds / self.window_s
        if k < 1 or abs(k - round(k)) > 1e-6:
            raise SimConfigError(f"rebinned: {seconds!r} s is not a whole number of {self.window_s:g}-s windows")
        k = int(round(k))
        s = self.series(name)
        m = s.shape[1] // k
        return s[:, :m * k].reshape(s.shape[0], m, k).sum(axis=2)


def extract(S, lay: TraceLayout, net: Network, meta, t0_ns: int, t1_ns: int) -> CircuitTrace:
    """The :class:`CircuitTrace` of ``[t0_ns, t1_ns)`` from the run's state (both bounds multiples of
    the block, which is a whole number of windows: checked by the caller)."""
    w0, w1 = t0_ns // lay.window_ns, t1_ns // lay.window_ns
    b0, b1 = t0_ns // lay.block_ns, t1_ns // lay.block_ns
    cnt = S.ctcnt[:, w0:w1, :].transpose(0, 2, 1)  # [series, circuit, window]
    idx = {int(c): i for i, c in enumerate(lay.circuits)}
    circ = meta["t_circ"]
    ttfb = S.ti[L.TI_TTFB]
    sel = (ttfb >= t0_ns) & (ttfb < t1_ns)
    sel &= np.isin(circ, lay.circuits)
    start = S.ti[L.TI_START][sel]
    kinds = {L.SCHED_KIST: "kist", L.SCHED_KISTLITE: "kistlite", L.SCHED_VANILLA: "vanilla"}
    rtt = S.ctrtt[:, :, b0:b1]
    return CircuitTrace(
        t0_s=t0_ns / 1e9, t1_s=t1_ns / 1e9, window_s=lay.window_ns / 1e9, block_s=lay.block_ns / 1e9,
        circuits=lay.circuits.copy(), labels=tuple(net.circuits[int(c)][1] for c in lay.circuits),
        paths=tuple(net.circuits[int(c)][0] for c in lay.circuits), node_names=tuple(net.node_names),
        guard_in=np.stack([cnt[L.CT_GUARD_IN_UP], cnt[L.CT_GUARD_IN_DOWN]], axis=1),
        exit_out=np.stack([cnt[L.CT_EXIT_OUT_UP], cnt[L.CT_EXIT_OUT_DOWN]], axis=1),
        client_in=cnt[L.CT_CLIENT_IN_DOWN].copy(),
        rtt_count=rtt[L.CT_R_N].astype(np.int64), rtt_sum_ms=rtt[L.CT_R_SUM_MS].copy(),
        rtt_sumsq_ms=rtt[L.CT_R_SUMSQ_MS].copy(), rtt_min_ms=rtt[L.CT_R_MIN_MS].copy(),
        exit_nodes=lay.exits.copy(), circuit_exit_slot=lay.slot.copy(),
        gap_hist=S.ctgap[b0:b1].sum(axis=0), gap_bin_edges_s=gap_bin_edges_s(),
        exit_scheduler=tuple(kinds[int(S.ni[L.NI_SCHED, n])] for n in lay.exits),
        exit_interval_ms=S.ni[L.NI_INTERVAL_MS, lay.exits].copy(),
        exit_tick_ms=S.ni[L.NI_TICK_NS, lay.exits] / 1e6,
        transfer_trace_index=np.array([idx[int(c)] for c in circ[sel]], np.int64),
        transfer_start_s=start / 1e9, transfer_ttfb_s=(ttfb[sel] - start) / 1e9,
    )


def check_bounds(lay: TraceLayout | None, t0_ns: int, t1_ns: int) -> None:
    """Refuse a trace window that is not made of whole blocks (or a run without a trace)."""
    if lay is None:
        raise SimConfigError("circuit_trace: the run records no circuit trace (RunConfig.circuit_trace=None)")
    for what, t in (("t0_s", t0_ns), ("t1_s", t1_ns)):
        if t % lay.block_ns:
            raise SimConfigError(f"circuit_trace {what}={t / 1e9!r}: not a multiple of the trace's block_s="
                                 f"{lay.block_ns / 1e9:g}")
    if not math.isfinite(t0_ns) or t0_ns >= t1_ns:
        raise SimConfigError(f"circuit_trace [{t0_ns / 1e9!r}, {t1_ns / 1e9!r}): needs t0_s < t1_s")
    if t0_ns < lay.start_ns:
        raise SimConfigError(f"circuit_trace t0_s={t0_ns / 1e9!r}: the trace starts at start_s="
                             f"{lay.start_ns / 1e9:g} (CircuitTraceConfig)")
