"""Compiled basics: the event queue (a 4-ary heap in arrays), the cell pool, the RNG, delay records.

Events are ordered by (time, sequence number): events at the same time run in the order they
were scheduled, which is how "later in the same libevent pass" is modelled (§5.2, §9).  Events
for the current instant go to a FIFO ring (``S.nq``) instead of the heap.  Each node's scheduler
event is one slot (``timer_arm``: tor's ``scheduler_ev_add`` reschedules its one event, it never
adds a second), kept in a small heap of nodes (``S.tq``) keyed by the slot's (time, sequence);
re-arming moves the slot.  ``ev_next`` merges the three by (time, sequence), so the order is
exactly that of a single heap.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kistexp.sim import layout as L


@njit(cache=True, inline="always")
def _set_event(arr, r, t, seq, kind, a, b, c):
    """Write an event's fields into row ``r`` of ``arr`` (the heap, the same-instant ring or a
    chan queue: all share the ``E_*`` field order)."""
    arr[r, L.E_T] = t
    arr[r, L.E_SEQ] = seq
    arr[r, L.E_KIND] = kind
    arr[r, L.E_A] = a
    arr[r, L.E_B] = b
    arr[r, L.E_C] = c


@njit(cache=True)
def ev_push(S, t, kind, a, b, c):
    g = S.g
    seq = g[L.G_SEQ]
    g[L.G_SEQ] = seq + 1
    if t == g[L.G_NOW]:
        nq = S.nq
        j = g[L.G_NQ_HEAD] + g[L.G_NQ_N]
        if j >= nq.shape[0]:
            j -= nq.shape[0]
        g[L.G_NQ_N] += 1
        _set_event(nq, j, t, seq, kind, a, b, c)
        return
    _heap_insert(S, t, seq, kind, a, b, c)


@njit(cache=True, inline="always")
def _heap_insert(S, t, seq, kind, a, b, c):
    ev = S.ev
    g = S.g
    i = g[L.G_EVN]
    g[L.G_EVN] = i + 1
    # sift up with a hole (a 4-ary heap: parent of i is (i - 1) // 4)
    while i > 0:
        p = (i - 1) >> 2
        pt = ev[p, L.E_T]
        if pt < t or (pt == t and ev[p, L.E_SEQ] < seq):
            break
        for f in range(L.N_EV):
            ev[i, f] = ev[p, f]
        i = p
    _set_event(ev, i, t, seq, kind, a, b, c)


@njit(cache=True)
def ev_push_chan(S, t, acks, c, b, x):
    """Schedule chan ``c``'s next arrival (``acks`` False) or ack (True) at ``t``, as ``ev_push``
    would, but keep the heap small: a chan's arrivals (and its acks) come in time order (its
    flights leave its NIC in order over a fixed delay), so only the earliest of each chan's is in
    the heap, as a representative, and the later ones wait in the chan's queue (``S.evq``) with
    the sequence numbers they were given now.  Popping the representative puts the queue's next
    event in the heap (``ev_next``), so events still run in exactly (time, sequence) order.  The
    heap then holds a few events per chan instead of every flight in flight (tens of thousands
    on bench case (a), each sift-down a chain of cache misses).  An event earlier than the
    queue's latest (not seen on lossless links) is an ordinary heap event."""
    g = S.g
    plain = L.EV_ACK if acks else L.EV_ARRIVAL
    if t == g[L.G_NOW]:
        ev_push(S, t, plain, c, b, x)
        return
    k = L.CI_EQ_STRIDE if acks else 0  # the ack queue's fields follow the arrival queue's
    if S.ci[L.CI_EQ_ON + k, c] == 0:
        S.ci[L.CI_EQ_ON + k, c] = 1
        S.ci[L.CI_EQ_LAST + k, c] = t
        ev_push(S, t, L.EV_ACK_REP if acks else L.EV_ARRIVAL_REP, c, b, x)
        return
    if t < S.ci[L.CI_EQ_LAST + k, c]:
        ev_push(S, t, plain, c, b, x)
        return
    S.ci[L.CI_EQ_LAST + k, c] = t
    seq = g[L.G_SEQ]
    g[L.G_SEQ] = seq + 1
    n = g[L.G_EQ_NFREE] - 1
    g[L.G_EQ_NFREE] = n
    r = S.eqfree[n]
    q = S.evq
    _set_event(q, r, t, seq, plain, c, b, x)
    q[r, L.EQ_NEXT] = -1
    tail = S.ci[L.CI_EQ_TAIL + k, c]
    if tail < 0:
        S.ci[L.CI_EQ_HEAD + k, c] = r
    else:
        q[tail, L.EQ_NEXT] = r
    S.ci[L.CI_EQ_TAIL + k, c] = r


@njit(cache=True, inline="always")
def _next_of_chan_queue(S, c, acks, r):
    """Take row ``r``, the head of chan ``c``'s arrival or ack queue, off the queue; returns it
    (the caller copies it before the row is reused)."""
    k = L.CI_EQ_STRIDE if acks else 0
    q = S.evq
    nxt = q[r, L.EQ_NEXT]
    S.ci[L.CI_EQ_HEAD + k, c] = nxt
    if nxt < 0:
        S.ci[L.CI_EQ_TAIL + k, c] = -1
    n = S.g[L.G_EQ_NFREE]
    S.eqfree[n] = r
    S.g[L.G_EQ_NFREE] = n + 1
    q[r, L.E_KIND] = L.EV_ACK_REP if acks else L.EV_ARRIVAL_REP  # it represents the queue now
    return r


@njit(cache=True)
def _replace_root(S, r):
    """Put chan-queue row ``r``'s event at the heap's root and sift it down."""
    q = S.evq
    i = _sift_hole(S, S.g[L.G_EVN], q[r, L.E_T], q[r, L.E_SEQ])
    for f in range(L.N_EV):
        S.ev[i, f] = q[r, f]


@njit(cache=True)
def ev_push_entry(D, t, kind, a, b, c):
    """``ev_push`` called from Python (``D`` as for ``engine.run_kernel``)."""
    ev_push(L.state_from(D), t, kind, a, b, c)


@njit(cache=True, inline="always")
def _sift_hole(S, n, t, seq):
    """Move the root's hole down the 4-ary heap of ``n`` events until an event keyed ``(t, seq)``
    fits there; returns the hole's row (the caller writes that event into it).  A node's four
    children are adjacent rows: half the levels of a binary heap."""
    ev = S.ev
    i = 0
    while True:
        c = 4 * i + 1
        if c >= n:
            break
        last = min(c + 4, n)
        ct = ev[c, L.E_T]
        cs = ev[c, L.E_SEQ]
        for j in range(c + 1, last):
            jt = ev[j, L.E_T]
            if jt < ct or (jt == ct and ev[j, L.E_SEQ] < cs):
                c = j
                ct = jt
                cs = ev[j, L.E_SEQ]
        if t < ct or (t == ct and seq < cs):
            break
        for f in range(L.N_EV):
            ev[i, f] = ev[c, f]
        i = c
    return i


@njit(cache=True)
def ev_pop(S):
    """Remove the root; its fields are copied to column ``cap - 1`` (kept free for this)."""
    ev = S.ev
    g = S.g
    cap = ev.shape[0]
    for f in range(L.N_EV):
        ev[cap - 1, f] = ev[0, f]
    n = g[L.G_EVN] - 1
    g[L.G_EVN] = n
    if n == 0:
        return
    i = _sift_hole(S, n, ev[n, L.E_T], ev[n, L.E_SEQ])
    if i != n:
        for f in range(L.N_EV):
            ev[i, f] = ev[n, f]


@njit(cache=True, inline="always")
def _timer_before(S, a, b):
    """Node ``a``'s slot comes before node ``b``'s: (time, sequence) order."""
    ta = S.ni[L.NI_TIMER_AT, a]
    tb = S.ni[L.NI_TIMER_AT, b]
    return ta < tb or (ta == tb and S.ni[L.NI_TIMER_SEQ, a] < S.ni[L.NI_TIMER_SEQ, b])


@njit(cache=True)
def _timer_sift(S, i):
    """Restore the heap order of ``S.tq`` around position ``i`` (its key moved either way)."""
    tq = S.tq
    n = S.g[L.G_TQ_N]
    node = tq[i]
    while i > 0:
        p = (i - 1) >> 1
        if not _timer_before(S, node, tq[p]):
            break
        tq[i] = tq[p]
        S.ni[L.NI_TQ_IDX, tq[i]] = i
        i = p
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _timer_before(S, tq[c + 1], tq[c]):
            c += 1
        if not _timer_before(S, tq[c], node):
            break
        tq[i] = tq[c]
        S.ni[L.NI_TQ_IDX, tq[i]] = i
        i = c
    tq[i] = node
    S.ni[L.NI_TQ_IDX, node] = i


@njit(cache=True)
def timer_arm(S, node, t):
    """Schedule ``node``'s scheduler event at ``t``, replacing an armed one (``scheduler_ev_add``)."""
    g = S.g
    S.ni[L.NI_TIMER_AT, node] = t
    S.ni[L.NI_TIMER_SEQ, node] = g[L.G_SEQ]
    g[L.G_SEQ] += 1
    i = S.ni[L.NI_TQ_IDX, node]
    if i < 0:
        i = g[L.G_TQ_N]
        g[L.G_TQ_N] = i + 1
        S.tq[i] = node
    _timer_sift(S, i)


@njit(cache=True, inline="always")
def _timer_pop(S):
    """Take the earliest slot out of ``S.tq``; returns its node."""
    tq = S.tq
    node = tq[0]
    S.ni[L.NI_TQ_IDX, node] = -1
    n = S.g[L.G_TQ_N] - 1
    S.g[L.G_TQ_N] = n
    if n > 0:
        tq[0] = tq[n]
        _timer_sift(S, 0)
    return node


@njit(cache=True, inline="always")
def _before(t, seq, arr, row):
    return t < arr[row, L.E_T] or (t == arr[row, L.E_T] and seq < arr[row, L.E_SEQ])


@njit(cache=True)
def ev_next(S):
    """Remove the next event unless it lies past ``G_END``; returns the array and row holding its
    fields (row -1: no event left at or before ``G_END``, and none was removed)."""
    g = S.g
    ev = S.ev
    end = g[L.G_END]
    scratch = ev.shape[0] - 1
    if g[L.G_TQ_N] > 0:
        node = S.tq[0]
        t = S.ni[L.NI_TIMER_AT, node]
        seq = S.ni[L.NI_TIMER_SEQ, node]
        if ((g[L.G_NQ_N] == 0 or _before(t, seq, S.nq, g[L.G_NQ_HEAD]))
                and (g[L.G_EVN] == 0 or _before(t, seq, ev, 0))):
            if t > end:
                return ev, -1
            _timer_pop(S)
            ev[scratch, L.E_T] = t
            ev[scratch, L.E_SEQ] = seq
            ev[scratch, L.E_KIND] = L.EV_SCHED
            ev[scratch, L.E_A] = node
            return ev, scratch
    if g[L.G_NQ_N] > 0:
        h = g[L.G_NQ_HEAD]
        nq = S.nq
        if g[L.G_EVN] == 0 or _before(nq[h, L.E_T], nq[h, L.E_SEQ], ev, 0):
            if nq[h, L.E_T] > end:
                return ev, -1
            n = g[L.G_NQ_N] - 1
            g[L.G_NQ_N] = n
            # an emptied ring starts again at its first row: the instant's events then stay in a
            # few cache lines instead of walking the whole ring
            g[L.G_NQ_HEAD] = 0 if n == 0 else (h + 1 if h + 1 < nq.shape[0] else 0)
            return nq, h
    if g[L.G_EVN] == 0 or ev[0, L.E_T] > end:
        return ev, -1
    k = ev[0, L.E_KIND]
    if k != L.EV_ARRIVAL_REP and k != L.EV_ACK_REP:
        ev_pop(S)
        _prefetch_root_queue(S)
        return ev, scratch
    # a chan queue's representative: it runs as the plain event, and the queue's next event
    # (if any) takes its place in the heap, replacing the root in one sift-down (events have
    # distinct (time, sequence) keys, so the heap's shape never decides an order)
    acks = k == L.EV_ACK_REP
    stride = L.CI_EQ_STRIDE if acks else 0
    c = ev[0, L.E_A]
    r = S.ci[L.CI_EQ_HEAD + stride, c]
    if r >= 0:
        for f in range(L.N_EV):
            ev[scratch, f] = ev[0, f]
        _replace_root(S, _next_of_chan_queue(S, c, acks, r))
    else:
        S.ci[L.CI_EQ_ON + stride, c] = 0
        ev_pop(S)
    ev[scratch, L.E_KIND] = L.EV_ACK if acks else L.EV_ARRIVAL
    _prefetch_root_queue(S)
    return ev, scratch


@njit(cache=True, inline="always")
def _prefetch_root_queue(S):
    """Ask for what the heap's new root will read first, while this event runs: the next row of the
    chan queue it represents (written a flight's delay ago, long out of the cache), or the first
    cell of the flight a delivery hands on."""
    if S.g[L.G_EVN] == 0:
        return
    k = S.ev[0, L.E_KIND]
    if k == L.EV_ARRIVAL_REP or k == L.EV_ACK_REP:
        r = S.ci[L.CI_EQ_HEAD + (L.CI_EQ_STRIDE if k == L.EV_ACK_REP else 0), S.ev[0, L.E_A]]
        if r >= 0:
            prefetch_row(S.evq, r)
    elif k == L.EV_DELIVER:
        # the first cells of the flight, whose delays on_arrival reads first
        c = S.ev[0, L.E_A]
        if S.ci[L.CI_KQ_N, c] > 0:
            j = S.ci[L.CI_KQ_BASE, c] + S.ci[L.CI_KQ_POS, c]
            prefetch_row(S.cells, S.kq[j])


@intrinsic
def _prefetch(typingctx, ptr, offset):
    """``llvm.prefetch`` (read, keep in all cache levels, data) of the byte ``offset`` past ``ptr``."""
    if not (isinstance(ptr, types.CPointer) and isinstance(offset, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.globals.get("llvm.prefetch.p0")
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(fn, [builder.gep(builder.bitcast(args[0], i8p), [args[1]]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.none(ptr, offset), codegen


@njit(cache=True, inline="always")
def prefetch_row(arr, row):
    """Hint the CPU to load element ``row`` of the C-contiguous array ``arr`` (its address from
    numba's documented ``ffi.from_buffer``; the hint itself is LLVM's prefetch intrinsic, worth
    about a fifth of the speed on bench case (a): the cells of a flight lie anywhere in the pool)."""
    _prefetch(L._FFI.from_buffer(arr), row * arr.strides[0])


@njit(cache=True, inline="always")
def cell_list_push(S, rows, head_f, tail_f, i, k):
    """Append cell ``k`` to the FIFO whose head and tail are ``rows[head_f, i]``, ``rows[tail_f, i]``
    (a circuit queue in ``S.qi`` or an outbuf in ``S.ci``), linked through the cells' ``next``."""
    S.cells[k].next = -1
    tail = rows[tail_f, i]
    if tail < 0:
        rows[head_f, i] = k
    else:
        S.cells[tail].next = k
    rows[tail_f, i] = k


@njit(cache=True, inline="always")
def cell_list_pop(S, rows, head_f, tail_f, i):
    """Take the head cell of that FIFO (it must not be empty); the new head is ``rows[head_f, i]``."""
    k = rows[head_f, i]
    nxt = S.cells[k].next
    rows[head_f, i] = nxt
    if nxt < 0:
        rows[tail_f, i] = -1
    return k


@njit(cache=True, inline="always")
def cell_alloc(S):
    """Take the most recently freed cell.  Free cells are a stack of ids (``S.free``), not a list
    threaded through the pool: finding the next free cell must not wait for a cold cache line."""
    g = S.g
    n = g[L.G_NFREE] - 1
    g[L.G_NFREE] = n
    k = S.free[n]
    S.cells[k].next = -1
    return k


@njit(cache=True, inline="always")
def cell_free(S, k):
    g = S.g
    n = g[L.G_NFREE]
    S.free[n] = k
    g[L.G_NFREE] = n + 1


@njit(cache=True, inline="always")
def rng_uniform(S):
    """64-bit LCG (Knuth's MMIX constants), top 52 bits: deterministic per seed."""
    x = S.g[L.G_RNG] * 6364136223846793005 + 1442695040888963407
    S.g[L.G_RNG] = x
    return ((x >> 12) & ((1 << 52) - 1)) / float(1 << 52)


@njit(cache=True, inline="always")
def hist_bin(delay_ns):
    if delay_ns < 1000:
        return 0
    b = 1 + int(math.log10(delay_ns / 1000.0) * L.HIST_PER_DECADE)
    if b >= L.HIST_BINS - 1:
        return L.HIST_BINS - 1
    return b


@njit(cache=True)
def hist_edges():
    """``e[b]``: the smallest delay (ns) that ``hist_bin`` puts in bin ``b`` or above, for every
    bin, with ``e[0]`` and ``e[HIST_BINS]`` as the int64 extremes: ``hist_bin(d)`` is the ``b``
    with ``e[b] <= d < e[b + 1]``.  Found by bisection on ``hist_bin`` itself (monotonic), so a
    lookup in ``e`` gives the same bin as the logarithm, to the last nanosecond."""
    e = np.empty(L.HIST_BINS + 1, np.int64)
    e[0] = -(2**63)
    e[L.HIST_BINS] = 2**63 - 1
    for b in range(1, L.HIST_BINS):
        lo = 0  # hist_bin(lo) < b
        hi = 10**15  # hist_bin(hi) >= b (1e15 ns is past the last bin)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hist_bin(mid) >= b:
                hi = mid
            else:
                lo = mid
        e[b] = hi
    return e


@njit(cache=True, inline="always")
def hinted_bin(e, hint, x):
    """The histogram bin of ``x`` (``e[b] <= x < e[b + 1]`` over the edges ``e``, ``hist_edges``) without
    a logarithm: ``hint`` first, since samples in a row (cells of one flight or one run) nearly always
    share a bin, else a bisection of the edges."""
    if e[hint] <= x < e[hint + 1]:
        return hint
    lo = 0
    hi = L.HIST_BINS  # e[lo] <= x < e[hi]
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if e[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def _bin_of(S, m, delay_ns):
    """``hist_bin(delay_ns)``, starting from the bin of the previous sample of the kind (``S.g[m]``)."""
    b = hinted_bin(S.hedge, S.g[m], delay_ns)
    S.g[m] = b
    return b


@njit(cache=True, inline="always")
def record_delay(S, which, cq, delay_ns):
    """Per-cell delay sample: ``which`` 0 = circuit queue (application), 1 = kernel socket."""
    cls = S.qi[L.QI_CLASS, cq]
    b = _bin_of(S, L.G_HB_BIN + which, delay_ns)
    S.hist[which, cls, b] += 1
    circ = S.qi[L.QI_CIRC, cq]
    S.circ_sum[which, circ] += delay_ns
    S.circ_sum[2 + which, circ] += 1
    if not L.keeps_records(S):
        return
    n = S.g[L.G_RAW_N]
    if n < S.raw.shape[1]:
        S.raw[0, n] = which
        S.raw[1, n] = cq
        S.raw[2, n] = delay_ns
        S.raw[3, n] = S.g[L.G_NOW]
        S.g[L.G_RAW_N] = n + 1


@njit(cache=True, inline="always")
def trace_chan(S, c, t):
    """Record (time, outbuf bytes, kernel-unsent bytes, kernel-unacked bytes) of the traced chan."""
    if not L.keeps_records(S) or c != S.g[L.G_TRACE_CHAN]:
        return
    n = S.g[L.G_TRACE_N]
    if n < S.trace.shape[1]:
        S.trace[0, n] = t
        S.trace[1, n] = S.ci[L.CI_OB_BYTES, c]
        S.trace[2, n] = S.ci[L.CI_WRITE_SEQ, c] - S.ci[L.CI_SND_NXT, c]
        S.trace[3, n] = S.ci[L.CI_SND_NXT, c] - S.ci[L.CI_SND_UNA, c]
        S.g[L.G_TRACE_N] = n + 1
