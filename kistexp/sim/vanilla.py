"""Vanilla (§9): "as much as possible, as soon as possible".

No interval: ``schedule()`` activates the run in the current pass whenever a channel is pending.
A run serves channels one after another, each up to its outbuf room
(``channel_tls_num_cells_writeable``, ≤ 64 cells from an empty outbuf), cells in EWMA order.  It
never writes to the kernel itself; write-ready callbacks flush the outbuf and, below
``orconn_low``, ``wants_writes`` wakes it again: the 16 KiB / 32 KiB watermark loop.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.chanheap import pend_pop, pend_push
from kistexp.sim.channel import flush_cells
from kistexp.sim.events import timer_arm
from kistexp.sim.kistlite import cells_writeable

MAX_FLUSH_CELLS = 1000
FLUSH_CLAMP = 256


@njit(cache=True)
def vanilla_run(S, node, t):
    nreadd = 0
    moved = 0
    while S.ni[L.NI_HEAP_N, node] > 0:
        ch = pend_pop(S, node)
        n = cells_writeable(S.ci[L.CI_OB_BYTES, ch])
        if n <= 0:
            S.ci[L.CI_STATE, ch] = L.ST_WAITING_TO_WRITE
            continue
        done = 0
        while done < n:
            k = flush_cells(S, ch, min(MAX_FLUSH_CELLS, FLUSH_CLAMP, n - done), t)
            if k <= 0:
                break
            done += k
        moved += done
        if done < n:
            S.ci[L.CI_STATE, ch] = L.ST_WAITING_FOR_CELLS
        elif S.ci[L.CI_CMUX_N, ch] > 0:
            if cells_writeable(S.ci[L.CI_OB_BYTES, ch]) > 0:
                S.readd[nreadd] = ch
                nreadd += 1
            else:
                S.ci[L.CI_STATE, ch] = L.ST_WAITING_TO_WRITE
        elif cells_writeable(S.ci[L.CI_OB_BYTES, ch]) > 0:
            S.ci[L.CI_STATE, ch] = L.ST_WAITING_FOR_CELLS
        else:
            S.ci[L.CI_STATE, ch] = L.ST_IDLE
    for i in range(nreadd):
        c = S.readd[i]
        S.ci[L.CI_STATE, c] = L.ST_PENDING
        pend_push(S, node, c)
    return moved


@njit(cache=True)
def vanilla_schedule(S, node, t, after_run):
    if S.ni[L.NI_HEAP_N, node] == 0:
        return
    armed = S.ni[L.NI_TIMER_AT, node]
    if 0 <= armed and armed <= t and not after_run:
        return  # already active in this pass
    fire = S.ni[L.NI_LAST_RUN, node] if after_run else t  # the end of this pass
    timer_arm(S, node, fire)


@njit(cache=True)
def vanilla_on_new_consensus(S, node, interval_ms):
    """Vanilla's ``scheduler_t`` has no ``on_new_consensus``: no parameter changes how it runs.  The
    KIST interval is still the node's (``kist_scheduler_run_interval`` reads the consensus whenever
    KIST starts), so it is kept for a later switch to KIST or KISTLite."""
    S.ni[L.NI_INTERVAL_MS, node] = interval_ms
