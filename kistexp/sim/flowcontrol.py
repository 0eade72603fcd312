"""End-to-end flow control at the circuit edges (§13): legacy SENDME windows or Vegas.

Legacy (cc_alg 0, §13.1): the sender's circuit package window starts at ``circwindow`` (1000) and
a stream's at 500; the receiver sends a circuit SENDME each time its deliver window falls to
``circwindow - 100`` (then adds 100) and a stream SENDME at 450 (adds 50).  Only DATA cells count.

Vegas (cc_alg 2, §13.2, exit-path parameters of §14): package window ``cwnd - inflight``; the
receiver sends a SENDME every ``sendme_inc`` (31) DATA cells; the sender updates RTT, BDP and
cwnd on each SENDME (slow start on every SENDME, steady state once per ``CWND_UPDATE_RATE``).
Stream windows are not used (XON/XOFF never triggers: the edge applications read at once).

SENDMEs are ordinary cells that go through the schedulers (§15 rule 9); the engine queues them.

Parameters are per circuit: each node holds the congestion-control values of its latest
consensus (``S.ncc``, set by ``fc_on_new_consensus``), and a circuit copies them when it is built
(``circuit_build``, at its first stream), as tor reads them per new circuit.  Each direction uses
the parameters of the edge that sends its data; a circuit uses Vegas only if both edges support
congestion control and have ``cc_alg`` != 0 (§13.2 negotiation).
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.ctrace import trace_rtt, trace_sendme_acked, trace_sendme_cell, tracing

FC_SENDME = 0
FC_VEGAS = 1

EMIT_CIRC = 1
EMIT_STREAM = 2
#: ``connection_outbuf_too_full``: 10 * CELL_PAYLOAD_SIZE (509) bytes
OUTBUF_FULL_BYTES = 10 * 509


@njit(cache=True, inline="always")
def circ_window(S, cd):
    """Cells the circuit-direction may still package."""
    if S.di[L.DI_FC, cd] == FC_SENDME:
        return S.di[L.DI_PKG_WIN, cd]
    w = S.di[L.DI_CWND, cd] - S.di[L.DI_INFLIGHT, cd]
    return w if w > 0 else 0


@njit(cache=True, inline="always")
def unacked(S, cd):
    """DATA cells packaged and not yet acknowledged by a SENDME: what the window bounds."""
    if S.di[L.DI_FC, cd] == FC_SENDME:
        return S.dcc[cd, L.C_CIRCWINDOW] - S.di[L.DI_PKG_WIN, cd]
    return S.di[L.DI_INFLIGHT, cd]


@njit(cache=True, inline="always")
def stream_window(S, s):
    if S.di[L.DI_FC, S.si[s].cd] == FC_SENDME:
        return S.si[s].pkg_win
    return 1 << 40


@njit(cache=True, inline="always")
def on_package(S, cd, s, t):
    """A DATA cell was packaged at the source edge."""
    if S.di[L.DI_FC, cd] == FC_SENDME:
        S.di[L.DI_PKG_WIN, cd] -= 1
        S.si[s].pkg_win -= 1
        if tracing(S):
            trace_sendme_cell(S, cd, t)
    else:
        infl = S.di[L.DI_INFLIGHT, cd]
        if (infl + 1) % S.dcc[cd, L.C_SENDME_INC] == 0:
            cap = S.ts.shape[1]
            n = S.di[L.DI_TS_N, cd]
            if n < cap:
                S.ts[cd, (S.di[L.DI_TS_HEAD, cd] + n) % cap] = t
                S.di[L.DI_TS_N, cd] = n + 1
        S.di[L.DI_INFLIGHT, cd] = infl + 1


@njit(cache=True, inline="always")
def on_deliver(S, cd, s):
    """A DATA cell reached the sink edge; returns the SENDMEs to emit (EMIT_* bit mask)."""
    emit = 0
    if S.di[L.DI_FC, cd] == FC_SENDME:
        w = S.di[L.DI_DELIV_WIN, cd] - 1
        if w <= S.dcc[cd, L.C_CIRCWINDOW] - S.pi[L.P_CIRC_INC]:
            w += S.pi[L.P_CIRC_INC]
            emit |= EMIT_CIRC
        S.di[L.DI_DELIV_WIN, cd] = w
        sw = S.si[s].deliv_win - 1
        if S.pi[L.P_EDGE_WRITE] == 0 and sw <= S.pi[L.P_STREAM_WINDOW] - S.pi[L.P_STREAM_INC]:
            sw += S.pi[L.P_STREAM_INC]
            emit |= EMIT_STREAM
        S.si[s].deliv_win = sw
    else:
        r = S.di[L.DI_RECV, cd] + 1
        if r >= S.dcc[cd, L.C_SENDME_INC]:
            r = 0
            emit |= EMIT_CIRC
        S.di[L.DI_RECV, cd] = r
    return emit


@njit(cache=True, inline="always")
def stream_sendmes_due(S, s):
    """``sendme_connection_edge_consider_sending`` (core/or/sendme.c): nothing while the edge's
    outbuf toward its application holds more than 10 cells' payload ("Don't send it if we still
    have data to deliver", ``connection_outbuf_too_full``: > 10 * CELL_PAYLOAD_SIZE), else one
    stream SENDME per increment owed (its ``while`` loop).  Returns how many to send, -1 when
    one is owed and held."""
    low = S.pi[L.P_STREAM_WINDOW] - S.pi[L.P_STREAM_INC]
    if S.si[s].ob > OUTBUF_FULL_BYTES:
        return -1 if S.si[s].deliv_win <= low else 0
    n = 0
    while S.si[s].deliv_win <= low:
        S.si[s].deliv_win += S.pi[L.P_STREAM_INC]
        n += 1
    return n


@njit(cache=True)
def on_sendme(S, cd, kind, s, t):
    """A SENDME for data direction ``cd`` reached the source edge."""
    S.di[L.DI_SENDMES_RECV, cd] += 1
    if S.di[L.DI_FC, cd] == FC_SENDME:
        if kind == L.K_SENDME_CIRC:
            S.di[L.DI_PKG_WIN, cd] += S.pi[L.P_CIRC_INC]
            if tracing(S):
                trace_sendme_acked(S, cd, t)
        else:
            S.si[s].pkg_win += S.pi[L.P_STREAM_INC]
    else:
        vegas_process_sendme(S, cd, t)


@njit(cache=True, inline="always")
def _update_rate(S, cd, cwnd, ss):
    if ss:
        return 1
    r = S.dcc[cd, L.C_CWND_INC_RATE] * S.dcc[cd, L.C_SENDME_INC]
    return (cwnd + r // 2) // r


@njit(cache=True)
def vegas_process_sendme(S, cd, t):
    """``congestion_control_vegas_process_sendme``, in the order of §13.2 steps 1-8."""
    P = S.dcc
    inc = P[cd, L.C_SENDME_INC]
    cwnd = S.di[L.DI_CWND, cd]
    ss = S.di[L.DI_SS, cd] == 1
    inflight = S.di[L.DI_INFLIGHT, cd]
    rate = _update_rate(S, cd, cwnd, ss)
    # 1. event counters
    if S.di[L.DI_NEXT_CC, cd] > 0:
        S.di[L.DI_NEXT_CC, cd] -= 1
    if S.di[L.DI_NEXT_CWND, cd] > 0:
        S.di[L.DI_NEXT_CWND, cd] -= 1
    # 2. RTT sample
    if S.di[L.DI_TS_N, cd] > 0:
        cap = S.ts.shape[1]
        h = S.di[L.DI_TS_HEAD, cd]
        sent = S.ts[cd, h]
        S.di[L.DI_TS_HEAD, cd] = (h + 1) % cap
        S.di[L.DI_TS_N, cd] -= 1
        rtt = float(t - sent)
        if rtt > 0:
            if tracing(S):
                trace_rtt(S, cd, t, rtt)
            if ss:
                n = P[cd, L.C_EWMA_SS]
            else:
                n = min(rate * P[cd, L.C_EWMA_CWND_PCT] // 100, P[cd, L.C_EWMA_MAX])
            n = max(n, 2)
            ewma = S.df[L.DF_EWMA_RTT, cd]
            ewma = rtt if ewma == 0.0 else (2.0 * rtt + (n - 1) * ewma) / (n + 1)
            S.df[L.DF_EWMA_RTT, cd] = ewma
            mn = S.df[L.DF_MIN_RTT, cd]
            if mn == 0.0 or ewma < mn:
                mn = ewma
            elif cwnd == P[cd, L.C_CWND_MIN] and not ss:
                mn = max(ewma, mn)  # cc_rtt_reset_pct = 100
            S.df[L.DF_MIN_RTT, cd] = mn
    ewma = S.df[L.DF_EWMA_RTT, cd]
    mn = S.df[L.DF_MIN_RTT, cd]
    if ewma <= 0.0 or mn <= 0.0:
        S.di[L.DI_INFLIGHT, cd] = max(inflight - inc, 0)
        return
    # 3. BDP and queue use
    bdp = int(cwnd * mn / ewma)
    S.df[L.DF_BDP, cd] = bdp
    queue_use = cwnd - bdp
    # 4. local queue toward the channel at or above cellq_high
    blocked = S.di[L.DI_BLOCKED, cd] == 1
    # 5. cwnd_full
    if inflight + P[cd, L.C_FULL_GAP] * inc >= cwnd:
        S.di[L.DI_CWND_FULL, cd] = 1
    elif 100 * inflight < P[cd, L.C_FULL_MINPCT] * cwnd:
        if P[cd, L.C_FULL_PER_CWND] == 0 or S.di[L.DI_NEXT_CWND, cd] == 0:
            S.di[L.DI_CWND_FULL, cd] = 0
    if S.di[L.DI_NEXT_CWND, cd] == 0:
        S.di[L.DI_NEXT_CWND, cd] = max((cwnd + inc // 2) // inc, 1)
    full = S.di[L.DI_CWND_FULL, cd] == 1
    if ss:
        # 6. slow start, on every SENDME
        if queue_use < P[cd, L.C_GAMMA] and not blocked:
            if full:
                if cwnd <= P[cd, L.C_SSCAP]:
                    step = (P[cd, L.C_CWND_INC_PCT_SS] * inc + 50) // 100
                else:
                    step = max(1, (inc * P[cd, L.C_SSCAP] + cwnd) // (2 * cwnd))
                cwnd += step
                per_cwnd = max((cwnd + inc // 2) // inc, 1)
                if step * per_cwnd <= P[cd, L.C_CWND_INC] * P[cd, L.C_CWND_INC_RATE]:
                    ss = False
        else:
            cwnd = bdp + P[cd, L.C_GAMMA]
            ss = False
        if cwnd >= P[cd, L.C_SS_MAX]:
            cwnd = P[cd, L.C_SS_MAX]
            ss = False
    elif S.di[L.DI_NEXT_CC, cd] == 0:
        # 7. steady state, once every CWND_UPDATE_RATE SENDMEs
        if queue_use > P[cd, L.C_DELTA]:
            cwnd = bdp + P[cd, L.C_DELTA] - P[cd, L.C_CWND_INC]
        elif queue_use > P[cd, L.C_BETA] or blocked:
            cwnd -= P[cd, L.C_CWND_INC]
        elif full and queue_use < P[cd, L.C_ALPHA]:
            cwnd += P[cd, L.C_CWND_INC]
    cwnd = max(cwnd, P[cd, L.C_CWND_MIN])
    if S.di[L.DI_NEXT_CC, cd] == 0:
        S.di[L.DI_NEXT_CC, cd] = _update_rate(S, cd, cwnd, ss)
    S.di[L.DI_CWND, cd] = cwnd
    S.di[L.DI_SS, cd] = 1 if ss else 0
    # 8.
    S.di[L.DI_INFLIGHT, cd] = max(inflight - inc, 0)


@njit(cache=True)
def circuit_build(S, circ):
    """A circuit is built (its first stream starts): both directions take their edges' parameters."""
    fwd = 2 * circ
    a = S.di[L.DI_SRC_NODE, fwd]
    b = S.di[L.DI_SINK_NODE, fwd]
    vegas = (S.ni[L.NI_FC, a] == FC_VEGAS and S.ni[L.NI_FC, b] == FC_VEGAS
             and S.ncc[a, L.C_CC_ALG] != 0 and S.ncc[b, L.C_CC_ALG] != 0)
    for cd in (fwd, fwd + 1):
        src = S.di[L.DI_SRC_NODE, cd]
        for f in range(L.N_CC):
            S.dcc[cd, f] = S.ncc[src, f]
        S.di[L.DI_BUILT, cd] = 1
        S.di[L.DI_FC, cd] = FC_VEGAS if vegas else FC_SENDME
        w = S.dcc[cd, L.C_CIRCWINDOW]
        S.di[L.DI_PKG_WIN, cd] = w
        S.di[L.DI_DELIV_WIN, cd] = w
        cwnd = S.dcc[cd, L.C_CWND_INIT]
        inc = S.dcc[cd, L.C_SENDME_INC]
        S.di[L.DI_CWND, cd] = cwnd
        S.di[L.DI_SS, cd] = 1
        S.di[L.DI_NEXT_CC, cd] = 1
        S.di[L.DI_NEXT_CWND, cd] = (cwnd + inc // 2) // inc


@njit(cache=True)
def fc_on_new_consensus(D, node, values):
    """A new consensus reaches ``node``: the values (``L.C_*`` order) apply to circuits built later.
    (Called from Python: ``D`` as for ``engine.run_kernel``.)"""
    S = L.state_from(D)
    for f in range(L.N_CC):
        S.ncc[node, f] = values[f]


def cc_alg_in_use(cc_alg: int) -> int:
    """§13.2: only 0 (fixed SENDME windows) and 2 (Vegas) are accepted; other values become 2."""
    return 0 if cc_alg == 0 else 2


def timestamp_capacity(sendme_inc: int, ss_max: int) -> int:
    """Send timestamps a Vegas direction can have outstanding: at most ss_max cells in flight."""
    return (2 * ss_max) // sendme_inc + 8
