"""Compiled basics: the event queue (binary heap in arrays), the cell pool, the RNG, delay records.

The event heap is ordered by (time, sequence number): events at the same time run in the order
they were scheduled, which is how "later in the same libevent pass" is modelled (§5.2, §9).
"""

from __future__ import annotations

import math

from numba import njit

from kistexp.sim import layout as L


@njit(cache=True)
def ev_push(S, t, kind, a, b, c):
    ev = S.ev
    g = S.g
    seq = g[L.G_SEQ]
    g[L.G_SEQ] = seq + 1
    i = g[L.G_EVN]
    g[L.G_EVN] = i + 1
    # sift up with a hole
    while i > 0:
        p = (i - 1) >> 1
        pt = ev[L.E_T, p]
        if pt < t or (pt == t and ev[L.E_SEQ, p] < seq):
            break
        for f in range(L.N_EV):
            ev[f, i] = ev[f, p]
        i = p
    ev[L.E_T, i] = t
    ev[L.E_SEQ, i] = seq
    ev[L.E_KIND, i] = kind
    ev[L.E_A, i] = a
    ev[L.E_B, i] = b
    ev[L.E_C, i] = c


@njit(cache=True)
def ev_pop(S):
    """Remove the root; its fields are copied to column ``cap - 1`` (kept free for this)."""
    ev = S.ev
    g = S.g
    cap = ev.shape[1]
    for f in range(L.N_EV):
        ev[f, cap - 1] = ev[f, 0]
    n = g[L.G_EVN] - 1
    g[L.G_EVN] = n
    if n == 0:
        return
    t = ev[L.E_T, n]
    seq = ev[L.E_SEQ, n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n:
            ct = ev[L.E_T, c]
            dt = ev[L.E_T, c + 1]
            if dt < ct or (dt == ct and ev[L.E_SEQ, c + 1] < ev[L.E_SEQ, c]):
                c += 1
        ct = ev[L.E_T, c]
        if t < ct or (t == ct and seq < ev[L.E_SEQ, c]):
            break
        for f in range(L.N_EV):
            ev[f, i] = ev[f, c]
        i = c
    if i != n:
        for f in range(L.N_EV):
            ev[f, i] = ev[f, n]


@njit(cache=True)
def cell_alloc(S):
    g = S.g
    k = g[L.G_FREE]
    g[L.G_FREE] = S.cells[L.KI_NEXT, k]
    g[L.G_NFREE] -= 1
    S.cells[L.KI_NEXT, k] = -1
    return k


@njit(cache=True)
def cell_free(S, k):
    g = S.g
    S.cells[L.KI_NEXT, k] = g[L.G_FREE]
    g[L.G_FREE] = k
    g[L.G_NFREE] += 1


@njit(cache=True)
def rng_uniform(S):
    """64-bit LCG (Knuth's MMIX constants), top 52 bits: deterministic per seed."""
    x = S.g[L.G_RNG] * 6364136223846793005 + 1442695040888963407
    S.g[L.G_RNG] = x
    return ((x >> 12) & ((1 << 52) - 1)) / float(1 << 52)


@njit(cache=True)
def hist_bin(delay_ns):
    if delay_ns < 1000:
        return 0
    b = 1 + int(math.log10(delay_ns / 1000.0) * L.HIST_PER_DECADE)
    if b >= L.HIST_BINS - 1:
        return L.HIST_BINS - 1
    return b


@njit(cache=True)
def record_delay(S, which, cq, delay_ns):
    """Per-cell delay sample: ``which`` 0 = circuit queue (application), 1 = kernel socket."""
    cls = S.qi[L.QI_CLASS, cq]
    S.hist[which, cls, hist_bin(delay_ns)] += 1
    circ = S.qi[L.QI_CIRC, cq]
    S.circ_sum[which, circ] += delay_ns
    S.circ_sum[2 + which, circ] += 1
    n = S.g[L.G_RAW_N]
    if n < S.raw.shape[1]:
        S.raw[0, n] = which
        S.raw[1, n] = cq
        S.raw[2, n] = delay_ns
        S.raw[3, n] = S.g[L.G_NOW]
        S.g[L.G_RAW_N] = n + 1
