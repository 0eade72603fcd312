"""Metric store and collectors: how long imports and window selections take.

Run: PYTHONPATH=. .venv/bin/python bench/metrics_bench.py [--samples N] [--repeat N]
Prints best and median wall time of: reading the op-hk6a OnionPerf day (23 MB of JSON,
7,175 circuits), importing it into a fresh experiment, storing N synthetic relay samples
(1,000 relays), selecting a one-hour window by value in effect from them, parsing and
verifying the 2022 consensus as an archive, and the peak RSS.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

from consensus_bench import _time  # the same best/median timer (bench/ is on sys.path when run as a script)

from kistexp.dirauth.documents import load_key_certificates
from kistexp.expdir import ExperimentDir
from kistexp.localnet import machine
from kistexp.metrics import importer
from kistexp.metrics.collectors import consensus_archive, onionperf
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
HK6A = DATA / "onionperf" / "2021-06-01.op-hk6a.onionperf.analysis.json.xz"
PINNED_2022 = ("D586D18309DED4CD6D57C18FDB97EFA96D330566", "14C131DFC5C6F93646BE72FA1401C02A8DF2E8B4",
               "E8A9C45EDE6D711294FADF8E7951F4DE6CA56B58", "ED03BB616EB2F60BEC80151114BB25CEF515B226",
               "0232AF901C31A04EE9848595AF9BB7620D4C5B2E", "49015F787433103580E3B66A1707A00E60F2D15B",
               "EFCBE720AB3A82B99F9E953CD5BF50F7EEFC7B97", "23D15D965BC35114467363C165C4F724B64B4F66",
               "27102BC123E7AF1D4741AE047E160C91ADC76B21")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    t0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
    relays = [f"{i:040X}" for i in range(1000)]
    samples = [Sample(t0 + dt.timedelta(seconds=60 * (i // 1000)), 0.1 + (i % 97) / 100,
                      {"relay": relays[i % 1000], "relay_class": "guard" if i % 3 else "exit"},
                      2 if i < args.samples // 2 else 3) for i in range(args.samples)]
    certs = load_key_certificates(DATA / "cached-certs")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        rows.append(("read op-hk6a (OnionPerf 3.1, 23 MB JSON)", *_time(lambda: onionperf.load(HK6A), args.repeat)))

        def import_hk6a() -> None:
            with ExperimentDir.create(Path(tmp) / f"e{time.perf_counter_ns()}") as exp:
                importer.import_source(MetricStore(exp.db), str(HK6A))
        rows.append(("import op-hk6a into a new experiment", *_time(import_hk6a, args.repeat)))

        exp = ExperimentDir.create(Path(tmp) / "big")
        store = MetricStore(exp.db)

        def add() -> None:
            store.conn.execute("DELETE FROM samples")
            store.add_samples("relay_cpu_utilization", samples)
        rows.append((f"store {args.samples:,} relay samples", *_time(add, args.repeat)))
        mid = t0 + dt.timedelta(seconds=60 * (args.samples // 2000))
        window = (mid, mid + dt.timedelta(hours=1))
        got = []
        rows.append(("select 1 h window, guards, value 3", *_time(
            lambda: got.append(len(store.select("relay_cpu_utilization", *window, {"relay_class": "guard"}, 3))),
            args.repeat)))
        rows.append(("read + verify the 2022 consensus as an archive", *_time(
            lambda: consensus_archive.read_archive(DATA / "consensus-2022-11-19-10-00-00", certificates=certs,
                                                   trusted=PINNED_2022), args.repeat)))
        exp.close()
    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  best s   median s")
    for name, best, med in rows:
        print(f"{name:<{width}}  {best:7.3f}  {med:7.3f}")
    peak_mib = machine.peak_rss_mib()
    print(f"window held {got[-1]:,} samples; peak RSS {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
