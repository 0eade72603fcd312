"""``python -m fake_authorities --count 9 --port 7000 --interval 10s [--token T] [--state-dir D]``."""

from __future__ import annotations

import argparse
import sys

from fake_authorities.serve import describe, parse_population, serve
from kistexp.asciinum import ascii_uint
from kistexp.errors import KistexpError
from kistexp.output import error_line, visible


def _ascii_int(text: str) -> int:
    """argparse's ``int`` takes "١٢" (Arabic-Indic) and "1_0"; ports and counts take ASCII digits only."""
    value = ascii_uint(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number in ASCII digits")
    return value


def _return_large_buffers_to_the_system() -> None:
    """Request bodies (up to 16 MiB, MAX_BODY_BUFFER_BYTES of them at once) are allocated by many
    handler threads. glibc raises its mmap threshold after freeing such a block, so later bodies
    land in per-thread arenas that keep the freed memory: the process's RSS would then grow past
    the body budget. A fixed threshold (M_MMAP_THRESHOLD, which also stops the raising) keeps
    every large body in its own mapping, returned when it is freed. Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = -3 (malloc.h), 1 MiB
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    _return_large_buffers_to_the_system()
    p = argparse.ArgumentParser(prog="python -m fake_authorities",
                                description="Fake v3 directory authorities on loopback (see docs/fake-authorities.md).")
    p.add_argument("--count", type=_ascii_int, default=9, help="number of authorities (default 9)")
    p.add_argument("--port", type=_ascii_int, default=7000,
                   help="operator API port; authority i listens on port+i (default 7000)")
    p.add_argument("--interval", default="10s", help='one voting "hour" (default 10s)')
    p.add_argument("--token", default=None, help="operator API token (default: random, printed)")
    p.add_argument("--state-dir", default=None, help="keep keys, params and the token here across runs")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (127.0.0.0/8 only)")
    p.add_argument("--population", default=None, metavar="CACHES,CLIENTS",
                   help="attach simulated caches and clients, e.g. 200,1000")
    args = p.parse_args(argv)
    try:
        population = parse_population(args.population)
        serve(args.count, args.port, args.interval, args.token, args.state_dir, args.host, population,
              on_ready=lambda net: print("\n".join(visible(line) for line in describe(net)), flush=True))
    except KistexpError as exc:
        print(error_line(exc, prog="fake_authorities"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
