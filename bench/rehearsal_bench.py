"""What a dry run costs: hourly voting rounds of the embedded fake authorities on the virtual
clock, and the bundled KIST plan rehearsed against them.

Run: .venv/bin/python bench/rehearsal_bench.py [--rounds N] [--dir EXP]
Prints the wall and CPU time per voting round of nine authorities (1024-bit keys, every vote and
consensus signed, parsed and checked); with ``--dir EXP`` (an experiment with the plan's
predictions, from ``kistexp simulate``; a scratch copy is used) also the dry run of
plans/kist-run-interval-2020.toml with the demo's injected rollback and without injections
(to COMPLETED).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kistexp.plan import load_plan
from kistexp.rollout.dryrun import dry_run, initial_configs
from kistexp.rollout.rehearsal import EmbeddedAuthorities, rehearsal_clock
from kistexp.rollout.spec import spec_from_plan

PLAN = Path(__file__).resolve().parent.parent / "plans" / "kist-run-interval-2020.toml"


def rounds(n: int) -> None:
    spec = spec_from_plan(load_plan(PLAN))
    clock = rehearsal_clock(spec)
    t0 = time.perf_counter()
    with EmbeddedAuthorities(spec, clock, initial_configs(spec), spec.start) as auth:
        setup = time.perf_counter() - t0
        clock.run_until(spec.baseline_start)
        done = auth.net.rounds_done
        w0, c0 = time.perf_counter(), time.process_time()
        clock.run_until(spec.baseline_start + dt.timedelta(hours=n))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        n_done = auth.net.rounds_done - done
        latest = auth.net.latest()
    print(f"embedded authorities: {len(spec.authorities)} (keys and start {setup:.2f} s)")
    print(f"hourly rounds: {n_done} in {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({1000 * wall / n_done:.1f} ms wall, {1000 * cpu / n_done:.1f} ms CPU a round); "
          f"last consensus signed by {len(latest.signers)}")


def dry_runs(exp: Path) -> None:
    plan = load_plan(PLAN)
    for label, injections in (("injected rollback (make demo)", ["stage=1:relay_cpu_utilization=+50%"]),
                              ("no injection", [])):
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / "exp"
            shutil.copytree(exp, scratch)
            w0, c0 = time.perf_counter(), time.process_time()
            r = dry_run(plan, scratch, injections=injections)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(f"dry run, {label}: {r.status} in {wall:.1f} s wall, {cpu:.1f} s CPU")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--dir", type=Path, help="experiment directory with the bundled plan's predictions")
    args = ap.parse_args()
    rounds(args.rounds)
    if args.dir is not None:
        dry_runs(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
