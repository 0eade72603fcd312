"""Run a fake authority network in the foreground until SIGINT/SIGTERM (the CLI entry)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from fake_authorities.network import FakeAuthorityNetwork, NetworkError
from kistexp.asciinum import ascii_uint
from kistexp.durations import parse_duration


def parse_interval(text: str) -> int:
    """``10s``, ``1m`` or a bare number of seconds -> whole seconds (>= 2)."""
    raw = text.strip()
    try:
        bare = ascii_uint(raw)
        seconds = bare if bare is not None else int(parse_duration(raw).total_seconds())
    except ValueError:
        raise NetworkError(f"--interval {text[:40]!r}: expected seconds such as 10s, 1m or 20") from None
    if seconds < 2:
        raise NetworkError(f"--interval {text[:40]!r}: must be at least 2 s")
    if seconds > 86400:  # tor's longest V3AuthVotingInterval is 24 hours
        raise NetworkError(f"--interval {text[:40]!r}: must be at most 24 h (86400 s)")
    return seconds


def _count(text: str) -> int:
    value = ascii_uint(text.strip())
    if value is None:
        raise ValueError(text)
    return value


def parse_population(text: str | None) -> tuple[int, int] | None:
    """``CACHES,CLIENTS`` (e.g. ``200,1000``) for ``--population``."""
    if not text:
        return None
    try:
        caches, clients = (_count(x) for x in text.split(","))
    except ValueError:
        raise NetworkError(f"--population {text[:40]!r}: expected CACHES,CLIENTS, e.g. 200,1000") from None
    if caches < 1 or clients < 0 or caches + clients > 200_000:
        raise NetworkError(f"--population {text!r}: need at least one cache and at most 200000 nodes")
    return caches, clients


def describe(net: FakeAuthorityNetwork) -> list[str]:
    """What an operator needs: DirPorts with identities, the operator API and its token."""
    lines = [f"{net.count} fake authorities, one voting hour every {net.timing.interval_s} s "
             f"(vote {net.timing.vote_delay_s:.2f} s, dist {net.timing.dist_delay_s:.2f} s)"]
    for a in net.directory_authorities():
        lines.append(f"  {a.nickname:<11} http://{a.address}:{a.dirport}  v3ident {a.v3ident}")
    if net.timing.interval_s < 10:
        lines.append("note: tor refuses consensuses fresh for less than 10 s (TestingTorNetwork minimum); "
                     "use --interval 10s or more if a real tor reads these documents")
    lines.append(f"operator API: {net.operator_url}/kistexp/operator/status")
    lines.append(f"operator token: {net.token}")
    if net.state_dir:
        lines.append(f"state: {net.state_dir} (keys, network.json, operator-token)")
    return lines


def serve(count: int, port: int, interval: str, token: str | None = None, state_dir: str | Path | None = None,
          host: str = "127.0.0.1", population: tuple[int, int] | None = None,
          on_ready: Callable[[FakeAuthorityNetwork], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Start the network, call ``on_ready``, block until a signal (or ``stop``), stop cleanly."""
    stop = stop or threading.Event()
    net = FakeAuthorityNetwork(count=count, interval_s=parse_interval(interval), port=port, host=host,
                               token=token, state_dir=state_dir)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        net.start()
        if population:
            net.attach_population(caches=population[0], clients=population[1])
        if on_ready:
            on_ready(net)
        while not stop.wait(0.5):
            pass
    finally:
        net.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
