"""Steppable runs (issue 8 items 1-3): advance_to, apply through the scheduler hooks, windows, vocabulary."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kistexp.errors import SimConfigError
from kistexp.metrics import catalogue
from kistexp.sim import (
    LOOPBACK_MSS,
    FlowControlConfig,
    InteractiveFlow,
    IntervalChange,
    LinkConfig,
    Network,
    NodeConfig,
    RunConfig,
    Simulation,
    Transfer,
    run,
)
from kistexp.sim.vocabulary import METRICS, relay_values, window_samples

BIG = 2_000_000_000


def _path(sched: str, fc: str, interval: int = 10, change: bool = False, exit_read_cells: int = 0,
          defaults: bool = False):
    net = Network(LinkConfig(rtt_ms=4.0, mss=LOOPBACK_MSS, loss_rate=0.001))
    ns = [net.add_node(NodeConfig(role=r, scheduler=sched, kist_interval_ms=interval))
          for r in ("client", "guard", "middle", "exit")]
    for i in range(4):
        c = net.add_circuit(ns, "bulk" if i < 3 else "quiet")
        if i < 3:
            net.add_transfer(Transfer(c, 498, 3_000_000, 0.1 * i))
        else:
            net.add_interactive(InteractiveFlow(c, 0.0, 3.0, 0.1))
    if change:
        net.change_interval(IntervalChange(1.5, ns[2], 2))
    if defaults:  # the model as it runs by default
        fcc = FlowControlConfig(kind=fc)
        return net, RunConfig(duration_s=3.0, seed=7, sample_interval_s=0.5, flow_control=fcc)
    # the model of the recorded figures below: from before the exit's read share, the relays' read
    # share, the edge outbuf and libevent's timeout from each pass (all off)
    fcc = FlowControlConfig(kind=fc, exit_read_cells=exit_read_cells, edge_write_cells=0)
    return net, RunConfig(duration_s=3.0, seed=7, sample_interval_s=0.5, flow_control=fcc,
                          read_share=False, wake_rebase=False)


#: the node counters the recorded digests below cover (counters added since, such as delayed_acks,
#: are checked by tests of their own)
RECORDED_COUNTERS = ("scheduler_runs", "socket_info_syscalls", "kernel_writes", "cells_sent", "cells_received",
                     "crypto_layers", "digests", "bytes_written", "peak_app_bytes", "peak_kernel_bytes",
                     "peak_queued_bytes")


def _fingerprint(res) -> dict:
    h = hashlib.sha256()
    for a in (res.transfer_ttlb_s, res.transfer_ttfb_s, res.chan_bytes_sent, res.delay_hist, res.run_time_s):
        h.update(np.ascontiguousarray(a).tobytes())
    for k in sorted(RECORDED_COUNTERS):
        h.update(res.node_counters[k].tobytes())
    return dict(cells=res.cells_scheduled, events=res.events, digest=h.hexdigest()[:16],
                bytes=int(res.chan_bytes_sent[-1].sum()))


# recorded with the one-call run() before the steppable simulation existed; ``events`` counted
# stale timer events then (a re-armed KIST timer left its old event in the heap), so it may only
# have dropped since each node has one timer slot
BEFORE = {
    ("kist", "sendme", 10, False): dict(cells=56124, events=8532, digest="a4c73b60dd0170c3", bytes=28847736),
    ("kist", "vegas", 10, True): dict(cells=56253, events=8458, digest="3394af532184516f", bytes=28914042),
    ("vanilla", "sendme", 10, False): dict(cells=56124, events=16796, digest="e2f97c3a385b7fd8", bytes=28847736),
}


def _same_as_before(fp: dict, case: tuple) -> None:
    want = dict(BEFORE[case])
    assert fp.pop("events") <= want.pop("events")
    assert fp == want


@pytest.mark.parametrize("case", list(BEFORE))
def test_run_gives_the_figures_it_gave_before_the_steppable_simulation(case):
    _same_as_before(_fingerprint(run(*_path(*case))), case)


@pytest.mark.parametrize(("exit_read_cells", "defaults"), [(0, False), (32, False), (32, True)])
def test_advancing_in_pieces_gives_the_same_result_as_one_run(exit_read_cells, defaults):
    net, rc = _path("kist", "vegas", change=True, exit_read_cells=exit_read_cells, defaults=defaults)
    sim = Simulation(net, rc)
    for t in (0.0, 0.37, 0.5, 1.5, 2.2, 3.0):
        sim.advance_to(t)
        assert sim.now_s == t
    pieces = _fingerprint(sim.result())
    assert pieces == _fingerprint(run(net, rc))
    if exit_read_cells == 0 and not defaults:
        _same_as_before(pieces, ("kist", "vegas", 10, True))


def _pair(version: str = "0.4.7.16", sched: str = "kistlite", interval: int = 10, **exit_kw):
    net = Network(LinkConfig(rtt_ms=0.1, mss=LOOPBACK_MSS))
    client = net.add_node(NodeConfig(role="client", scheduler=sched, kist_interval_ms=interval), "client")
    ex = net.add_node(NodeConfig(role="exit", scheduler=sched, kist_interval_ms=interval, tor_version=version,
                                 **exit_kw), "exit")
    for _ in range(8):
        net.add_transfer(Transfer(net.add_circuit([client, ex], "bulk"), 498, BIG, 0.0))
    return net, client, ex


def _periods(res, node, lo, hi):
    sel = (res.run_node == node) & (res.run_cells > 0)
    t = res.run_time_s[sel]
    gaps = np.diff(t) * 1e3
    return gaps[(t[1:] > lo) & (t[1:] < hi)]


def test_apply_at_t_changes_only_what_follows():
    net, client, ex = _pair()
    plain = run(net, RunConfig(duration_s=2.0))
    sim = Simulation(net, RunConfig(duration_s=2.0))
    sim.advance_to(1.0)
    (applied,) = sim.apply([ex], {"KISTSchedRunInterval": 2})
    assert applied.values["KISTSchedRunInterval"] == 2 and applied.clamped == ()
    sim.advance_to(2.0)
    res = sim.result()
    before = plain.run_time_s[plain.run_time_s <= 1.0]
    np.testing.assert_array_equal(res.run_time_s[res.run_time_s <= 1.0], before)
    assert np.median(_periods(res, ex, 0.1, 0.99)) == pytest.approx(12.0, abs=0.05)  # §5.2 at J = 4 ms
    assert np.median(_periods(res, ex, 1.05, 2.0)) == pytest.approx(4.0, abs=0.05)
    assert np.median(_periods(plain, ex, 1.05, 2.0)) == pytest.approx(12.0, abs=0.05)


@pytest.mark.parametrize(("version", "role", "given", "key", "effective", "clamped"), [
    ("0.4.8.13", "exit", {"KISTSchedRunInterval": 1}, "KISTSchedRunInterval", 2, True),     # bug 40808
    ("0.4.8.13", "exit", {"KISTSchedRunInterval": 0}, "KISTSchedRunInterval", 2, True),
    ("0.4.8.13", "exit", {"KISTSchedRunInterval": 500}, "KISTSchedRunInterval", 100, True),
    ("0.4.7.16", "exit", {"KISTSchedRunInterval": 500}, "KISTSchedRunInterval", 100, True),
    ("0.4.7.16", "exit", {"KISTSchedRunInterval": 0}, "KISTSchedRunInterval", 0, False),
    ("0.4.8.13", "exit", {}, "KISTSchedRunInterval", 2, False),                              # default
    ("0.4.7.16", "exit", {}, "KISTSchedRunInterval", 10, False),
    ("0.4.8.13", "client", {"KISTSchedRunIntervalClient": 7, "KISTSchedRunInterval": 3},
     "KISTSchedRunIntervalClient", 7, False),
    ("0.4.7.16", "client", {"KISTSchedRunIntervalClient": 7, "KISTSchedRunInterval": 3},
     "KISTSchedRunInterval", 3, False),
    ("0.4.8.13", "exit", {"CircuitPriorityHalflifeMsec": 0}, "CircuitPriorityHalflifeMsec", 1, True),
    ("0.4.8.13", "exit", {"cc_sendme_inc": 500}, "cc_sendme_inc", 254, True),
    ("0.4.8.13", "exit", {"cc_alg": 1}, "cc_alg", 2, False),                                 # 1 becomes 2
])
def test_values_are_clamped_as_the_nodes_tor_version_clamps_them(version, role, given, key, effective, clamped):
    net = Network()
    n = net.add_node(NodeConfig(role=role, tor_version=version))
    net.add_circuit([n, net.add_node(NodeConfig())])
    sim = Simulation(net, RunConfig(duration_s=1.0))
    (applied,) = sim.apply(n, given)
    assert applied.values[key] == effective
    assert (key in applied.clamped) == clamped
    if key.startswith("KIST"):
        assert sim.node_interval_ms(n) == effective
        other = {"KISTSchedRunInterval": "KISTSchedRunIntervalClient"}.get(key, "KISTSchedRunInterval")
        assert other not in applied.values  # the other interval parameter is not read by this node


def test_a_torrc_interval_wins_over_the_consensus():
    net = Network()
    n = net.add_node(NodeConfig(kist_interval_ms=1, torrc_overrides=("KISTSchedRunInterval",)))
    net.add_circuit([n, net.add_node(NodeConfig())])
    sim = Simulation(net, RunConfig(duration_s=1.0))
    sim.apply(n, {"KISTSchedRunInterval": 50})
    assert sim.node_interval_ms(n) == 1


@pytest.mark.parametrize(("schedulers", "after"), [((), "kistlite"), (("kist", "vanilla"), "vanilla")])
def test_zero_switches_an_old_relay_to_its_next_scheduler_at_run_time(schedulers, after):
    # §3, §5.1: before 0.4.8.2 a consensus 0 makes KIST unusable; the Schedulers list decides what runs
    net, client, ex = _pair("0.4.7.16", "kist", 10, schedulers=schedulers)
    sim = Simulation(net, RunConfig(duration_s=2.0))
    sim.advance_to(1.0)
    sim.apply(ex, {"KISTSchedRunInterval": 0})
    assert sim.node_scheduler(ex) == after
    sim.advance_to(1.5)
    sim.apply(ex, {"KISTSchedRunInterval": 5})
    assert sim.node_scheduler(ex) == "kist"  # usable again: the first entry wins
    sim.advance_to(2.0)
    w_kist, w_off, w_back = sim.window(0.0, 1.0), sim.window(1.0, 1.5), sim.window(1.5, 2.0)
    assert w_kist.node_counters["socket_info_syscalls"][ex] > 0
    assert w_off.node_counters["socket_info_syscalls"][ex] == 0      # KISTLite and Vanilla make none (§7.5)
    assert w_off.node_counters["cells_sent"][ex] > 0
    assert w_back.node_counters["socket_info_syscalls"][ex] > 0
    if after == "kistlite":  # interval 0: KISTLite runs in every pass, far more often than every 12 ms
        assert w_off.node_counters["scheduler_runs"][ex] > 3 * w_kist.node_counters["scheduler_runs"][ex] / 2


def _vegas_pair(client_fc: str, exit_fc: str):
    net = Network(LinkConfig(rtt_ms=50.0))
    c = net.add_node(NodeConfig(role="client", kist_interval_ms=2, flow_control=client_fc))
    x = net.add_node(NodeConfig(role="exit", kist_interval_ms=2, flow_control=exit_fc))
    return net, c, x


@pytest.mark.parametrize(("client_fc", "exit_fc", "vegas"),
                         [("vegas", "vegas", True), ("vegas", "sendme", False), ("sendme", "vegas", False)])
def test_a_circuit_uses_vegas_only_if_both_ends_do(client_fc, exit_fc, vegas):
    net, c, x = _vegas_pair(client_fc, exit_fc)
    circ = net.add_circuit([c, x])
    net.add_transfer(Transfer(circ, 498, BIG, 0.0))
    res = run(net, RunConfig(duration_s=3.0))
    inflight = res.circuit_max_inflight_cells[circ, 1]
    if vegas:
        assert inflight > 500 and res.circuit_final_cwnd_cells[circ, 1] != 124
    else:
        assert 450 <= inflight <= 550  # §13.1: the 500-cell stream window binds


def test_cc_parameters_are_read_by_circuits_built_after_the_consensus():
    net, c, x = _vegas_pair("vegas", "vegas")
    old, new = net.add_circuit([c, x]), net.add_circuit([c, x])
    net.add_transfer(Transfer(old, 498, BIG, 0.0))
    net.add_transfer(Transfer(new, 498, BIG, 1.0))
    sim = Simulation(net, RunConfig(duration_s=3.0))
    sim.advance_to(0.5)
    sim.apply([c, x], {"cc_alg": 0})
    sim.advance_to(3.0)
    res = sim.result()
    assert res.circuit_max_inflight_cells[old, 1] > 500            # built under Vegas, stays Vegas
    assert 450 <= res.circuit_max_inflight_cells[new, 1] <= 550     # built after cc_alg=0: SENDME windows


def test_windows_measure_stage_against_baseline_in_catalogue_names():
    net, rc = _path("kist", "sendme")
    sim = Simulation(net, rc)
    sim.advance_to(1.5)
    sim.apply(["guard1", 2, 3], {"KISTSchedRunInterval": 2})
    sim.advance_to(3.0)
    res = sim.result()
    whole = sim.window(0.0, 3.0)
    np.testing.assert_array_equal(whole.node_counters["cells_sent"], res.node_counters["cells_sent"])
    np.testing.assert_array_equal(whole.delay_hist, res.delay_hist)
    base, stage = sim.window(0.5, 1.5), sim.window(1.5, 2.5)
    np.testing.assert_array_equal(base.node_counters["scheduler_runs"] + stage.node_counters["scheduler_runs"],
                                  sim.window(0.5, 2.5).node_counters["scheduler_runs"])
    np.testing.assert_array_equal(base.chan_bytes + stage.chan_bytes, sim.window(0.5, 2.5).chan_bytes)
    chan = res.chan_between(3, 2)
    assert base.channel_throughput_bytes_per_s(chan) == pytest.approx(
        (res.chan_bytes_sent[3, chan] - res.chan_bytes_sent[1, chan]) / 1.0)
    samples = window_samples(base)  # the bulk transfers run in the baseline window
    assert set(samples) == set(METRICS) and all(catalogue.get(m) for m in samples)
    assert len(samples["relay_cpu_utilization"]) == 3 and np.all(samples["relay_cpu_utilization"] > 0)
    assert len(samples["quiet_circuit_latency_ms"]) > 0
    assert np.all(samples["relay_bandwidth_bytes_per_s"] > 1e6)
    assert np.all(window_samples(stage)["relay_bandwidth_bytes_per_s"] < 1e5)  # only the quiet circuit is left
    per_node = relay_values(stage)
    assert set(per_node["relay_rss_bytes"]) == {"guard1", "middle2", "exit3"}
    assert len(whole.transfer_ttlb_s) == int(np.sum(~np.isnan(res.transfer_ttlb_s)))


def test_a_window_can_be_measured_while_the_run_goes_on():
    net, rc = _path("kist", "sendme")
    sim = Simulation(net, rc)
    sim.advance_to(np.float64(1.2))              # off the 0.5 s sample grid
    early = sim.window(0.5, 1.2)
    sim.advance_to(3)
    later = sim.window(0.5, 1.2)
    np.testing.assert_array_equal(early.chan_bytes, later.chan_bytes)
    np.testing.assert_array_equal(early.node_counters["cells_sent"], later.node_counters["cells_sent"])
    np.testing.assert_array_equal(early.node_peaks["peak_queued_bytes"], later.node_peaks["peak_queued_bytes"])
    assert early.node_levels["kernel_bytes"].shape == (2, 4)   # samples at 0.5 and 1.0 s
    assert early.node_peaks["peak_queued_bytes"].max() > 0


def test_bad_input_is_refused_with_the_node_and_key():
    net, client, ex = _pair()
    sim = Simulation(net, RunConfig(duration_s=2.0))
    typo = r"node 1 \(exit\): 'KISTSchedRunIntervall'.*did you mean 'KISTSchedRunInterval'"
    with pytest.raises(SimConfigError, match=typo):
        sim.apply(ex, {"KISTSchedRunIntervall": 2})
    with pytest.raises(SimConfigError, match=r"node 1 \(exit\): KISTSchedRunInterval=3.5: consensus values are"):
        sim.apply(ex, {"KISTSchedRunInterval": 3.5})
    with pytest.raises(SimConfigError, match=r"nodes 0 \(client\), 1 \(exit\): cc_alg=4294967296: out of range"):
        sim.apply([client, ex], {"cc_alg": 2**32})
    with pytest.raises(SimConfigError, match="KISTSockBufSizeFactor"):
        sim.apply(ex, {"KISTSockBufSizeFactor": -1.0})
    with pytest.raises(SimConfigError, match="no node named 'nobody'"):
        sim.apply("nobody", {})
    net2, _, ex2 = _pair("0.4.7.16", "kist", schedulers=("kist",))
    with pytest.raises(SimConfigError, match=r"node 1 \(exit\).*tor exits"):
        Simulation(net2, RunConfig(duration_s=1.0)).apply(ex2, {"KISTSchedRunInterval": 0})
    sim.advance_to(1.0)
    with pytest.raises(SimConfigError, match="only moves forward"):
        sim.advance_to(0.5)
    with pytest.raises(SimConfigError, match="beyond the run's duration"):
        sim.advance_to(2.5)
    with pytest.raises(SimConfigError, match="has only reached 1 s"):
        sim.window(0.0, 2.0)
    with pytest.raises(SimConfigError, match="not a sample time"):
        sim.window(0.0, 0.25)
    with pytest.raises(SimConfigError, match="t0_s < t1_s"):
        sim.window(1.0, 0.0)
    with pytest.raises(SimConfigError, match="memory_limit_bytes"):
        Simulation(net, RunConfig(duration_s=1.0, memory_limit_bytes=100_000))
    with pytest.raises(SimConfigError, match="tor_version"):
        NodeConfig(tor_version="0.4.x").validate()
    with pytest.raises(SimConfigError, match="must start with the running scheduler"):
        NodeConfig(scheduler="kist", schedulers=("vanilla", "kist")).validate()
