"""The simulator's circuit trace end to end: what it records, that it changes nothing, and the measures
computed from a small simulated network."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from kistexp.anonymity import add_probes, attack_measures, isolate_circuits, scalars
from kistexp.errors import SimConfigError
from kistexp.sim import (
    CircuitTraceConfig,
    FlowControlConfig,
    LinkConfig,
    Network,
    NodeConfig,
    RunConfig,
    Simulation,
)
from kistexp.sim import layout as L
from kistexp.sim import workloads as wl

CELLS = 2000  # a response of 2000 DATA cells
TRACE = CircuitTraceConfig()


def _path_net(nic: float = 5e6) -> tuple[Network, list[int]]:
    """One client, guard, middle and exit; a 3-hop circuit with one download, a one-hop circuit to the
    guard with another."""
    net = Network(LinkConfig(rtt_ms=20.0))
    c, g, m, x = (net.add_node(NodeConfig(role=r, kist_interval_ms=10, nic_rate_bytes_per_s=nic))
                  for r in ("client", "guard", "middle", "exit"))
    full = net.add_circuit([c, g, m, x], "bulk")
    one = net.add_circuit([c, g], "probe")
    net.add_transfers([full, one], [498, 498], [CELLS * 498, CELLS * 498], [0.1, 0.3])
    return net, [c, g, m, x]


def _run(net: Network, rc: RunConfig, until: float | None = None) -> Simulation:
    sim = Simulation(net, rc)
    sim.advance_to(until if until is not None else rc.duration_s)
    return sim


@pytest.mark.parametrize("kind", ["sendme", "vegas"])
def test_an_observer_counts_every_cell_at_guard_exit_and_client(kind):
    net, (c, g, m, x) = _path_net()
    sim = _run(net, RunConfig(duration_s=4.0, seed=2, flow_control=FlowControlConfig(kind=kind),
                              circuit_trace=TRACE))
    assert (sim.result().transfer_ttlb_s > 0).all()  # both downloads finished
    tr = sim.circuit_trace(0.0, 4.0)
    assert tr.circuits.tolist() == [0, 1] and tr.paths == ((c, g, m, x), (c, g)) and tr.n_windows == 40
    total = {name: tr.series(name).sum(axis=1) for name in
             ("guard_in_up", "guard_in_down", "exit_out_up", "exit_out_down", "client_in_down")}
    # downstream: the response's DATA cells leave the exit, enter the guard and reach the client
    assert total["exit_out_down"].tolist() == [CELLS, CELLS]
    assert total["guard_in_down"].tolist() == [CELLS, 0]  # a one-hop circuit's cells start at its guard
    assert total["client_in_down"].tolist() == [CELLS, CELLS]
    # upstream: the request and the client's SENDMEs, the same cells at both ends
    assert (total["guard_in_up"] == total["exit_out_up"]).all()
    sendmes = CELLS // (31 if kind == "vegas" else 100)
    assert (total["guard_in_up"] >= 1 + sendmes).all()
    # a cell leaves the exit before it enters the guard, and reaches the client after that
    first = {k: np.argmax(tr.series(k)[0] > 0) for k in ("exit_out_down", "guard_in_down", "client_in_down")}
    assert first["exit_out_down"] <= first["guard_in_down"] <= first["client_in_down"]
    # every departure but each circuit's first has a gap before it
    assert tr.gap_hist.sum() == CELLS * 2 - 2
    assert tr.exit_nodes.tolist() == [g, x] and tr.circuit_exit_slot.tolist() == [1, 0]
    assert tr.exit_scheduler == ("kist", "kist") and tr.exit_interval_ms.tolist() == [10, 10]
    # the exit's RTT samples: at least the path's propagation round trip (20 ms a hop)
    assert tr.rtt_count[0].sum() >= sendmes - 1 and tr.rtt_count[1].sum() >= sendmes - 1
    has = tr.rtt_count > 0
    assert (tr.rtt_min_ms[0][has[0]] >= 3 * 20.0).all() and (tr.rtt_min_ms[1][has[1]] >= 20.0).all()
    assert (tr.rtt_sum_ms[has] / tr.rtt_count[has] >= tr.rtt_min_ms[has] - 1e-9).all()
    assert tr.transfer_trace_index.tolist() == [0, 1]
    res = sim.result()
    np.testing.assert_allclose(tr.transfer_ttfb_s, res.transfer_ttfb_s)


def test_windows_of_a_trace_add_up_and_bounds_are_checked():
    net, _ = _path_net()
    sim = _run(net, RunConfig(duration_s=4.0, seed=2, circuit_trace=CircuitTraceConfig(block_s=0.5)), until=3.0)
    whole = sim.circuit_trace(0.0, 3.0)
    parts = [sim.circuit_trace(a, a + 1.0) for a in (0.0, 1.0, 2.0)]
    np.testing.assert_array_equal(np.concatenate([p.exit_out for p in parts], axis=2), whole.exit_out)
    np.testing.assert_array_equal(sum(p.gap_hist for p in parts), whole.gap_hist)
    np.testing.assert_array_equal(np.concatenate([p.rtt_count for p in parts], axis=1), whole.rtt_count)
    np.testing.assert_array_equal(whole.rebinned("client_in_down", 1.0),
                                  np.stack([p.client_in.sum(axis=1) for p in parts], axis=1))
    with pytest.raises(SimConfigError, match="block_s"):
        sim.circuit_trace(0.25, 1.0)
    with pytest.raises(SimConfigError, match="only reached"):
        sim.circuit_trace(0.0, 4.0)
    untraced = _run(_path_net()[0], RunConfig(duration_s=1.0))
    with pytest.raises(SimConfigError, match="records no circuit trace"):
        untraced.circuit_trace(0.0, 1.0)
    with pytest.raises(SimConfigError, match="circuit 7 does not exist"):
        Simulation(_path_net()[0], RunConfig(circuit_trace=CircuitTraceConfig(circuits=(7,))))
    with pytest.raises(SimConfigError, match="whole number of windows"):
        RunConfig(circuit_trace=CircuitTraceConfig(window_ms=300, block_s=1.0)).validate()


def _mixed(seed: int = 5) -> Network:
    mix = wl.WorkloadMix(bulk=1, web=6, onionperf=1, interactive=2)
    load = wl.build_workload(mix, circuits=40, duration_s=5.0, seed=seed)
    topo = wl.small_network(8, 40, clients=8, seed=seed, relay=NodeConfig(kist_interval_ms=2, nic_rate_bytes_per_s=4e6),
                            client=NodeConfig(role="client", kist_interval_ms=2), link=LinkConfig(rtt_ms=30.0),
                            labels=load.kinds)
    wl.add_workload(topo.network, load, topo.circuits, seed=seed)
    return topo.network


@pytest.mark.parametrize("kind", ["sendme", "vegas"])
def test_tracing_changes_no_result_of_a_seed(kind):
    rc = RunConfig(duration_s=5.0, seed=4, flow_control=FlowControlConfig(kind=kind))
    plain = _run(_mixed(), rc)
    traced = _run(_mixed(), attrs.evolve(rc, circuit_trace=CircuitTraceConfig(circuits=(0, 3, 5))))
    a, b = plain.result(), traced.result()
    assert (a.cells_scheduled, a.events) == (b.cells_scheduled, b.events)
    for name in ("transfer_ttfb_s", "transfer_ttlb_s", "chan_bytes_sent", "delay_hist", "run_time_s",
                 "circuit_final_cwnd_cells"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # only the circuits asked for are traced
    assert traced.circuit_trace(0.0, 5.0).circuits.tolist() == [0, 3, 5]
    w1, w2 = plain.window(1.0, 5.0), traced.window(1.0, 5.0)
    np.testing.assert_array_equal(w1.chan_bytes, w2.chan_bytes)


def test_measures_of_a_small_simulated_network_and_its_leaky_control():
    net = _mixed(seed=6)
    targets = [c for c, (p, lbl) in enumerate(net.circuits) if lbl in ("bulk", "web", "onionperf")][:10]
    guards = sorted({net.circuits[c][0][1] for c in range(len(net.circuits))})
    iso = isolate_circuits(net)
    probes = add_probes(net, guards, start_s=0.0)
    assert all(net.circuits[p] == ((net.circuits[p][0][0], r), "probe") for r, p in probes.items())
    # the control: the same circuits, each on relays and channels of its own
    assert [lbl for _, lbl in iso.network.circuits] == [lbl for _, lbl in net.circuits[:len(iso.paths)]]
    used = {}
    for j, path in enumerate(iso.paths):
        for u, v in zip(path, path[1:], strict=False):
            assert used.setdefault(iso.network.channel_between(u, v), j) == j
    for a, b in zip(iso.network.transfer_arrays(), _mixed(seed=6).transfer_arrays(), strict=True):
        np.testing.assert_array_equal(a, b)
    ctl_probes = add_probes(iso.network, [iso.relay_copies(c)[0] for c in targets], start_s=0.0)
    regions = {n: ("EU" if n % 2 else "NA") for n, cfg in enumerate(net.nodes) if cfg.role == "client"}
    out = []
    for network, pr in ((net, probes), (iso.network, ctl_probes)):
        sim = _run(network, RunConfig(duration_s=5.0, seed=1, circuit_trace=TRACE))
        m = attack_measures(sim.circuit_trace(1.0, 5.0), regions=regions, probes=pr, targets=targets, fprs=(0.1,),
                            segment_s=1.0)
        out.append(m)
    base, ctl = out
    assert base.flow.n_flows > 10 and 0.0 <= base.flow.tpr[0.1] <= 1.0
    assert base.fingerprint is not None and base.fingerprint.targets >= 5
    assert base.gaps.total > 0 and base.latency.ttfb is not None
    figures = scalars(ctl, base)
    assert figures["attack_gap_ks_distance"] > 0.0 and scalars(base)["attack_gap_ks_distance"] == 0.0
    assert set(figures) >= {"attack_flow_tpr_at_fpr_0.1", "attack_fingerprint_auc", "attack_mi_region_ttfb_bits",
                            "attack_gap_share_at_run_period", "attack_rtt_cv"}


def test_kernel_queue_compaction_moves_the_traces_copy_with_the_cells():
    """``state.grow_kq`` compacts the kernel-queue rings; the trace's copy beside each slot moves too."""
    from kistexp.sim.state import grow_kq

    rc = RunConfig(duration_s=3.0, seed=2, circuit_trace=TRACE)
    plain = _run(_path_net(nic=1e6)[0], rc)
    sim = Simulation(_path_net(nic=1e6)[0], rc)
    queued = 0
    for t in (0.2, 0.35, 0.5, 0.9, 1.3):
        sim.advance_to(t)
        queued += int(sim._S.ci[L.CI_KQ_N].sum())
        sim._S = grow_kq(sim._S)
        assert sim._S.ctkq.shape == sim._S.kq.shape
    assert queued > 0
    sim.advance_to(3.0)
    a, b = plain.circuit_trace(0.0, 3.0), sim.circuit_trace(0.0, 3.0)
    for name in ("guard_in", "exit_out", "client_in", "gap_hist", "rtt_count", "rtt_sum_ms"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.exit_out.sum() > 0
