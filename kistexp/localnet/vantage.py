"""One vantage point of the measurement client: one client tor, measured by three threads.

* ``control``: the client tor's ControlPort with the event listeners of
  ``kistexp.localnet.torevents``, attached again after tor restarts; it closes each
  measurement's circuit once its transfer is done. OnionPerf's circuits close after
  MaxCircuitDirtiness (10 min), but here the period is seconds, each circuit carries one
  transfer, and a circuit enters the analysis file only once closed.
* ``transfers``: every ``period_s`` one transfer (``kistexp.localnet.tgen``), cycling the
  configured sizes, at most ``max_concurrent`` at once; a tick that finds them all busy is
  skipped (counted).
* ``interactive``: the quiet circuit, one long-lived ``GET /echo`` stream with its own SOCKS
  username, sending a small message every ``interactive_period_s`` and timing the echo into
  the sidecar (``kistexp.localnet.quietcircuit``).

Its records go to its analysis files (``kistexp.localnet.analysisfiles``); ``health()`` says
how it is doing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Protocol

import attrs

from kistexp.errors import LocalNetError
from kistexp.localnet.analysisfiles import OnionPerfDayFiles, _utc_day
from kistexp.localnet.control import ControlPort
from kistexp.localnet.network import LocalNetwork
from kistexp.localnet.quietcircuit import sidecar_name
from kistexp.localnet.spec import LOOPBACK, SERVICE_ADDRESS
from kistexp.localnet.tgen import MAX_HEADER_BYTES, SIZES, _Stopped, run_transfer, tgen_stream
from kistexp.localnet.torevents import TorEvents
from kistexp.localnet.traffic import socks_connect


def _positive(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise LocalNetError(f"measurement {attribute.name} must be a positive number of seconds, got {value!r}")


@attrs.frozen
class MeasurementConfig:
    """What the measurement client does. Times are seconds of wall time: an accelerated network
    is measured with a shorter ``period_s`` than OnionPerf's 300 s.

    ``vantages``: client nicknames to measure from (empty: every client). ``service_port``: use a
    bulk server (with ``/echo``) already listening on 127.0.0.2 at that port instead of starting
    one on the network's service port. ``max_concurrent``: transfers at once per vantage point.
    """

    out_dir: Path = attrs.field(converter=Path)
    period_s: float = attrs.field(default=300.0, validator=_positive)
    sizes: tuple[int, ...] = attrs.field(default=SIZES, converter=tuple)
    transfer_timeout_s: float = attrs.field(default=60.0, validator=_positive)
    max_concurrent: int = 2
    interactive_period_s: float = attrs.field(default=1.0, validator=_positive)
    interactive_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    interactive_bytes: int = 32
    vantages: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    service_port: int | None = None
    write_interval_s: float = attrs.field(default=1.0, validator=_positive)
    close_circuits: bool = True
    reconnect_s: float = attrs.field(default=2.0, validator=_positive)
    # how long the first transfer waits for the event listeners (so that its circuit is
    # recorded); a client tor that is down at start holds the transfers back no longer
    attach_wait_s: float = attrs.field(default=10.0, validator=_positive)
    measurement_ip: str = LOOPBACK

    def __attrs_post_init__(self) -> None:
        if not self.sizes or any(not isinstance(s, int) or s <= 0 for s in self.sizes):
            raise LocalNetError(f"measurement sizes must be positive byte counts, got {self.sizes!r}")
        if not 1 <= self.max_concurrent <= 64:
            raise LocalNetError(f"max_concurrent must be 1..64 transfers, got {self.max_concurrent}")
        if not 8 <= self.interactive_bytes <= 498:
            # one relay cell carries 498 bytes of data: the probe is a single cell each way
            raise LocalNetError(f"interactive_bytes must be 8..498, got {self.interactive_bytes}")
        if self.service_port is not None and not 1 <= self.service_port <= 65535:
            raise LocalNetError(f"service port {self.service_port} is not a TCP port")


class MeasuringClient(Protocol):
    """What a vantage point uses of the client that runs it (kistexp.localnet.measure.MeasurementClient)."""

    config: MeasurementConfig
    net: LocalNetwork
    service_port: int
    _stop: threading.Event
    _wake: threading.Event
    _vantages: list[_Vantage]


@attrs.frozen
class VantageHealth:
    """How one vantage point is doing. ``healthy``: its tor's ControlPort answers and its last
    finished transfer succeeded (or none has finished yet)."""

    vantage: str
    healthy: bool
    control_connected: bool
    transfers_ok: int
    transfers_failed: int
    transfers_skipped: int  # ticks that found max_concurrent transfers still running
    in_flight: int
    last_success: dt.datetime | None
    last_error: dt.datetime | None
    last_problem: str
    probes_ok: int
    probes_failed: int
    last_rtt_ms: float | None


def _utc(unix: float | None) -> dt.datetime | None:
    return None if unix is None else dt.datetime.fromtimestamp(unix, dt.timezone.utc)


class _ProbeFailed(Exception):
    """An interactive probe failed after its stream was set up: ``code`` is tgen's error name."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class _Vantage:
    """One client tor being measured: its threads, counters and files."""

    def __init__(self, client: MeasuringClient, nickname: str, socks_port: int) -> None:
        self.client = client
        self.cfg = client.config
        self.nickname = nickname
        self.socks_port = socks_port
        self.stop = client._stop
        self.lock = threading.Lock()
        self.events = TorEvents(self._sink)
        self.files = OnionPerfDayFiles(self.cfg.out_dir, nickname, measurement_ip=self.cfg.measurement_ip,
                                       guards=self.events.guards_json)
        self.control: ControlPort | None = None
        self.control_problem = ""
        self.attached = threading.Event()
        self.closing: queue.Queue[str] = queue.Queue()
        self.sockets: set[socket.socket] = set()
        self.threads: list[threading.Thread] = []
        self.transfer_threads: set[threading.Thread] = set()
        self.number = 0
        self.ok = self.failed = self.skipped = 0
        self.last_success: float | None = None
        self.last_error: float | None = None
        self.last_problem = ""
        self.probes_ok = self.probes_failed = 0
        self.last_rtt_ms: float | None = None

    # -- tor events and files
    def _sink(self, kind: str, key: str, record: dict, end_unix: float) -> None:
        self.files.add(kind, key, record, end_unix)
        self.client._wake.set()

    # -- sockets a stop() must be able to break
    def track(self, sock: socket.socket) -> bool:
        with self.lock:
            if self.stop.is_set():
                return False
            self.sockets.add(sock)
            return True

    def untrack(self, sock: socket.socket | None) -> None:
        if sock is not None:
            with self.lock:
                self.sockets.discard(sock)

    def break_sockets(self) -> None:
        with self.lock:
            socks = list(self.sockets)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def start(self) -> None:
        self.number = self.files.next_number() - 1
        for target, name in ((self._control_loop, "control"), (self._schedule_loop, "transfers"),
                             (self._interactive_loop, "interactive")):
            t = threading.Thread(target=target, name=f"measure-{self.nickname}-{name}", daemon=True)
            self.threads.append(t)
            t.start()

    # -- the ControlPort: listeners, reconnection, closing finished circuits
    def _connect(self) -> None:
        import stem
        from stem.control import EventType

        net = self.client.net
        ctl = net.control(self.nickname)
        try:
            # a client with a fixed CircuitBuildTimeout (the local network's clients) computes no
            # timeout and sends no BUILDTIMEOUT_SET: its timeout is the configured one
            learn = ctl.get_conf("LearnCircuitBuildTimeout")
            fixed = ctl.get_conf("CircuitBuildTimeout")
            timeout_ms = None
            if learn == ["0"] and fixed and fixed[-1].split()[0].isdecimal():
                timeout_ms = int(fixed[-1].split()[0]) * 1000
            self.events.reset(timeout_ms)
            # circuits queued for closing belong to the tor before this connection (a restarted
            # one numbers its circuits anew): closing them by id here would hit strangers
            while not self.closing.empty():
                with contextlib.suppress(queue.Empty):
                    self.closing.get_nowait()
            kinds = (EventType.CIRC, EventType.CIRC_MINOR, EventType.STREAM, EventType.BUILDTIMEOUT_SET,
                     EventType.GUARD)
            ctl.controller.add_event_listener(self.events.handle, *kinds)
            if not ctl.controller.is_authenticated():
                # ControlPort authenticates with stem.connection's cookie call, after which stem's
                # Controller does not count itself authenticated and so never sends SETEVENTS for
                # its listeners: ask tor for the events here
                reply = ctl.controller.msg("SETEVENTS " + " ".join(str(k) for k in kinds))
                if not reply.is_ok():
                    raise LocalNetError(f"{self.nickname}: SETEVENTS refused: {str(reply)[:120]}")
            if not ctl.controller.is_alive():
                raise LocalNetError(f"{self.nickname}: its ControlPort closed while attaching")
            self.events.seed_guards(ctl.get_info("entry-guards"), time.time())
        except (LocalNetError, stem.ControllerError, stem.SocketError) as exc:
            _close_quietly(ctl)
            raise LocalNetError(str(exc).splitlines()[0] if str(exc) else f"{self.nickname}: attach failed") from None
        with self.lock:
            if self.stop.is_set():
                _close_quietly(ctl)
                return
            self.control = ctl
            self.control_problem = ""
        self.attached.set()

    def _control_loop(self) -> None:
        import stem

        while not self.stop.is_set():
            ctl = self.control
            if ctl is None or not ctl.controller.is_alive():
                if ctl is not None:
                    self.attached.clear()
                    with self.lock:
                        self.control = None
                    self.control_problem = f"{self.nickname}: its ControlPort closed (tor gone?)"
                    _close_quietly(ctl)
                try:
                    self._connect()
                except LocalNetError as exc:
                    self.control_problem = str(exc)
                    self.stop.wait(self.cfg.reconnect_s)
                continue
            try:
                cid = self.closing.get(timeout=0.25)
            except queue.Empty:
                continue
            with contextlib.suppress(stem.ControllerError, stem.SocketError, ValueError):
                # "Unknown circuit" when it closed by itself meanwhile: nothing to do
                ctl.controller.close_circuit(cid)
        with self.lock:
            ctl, self.control = self.control, None
        if ctl is not None:
            _close_quietly(ctl)

    # -- transfers
    def _schedule_loop(self) -> None:
        cfg = self.cfg
        # vantage points take turns within a period rather than all starting at once
        offset = cfg.period_s * self.client._vantages.index(self) / max(1, len(self.client._vantages))
        attach_by = time.monotonic() + cfg.attach_wait_s
        while not self.attached.is_set() and not self.stop.is_set() and time.monotonic() < attach_by:
            self.attached.wait(0.1)
        next_at = time.monotonic() + offset
        cycle = 0
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            with self.lock:
                busy = len(self.transfer_threads)
            if busy >= cfg.max_concurrent:
                with self.lock:
                    self.skipped += 1
            else:
                size = cfg.sizes[cycle % len(cfg.sizes)]
                cycle += 1
                self.number += 1
                t = threading.Thread(target=self._transfer, args=(self.number, size),
                                     name=f"measure-{self.nickname}-transfer-{self.number}", daemon=True)
                with self.lock:
                    self.transfer_threads.add(t)
                t.start()
            next_at += cfg.period_s
            # after a stall, carry on from now instead of firing the missed ticks at once
            next_at = max(next_at, time.monotonic())

    def _transfer(self, number: int, size: int) -> None:
        tracked: set[socket.socket] = set()

        def track(sock: socket.socket) -> bool:
            tracked.add(sock)
            return self.track(sock)

        try:
            trace = run_transfer(vantage=self.nickname, number=number, size=size, socks_port=self.socks_port,
                                 host=SERVICE_ADDRESS, port=self.client.service_port,
                                 username=f"kistexp-measure-{self.nickname}-{number}-{time.time_ns()}",
                                 timeout_s=self.cfg.transfer_timeout_s, track=track)
            for sock in tracked:
                self.untrack(sock)
            if self.stop.is_set() and not trace.success:
                return  # broken off by stop(): not a measurement of the network
            self.files.add("tgen", trace.key, tgen_stream(trace), trace.end_unix)
            with self.lock:
                if trace.success:
                    self.ok += 1
                    self.last_success = trace.end_unix
                else:
                    self.failed += 1
                    self.last_error = trace.end_unix
                    self.last_problem = f"{trace.error}: {trace.detail}"
            # tor saw the stream after the transfer began (its SOCKS request), never before
            circuit = self.events.circuit_of(trace.local_port, trace.start_unix) if trace.local_port else None
            if circuit is not None and self.cfg.close_circuits:
                self.closing.put(circuit)
            self.client._wake.set()
        except Exception as exc:  # a fault of this code, not of the network: counted, never raised
            with self.lock:
                self.failed += 1
                self.last_error = time.time()
                self.last_problem = f"MISC: unexpected {type(exc).__name__}: {exc}"
        finally:
            with self.lock:
                self.transfer_threads.discard(threading.current_thread())

    # -- the quiet circuit
    def _interactive_loop(self) -> None:
        cfg = self.cfg
        opened = 0
        sock: socket.socket | None = None
        seq = 0
        next_at = time.monotonic()
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            next_at = max(next_at + cfg.interactive_period_s, time.monotonic())
            sent_at = time.time()
            try:
                if sock is None:
                    opened += 1
                    sock = self._open_echo(opened)
                seq += 1
                rtt_ms = self._probe(sock, seq)
            except Exception as exc:  # LocalNetError (SOCKS), OSError, _ProbeFailed, _Stopped; never raised
                if self.stop.is_set():
                    break
                self._close_interactive(sock)
                sock = None
                if isinstance(exc, TimeoutError) or "timed out" in str(exc):
                    error = "TIMEOUT"
                elif isinstance(exc, _ProbeFailed):
                    error = exc.code
                elif isinstance(exc, (LocalNetError, OSError)):  # the SOCKS stage, or the socket
                    error = "PROXY" if isinstance(exc, LocalNetError) else "READ"
                else:
                    error = "MISC"
                self._write_probe({"time": round(sent_at, 6), "rtt_ms": None, "ok": False, "error": error,
                                   "detail": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                                   "stream": opened})
                with self.lock:
                    self.probes_failed += 1
                continue
            self._write_probe({"time": round(sent_at, 6), "rtt_ms": round(rtt_ms, 3), "ok": True, "stream": opened})
            with self.lock:
                self.probes_ok += 1
                self.last_rtt_ms = rtt_ms
        self._close_interactive(sock)

    def _open_echo(self, opened: int) -> socket.socket:
        """A new interactive stream: its own SOCKS username (so its own circuit, which the bulk
        transfers never share) and ``GET /echo``."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.interactive_timeout_s

        def on_step(step: str, s: socket.socket) -> None:
            if not self.track(s):  # at every step: a shutdown misses a socket still connecting
                raise _Stopped()
            s.settimeout(max(0.001, deadline - time.monotonic()))

        sock = socks_connect(self.socks_port, SERVICE_ADDRESS, self.client.service_port,
                             f"kistexp-interactive-{self.nickname}-{opened}-{time.time_ns()}",
                             timeout_s=cfg.interactive_timeout_s, on_step=on_step)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(f"GET /echo HTTP/1.0\r\nHost: {SERVICE_ADDRESS}\r\n\r\n".encode())
            header = bytearray()
            while b"\r\n\r\n" not in header:
                piece = sock.recv(1024)
                if not piece:
                    raise _ProbeFailed("READEOF", "the echo stream closed before its header")
                header += piece
                if len(header) > MAX_HEADER_BYTES:
                    raise _ProbeFailed("HEADER", "no end of the echo stream's HTTP header")
            if not header.startswith(b"HTTP/1.0 200") and not header.startswith(b"HTTP/1.1 200"):
                raise _ProbeFailed("HEADER", f"the echo path answered {bytes(header[:40])!r}; does the bulk server "
                                             "have /echo?")
            if header.index(b"\r\n\r\n") + 4 != len(header):
                raise _ProbeFailed("MISC", "the echo path sent bytes nobody asked for")
        except BaseException:
            self._close_interactive(sock)
            raise
        return sock

    def _probe(self, sock: socket.socket, seq: int) -> float:
        """Send one small message and wait for its echo; the round trip in ms."""
        size = self.cfg.interactive_bytes
        message = f"{seq:0{size - 1}d}\n".encode()[-size:]
        t0 = time.monotonic()
        deadline = t0 + self.cfg.interactive_timeout_s
        sock.settimeout(self.cfg.interactive_timeout_s)
        sock.sendall(message)
        got = bytearray()
        while len(got) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no echo within {self.cfg.interactive_timeout_s:g} s")
            sock.settimeout(left)
            piece = sock.recv(size - len(got))
            if not piece:
                raise _ProbeFailed("READEOF", "the echo stream closed")
            got += piece
        rtt = (time.monotonic() - t0) * 1000.0
        if bytes(got) != message:
            raise _ProbeFailed("MISC", "the echo came back altered")
        return rtt

    def _close_interactive(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        self.untrack(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def _write_probe(self, record: dict) -> None:
        path = self.cfg.out_dir / sidecar_name(_utc_day(record["time"]), self.nickname)
        try:
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record, allow_nan=False) + "\n")
        except (OSError, ValueError) as exc:
            with self.lock:
                self.last_problem = f"{path}: cannot append a probe: {exc}"

    def health(self) -> VantageHealth:
        with self.lock:
            ok, failed, skipped = self.ok, self.failed, self.skipped
            last_success, last_error = self.last_success, self.last_error
            in_flight = len(self.transfer_threads)
            connected = self.control is not None and self.control.controller.is_alive()
            problem = self.last_problem or self.control_problem
            if not connected:
                problem = self.control_problem or problem
            probes_ok, probes_failed, rtt = self.probes_ok, self.probes_failed, self.last_rtt_ms
        transfers_fine = last_error is None or (last_success is not None and last_success > last_error)
        return VantageHealth(self.nickname, connected and transfers_fine, connected, ok, failed, skipped, in_flight,
                             _utc(last_success), _utc(last_error), problem, probes_ok, probes_failed, rtt)


def _close_quietly(ctl: ControlPort | None) -> None:
    if ctl is None:
        return
    try:
        ctl.close()
    except Exception:  # closing a connection to a dead tor may fail in many ways; it is closed either way
        pass
