"""The scheduler's ``channels_pending`` heap, one per node (§10).

tor's ``smartlist_pqueue`` (``pqueue.py``) over channels.  The key of a channel (§10.1) is the
EWMA ``cell_count`` of the head active circuit of its cmux, or +inf for a cmux without an
active circuit; ``S.ckey[CK_KEY]`` holds it, kept in step by ``cmux_ewma`` on every change, so the
comparator reads live keys and the heap is never re-heapified (§10.3): a key that changes while
a channel sits in the heap can silently violate the heap order, as in tor.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.pqueue import pq_push, pq_remove_at


@njit(cache=True, inline="always")
def pend_push(S, node, c):
    S.ni[L.NI_HEAP_N, node] = pq_push(S.pend_heap, S.ni[L.NI_HEAP_BASE, node], S.ni[L.NI_HEAP_N, node], c,
                                      S.ckey, L.CK_KEY, S.ckey, L.CK_POS)


@njit(cache=True, inline="always")
def pend_pop(S, node):
    c, n = pq_remove_at(S.pend_heap, S.ni[L.NI_HEAP_BASE, node], S.ni[L.NI_HEAP_N, node], 0,
                        S.ckey, L.CK_KEY, S.ckey, L.CK_POS)
    S.ni[L.NI_HEAP_N, node] = n
    return c


@njit(cache=True)
def pend_remove(S, node, c):
    """``smartlist_pqueue_remove`` (release / doesnt_want_writes): sift down only (§10.2)."""
    _, n = pq_remove_at(S.pend_heap, S.ni[L.NI_HEAP_BASE, node], S.ni[L.NI_HEAP_N, node],
                        int(S.ckey[L.CK_POS, c]), S.ckey, L.CK_KEY, S.ckey, L.CK_POS)
    S.ni[L.NI_HEAP_N, node] = n
