"""Sweep throughput: cells per minute on 1 and 2 local workers and on a 2-worker Dask LocalCluster, and the
scheduling overhead per cell (docs/sweeps.md, "Throughput").

    PYTHONPATH=. .venv/bin/python bench/sweep_bench.py [--cells 8] [--scale 0.01] [--duration 8] [--noop 200]

Each backend runs the same grid of real cells from an empty cache. Printed per backend:

* cells/min: cells over the wall time of the run (worker start-up included: spawn, imports, loading the
  compiled simulator from numba's cache);
* cell compute: the mean time a worker spent inside a cell (``CellResult.wall_s``);
* slot overhead: per cell, the worker-slot time not spent computing (wall x slots - compute) / cells:
  start-up, pickling the task (with its sampled network) and the result, the scheduler's round trip;
* scheduling overhead: the same loop with a cell that does nothing, cells per second and seconds per cell:
  what the submitting process and the executor cost per cell, whatever the cell; and the CPU time of this
  process per cell (the submitting side; for the LocalCluster it includes the scheduler, which runs here).

The machine is shared: the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

import attrs

from kistexp.sweep.cache import CellCache
from kistexp.sweep.cells import CellResult, CellTask, expand
from kistexp.sweep.execute import DaskBackend, LocalBackend, execute
from kistexp.sweep.spec import parse_sweep

SWEEP = """
name = "bench"
duration = "{duration}s"
[values]
KISTSchedRunInterval = [2, 10]
[traffic]
loads = [0.4]
seeds = [1]
[population]
scale = {scale}
samples = {samples}
"""


def noop_cell(task: CellTask) -> CellResult:
    """A cell that computes nothing: what remains is the cost of moving a cell through the executor."""
    return CellResult(task.key, (), 0, 0, 1.0, 0.0, 0.0, "noop")


def _run(backend, tasks: list[CellTask]) -> tuple[float, list]:
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        try:
            outcomes = execute(tasks, backend, CellCache(cache))
        finally:
            backend.close()
        return time.perf_counter() - t0, outcomes


def _report(name: str, slots: int, wall: float, outcomes: list) -> dict:
    ok = [o for o in outcomes if o.status == "ok"]
    compute = sum(o.result.wall_s for o in ok)
    row = {"backend": name, "cells": len(ok), "wall_s": wall, "cells_per_min": 60 * len(ok) / wall,
           "cell_compute_s": compute / max(1, len(ok)),
           "slot_overhead_s": (wall * slots - compute) / max(1, len(ok))}
    print(f"{name:<28} {len(ok):>3} cells  {wall:7.1f} s  {row['cells_per_min']:6.1f} cells/min  "
          f"cell compute {row['cell_compute_s']:5.2f} s  slot overhead {row['slot_overhead_s']:5.2f} s/cell")
    return row


def _noop(name: str, backend, tasks: list[CellTask]) -> None:
    cpu0 = time.process_time()
    wall, outcomes = _run(backend, tasks)
    cpu = time.process_time() - cpu0
    print(f"{name:<28} {len(outcomes):>3} no-op cells {wall:6.2f} s  {len(outcomes) / wall:7.1f} cells/s  "
          f"{1000 * wall / len(outcomes):6.1f} ms/cell wall, {1000 * cpu / len(outcomes):5.1f} ms/cell CPU of this "
          "process")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=8, help="cells per run (2 values x cells/2 networks)")
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--noop", type=int, default=200, help="no-op cells for the scheduling overhead")
    args = ap.parse_args()
    samples = list(range(1, max(1, args.cells // 2) + 1))
    sweep = parse_sweep(SWEEP.format(duration=round(args.duration), scale=args.scale, samples=samples), "bench.toml")
    tasks = expand(sweep)
    noop_tasks = [tasks[i % len(tasks)] for i in range(args.noop)]
    noop_tasks = [attrs.evolve(t, index=i, key=f"{i:064x}") for i, t in enumerate(noop_tasks)]
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"cpus: {os.cpu_count()}; {len(tasks)} cells of {len(tasks[0].population)} relays, {args.duration:g} "
          f"simulated s each (scale {args.scale:g})")
    rows = []
    for workers in (1, 2):
        rows.append(_report(f"local pool, {workers} worker(s)", workers, *_run(LocalBackend(workers), tasks)))
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster:
        rows.append(_report("Dask LocalCluster, 2 workers", 2, *_run(DaskBackend(cluster.scheduler_address), tasks)))
        _noop("Dask LocalCluster, 2 workers", DaskBackend(cluster.scheduler_address, cell_fn=noop_cell), noop_tasks)
    _noop("local pool, 2 worker(s)", LocalBackend(2, cell_fn=noop_cell), noop_tasks)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
