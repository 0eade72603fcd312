"""Speed of the relay-scheduling simulator (issue 4, point 9).

Prints, per scenario: cells scheduled per wall-second, simulated seconds per wall-second and the
peak RSS of the process, excluding numba's one-time compile (reported separately).

(a) one relay with 200 channels (100 client-side, 100 exit-side neighbours) and 2,000 mixed
    circuits through it, 60 s simulated;
(b) a 100-relay network (guards, middles, exits) with 100 clients and 1,000 3-hop circuits,
    60 s simulated;
(c) a 1,000-relay network with 1,000 clients and 50,000 3-hop circuits, 60 s simulated (the
    relay population's scale; its target is peak RSS <= 2 GiB).

Each case runs ``--repeat`` times (5 by default) in a fresh process (so the peak RSS is the
case's own); the figures printed are the medians, with the spread, and the cells per CPU-second
of the process (a loaded machine stretches wall time, not CPU time).  Targets (issue 8): (a) >= 6 M
cells per wall-second on one core (aim 10 M), (b) >= 5 M, (c) peak RSS <= 2 GiB.  The machine's
load average is printed with the figures: other processes on the machine slow the runs; so does a
virtual machine's host running other work on its cores, whose share (Linux's steal time) is printed too.

Mixed circuits: 10 % bulk (5 MiB downloads back to back), 60 % web-like (320 KiB, think time
uniform in 1..30 s), 30 % interactive (a 1-cell request and a 2-cell answer every 100 ms).

    .venv/bin/python bench/sim_bench.py [--duration S] [--scheduler kist|kistlite|vanilla] [--only a|b|c]
                                        [--repeat N] [--history]

``--history`` appends the printed figures to bench/history/simulator-speed.csv (one row per figure: date, CPU
model, cores, commit, case, metric, median with the spread), the measurement history that
docs/simulator.md's speed table summarises.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kistexp.localnet import machine
from kistexp.sim import InteractiveFlow, LinkConfig, Network, NodeConfig, RunConfig, run, warm_up

BULK = 5 * 1024 * 1024
WEB = 320 * 1024
HISTORY = Path(__file__).resolve().parent / "history" / "simulator-speed.csv"
HISTORY_COLUMNS = ["date_utc", "machine", "cpu_model", "cores", "commit", "bench", "case", "metric", "value", "min",
                   "max", "unit", "runs", "load", "note"]


def _mixed(net: Network, circuits: list[int], duration_s: float, rng: np.random.Generator) -> None:
    kinds = rng.choice(3, size=len(circuits), p=[0.1, 0.6, 0.3])
    for c, kind in zip(circuits, kinds, strict=True):
        t0 = float(rng.uniform(0, min(1.0, duration_s / 2)))  # every flow starts within the run
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


def _relay_network(scheduler: str, duration_s: float, seed: int, guards: int, middles: int, exits: int,
                   clients: int, circuits: int) -> Network:
    """Relays of three roles, clients, and 3-hop circuits over random guard, middle and exit."""
    rng = np.random.default_rng(seed)
    net = Network()
    roles = ["guard"] * guards + ["middle"] * middles + ["exit"] * exits
    relays = [net.add_node(NodeConfig(role=r, scheduler=scheduler, kist_interval_ms=2,
                                      nic_rate_bytes_per_s=float(rng.choice([12.5e6, 50e6, 125e6]))))
              for r in roles]
    g, m, x = relays[:guards], relays[guards:guards + middles], relays[guards + middles:]
    cs = [net.add_node(NodeConfig(role="client", scheduler=scheduler, kist_interval_ms=2)) for _ in range(clients)]
    circs = []
    for i in range(circuits):
        path = [cs[i % clients], g[int(rng.integers(guards))], m[int(rng.integers(middles))],
                x[int(rng.integers(exits))]]
        for u, v in zip(path, path[1:], strict=False):
            if net.channel_between(u, v) is None:
                net.add_channel(u, v, LinkConfig(rtt_ms=float(rng.uniform(5, 120))))
        circs.append(net.add_circuit(path, f"c{i % 3}"))
    _mixed(net, circs, duration_s, rng)
    return net


def network_100(scheduler: str, duration_s: float, seed: int = 2) -> Network:
    return _relay_network(scheduler, duration_s, seed, 30, 40, 30, 100, 1000)


def network_1000(scheduler: str, duration_s: float, seed: int = 3) -> Network:
    """1,000 relays (300 guards, 400 middles, 300 exits), 1,000 clients, 50,000 circuits."""
    return _relay_network(scheduler, duration_s, seed, 300, 400, 300, 1000, 50_000)


CASES = {"a": one_relay, "b": network_100, "c": network_1000}


def _one(case: str, scheduler: str, duration_s: float) -> dict:
    """One run of a case in this process: its figures as a dict."""
    load = warm_up()
    net = CASES[case](scheduler, duration_s)
    ticks = machine.cpu_ticks()
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = run(net, RunConfig(duration_s=duration_s, seed=7, sample_interval_s=1.0))
    cpu = time.process_time() - c0
    total = time.perf_counter() - t0
    stolen = machine.stolen_fraction(ticks, machine.cpu_ticks())
    return {
        "nodes": len(net.nodes), "channels": len(net.channels), "circuits": len(net.circuits),
        "transfers": net.n_transfers, "cells": res.cells_scheduled, "events": res.events,
        "finished": int((~np.isnan(res.transfer_ttlb_s)).sum()), "kernel_wall_s": res.wall_s,
        "run_wall_s": total, "load_s": load,
        "cells_per_s": res.cells_scheduled / res.wall_s, "cpu_s": cpu,
        "cells_per_cpu_s": res.cells_scheduled / cpu,
        "rss_mib": machine.peak_rss_mib(),
        "stolen": stolen,
    }


def _measure(case: str, scheduler: str, duration_s: float, repeat: int) -> list[dict]:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--one", case, "--scheduler", scheduler,
                              "--duration", str(duration_s)], check=True, capture_output=True, text=True,
                             env=dict(os.environ))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    r = runs[0]
    rate = np.array([x["cells_per_s"] for x in runs]) / 1e6
    rss = np.array([x["rss_mib"] for x in runs])
    wall = np.array([x["kernel_wall_s"] for x in runs])
    print(f"({case}) nodes={r['nodes']} channels={r['channels']} circuits={r['circuits']} "
          f"transfers={r['transfers']}, {duration_s:g} s simulated, {repeat} runs")
    print(f"    cells scheduled: {r['cells']:,}  events: {r['events']:,}  transfers finished: {r['finished']:,}")
    print(f"    cells scheduled per wall-second: median {np.median(rate):.2f} M "
          f"(min {rate.min():.2f}, max {rate.max():.2f})")
    per_cpu = np.array([x.get("cells_per_cpu_s", np.nan) for x in runs]) / 1e6
    print(f"    cells scheduled per CPU-second of run() (building included; what one free core "
          f"would do): median {np.nanmedian(per_cpu):.2f} M")
    print(f"    kernel wall: median {np.median(wall):.2f} s; simulated seconds per wall-second: "
          f"{duration_s / np.median(wall):.2f}; build + run: {np.median([x['run_wall_s'] for x in runs]):.2f} s")
    print(f"    peak RSS: median {np.median(rss):.0f} MiB (max {rss.max():.0f})")
    print(f"    load average (1, 5, 15 min): {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    stolen = [x["stolen"] for x in runs if x.get("stolen") is not None]
    if stolen:
        # a virtual machine's host may run something else on its cores: time no process here gets
        print(f"    CPU time the hypervisor took during the runs (all cores): median {100 * np.median(stolen):.1f} % "
              f"(min {100 * min(stolen):.1f}, max {100 * max(stolen):.1f})")
    figures = [("cells_scheduled", r["cells"] / 1e6, None, None, "M cells"),
               ("cells_per_wall_s", np.median(rate), rate.min(), rate.max(), "M cells/s"),
               ("cells_per_cpu_s", np.nanmedian(per_cpu), None, None, "M cells/s"),
               ("peak_rss", np.median(rss), None, None, "MiB")]
    if stolen:
        figures.append(("stolen", 100 * np.median(stolen), 100 * min(stolen), 100 * max(stolen), "%"))
    return [{"case": case, "metric": m, "value": v, "min": lo, "max": hi, "unit": unit, "runs": repeat}
            for m, v, lo, hi, unit in figures]


def _commit() -> str:
    """HEAD's short hash, with "+changes" when the simulator's sources or this file differ from it."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "kistexp/sim",
                                "bench/sim_bench.py"], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def append_history(rows: list[dict], scheduler: str, duration_s: float, path: Path = HISTORY) -> None:
    """Append one CSV row per figure to the speed history (the header first if the file is new)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    common = {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "machine": "",
              "cpu_model": machine.cpu_model(), "cores": cores, "commit": _commit(), "bench": "sim_bench.py",
              "load": f"{os.getloadavg()[0]:.1f}", "note": ""}
    if (scheduler, duration_s) != ("kist", 60.0):
        common["note"] = f"scheduler {scheduler}, {duration_s:g} s simulated"
    new = not path.exists()
    with path.open("a", newline="") as f:
        out = csv.DictWriter(f, HISTORY_COLUMNS, lineterminator="\n")
        if new:
            out.writeheader()
        for row in rows:
            digits = {"MiB": 0, "s": 1, "%": 1}.get(row["unit"], 2)
            fmt = {k: "" if row.get(k) is None else f"{row[k]:.{digits}f}" for k in ("value", "min", "max")}
            out.writerow({**common, **row, **fmt})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--scheduler", default="kist")
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--history", action="store_true",
                    help=f"append the figures to {HISTORY.relative_to(HISTORY.parent.parent.parent)}")
    ap.add_argument("--one", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.scheduler, args.duration)))
        return
    compile_s = warm_up()
    print(f"compile or cache load: {compile_s:.1f} s (scheduler {args.scheduler})")
    rows = [{"case": "", "metric": "compile_or_load", "value": compile_s, "min": None, "max": None, "unit": "s",
             "runs": 1}]
    for case in sorted(CASES):
        if args.only in (None, case):
            rows += _measure(case, args.scheduler, args.duration, args.repeat)
    if args.history:
        append_history(rows, args.scheduler, args.duration)
        print(f"appended {len(rows)} rows to {HISTORY}")


if __name__ == "__main__":
    main()
