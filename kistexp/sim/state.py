"""The array state of a run: compiled from a :class:`~kistexp.sim.network.Network`, grown while it runs.

``build_state(network, run_config)`` turns the description into the struct-of-arrays state the
compiled event loop works on (``layout.State``) and what the results need besides it, refusing (with
:class:`SimConfigError`) a network whose state would exceed ``memory_limit_bytes`` before allocating
the run-time arrays; ``seed_events`` queues the run's first events.  When the loop stops because an
array is full (``layout.RS_GROW_*``), ``grow_cells``, ``grow_events``, ``grow_kq`` and
``grow_streams`` return the state with that array enlarged and nothing the model computes changed.
``CC_PARAMS`` maps each congestion-control consensus parameter to its field of ``S.ncc``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from kistexp import params
from kistexp.errors import SimConfigError
from kistexp.sim import circuittrace
from kistexp.sim import flowcontrol as fc
from kistexp.sim import layout as L
from kistexp.sim.cmux_ewma import ln_scale_factor
from kistexp.sim.config import RunConfig
from kistexp.sim.engine import push_next_start_entry
from kistexp.sim.events import ev_push_entry, hist_edges
from kistexp.sim.network import InteractiveFlow, Network, flow_starts
from kistexp.sim.scheduler import SCHED_KIND

#: cell ids a chan's kernel-queue ring holds before it first doubles
KQ_RING_START = 8


def _cell_pool(n: int) -> np.ndarray:
    """A zeroed pool of ``n`` cells starting on a 32-byte boundary (no cell straddles a cache line)."""
    size = L.CELL_DTYPE.itemsize
    buf = np.zeros((n + 1) * size, np.uint8)
    skip = -buf.ctypes.data % size
    return buf[skip:skip + n * size].view(L.CELL_DTYPE)


def _chan_keys(n_chan: int) -> np.ndarray:
    """``S.ckey``: every chan's pending-heap key +inf (no active circuit, §10.1), out of the heap (-1).
    The position is kept as a float beside the key (exact: heaps hold far fewer than 2**53 chans)."""
    keys = np.empty((L.N_CK, n_chan), np.float64, order=L.ENTITY_MAJOR)
    keys[L.CK_KEY] = np.inf
    keys[L.CK_POS] = -1
    return keys


@functools.cache
def _hist_edges_cached() -> np.ndarray:
    return hist_edges()


def _hist_edges() -> np.ndarray:
    """The delay histograms' bin edges (``events.hist_edges``), computed once per process."""
    return _hist_edges_cached().copy()


def _cells(nbytes: np.ndarray) -> np.ndarray:
    return np.maximum(1, (nbytes + L.RELAY_PAYLOAD - 1) // L.RELAY_PAYLOAD)


#: consensus name of each congestion-control parameter -> (field of ``S.ncc``, FlowControlConfig attribute)
CC_PARAMS = {
    "cc_alg": (L.C_CC_ALG, None),
    "circwindow": (L.C_CIRCWINDOW, "circwindow"),
    "cc_sendme_inc": (L.C_SENDME_INC, "sendme_inc"),
    "cc_cwnd_init": (L.C_CWND_INIT, "cwnd_init"),
    "cc_cwnd_min": (L.C_CWND_MIN, "cwnd_min"),
    "cc_cwnd_inc": (L.C_CWND_INC, "cwnd_inc"),
    "cc_cwnd_inc_pct_ss": (L.C_CWND_INC_PCT_SS, "cwnd_inc_pct_ss"),
    "cc_cwnd_inc_rate": (L.C_CWND_INC_RATE, "cwnd_inc_rate"),
    "cc_ss_max": (L.C_SS_MAX, "ss_max"),
    "cc_sscap_exit": (L.C_SSCAP, "sscap"),
    "cc_vegas_alpha_exit": (L.C_ALPHA, "vegas_alpha"),
    "cc_vegas_beta_exit": (L.C_BETA, "vegas_beta"),
    "cc_vegas_gamma_exit": (L.C_GAMMA, "vegas_gamma"),
    "cc_vegas_delta_exit": (L.C_DELTA, "vegas_delta"),
    "cc_cwnd_full_gap": (L.C_FULL_GAP, "cwnd_full_gap"),
    "cc_cwnd_full_minpct": (L.C_FULL_MINPCT, "cwnd_full_minpct"),
    "cc_cwnd_full_per_cwnd": (L.C_FULL_PER_CWND, "cwnd_full_per_cwnd"),
    "cc_ewma_cwnd_pct": (L.C_EWMA_CWND_PCT, "ewma_cwnd_pct"),
    "cc_ewma_max": (L.C_EWMA_MAX, "ewma_max"),
    "cc_ewma_ss": (L.C_EWMA_SS, "ewma_ss"),
}


def cc_values(fcc) -> dict[int, int]:
    """The run's FlowControlConfig as ``S.ncc`` fields."""
    return {field: getattr(fcc, attr) for field, attr in CC_PARAMS.values() if attr is not None}


def build_state(net: Network, rc: RunConfig):
    """Compile the description into the array state (``layout.State``); returns it with what the
    results need besides it (``_Meta``: labels, channel ends, sample count, per-transfer arrays)."""
    fcc = rc.flow_control
    n_nodes = len(net.nodes)
    n_chan = 2 * len(net.channels)
    circuits = net.circuits
    n_circ = len(circuits)
    n_cd = 2 * n_circ

    ni = np.zeros((L.N_NI, n_nodes), np.int64, order=L.ENTITY_MAJOR)
    nf = np.zeros((L.N_NF, n_nodes), np.float64, order=L.ENTITY_MAJOR)
    rng = np.random.default_rng(rc.seed)
    for i, n in enumerate(net.nodes):
        ni[L.NI_SCHED, i] = SCHED_KIND[n.scheduler]
        ni[L.NI_INTERVAL_MS, i] = n.kist_interval_ms
        ni[L.NI_TICK_NS, i] = max(1, int(round(n.kernel_tick_ms * L.MS)))
        ni[L.NI_PASS_NS, i] = max(1, int(round(n.pass_time_us * 1000)))
        ni[L.NI_TIMER_AT, i] = -1
        ni[L.NI_DEADLINE, i] = -1
        ni[L.NI_TQ_IDX, i] = -1
        ni[L.NI_XMIT_T, i] = -1
        ni[L.NI_CELL_CPU_NS, i] = int(round(n.cell_cpu_us * 1000))
        ni[L.NI_SEND_CPU_NS, i] = int(round(n.cell_send_cpu_us * 1000))
        ni[L.NI_EWMA_TICK, i] = 1000
        # tor's EWMA tick clock starts at a random phase (§11.4)
        ni[L.NI_EWMA_START_MS, i] = -int(rng.integers(0, rc.ewma.tick_s * 1000)) * L.MS
        nf[L.NF_NIC_RATE, i] = float(n.nic_rate_bytes_per_s or 0.0)
        nf[L.NF_FACTOR, i] = n.sock_buf_factor
        nf[L.NF_LN_F, i] = ln_scale_factor(rc.ewma.halflife_ms, rc.ewma.tick_s)
        ni[L.NI_FC, i] = fc.FC_VEGAS if (n.flow_control or fcc.kind) == "vegas" else fc.FC_SENDME
    # every node starts with the run's congestion-control values (cc_alg: the compiled default)
    ncc = np.zeros((max(n_nodes, 1), L.N_CC), np.int64)
    ncc[:, L.C_CC_ALG] = params.get("cc_alg").current.default
    for field, val in cc_values(fcc).items():
        ncc[:, field] = val

    ci = np.zeros((L.N_CI, n_chan), np.int64, order=L.ENTITY_MAJOR)
    cf = np.zeros((L.N_CF, n_chan), np.float64, order=L.ENTITY_MAJOR)
    chan_nodes = np.zeros((2, n_chan), np.int64)
    max_sndbuf = 0
    for i, (a, b, link) in enumerate(net.channels):
        for c, (src, dst) in ((2 * i, (a, b)), (2 * i + 1, (b, a))):
            chan_nodes[:, c] = (src, dst)
            ci[L.CI_NODE, c] = src
            ci[L.CI_PEER, c] = dst
            ci[L.CI_MSS, c] = link.mss
            ci[L.CI_OWD_NS, c] = int(round(link.rtt_ms * L.MS / 2))
            ci[L.CI_RATE_LIMITED, c] = 1 if link.rate_limited else 0
            ci[L.CI_INIT_CWND, c] = link.initial_cwnd
            if link.send_buffer_bytes:
                ci[L.CI_SNDBUF, c] = link.send_buffer_bytes
                ci[L.CI_SNDBUF_MAX, c] = 0
            else:
                ci[L.CI_SNDBUF_MAX, c] = link.send_buffer_max_bytes
                ci[L.CI_SNDBUF, c] = min(link.send_buffer_max_bytes, 4 * max(10, link.initial_cwnd) * link.mss)
            max_sndbuf = max(max_sndbuf, link.send_buffer_bytes or link.send_buffer_max_bytes)
            cf[L.CF_CWND, c] = link.initial_cwnd
            cf[L.CF_SSTHRESH, c] = 1e18
            cf[L.CF_LOSS_P, c] = link.loss_rate
            ci[L.CI_NAGLE, c] = 1 if link.nagle else 0
            if link.nagle:
                # tcp_bound_to_half_wnd: the sender's mss is at most half the peer's window
                ci[L.CI_RWND, c] = link.receive_window_bytes
                ci[L.CI_RWND_MAX, c] = link.receive_window_max_bytes  # 0: a fixed window
                ci[L.CI_MSS, c] = min(link.mss, link.receive_window_bytes // 2)
            ci[L.CI_RCV_MSS, c] = L.TCP_MSS_DEFAULT
            ci[L.CI_LRCV, c] = -1
            ci[L.CI_DELACK_AT, c] = -1
            ci[L.CI_DELACK_NS, c] = int(round(link.delayed_ack_ms * L.MS))
    ci[L.CI_STATE] = L.ST_WAITING_FOR_CELLS  # the OR connection opened with room: wants_writes on IDLE
    for f in (L.CI_OB_HEAD, L.CI_OB_TAIL, L.CI_EQ_HEAD, L.CI_EQ_TAIL, L.CI_EQK_HEAD, L.CI_EQK_TAIL):
        ci[f] = -1
    # kernel-queue rings (tcp.kq_push): small, doubling with their content
    ci[L.CI_KQ_CAP] = KQ_RING_START
    ci[L.CI_KQ_BASE] = np.arange(n_chan) * KQ_RING_START
    kq_len = KQ_RING_START * n_chan

    # pending-heap segments per node
    per_node = np.bincount(chan_nodes[0], minlength=n_nodes) if n_chan else np.zeros(n_nodes, np.int64)
    ni[L.NI_HEAP_BASE] = np.concatenate(([0], np.cumsum(per_node)[:-1]))

    def chan(u: int, v: int) -> int:
        i = net.channel_between(u, v)
        a, _, _ = net.channels[i]
        return 2 * i if a == u else 2 * i + 1

    labels: dict[str, int] = {}
    hops = np.array([len(p) - 1 for p, _ in circuits], np.int64)
    n_cq = int(2 * hops.sum())
    qi = np.zeros((L.N_QI, n_cq), np.int64, order=L.ENTITY_MAJOR)
    qf = np.zeros((L.N_QF, n_cq), np.float64, order=L.ENTITY_MAJOR)
    di = np.zeros((L.N_DI, n_cd), np.int64, order=L.ENTITY_MAJOR)
    df = np.zeros((L.N_DF, n_cd), np.float64, order=L.ENTITY_MAJOR)
    base = 0
    for j, (path, label) in enumerate(circuits):
        h = len(path) - 1
        cls = labels.setdefault(label, len(labels))
        for d in (0, 1):
            for k in range(h):
                q = base + d * h + k
                if d == 0:
                    qi[L.QI_CHAN, q] = chan(path[k], path[k + 1])
                    qi[L.QI_NEXTQ, q] = q + 1 if k + 1 < h else -1
                else:  # sender is path[k + 1], toward path[k]
                    qi[L.QI_CHAN, q] = chan(path[k + 1], path[k])
                    qi[L.QI_NEXTQ, q] = q - 1 if k >= 1 else -1
                qi[L.QI_CD, q] = 2 * j + d
                qi[L.QI_CLASS, q] = cls
                qi[L.QI_CIRC, q] = j
        di[L.DI_SRC_CQ, 2 * j] = base
        di[L.DI_SRC_CQ, 2 * j + 1] = base + h + h - 1
        di[L.DI_SRC_NODE, 2 * j], di[L.DI_SINK_NODE, 2 * j] = path[0], path[-1]
        di[L.DI_SRC_NODE, 2 * j + 1], di[L.DI_SINK_NODE, 2 * j + 1] = path[-1], path[0]
        di[L.DI_REV_CQ, 2 * j] = di[L.DI_SRC_CQ, 2 * j + 1]
        di[L.DI_REV_CQ, 2 * j + 1] = di[L.DI_SRC_CQ, 2 * j]
        base += 2 * h
    if n_cd:
        di[L.DI_CIRC] = np.arange(n_cd) // 2
        di[L.DI_DIR] = np.arange(n_cd) % 2
        di[L.DI_HOPS] = np.repeat(hops, 2)
    di[L.DI_PKG_WIN] = fcc.circwindow
    di[L.DI_DELIV_WIN] = fcc.circwindow
    di[L.DI_READY_HEAD] = -1
    di[L.DI_READY_TAIL] = -1
    di[L.DI_CWND] = fcc.cwnd_init
    di[L.DI_SS] = 1
    di[L.DI_NEXT_CC] = 1
    di[L.DI_NEXT_CWND] = (fcc.cwnd_init + fcc.sendme_inc // 2) // fcc.sendme_inc
    qi[L.QI_HEAD] = -1
    qi[L.QI_TAIL] = -1
    qi[L.QI_HEAP_IDX] = -1
    qi[L.QI_LAST_TICK] = 1000
    ci[L.CI_REF_TICK] = 1000
    # cmux heap segments per chan
    per_chan = np.bincount(qi[L.QI_CHAN], minlength=n_chan) if n_cq else np.zeros(n_chan, np.int64)
    ci[L.CI_CMUX_BASE] = np.concatenate(([0], np.cumsum(per_chan)[:-1])) if n_chan else 0
    ci[L.CI_CMUX_CAP] = per_chan

    # transfers and streams: a regular transfer holds a stream pair for the run; an interactive
    # flow is one record whose exchanges take pairs from a pool while they run (layout.N_FL)
    n_tr = net.n_transfers
    ti = np.zeros((L.N_TI, n_tr), np.int64, order=L.ENTITY_MAJOR)
    reg: list[tuple[np.ndarray, ...]] = []
    flows: list[tuple[int, int, InteractiveFlow]] = []
    first = 0
    for part in net.transfer_parts():
        if isinstance(part, InteractiveFlow):
            starts = flow_starts(part)
            n = len(starts)
            ti[L.TI_START, first:first + n] = np.round(starts * 1e9).astype(np.int64)
            flows.append((first, n, part))
        else:
            n = len(part[0])
            ti[L.TI_START, first:first + n] = np.round(part[3] * 1e9).astype(np.int64)
            reg.append((np.arange(first, first + n, dtype=np.int64), *part[:3]))
        first += n
    ti[L.TI_TTFB] = -1
    ti[L.TI_TTLB] = -1
    e = np.zeros(0, np.int64)
    r_ids, r_circ, r_req, r_resp = (np.concatenate([c[i] for c in reg]) if reg else e for i in range(4))
    biggest = max([int(r_req.max()), int(r_resp.max())] if len(r_ids) else [0])
    biggest = max([biggest] + [max(f.request_bytes, f.response_bytes) for _, _, f in flows])
    if biggest > L.INT_MAX * L.RELAY_PAYLOAD:
        raise SimConfigError(f"transfer: at most {L.INT_MAX * L.RELAY_PAYLOAD} bytes a direction "
                             f"({L.INT_MAX} cells), got {biggest}")
    n_reg = len(r_ids)
    n_exchanges = sum(n for _, n, _ in flows)
    pool = min(n_exchanges, max(64, 4 * len(flows)))  # grows in the run when short (grow_streams)
    si = np.zeros(2 * (n_reg + pool), L.STREAM_DTYPE)  # one record per stream
    si["cd"][0:2 * n_reg:2] = 2 * r_circ
    si["cd"][1:2 * n_reg:2] = 2 * r_circ + 1
    si["total"][0:2 * n_reg:2] = _cells(r_req)
    si["total"][1:2 * n_reg:2] = _cells(r_resp)
    si["topkg"] = si["total"]
    si["pkg_win"] = fcc.stream_window
    si["deliv_win"] = fcc.stream_window
    si["next"] = -1
    pair_tr = np.full(n_reg + pool, -1, np.int64)
    pair_tr[:n_reg] = r_ids
    pfree = np.arange(n_reg + pool - 1, n_reg - 1, -1, dtype=np.int64)  # pair n_reg on top
    fl = np.zeros((L.N_FL, len(flows)), np.int64, order=L.ENTITY_MAJOR)
    for i, (f0, n, f) in enumerate(flows):
        fl[:, i] = (f.circuit, f0, n, 0, _cells(np.int64(f.request_bytes)), _cells(np.int64(f.response_bytes)))
    # the flows in (first start, first id) order: a sorted array is a heap
    flheap = np.lexsort((fl[L.FL_FIRST_TR], ti[L.TI_START, fl[L.FL_FIRST_TR]])).astype(np.int64)
    stream_cells = int(si["total"].sum(dtype=np.int64)) + int((fl[L.FL_N] * (fl[L.FL_REQ] + fl[L.FL_RESP])).sum())
    tr_order = np.argsort(ti[L.TI_START, r_ids], kind="stable").astype(np.int64)  # regular pairs

    pi = np.zeros(L.N_PI, np.int64)
    for key, val in (("P_CIRCWINDOW", fcc.circwindow), ("P_CIRC_INC", fcc.circ_increment),
                     ("P_STREAM_WINDOW", fcc.stream_window), ("P_STREAM_INC", fcc.stream_increment),
                     ("P_CELLQ_HIGH", fcc.cellq_high), ("P_CELLQ_LOW", fcc.cellq_low),
                     ("P_EXIT_READ", fcc.exit_read_cells), ("P_EDGE_WRITE", fcc.edge_write_cells),
                     ("P_READ_SHARE", L.WRITE_SHARE_BYTES // L.CELL_SIZE if rc.read_share else 0),
                     ("P_WAKE_REBASE", 1 if rc.wake_rebase else 0),
                     ("P_SENDME_INC", fcc.sendme_inc), ("P_CWND_INIT", fcc.cwnd_init),
                     ("P_CWND_MIN", fcc.cwnd_min), ("P_CWND_INC", fcc.cwnd_inc),
                     ("P_CWND_INC_PCT_SS", fcc.cwnd_inc_pct_ss), ("P_CWND_INC_RATE", fcc.cwnd_inc_rate),
                     ("P_SS_MAX", fcc.ss_max), ("P_SSCAP", fcc.sscap), ("P_ALPHA", fcc.vegas_alpha),
                     ("P_BETA", fcc.vegas_beta), ("P_GAMMA", fcc.vegas_gamma), ("P_DELTA", fcc.vegas_delta),
                     ("P_FULL_GAP", fcc.cwnd_full_gap), ("P_FULL_MINPCT", fcc.cwnd_full_minpct),
                     ("P_FULL_PER_CWND", fcc.cwnd_full_per_cwnd), ("P_EWMA_CWND_PCT", fcc.ewma_cwnd_pct),
                     ("P_EWMA_MAX", fcc.ewma_max), ("P_EWMA_SS", fcc.ewma_ss),
                     ("P_EWMA_TICK_MS", rc.ewma.tick_s * 1000), ("P_QCAP", 2500)):
        pi[getattr(L, key)] = val
    vegas = bool(n_nodes) and bool((ni[L.NI_FC] == fc.FC_VEGAS).any())
    ts_cap = fc.timestamp_capacity(fcc.sendme_inc, fcc.ss_max) if vegas else 1
    pi[L.P_TS_CAP] = ts_cap
    pf = np.zeros(L.N_PF, np.float64)

    n_samples = int(math.floor(rc.duration_s / rc.sample_interval_s + 1e-9)) + 1
    max_flight_cells = max_sndbuf // L.CELL_SIZE + 1
    cell_reserve = 2 * max_flight_cells + fcc.cellq_high + 1024
    ev_reserve = 4 * max_flight_cells + 4 * int(per_node.max() if n_nodes else 0) + 1024
    # a first guess (a full edge queue per circuit-direction); the pool doubles when it runs short
    est_cells = int(min(n_cd * fcc.cellq_high, stream_cells + 64 * n_cd))
    cell_cap = max(2 * cell_reserve, min(est_cells, 1 << 20) + cell_reserve)
    ev_cap = 2 * ev_reserve + 2 * n_chan + 1024  # the heap doubles when it runs short
    # what the run-time arrays will take, checked before allocating them
    planned = (4 + L.CELL_DTYPE.itemsize) * cell_cap + 4 * (kq_len + _kq_reserve(cell_cap)) + 8 * (
                   2 * ev_cap * L.N_EV + ev_cap * (L.N_EQ + 1) + n_samples * n_chan + n_chan
                   + L.N_NS * n_samples * n_nodes + n_cd * ts_cap + 5 * rc.cell_delays_max
                   + 4 * rc.run_log_max + (4 * rc.trace_max if rc.trace_chan >= 0 else 0)
                   + n_samples * 2 * max(len(labels), 1) * L.HIST_BINS + n_cd * L.N_CC)
    described = sum(a.nbytes for a in (ni, nf, ci, cf, qi, qf, di, df, si, ti, tr_order, pair_tr, pfree, fl))
    trace_layout = circuittrace.plan(net, rc)
    if trace_layout is not None:
        planned += trace_layout.nbytes + 8 * n_cq + 4 * (kq_len + _kq_reserve(cell_cap))
    if planned + described > rc.memory_limit_bytes:
        raise SimConfigError(
            f"run.memory_limit_bytes={rc.memory_limit_bytes}: the network needs "
            f"{(planned + described) / 2**20:.0f} MiB of simulator state "
            f"(limit {rc.memory_limit_bytes / 2**20:.0f} MiB)")

    g = np.zeros(L.N_G, np.int64)
    g[L.G_END] = int(round(rc.duration_s * 1e9))
    g[L.G_RNG] = int(rng.integers(1, 2**62))
    g[L.G_EW_STREAM] = -1  # no edge write waiting for the end of the current event
    g[L.G_SAMPLE_NS] = int(round(rc.sample_interval_s * 1e9))
    g[L.G_NSAMPLES] = n_samples
    g[L.G_CELL_RESERVE] = cell_reserve
    g[L.G_EV_RESERVE] = ev_reserve
    g[L.G_EQ_NFREE] = ev_cap  # S.eqfree: the stack of free rows of S.evq
    for key, field in (("trace_chan", L.G_TRACE_CHAN), ("run_log_chan", L.G_RUNLOG_CHAN)):
        chan = getattr(rc, key)
        if chan >= n_chan:
            raise SimConfigError(f"run.{key}={chan}: the network has {n_chan} directed channels")
        g[field] = chan
    cells = _cell_pool(cell_cap)
    g[L.G_NFREE] = cell_cap  # S.free: the stack of free cell ids, cell 0 on top
    g[L.G_KQ_END] = kq_len
    g[L.G_NREG] = n_reg
    g[L.G_PFREE_N] = pool
    g[L.G_FLH_N] = len(flows)

    changes = sorted(net.interval_changes, key=lambda c: c.time_s)
    chg = np.zeros((3, len(changes)), np.int64)
    for i, c in enumerate(changes):
        chg[:, i] = (int(round(c.time_s * 1e9)), c.node, c.interval_ms)

    S = L.State(
        g=g, pi=pi, pf=pf, ni=ni, nf=nf, ci=ci, cf=cf, qi=qi, qf=qf, di=di, df=df,
        ts=np.zeros((n_cd, ts_cap), np.int64), si=si, ti=ti, tr_order=tr_order, cells=cells,
        ev=np.zeros((ev_cap, L.N_EV), np.int64), pend_heap=np.zeros(max(n_chan, 1), np.int64),
        cmux_heap=np.zeros(max(n_cq, 1), np.int64), touched=np.zeros(max(n_chan, 1), np.int64),
        readd=np.zeros(max(n_chan, 1), np.int64), ww=np.zeros(max(n_chan, 1), np.int64),
        ser_chan=np.zeros((n_samples, n_chan), np.int64),
        ser_node=np.zeros((L.N_NS, n_samples, n_nodes), np.int64),
        hist=np.zeros((2, max(len(labels), 1), L.HIST_BINS), np.int64), hedge=_hist_edges(),
        circ_sum=np.zeros((L.N_CS, n_circ), np.int64, order=L.ENTITY_MAJOR),
        raw=np.zeros((4, rc.cell_delays_max), np.int64), chg=chg,
        runlog=np.zeros((4, rc.run_log_max), np.int64),
        trace=np.zeros((4, rc.trace_max if rc.trace_chan >= 0 else 0), np.int64),
        ckey=_chan_keys(max(n_chan, 1)), armed=np.zeros(max(n_chan, 1), np.int64),
        nq=np.zeros((ev_cap, L.N_EV), np.int64), evq=np.zeros((ev_cap, L.N_EQ), np.int64),
        eqfree=np.arange(ev_cap - 1, -1, -1, dtype=np.int64), kq=np.zeros(kq_len + _kq_reserve(cell_cap), np.int32),
        free=np.arange(cell_cap - 1, -1, -1, dtype=np.int32),
        ncc=ncc, dcc=np.zeros((max(n_cd, 1), L.N_CC), np.int64),
        ser_hist=np.zeros((n_samples, 2, max(len(labels), 1), L.HIST_BINS), np.int64),
        tq=np.zeros(max(n_nodes, 1), np.int64),
        pair_tr=pair_tr, pfree=np.concatenate((pfree, np.zeros(max(0, 1 - pool), np.int64))), fl=fl,
        flheap=flheap, **circuittrace.build_arrays(net, trace_layout, n_cq),
        ctkq=np.zeros(kq_len + _kq_reserve(cell_cap) if trace_layout is not None else 0, np.int32),
    )
    meta = _Meta(net, n_tr, labels=list(labels), chan_nodes=chan_nodes, n_samples=n_samples,
                 trace_layout=trace_layout)
    return S, meta


class _Meta(dict):
    """What ``build_state`` tells the results besides the state.  The per-transfer arrays (``t_circ``,
    ``t_req``, ``t_resp``, ``t_start``) are expanded from the network when first asked for: until
    then an interactive flow is one record, however many exchanges it has."""

    def __init__(self, net: Network, n_tr: int, **facts) -> None:
        super().__init__(**facts)
        self._net = net
        self._n_tr = n_tr

    def __missing__(self, key: str):
        if key not in ("t_circ", "t_req", "t_resp", "t_start"):
            raise KeyError(key)
        circ, req, resp, start = (a[:self._n_tr] for a in self._net.transfer_arrays())
        self.update(t_circ=circ, t_req=req, t_resp=resp, t_start=start)
        return self[key]


def state_bytes(S) -> int:
    """What the state's arrays take, in bytes."""
    return sum(a.nbytes for a in S)


def check_memory(S, rc: RunConfig, when: str) -> None:
    """SimConfigError when the state ``S`` takes more than ``rc.memory_limit_bytes``; ``when`` says at
    which point of the run."""
    need = state_bytes(S)
    if need > rc.memory_limit_bytes:
        raise SimConfigError(
            f"run.memory_limit_bytes={rc.memory_limit_bytes}: {when} needs {need / 2**20:.0f} MiB "
            f"of simulator state (limit {rc.memory_limit_bytes / 2**20:.0f} MiB)")


def grow_cells(S):
    """Twice the cell pool; the new cells go on the free stack after the free ones, lowest id on top."""
    old = S.cells
    cap = old.shape[0]
    new = _cell_pool(2 * cap)
    new[:cap] = old
    nfree = int(S.g[L.G_NFREE])
    free = np.empty(2 * cap, np.int32)
    free[:nfree] = S.free[:nfree]
    free[nfree:nfree + cap] = np.arange(2 * cap - 1, cap - 1, -1)  # the new cells first, in order
    S.g[L.G_NFREE] = nfree + cap
    return S._replace(cells=new, free=free)


def grow_events(S):
    """Twice the event heap, the queue of later events (``S.nq``, unrolled to start at row 0) and the
    rows of the chans' event queues (``S.evq``, whose rows keep their numbers)."""
    old = S.ev
    n = int(S.g[L.G_EVN])
    new = np.zeros((2 * old.shape[0], L.N_EV), np.int64)
    new[:n] = old[:n]
    oq = S.nq
    m = int(S.g[L.G_NQ_N])
    nq = np.zeros((2 * oq.shape[0], L.N_EV), np.int64)
    nq[:m] = oq[(int(S.g[L.G_NQ_HEAD]) + np.arange(m)) % oq.shape[0]]
    S.g[L.G_NQ_HEAD] = 0
    # the chans' queued events keep their rows (the queues link rows by number)
    oe = S.evq
    evq = np.zeros((2 * oe.shape[0], L.N_EQ), np.int64)
    evq[:oe.shape[0]] = oe
    nfree = int(S.g[L.G_EQ_NFREE])
    eqfree = np.zeros(2 * oe.shape[0], np.int64)
    eqfree[:nfree] = S.eqfree[:nfree]
    eqfree[nfree:nfree + oe.shape[0]] = np.arange(2 * oe.shape[0] - 1, oe.shape[0] - 1, -1)
    S.g[L.G_EQ_NFREE] = nfree + oe.shape[0]
    return S._replace(ev=new, nq=nq, evq=evq, eqfree=eqfree)


def grow_streams(S):
    """Twice the pool of stream pairs for interactive exchanges (``engine._start_transfer``)."""
    n_pairs = S.pair_tr.shape[0]
    add = max(64, n_pairs - int(S.g[L.G_NREG]))
    si = np.zeros(2 * (n_pairs + add), L.STREAM_DTYPE)
    si[:2 * n_pairs] = S.si
    si["next"][2 * n_pairs:] = -1
    pair_tr = np.full(n_pairs + add, -1, np.int64)
    pair_tr[:n_pairs] = S.pair_tr
    nfree = int(S.g[L.G_PFREE_N])
    pfree = np.zeros(n_pairs + add - int(S.g[L.G_NREG]), np.int64)
    pfree[:nfree] = S.pfree[:nfree]
    pfree[nfree:nfree + add] = np.arange(n_pairs + add - 1, n_pairs - 1, -1)
    S.g[L.G_PFREE_N] = nfree + add
    return S._replace(si=si, pair_tr=pair_tr, pfree=pfree)


def _kq_reserve(cell_cap: int) -> int:
    """Free slots ``S.kq`` keeps at its end for one event (``engine._run_kernel``)."""
    return L.KQ_SLOTS_PER_CELL * cell_cap + L.KQ_SLACK


def grow_kq(S):
    """Room at the end of ``S.kq`` for the next event (``engine._run_kernel``): the live rings are
    compacted, in order, to the start of a new array with as much room again as they take.

    A ring that fills moves to a new segment twice its size (``tcp.kq_push``) and leaves its old
    one unused; compacting drops those.  Where a ring's cells sit in ``S.kq`` changes nothing the
    model computes.
    """
    ci = S.ci
    cap, n, pos, base = ci[L.CI_KQ_CAP], ci[L.CI_KQ_N], ci[L.CI_KQ_POS], ci[L.CI_KQ_BASE]
    live = int(cap.sum())
    new = np.zeros(2 * live + _kq_reserve(S.free.shape[0]), np.int32)
    traced = S.ctkq.shape[0] > 0  # the circuit trace's copy beside each slot moves with it
    new_ct = np.zeros(new.shape[0] if traced else 0, np.int32)
    new_base = np.concatenate(([0], np.cumsum(cap)[:-1])) if len(cap) else cap
    total = int(n.sum())
    if total:
        owner = np.repeat(np.arange(len(n)), n)
        i = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
        old = base[owner] + (pos[owner] + i) % cap[owner]
        new[new_base[owner] + i] = S.kq[old]
        if traced:
            new_ct[new_base[owner] + i] = S.ctkq[old]
    ci[L.CI_KQ_BASE] = new_base
    ci[L.CI_KQ_POS] = 0
    S.g[L.G_KQ_END] = live
    return S._replace(kq=new, ctkq=new_ct)


def seed_events(S) -> None:
    """Queue the run's first events: the first transfer to start, the first sample and the first
    interval change, if any."""
    ref = L.descriptor(S)
    push_next_start_entry(ref)  # the first transfer to start
    ev_push_entry(ref, 0, L.EV_SAMPLE, 0, 0, 0)
    if S.chg.shape[1]:
        ev_push_entry(ref, int(S.chg[0, 0]), L.EV_INTERVAL, int(S.chg[1, 0]), int(S.chg[2, 0]), 0)

