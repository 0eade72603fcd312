"""Compiled basics: the event queue (binary heap in arrays), the cell pool, the RNG, delay records.

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

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kistexp.sim import layout as L


@njit(cache=True)
def ev_push(S, t, kind, a, b, c):
    g = S.g
    seq = g[L.G_SEQ]
    g[L.G_SEQ] = seq + 1
    if t == g[L.G_NOW]:
        nq = S.nq
        cap = nq.shape[0]
        j = (g[L.G_NQ_HEAD] + g[L.G_NQ_N]) % cap
        g[L.G_NQ_N] += 1
        nq[j, L.E_T] = t
        nq[j, L.E_SEQ] = seq
        nq[j, L.E_KIND] = kind
        nq[j, L.E_A] = a
        nq[j, L.E_B] = b
        nq[j, L.E_C] = c
        return
    ev = S.ev
    i = g[L.G_EVN]
    g[L.G_EVN] = i + 1
    # sift up with a hole
    while i > 0:
        p = (i - 1) >> 1
        pt = ev[p, L.E_T]
        if pt < t or (pt == t and ev[p, L.E_SEQ] < seq):
            break
        for f in range(L.N_EV):
            ev[i, f] = ev[p, f]
        i = p
    ev[i, L.E_T] = t
    ev[i, L.E_SEQ] = seq
    ev[i, L.E_KIND] = kind
    ev[i, L.E_A] = a
    ev[i, L.E_B] = b
    ev[i, L.E_C] = c


@njit(cache=True)
def ev_push_entry(D, t, kind, a, b, c):
    """``ev_push`` called from Python (``D`` as for ``engine.run_kernel``)."""
    ev_push(L.state_from(D), t, kind, a, b, c)


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
    t = ev[n, L.E_T]
    seq = ev[n, L.E_SEQ]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n:
            ct = ev[c, L.E_T]
            dt = ev[c + 1, L.E_T]
            if dt < ct or (dt == ct and ev[c + 1, L.E_SEQ] < ev[c, L.E_SEQ]):
                c += 1
        ct = ev[c, L.E_T]
        if t < ct or (t == ct and seq < ev[c, L.E_SEQ]):
            break
        for f in range(L.N_EV):
            ev[i, f] = ev[c, f]
        i = c
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
    """Remove the next event; returns the array and row holding its fields (-1 row: none left)."""
    g = S.g
    ev = S.ev
    scratch = ev.shape[0] - 1
    if g[L.G_TQ_N] > 0:
        node = S.tq[0]
        t = S.ni[L.NI_TIMER_AT, node]
        seq = S.ni[L.NI_TIMER_SEQ, node]
        if ((g[L.G_NQ_N] == 0 or _before(t, seq, S.nq, g[L.G_NQ_HEAD]))
                and (g[L.G_EVN] == 0 or _before(t, seq, ev, 0))):
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
            g[L.G_NQ_HEAD] = (h + 1) % nq.shape[0]
            g[L.G_NQ_N] -= 1
            return nq, h
    if g[L.G_EVN] == 0:
        return ev, -1
    ev_pop(S)
    return ev, scratch


@njit(cache=True)
def ev_peek_time(S):
    """Time of the next event, or -1 when there is none."""
    t = -1
    if S.g[L.G_NQ_N] > 0:
        t = S.nq[S.g[L.G_NQ_HEAD], L.E_T]
    elif S.g[L.G_EVN] > 0:
        t = S.ev[0, L.E_T]
    if S.g[L.G_TQ_N] > 0:
        tt = S.ni[L.NI_TIMER_AT, S.tq[0]]
        if t < 0 or tt < t:
            t = tt
    return t


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


@njit(cache=True, inline="always")
def record_delay(S, which, cq, delay_ns):
    """Per-cell delay sample: ``which`` 0 = circuit queue (application), 1 = kernel socket."""
    cls = S.qi[L.QI_CLASS, cq]
    # the cells of one flight or one run mostly share a delay: remember the last bin per kind
    # (a logarithm per cell is a noticeable share of the run time)
    m = L.G_HB_DELAY + 2 * which
    if S.g[m] == delay_ns:
        b = S.g[m + 1]
    else:
        b = hist_bin(delay_ns)
        S.g[m] = delay_ns
        S.g[m + 1] = b
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
