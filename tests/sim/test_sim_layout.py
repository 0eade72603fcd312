"""The simulator's state layout (issue 8 item 5): lean kernel, interactive flows as one record,
kernel-queue compaction and stream-pool growth all leave the results of a seed unchanged."""

from __future__ import annotations

import numpy as np

from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig, RunConfig, Simulation, run
from kistexp.sim import layout as L
from kistexp.sim.network import flow_starts
from kistexp.sim.state import build_state, grow_events, grow_kq, grow_streams


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
    S, meta = build_state(net, RC)
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
        sim._S = grow_streams(grow_kq(S))
        assert sim._S.kq.shape[0] >= int(sim._S.ci[L.CI_KQ_CAP].sum())
    sim.advance_to(1.5)
    _same(plain, sim.result())


def test_descriptor_holds_each_arrays_address_and_shape_and_refuses_a_wrong_array():
    S, _ = build_state(_net(), RC)
    desc = L.descriptor(S)
    assert desc.dtype == np.int64 and desc.shape == (L.DESC_SLOTS * len(L.FIELDS),)
    for k, (arr, (name, _, nd, *_)) in enumerate(zip(S, L.FIELDS, strict=True)):
        assert desc[L.DESC_SLOTS * k] == arr.ctypes.data, name
        assert tuple(desc[L.DESC_SLOTS * k + 1:L.DESC_SLOTS * k + 1 + nd]) == arr.shape, name
    # a strided view or a wrong dtype would be read as if it were the state's own layout
    assert S.ci.flags.f_contiguous and S.ci.strides[1] == 8 * L.N_CI  # one chan's fields together
    for bad, why in ((S._replace(ci=S.ci[:, ::2]), "ci"), (S._replace(g=S.g.astype(np.int32)), "g"),
                     (S._replace(ci=np.ascontiguousarray(S.ci)), "ci")):
        try:
            L.descriptor(bad)
        except TypeError as e:
            assert f"simulator state {why}:" in str(e)
        else:
            raise AssertionError(f"descriptor accepted a wrong {why}")


def test_two_simulations_stepped_in_turn_keep_their_own_state():
    """Each entry point sees the state it is given: two runs advanced alternately give what each
    gives alone."""
    other = _net()
    other.add_transfers([1], [498], [2_000_000], [0.1])
    alone, other_alone = run(_net(), RC), run(other, RC)
    assert other_alone.events != alone.events
    s1, s2 = Simulation(_net(), RC), Simulation(other, RC)
    for t in (0.3, 0.9, 1.5):
        s1.advance_to(t)
        s2.advance_to(t)
    _same(alone, s1.result())
    _same(other_alone, s2.result())


def test_chan_event_queues_keep_the_heap_small_and_growing_them_changes_nothing():
    """Later arrivals and acks of a chan wait in its queue behind one heap representative; the
    run is the same when the event arrays are doubled (queue rows renumbered nowhere) mid-run."""
    plain = run(_net(), RC)
    sim = Simulation(_net(), RC)
    queued_seen = 0
    for t in (0.2, 0.5, 0.8, 1.1):
        sim.advance_to(t)
        S = sim._S
        queued = S.evq.shape[0] - int(S.g[L.G_EQ_NFREE])
        queued_seen = max(queued_seen, queued)
        n_chan = S.ci.shape[1]
        assert int(S.g[L.G_EVN]) <= 2 * n_chan + 16  # at most one arrival and one ack per chan, and a few others
        sim._S = grow_events(S)
    sim.advance_to(1.5)
    _same(plain, sim.result())
    assert queued_seen > 0


def test_lossy_links_run_with_chan_event_queues():
    """Losses delay a flight's arrival; arrivals stay in time order per chan, so the run
    completes with every transfer delivered."""
    net = Network(LinkConfig(rtt_ms=20.0))
    a, m, b = (net.add_node(NodeConfig(role=r)) for r in ("client", "relay", "exit"))
    net.add_channel(a, m, LinkConfig(rtt_ms=20.0, loss_rate=0.02))
    c = net.add_circuit([a, m, b])
    net.add_transfers([c] * 3, [498] * 3, [400_000] * 3, [0.0, 0.3, 0.6])
    res = run(net, RunConfig(duration_s=8.0, seed=2))
    assert np.isfinite(res.transfer_ttlb_s).all()
    assert res.chan_losses.sum() > 0


def test_histogram_bin_edges_give_the_logarithms_bin_for_every_delay():
    """A delay's bin is looked up in ``hist_edges`` instead of computing a logarithm per cell:
    the lookup must agree with ``hist_bin`` everywhere, at the edges above all."""
    from numba import njit

    from kistexp.sim.events import hist_bin, hist_edges

    e = hist_edges()
    assert e.shape == (L.HIST_BINS + 1,) and (e[1:] > e[:-1]).all()
    assert e[1] == 1000 and e[L.HIST_BINS - 1] == 100_000_000_000  # 1 us and 100 s

    @njit
    def disagreements(e):
        bad = 0
        for b in range(1, e.shape[0] - 1):
            for d in (e[b] - 1, e[b], e[b] + 1):
                k = hist_bin(d)
                if not (e[k] <= d < e[k + 1]):
                    bad += 1
        for d in range(-5, 200_000, 3):
            k = hist_bin(d)
            if not (e[k] <= d < e[k + 1]):
                bad += 1
        return bad

    assert disagreements(e) == 0
