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

Issue 38's speed targets (``--speed``, and ``--whole-consensus``, which takes the better part of an hour):

(s) the 2,000-relay sample at full NIC rates (``TrafficModel.bandwidth_scale`` 1, load 0.4), advanced in
    ``--speed-step`` pieces up to ``--speed-seconds``: core-seconds (``time.process_time``) per simulated
    second for each piece and overall, target <= 2;
(w) the whole consensus at full NIC rates, 60 simulated seconds: peak RSS (target <= 8 GiB), wall time
    and core-seconds.

Each figure is printed with the CPU model (/proc/cpuinfo); ``--history`` appends them to
bench/history/simulator-speed.csv as ``bench/sim_bench.py --history`` does.

    .venv/bin/python bench/population_bench.py [--only a|b|c] [--byte-budget B] [--full-rate-seconds S]
    .venv/bin/python bench/population_bench.py --speed [--speed-seconds 20] [--whole-consensus] [--history]

Issue 37's cost of the attack measures (``--attacks``): one run of ``kistexp simulate``'s cells at the
bundled plan's settings (scale 0.02, 60 simulated s, load 0.4, full NIC rates or with ``--fast`` NICs
scaled to the fast-mode budget, KIST at 10 ms)
untraced and with the circuit trace of the stage window (``kistexp.population.attacks``), ``--repeats``
alternating runs each, the least CPU-seconds of each kept (the machine is shared: the least is the run
least disturbed); then the CPU-seconds of computing the measures from the trace. Both are printed as a
share of the untraced run, with the CPU model; target: together below 10 %.

    .venv/bin/python bench/population_bench.py --attacks [--repeats 3] [--attack-seeds 1,2] [--fast]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LIMIT_S = 600.0
SCALE_2000 = 2000 / 6075


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


def _speed_one(scale: float, duration: float, step: float) -> dict:
    """The full-rate network of ``scale``, advanced in ``step`` pieces: core-seconds per piece."""
    from kistexp.localnet import machine
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.simnet import TrafficModel, build_network
    from kistexp.sim import RunConfig, Simulation, warm_up

    warm_up()
    t0 = time.perf_counter()
    full = load_population()
    pop = sample(full, scale, 1) if scale < 1 else full
    sn = build_network(pop, duration_s=duration, seed=1, interval_ms=2, scale=scale,
                       traffic=TrafficModel(load=0.4, warmup_s=min(10.0, duration / 6)))
    sim = Simulation(sn.network, RunConfig(duration_s=duration, seed=1, memory_limit_bytes=12 * 1024**3))
    build_s = time.perf_counter() - t0
    pieces = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    t = 0.0
    while t < duration:
        t = min(duration, t + step)
        c = time.process_time()
        sim.advance_to(t)
        pieces.append((t, time.process_time() - c))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    res = sim.result()
    return {"relays": len(pop), "circuits": len(sn.network.circuits), "channels": len(sn.network.channels),
            "transfers": sn.network.n_transfers, "duration_s": duration, "build_s": build_s, "run_wall_s": wall,
            "run_cpu_s": cpu, "pieces": pieces, "cells_scheduled": int(res.cells_scheduled),
            "events": int(res.events), "peak_rss_mib": machine.peak_rss_mib(), "cpu_model": machine.cpu_model()}


def _speed(a: argparse.Namespace) -> list[dict]:
    rows = []
    r = _spawn_speed([str(SCALE_2000), str(a.speed_seconds), str(a.speed_step)], 12 * LIMIT_S)
    if r is None:
        print("(s) 2,000 relays at full NIC rates: did not finish")
    else:
        per = r["run_cpu_s"] / r["duration_s"]
        prev = 0.0
        steps = []
        for t, c in r["pieces"]:
            steps.append(f"{prev:g}-{t:g} s: {c / (t - prev):.2f}")
            prev = t
        print(f"(s) 2,000 relays at full NIC rates, load 0.4, {r['duration_s']:g} simulated s on {r['cpu_model']}: "
              f"{r['relays']} relays, {r['circuits']} circuits, {r['channels']} channels; "
              f"{per:.2f} core-s per simulated s (target <= 2; {r['run_cpu_s']:.1f} core-s, "
              f"{r['run_wall_s']:.1f} s wall), {r['cells_scheduled'] / r['run_cpu_s'] / 1e6:.2f} M cells per core-s, "
              f"peak RSS {r['peak_rss_mib']:.0f} MiB; per piece (core-s per simulated s): {', '.join(steps)}",
              flush=True)
        note = f"2,000-relay sample at full NIC rates, load 0.4, {r['duration_s']:g} s simulated"
        rows += [{"case": "s", "metric": "core_s_per_sim_s", "value": per, "unit": "core-s", "note": note},
                 {"case": "s", "metric": "cells_per_cpu_s", "value": r["cells_scheduled"] / r["run_cpu_s"] / 1e6,
                  "unit": "M cells/s", "note": note},
                 {"case": "s", "metric": "peak_rss", "value": r["peak_rss_mib"], "unit": "MiB", "note": note}]
    if a.whole_consensus:
        r = _spawn_speed(["1.0", "60", "10"], 12 * LIMIT_S)
        if r is None:
            print("(w) whole consensus at full NIC rates: did not finish within two hours")
            return rows
        print(f"(w) whole consensus at full NIC rates, load 0.4, 60 simulated s on {r['cpu_model']}: "
              f"{r['relays']} relays, {r['circuits']} circuits, {r['channels']} channels; peak RSS "
              f"{r['peak_rss_mib'] / 1024:.2f} GiB (target <= 8), {r['run_wall_s']:.0f} s wall, "
              f"{r['run_cpu_s']:.0f} core-s ({r['run_cpu_s'] / 60:.1f} core-s per simulated s), build "
              f"{r['build_s']:.0f} s", flush=True)
        note = "whole consensus at full NIC rates, load 0.4, 60 s simulated"
        rows += [{"case": "w", "metric": "peak_rss", "value": r["peak_rss_mib"], "unit": "MiB", "note": note},
                 {"case": "w", "metric": "run_cpu", "value": r["run_cpu_s"], "unit": "s", "note": note},
                 {"case": "w", "metric": "run_wall", "value": r["run_wall_s"], "unit": "s", "note": note}]
    return rows


def _attacks_cost(seeds: list[int], repeats: int, fast: bool = False) -> None:
    """The cost of the attack measures against the run they come from (see the module docstring)."""
    from kistexp.localnet import machine
    from kistexp.population import attacks
    from kistexp.population.classes import load_class_shares
    from kistexp.population.predict import FAST_BYTE_BUDGET, FULL_RATES, _plan_network
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample
    from kistexp.population.simnet import TrafficModel
    from kistexp.sim import RunConfig, Simulation, warm_up

    warm_up()
    warm_up(keep_raw_delays=True)  # the kernel that records, compiled before anything is timed
    full = load_population()
    duration, traffic = 60.0, TrafficModel(load=0.4, warmup_s=10.0)
    t0, t1 = attacks.stage_trace_window(duration, traffic.warmup_s)
    plain_all = traced_all = measure_all = 0.0
    for seed in seeds:
        sn = _plan_network(sample(full, 0.02, seed), seed=seed, duration_s=duration, traffic=traffic,
                           shares=load_class_shares(), scale=0.02,
                           byte_budget=FAST_BYTE_BUDGET if fast else FULL_RATES)
        plain, traced, measured = [], [], []
        for _ in range(repeats):
            for trace in (None, attacks.trace_config(sn, t0)):
                c0 = time.process_time()
                sim = Simulation(sn.network, RunConfig(duration_s=duration, seed=seed, circuit_trace=trace))
                sn.apply(sim, range(len(sn.network.nodes)), {"KISTSchedRunInterval": 10})
                sim.advance_to(duration)
                (plain if trace is None else traced).append(time.process_time() - c0)
                if trace is not None:
                    measured.append(attacks.measure_run(sim, sn, t0, t1, seed=seed))
        m = min(measured, key=lambda r: r.cpu_s)
        print(f"    network {seed}: {len(sn.population)} relays, {len(attacks.flow_circuits(sn))} traced circuits, "
              f"traced span [{t0:g}, {t1:g}) s, {m.flows:,} flows; untraced {min(plain):.2f} CPU-s, traced "
              f"{min(traced):.2f} CPU-s, measures {m.cpu_s:.2f} CPU-s (least of {repeats})", flush=True)
        plain_all += min(plain)
        traced_all += min(traced)
        measure_all += m.cpu_s
    record = traced_all / plain_all - 1
    compute = measure_all / plain_all
    print(f"(m) attack measures ({'fast mode, NICs scaled to 75 MB/s' if fast else 'full NIC rates'}) on "
          f"{machine.cpu_model()}: recording the trace {100 * record:+.1f} % "
          f"({traced_all - plain_all:.2f} CPU-s), computing the measures {100 * compute:.1f} % ({measure_all:.2f} "
          f"CPU-s), together {100 * (record + compute):.1f} % of the {plain_all:.2f} CPU-s of untraced stage "
          f"simulation (target < 10 %)", flush=True)


def _spawn_speed(args: list[str], timeout: float) -> dict | None:
    return _spawn(args, timeout, flag="--speed-child")


def _append_history(rows: list[dict]) -> None:
    """One row per figure in bench/history/simulator-speed.csv's columns (``sim_bench.HISTORY_COLUMNS``)."""
    import csv
    from datetime import datetime, timezone

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sim_bench

    from kistexp.localnet import machine

    common = {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "machine": "",
              "cpu_model": machine.cpu_model(), "cores": len(os.sched_getaffinity(0)), "commit": sim_bench._commit(),
              "bench": "population_bench.py", "load": f"{os.getloadavg()[0]:.1f}", "runs": 1, "min": "", "max": ""}
    with sim_bench.HISTORY.open("a", newline="") as f:
        out = csv.DictWriter(f, sim_bench.HISTORY_COLUMNS, lineterminator="\n")
        for row in rows:
            digits = {"MiB": 0, "s": 0}.get(row["unit"], 2)
            out.writerow({**common, **row, "value": f"{row['value']:.{digits}f}"})


def _spawn(args: list[str], timeout: float, flag: str = "--child") -> dict | None:
    try:
        out = subprocess.run([sys.executable, __file__, flag, *args], capture_output=True, text=True,
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
    ap.add_argument("--speed", action="store_true", help="issue 38's speed targets instead of (a)-(c)")
    ap.add_argument("--speed-seconds", type=float, default=20.0)
    ap.add_argument("--speed-step", type=float, default=5.0)
    ap.add_argument("--whole-consensus", action="store_true", help="with --speed: also the whole consensus, 60 s")
    ap.add_argument("--history", action="store_true", help="with --speed: append the figures to the speed history")
    ap.add_argument("--speed-child", nargs=3, metavar=("SCALE", "DURATION", "STEP"), help=argparse.SUPPRESS)
    ap.add_argument("--attacks", action="store_true", help="issue 37: the cost of the attack measures")
    ap.add_argument("--repeats", type=int, default=3, help="with --attacks: alternating runs each")
    ap.add_argument("--attack-seeds", default="1,2", help="with --attacks: the sampled networks' seeds")
    ap.add_argument("--fast", action="store_true", help="with --attacks: NICs scaled as kistexp simulate --fast")
    a = ap.parse_args()
    if a.attacks:
        print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        _attacks_cost([int(x) for x in a.attack_seeds.split(",")], a.repeats, a.fast)
        print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        return
    if a.speed_child:
        print(json.dumps(_speed_one(*(float(x) for x in a.speed_child))))
        return
    if a.speed:
        print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        rows = _speed(a)
        print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        if a.history and rows:
            _append_history(rows)
            print(f"appended {len(rows)} rows to bench/history/simulator-speed.csv (load {os.getloadavg()[0]:.1f})")
        return
    if a.child:
        scale, load, duration, bw, budget = a.child
        print(json.dumps(_one(float(scale), float(load), float(duration), None if bw == "auto" else float(bw),
                              float(budget))))
        return
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    budget = str(a.byte_budget)
    scale_2000 = str(SCALE_2000)
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
