"""The scheduler's ``channels_pending`` heap, one per node (§10).

A faithful copy of tor's ``smartlist_pqueue_*`` (§10.2): push sifts up while strictly less than
the parent; pop moves the last element to the root and sifts down with "left child wins ties";
keys are read live at comparison time and never re-heapified (§10.3), so a key that changes
while a channel sits in the heap can silently violate the heap order, as in tor.

The key of a channel (§10.1) is the EWMA ``cell_count`` of the head active circuit of its cmux;
a cmux without an active circuit compares as +inf (after any channel with one; equal to another
without one).
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L


@njit(cache=True, inline="always")
def chan_key(S, c):
    """The live key; ``S.ckey`` mirrors it (kept in step by cmux_ewma on every change)."""
    return S.ckey[c]


@njit(cache=True, inline="always")
def pend_push(S, node, c):
    h = S.pend_heap
    base = S.ni[L.NI_HEAP_BASE, node]
    i = S.ni[L.NI_HEAP_N, node]
    S.ni[L.NI_HEAP_N, node] = i + 1
    key = chan_key(S, c)
    while i > 0:
        p = (i - 1) >> 1
        pc = h[base + p]
        if chan_key(S, pc) <= key:
            break
        h[base + i] = pc
        S.ci[L.CI_HEAP_IDX, pc] = i
        i = p
    h[base + i] = c
    S.ci[L.CI_HEAP_IDX, c] = i


@njit(cache=True, inline="always")
def _pend_heapify(S, node, i):
    h = S.pend_heap
    base = S.ni[L.NI_HEAP_BASE, node]
    n = S.ni[L.NI_HEAP_N, node]
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        if chan_key(S, h[base + i]) < chan_key(S, h[base + left]):
            best = i
        else:
            best = left
        right = left + 1
        if right < n and chan_key(S, h[base + right]) < chan_key(S, h[base + best]):
            best = right
        if best == i:
            return
        a = h[base + i]
        b = h[base + best]
        h[base + i] = b
        h[base + best] = a
        S.ci[L.CI_HEAP_IDX, b] = i
        S.ci[L.CI_HEAP_IDX, a] = best
        i = best


@njit(cache=True, inline="always")
def pend_pop(S, node):
    h = S.pend_heap
    base = S.ni[L.NI_HEAP_BASE, node]
    n = S.ni[L.NI_HEAP_N, node] - 1
    top = h[base]
    S.ci[L.CI_HEAP_IDX, top] = -1
    S.ni[L.NI_HEAP_N, node] = n
    if n > 0:
        last = h[base + n]
        h[base] = last
        S.ci[L.CI_HEAP_IDX, last] = 0
        _pend_heapify(S, node, 0)
    return top


@njit(cache=True)
def pend_remove(S, node, c):
    """smartlist_pqueue_remove: the last element fills the hole and is sifted down only (§10.2)."""
    h = S.pend_heap
    base = S.ni[L.NI_HEAP_BASE, node]
    i = S.ci[L.CI_HEAP_IDX, c]
    n = S.ni[L.NI_HEAP_N, node] - 1
    S.ci[L.CI_HEAP_IDX, c] = -1
    S.ni[L.NI_HEAP_N, node] = n
    if i != n:
        last = h[base + n]
        h[base + i] = last
        S.ci[L.CI_HEAP_IDX, last] = i
        _pend_heapify(S, node, i)
