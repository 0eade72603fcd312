"""Compiled recorders of the circuit trace (``RunConfig.circuit_trace``): what an observer at a circuit's
guard and at its exit sees (the attacks of ``kistexp.anonymity`` read it).

Only code compiled for a run that keeps records calls them (``layout.keeps_records``): the lean kernel,
which runs every untraced run without raw delays, has none of this, so a run not asking for a trace
costs nothing and computes exactly what it did before.  The recorders only read the model's state and
write the trace's own arrays (``S.ctcnt``, ``S.ctcirc``, ``S.ctgap``, ``S.ctrtt``, ``S.ctts``, ``S.ctdt``;
``tcp.kq_push`` keeps ``S.ctkq``, each kernel-queue slot's ``S.ctq``, so that counting a flight reads
no cell record).

A flight within one window and block counts each run of consecutive cells of one circuit at once, the
gaps inside the run one serialisation time (``CELL_SIZE`` at the NIC's rate) each; a flight that
crosses a window or block boundary is counted cell by cell (``_cells_one_by_one``).

Cells are timed on the wire, when the sender's kernel puts them there (``tcp.tcp_send_upto``): a flight
leaves the NIC as one FIFO at the node's rate, so the cell ending ``b`` bytes before the flight's end
left ``b / rate`` before the flight's last byte (``leave``) and reached the peer that much before the
flight's arrival; a cell is counted in the flight that carries its last byte.  Every cell counts,
SENDMEs included: an observer of the TLS stream cannot tell them apart.  What the receiving node then
does with the cell (its CPU, its read shares) is not part of what the observer sees.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.events import hinted_bin


@njit(cache=True, inline="always")
def tracing(S):
    """Whether this run keeps a circuit trace (a constant False in the lean kernel)."""
    return L.keeps_records(S) and S.ctq.shape[0] > 0


@njit(cache=True, inline="always")
def _gap_bin(S, gap_ns):
    """The delay histograms' bin of ``gap_ns``, starting from the previous gap's bin (kept in
    ``S.ctdt[2]``), as gaps within a flight share one."""
    b = hinted_bin(S.hedge, S.ctdt[2], gap_ns)
    S.ctdt[2] = b
    return b


@njit(cache=True, inline="always")
def _count(S, series, i, w):
    if 0 <= w < S.ctcnt.shape[1]:
        S.ctcnt[series, w, i] += 1


@njit(cache=True, inline="always")
def _exit_departure(S, i, t, blk):
    """A cell of traced circuit ``i`` left its exit toward the middle at ``t`` (in block ``blk``): the
    gap to the one before."""
    last = S.ctcirc[L.CT_C_LAST, i]
    S.ctcirc[L.CT_C_LAST, i] = t
    if last >= 0 and 0 <= blk < S.ctgap.shape[0]:
        S.ctgap[blk, S.ctcirc[L.CT_C_SLOT, i], _gap_bin(S, t - last)] += 1


@njit(cache=True, inline="always")
def _slot_of(S, memo, t, t_first, unit):
    """``t // unit`` for the cells of one flight, ``t_first`` its first cell's time, or -1 when a cell
    crosses into the next window (block): the index of the last flight looked up this way (kept in
    ``S.ctdt[memo]``) when ``t`` is in it, as it mostly is (time moves on in small steps), else one
    division."""
    w = S.ctdt[memo]
    lo = w * unit
    if not lo <= t < lo + unit:
        w = t // unit
        S.ctdt[memo] = w
        lo = w * unit
    return w if t_first >= lo else -1


@njit(cache=True)
def trace_flight(S, c, first, end, leave, arr):
    """Chan ``c``'s flight of the bytes ``[first, end)`` of its stream left the NIC, its last byte at
    ``leave``, and reaches the peer at ``arr``: count its complete cells of traced circuits."""
    nkq = S.ci[L.CI_KQ_N, c]
    if nkq == 0:
        return
    head_end = S.ci[L.CI_WRITE_SEQ, c] - (nkq - 1) * L.CELL_SIZE  # where the queue's first cell ends
    if end < head_end:
        return
    i0 = 0 if first < head_end else (first - head_end) // L.CELL_SIZE + 1
    i1 = min(nkq - 1, (end - head_end) // L.CELL_SIZE)
    if i1 < i0:
        return
    # cell i's last byte left (end - head_end - i CELL_SIZE) / rate before the flight's last byte
    ns_per_byte = S.ctnspb[S.ci[L.CI_NODE, c]]
    per = L.CELL_SIZE * ns_per_byte
    back0 = (end - head_end) * ns_per_byte
    # the window (block) of every cell of the flight, when its first and last cells share it (else -1:
    # found per cell)
    first_back = int(back0 - i0 * per)
    wn = S.ctdt[0]
    wd = _slot_of(S, 4, leave, leave - first_back, wn)
    wa = _slot_of(S, 5, arr, arr - first_back, wn)
    bn = S.ctdt[1]
    bd = _slot_of(S, 6, leave, leave - first_back, bn)
    base = S.ci[L.CI_KQ_BASE, c]
    cap = S.ci[L.CI_KQ_CAP, c]
    pos = S.ci[L.CI_KQ_POS, c]
    if wd < 0 or wa < 0 or bd < 0:
        _cells_one_by_one(S, base, cap, pos, i0, i1, back0, per, leave, arr)
        return
    # the whole flight in one window and block: each run of consecutive cells of one circuit counts at
    # once, the gaps inside it one serialisation time each
    gap_bin = _gap_bin(S, int(round(per)))
    i = i0
    j = pos + i0
    if j >= cap:
        j -= cap
    while i <= i1:
        r = S.ctkq[base + j]  # the cell's S.ctq, kept beside its kernel-queue slot (tcp.kq_push)
        k = i + 1
        j += 1
        if j >= cap:
            j -= cap
        while k <= i1 and S.ctkq[base + j] == r:
            k += 1
            j += 1
            if j >= cap:
                j -= cap
        bits = r & ((1 << L.CT_IDX_SHIFT) - 1)
        if bits:
            idx = (r >> L.CT_IDX_SHIFT) - 1
            run = k - i
            for s in range(L.CT_SERIES):
                if bits & (1 << s):
                    w = wd if s == L.CT_EXIT_OUT_DOWN else wa
                    if w < S.ctcnt.shape[1]:
                        S.ctcnt[s, w, idx] += run
            if bits & L.CT_GAP:
                _exit_departure(S, idx, leave - int(back0 - i * per), bd)
                if run > 1:
                    S.ctcirc[L.CT_C_LAST, idx] = leave - int(back0 - (k - 1) * per)
                    if bd < S.ctgap.shape[0]:
                        S.ctgap[bd, S.ctcirc[L.CT_C_SLOT, idx], gap_bin] += run - 1
        i = k


@njit(cache=True)
def _cells_one_by_one(S, base, cap, pos, i0, i1, back0, per, leave, arr):
    """``trace_flight`` for a flight whose cells fall in more than one window or block."""
    wn = S.ctdt[0]
    bn = S.ctdt[1]
    for i in range(i0, i1 + 1):
        j = pos + i
        if j >= cap:
            j -= cap
        r = S.ctkq[base + j]
        bits = r & ((1 << L.CT_IDX_SHIFT) - 1)
        if bits == 0:
            continue
        idx = (r >> L.CT_IDX_SHIFT) - 1
        back = int(back0 - i * per)
        if bits & ((1 << L.CT_EXIT_OUT_DOWN) | L.CT_GAP):
            dep = leave - back
            if bits & (1 << L.CT_EXIT_OUT_DOWN):
                _count(S, L.CT_EXIT_OUT_DOWN, idx, dep // wn)
            if bits & L.CT_GAP:
                _exit_departure(S, idx, dep, dep // bn)
        rest = bits & ~((1 << L.CT_EXIT_OUT_DOWN) | L.CT_GAP)
        if rest:
            w = (arr - back) // wn
            for s in range(L.CT_SERIES):
                if rest & (1 << s):
                    _count(S, s, idx, w)


@njit(cache=True, inline="always")
def _traced_exit(S, cd):
    """The trace index of circuit-direction ``cd`` when it is a traced circuit's downstream direction
    (its source edge is the exit), else -1."""
    if S.di[L.DI_DIR, cd] != 1:
        return -1
    r = S.ctq[S.di[L.DI_SRC_CQ, cd]]
    return (r >> L.CT_IDX_SHIFT) - 1 if r != 0 else -1


@njit(cache=True, inline="always")
def trace_sendme_cell(S, cd, t):
    """A DATA cell of circuit-direction ``cd`` on fixed SENDME windows is about to be packaged at ``t``:
    if the sink will send a circuit SENDME for it (every ``circ_increment``-th, ``flowcontrol.on_deliver``)
    and this is a traced circuit's exit, remember when (the exit's RTT measurement, ``trace_sendme_acked``)."""
    if (S.di[L.DI_PACKAGED, cd] + 1) % S.pi[L.P_CIRC_INC] != 0:
        return
    i = _traced_exit(S, cd)
    if i < 0:
        return
    n = S.ctcirc[L.CT_C_TS_N, i]
    cap = S.ctts.shape[1]
    if n < cap:
        S.ctts[i, (S.ctcirc[L.CT_C_TS_HEAD, i] + n) % cap] = t
        S.ctcirc[L.CT_C_TS_N, i] = n + 1


@njit(cache=True)
def trace_sendme_acked(S, cd, t):
    """A circuit SENDME for data direction ``cd`` (fixed windows) reached its source at ``t``: the RTT
    of the oldest remembered cell, for a traced circuit's exit."""
    i = _traced_exit(S, cd)
    if i < 0:
        return
    n = S.ctcirc[L.CT_C_TS_N, i]
    if n == 0:
        return
    h = S.ctcirc[L.CT_C_TS_HEAD, i]
    sent = S.ctts[i, h]
    S.ctcirc[L.CT_C_TS_HEAD, i] = (h + 1) % S.ctts.shape[1]
    S.ctcirc[L.CT_C_TS_N, i] = n - 1
    if t > sent:
        trace_rtt(S, cd, t, float(t - sent))


@njit(cache=True)
def trace_rtt(S, cd, t, rtt_ns):
    """The source edge of circuit-direction ``cd`` took an RTT sample at ``t`` (Vegas, on a SENDME):
    kept for traced circuits' downstream direction, the exit's measurement of the circuit."""
    i = _traced_exit(S, cd)
    if i < 0:
        return
    blk = t // S.ctdt[1]
    if not 0 <= blk < S.ctrtt.shape[2]:
        return
    ms = rtt_ns / 1e6
    R = S.ctrtt
    R[L.CT_R_N, i, blk] += 1.0
    R[L.CT_R_SUM_MS, i, blk] += ms
    R[L.CT_R_SUMSQ_MS, i, blk] += ms * ms
    if ms < R[L.CT_R_MIN_MS, i, blk]:
        R[L.CT_R_MIN_MS, i, blk] = ms
