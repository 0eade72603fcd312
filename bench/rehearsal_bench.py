"""What a dry run costs: hourly voting rounds of the embedded fake authorities on the virtual
clock, and the bundled KIST plan rehearsed against them.

Run: .venv/bin/python bench/rehearsal_bench.py [--rounds N] [--dir EXP]
Prints the wall and CPU time per voting round of nine authorities (1024-bit keys, every vote and
consensus signed, parsed and checked); with ``--dir EXP`` (an experiment with the plan's
predictions, from ``kistexp simulate``; a scratch copy is used) also the dry run of
plans/kist-run-interval-2020.toml with the demo's injected rollback and without injections
(to COMPLETED). Then the cost of a live run's measured collections: a plan judged on relay bandwidth
and CPU, ten measured sources (eight relays' MetricsPorts served on 127.0.0.1, two tor-process /proc
entries), each plan hour polled, stored and judged on the virtual clock: CPU per plan hour of
collection plus look (target < 1 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kistexp.localnet.machine import cpu_model
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


class _MetricsPort:
    """Eight relays' MetricsPorts on one loopback server: ~300 lines each, counters that grow."""

    def __init__(self) -> None:
        import http.server
        import threading

        served = {"n": 0}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                served["n"] += 1
                n = served["n"]
                lines = ["# TYPE tor_relay_traffic_bytes counter",
                         f'tor_relay_traffic_bytes{{direction="read"}} {n * 1_000_000}',
                         f'tor_relay_traffic_bytes{{direction="written"}} {n * 1_100_000}',
                         "# TYPE tor_relay_connections gauge"]
                lines += [f'tor_relay_connections{{type="OR",direction="received",state="opened",family="ipv4",'
                          f'k="{i}"}} {i}' for i in range(300)]
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# the bundled plan, judged on the two relay metrics the ten measured sources provide
MEASURED_CRITERIA = (("relay_bandwidth_bytes_per_s", "relative-decrease"),
                     ("relay_cpu_utilization", "relative-increase"))


def measured(extra_hours: int) -> None:
    """CPU per plan hour of a measured run's collections and looks, ten sources: the baseline and
    ``extra_hours`` of stage 1, where every hour is also a look."""
    import os

    import attrs

    from kistexp.metrics.instruments import MetricsPortInstrument, ProcInstrument
    from kistexp.plan.model import Criterion
    from kistexp.rollout.assembly import assemble, measured_source
    from kistexp.rollout.dryrun import _start_fresh
    from kistexp.rollout.journal import Journal
    from kistexp.rollout.rehearsal import rehearse
    from kistexp.rollout.sources import MEASURED
    from kistexp.store.schema import open_db

    criteria = tuple(Criterion(metric, "mean", comparison, 0.25, 10, "step-back", name=metric)
                     for metric, comparison in MEASURED_CRITERIA)
    spec = spec_from_plan(attrs.evolve(load_plan(PLAN), criteria=criteria))
    port = _MetricsPort()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "experiment.db"
        open_db(db).close()
        journal = Journal(db, durable=False)
        _start_fresh(journal, spec, MEASURED)
        clock = rehearsal_clock(spec)
        instruments = [MetricsPortInstrument(f"relay{i}", port.url, clock=clock) for i in range(8)]
        instruments += [ProcInstrument(f"tor{i}", os.getpid(), clock=clock) for i in range(2)]
        until = spec.start + dt.timedelta(hours=extra_hours)
        hours = round((until - spec.baseline_start) / dt.timedelta(hours=1))
        with EmbeddedAuthorities(spec, clock, initial_configs(spec), until) as net:
            source = measured_source(db, instruments, clock, spec, "bench")
            engine = assemble(spec, journal, net.actuator, source, clock, experiment_id="bench")
            clock.run_until(spec.baseline_start)
            w0, c0 = time.perf_counter(), time.process_time()
            rehearse(engine, journal, clock, until=until, who="bench")
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            looks = len(journal.verdicts())
            source.close()
        journal.close()
    port.close()
    print(f"measured collections: {len(instruments)} sources, {hours} plan hours, {looks} verdicts in "
          f"{wall:.2f} s wall, {cpu:.2f} s CPU ({cpu / hours:.3f} s CPU a plan hour of collection plus look, "
          f"voting rounds included; target < 1 s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--dir", type=Path, help="experiment directory with the bundled plan's predictions")
    ap.add_argument("--measured-hours", type=int, default=24,
                    help="plan hours of stage 1 after the baseline in the measured-collection bench")
    args = ap.parse_args()
    print(f"CPU: {cpu_model()}")
    rounds(args.rounds)
    measured(args.measured_hours)
    if args.dir is not None:
        dry_runs(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
