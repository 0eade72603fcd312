"""KIST (§5-§7): when it runs, how much each socket may take, and the one-cell-at-a-time loop.

* Timer (§5.2): after a run the timeout is ``interval - 1`` ms counted from libevent's cached,
  coarse (tick-quantised) loop time.  ``epoll_wait`` sleeps that long from the end of the pass
  (``p``, which grows with the cells the run moved), then ``deadline - coarse now`` again until
  the coarse clock has reached the deadline: the run lands just after a tick, at a phase within
  the first millisecond that each node carries from run to run.  A channel entering PENDING re-arms it with
  ``interval - ceil_ms(now - last_run)``; ``diff >= interval`` runs in the same pass (the first
  cell after an idle gap is free).
* Limit (§6): refreshed only for channels pending at the start of a run:
  ``max(cwnd - unacked, 0) * mss + trunc(cwnd * mss * factor) - notsent - outbuf``, floored at 0;
  two socket-info syscalls per refreshed channel; 543 B charged per cell.
* Loop (§7): one cell per iteration from the channel whose head circuit has the lowest EWMA
  count across all pending channels; outbuf written early at a channel switch when > 4112 B,
  and every touched outbuf at the end (§7.3).
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.chanheap import pend_pop, pend_push
from kistexp.sim.channel import flush_cells
from kistexp.sim.cmux_ewma import cmux_head
from kistexp.sim.events import prefetch_row, timer_arm
from kistexp.sim.kistlite import kistlite_limit
from kistexp.sim.tcp import write_to_kernel


@njit(cache=True, inline="always")
def kist_limit(S, c):
    cwnd = int(S.cf[L.CF_CWND, c])
    mss = S.ci[L.CI_MSS, c]
    tcp_space = max(cwnd - S.ci[L.CI_UNACKED, c], 0) * mss
    notsent = S.ci[L.CI_WRITE_SEQ, c] - S.ci[L.CI_SND_NXT, c]
    extra = int(cwnd * mss * S.nf[L.NF_FACTOR, S.ci[L.CI_NODE, c]]) - notsent - S.ci[L.CI_OB_BYTES, c]
    return max(tcp_space + extra, 0)


@njit(cache=True, inline="always")
def _can_write(S, c):
    if S.ci[L.CI_KS_ENTRY, c] == 0:
        return True  # no socket entry: tor's "bug path" lets it write
    return (S.ci[L.CI_KS_LIMIT, c] - S.ci[L.CI_KS_WRITTEN, c]) // L.KIST_CELL_COST > 0


@njit(cache=True, inline="always")
def _touch(S, c):
    """Add to the run's outbuf table; CI_TOUCHED: 0 absent, 1 in the table, 2 listed but removed."""
    st = S.ci[L.CI_TOUCHED, c]
    if st == 0:
        n = S.g[L.G_TOUCHED_N]
        S.touched[n] = c
        S.g[L.G_TOUCHED_N] = n + 1
    S.ci[L.CI_TOUCHED, c] = 1


@njit(cache=True)
def _write(S, c, t):
    if write_to_kernel(S, c, t) and S.ci[L.CI_WW, c] == 0:
        # wants_writes is delivered after the run (see scheduler.run_scheduler)
        S.ci[L.CI_WW, c] = 1
        n = S.g[L.G_WW_N]
        S.ww[n] = c
        S.g[L.G_WW_N] = n + 1


@njit(cache=True)
def kist_run(S, node, t, lite):
    """``kist_scheduler_run`` (§7); ``lite`` selects the KISTLite limit and no syscalls (§8)."""
    base = S.ni[L.NI_HEAP_BASE, node]
    for i in range(S.ni[L.NI_HEAP_N, node]):
        c = S.pend_heap[base + i]
        S.ci[L.CI_KS_ENTRY, c] = 1
        S.ci[L.CI_KS_WRITTEN, c] = 0
        if lite:
            S.ci[L.CI_KS_LIMIT, c] = kistlite_limit(S, c)
        else:
            S.ci[L.CI_KS_LIMIT, c] = kist_limit(S, c)
            S.ni[L.NI_SYSCALLS, node] += 2
        if S.ci[L.CI_CMUX_N, c] > 0:
            # the head cell of the chan's best circuit, which its first flush reads: queued a
            # while ago, it is out of the cache; asked for now, it arrives while the loop runs
            prefetch_row(S.cells, S.qi[L.QI_HEAD, cmux_head(S, c)])
    S.g[L.G_TOUCHED_N] = 0
    nreadd = 0
    moved = 0
    prev = -1
    while S.ni[L.NI_HEAP_N, node] > 0:
        ch = pend_pop(S, node)
        _touch(S, ch)
        if prev < 0:
            prev = ch
        if ch != prev:
            _touch(S, prev)
            if S.ci[L.CI_OB_BYTES, prev] > L.EARLY_WRITE_BYTES:
                _write(S, prev, t)
                S.ci[L.CI_TOUCHED, prev] = 2  # outbuf_table_remove
            prev = ch
        if _can_write(S, ch):
            n = flush_cells(S, ch, 1, t)
            if n > 0:
                S.ci[L.CI_KS_WRITTEN, ch] += n * L.KIST_CELL_COST
                moved += n
                # Alone in the heap (always so on a client or an exit with one channel): case 4
                # would push it back and the next iteration pop it again at once, so its cells
                # go one after another here, in the same order, without the heap round trips.
                if S.ni[L.NI_HEAP_N, node] == 0:
                    while S.ci[L.CI_CMUX_N, ch] > 0 and _can_write(S, ch):
                        flush_cells(S, ch, 1, t)
                        S.ci[L.CI_KS_WRITTEN, ch] += L.KIST_CELL_COST
                        moved += 1
            else:
                S.ci[L.CI_STATE, ch] = L.ST_WAITING_FOR_CELLS
                continue
        if S.ci[L.CI_CMUX_N, ch] == 0:
            S.ci[L.CI_STATE, ch] = L.ST_WAITING_FOR_CELLS  # cases 1 and 2: deliberately not IDLE
        elif not _can_write(S, ch):
            if S.ci[L.CI_READD, ch] == 0:  # case 3: back next run
                S.ci[L.CI_READD, ch] = 1
                S.readd[nreadd] = ch
                nreadd += 1
        else:
            S.ci[L.CI_STATE, ch] = L.ST_PENDING  # case 4
            pend_push(S, node, ch)
    for i in range(S.g[L.G_TOUCHED_N]):
        c = S.touched[i]
        if S.ci[L.CI_TOUCHED, c] == 1 and S.ci[L.CI_OB_BYTES, c] > 0:
            _write(S, c, t)
        S.ci[L.CI_TOUCHED, c] = 0
    S.g[L.G_TOUCHED_N] = 0
    for i in range(nreadd):
        c = S.readd[i]
        S.ci[L.CI_READD, c] = 0
        S.ci[L.CI_STATE, c] = L.ST_PENDING
        if S.ckey[L.CK_POS, c] < 0:
            pend_push(S, node, c)
    return moved


@njit(cache=True, inline="always")
def _ceil_ms(ns):
    if ns <= 0:
        return 0
    return (ns + L.MS - 1) // L.MS


@njit(cache=True)
def kist_schedule(S, node, t, after_run):
    """``kist_scheduler_schedule`` with libevent's coarse timer (§5.2)."""
    if S.ni[L.NI_HEAP_N, node] == 0:
        return
    armed = S.ni[L.NI_TIMER_AT, node]
    if not after_run and 0 <= armed <= t:
        return  # the run event is already active in this pass
    interval = S.ni[L.NI_INTERVAL_MS, node]
    # p: the rest of the pass that ran the scheduler (run_scheduler stamped last_run at its end)
    p = S.ni[L.NI_LAST_RUN, node] - t if after_run else 0
    # a real clock always moves between last_run and now: any elapsed time counts >= 1 ms
    diff = max(1, _ceil_ms(t + p - S.ni[L.NI_LAST_RUN, node]))
    if after_run:
        diff = 1
    if diff >= interval:
        fire = t + p  # event_active: later in this pass
        S.ni[L.NI_DEADLINE, node] = -1
    else:
        x = (interval - diff) * L.MS
        j = S.ni[L.NI_TICK_NS, node]
        deadline = (t // j) * j + x  # cached, coarse loop time + timeout
        S.ni[L.NI_DEADLINE, node] = deadline
        # epoll_wait sleeps the timeout computed from the stale cached time, i.e. the full x from
        # the end of this pass; on each wake-up libevent refreshes its coarse clock and, while it
        # is short of the deadline, sleeps again for deadline - coarse now (whole ms)
        fire = _wake_chain(t, t + p, deadline, j)
    timer_arm(S, node, fire)


@njit(cache=True, inline="always")
def _wake_chain(w, end, deadline, j):
    """When the run fires if the loop woke at ``w`` (cached coarse time ``C(w)``) and calls
    ``epoll_wait`` again at ``end``: ``timeout_next`` measures the timeout against the stale cached
    time, whole ms; each later wake-up refreshes the coarse clock and sleeps again while it is
    short of the deadline (kist-ewma.md §5.2)."""
    fire = end + (deadline - (w // j) * j)
    while (fire // j) * j < deadline:
        fire += deadline - (fire // j) * j
    return fire


@njit(cache=True)
def kist_loop_woke(S, node, t):
    """The node's event loop woke at ``t`` for I/O while its run timer is armed: the next
    ``epoll_wait`` timeout is measured from this pass's cached time, so the run's phase within the
    millisecond becomes this wake-up's, not the last run's (libevent ``event_base_loop``:
    ``timeout_next`` before ``clear_time_cache``; ``epoll_dispatch`` rounds to whole ms).  A
    wake-up at or after the coarse deadline runs the timer in this pass.  Only with
    ``RunConfig.wake_rebase``."""
    if S.pi[L.P_WAKE_REBASE] == 0:
        return
    deadline = S.ni[L.NI_DEADLINE, node]
    fire = S.ni[L.NI_TIMER_AT, node]
    if deadline < 0 or fire <= t or t < S.ni[L.NI_LAST_RUN, node]:
        return  # no timer armed, it is due, or this is still the pass that armed it
    j = S.ni[L.NI_TICK_NS, node]
    if (t // j) * j >= deadline:
        new = t
    else:
        new = _wake_chain(t, t, deadline, j)
    if new != fire:
        timer_arm(S, node, new)


@njit(cache=True)
def kist_on_new_consensus(S, node, interval_ms):
    """``kist_scheduler_on_new_consensus`` -> ``set_scheduler_run_interval`` (§5.1): the interval is
    read at the next ``schedule()``; an armed timer keeps its deadline.  KIST and KISTLite share it
    (one scheduler object with a lite flag, §3).  0 is possible before 0.4.8.2: KIST is then
    unusable (``scheduler_can_use_kist``) and KISTLite runs in every pass (``diff >= 0``)."""
    S.ni[L.NI_INTERVAL_MS, node] = interval_ms


@njit(cache=True)
def kist_on_new_options(S, node, sock_buf_factor):
    """``kist_scheduler_on_new_options``: ``KISTSockBufSizeFactor`` is read for the next limits (§6)."""
    S.nf[L.NF_FACTOR, node] = sock_buf_factor
