"""What a run measured: raw counters and sampled series (the cost model and experiments build on them).

Units are in the names: ``_s``, ``_ms``, ``_bytes``, ``_cells``.  Per-cell delays are kept as
log-spaced histograms per circuit label (40 bins per decade from 1 us; percentiles are
interpolated within a bin, about 3 % resolution), as per-circuit sums, and optionally raw.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from kistexp import jsonout
from kistexp.sim import layout as L

#: gaps between busy runs longer than this are idle spells, not a period (the rule of the real
#: side, ``localnet.schedlog.MAX_BUSY_GAP_MS``)
MAX_BUSY_GAP_MS = 250.0

NODE_COUNTERS = {
    # name in results / cost model -> node field
    "scheduler_runs": L.NI_RUNS,
    "socket_info_syscalls": L.NI_SYSCALLS,
    "kernel_writes": L.NI_WRITES,
    "cells_sent": L.NI_CELLS_SENT,
    "cells_received": L.NI_CELLS_RECV,
    "crypto_layers": L.NI_CRYPTO,
    "digests": L.NI_DIGESTS,
    "bytes_written": L.NI_BYTES_WRITTEN,
    "peak_app_bytes": L.NI_PEAK_APP,
    "peak_kernel_bytes": L.NI_PEAK_KERN,
    "peak_queued_bytes": L.NI_PEAK_TOTAL,
    # ACKs the node's sockets sent when the delayed-ACK timer fired (Linux's TcpExt DelayedACKs)
    "delayed_acks": L.NI_DELACKS,
    # read callbacks on OR connections: at most one bucket share each (engine.py, EV_ARRIVAL)
    "read_callbacks": L.NI_READS,
    # checks (after a DATA cell, after a write) that held an owed stream SENDME behind a full edge outbuf
    "stream_sendmes_held": L.NI_SENDMES_HELD,
}
NODE_SERIES = {
    "scheduler_runs": L.NS_RUNS,
    "socket_info_syscalls": L.NS_SYSCALLS,
    "cells_sent": L.NS_CELLS_SENT,
    "kernel_writes": L.NS_WRITES,
    "app_bytes": L.NS_APP_BYTES,
    "kernel_bytes": L.NS_KERN_BYTES,
}
DELAY_KINDS = {"app": 0, "kernel": 1}


def _bin_edges_ns() -> np.ndarray:
    """Lower edge of each histogram bin in ns (bin 0 = [0, 1 us))."""
    k = np.arange(L.HIST_BINS - 1)
    return np.concatenate(([0.0], 1000.0 * 10.0 ** (k / L.HIST_PER_DECADE)))


def hist_percentile_ns(counts: np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of a delay histogram, interpolated inside the bin."""
    total = int(counts.sum())
    if total == 0:
        return math.nan
    edges = _bin_edges_ns()
    upper = np.append(edges[1:], edges[-1] * 10 ** (1 / L.HIST_PER_DECADE))
    target = q / 100.0 * total
    cum = np.cumsum(counts)
    b = int(np.searchsorted(cum, max(target, 1e-9)))
    b = min(b, len(counts) - 1)
    before = cum[b - 1] if b > 0 else 0
    inside = (target - before) / counts[b] if counts[b] else 0.0
    lo, hi = edges[b], upper[b]
    if b == 0:
        return float(hi * inside)
    return float(lo * (hi / lo) ** inside)


def label_hist(delay_hist: np.ndarray, labels: tuple[str, ...], kind: str, label: str | None) -> np.ndarray:
    """One delay kind's histogram ([kind, label, bin] counts) for a label, or summed over labels."""
    h = delay_hist[DELAY_KINDS[kind]]
    if label is None:
        return h.sum(axis=0)
    return h[labels.index(label)] if label in labels else np.zeros(h.shape[1], np.int64)


@attrs.frozen(eq=False)
class SimResult:
    duration_s: float
    seed: int
    wall_s: float
    node_names: tuple[str, ...]
    node_roles: tuple[str, ...]
    node_schedulers: tuple[str, ...]
    node_counters: dict[str, np.ndarray]        # name -> [node]
    sample_times_s: np.ndarray                  # [sample]
    node_series: dict[str, np.ndarray]          # name -> [sample, node], cumulative
    chan_src: np.ndarray                        # [chan] node sending on this socket
    chan_dst: np.ndarray
    chan_bytes_sent: np.ndarray                 # [sample, chan], cumulative bytes onto the wire
    chan_final_cwnd: np.ndarray                 # [chan] segments
    chan_losses: np.ndarray                     # [chan] flights with a lost segment
    circuit_labels: tuple[str, ...]             # [circuit]
    labels: tuple[str, ...]                     # label names, index = histogram row
    delay_hist: np.ndarray                      # [kind(app, kernel), label, bin] counts of per-hop samples
    circuit_delay_sum_ns: np.ndarray            # [kind, circuit]
    circuit_delay_count: np.ndarray             # [kind, circuit]
    circuit_max_inflight_cells: np.ndarray      # [circuit, dir]: max DATA cells packaged, not yet SENDME-acked
    circuit_final_cwnd_cells: np.ndarray        # [circuit, dir]: Vegas cwnd at the end
    circuit_final_bdp_cells: np.ndarray         # [circuit, dir]: Vegas' BDP estimate at the end (§13.2 step 3)
    transfer_circuit: np.ndarray
    transfer_start_s: np.ndarray
    transfer_request_bytes: np.ndarray
    transfer_response_bytes: np.ndarray
    transfer_ttfb_s: np.ndarray                 # time to first response byte, nan if none arrived
    transfer_ttlb_s: np.ndarray                 # time to last response byte, nan if unfinished
    run_node: np.ndarray                        # scheduler-run log (first run_log_max runs)
    run_time_s: np.ndarray
    run_cells: np.ndarray
    run_chan_cells: np.ndarray                  # per logged run: cells onto RunConfig.run_log_chan
    raw_delays: np.ndarray                      # [5, n]: kind, circuit, delay ns, time ns, sending node
    trace: np.ndarray                           # [4, n]: time ns, outbuf, kernel unsent, unacked bytes
    cells_scheduled: int
    events: int
    queue_cap_exceeded: int

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_state(cls, S, meta, net, rc, wall_s: float) -> SimResult:
        ni = S.ni
        ns = int(meta["n_samples"])
        n_tr = len(meta["t_circ"])
        start = meta["t_start"]

        def rel(field):
            # in place: on a large network each temporary is as large as the transfers' table
            v = S.ti[field].astype(np.float64)
            v /= 1e9
            v[S.ti[field] < 0] = np.nan
            if n_tr:
                v -= start
            return v

        raw_n = int(S.g[L.G_RAW_N])
        raw = np.zeros((5, raw_n), np.int64)
        raw[:4] = S.raw[:, :raw_n]
        if raw_n:
            cq = S.raw[1, :raw_n]
            raw[1] = S.qi[L.QI_CIRC, cq]
            raw[4] = S.ci[L.CI_NODE, S.qi[L.QI_CHAN, cq]]
        rl = int(S.g[L.G_RUNLOG_N])
        return cls(
            duration_s=rc.duration_s, seed=rc.seed, wall_s=wall_s,
            node_names=tuple(net.node_names), node_roles=tuple(n.role for n in net.nodes),
            node_schedulers=tuple(n.scheduler for n in net.nodes),
            node_counters={k: ni[f].copy() for k, f in NODE_COUNTERS.items()},
            sample_times_s=np.arange(ns) * rc.sample_interval_s,
            node_series={k: S.ser_node[f].copy() for k, f in NODE_SERIES.items()},
            chan_src=meta["chan_nodes"][0].copy(), chan_dst=meta["chan_nodes"][1].copy(),
            chan_bytes_sent=S.ser_chan.copy(), chan_final_cwnd=S.cf[L.CF_CWND].copy(),
            chan_losses=S.ci[L.CI_LOSSES].copy(),
            circuit_labels=tuple(lbl for _, lbl in net.circuits), labels=tuple(meta["labels"]),
            delay_hist=S.hist.copy(),
            circuit_delay_sum_ns=S.circ_sum[[L.CS_APP_NS, L.CS_KERN_NS]].copy(),
            circuit_delay_count=S.circ_sum[[L.CS_APP_N, L.CS_KERN_N]].copy(),
            circuit_max_inflight_cells=S.di[L.DI_MAX_INFLIGHT].reshape(-1, 2).copy(),
            circuit_final_cwnd_cells=S.di[L.DI_CWND].reshape(-1, 2).copy(),
            circuit_final_bdp_cells=S.df[L.DF_BDP].reshape(-1, 2).copy(),
            transfer_circuit=meta["t_circ"], transfer_start_s=start,
            transfer_request_bytes=meta["t_req"], transfer_response_bytes=meta["t_resp"],
            transfer_ttfb_s=rel(L.TI_TTFB), transfer_ttlb_s=rel(L.TI_TTLB),
            run_node=S.runlog[0, :rl].copy(), run_time_s=S.runlog[1, :rl] / 1e9,
            run_cells=S.runlog[2, :rl].copy(), run_chan_cells=S.runlog[3, :rl].copy(), raw_delays=raw,
            trace=S.trace[:, :int(S.g[L.G_TRACE_N])].copy(),
            cells_scheduled=int(S.g[L.G_CELLS_SCHEDULED]), events=int(S.g[L.G_EVENTS]),
            queue_cap_exceeded=int(S.g[L.G_QCAP_EXCEEDED]),
        )

    # -- helpers ------------------------------------------------------------------------------
    def node_index(self, node: int | str) -> int:
        return self.node_names.index(node) if isinstance(node, str) else int(node)

    def node_counts(self, node: int | str) -> dict[str, int]:
        """Event counts of one node (the cost model's inputs)."""
        i = self.node_index(node)
        return {k: int(v[i]) for k, v in self.node_counters.items()}

    def delay_hist_for(self, kind: str = "app", label: str | None = None) -> np.ndarray:
        return label_hist(self.delay_hist, self.labels, kind, label)

    def delay_percentile_ms(self, kind: str = "app", q: float = 50.0, label: str | None = None) -> float:
        """Percentile of per-hop cell delays: ``kind`` "app" (circuit queue) or "kernel" (socket)."""
        return hist_percentile_ns(self.delay_hist_for(kind, label), q) / 1e6

    def delay_mean_ms(self, kind: str = "app", label: str | None = None) -> float:
        k = DELAY_KINDS[kind]
        sel = np.ones(len(self.circuit_labels), bool) if label is None else \
            np.array([lbl == label for lbl in self.circuit_labels], bool)
        n = self.circuit_delay_count[k][sel].sum()
        return float(self.circuit_delay_sum_ns[k][sel].sum() / n / 1e6) if n else math.nan

    def channel_throughput_bytes_per_s(self, chan: int) -> np.ndarray:
        """Bytes per second put on the wire by directed channel ``chan``, per sample interval."""
        b = self.chan_bytes_sent[:, chan]
        dt = np.diff(self.sample_times_s)
        return np.diff(b) / dt if len(dt) else np.zeros(0)

    def chan_between(self, src: int, dst: int) -> int:
        idx = np.nonzero((self.chan_src == src) & (self.chan_dst == dst))[0]
        if not len(idx):
            raise KeyError(f"no channel from node {src} to node {dst}")
        return int(idx[0])

    def node_rate_per_s(self, series: str, node: int | str) -> np.ndarray:
        """Per-interval rate of a cumulative node series (e.g. scheduler runs per second)."""
        v = self.node_series[series][:, self.node_index(node)]
        return np.diff(v) / np.diff(self.sample_times_s)

    def run_periods_ms(self, node: int | str, busy_only: bool = True, on_logged_chan: bool = False) -> np.ndarray:
        """Gaps between consecutive logged scheduler runs of a node (runs that moved cells).

        ``on_logged_chan``: as the fidelity harness measures real tor (``localnet.schedlog``), the
        gaps between consecutive runs of the node that both moved cells onto the run's logged
        channel (``RunConfig.run_log_chan``, which must be one of the node's), a run that moved
        none breaking the chain, and gaps longer than 250 ms (idle spells) left out."""
        i = self.node_index(node)
        sel = self.run_node == i
        if not on_logged_chan:
            if busy_only:
                sel &= self.run_cells > 0
            return np.diff(self.run_time_s[sel]) * 1e3
        t = self.run_time_s[sel] * 1e3
        busy = self.run_chan_cells[sel] > 0
        both = busy[1:] & busy[:-1]
        gaps = np.diff(t)[both]
        return gaps[gaps <= MAX_BUSY_GAP_MS]

    def cells_per_run(self, node: int | str, on_logged_chan: bool = False) -> np.ndarray:
        """Cells each logged run of the node moved; ``on_logged_chan``: those it moved onto the
        logged channel (``RunConfig.run_log_chan``), as the harness counts real tor's busiest one."""
        i = self.node_index(node)
        return (self.run_chan_cells if on_logged_chan else self.run_cells)[self.run_node == i]


def _percentile(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def _finished(r: SimResult) -> np.ndarray:
    return r.transfer_ttlb_s[~np.isnan(r.transfer_ttlb_s)]


def _delays_by_label(r: SimResult) -> dict[str, dict[str, float]]:
    return {lbl: {
        "app_delay_ms_p50": r.delay_percentile_ms("app", 50, lbl),
        "app_delay_ms_p99": r.delay_percentile_ms("app", 99, lbl),
        "kernel_delay_ms_p50": r.delay_percentile_ms("kernel", 50, lbl),
        "kernel_delay_ms_p99": r.delay_percentile_ms("kernel", 99, lbl),
        "app_delay_ms_mean": r.delay_mean_ms("app", lbl),
        "kernel_delay_ms_mean": r.delay_mean_ms("kernel", lbl),
    } for lbl in r.labels}


def _nodes(r: SimResult) -> list[dict[str, Any]]:
    nodes = []
    for i, name in enumerate(r.node_names):
        d: dict[str, Any] = {"name": name, "role": r.node_roles[i], "scheduler": r.node_schedulers[i]}
        for k, v in r.node_counters.items():
            d[k if k.endswith("_bytes") else f"{k}_count"] = int(v[i])
        d["scheduler_runs_per_s"] = float(r.node_counters["scheduler_runs"][i] / r.duration_s)
        d["socket_info_syscalls_per_s"] = float(r.node_counters["socket_info_syscalls"][i] / r.duration_s)
        nodes.append(d)
    return nodes


#: A run's JSON (units in the keys): these fields, then what the arrays sum up to; NaN (no sample) stays NaN.
_JSON_FIELDS = {"duration_s": "duration_s", "seed": "seed", "wall_s": "wall_s",
                "cells_scheduled": "cells_scheduled_count", "events": "events_count",
                "queue_cap_exceeded": "queue_cap_exceeded_count"}
jsonout.shape(
    omit=tuple(a.name for a in attrs.fields(SimResult) if a.name not in _JSON_FIELDS),
    rename={a: key for a, key in _JSON_FIELDS.items() if a != key},
    derived={"transfers_count": lambda r: int(len(r.transfer_circuit)),
             "transfers_finished_count": lambda r: int((~np.isnan(r.transfer_ttlb_s)).sum()),
             "transfer_ttfb_s_p50": lambda r: _percentile(r.transfer_ttfb_s[~np.isnan(r.transfer_ttfb_s)], 50),
             "transfer_ttlb_s_p50": lambda r: _percentile(_finished(r), 50),
             "transfer_ttlb_s_p90": lambda r: _percentile(_finished(r), 90),
             "delays_by_label": _delays_by_label, "nodes": _nodes},
    order=tuple(_JSON_FIELDS.values()))(SimResult)
