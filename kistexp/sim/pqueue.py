"""tor's ``smartlist_pqueue`` (§10.2), shared by the pending-channel heap and every cmux heap.

An array-based binary min-heap over item ids in ``h[base:base + n]``.  ``keys[kr, item]`` is read
at comparison time (live keys, §10.3); ``idx[ir, item]`` records each item's heap position (-1
when absent).  Both are rows of 2-D state arrays, passed without making views.  Push sifts up
while strictly less than the parent (a tie stays below); sift-down prefers the left child on a
tie and takes the right child only when strictly less; remove moves the last element into the
hole and sifts down only (tor's quirk).
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def pq_push(h, base, n, item, keys, kr, idx, ir):
    """Add ``item``; returns the new size."""
    i = n
    key = keys[kr, item]
    while i > 0:
        p = (i - 1) >> 1
        parent = h[base + p]
        if keys[kr, parent] <= key:
            break
        h[base + i] = parent
        idx[ir, parent] = i
        i = p
    h[base + i] = item
    idx[ir, item] = i
    return n + 1


@njit(cache=True, inline="always")
def pq_heapify(h, base, n, i, keys, kr, idx, ir):
    """tor's ``smartlist_pqueue`` sift-down from ``i``.  tor swaps the item with its chosen child at
    each level; here the children move up into a hole and the item is written once at the end,
    which leaves every item where the swaps would (the item's key is the one compared)."""
    x = h[base + i]
    kx = keys[kr, x]
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        kl = keys[kr, h[base + left]]
        if kx < kl:
            best = i
            kb = kx
        else:
            best = left  # a tie with the left child sifts the item down (tor's order)
            kb = kl
        right = left + 1
        if right < n and keys[kr, h[base + right]] < kb:
            best = right
        if best == i:
            break
        y = h[base + best]
        h[base + i] = y
        idx[ir, y] = i
        i = best
    h[base + i] = x
    idx[ir, x] = i


@njit(cache=True, inline="always")
def pq_remove_at(h, base, n, i, keys, kr, idx, ir):
    """Remove the item at position ``i`` (0 = pop); returns (item, new size)."""
    item = h[base + i]
    idx[ir, item] = -1
    n -= 1
    if i != n:
        last = h[base + n]
        h[base + i] = last
        idx[ir, last] = i
        pq_heapify(h, base, n, i, keys, kr, idx, ir)
    return item, n
