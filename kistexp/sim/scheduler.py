"""The scheduler interface (tor's ``scheduler_t``) and the channel state machine of §2.

``run_scheduler`` and ``schedule`` dispatch on the node's scheduler kind to ``kist.py`` (KIST and,
with the lite flag, KISTLite) or ``vanilla.py``; the rest of the simulator never knows which one
it drives.  State transitions (§2):

* ``has_waiting_cells``: WAITING_FOR_CELLS -> PENDING (+ schedule), IDLE -> WAITING_TO_WRITE;
* ``wants_writes``: WAITING_TO_WRITE -> PENDING (+ schedule), IDLE -> WAITING_FOR_CELLS;
* only a run moves a channel out of PENDING.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L
from kistexp.sim.chanheap import pend_push
from kistexp.sim.channel import push_armed_writes
from kistexp.sim.kist import kist_on_new_consensus, kist_on_new_options, kist_run, kist_schedule
from kistexp.sim.vanilla import vanilla_on_new_consensus, vanilla_run, vanilla_schedule

SCHED_KIND = {"kist": L.SCHED_KIST, "kistlite": L.SCHED_KISTLITE, "vanilla": L.SCHED_VANILLA}


def select_scheduler(schedulers: tuple[str, ...], kist_interval_ms: int) -> int:
    """``select_scheduler`` (§3): the first usable entry of the node's ``Schedulers`` list.  KIST is
    usable only while the run interval is > 0 (``scheduler_can_use_kist``); KISTLite and Vanilla
    always are."""
    for name in schedulers:
        if name == "kist" and kist_interval_ms <= 0:
            continue
        return SCHED_KIND[name]
    return -1


@njit(cache=True)
def schedule(S, node, t, after_run):
    if S.ni[L.NI_SCHED, node] == L.SCHED_VANILLA:
        vanilla_schedule(S, node, t, after_run)
    else:
        kist_schedule(S, node, t, after_run)


@njit(cache=True, inline="always")
def has_waiting_cells(S, c, t):
    st = S.ci[L.CI_STATE, c]
    if st == L.ST_WAITING_FOR_CELLS:
        S.ci[L.CI_STATE, c] = L.ST_PENDING
        node = S.ci[L.CI_NODE, c]
        pend_push(S, node, c)
        schedule(S, node, t, False)
    elif st == L.ST_IDLE:
        S.ci[L.CI_STATE, c] = L.ST_WAITING_TO_WRITE


@njit(cache=True)
def wants_writes(S, c, t):
    st = S.ci[L.CI_STATE, c]
    if st == L.ST_WAITING_TO_WRITE:
        S.ci[L.CI_STATE, c] = L.ST_PENDING
        node = S.ci[L.CI_NODE, c]
        pend_push(S, node, c)
        schedule(S, node, t, False)
    elif st == L.ST_IDLE:
        S.ci[L.CI_STATE, c] = L.ST_WAITING_FOR_CELLS


@njit(cache=True)
def run_scheduler(S, node, t):
    """The scheduler event callback: ``run()`` then ``schedule()`` (§2)."""
    S.ni[L.NI_TIMER_AT, node] = -1
    S.ni[L.NI_DEADLINE, node] = -1
    S.ni[L.NI_RUNS, node] += 1
    kind = S.ni[L.NI_SCHED, node]
    S.g[L.G_WW_N] = 0
    if kind == L.SCHED_VANILLA:
        moved = vanilla_run(S, node, t)
    else:
        moved = kist_run(S, node, t, kind == L.SCHED_KISTLITE)
    push_armed_writes(S, t)
    # §5.2's p: the pass lasts as long as its work, a fixed part plus each cell sent (TLS write,
    # write calls).  The cells' work also occupies the event loop; the fixed part stands for the
    # pass's other callbacks, whose cells the loop has already been charged for on receipt.
    work = moved * S.ni[L.NI_SEND_CPU_NS, node]
    S.ni[L.NI_CPU_FREE, node] = max(S.ni[L.NI_CPU_FREE, node], t) + work
    S.ni[L.NI_LAST_RUN, node] = t + S.ni[L.NI_PASS_NS, node] + work
    S.ni[L.NI_RUN_CELLS_LAST, node] = moved
    n = S.g[L.G_RUNLOG_N]
    if n < S.runlog.shape[1]:
        S.runlog[0, n] = node
        S.runlog[1, n] = t
        S.runlog[2, n] = moved
        S.runlog[3, n] = S.g[L.G_RUN_CHAN_CELLS]
        S.g[L.G_RUNLOG_N] = n + 1
    S.g[L.G_RUN_CHAN_CELLS] = 0
    for i in range(S.g[L.G_WW_N]):
        c = S.ww[i]
        S.ci[L.CI_WW, c] = 0
        wants_writes(S, c, t)
    S.g[L.G_WW_N] = 0
    schedule(S, node, t, True)


@njit(cache=True)
def notify_networkstatus_changed(D, node, kind, interval_ms):
    """``scheduler_notify_networkstatus_changed``: ``set_scheduler()`` (``kind``, chosen by
    ``select_scheduler``), then the running scheduler's ``on_new_consensus``.  Switching keeps the
    pending channels and an armed run event (scheduler.c owns both, §3); the next run is the new
    scheduler's.  (Called from Python: ``D`` as for ``engine.run_kernel``.)"""
    S = L.state_from(D)
    S.ni[L.NI_SCHED, node] = kind
    if kind == L.SCHED_VANILLA:
        vanilla_on_new_consensus(S, node, interval_ms)
    else:
        kist_on_new_consensus(S, node, interval_ms)


@njit(cache=True)
def notify_new_options(D, node, sock_buf_factor):
    """``scheduler_conf_changed`` with the KIST options (``on_new_options``)."""
    kist_on_new_options(L.state_from(D), node, sock_buf_factor)
