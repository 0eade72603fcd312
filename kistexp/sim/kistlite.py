"""KISTLite (§8): KIST without kernel syscalls; its per-channel limit comes from the outbuf room.

The run loop, timer, outbuf policy and EWMA priority are KIST's (``kist.py`` runs it with the
lite flag); only the limit differs, computed here.  So does its consensus hook: tor's KISTLite is
the KIST scheduler object in lite mode (§3), whose ``on_new_consensus`` is ``kist.kist_on_new_consensus``.
"""

from __future__ import annotations

from numba import njit

from kistexp.sim import layout as L


@njit(cache=True, inline="always")
def cells_writeable(outbuf):
    """``channel_tls_num_cells_writeable_method``, including its unsigned wrap (§6).

    ``CEIL_DIV(orconn_high - outbuf, 514)`` computed unsigned: 64 cells on an empty outbuf, 0 for
    an outbuf in [orconn_high, orconn_high + 513], and INT_MAX cells (wrapped) above that.
    """
    if outbuf <= L.ORCONN_HIGH:
        return (L.ORCONN_HIGH - outbuf + L.CELL_SIZE - 1) // L.CELL_SIZE
    if outbuf - L.ORCONN_HIGH <= L.CELL_SIZE - 1:
        return 0
    return L.INT_MAX


@njit(cache=True, inline="always")
def kistlite_limit(S, c):
    """§6 fallback limit: cells_writeable * (514 + 29) bytes for this run."""
    return cells_writeable(S.ci[L.CI_OB_BYTES, c]) * L.KIST_CELL_COST
