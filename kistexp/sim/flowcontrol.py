"""End-to-end flow control at the circuit edges (§13): legacy SENDME windows or Vegas.

Legacy (cc_alg 0, §13.1): the sender's circuit package window starts at ``circwindow`` (1000) and
a stream's at 500; the receiver sends a circuit SENDME each time its deliver window falls to
``circwindow - 100`` (then adds 100) and a stream SENDME at 450 (adds 50).  Only DATA cells count.

Vegas (cc_alg 2, §13.2, exit-path parameters of §14): package window ``cwnd - inflight``; the
receiver sends a SENDME every ``sendme_inc`` (31) DATA cells; the sender updates RTT, BDP and
cwnd on each SENDME (slow start on every SENDME, steady state once per ``CWND_UPDATE_RATE``).
Stream windows are not used (XON/XOFF never triggers: the edge applications read at once).

SENDMEs are ordinary cells that go through the schedulers (§15 rule 9); the engine queues them.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L

FC_SENDME = 0
FC_VEGAS = 1

EMIT_CIRC = 1
EMIT_STREAM = 2


@njit(cache=True, _nrt=False, inline="always")
def circ_window(S, cd):
    """Cells the circuit-direction may still package."""
    if S.g[L.G_FC_KIND] == FC_SENDME:
        return S.di[L.DI_PKG_WIN, cd]
    w = S.di[L.DI_CWND, cd] - S.di[L.DI_INFLIGHT, cd]
    return w if w > 0 else 0


@njit(cache=True, _nrt=False, inline="always")
def unacked(S, cd):
    """DATA cells packaged and not yet acknowledged by a SENDME: what the window bounds."""
    if S.g[L.G_FC_KIND] == FC_SENDME:
        return S.pi[L.P_CIRCWINDOW] - S.di[L.DI_PKG_WIN, cd]
    return S.di[L.DI_INFLIGHT, cd]


@njit(cache=True, _nrt=False, inline="always")
def stream_window(S, s):
    if S.g[L.G_FC_KIND] == FC_SENDME:
        return S.si[s, L.SI_PKG_WIN]
    return 1 << 40


@njit(cache=True, _nrt=False)
def on_package(S, cd, s, t):
    """A DATA cell was packaged at the source edge."""
    if S.g[L.G_FC_KIND] == FC_SENDME:
        S.di[L.DI_PKG_WIN, cd] -= 1
        S.si[s, L.SI_PKG_WIN] -= 1
    else:
        infl = S.di[L.DI_INFLIGHT, cd]
        if (infl + 1) % S.pi[L.P_SENDME_INC] == 0:
            cap = S.ts.shape[1]
            n = S.di[L.DI_TS_N, cd]
            if n < cap:
                S.ts[cd, (S.di[L.DI_TS_HEAD, cd] + n) % cap] = t
                S.di[L.DI_TS_N, cd] = n + 1
        S.di[L.DI_INFLIGHT, cd] = infl + 1


@njit(cache=True, _nrt=False)
def on_deliver(S, cd, s):
    """A DATA cell reached the sink edge; returns the SENDMEs to emit (EMIT_* bit mask)."""
    emit = 0
    if S.g[L.G_FC_KIND] == FC_SENDME:
        w = S.di[L.DI_DELIV_WIN, cd] - 1
        if w <= S.pi[L.P_CIRCWINDOW] - S.pi[L.P_CIRC_INC]:
            w += S.pi[L.P_CIRC_INC]
            emit |= EMIT_CIRC
        S.di[L.DI_DELIV_WIN, cd] = w
        sw = S.si[s, L.SI_DELIV_WIN] - 1
        if sw <= S.pi[L.P_STREAM_WINDOW] - S.pi[L.P_STREAM_INC]:
            sw += S.pi[L.P_STREAM_INC]
            emit |= EMIT_STREAM
        S.si[s, L.SI_DELIV_WIN] = sw
    else:
        r = S.di[L.DI_RECV, cd] + 1
        if r >= S.pi[L.P_SENDME_INC]:
            r = 0
            emit |= EMIT_CIRC
        S.di[L.DI_RECV, cd] = r
    return emit


@njit(cache=True, _nrt=False)
def on_sendme(S, cd, kind, s, t):
    """A SENDME for data direction ``cd`` reached the source edge."""
    S.di[L.DI_SENDMES_RECV, cd] += 1
    if S.g[L.G_FC_KIND] == FC_SENDME:
        if kind == L.K_SENDME_CIRC:
            S.di[L.DI_PKG_WIN, cd] += S.pi[L.P_CIRC_INC]
        else:
            S.si[s, L.SI_PKG_WIN] += S.pi[L.P_STREAM_INC]
    else:
        vegas_process_sendme(S, cd, t)


@njit(cache=True, _nrt=False, inline="always")
def _update_rate(S, cwnd, ss):
    if ss:
        return 1
    r = S.pi[L.P_CWND_INC_RATE] * S.pi[L.P_SENDME_INC]
    return (cwnd + r // 2) // r


@njit(cache=True, _nrt=False)
def vegas_process_sendme(S, cd, t):
    """``congestion_control_vegas_process_sendme``, in the order of §13.2 steps 1-8."""
    P = S.pi
    inc = P[L.P_SENDME_INC]
    cwnd = S.di[L.DI_CWND, cd]
    ss = S.di[L.DI_SS, cd] == 1
    inflight = S.di[L.DI_INFLIGHT, cd]
    rate = _update_rate(S, cwnd, ss)
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
            if ss:
                n = P[L.P_EWMA_SS]
            else:
                n = min(rate * P[L.P_EWMA_CWND_PCT] // 100, P[L.P_EWMA_MAX])
            n = max(n, 2)
            ewma = S.df[L.DF_EWMA_RTT, cd]
            ewma = rtt if ewma == 0.0 else (2.0 * rtt + (n - 1) * ewma) / (n + 1)
            S.df[L.DF_EWMA_RTT, cd] = ewma
            mn = S.df[L.DF_MIN_RTT, cd]
            if mn == 0.0 or ewma < mn:
                mn = ewma
            elif cwnd == P[L.P_CWND_MIN] and not ss:
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
    if inflight + P[L.P_FULL_GAP] * inc >= cwnd:
        S.di[L.DI_CWND_FULL, cd] = 1
    elif 100 * inflight < P[L.P_FULL_MINPCT] * cwnd:
        if P[L.P_FULL_PER_CWND] == 0 or S.di[L.DI_NEXT_CWND, cd] == 0:
            S.di[L.DI_CWND_FULL, cd] = 0
    if S.di[L.DI_NEXT_CWND, cd] == 0:
        S.di[L.DI_NEXT_CWND, cd] = max((cwnd + inc // 2) // inc, 1)
    full = S.di[L.DI_CWND_FULL, cd] == 1
    if ss:
        # 6. slow start, on every SENDME
        if queue_use < P[L.P_GAMMA] and not blocked:
            if full:
                if cwnd <= P[L.P_SSCAP]:
                    step = (P[L.P_CWND_INC_PCT_SS] * inc + 50) // 100
                else:
                    step = max(1, (inc * P[L.P_SSCAP] + cwnd) // (2 * cwnd))
                cwnd += step
                per_cwnd = max((cwnd + inc // 2) // inc, 1)
                if step * per_cwnd <= P[L.P_CWND_INC] * P[L.P_CWND_INC_RATE]:
                    ss = False
        else:
            cwnd = bdp + P[L.P_GAMMA]
            ss = False
        if cwnd >= P[L.P_SS_MAX]:
            cwnd = P[L.P_SS_MAX]
            ss = False
    elif S.di[L.DI_NEXT_CC, cd] == 0:
        # 7. steady state, once every CWND_UPDATE_RATE SENDMEs
        if queue_use > P[L.P_DELTA]:
            cwnd = bdp + P[L.P_DELTA] - P[L.P_CWND_INC]
        elif queue_use > P[L.P_BETA] or blocked:
            cwnd -= P[L.P_CWND_INC]
        elif full and queue_use < P[L.P_ALPHA]:
            cwnd += P[L.P_CWND_INC]
    cwnd = max(cwnd, P[L.P_CWND_MIN])
    if S.di[L.DI_NEXT_CC, cd] == 0:
        S.di[L.DI_NEXT_CC, cd] = _update_rate(S, cwnd, ss)
    S.di[L.DI_CWND, cd] = cwnd
    S.di[L.DI_SS, cd] = 1 if ss else 0
    # 8.
    S.di[L.DI_INFLIGHT, cd] = max(inflight - inc, 0)
