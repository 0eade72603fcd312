"""The simulator's state layout (issue 8 item 5): lean kernel, interactive flows as one record,
kernel-queue compaction and stream-pool growth all leave the results of a seed unchanged."""

from __future__ import annotations

import numpy as np

from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig, RunConfig, Simulation, run
from kistexp.sim import layout as L
from kistexp.sim.network import _build, _grow_kq, _grow_streams, flow_starts


def _net(expand: bool = False) -> Network:
    """Two circuits on one path: downloads and interactive flows overlapping many exchanges
    (a 1 ms period against a 100 ms round trip), one of them with streams past a stream-SENDME
    increment (its stream pairs are never reused)."""
    net = Network(LinkConfig(rtt_ms=100.0))
    a, m, b = (net.add_node(NodeConfig(role=r)) for r in ("client", "relay", "exit"))
    c1, c2 = net.add_circuit([a, m, b], "quiet"), net.add_circuit([a, m, b], "bulk")
    net.add_transfers([c2, c2], [498, 498], [300_000, 20_000], [0.05, 0.0005])
    flows = [InteractiveFlow(c1, 0.0, 0.6, 0.001, 498, 996), InteractiveFlow(c2, 0.0005, 0.5, 0.0007, 30_000, 40_000)]
    for f in flows:
        if expand:
            n = len(flow_starts(f))
            net.add_transfers([f.circuit] * n, [f.request_bytes] * n, [f.response_bytes] * n, flow_starts(f))
        else:
            net.add_interactive(f)
    net.add_transfers([c2], [498], [100_000], [0.0005])
    return net


def _same(r1, r2) -> None:
    assert (r1.cells_scheduled, r1.events) == (r2.cells_scheduled, r2.events)
    for name in ("transfer_ttlb_s", "transfer_ttfb_s", "transfer_start_s", "transfer_circuit", "delay_hist",
                 "chan_bytes_sent", "run_time_s"):
        np.testing.assert_array_equal(getattr(r1, name), getattr(r2, name), err_msg=name)


RC = RunConfig(duration_s=1.5, seed=3)


def test_interactive_flow_runs_as_its_exchanges_would():
    flows, expanded = run(_net(), RC), run(_net(expand=True), RC)
    _same(flows, expanded)
    assert flows.transfer_circuit.shape == (3 + 600 + 714,)
    assert np.isfinite(flows.transfer_ttlb_s).sum() > 600  # the small exchanges and more


def test_interactive_flow_is_one_record_until_results():
    net = _net()
    S, meta = _build(net, RC)
    assert S.fl.shape == (L.N_FL, 2)
    # stream records: the three downloads plus a small pool, not one pair per exchange
    assert S.si.shape[0] == 2 * (3 + 64)
    assert len(meta["t_circ"]) == net.n_transfers == 1317


def test_lean_kernel_gives_the_full_kernels_results():
    lean = run(_net(), RC)
    full = run(_net(), RunConfig(duration_s=1.5, seed=3, cell_delays_max=1000, trace_chan=1))
    _same(lean, full)
    assert lean.raw_delays.shape[1] == 0 and full.raw_delays.shape[1] == 1000
    assert full.trace.shape[1] > 0


def test_kernel_queue_compaction_and_stream_pool_growth_change_nothing():
    plain = run(_net(), RC)
    sim = Simulation(_net(), RC)
    for t in (0.2, 0.4, 0.7, 1.0):
        sim.advance_to(t)
        S = sim._S
        assert int(S.ci[L.CI_KQ_N].sum()) > 0 or t > 0.9
        sim._S = _grow_streams(_grow_kq(S))
        assert sim._S.kq.shape[0] >= int(sim._S.ci[L.CI_KQ_CAP].sum())
    sim.advance_to(1.5)
    _same(plain, sim.result())
