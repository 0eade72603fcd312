"""Moving cells from a channel's cmux into its outbuf (``channel_flush_from_first_active_circuit``).

One cell per pick, always from the cmux's best circuit (§4 step 3, §11.6); the EWMA charge
happens here, at transmit-to-outbuf time (§15 rule 7).  Adding bytes to an outbuf arms the
connection's write event (§4 step 4).  When an edge's circuit queue drains to ``cellq_low``
while its streams are blocked, they resume reading (§4 step 5).
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.cmux_ewma import cmux_head, ewma_deactivate, ewma_notify_xmit
from kistexp.sim.events import cell_list_pop, cell_list_push, ev_push, prefetch_row, record_delay, trace_chan


@njit(cache=True, inline="always")
def arm_write(S, c):
    """Mark the write event armed; ``push_armed_writes`` queues it after the run (same pass)."""
    if S.ci[L.CI_ARMED, c] == 0:
        S.ci[L.CI_ARMED, c] = 1
        n = S.g[L.G_ARMED_N]
        S.armed[n] = c
        S.g[L.G_ARMED_N] = n + 1


@njit(cache=True)
def push_armed_writes(S, t):
    for i in range(S.g[L.G_ARMED_N]):
        c = S.armed[i]
        S.ci[L.CI_ARMED, c] = 0
        if S.ci[L.CI_OB_BYTES, c] > 0 and S.ci[L.CI_WRITE_EV, c] == 0:
            S.ci[L.CI_WRITE_EV, c] = 1
            ev_push(S, t, L.EV_WRITE, c, 0, 0)
    S.g[L.G_ARMED_N] = 0


@njit(cache=True, inline="always")
def flush_cells(S, c, n, t):
    """Flush up to ``n`` cells from chan ``c``'s cmux into its outbuf; returns how many moved."""
    done = 0
    while done < n and S.ci[L.CI_CMUX_N, c] > 0:
        q = cmux_head(S, c)
        k = cell_list_pop(S, S.qi, L.QI_HEAD, L.QI_TAIL, q)
        nxt = S.qi[L.QI_HEAD, q]
        if nxt >= 0:
            prefetch_row(S.cells, nxt)  # the queue's next head, read at its next flush
        left = S.qi[L.QI_N, q] - 1
        S.qi[L.QI_N, q] = left
        record_delay(S, 0, q, t - S.cells[k].t_enq)
        cell_list_push(S, S.ci, L.CI_OB_HEAD, L.CI_OB_TAIL, c, k)  # append to the outbuf
        S.ci[L.CI_OB_BYTES, c] += L.CELL_SIZE
        ewma_notify_xmit(S, c, q, t)
        if left == 0:
            ewma_deactivate(S, q)
        cd = S.qi[L.QI_CD, q]
        if S.di[L.DI_BLOCKED, cd] == 1 and S.di[L.DI_SRC_CQ, cd] == q and left <= S.pi[L.P_CELLQ_LOW]:
            S.di[L.DI_BLOCKED, cd] = 0
            if S.di[L.DI_RESUME_EV, cd] == 0:
                S.di[L.DI_RESUME_EV, cd] = 1
                ev_push(S, t, L.EV_RESUME, cd, 0, 0)
        done += 1
    if done > 0:
        node = S.ci[L.CI_NODE, c]
        S.ni[L.NI_CELLS_SENT, node] += done
        S.g[L.G_CELLS_SCHEDULED] += done
        if c == S.g[L.G_RUNLOG_CHAN]:
            S.g[L.G_RUN_CHAN_CELLS] += done
        arm_write(S, c)
        trace_chan(S, c, t)
    return done
