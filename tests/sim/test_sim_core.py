"""Simulation core: the validation tests of kist-ewma.md §15 and the model's contracts."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from kistexp import jsonout
from kistexp.errors import SimConfigError
from kistexp.sim import (
    LOOPBACK_MSS,
    EwmaConfig,
    FlowControlConfig,
    IntervalChange,
    LinkConfig,
    Network,
    NodeConfig,
    RunConfig,
    Transfer,
    run,
)

BIG = 2_000_000_000  # a response that does not finish within the test


def _pair(exit_sched: str, interval_ms: int, *, link: LinkConfig | None = None, circuits: int = 1,
          client_sched: str | None = None, **exit_kw) -> tuple[Network, int, int, list[int]]:
    """A client and an exit joined by one channel; the exit sends the bulk responses."""
    net = Network(link if link is not None else LinkConfig(rtt_ms=0.1, mss=LOOPBACK_MSS))
    client = net.add_node(NodeConfig(role="client", scheduler=client_sched or exit_sched,
                                     kist_interval_ms=interval_ms), "client")
    ex = net.add_node(NodeConfig(role="exit", scheduler=exit_sched, kist_interval_ms=interval_ms, **exit_kw),
                      "exit")
    circs = [net.add_circuit([client, ex], "bulk") for _ in range(circuits)]
    return net, client, ex, circs


def _busy(res, node, skip: int = 20):
    sel = (res.run_node == node) & (res.run_cells > 0)
    return res.run_time_s[sel][skip:], res.run_cells[sel][skip:]


@pytest.mark.parametrize(("interval_ms", "period_ms"), [(10, 12.0), (2, 4.0)])
def test_kistlite_backlogged_channel_moves_64_cells_per_run_every_tick_quantised_period(interval_ms, period_ms):
    # §15: KISTLite, one backlogged channel: 64 cells (32,896 B) per run, P from §5.2 at J = 4 ms
    net, client, ex, circs = _pair("kistlite", interval_ms, circuits=8)
    for c in circs:
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
    res = run(net, RunConfig(duration_s=2.0, sample_interval_s=0.5))
    times, cells = _busy(res, ex)
    assert np.mean(cells == 64) > 0.95
    # each run fires in the millisecond after the tick (libevent wakes late, §5.2), so single
    # periods exceed P by the pass length until the phase wraps; on average they are P
    assert np.median(np.diff(times)) * 1e3 == pytest.approx(period_ms, abs=0.05)
    assert np.mean(np.diff(times)) * 1e3 == pytest.approx(period_ms, abs=0.01)
    thr = res.channel_throughput_bytes_per_s(res.chan_between(ex, client))[-1]
    assert thr == pytest.approx(64 * 514 / (period_ms / 1e3), rel=0.03)


def test_timer_fires_where_libevent_wakes_in_the_millisecond_after_the_tick():
    # §5.2: epoll_wait sleeps interval - 1 ms from the end of the pass, then deadline - coarse now
    # until the coarse clock has reached the deadline: every run lands within 1 ms after a 4 ms
    # tick, p later in it than the run before (p = pass + cells moved * send CPU), until the
    # phase passes 1 ms and falls back.  Without the loop's other wake-ups (RunConfig.wake_rebase,
    # tested in test_sim_scenarios), which would move that phase, the chain is seen alone.
    net, client, ex, circs = _pair("kistlite", 2, circuits=8)
    for c in circs:
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
    res = run(net, RunConfig(duration_s=1.0, wake_rebase=False))
    times, cells = _busy(res, ex)
    ns = np.round(times * 1e9).astype(np.int64)
    assert np.all(ns % 4_000_000 < 1_000_000)
    cfg = NodeConfig()
    p = round(cfg.pass_time_us * 1000) + 64 * round(cfg.cell_send_cpu_us * 1000)
    gaps = np.diff(ns)
    assert np.all(cells == 64)
    assert np.mean(gaps == 4_000_000 + p) > 0.9
    assert set(np.unique(gaps)) <= {4_000_000 + p, 3_000_000 + p}
    assert np.mean(gaps) == pytest.approx(4_000_000, rel=2e-3)  # §5.2: P = 4 ms on average


def test_kist_first_run_on_an_idle_iw10_socket_moves_53_cells():
    # §6/§15: (cwnd, unacked, mss, notsent, outbuf) = (10, 0, 1448, 0, 0) -> floor(28960 / 543) = 53;
    # the exit's read share off, so that the whole backlog waits when the scheduler first runs
    net, client, ex, circs = _pair("kist", 10, link=LinkConfig(rtt_ms=20.0, mss=1448, initial_cwnd=10))
    net.add_transfer(Transfer(circs[0], 498, 5 * 1024 * 1024, 0.5))
    res = run(net, RunConfig(duration_s=1.0, flow_control=FlowControlConfig(exit_read_cells=0)))
    assert res.cells_per_run(ex)[0] == 53
    assert res.node_counts(ex)["socket_info_syscalls"] >= 2  # TCP_INFO + SIOCOUTQNSD per pending socket


def test_an_exit_packages_32_cells_per_read_and_its_first_run_takes_only_the_first_read():
    # connection_bucket_get_share: an exit reads at most 32 * 498 B per read callback of each
    # stream's connection. The first read's cells make the idle scheduler run at once (§5.2,
    # diff >= interval); the next reads come in the next passes, after that run, and wait for
    # the timer: the first run moves 32 cells, the second a full circuit queue.
    net, client, ex, circs = _pair("kist", 10, link=LinkConfig(rtt_ms=20.0, mss=LOOPBACK_MSS))
    net.add_transfer(Transfer(circs[0], 498, 5 * 1024 * 1024, 0.5))
    res = run(net, RunConfig(duration_s=1.0))
    runs = res.cells_per_run(ex)
    runs = runs[runs > 0]
    high = FlowControlConfig().cellq_high  # §4: packaging stops at 256 queued cells
    assert runs[0] == 32
    assert runs[1] == high  # by the timer's run the later reads have filled the queue
    off = run(net, RunConfig(duration_s=1.0, flow_control=FlowControlConfig(exit_read_cells=0)))
    first_off = off.cells_per_run(ex)
    assert first_off[first_off > 0][0] == high  # without the share the first run takes a full queue


def _loopback_path(fc: str, *, read_share: bool, edge_write_cells: int = 0):
    """The fidelity harness's path (loopback links with Nagle, KIST at 2 ms), one 5 MB download."""
    from kistexp.sim import scenarios

    sc = scenarios.PathScenario(scheduler="kist", interval_ms=2, cc_alg=0 if fc == "sendme" else 2,
                                transfer_bytes=5_000_000, read_share=read_share,
                                edge_write_cells=edge_write_cells)
    built = scenarios.get("circuit").build(sc)
    return built.network, built.run_config, built.topology.clients[0]


def test_a_read_callback_takes_at_most_one_share_and_the_rest_of_its_tls_record():
    # connection_bucket_read_limit: 16448 B a read on a rate-limited connection, plus the rest of
    # the TLS record it ends in (connection_buf_read_from_socket reads the pending bytes too): at
    # most 40 cells. Loopback segments carry up to 127 cells, which one read takes whole without it.
    net, rc, client = _loopback_path("vegas", read_share=True)
    res = run(net, rc)
    reads = res.node_counters["read_callbacks"][client]
    assert np.isfinite(res.transfer_ttlb_s).all()
    assert res.node_counters["cells_received"][client] / reads <= 40
    net, rc, client = _loopback_path("vegas", read_share=False)
    whole = run(net, rc)
    assert whole.node_counters["cells_received"][client] / whole.node_counters["read_callbacks"][client] > 40
    assert whole.node_counters["stream_sendmes_held"][client] == 0


def test_stream_sendmes_wait_while_the_edge_outbuf_holds_more_than_ten_cells():
    # sendme_connection_edge_consider_sending: no stream SENDME while the edge connection's outbuf
    # holds more than 10 * 509 B; the ones owed go once a write has brought it down. In a read of
    # up to 40 cells, the cell that makes one due mostly has more than 10 before it. The download
    # completes (a held SENDME lost would stall it at the 500-cell stream window). Vegas circuits
    # send no stream SENDMEs; without the edge outbuf nothing is held.
    owed = 5_000_000 // 498 // 50
    net, rc, client = _loopback_path("sendme", read_share=True, edge_write_cells=32)
    res = run(net, rc)
    assert np.isfinite(res.transfer_ttlb_s).all()
    assert res.node_counters["stream_sendmes_held"][client] >= owed // 2
    for fc, cells in (("vegas", 32), ("sendme", 0)):
        net, rc, client = _loopback_path(fc, read_share=True, edge_write_cells=cells)
        other = run(net, rc)
        assert np.isfinite(other.transfer_ttlb_s).all()
        assert other.node_counters["stream_sendmes_held"][client] == 0


def test_ewma_quiet_circuit_wins_every_pick_until_its_count_passes_the_decayed_bulk_count():
    # §15: one circuit busy for 60 s, a quiet one then starts; H = 30 s
    net, client, ex, (bulk, quiet) = _pair("kistlite", 10, circuits=2)
    net.add_transfer(Transfer(bulk, 498, BIG, 0.0))
    net.add_transfer(Transfer(quiet, 498, BIG, 60.0))
    res = run(net, RunConfig(duration_s=90.0, sample_interval_s=10.0, ewma=EwmaConfig(30000, 10),
                             cell_delays_max=3_000_000))
    raw = res.raw_delays
    sel = (raw[0] == 0) & (raw[4] == ex)          # picks of the exit's cmux, in time order
    circ, t = raw[1, sel], raw[3, sel] / 1e9
    start = np.argmax(circ == quiet)
    after = circ[start:]
    streak = int(np.argmax(after != quiet))       # consecutive picks won by the quiet circuit
    assert streak > 50_000
    # §11.7: within one cmux the counts order like the continuous EWMA sum of 0.5 ** (age / H)
    t_cross = t[start + streak]

    def ewma(which):
        ti = t[:start + streak][circ[:start + streak] == which]
        return np.sum(0.5 ** ((t_cross - ti) / 30.0))

    assert ewma(quiet) == pytest.approx(ewma(bulk), rel=0.01)
    # after the crossing both circuits share the channel
    tail = after[streak:streak + 2000]
    assert 0.3 < np.mean(tail == quiet) < 0.7


def test_vanilla_outbuf_oscillates_between_orconn_low_and_orconn_high_plus_a_cell():
    # §9/§15: refill to >= 32768 whenever a flush leaves the outbuf below 16384
    link = LinkConfig(rtt_ms=10.0, mss=1448, send_buffer_bytes=65536)
    net, client, ex, circs = _pair("vanilla", 10, link=link, circuits=4, nic_rate_bytes_per_s=2e6)
    for c in circs:
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
    chan = 2 * net.channel_between(client, ex) + 1  # exit -> client
    res = run(net, RunConfig(duration_s=3.0, trace_chan=chan, trace_max=1_000_000))
    assert res.chan_src[chan] == ex
    t, ob = res.trace[0] / 1e9, res.trace[1]
    steady = t > 0.5
    rises = np.nonzero(np.diff(ob) > 0)[0] + 1           # a Vanilla run refilled the outbuf
    rises = rises[steady[rises]]
    assert len(rises) > 50
    before, after = ob[rises - 1], ob[rises]
    assert np.all(before < 16384) and np.all(before >= 16384 - 16448)
    assert np.all(after >= 32768) and np.all(after <= 32768 + 513)
    assert ob[steady].max() <= 32768 + 513


def _mixed_network(loss: float) -> Network:
    net = Network(LinkConfig(rtt_ms=30.0, loss_rate=loss))
    nodes = [net.add_node(NodeConfig(role=r, scheduler=s, kist_interval_ms=3, nic_rate_bytes_per_s=5e6))
             for r, s in (("client", "kist"), ("guard", "kist"), ("middle", "kistlite"), ("exit", "vanilla"),
                          ("client", "kist"))]
    c1 = net.add_circuit(nodes[:4], "bulk")
    c2 = net.add_circuit([nodes[4], nodes[1], nodes[2], nodes[3]], "web")
    net.add_transfer(Transfer(c1, 498, 3_000_000, 0.0))
    for k in range(5):
        net.add_transfer(Transfer(c2, 600, 320 * 1024, 0.2 * k))
    return net


def test_runs_are_deterministic_per_seed_and_the_seed_matters():
    a = run(_mixed_network(0.01), RunConfig(duration_s=3.0, seed=11))
    b = run(_mixed_network(0.01), RunConfig(duration_s=3.0, seed=11))
    c = run(_mixed_network(0.01), RunConfig(duration_s=3.0, seed=12))
    assert a.chan_losses.sum() > 0
    np.testing.assert_array_equal(a.transfer_ttlb_s, b.transfer_ttlb_s)
    np.testing.assert_array_equal(a.chan_bytes_sent, b.chan_bytes_sent)
    assert a.node_counters["cells_sent"].tolist() == b.node_counters["cells_sent"].tolist()
    assert a.events == b.events
    assert not np.array_equal(a.chan_bytes_sent, c.chan_bytes_sent)


def test_sendme_windows_bound_cells_in_flight_to_the_circuit_and_stream_windows():
    # §13.1: 1000 cells per circuit, 500 per stream; a long, slow path keeps the windows full
    net, client, ex, (one, many) = _pair("kist", 2, link=LinkConfig(rtt_ms=200.0), circuits=2,
                                         nic_rate_bytes_per_s=4e6)
    net.add_transfer(Transfer(one, 498, BIG, 0.0))
    for _ in range(4):
        net.add_transfer(Transfer(many, 498, BIG, 0.0))
    res = run(net, RunConfig(duration_s=3.0))
    assert 450 <= res.circuit_max_inflight_cells[one, 1] <= 550   # the stream window binds
    assert res.circuit_max_inflight_cells[many, 1] == 1000           # the circuit window binds


def test_vegas_replaces_the_windows_with_a_congestion_window():
    net, client, ex, (c,) = _pair("kist", 2, link=LinkConfig(rtt_ms=50.0))
    net.add_transfer(Transfer(c, 498, BIG, 0.0))
    res = run(net, RunConfig(duration_s=3.0, flow_control=FlowControlConfig(kind="vegas")))
    assert res.circuit_max_inflight_cells[c, 1] > 500      # no stream window under Vegas
    assert res.circuit_final_cwnd_cells[c, 1] != 124       # cwnd moved from cc_cwnd_init
    assert res.circuit_final_cwnd_cells[c, 1] >= 124       # never below cc_cwnd_min


@pytest.mark.parametrize(("alpha", "beta", "gamma", "delta"), [(186, 248, 186, 310), (60, 90, 60, 120)])
def test_vegas_settles_with_its_queue_use_between_alpha_and_beta(alpha, beta, gamma, delta):
    # §13.2 steps 3 and 7: in steady state cwnd grows while queue_use = cwnd - bdp < alpha and shrinks
    # while it is > beta; a 2 MB/s bottleneck on a 50 ms path holds the circuit there
    net, client, ex, (c,) = _pair("kist", 2, link=LinkConfig(rtt_ms=50.0), nic_rate_bytes_per_s=2e6)
    net.add_transfer(Transfer(c, 498, BIG, 0.0))
    fcc = FlowControlConfig(kind="vegas", vegas_alpha=alpha, vegas_beta=beta, vegas_gamma=gamma, vegas_delta=delta)
    res = run(net, RunConfig(duration_s=20.0, flow_control=fcc))
    cwnd, bdp = res.circuit_final_cwnd_cells[c, 1], res.circuit_final_bdp_cells[c, 1]
    assert alpha <= cwnd - bdp <= beta
    # the cells really queued on the path (cwnd minus rate x the 50 ms propagation) follow the target
    rate = res.channel_throughput_bytes_per_s(res.chan_between(ex, client))[-5:].mean() / 514
    assert rate == pytest.approx(2e6 / 514, rel=0.02)
    assert alpha <= cwnd - rate * 0.050 <= 2 * delta


def test_interval_change_mid_run_takes_effect_at_the_next_schedule():
    net, client, ex, circs = _pair("kistlite", 10, circuits=8)
    for c in circs:
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
    net.change_interval(IntervalChange(time_s=1.0, node=ex, interval_ms=2))
    # wake_rebase off: the gaps are then whole periods, not moved by the phase of other wake-ups
    res = run(net, RunConfig(duration_s=2.0, wake_rebase=False))
    times, _ = _busy(res, ex, skip=0)
    gaps = np.diff(times) * 1e3
    before, after = gaps[times[1:] < 0.99], gaps[times[1:] > 1.02]
    assert np.median(before) == pytest.approx(12.0, abs=0.05)
    assert np.median(after) == pytest.approx(4.0, abs=0.05)
    # the timer armed before the change keeps its deadline: one more 12 ms gap, then 4 ms
    first_after = np.argmax(times > 1.0)
    assert gaps[first_after - 1] == pytest.approx(12.0, abs=0.05)
    assert gaps[first_after] == pytest.approx(4.0, abs=0.05)


def test_first_cell_after_idle_is_free_and_a_busy_scheduler_waits_for_its_timer():
    # §5.2 / §15 rules 4-5: after an idle gap (diff >= interval) the run happens in the same pass;
    # 3 ms after a run the timer is set to interval - diff from the coarse clock
    net, client, ex, (c,) = _pair("kist", 10, cell_cpu_us=0.0)
    net.add_transfer(Transfer(c, 498, 498, 1.0))
    net.add_transfer(Transfer(c, 498, 498, 1.003))
    res = run(net, RunConfig(duration_s=2.0))
    cpu = NodeConfig().cell_cpu_us * 1e-6  # the client's work on the received cell
    # first exchange: one round trip (0.1 ms) and the client's CPU per cell, no KIST wait
    assert res.transfer_ttlb_s[0] == pytest.approx(0.1e-3 + cpu, abs=1e-9)
    # second: the client ran at 1.0, so diff = 3 ms and the timeout is 7 ms: the deadline
    # C(1.003) + 7 = 1.007 is reached on the 1.008 tick, but epoll waits the full 7 ms from 1.003,
    # so the run is at 1.010; the exit then idled 10 ms and answers at once: 1.0101 + CPU
    assert res.transfer_ttlb_s[1] == pytest.approx(1.0101 + cpu - 1.003, abs=1e-9)


@pytest.mark.parametrize(("make", "key"), [
    (lambda: NodeConfig(nic_rate_bytes_per_s=-1.0), "nic_rate_bytes_per_s"),
    (lambda: LinkConfig(loss_rate=-0.1), "loss_rate"),
    (lambda: LinkConfig(mss=0), "mss"),
    (lambda: NodeConfig(kist_interval_ms=0), "kist_interval_ms"),
    (lambda: NodeConfig(kist_interval_ms=101), "kist_interval_ms"),
    (lambda: NodeConfig(scheduler="fifo"), "scheduler"),
    (lambda: FlowControlConfig(kind="bbr"), "kind"),
])
def test_invalid_model_parameters_raise_before_anything_runs(make, key):
    cfg = make()
    net = Network(cfg if isinstance(cfg, LinkConfig) else LinkConfig())
    node_cfg = cfg if isinstance(cfg, NodeConfig) else NodeConfig()
    a, b = net.add_node(node_cfg), net.add_node(NodeConfig())
    net.add_transfer(Transfer(net.add_circuit([a, b]), 498, 498, 0.0))
    rc = RunConfig(flow_control=cfg) if isinstance(cfg, FlowControlConfig) else RunConfig()
    with pytest.raises(SimConfigError, match=key):
        run(net, rc)


def test_bad_network_references_and_interval_changes_raise():
    net = Network()
    a = net.add_node(NodeConfig())
    with pytest.raises(SimConfigError, match="does not exist"):
        net.add_circuit([a, 7])
    b = net.add_node(NodeConfig())
    net.add_circuit([a, b])
    with pytest.raises(SimConfigError, match="circuit 3 does not exist"):
        net.add_transfer(Transfer(3))
    net.change_interval(IntervalChange(1.0, b, 0))
    with pytest.raises(SimConfigError, match="interval_ms"):
        run(net, RunConfig(duration_s=1.0))


def test_a_run_beyond_the_memory_bound_stops_with_a_clear_error():
    net, client, ex, circs = _pair("vanilla", 10, circuits=2)
    with pytest.raises(SimConfigError, match="memory_limit_bytes"):
        run(net, RunConfig(duration_s=1.0, memory_limit_bytes=100_000))


def test_result_json_carries_units_and_cost_model_counts():
    res = run(_mixed_network(0.0), RunConfig(duration_s=2.0))
    d = jsonout.to_json(res)
    assert d["duration_s"] == 2.0 and d["transfers_count"] == 6
    node = d["nodes"][1]
    for key in ("scheduler_runs_count", "socket_info_syscalls_count", "kernel_writes_count",
                "cells_sent_count", "peak_queued_bytes", "scheduler_runs_per_s"):
        assert key in node
    counts = res.node_counts(1)
    assert counts["cells_received"] == counts["crypto_layers"]  # a guard: one layer per relayed cell
    assert counts["socket_info_syscalls"] > 0 and res.node_counts(2)["socket_info_syscalls"] == 0
    assert set(d["delays_by_label"]) == {"bulk", "web"}


def test_a_run_that_outgrows_the_memory_bound_stops_during_the_run():
    from kistexp.sim.state import build_state, state_bytes

    # 80 circuits whose middle relay has a slow NIC: cells pile up there to the circuit windows
    net = Network(LinkConfig(rtt_ms=1.0, mss=LOOPBACK_MSS))
    path = [net.add_node(NodeConfig(role=r, scheduler="kist", nic_rate_bytes_per_s=1e6 if r == "middle" else 0.0))
            for r in ("client", "guard", "middle", "exit")]
    for _ in range(80):
        c = net.add_circuit(path)
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
        net.add_transfer(Transfer(c, 498, BIG, 0.0))
    rc = RunConfig(duration_s=2.0)
    state, _ = build_state(net, rc)
    limit = state_bytes(state) + 64 * 1024   # room to start, not to double the cell pool
    with pytest.raises(SimConfigError, match=r"memory_limit_bytes=\d+: the run at t=[\d.]+ s needs"):
        run(net, attrs.evolve(rc, memory_limit_bytes=limit))
    assert run(net, rc).node_counters["peak_app_bytes"][2] > state.cells.shape[0] * 514


def test_a_cpu_bound_receiver_gets_every_cell_in_order_at_its_cpu_rate():
    # the client processes 1 cell per 20 us while acks return after 0.05 ms: the exit's kernel queue
    # (cells sent, not yet processed) outgrows its send buffer and the rings holding it must grow
    net = Network(LinkConfig(rtt_ms=0.1, mss=1448))
    client = net.add_node(NodeConfig(role="client", kist_interval_ms=2, cell_cpu_us=20.0), "client")
    ex = net.add_node(NodeConfig(role="exit", kist_interval_ms=2, cell_cpu_us=0.0), "exit")
    circs = [net.add_circuit([client, ex], "bulk") for _ in range(8)]
    size = 2_000_000
    for c in circs:
        net.add_transfer(Transfer(c, 498, size, 0.0))
    res = run(net, RunConfig(duration_s=2.0))
    cells = 8 * -(-size // 498)
    assert np.all(np.isfinite(res.transfer_ttlb_s))
    assert res.node_counts(client)["cells_received"] == cells
    # the client's CPU is the bottleneck: the last byte arrives after all cells' processing time
    assert np.max(res.transfer_ttlb_s) == pytest.approx(cells * 20e-6, rel=0.1)
