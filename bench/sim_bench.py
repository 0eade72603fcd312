"""Speed of the relay-scheduling simulator (issue 4, point 9).

Prints, per scenario: cells scheduled per wall-second, simulated seconds per wall-second and the
peak RSS of the process, excluding numba's one-time compile (reported separately).

(a) one relay with 200 channels (100 client-side, 100 exit-side neighbours) and 2,000 mixed
    circuits through it, 60 s simulated;
(b) a 100-relay network (guards, middles, exits) with 100 clients and 1,000 3-hop circuits,
    60 s simulated.

Mixed circuits: 10 % bulk (5 MiB downloads back to back), 60 % web-like (320 KiB, think time
uniform in 1..30 s), 30 % interactive (a 1-cell request and a 2-cell answer every 100 ms).

    .venv/bin/python bench/sim_bench.py [--duration S] [--scheduler kist|kistlite|vanilla] [--only a|b]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig, RunConfig, run

BULK = 5 * 1024 * 1024
WEB = 320 * 1024


def _mixed(net: Network, circuits: list[int], duration_s: float, rng: np.random.Generator) -> None:
    kinds = rng.choice(3, size=len(circuits), p=[0.1, 0.6, 0.3])
    for c, kind in zip(circuits, kinds, strict=True):
        t0 = float(rng.uniform(0, 1))
        if kind == 0:  # bulk: enough back-to-back 5 MiB downloads to stay busy
            n = 40
            net.add_transfers([c] * n, [498] * n, [BULK] * n, t0 + np.arange(n) * 1.5)
        elif kind == 1:
            starts = t0 + np.cumsum(rng.uniform(1, 30, size=int(duration_s)))
            starts = starts[starts < duration_s]
            net.add_transfers([c] * len(starts), [498] * len(starts), [WEB] * len(starts), starts)
        else:
            net.add_interactive(InteractiveFlow(c, t0, duration_s, 0.1, 498, 996))


def one_relay(scheduler: str, duration_s: float, seed: int = 1) -> Network:
    rng = np.random.default_rng(seed)
    net = Network(LinkConfig(rtt_ms=20.0))
    relay = net.add_node(NodeConfig(role="relay", scheduler=scheduler, kist_interval_ms=2,
                                    nic_rate_bytes_per_s=125e6), "relay")
    clients = [net.add_node(NodeConfig(role="client", scheduler=scheduler, kist_interval_ms=2))
               for _ in range(100)]
    exits = [net.add_node(NodeConfig(role="exit", scheduler=scheduler, kist_interval_ms=2))
             for _ in range(100)]
    for n in clients + exits:
        net.add_channel(n, relay, LinkConfig(rtt_ms=float(rng.uniform(5, 80))))
    circuits = [net.add_circuit([clients[i % 100], relay, exits[int(rng.integers(100))]], f"c{i % 3}")
                for i in range(2000)]
    _mixed(net, circuits, duration_s, rng)
    return net


def network_100(scheduler: str, duration_s: float, seed: int = 2) -> Network:
    rng = np.random.default_rng(seed)
    net = Network()
    roles = ["guard"] * 30 + ["middle"] * 40 + ["exit"] * 30
    relays = [net.add_node(NodeConfig(role=r, scheduler=scheduler, kist_interval_ms=2,
                                      nic_rate_bytes_per_s=float(rng.choice([12.5e6, 50e6, 125e6]))))
              for r in roles]
    guards, middles, exits = relays[:30], relays[30:70], relays[70:]
    clients = [net.add_node(NodeConfig(role="client", scheduler=scheduler, kist_interval_ms=2))
               for _ in range(100)]
    circuits = []
    for i in range(1000):
        path = [clients[i % 100], guards[int(rng.integers(30))], middles[int(rng.integers(40))],
                exits[int(rng.integers(30))]]
        for u, v in zip(path, path[1:], strict=False):
            if net.channel_between(u, v) is None:
                net.add_channel(u, v, LinkConfig(rtt_ms=float(rng.uniform(5, 120))))
        circuits.append(net.add_circuit(path, f"c{i % 3}"))
    _mixed(net, circuits, duration_s, rng)
    return net


def _measure(name: str, net: Network, duration_s: float) -> None:
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = run(net, RunConfig(duration_s=duration_s, seed=7, sample_interval_s=1.0))
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"({name}) nodes={len(net.nodes)} channels={len(net.channels)} circuits={len(net.circuits)} "
          f"transfers={net.n_transfers}")
    print(f"    cells scheduled: {res.cells_scheduled:,}  events: {res.events:,}  "
          f"transfers finished: {int((~np.isnan(res.transfer_ttlb_s)).sum()):,}")
    print(f"    kernel wall: {res.wall_s:.2f} s (run() total {total:.2f} s wall, {cpu:.2f} s CPU)")
    print(f"    cells scheduled per wall-second: {res.cells_scheduled / res.wall_s / 1e6:.2f} M")
    print(f"    simulated seconds per wall-second: {duration_s / res.wall_s:.2f}")
    print(f"    peak RSS: {rss_mib:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--scheduler", default="kist")
    ap.add_argument("--only", choices=["a", "b"])
    args = ap.parse_args()

    # compile (or load from numba's cache) on a tiny network first
    t0 = time.perf_counter()
    warm = Network()
    a, b = warm.add_node(NodeConfig(role="client")), warm.add_node(NodeConfig(role="exit"))
    warm.add_transfers([warm.add_circuit([a, b])], [498], [100_000], [0.0])
    run(warm, RunConfig(duration_s=0.2))
    print(f"compile or cache load: {time.perf_counter() - t0:.1f} s (scheduler {args.scheduler})")
    if args.only in (None, "a"):
        _measure("a", one_relay(args.scheduler, args.duration), args.duration)
    if args.only in (None, "b"):
        _measure("b", network_100(args.scheduler, args.duration), args.duration)


if __name__ == "__main__":
    main()
