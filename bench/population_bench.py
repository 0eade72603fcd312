"""Speed of sampled-population simulations (issue 9, point 10).

Prints, per case: relays, client processes, circuits, the NIC scale used, wall time (build and run),
simulated seconds per core-second and peak RSS, each case in its own process (so peak RSS is its own):

(a) a 2,000-relay sample of the shared consensus at the default load (0.4), 60 simulated seconds, with
    the NICs scaled so the offered client traffic fits ``--byte-budget`` (what ``kistexp simulate`` does),
    and the same sample at full NIC rates for ``--full-rate-seconds`` simulated seconds;
(b) the whole consensus (6,075 relays after tornettools' filter) at light load (0.1), 60 s;
(c) the largest of the scales ``--scales`` whose 60 simulated seconds at the default load and full NIC
    rates finish within 10 minutes.

The machine is shared: ``uptime`` is printed before and after, and core-seconds are the process's user +
system CPU time, not wall time.

    .venv/bin/python bench/population_bench.py [--only a|b|c] [--byte-budget B] [--full-rate-seconds S]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

LIMIT_S = 600.0


def _one(scale: float, load: float, duration: float, bandwidth_scale: float | None, budget: float) -> dict:
    import attrs

    from kistexp.localnet import machine
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.simnet import TrafficModel, build_network
    from kistexp.sim import RunConfig, Simulation

    t0 = time.perf_counter()
    c0 = time.process_time()
    full = load_population()
    pop = sample(full, scale, 1) if scale < 1 else sample(full, 1.0, 1)
    traffic = TrafficModel(load=load, warmup_s=min(10.0, duration / 6))
    sn = build_network(pop, duration_s=duration, seed=1, interval_ms=2, traffic=traffic, scale=scale)
    if bandwidth_scale is None and sn.offered_bytes_per_s > budget:
        bandwidth_scale = budget / sn.offered_bytes_per_s
    if bandwidth_scale is not None and bandwidth_scale != 1.0:
        sn = build_network(pop, duration_s=duration, seed=1, interval_ms=2, scale=scale,
                           traffic=attrs.evolve(traffic, bandwidth_scale=bandwidth_scale))
    build_s = time.perf_counter() - t0
    sim = Simulation(sn.network, RunConfig(duration_s=duration, seed=1, memory_limit_bytes=12 * 1024**3))
    t1 = time.perf_counter()
    c1 = time.process_time()
    sim.advance_to(duration)
    run_s = time.perf_counter() - t1
    cpu_s = time.process_time() - c1
    res = sim.result()
    return {
        "scale": scale, "relays": len(pop), "clients": len(sn.client_nodes) + len(sn.perf_nodes),
        "circuits": len(sn.network.circuits), "channels": len(sn.network.channels),
        "transfers": sn.network.n_transfers, "load": load, "bandwidth_scale": sn.traffic.bandwidth_scale,
        "offered_MBps": sn.offered_bytes_per_s / 1e6, "duration_s": duration, "build_s": build_s,
        "run_wall_s": run_s, "run_cpu_s": cpu_s, "total_cpu_s": time.process_time() - c0,
        "sim_s_per_core_s": duration / cpu_s if cpu_s else float("inf"),
        "cells_scheduled": int(res.cells_scheduled),
        "peak_rss_mib": machine.peak_rss_mib(),
    }


def _spawn(args: list[str], timeout: float) -> dict | None:
    try:
        out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _print(name: str, r: dict | None) -> None:
    if r is None:
        print(f"{name}: did not finish within the limit")
        return
    print(f"{name}: {r['relays']} relays, {r['clients']} client processes, {r['circuits']} circuits, "
          f"{r['channels']} channels, {r['transfers']} transfers; load {r['load']}, NICs x {r['bandwidth_scale']:.3g} "
          f"({r['offered_MBps']:.0f} MB/s offered); {r['duration_s']:g} simulated s: build {r['build_s']:.1f} s, "
          f"run {r['run_wall_s']:.1f} s wall / {r['run_cpu_s']:.1f} core-s -> {r['sim_s_per_core_s']:.3f} "
          f"simulated s per core-s ({1 / r['sim_s_per_core_s']:.1f} core-s per simulated s), "
          f"{r['cells_scheduled'] / max(r['run_cpu_s'], 1e-9) / 1e6:.2f} M cells per core-s, "
          f"peak RSS {r['peak_rss_mib']:.0f} MiB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=5, metavar=("SCALE", "LOAD", "DURATION", "BWSCALE", "BUDGET"))
    ap.add_argument("--only", choices=("a", "b", "c"))
    ap.add_argument("--byte-budget", type=float, default=75e6)
    ap.add_argument("--full-rate-seconds", type=float, default=5.0)
    ap.add_argument("--scales", default="0.1,0.2,0.33")
    a = ap.parse_args()
    if a.child:
        scale, load, duration, bw, budget = a.child
        print(json.dumps(_one(float(scale), float(load), float(duration), None if bw == "auto" else float(bw),
                              float(budget))))
        return
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    budget = str(a.byte_budget)
    scale_2000 = str(2000 / 6075)
    if a.only in (None, "a"):
        _print("(a) 2,000 relays, load 0.4, NICs scaled to the budget",
               _spawn([scale_2000, "0.4", "60", "auto", budget], 3 * LIMIT_S))
        _print(f"(a') 2,000 relays, load 0.4, full NIC rates, {a.full_rate_seconds:g} s",
               _spawn([scale_2000, "0.4", str(a.full_rate_seconds), "1.0", budget], 3 * LIMIT_S))
    if a.only in (None, "b"):
        _print("(b) whole consensus, load 0.1, NICs scaled to the budget",
               _spawn(["1.0", "0.1", "60", "auto", budget], 3 * LIMIT_S))
    if a.only in (None, "c"):
        best = None
        for s in (float(x) for x in a.scales.split(",")):
            t = time.perf_counter()
            r = _spawn([str(s), "0.4", "60", "1.0", budget], LIMIT_S)
            if r is not None and time.perf_counter() - t <= LIMIT_S:
                best = r
                _print(f"    scale {s:g} finished", r)
            else:
                print(f"    scale {s:g}: not finished within {LIMIT_S:.0f} s of wall time", flush=True)
                break
        _print("(c) largest scale finishing 60 simulated s within 10 min (load 0.4, full NIC rates)", best)
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
