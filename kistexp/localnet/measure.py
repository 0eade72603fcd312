"""A measurement client for the local tor network that does OnionPerf's job: timed transfers
through every client (a *vantage point*), the client tor's circuits and streams from its
ControlPort, and Tor Metrics' day files (metrics-sources.md §1), plus a quiet-circuit latency
probe beside them.

Per vantage point (a client nickname):

* every ``period_s`` one transfer from the bulk server (``GET /bytes/N`` on 127.0.0.2, the only
  port the exit allows), cycling 50 KiB, 1 MiB and 5 MiB, each through a fresh circuit: a new
  SOCKS username per transfer (tor's IsolateSOCKSAuth). What tgen records per stream is recorded
  (``usecs-to-*`` steps, byte thresholds, progress, error codes, the SOCKS connection's real local
  port). A transfer that fails is an errored stream with tgen's error code, never an exception; at
  most ``max_concurrent`` run at once and a tick that finds them all busy is skipped (counted).
* stem listeners for CIRC, CIRC_MINOR, STREAM, BUILDTIMEOUT_SET and GUARD events build the
  ``tor`` section exactly as OnionPerf's analysis does (format 3.1: ``cbt_set``, ``filtered_out``,
  ``current_guards``, ``tor.guards``). A measurement's circuit is closed once its transfer is
  done: OnionPerf's circuits close after MaxCircuitDirtiness (10 min), but here the period is
  seconds, each circuit carries one transfer, and a circuit enters the file only once closed.
* ``YYYY-MM-DD.<vantage>.onionperf.analysis.json`` (version 3.1) in ``out_dir``, one per UTC
  day, rewritten whole (temporary file and rename) at most every ``write_interval_s`` while it
  grows; a day's records leave memory once its file is final.
* one long-lived interactive stream (``GET /echo``) with its own SOCKS username, sending a small
  message every ``interactive_period_s`` and timing the echo, into the sidecar
  ``YYYY-MM-DD.<vantage>.interactive.jsonl``; ``read_interactive`` and ``InteractiveInstrument``
  turn it into ``quiet_circuit_latency_ms`` samples.

Every wait is bounded; ``stop(timeout_s)`` returns within its bound. A client tor that dies turns
into failed transfers and an unhealthy ``health()``, not a hang.

The work is split by idea: the transfers (``kistexp.localnet.tgen``), the ``tor`` section from
control-port events (``kistexp.localnet.torevents``), the day files
(``kistexp.localnet.analysisfiles``), the quiet-circuit sidecar
(``kistexp.localnet.quietcircuit``) and each vantage point's threads
(``kistexp.localnet.vantage``). This module holds what a caller uses, the configuration and the
client, and names the rest.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

from kistexp.errors import LocalNetError
from kistexp.localnet.analysisfiles import _SOURCE_NAME, OnionPerfDayFiles, _utc_day, day_file_name
from kistexp.localnet.quietcircuit import InteractiveInstrument, InteractiveLines, read_interactive, sidecar_name
from kistexp.localnet.tgen import SIZES, THRESHOLDS, TransferTrace, run_transfer, tgen_stream
from kistexp.localnet.torevents import TorEvents
from kistexp.localnet.traffic import BulkServerProcess
from kistexp.localnet.vantage import MeasurementConfig, VantageHealth, _close_quietly, _Vantage


class MeasurementClient:
    """Runs ``config`` against a running ``LocalNetwork`` (exits, relays and at least one client):
    ``start()``, then ``health()``, the files in ``config.out_dir``, and ``stop(timeout_s)``.
    See the module docstring."""

    def __init__(self, net, config: MeasurementConfig) -> None:
        self.net = net
        self.config = config
        if not net.by_role("exit"):
            raise LocalNetError("the network has no exit: no transfer could ever leave it")
        clients = {n.nickname: n for n in net.by_role("client")}
        names = config.vantages or tuple(clients)
        if not names:
            raise LocalNetError("the network has no client to measure from")
        for name in names:
            if name not in clients:
                raise LocalNetError(f"vantage point {name!r} is not a client of the network "
                                    f"(clients: {', '.join(clients) or 'none'})")
            if not _SOURCE_NAME.match(name):
                raise LocalNetError(f"vantage point name {name!r} is not an OnionPerf source name ([A-Za-z0-9-]+)")
        self.service_port = config.service_port or net.spec.service_port
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._vantages = [_Vantage(self, name, clients[name].socks_port) for name in dict.fromkeys(names)]
        self._server: BulkServerProcess | None = None
        self._writer: threading.Thread | None = None
        self._started = False

    @property
    def vantages(self) -> tuple[str, ...]:
        return tuple(v.nickname for v in self._vantages)

    def day_file(self, vantage: str, day: dt.date | None = None) -> Path:
        """Where the analysis file of ``vantage`` for ``day`` (default: today, UTC) is written."""
        return self.config.out_dir / day_file_name(day or _utc_day(time.time()), vantage)

    def sidecar(self, vantage: str, day: dt.date | None = None) -> Path:
        return self.config.out_dir / sidecar_name(day or _utc_day(time.time()), vantage)

    def interactive_instrument(self, vantage: str, *, watch: object = None, param: str | None = None,
                               name: str | None = None) -> InteractiveInstrument:
        """An Instrument over ``vantage``'s sidecars; stale after three missed probes."""
        if vantage not in self.vantages:
            raise LocalNetError(f"{vantage!r} is not a vantage point of this measurement ({', '.join(self.vantages)})")
        cfg = self.config
        return InteractiveInstrument(cfg.out_dir, vantage, name=name, watch=watch, param=param,
                                     stale_after_s=3 * cfg.interactive_period_s + cfg.interactive_timeout_s)

    def start(self) -> None:
        if self._started:
            raise LocalNetError("the measurement client has been started already (make a new one to measure again)")
        try:
            self.config.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LocalNetError(f"{self.config.out_dir}: cannot make the output directory: "
                                f"{exc.strerror or exc}") from None
        if self.config.service_port is None:
            self._server = BulkServerProcess(self.service_port)
        self._started = True
        self._writer = threading.Thread(target=self._write_loop, name="measure-writer", daemon=True)
        self._writer.start()
        for v in self._vantages:
            v.start()

    def _write_loop(self) -> None:
        gap = self.config.write_interval_s
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait(gap)
            if self._stop.is_set():
                break
            wait = last + gap - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)
                continue
            self._wake.clear()
            t0 = time.monotonic()
            for v in self._vantages:
                if v.files.dirty:
                    v.files.flush()
            last = time.monotonic()
            # a big day file costs its size at every rewrite: keep writing under ~5 % of the time
            gap = max(self.config.write_interval_s, 20 * (last - t0))

    def health(self) -> dict[str, VantageHealth]:
        return {v.nickname: v.health() for v in self._vantages}

    def flush(self) -> tuple[Path, ...]:
        """Write every vantage point's changed day files now."""
        return tuple(p for v in self._vantages for p in v.files.flush())

    def stop(self, timeout_s: float = 10.0) -> tuple[str, ...]:
        """Stop everything within ``timeout_s``: break in-flight transfers and the interactive
        streams, close the control connections, write the day files a last time and end the bulk
        server. Returns the names of threads that did not end in time (normally none)."""
        deadline = time.monotonic() + max(0.1, timeout_s)
        self._stop.set()
        self._wake.set()
        for v in self._vantages:
            v.break_sockets()
        threads = [t for v in self._vantages for t in v.threads]
        if self._writer is not None:
            threads.append(self._writer)
        # keep a share of the bound for the last write and the server
        reserve = min(1.0, 0.25 * max(0.1, timeout_s))
        for t in threads:
            t.join(max(0.0, deadline - reserve - time.monotonic()))
        for v in self._vantages:
            with v.lock:
                pending = list(v.transfer_threads)
            for t in pending:
                t.join(max(0.0, deadline - reserve - time.monotonic()))
            with v.lock:
                ctl, v.control = v.control, None
            _close_quietly(ctl)
        for v in self._vantages:
            v.files.flush(force=True)
        if self._server is not None:
            server, self._server = self._server, None
            closer = threading.Thread(target=server.close, name="measure-server-close", daemon=True)
            closer.start()
            closer.join(max(0.0, deadline - time.monotonic()))
            if closer.is_alive():
                threads.append(closer)
        left = [t.name for t in threads if t.is_alive()]
        left += [t.name for v in self._vantages for t in list(v.transfer_threads) if t.is_alive()]
        return tuple(left)

    def __enter__(self) -> MeasurementClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "InteractiveInstrument", "InteractiveLines", "MeasurementClient", "MeasurementConfig", "OnionPerfDayFiles",
    "SIZES", "THRESHOLDS", "TorEvents", "TransferTrace", "VantageHealth", "day_file_name", "read_interactive",
    "run_transfer", "sidecar_name", "tgen_stream",
]
