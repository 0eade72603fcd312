"""The directory client fetching the real 6,088-relay consensus from a loopback DirPort.

Run: .venv/bin/python bench/directory_bench.py [--repeat N]
Serves ../shared/data/consensus-2022-11-19-10-00-00 from a fake DirPort on 127.0.0.1 in each
encoding (compressed once, as tor keeps it precompressed) and prints, per encoding, the bytes on
the wire and the best/median time of fetch + decompress (with the bomb guard) + parse + signature
check against cached-certs; then the time the guard needs to refuse a 1 GiB zlib bomb.
"""

from __future__ import annotations

import argparse
import statistics
import time
import zlib
from pathlib import Path

from fake_authorities.dirport import DirPortApp, DirPortServer, DirRequest, DirResponse, ServedConsensus, error
from kistexp.dirauth.authorities import AUTHORITIES_TOR_0_4_7_10
from kistexp.dirauth.documents import load_key_certificates
from kistexp.directory import DirectoryClient, Endpoint
from kistexp.errors import DirectoryError

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
# The shared consensus and certificates are from 2022; verify them as a client did then.
ARCHIVE_NOW = 1668853800.0  # 2022-11-19 10:30 UTC


class _OneConsensus:
    """Just enough of an authority to serve one consensus file."""

    def __init__(self, text: bytes) -> None:
        self.text = text

    def served_consensus(self, flavour: str) -> ServedConsensus | None:
        return ServedConsensus(self.text, time.time(), time.time() + 3600, time.time() + 3 * 3600, "", ())

    def now(self) -> float:
        return time.time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    text = (DATA / "consensus-2022-11-19-10-00-00").read_bytes()
    certs = load_key_certificates(DATA / "cached-certs")
    app = DirPortApp(_OneConsensus(text))  # type: ignore[arg-type]
    srv = DirPortServer(app.handle, "127.0.0.1", 0)
    srv.listen()
    # The nine authorities that signed the 2022 consensus, pinned, all served by the bench server.
    pinned = [Endpoint(a.nickname, "127.0.0.1", srv.port, a.v3ident) for a in AUTHORITIES_TOR_0_4_7_10]
    ep = pinned[0]
    relays = text.count(b"\nr ")
    print(f"consensus: {len(text)} bytes, {relays} relays")
    try:
        for enc in ("identity", "deflate", "gzip", "x-zstd", "x-tor-lzma"):
            runs = []
            wire = 0
            for _ in range(args.repeat):
                with DirectoryClient(pinned, certificates=certs, accept_encodings=[enc],
                                     clock=lambda: ARCHIVE_NOW) as c:
                    wire = c.fetch(ep, "/tor/status-vote/current/consensus").wire_bytes
                    t0 = time.perf_counter()
                    doc = c.fetch_consensus("ns", endpoint=ep)
                    runs.append(time.perf_counter() - t0)
            print(f"{enc:>11}: {wire:>9} bytes on the wire; fetch+decode+parse+verify best "
                  f"{min(runs) * 1000:.0f} ms, median {statistics.median(runs) * 1000:.0f} ms "
                  f"({doc.relay_count} relays, KISTSchedRunInterval={dict(doc.params).get('KISTSchedRunInterval')})")
    finally:
        srv.close()

    comp = zlib.compressobj(9)
    zeros = b"\0" * (1 << 20)
    bomb = b"".join(comp.compress(zeros) for _ in range(1024)) + comp.flush()

    def bomb_app(req: DirRequest) -> DirResponse:
        if req.path.startswith("/tor/"):
            return DirResponse(200, bomb, (("Content-Encoding", "deflate"),))
        return error(404)

    srv = DirPortServer(bomb_app, "127.0.0.1", 0)
    srv.listen()
    try:
        ep = Endpoint("bomb", "127.0.0.1", srv.port)
        with DirectoryClient([ep], retries=0) as c:
            t0 = time.perf_counter()
            try:
                c.fetch(ep, "/tor/status-vote/current/consensus")
            except DirectoryError as exc:
                print(f"zlib bomb ({len(bomb)} bytes -> 1 GiB) refused in {(time.perf_counter() - t0) * 1000:.0f} ms: "
                      f"{str(exc).split(': ', 1)[1]}")
    finally:
        srv.close()


if __name__ == "__main__":
    main()
