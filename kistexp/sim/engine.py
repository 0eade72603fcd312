"""The compiled event loop: cell arrivals, edges (packaging and delivery), and event dispatch.

``run_kernel(S)`` processes events in (time, sequence) order until the next event lies past
``G_END``, or until the cell pool or the event heap needs to grow (it then returns a status and
the Python driver grows the arrays and calls it again: the state is entirely in ``S``).
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import flowcontrol as fc
from kistexp.sim import layout as L
from kistexp.sim.cmux_ewma import ewma_activate
from kistexp.sim.events import (
    cell_alloc,
    cell_free,
    cell_list_push,
    ev_next,
    ev_push,
    prefetch_row,
    record_delay,
)
from kistexp.sim.kist import kist_loop_woke, kist_on_new_consensus
from kistexp.sim.scheduler import has_waiting_cells, run_scheduler, wants_writes
from kistexp.sim.tcp import _track_peaks, on_ack, on_ack_now, on_delack, rcv_read, rcv_segments, write_to_kernel

PREFETCH_AHEAD = 8


@njit(cache=True, inline="always")
def append_cell(S, q, k, t):
    """``append_cell_to_circuit_queue`` (§4 step 2): queue, activate in EWMA, wake the scheduler.

    The caller raises the node's queued-bytes peaks (``_track_peaks``) after its batch of
    appends: within one (an arriving flight, a packaging pass) the node's queued bytes only
    grow, so the peak after the last append is the batch's peak."""
    S.cells[k].cq = q
    S.cells[k].t_enq = t
    cell_list_push(S, S.qi, L.QI_HEAD, L.QI_TAIL, q, k)
    n = S.qi[L.QI_N, q] + 1
    S.qi[L.QI_N, q] = n
    c = S.qi[L.QI_CHAN, q]
    node = S.ci[L.CI_NODE, c]
    S.ni[L.NI_APP_BYTES, node] += L.CELL_SIZE  # its peaks: by the caller, once per batch
    if n > S.pi[L.P_QCAP]:
        S.g[L.G_QCAP_EXCEEDED] += 1
    if n == 1:
        ewma_activate(S, q)
    has_waiting_cells(S, c, t)


@njit(cache=True, inline="always")
def _originate(S, cd, node):
    """Crypto work of a relay cell originated at an edge: all layers at the client, one at the exit."""
    if S.di[L.DI_DIR, cd] == 0:
        S.ni[L.NI_CRYPTO, node] += S.di[L.DI_HOPS, cd]
    else:
        S.ni[L.NI_CRYPTO, node] += 1
    S.ni[L.NI_DIGESTS, node] += 1


@njit(cache=True, inline="always")
def _ready_add(S, cd, s):
    if S.si[s].inready == 1:
        return
    S.si[s].inready = 1
    S.si[s].next = -1
    tail = S.di[L.DI_READY_TAIL, cd]
    if tail < 0:
        S.di[L.DI_READY_HEAD, cd] = s
    else:
        S.si[tail].next = s
    S.di[L.DI_READY_TAIL, cd] = s


@njit(cache=True, inline="always")
def _ready_pop(S, cd):
    s = S.di[L.DI_READY_HEAD, cd]
    nxt = S.si[s].next
    S.di[L.DI_READY_HEAD, cd] = nxt
    if nxt < 0:
        S.di[L.DI_READY_TAIL, cd] = -1
    S.si[s].inready = 0
    S.si[s].next = -1
    return s


@njit(cache=True, inline="always")
def _resume(S, cd, t):
    if S.di[L.DI_RESUME_EV, cd] == 0:
        S.di[L.DI_RESUME_EV, cd] = 1
        ev_push(S, t, L.EV_RESUME, cd, 0, 0)


@njit(cache=True, inline="always")
def _package_cell(S, cd, s, q, node, t):
    """One DATA cell of stream ``s`` packaged onto its circuit's queue ``q`` at the source edge."""
    k = cell_alloc(S)
    S.cells[k].kind = L.K_DATA
    S.cells[k].stream = s
    fc.on_package(S, cd, s, t)
    S.si[s].topkg -= 1
    _originate(S, cd, node)
    S.di[L.DI_PACKAGED, cd] += 1
    unacked = fc.unacked(S, cd)
    if unacked > S.di[L.DI_MAX_INFLIGHT, cd]:
        S.di[L.DI_MAX_INFLIGHT, cd] = unacked
    append_cell(S, q, k, t)


@njit(cache=True, inline="always")
def _ready_count(S, cd):
    """Streams in ``cd``'s ready list."""
    n = 0
    s = S.di[L.DI_READY_HEAD, cd]
    while s >= 0:
        n += 1
        s = S.si[s].next
    return n


@njit(cache=True, inline="always")
def _package_inbuf(S, cd, s, q, node, high, most, t):
    """Package up to ``most`` cells from stream ``s``'s inbuf while the windows allow and the
    circuit queue is below ``high`` (``connection_edge_package_raw_inbuf``); returns how many."""
    r = S.si[s]
    m = 0
    while (m < most and r.inbuf > 0 and S.qi[L.QI_N, q] < high and fc.circ_window(S, cd) > 0
           and fc.stream_window(S, s) > 0):
        _package_cell(S, cd, s, q, node, t)
        r.inbuf -= 1
        m += 1
    return m


@njit(cache=True, inline="always")
def _packaged(S, cd, q, node):
    """After packaging: the node's peaks, and the streams blocked at ``cellq_high`` (§4)."""
    _track_peaks(S, node)
    if S.qi[L.QI_N, q] >= S.pi[L.P_CELLQ_HIGH]:
        S.di[L.DI_BLOCKED, cd] = 1


@njit(cache=True, inline="always")
def _exit_reads(S, cd):
    """Whether ``cd``'s source edge is an exit reading its streams' servers by bucket shares
    (``FlowControlConfig.exit_read_cells``), with inbufs between the reads and the packaging."""
    return S.di[L.DI_DIR, cd] == 1 and S.pi[L.P_EXIT_READ] > 0


@njit(cache=True)
def package(S, cd, t):
    """Edge packaging (§4): one pass of the source's event loop over the ready streams.

    At an exit (``_exit_reads``) each ready stream's connection gets one read callback in the
    pass (``connection_handle_read``): it reads at most ``P_EXIT_READ`` cells' payload from its
    server into the connection's inbuf (``connection_bucket_read_limit``: 32 * RELAY_PAYLOAD_SIZE,
    core/mainloop/connection.c), then packages from the inbuf while the windows allow and the
    circuit queue is below ``cellq_high`` (``connection_edge_package_raw_inbuf``, core/or/relay.c);
    what the windows leave stays in the inbuf for the next SENDME (``_package_inbufs``).  Once the
    circuit's window is empty, reading stops on all its streams (``circuit_consider_stop_edge_
    reading``) and the callbacks still due in this pass do not run.  Streams with data left read
    again in the next pass, after what this one set going (a scheduler run the first cells made
    active runs before it, §5.2).  Elsewhere (requests from the client): everything the windows
    allow at once.
    """
    if S.di[L.DI_BLOCKED, cd] == 1:
        return
    q = S.di[L.DI_SRC_CQ, cd]
    node = S.di[L.DI_SRC_NODE, cd]
    high = S.pi[L.P_CELLQ_HIGH]
    if _exit_reads(S, cd):
        share = S.pi[L.P_EXIT_READ]
        for _ in range(_ready_count(S, cd)):
            if S.qi[L.QI_N, q] >= high or fc.circ_window(S, cd) <= 0:
                break
            s = _ready_pop(S, cd)
            if fc.stream_window(S, s) <= 0:
                continue  # reading stopped; back in the ready list when its stream SENDME arrives
            r = S.si[s]
            r.inbuf = min(r.topkg, r.inbuf + share)
            _package_inbuf(S, cd, s, q, node, high, r.inbuf, t)
            if r.topkg > 0:
                _ready_add(S, cd, s)
        if S.di[L.DI_READY_HEAD, cd] >= 0 and S.qi[L.QI_N, q] < high and fc.circ_window(S, cd) > 0:
            _resume(S, cd, t)
    else:
        while S.di[L.DI_READY_HEAD, cd] >= 0:
            if S.qi[L.QI_N, q] >= high:
                break
            if fc.circ_window(S, cd) <= 0:
                break
            s = _ready_pop(S, cd)
            if fc.stream_window(S, s) <= 0:
                continue  # back in the ready list when its stream SENDME arrives
            _package_cell(S, cd, s, q, node, t)
            if S.si[s].topkg > 0:
                _ready_add(S, cd, s)
    _packaged(S, cd, q, node)


@njit(cache=True, inline="always")
def _inbuf_ready(S, s, only):
    """Stream ``s`` has inbuf cells a SENDME may package (``only``: that stream alone, if >= 0)."""
    return (only < 0 or s == only) and S.si[s].inbuf > 0 and fc.stream_window(S, s) > 0


@njit(cache=True)
def _package_inbufs(S, cd, only, t):
    """A SENDME opened ``cd``'s window at an exit: package what the streams' inbufs already hold,
    in this pass, before any new read.  A circuit SENDME (``only`` < 0): ``circuit_resume_edge_
    reading_helper`` (core/or/relay.c), unless the queue is blocked: up to min(window,
    cellq_high - queue) cells, shared out as ceil(max / n) per stream with inbuf data, again over
    the streams that used their whole share.  A stream SENDME: that stream's inbuf
    (``connection_edge_package_raw_inbuf`` from ``sendme_process_stream_level``)."""
    if S.di[L.DI_BLOCKED, cd] == 1:
        return
    q = S.di[L.DI_SRC_CQ, cd]
    node = S.di[L.DI_SRC_NODE, cd]
    high = S.pi[L.P_CELLQ_HIGH]
    most = min(fc.circ_window(S, cd), high - S.qi[L.QI_N, q])
    moved = False
    while most > 0:
        npk = 0
        s = S.di[L.DI_READY_HEAD, cd]
        while s >= 0:
            if _inbuf_ready(S, s, only):
                npk += 1
            s = S.si[s].next
        if npk == 0:
            break
        per = (most + npk - 1) // npk
        done = 0
        left = 0
        s = S.di[L.DI_READY_HEAD, cd]
        while s >= 0:
            if _inbuf_ready(S, s, only):
                m = _package_inbuf(S, cd, s, q, node, high, per, t)
                done += m
                if m == per:
                    left += 1
            s = S.si[s].next
        if done > 0:
            moved = True
        if done == 0 or done >= most or left == 0:
            break
        most -= done
    if not moved:
        return
    # a stream whose last cells came from its inbuf leaves the ready list
    for _ in range(_ready_count(S, cd)):
        s = _ready_pop(S, cd)
        if S.si[s].topkg > 0:
            _ready_add(S, cd, s)
    _packaged(S, cd, q, node)


@njit(cache=True)
def _send_sendme(S, cd, kind, s, node, t):
    """Queue a SENDME for data direction ``cd`` at its sink, toward its source (§15 rule 9)."""
    k = cell_alloc(S)
    S.cells[k].kind = kind
    S.cells[k].stream = s
    _originate(S, cd ^ 1, node)
    append_cell(S, S.di[L.DI_REV_CQ, cd], k, t)
    _track_peaks(S, node)


@njit(cache=True)
def deliver_edge(S, k, q, node, t):
    """A cell reached the end of its path."""
    cd = S.qi[L.QI_CD, q]
    kind = S.cells[k].kind
    s = S.cells[k].stream
    if S.di[L.DI_DIR, cd] == 1:
        S.ni[L.NI_CRYPTO, node] += S.di[L.DI_HOPS, cd]
    else:
        S.ni[L.NI_CRYPTO, node] += 1
    S.ni[L.NI_DIGESTS, node] += 1
    if kind == L.K_DATA:
        S.di[L.DI_DELIVERED, cd] += 1
        d = S.si[s].delivered + 1
        S.si[s].delivered = d
        tr = S.pair_tr[s >> 1]  # streams 2 p and 2 p + 1 are pair p's request and response
        if S.di[L.DI_DIR, cd] == 0:
            if d == S.si[s].total:
                rcd = cd ^ 1
                _ready_add(S, rcd, s ^ 1)
                _resume(S, rcd, t)
        else:
            if d == 1:
                S.ti[L.TI_TTFB, tr] = t
            if d == S.si[s].total:
                S.ti[L.TI_TTLB, tr] = t
        emit = fc.on_deliver(S, cd, s)
        if emit & fc.EMIT_CIRC:
            _send_sendme(S, cd, L.K_SENDME_CIRC, -1, node, t)
        if emit & fc.EMIT_STREAM:
            _send_sendme(S, cd, L.K_SENDME_STREAM, s, node, t)
        if S.pi[L.P_EDGE_WRITE] > 0 and S.di[L.DI_FC, cd] == fc.FC_SENDME:
            # the payload waits in the edge connection's outbuf for the next pass's write
            # (connection_buf_add); the stream SENDME owed goes now only if that outbuf is short
            S.si[s].ob += L.RELAY_PAYLOAD
            _consider_stream_sendmes(S, s, node, t)
            if S.si[s].wev == 0:
                S.si[s].wev = 1
                _edge_write_later(S, s, node, t, False)
        if S.di[L.DI_DIR, cd] == 1 and d == S.si[s].total:
            _pair_done(S, s >> 1)
    else:
        # a SENDME travelling in direction cd acknowledges data of the opposite direction
        dcd = cd ^ 1
        fc.on_sendme(S, dcd, kind, s, t)
        if kind == L.K_SENDME_STREAM and S.si[s].topkg > 0:
            _ready_add(S, dcd, s)
        if _exit_reads(S, dcd):
            _package_inbufs(S, dcd, s if kind == L.K_SENDME_STREAM else -1, t)
        _resume(S, dcd, t)


@njit(cache=True, inline="always")
def _consider_stream_sendmes(S, s, node, t):
    """Send the stream SENDMEs ``s`` owes unless its edge outbuf is full (fc.stream_sendmes_due),
    counting a check that holds one."""
    n = fc.stream_sendmes_due(S, s)
    if n < 0:
        S.ni[L.NI_SENDMES_HELD, node] += 1
    for _ in range(n):
        _send_sendme(S, S.si[s].cd, L.K_SENDME_STREAM, s, node, t)


@njit(cache=True, inline="always")
def _edge_write_later(S, s, node, t, again):
    """Queue the edge connection's write callback.  The first after a read runs in the same
    pass, right after that read's cells (``again`` False: connection_start_writing, and the
    socket toward a local application is writable at once); one for what a write left behind
    runs in a later pass, after the reads the node's CPU is already busy with."""
    when = t
    if again and S.ni[L.NI_CPU_FREE, node] > t:
        when = S.ni[L.NI_CPU_FREE, node]
    g = S.g
    if (not again and g[L.G_EW_STREAM] < 0 and g[L.G_NQ_N] == 0 and (g[L.G_EVN] == 0 or S.ev[0, L.E_T] > t)
            and (g[L.G_TQ_N] == 0 or S.ni[L.NI_TIMER_AT, S.tq[0]] > t)):
        # nothing else is due at t: the write would be the very next event, so it runs at the end
        # of this one (_run_kernel) without a trip through the event queue; same order, same result
        g[L.G_EW_STREAM] = s
        g[L.G_EW_NODE] = node
        return
    ev_push(S, when, L.EV_EDGE_WRITE, s, node, 0)


@njit(cache=True)
def on_edge_write(S, s, node, t):
    """An edge connection's write callback toward its application: at most the write share
    (``connection_bucket_write_limit``: 32 * RELAY_PAYLOAD_SIZE a callback on a rate-limited
    connection, and CountPrivateBandwidth makes loopback ones so), then
    ``connection_edge_flushed_some`` -> ``sendme_connection_edge_consider_sending``."""
    S.si[s].wev = 0
    ob = S.si[s].ob
    w = S.pi[L.P_EDGE_WRITE] * L.RELAY_PAYLOAD
    ob = ob - w if ob > w else 0
    S.si[s].ob = ob
    _consider_stream_sendmes(S, s, node, t)
    if ob > 0:
        S.si[s].wev = 1
        _edge_write_later(S, s, node, t, True)


@njit(cache=True, inline="always")
def _edge_write_event(S, s, node, t):
    """``EV_EDGE_WRITE``, queued or run at the end of the event that made it: the write, then the
    loop's wake-up (a no-op for a write in the pass of the read before it)."""
    on_edge_write(S, s, node, t)
    kist_loop_woke(S, node, t)


@njit(cache=True)
def on_arrival(S, c, upto, leave, t):
    """A flight reached the peer: hand every complete cell to the relay layer (§4 steps 1-2)."""
    node = S.ci[L.CI_PEER, c]
    nkq = S.ci[L.CI_KQ_N, c]
    # the kernel queue is the byte stream's tail: its last cell ends at write_seq
    head_end = S.ci[L.CI_WRITE_SEQ, c] - (nkq - 1) * L.CELL_SIZE
    if nkq == 0 or upto < head_end:
        return
    n = min(nkq, (upto - head_end) // L.CELL_SIZE + 1)
    base = S.ci[L.CI_KQ_BASE, c]
    cap = S.ci[L.CI_KQ_CAP, c]
    pos = S.ci[L.CI_KQ_POS, c]
    # the cells of a flight lie anywhere in the pool: ask for the first ones at once, then for
    # one PREFETCH_AHEAD cells ahead of the one being processed
    for i in range(min(n, PREFETCH_AHEAD)):
        j = pos + i
        if j >= cap:
            j -= cap
        prefetch_row(S.cells, S.kq[base + j])
    for i in range(n):
        j = pos + i
        if j >= cap:
            j -= cap
        k = S.kq[base + j]
        if i + PREFETCH_AHEAD < n:
            j += PREFETCH_AHEAD
            if j >= cap:
                j -= cap
            prefetch_row(S.cells, S.kq[base + j])
        q = S.cells[k].cq
        record_delay(S, 1, q, leave - S.cells[k].t_kern)
        nq = S.qi[L.QI_NEXTQ, q]
        if nq >= 0:
            S.ni[L.NI_CRYPTO, node] += 1
            append_cell(S, nq, k, t)
        else:
            deliver_edge(S, k, q, node, t)
            cell_free(S, k)
    left = nkq - n
    S.ci[L.CI_KQ_N, c] = left
    pos += n
    if pos >= cap:
        pos -= cap
    S.ci[L.CI_KQ_POS, c] = pos if left > 0 else 0  # an empty ring restarts at its first slot
    S.ni[L.NI_CELLS_RECV, node] += n
    _track_peaks(S, node)


@njit(cache=True)
def on_write_ready(S, c, t):
    """The connection's write event: one write call; below orconn_low, ``wants_writes`` (§2, §9)."""
    S.ci[L.CI_WRITE_EV, c] = 0
    if S.ci[L.CI_OB_BYTES, c] > 0 and write_to_kernel(S, c, t):
        wants_writes(S, c, t)


@njit(cache=True, inline="always")
def _pair_done(S, p):
    """Pair ``p``'s answer has arrived: an interactive exchange's pair goes back to the pool.  Only
    when neither stream reached a stream-SENDME increment: no SENDME for it can still be on its
    way (one is sent per P_STREAM_INC cells delivered, flowcontrol.on_deliver)."""
    if (p >= S.g[L.G_NREG] and S.si[2 * p].total < S.pi[L.P_STREAM_INC]
            and S.si[2 * p + 1].total < S.pi[L.P_STREAM_INC]):
        n = S.g[L.G_PFREE_N]
        S.pfree[n] = p
        S.g[L.G_PFREE_N] = n + 1


@njit(cache=True)
def _start_transfer(S, tr, p, flow, t):
    if p < 0:
        # an interactive exchange: a pair from the pool, streams as the flow says
        n = S.g[L.G_PFREE_N] - 1
        S.g[L.G_PFREE_N] = n
        p = S.pfree[n]
        S.pair_tr[p] = tr
        circ = S.fl[L.FL_CIRC, flow]
        for d in range(2):
            r = S.si[2 * p + d]
            r.cd = 2 * circ + d
            r.total = S.fl[L.FL_REQ + d, flow]
            r.topkg = r.total
            r.delivered = 0
            r.pkg_win = S.pi[L.P_STREAM_WINDOW]
            r.deliv_win = S.pi[L.P_STREAM_WINDOW]
            r.next = -1
            r.inready = 0
            r.ob = 0  # a write still pending (wev) finds nothing left to write
            r.inbuf = 0
    s = 2 * p
    cd = S.si[s].cd
    if S.di[L.DI_BUILT, cd] == 0:
        fc.circuit_build(S, cd // 2)
    _ready_add(S, cd, s)
    package(S, cd, t)


@njit(cache=True, inline="always")
def _flow_before(S, f, h):
    """Flow ``f``'s next exchange starts before flow ``h``'s: by (start, transfer id), the order of a
    stable sort of all transfers by start time."""
    a = S.fl[L.FL_FIRST_TR, f] + S.fl[L.FL_K, f]
    b = S.fl[L.FL_FIRST_TR, h] + S.fl[L.FL_K, h]
    ta = S.ti[L.TI_START, a]
    tb = S.ti[L.TI_START, b]
    return ta < tb or (ta == tb and a < b)


@njit(cache=True)
def _flow_sift_down(S):
    """Restore the heap order of ``S.flheap`` after its root's next exchange moved later."""
    h = S.flheap
    n = S.g[L.G_FLH_N]
    f = h[0]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _flow_before(S, h[c + 1], h[c]):
            c += 1
        if not _flow_before(S, h[c], f):
            break
        h[i] = h[c]
        i = c
    h[i] = f


@njit(cache=True)
def push_next_start(S):
    """Schedule the next transfer to start: one start event at a time, in (start, transfer id)
    order, merging the regular transfers (``S.tr_order``) with the interactive flows' next
    exchanges (a heap of flows, ``S.flheap``)."""
    g = S.g
    nxt = g[L.G_NEXT_TR]
    j = -1
    tr = -1
    t = 0
    if nxt < S.tr_order.shape[0]:
        j = S.tr_order[nxt]
        tr = S.pair_tr[j]
        t = S.ti[L.TI_START, tr]
    if g[L.G_FLH_N] > 0:
        f = S.flheap[0]
        k = S.fl[L.FL_K, f]
        x = S.fl[L.FL_FIRST_TR, f] + k
        tx = S.ti[L.TI_START, x]
        if tr < 0 or tx < t or (tx == t and x < tr):
            if k + 1 < S.fl[L.FL_N, f]:
                S.fl[L.FL_K, f] = k + 1
            else:
                n = g[L.G_FLH_N] - 1
                g[L.G_FLH_N] = n
                S.flheap[0] = S.flheap[n]
            if g[L.G_FLH_N] > 0:
                _flow_sift_down(S)
            ev_push(S, tx, L.EV_START, x, -1, f)
            return
    if tr >= 0:
        g[L.G_NEXT_TR] = nxt + 1
        ev_push(S, t, L.EV_START, tr, j, -1)


@njit(cache=True)
def push_next_start_entry(D):
    """``push_next_start`` called from Python (``D`` as for ``run_kernel``): the first start."""
    push_next_start(L.state_from(D))


#: (series, node field) pairs sampled into ``S.ser_node`` (the peaks since the previous sample last)
SAMPLED_NODE_FIELDS = (
    (L.NS_RUNS, L.NI_RUNS), (L.NS_SYSCALLS, L.NI_SYSCALLS), (L.NS_CELLS_SENT, L.NI_CELLS_SENT),
    (L.NS_WRITES, L.NI_WRITES), (L.NS_APP_BYTES, L.NI_APP_BYTES), (L.NS_KERN_BYTES, L.NI_KERN_BYTES),
    (L.NS_CELLS_RECV, L.NI_CELLS_RECV), (L.NS_CRYPTO, L.NI_CRYPTO), (L.NS_DIGESTS, L.NI_DIGESTS),
    (L.NS_BYTES_WRITTEN, L.NI_BYTES_WRITTEN), (L.NS_PEAK_APP, L.NI_WPEAK_APP),
    (L.NS_PEAK_KERN, L.NI_WPEAK_KERN), (L.NS_PEAK_TOTAL, L.NI_WPEAK_TOTAL),
)


@njit(cache=True)
def _sample(S):
    i = S.g[L.G_SAMPLE]
    if i >= S.ser_chan.shape[0]:
        return
    for c in range(S.ci.shape[1]):
        S.ser_chan[i, c] = S.ci[L.CI_BYTES_SENT, c]
    for n in range(S.ni.shape[1]):
        for f, src in SAMPLED_NODE_FIELDS:
            S.ser_node[f, i, n] = S.ni[src, n]
        # the peaks since the previous sample; the next interval starts from the present level
        for j in range(3):
            S.ni[L.NI_WPEAK_APP + j, n] = 0
        _track_peaks(S, n)
    h = S.hist
    for k in range(h.shape[0]):
        for lbl in range(h.shape[1]):
            for b in range(h.shape[2]):
                S.ser_hist[i, k, lbl, b] = h[k, lbl, b]
    S.g[L.G_SAMPLE] = i + 1


@njit(cache=True)
def run_kernel(D):
    """Entry from Python: ``D`` is ``layout.descriptor(S)`` of the caller's state."""
    return _run_kernel(L.state_from(D))


@njit(cache=True)
def run_kernel_lean(D):
    """``run_kernel`` compiled without the raw-delay and trace bookkeeping (``layout.is_lean``)."""
    return _run_kernel(L.lean_state_from(D))


@njit(cache=True)
def _run_kernel(S):
    g = S.g
    while True:
        if g[L.G_NFREE] < g[L.G_CELL_RESERVE]:
            return L.RS_GROW_CELLS
        if (g[L.G_EVN] + g[L.G_EV_RESERVE] >= S.ev.shape[0] - 1
                or g[L.G_NQ_N] + g[L.G_EV_RESERVE] >= S.nq.shape[0]
                or g[L.G_EQ_NFREE] <= g[L.G_EV_RESERVE]):
            return L.RS_GROW_EVENTS
        if g[L.G_PFREE_N] == 0 and S.fl.shape[1] > 0:
            return L.RS_GROW_STREAMS  # an exchange about to start needs a stream pair
        # an event moves at most every cell of the pool into kernel queues; rings that fill double
        # (tcp.kq_push), taking at most four slots per cell at the end of S.kq
        if g[L.G_KQ_END] + L.KQ_SLOTS_PER_CELL * S.free.shape[0] + L.KQ_SLACK > S.kq.shape[0]:
            return L.RS_GROW_KQ
        arr, row = ev_next(S)
        if row < 0:
            break
        t = arr[row, L.E_T]
        kind = arr[row, L.E_KIND]
        a = arr[row, L.E_A]
        b = arr[row, L.E_B]
        c = arr[row, L.E_C]
        g[L.G_NOW] = t
        g[L.G_EVENTS] += 1
        if kind == L.EV_ARRIVAL:
            rcv_segments(S, a, b, t)
            node = S.ci[L.CI_PEER, a]
            cost = S.ni[L.NI_CELL_CPU_NS, node]
            if cost > 0:
                # the node's event loop reads and processes the flight when its CPU is free
                # cells end at multiples of 514 in the socket's byte stream
                first = S.ci[L.CI_ARR_SEQ, a] // L.CELL_SIZE
                ncells = b // L.CELL_SIZE - first
                S.ci[L.CI_ARR_SEQ, a] = b
                start = max(t, S.ni[L.NI_CPU_FREE, node])
                share = S.pi[L.P_READ_SHARE]
                if share > 0 and S.ci[L.CI_RATE_LIMITED, a] == 1:
                    # RunConfig.read_share: one read callback takes at most a bucket share
                    # (connection_bucket_read_limit, 32 cells) ...; the rest waits for the loop's
                    # next pass, after what this one set going
                    pos = first * L.CELL_SIZE
                    while True:
                        # ... and the rest of the TLS record that share ends in ("This *can* take
                        # us over our read allotment", connection_buf_read_from_socket): records
                        # taken as TLS_RECORD_BYTES pieces of the byte stream
                        lim = pos + share * L.CELL_SIZE
                        lim = (lim + L.TLS_RECORD_BYTES - 1) // L.TLS_RECORD_BYTES * L.TLS_RECORD_BYTES
                        k = lim // L.CELL_SIZE - first
                        if k >= ncells:
                            break
                        pos = (first + k) * L.CELL_SIZE
                        ev_push(S, start + k * cost, L.EV_DELIVER, a, pos, c)
                done = start + ncells * cost
                S.ni[L.NI_CPU_FREE, node] = done
                ev_push(S, done, L.EV_DELIVER, a, b, c)
            else:
                S.ni[L.NI_READS, node] += 1
                on_arrival(S, a, b, c, t)
                rcv_read(S, a, b, t)
                kist_loop_woke(S, node, t)
        elif kind == L.EV_DELIVER:
            node = S.ci[L.CI_PEER, a]
            S.ni[L.NI_READS, node] += 1
            on_arrival(S, a, b, c, t)
            rcv_read(S, a, b, t)
            kist_loop_woke(S, node, t)
        elif kind == L.EV_DELACK:
            on_delack(S, a, b, t)
        elif kind == L.EV_EDGE_WRITE:
            _edge_write_event(S, a, b, t)
        elif kind == L.EV_ACK_NOW:
            on_ack_now(S, a, t)
        elif kind == L.EV_ACK:
            on_ack(S, a, t, b, c)
        elif kind == L.EV_SCHED:
            run_scheduler(S, a, t)
        elif kind == L.EV_WRITE:
            on_write_ready(S, a, t)
            kist_loop_woke(S, S.ci[L.CI_NODE, a], t)
        elif kind == L.EV_RESUME:
            node = S.di[L.DI_SRC_NODE, a]
            if (b == 0 and _exit_reads(S, a) and S.ni[L.NI_TQ_IDX, node] >= 0
                    and S.ni[L.NI_TIMER_AT, node] <= t):
                # an exit's reads from its servers belong to the event loop's next pass: a
                # scheduler run due in this one (armed by this pass's wake-up, kist_loop_woke)
                # runs first, as libevent runs the timers that expired with this pass's I/O
                # callbacks before it polls again (event_base_loop: timeout_process, then
                # event_process_active); the SENDME's pass packaged only the inbufs
                ev_push(S, t, L.EV_RESUME, a, 1, 0)
            else:
                S.di[L.DI_RESUME_EV, a] = 0
                package(S, a, t)
        elif kind == L.EV_START:
            _start_transfer(S, a, b, c, t)
            push_next_start(S)
        elif kind == L.EV_SAMPLE:
            _sample(S)
            if g[L.G_SAMPLE] < S.ser_chan.shape[0]:
                ev_push(S, t + g[L.G_SAMPLE_NS], L.EV_SAMPLE, 0, 0, 0)
        elif kind == L.EV_INTERVAL:
            # §5.1: the new interval is read at the next schedule(); an armed timer keeps its deadline
            kist_on_new_consensus(S, a, b)
            i = g[L.G_NEXT_CHG]
            g[L.G_NEXT_CHG] = i + 1
            if i + 1 < S.chg.shape[1]:
                ev_push(S, S.chg[0, i + 1], L.EV_INTERVAL, S.chg[1, i + 1], S.chg[2, i + 1], 0)
        while g[L.G_EW_STREAM] >= 0:  # an edge write due next (_edge_write_later), as its EV_EDGE_WRITE
            s = g[L.G_EW_STREAM]
            g[L.G_EW_STREAM] = -1
            g[L.G_EVENTS] += 1
            _edge_write_event(S, s, g[L.G_EW_NODE], t)
    return L.RS_DONE
