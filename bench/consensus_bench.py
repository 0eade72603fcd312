"""Parse and verify the 6,088-relay consensus of 2022-11-19 10:00 UTC: kistexp against stem 1.8.2.

Run: .venv/bin/python bench/consensus_bench.py [--repeat N]
Prints best and median wall time of: parse, verify (signatures, with parsed certs), parse + verify,
building every RouterStatus, stem's parse (validate=True) and stem's validate_signatures, and the
peak RSS after kistexp's runs and after stem's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from kistexp.dirauth.documents import parse_key_certificates, parse_network_status, verify_signatures
from kistexp.localnet import machine

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _time(fn, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return min(runs), statistics.median(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--consensus", type=Path, default=DATA / "consensus-2022-11-19-10-00-00")
    ap.add_argument("--certs", type=Path, default=DATA / "cached-certs")
    args = ap.parse_args()
    data = args.consensus.read_bytes()
    certs = parse_key_certificates(args.certs.read_bytes(), str(args.certs))
    doc = parse_network_status(data, str(args.consensus))
    check = verify_signatures(doc, certs)
    print(f"consensus: {args.consensus.name}, {len(data)} bytes, {doc.relay_count} relays, "
          f"signatures {check.valid}/{check.total} valid ({check.needed} needed)")

    def parse():
        parse_network_status(data, "bench")

    fresh: list = []

    def verify():
        # each run takes a freshly parsed document: hashing the signed part is part of verification
        verify_signatures(fresh.pop(), certs)

    def both():
        d = parse_network_status(data, "bench")
        assert verify_signatures(d, certs).ok

    def build_all():
        for _ in doc.routers:
            pass

    rows = []
    rows.append(("kistexp parse", *_time(parse, args.repeat)))
    fresh.extend(parse_network_status(data, "bench") for _ in range(args.repeat))
    rows.append(("kistexp verify signatures", *_time(verify, args.repeat)))
    rows.append(("kistexp parse + verify", *_time(both, args.repeat)))
    rows.append(("kistexp build all RouterStatus", *_time(build_all, args.repeat)))
    fresh.clear()
    rss_ours = machine.peak_rss_mib()

    import stem.descriptor.networkstatus as stem_ns

    stem_certs = [stem_ns.KeyCertificate(c.text.encode()) for c in certs]
    stem_repeat = max(2, args.repeat // 2)
    holder = {}

    def stem_parse():
        holder["doc"] = stem_ns.NetworkStatusDocumentV3(data, validate=True)

    rows.append(("stem 1.8.2 parse (validate=True)", *_time(stem_parse, stem_repeat)))
    rows.append(("stem 1.8.2 validate_signatures",
                 *_time(lambda: holder["doc"].validate_signatures(stem_certs), stem_repeat)))
    rss_stem = machine.peak_rss_mib()

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'best s':>8}  {'median s':>8}")
    for name, best, median in rows:
        print(f"{name:<{width}}  {best:8.4f}  {median:8.4f}")
    print(f"peak RSS after kistexp runs: {rss_ours:.0f} MiB; after stem runs: {rss_stem:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
