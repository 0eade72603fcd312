"""The circuit multiplexer of a channel with tor's EWMA policy (§11).

Per cmux: a heap of *active* circuit queues (queued cells > 0) keyed by ``cell_count``, and a
reference tick (``active_circuit_pqueue_last_recalibrated``).  Per circuit queue: ``cell_count``
(double) and ``last_adjusted_tick``.  Rescaling is lazy and per cmux (§11.6-§11.7); the tick clock
is per node (process-global in tor) and reads the coarse monotonic clock (§11.4).  The heap is
the same ``smartlist_pqueue`` as the channel heap (§10.2), so ties between equal counts (all new
circuits start at 0.0) follow tor's heap rules.
"""

from __future__ import annotations

import math

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.pqueue import pq_push, pq_remove_at


@njit(cache=True, inline="always")
def current_tick(S, node, t):
    """``cell_ewma_get_current_tick_and_fraction`` on the coarse clock: returns (tick, frac)."""
    j = S.ni[L.NI_TICK_NS, node]
    coarse = (t // j) * j
    tick_ms = S.pi[L.P_EWMA_TICK_MS]
    msec = (coarse - S.ni[L.NI_EWMA_START_MS, node]) // L.MS
    if msec > tick_ms:
        d = msec // tick_ms
        S.ni[L.NI_EWMA_START_MS, node] += d * tick_ms * L.MS
        S.ni[L.NI_EWMA_TICK, node] += d
        msec = msec % tick_ms
    return S.ni[L.NI_EWMA_TICK, node], msec / float(tick_ms)


@njit(cache=True, inline="always")
def _refresh_chan_key(S, c):
    """Mirror the head count into ``S.ckey`` (+inf without active circuits, §10.1)."""
    if S.ci[L.CI_CMUX_N, c] == 0:
        S.ckey[L.CK_KEY, c] = math.inf
    else:
        S.ckey[L.CK_KEY, c] = S.qf[L.QF_COUNT, S.cmux_heap[S.ci[L.CI_CMUX_BASE, c]]]


@njit(cache=True, inline="always")
def _cmux_push(S, c, q):
    S.ci[L.CI_CMUX_N, c] = pq_push(S.cmux_heap, S.ci[L.CI_CMUX_BASE, c], S.ci[L.CI_CMUX_N, c], q,
                                   S.qf, L.QF_COUNT, S.qi, L.QI_HEAP_IDX)
    if S.qi[L.QI_HEAP_IDX, q] == 0:
        S.ckey[L.CK_KEY, c] = S.qf[L.QF_COUNT, q]


@njit(cache=True, inline="always")
def _cmux_remove_at(S, c, i):
    q, n = pq_remove_at(S.cmux_heap, S.ci[L.CI_CMUX_BASE, c], S.ci[L.CI_CMUX_N, c], i,
                        S.qf, L.QF_COUNT, S.qi, L.QI_HEAP_IDX)
    S.ci[L.CI_CMUX_N, c] = n
    _refresh_chan_key(S, c)
    return q


@njit(cache=True, inline="always")
def ewma_activate(S, q):
    """Queued cells 0 -> >0: rescale to the cmux's (possibly stale) reference tick, then push (§11.6)."""
    c = S.qi[L.QI_CHAN, q]
    ref = S.ci[L.CI_REF_TICK, c]
    d = ref - S.qi[L.QI_LAST_TICK, q]
    if d != 0:
        S.qf[L.QF_COUNT, q] *= math.exp(S.nf[L.NF_LN_F, S.ci[L.CI_NODE, c]] * d)
    S.qi[L.QI_LAST_TICK, q] = ref
    _cmux_push(S, c, q)


@njit(cache=True, inline="always")
def ewma_deactivate(S, q):
    """Queued cells -> 0: remove from the heap; the count is kept and decays lazily (§11.6)."""
    _cmux_remove_at(S, S.qi[L.QI_CHAN, q], S.qi[L.QI_HEAP_IDX, q])


@njit(cache=True, inline="always")
def ewma_notify_xmit(S, c, q, t):
    """Charge one transmitted cell to the head circuit ``q`` of chan ``c`` (§11.6 steps 1-4)."""
    node = S.ci[L.CI_NODE, c]
    ln_f = S.nf[L.NF_LN_F, node]
    if S.ni[L.NI_XMIT_T, node] != t:
        # the tick and the increment only change with the clock: compute once per instant
        tick, frac = current_tick(S, node, t)
        S.ni[L.NI_XMIT_T, node] = t
        S.nf[L.NF_XMIT_INC, node] = math.exp(-ln_f * frac)
    tick = S.ni[L.NI_EWMA_TICK, node]
    ref = S.ci[L.CI_REF_TICK, c]
    if tick != ref:
        base = S.ci[L.CI_CMUX_BASE, c]
        for i in range(S.ci[L.CI_CMUX_N, c]):
            aq = S.cmux_heap[base + i]
            S.qf[L.QF_COUNT, aq] *= math.exp(ln_f * (tick - S.qi[L.QI_LAST_TICK, aq]))
            S.qi[L.QI_LAST_TICK, aq] = tick
        S.ci[L.CI_REF_TICK, c] = tick
    S.qf[L.QF_COUNT, q] += S.nf[L.NF_XMIT_INC, node]
    # pop the head (it is q) and push it back at its new place
    _cmux_remove_at(S, c, 0)
    _cmux_push(S, c, q)


def ln_scale_factor(halflife_ms: int, tick_s: int) -> float:
    """ln F, F = 0.5 ** (T / H) (§11.3); computed from F while F is a normal double."""
    f = 0.5 ** (tick_s * 1000.0 / halflife_ms)
    return math.log(f) if f > 1e-300 else math.log(0.5) * tick_s * 1000.0 / halflife_ms


@njit(cache=True)
def ewma_set_options(D, node, ln_f):
    """``cmux_ewma_set_options`` (§11.2): a new consensus sets the node's scale factor.  Counts are
    kept; the lazy rescaling (§11.6) applies the new factor from here on, as tor's does."""
    L.state_from(D).nf[L.NF_LN_F, node] = ln_f


@njit(cache=True, inline="always")
def cmux_head(S, c):
    """The EWMA pick: the active circuit queue with the lowest count (caller checks CI_CMUX_N > 0)."""
    return S.cmux_heap[S.ci[L.CI_CMUX_BASE, c]]
