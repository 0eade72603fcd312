"""Synthetic circuit traces with known answers, for the anonymity measures' tests."""

from __future__ import annotations

import numpy as np

from kistexp.sim import CircuitTrace
from kistexp.sim.circuittrace import gap_bin_edges_s

WINDOW_S = 0.1


def trace(*, guard_down: np.ndarray, exit_down: np.ndarray, guard_up: np.ndarray | None = None,
          exit_up: np.ndarray | None = None, client_in: np.ndarray | None = None,
          paths: list[tuple[int, ...]] | None = None, rtt_blocks: np.ndarray | None = None,
          rtt_count: np.ndarray | None = None, gap_hist: np.ndarray | None = None,
          exit_interval_ms: int = 10, exit_tick_ms: float = 4.0, exit_scheduler: str = "kist",
          transfer_index: np.ndarray | None = None, transfer_ttfb_s: np.ndarray | None = None) -> CircuitTrace:
    """A CircuitTrace of ``n`` circuits over ``w`` windows of 100 ms (blocks of 1 s).

    ``rtt_blocks`` [n, block] are RTT values (ms) taken as one sample per block (``rtt_count`` gives
    other counts: each sample of a block then has that value); ``gap_hist`` [slot, bin]."""
    n, w = guard_down.shape
    zeros = np.zeros((n, w), np.int32)
    guard_up = zeros if guard_up is None else guard_up
    exit_up = zeros if exit_up is None else exit_up
    client_in = guard_down if client_in is None else client_in
    paths = paths or [(1000 + i, 2000 + i, 3000 + i, 4000 + i) for i in range(n)]
    blocks = max(1, int(round(w * WINDOW_S)))
    if rtt_blocks is None:
        rtt_blocks = np.zeros((n, blocks))
        rtt_count = np.zeros((n, blocks), np.int64)
    elif rtt_count is None:
        rtt_count = np.isfinite(rtt_blocks).astype(np.int64)
    vals = np.where(rtt_count > 0, rtt_blocks, 0.0)
    exits = np.array(sorted({p[-1] for p in paths}), np.int64)
    slot = np.searchsorted(exits, [p[-1] for p in paths])
    edges = gap_bin_edges_s()
    if gap_hist is None:
        gap_hist = np.zeros((len(exits), len(edges) - 1), np.int64)
    if transfer_index is None:
        transfer_index = np.zeros(0, np.int64)
        transfer_ttfb_s = np.zeros(0)
    return CircuitTrace(
        t0_s=0.0, t1_s=w * WINDOW_S, window_s=WINDOW_S, block_s=1.0, circuits=np.arange(n, dtype=np.int64),
        labels=tuple("web" for _ in range(n)), paths=tuple(tuple(p) for p in paths), node_names=(),
        guard_in=np.stack([guard_up, guard_down], axis=1), exit_out=np.stack([exit_up, exit_down], axis=1),
        client_in=client_in, rtt_count=rtt_count, rtt_sum_ms=vals * rtt_count, rtt_sumsq_ms=vals**2 * rtt_count,
        rtt_min_ms=np.where(rtt_count > 0, vals, np.inf), exit_nodes=exits, circuit_exit_slot=slot,
        gap_hist=gap_hist, gap_bin_edges_s=edges, exit_scheduler=tuple(exit_scheduler for _ in exits),
        exit_interval_ms=np.full(len(exits), exit_interval_ms), exit_tick_ms=np.full(len(exits), exit_tick_ms),
        transfer_trace_index=np.asarray(transfer_index, np.int64), transfer_start_s=np.zeros(len(transfer_index)),
        transfer_ttfb_s=np.asarray(transfer_ttfb_s, np.float64))


def bursty(rng: np.random.Generator, n: int, w: int) -> np.ndarray:
    """Independent on/off cell counts per window: a flow is busy in about a third of the windows."""
    busy = rng.random((n, w)) < 0.35
    return np.where(busy, rng.poisson(40, (n, w)), rng.poisson(0.3, (n, w))).astype(np.int32)
