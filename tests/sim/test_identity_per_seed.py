"""The simulator's results per seed, pinned (issue 38, point 3): a speed-up must not move a single bit.

Each case is a small run of the kind the population predictions make (a network shaped like a sample
of the consensus at full NIC rates, a new consensus mid-run), or a workload network through the kernel that
keeps raw per-cell delays, under KIST, KISTLite and Vanilla and two or three seeds.  The digest
covers the window samples in the metric vocabulary, the node levels and counters, the bytes per
channel and node, the delay histograms, the transfers' first and last bytes and the scheduler-run
log, and the counts of cells and events.  The figures were recorded from the code before the speed
work of issue 38; a change that moves any of them changes what the model predicts and is not a
speed-up.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig, RunConfig, Simulation
from kistexp.sim import workloads as wl
from kistexp.sim.vocabulary import relay_values, window_samples


def _consensus_case(seed: int, scheduler: str | None, interval_ms: int):
    """A network shaped like a sampled consensus at full NIC rates (``kistexp.population.simnet``),
    built here from the simulator's own API so that changes to the population model leave it alone:
    relays with lognormal NIC rates, KIST and KISTLite with 100, 250 and 1,000 Hz kernel ticks, a
    few holding a torrc interval, clients on three circuits each over bandwidth-weighted paths,
    channels of varied round trips, web, bulk, OnionPerf-like and interactive traffic."""
    rng = np.random.default_rng(1000 + seed)
    net = Network(LinkConfig(rtt_ms=8.0))
    relays, rates = [], []
    for i in range(60):
        rate = float(rng.lognormal(np.log(4e6), 1.0))
        torrc = i % 13 == 5
        relays.append(net.add_node(NodeConfig(
            role="relay", scheduler=scheduler or ("kist" if rng.random() < 0.75 else "kistlite"),
            kist_interval_ms=10 if torrc else interval_ms, kernel_tick_ms=1000.0 / int(rng.choice([100, 250, 1000])),
            nic_rate_bytes_per_s=rate, tor_version=str(rng.choice(["0.4.8.13", "0.4.9.11"])),
            torrc_overrides=("KISTSchedRunInterval",) if torrc else ())))
        rates.append(rate)
    weights = np.array(rates) / sum(rates)
    rtt = {}
    for k in range(48):
        client = net.add_node(NodeConfig(role="client", scheduler=scheduler or "kist", kist_interval_ms=2,
                                         nic_rate_bytes_per_s=12.5e6))
        kind = ("web", "web", "web", "bulk", "interactive", "perf")[k % 6]
        for _ in range(3):
            path = [client, *(relays[i] for i in rng.choice(len(relays), size=3, replace=False, p=weights))]
            for u, v in zip(path, path[1:], strict=False):
                if net.channel_between(u, v) is None:
                    rtt[u, v] = float(rng.uniform(5, 150))
                    net.add_channel(u, v, LinkConfig(rtt_ms=rtt[u, v]))
            c = net.add_circuit(path, kind)
            if kind == "interactive":
                net.add_interactive(InteractiveFlow(c, float(rng.uniform(0, 0.1)), 3.0, 0.1))
                continue
            size, rate = {"web": (320 * 1024, 2.0), "bulk": (10 * 1024 * 1024, 0.3), "perf": (1024 * 1024, 0.5)}[kind]
            starts = np.cumsum(rng.exponential(1 / rate, size=12))
            starts = starts[starts < 3.0]
            net.add_transfers(np.full(len(starts), c), np.full(len(starts), 498), np.full(len(starts), size), starts)
    return net, RunConfig(duration_s=3.0, seed=seed, sample_interval_s=0.5), relays


def _workload_case(seed: int, scheduler: str | None, interval_ms: int):
    mix = wl.WorkloadMix(bulk=1, web=4, onionperf=1, interactive=2)
    load = wl.build_workload(mix, circuits=40, duration_s=3.0, seed=seed)
    topo = wl.small_network(12, 40, clients=8, seed=seed,
                            relay=NodeConfig(scheduler=scheduler, kist_interval_ms=interval_ms,
                                             nic_rate_bytes_per_s=20e6),
                            client=NodeConfig(role="client", scheduler=scheduler, kist_interval_ms=interval_ms),
                            link=LinkConfig(rtt_ms=20.0, loss_rate=0.002), labels=load.kinds)
    wl.add_workload(topo.network, load, topo.circuits, seed=seed)
    # raw per-cell delays kept: the kernel with the record bookkeeping, not the lean one
    rc = RunConfig(duration_s=3.0, seed=seed, sample_interval_s=0.5, cell_delays_max=5000, trace_chan=1)
    return topo.network, rc, list(topo.relays)


def _update(h, value) -> None:
    h.update(np.ascontiguousarray(value).tobytes())


def _digest(build, seed: int, scheduler: str | None, interval_ms: int) -> dict:
    net, rc, relays = build(seed, scheduler, interval_ms)
    sim = Simulation(net, rc)
    h = hashlib.sha256()
    sim.advance_to(1.5)
    sim.apply(relays, {"KISTSchedRunInterval": 10 if interval_ms != 10 else 2})
    sim.advance_to(3.0)
    for t0, t1 in ((0.5, 1.5), (1.5, 3.0)):
        w = sim.window(t0, t1)
        samples = window_samples(w)
        for name in sorted(samples):
            _update(h, samples[name])
        per_relay = relay_values(w)
        for name in sorted(per_relay):
            for node in sorted(per_relay[name]):
                _update(h, per_relay[name][node])
        for group in (w.node_counters, w.node_peaks, w.node_levels):
            for name in sorted(group):
                _update(h, group[name])
        _update(h, w.chan_bytes)
        _update(h, [w.node_bytes_per_s(n) for n in range(len(w.node_names))])
        _update(h, w.delay_hist)
        for a in (w.transfer_circuit, w.transfer_ttfb_s, w.transfer_ttlb_s):
            _update(h, a)
    res = sim.result()
    for a in (res.transfer_ttfb_s, res.transfer_ttlb_s, res.chan_bytes_sent, res.delay_hist, res.run_time_s,
              res.run_node, res.run_cells, res.circuit_max_inflight_cells, res.circuit_final_cwnd_cells,
              res.chan_final_cwnd, res.chan_losses, res.raw_delays, res.trace):
        _update(h, a)
    for name in sorted(res.node_counters):
        _update(h, res.node_counters[name])
    return dict(cells=int(res.cells_scheduled), events=int(res.events), digest=h.hexdigest()[:20])


CASES = {
    ("consensus", 1, None, 2): dict(cells=1000762, events=243375, digest="d4740d231cf4f17311c7"),
    ("consensus", 2, None, 2): dict(cells=833173, events=204066, digest="ba69b5094800f58e0b15"),
    ("consensus", 1, "kistlite", 10): dict(cells=872796, events=216898, digest="04c2552c36f98bddeaae"),
    ("consensus", 3, "vanilla", 10): dict(cells=889536, events=294432, digest="e60edb3157615e2e2db5"),
    ("workload", 1, "kist", 2): dict(cells=149904, events=49305, digest="99bec8477b04346c9aa9"),
    ("workload", 2, "kist", 10): dict(cells=155474, events=49374, digest="a53573bebfc48119e2c7"),
    ("workload", 1, "kistlite", 2): dict(cells=160302, events=46783, digest="c4afcb9f341ce32b0a00"),
    ("workload", 3, "vanilla", 10): dict(cells=158343, events=71794, digest="98936f12b3bd38de745e"),
}
BUILDERS = {"consensus": _consensus_case, "workload": _workload_case}


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "-".join(map(str, c)))
def test_results_per_seed_are_the_recorded_ones(case):
    kind, seed, scheduler, interval_ms = case
    assert _digest(BUILDERS[kind], seed, scheduler, interval_ms) == CASES[case]



def test_simulations_share_no_run_state():
    # two simulations of one network in a process must not share an array the kernel writes (a
    # cached initial array, handed to both, would carry one run's heap positions into the other)
    net, rc, _ = _consensus_case(2, None, 2)
    a, b = Simulation(net, rc)._S, Simulation(net, rc)._S
    for name in ("ckey", "ci", "cf", "qi", "qf", "di", "ni", "nf", "cells", "ev", "pend_heap", "cmux_heap", "hist",
                 "circ_sum", "kq", "free"):
        assert not np.shares_memory(getattr(a, name), getattr(b, name)), name
