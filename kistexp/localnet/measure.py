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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs

from kistexp.errors import LocalNetError
from kistexp.localnet.control import ControlPort
from kistexp.localnet.spec import LOOPBACK, SERVICE_ADDRESS
from kistexp.localnet.traffic import BulkServerProcess, socks_connect
from kistexp.metrics.collectors import check_time
from kistexp.metrics.live import Reading
from kistexp.metrics.series import Sample, from_unix
from kistexp.safeio import read_bounded_text, write_atomic

#: OnionPerf's transfer sizes since April 2021 (metrics-sources.md §1.7): 50 KiB, 1 MiB, 5 MiB.
SIZES = (51200, 1048576, 5242880)
#: tgen's ``elapsed_seconds.payload_bytes_recv`` thresholds (§1.3).
THRESHOLDS = (10240, 20480, 51200, 102400, 204800, 512000, 1048576, 2097152, 5242880)
#: tgen's ``payload_progress_recv`` keys: "0.0" is the first payload byte, "1.0" the last.
PROGRESS = tuple(f"{k / 10:.1f}" for k in range(11))
#: tgen's ``time_info`` steps in the order a stream passes them (usecs-to-<step>).
TIME_STEPS = ("socket-create", "socket-connect", "proxy-init", "proxy-choice", "proxy-request", "proxy-response",
              "command", "response", "first-byte-recv", "last-byte-recv", "first-byte-send", "last-byte-send",
              "checksum-recv", "checksum-send")
ANALYSIS_VERSION = "3.1"
QUIET_METRIC = "quiet_circuit_latency_ms"
INTERACTIVE_KIND = "interactive"
#: OnionPerf's data source names (schema ``propertyNames``); client nicknames fit.
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9-]+$")
#: An HTTP header longer than this is not the bulk server's.
MAX_HEADER_BYTES = 16 * 1024
#: A day file is re-read at start (to extend, not overwrite, an earlier run's day); OnionPerf's
#: busiest day holds 31 MB raw (§5.2).
MAX_DAY_FILE_BYTES = 256 * 1024 * 1024
#: A day's records stay in memory this long after UTC midnight, for transfers and circuits that
#: end just after it but are handed over a little later.
DAY_GRACE_S = 300.0
#: A sidecar line longer than this is garbage, not a probe record.
MAX_SIDECAR_LINE = 4096


def _utc_day(unix: float) -> dt.date:
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).date()


def day_file_name(day: dt.date, vantage: str) -> str:
    """Tor Metrics' name of an OnionPerf analysis day file (uncompressed)."""
    return f"{day:%Y-%m-%d}.{vantage}.onionperf.analysis.json"


def sidecar_name(day: dt.date, vantage: str) -> str:
    return f"{day:%Y-%m-%d}.{vantage}.interactive.jsonl"


# ---- one transfer --------------------------------------------------------------------------


@attrs.frozen
class TransferTrace:
    """What one transfer recorded, in tgen's terms. Times are ``time.monotonic()`` values except
    ``end_unix``; ``steps`` maps tgen step names (TIME_STEPS) to when they were reached.

    ``error`` is tgen's stream error (NONE, PROXY, TIMEOUT, READ, READEOF, WRITE, HEADER, MISC),
    ``transport_error`` its transport error (NONE, CONNECT, PROXY_CHOICE, PROXY_AUTH, PROXY_STATUS,
    TIMEOUT); ``detail`` says why in one line (for health, not part of the file).
    """

    vantage: str
    number: int
    size: int
    username: str
    socks_port: int
    host: str
    port: int
    created: float
    ended: float
    end_unix: float
    steps: Mapping[str, float] = attrs.field(hash=False)
    local_port: int = 0
    fd: int = -1
    payload_recv: int = 0
    total_recv: int = 0
    total_sent: int = 0
    thresholds: Mapping[int, float] = attrs.field(factory=dict, hash=False)
    progress: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    error: str = "NONE"
    transport_error: str = "NONE"
    transport_state: str = "SUCCESS_OPEN"
    recv_state: str = "RECV_SUCCESS"
    send_state: str = "SEND_SUCCESS"
    detail: str = ""

    @property
    def success(self) -> bool:
        return self.error == "NONE"

    @property
    def start_unix(self) -> float:
        # tgen: unix_ts_start = unix_ts_end - (now-ts - created-ts) / 1e6 (metrics-sources.md §1.3)
        return self.end_unix - (self.ended - self.created)

    @property
    def key(self) -> str:
        """tgen's stream id: ``<id>:<fd>:<host:ip:port>:<host:ip:port>``."""
        return f"{self.number}:{self.fd}:localhost:{LOOPBACK}:{self.local_port}:{self.host}:{self.host}:{self.port}"


def _us(t: float) -> int:
    return int(round(t * 1e6))


def tgen_stream(trace: TransferTrace) -> dict:
    """The OnionPerf 3.x ``tgen.streams`` record of a transfer (all info values strings, §1.2)."""
    created = trace.created

    def usecs(step: str) -> str:
        t = trace.steps.get(step)
        return str(max(0, _us(t - created))) if t is not None else "-1"

    def since(t: float) -> float:
        return round(max(0.0, t - created), 6)

    progress = 100.0 * trace.payload_recv / trace.size if trace.size else 100.0
    record = {
        "byte_info": {
            "payload-bytes-recv": str(trace.payload_recv),
            "payload-bytes-send": "0",
            "payload-progress-recv": f"{progress:.2f}%",
            "payload-progress-send": "100.00%",
            "total-bytes-recv": str(trace.total_recv),
            "total-bytes-send": str(trace.total_sent),
        },
        "is_complete": True,
        "is_error": not trace.success,
        "is_success": trace.success,
        "stream_id": trace.key,
        "stream_info": {
            "error": trace.error,
            "id": str(trace.number),
            "name": trace.vantage,
            "peername": trace.host,
            "recvsize": str(trace.size),
            "recvstate": trace.recv_state,
            "sendsize": "0",
            "sendstate": trace.send_state,
            "vertexid": "stream",
        },
        "time_info": {
            "created-ts": str(_us(created)),
            "now-ts": str(_us(trace.ended)),
            **{f"usecs-to-{step}": usecs(step) for step in sorted(TIME_STEPS)},
        },
        "transport_info": {
            "error": trace.transport_error,
            "fd": str(trace.fd),
            "local": f"localhost:{LOOPBACK}:{trace.local_port}",
            "proxy": f"localhost:{LOOPBACK}:{trace.socks_port}",
            "remote": f"{trace.host}:{trace.host}:{trace.port}",
            "state": trace.transport_state,
        },
        "unix_ts_end": round(trace.end_unix, 6),
        "unix_ts_start": round(trace.start_unix, 6),
    }
    if trace.success:
        # tgen writes elapsed_seconds for streams without an error only (§1.3)
        record["elapsed_seconds"] = {
            "payload_bytes_recv": {str(k): since(t) for k, t in sorted(trace.thresholds.items())},
            "payload_bytes_send": {},
            "payload_progress_recv": {k: since(trace.progress[k]) for k in PROGRESS if k in trace.progress},
            "payload_progress_send": {},
        }
    return record


class _Stopped(Exception):
    """The measurement is stopping: the transfer is abandoned, not recorded."""


class _ProbeFailed(Exception):
    """An interactive probe failed after its stream was set up: ``code`` is tgen's error name."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


def run_transfer(*, vantage: str, number: int, size: int, socks_port: int, host: str, port: int, username: str,
                 timeout_s: float, track: Callable[[socket.socket], bool] | None = None) -> TransferTrace:
    """One ``GET /bytes/<size>`` through tor's SocksPort on a circuit chosen by ``username``, bounded
    by ``timeout_s`` in all. Never raises for a network failure: the trace carries tgen's error.

    ``track(sock)`` is called at each SOCKS step so that a caller can shut the socket down to end
    the transfer early; it returns False when the caller is stopping (the trace then has error MISC
    and detail "stopped"). At every step, since a shutdown misses a socket still connecting."""
    created = time.monotonic()
    deadline = created + timeout_s
    steps: dict[str, float] = {}
    held: dict[str, object] = {"local_port": 0, "fd": -1}

    def bound(sock: socket.socket) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("transfer timeout")
        sock.settimeout(left)

    def on_step(step: str, sock: socket.socket) -> None:
        steps[step] = time.monotonic()
        if track is not None and not track(sock):
            raise _Stopped()
        if step == "socket-connect":
            held["local_port"] = sock.getsockname()[1]
            held["fd"] = sock.fileno()
        bound(sock)

    def trace(**kw) -> TransferTrace:
        ended = time.monotonic()
        return TransferTrace(vantage=vantage, number=number, size=size, username=username, socks_port=socks_port,
                             host=host, port=port, created=created, ended=ended, end_unix=time.time(),
                             steps=dict(steps), local_port=int(held["local_port"]),  # type: ignore[arg-type]
                             fd=int(held["fd"]), **kw)  # type: ignore[arg-type]

    try:
        sock = socks_connect(socks_port, host, port, username, timeout_s=max(0.001, timeout_s), on_step=on_step)
    except _Stopped:
        return trace(error="MISC", transport_error="MISC", transport_state="ERROR", recv_state="RECV_NONE",
                     send_state="SEND_NONE", detail="stopped")
    except LocalNetError as exc:
        return trace(**_socks_failure(steps, str(exc), time.monotonic() >= deadline - 0.01))
    total_sent = total_recv = payload = 0
    thresholds: dict[int, float] = {}
    progress: dict[str, float] = {}
    recv_state, send_state = "RECV_NONE", "SEND_COMMAND"

    def result(**kw) -> TransferTrace:
        return trace(payload_recv=payload, total_recv=total_recv, total_sent=total_sent, thresholds=thresholds,
                     progress=progress, recv_state=kw.pop("recv_state", recv_state),
                     send_state=kw.pop("send_state", send_state), **kw)

    try:
        request = f"GET /bytes/{size} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode()
        try:
            bound(sock)
            sock.sendall(request)
        except TimeoutError:
            return result(error="TIMEOUT", detail=f"timed out after {timeout_s:g} s sending the request")
        except OSError as exc:
            return result(error="WRITE", send_state="SEND_ERROR", detail=f"sending the request failed: {exc}")
        steps["command"] = time.monotonic()
        total_sent = len(request)
        send_state, recv_state = "SEND_SUCCESS", "RECV_HEADER"
        header = bytearray()
        while payload < size or recv_state == "RECV_HEADER":
            try:
                bound(sock)
                piece = sock.recv(256 * 1024)
            except TimeoutError:
                return result(error="TIMEOUT", detail=f"timed out after {timeout_s:g} s with {payload} of {size} "
                                                      "bytes")
            except OSError as exc:
                return result(error="READ", detail=f"reading failed after {payload} of {size} bytes: {exc}")
            now = time.monotonic()
            if not piece:
                return result(error="READEOF", detail=f"the stream closed after {payload} of {size} bytes")
            total_recv += len(piece)
            if recv_state == "RECV_HEADER":
                header += piece
                end = header.find(b"\r\n\r\n")
                if end < 0:
                    if len(header) > MAX_HEADER_BYTES:
                        return result(error="HEADER", detail="no end of the HTTP header")
                    continue
                if not (header.startswith(b"HTTP/1.0 200") or header.startswith(b"HTTP/1.1 200")):
                    first = bytes(header[: header.find(b"\r\n")])[:60]
                    return result(error="HEADER", detail=f"the server answered {first!r}")
                steps["response"] = now
                recv_state = "RECV_PAYLOAD"
                got = len(header) - end - 4
            else:
                got = len(piece)
            if got <= 0:
                continue
            if "first-byte-recv" not in steps:
                steps["first-byte-recv"] = now
                progress["0.0"] = now
            payload += got
            # tgen moves the last-byte time on every read, errored streams included (§1.3 trap)
            steps["last-byte-recv"] = now
            for mark in THRESHOLDS:
                if mark <= payload and mark not in thresholds:
                    thresholds[mark] = now
            for k in range(1, 11):
                key = PROGRESS[k]
                if key not in progress and payload * 10 >= k * size:
                    progress[key] = now
        if payload > size:
            return result(error="MISC", detail=f"the server sent {payload} bytes, not {size}")
        return result(recv_state="RECV_SUCCESS")
    finally:
        with contextlib.suppress(OSError):
            sock.close()


def _socks_failure(steps: Mapping[str, float], why: str, timed_out: bool) -> dict:
    """tgen's stream and transport error for a SOCKS stage that failed after the last step reached."""
    if "proxy-request" in steps:
        state, xerr = "RESPONSE_STATUS", "PROXY_STATUS"
    elif "proxy-choice" in steps:
        state, xerr = "AUTH_RESPONSE", "PROXY_AUTH"
    elif "proxy-init" in steps:
        state, xerr = "CHOICE", "PROXY_CHOICE"
    elif "socket-connect" in steps:
        state, xerr = "INIT", "PROXY_CHOICE"
    else:
        state, xerr = "CONNECT", "CONNECT"
    timed_out = timed_out or "timed out" in why
    return {"error": "TIMEOUT" if timed_out else "PROXY", "transport_error": "TIMEOUT" if timed_out else xerr,
            "transport_state": state, "recv_state": "RECV_NONE", "send_state": "SEND_NONE", "detail": why}


# ---- the tor section from control-port events ---------------------------------------------------


class _Guard:
    """One entry guard as OnionPerf tracks it from GUARD events."""

    def __init__(self, fingerprint: str, nickname: str) -> None:
        self.fingerprint, self.nickname = fingerprint, nickname
        self.new_ts: float | None = None
        self.up_ts: float | None = None
        self.down_ts: float | None = None
        self.dropped_ts: float | None = None

    def as_json(self) -> dict:
        out: dict = {"fingerprint": self.fingerprint, "nickname": self.nickname}
        for key in ("new_ts", "up_ts", "down_ts", "dropped_ts"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 6)
        return out

    def current_at(self, t: float) -> bool:
        # OnionPerf: up before the circuit launched, and neither dropped nor down since
        return bool(self.up_ts and t >= self.up_ts and (not self.dropped_ts or t < self.dropped_ts)
                    and (not self.down_ts or t < self.down_ts))


class _Circuit:
    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.start: float | None = None
        self.built: float | None = None
        self.events: list[tuple[str, float]] = []
        self.path: list[tuple[str, float]] = []
        self.build_timeout: int | None = None
        self.build_quantile: float | None = None
        self.cbt_set = False
        self.failure_local: str | None = None
        self.failure_remote: str | None = None

    def record(self, end: float, guards: Iterable[_Guard]) -> dict | None:
        """OnionPerf's circuit record (schema 3.1, additionalProperties false); None when the
        LAUNCHED event came before the listener (OnionPerf drops those too)."""
        if self.start is None:
            return None
        s = self.start
        out: dict = {
            "circuit_id": self.cid,
            "unix_ts_start": round(s, 6),
            "unix_ts_end": round(end, 6),
            "elapsed_seconds": [[k, round(t - s, 6)] for k, t in self.events],
            "cbt_set": self.cbt_set,
            # written on every circuit by 3.1's analyze: true only under the exclude_cbt filter,
            # which this client does not apply (it writes no ``filters``)
            "filtered_out": False,
        }
        if self.path:
            out["path"] = [[hop, round(t - s, 6)] for hop, t in self.path]
        if self.built is not None:
            out["buildtime_seconds"] = round(self.built - s, 6)
        if self.build_timeout is not None:
            out["build_timeout"] = self.build_timeout
        if self.build_quantile is not None:
            out["build_quantile"] = self.build_quantile
        current = [g.as_json() for g in guards if g.current_at(s)]
        if current:
            out["current_guards"] = current
        if self.failure_local:
            out["failure_reason_local"] = self.failure_local
        if self.failure_remote:
            out["failure_reason_remote"] = self.failure_remote
        return out


class _Stream:
    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.circuit_id: str | None = None
        self.start: float | None = None
        self.events: list[tuple[str, float]] = []
        self.purpose: str | None = None
        self.source: str | None = None
        self.target: str | None = None
        self.failure_local: str | None = None
        self.failure_remote: str | None = None

    def record(self, end: float) -> dict | None:
        if self.start is None:
            return None
        s = self.start
        out: dict = {
            "stream_id": self.sid,
            "circuit_id": self.circuit_id,  # a string, or null for a stream never attached (§1.4)
            "unix_ts_start": round(s, 6),
            "unix_ts_end": round(end, 6),
            "elapsed_seconds": [[k, round(t - s, 6)] for k, t in self.events],
        }
        if self.source:
            out["source"] = self.source
        if self.target:
            out["target"] = self.target
        if self.failure_local:
            out["failure_reason_local"] = self.failure_local
        if self.failure_remote:
            out["failure_reason_remote"] = self.failure_remote
        return out


_HS_PURPOSES = frozenset({"HS_CLIENT_INTRO", "HS_CLIENT_REND", "HS_SERVICE_INTRO", "HS_SERVICE_REND"})
_STREAM_START = frozenset({"NEW", "NEWRESOLVE"})
_ENDED = frozenset({"CLOSED", "FAILED"})


def _text(value: object) -> str | None:
    """stem's enum members are strings; None stays None."""
    return None if value is None else str(value)


class TorEvents:
    """The client tor's circuits, streams and guards from its control-port events, turned into
    OnionPerf's ``tor`` records as they end (OnionPerf's TorCtlParser semantics, analysis.py).
    Every method is called from stem's event thread or under ``lock``; finished records go to
    ``sink(kind, id, record, end_unix)`` with kind "circuit" or "stream"."""

    def __init__(self, sink: Callable[[str, str, dict, float], None], clock: Callable[[], float] = time.time) -> None:
        self.sink = sink
        self.clock = clock
        self.lock = threading.Lock()
        self._circuits: dict[int, _Circuit] = {}
        self._streams: dict[int, _Stream] = {}
        self.guards: list[_Guard] = []
        self._build_timeout: int | None = None
        self._build_quantile: float | None = None
        self._cbt_set = False
        # source port -> (circuit id, when tor saw the stream): ports are reused, so a lookup
        # names the earliest time its stream may have started
        self._port_circuit: dict[int, tuple[str, float]] = {}
        self._done: list[tuple[str, str, dict, float]] = []

    def reset(self, build_timeout_ms: int | None = None) -> None:
        """A new connection (possibly to a restarted tor, which numbers circuits anew): open state
        is dropped; guards stay (their times are history)."""
        with self.lock:
            self._circuits.clear()
            self._streams.clear()
            self._port_circuit.clear()
            self._build_timeout, self._build_quantile, self._cbt_set = build_timeout_ms, None, False

    def seed_guards(self, entry_guards: str, at: float) -> None:
        """Guards tor already had when the listener attached (``GETINFO entry-guards``: ``$FP~nick
        status`` lines). Their GUARD UP came before us, so a guard that is up counts as up from now."""
        with self.lock:
            for line in entry_guards.splitlines():
                parts = line.split()
                if not parts or not parts[0].startswith("$"):
                    continue
                fp, _, nick = parts[0][1:].partition("~")
                guard = self._guard(fp, nick or fp)
                if len(parts) > 1 and parts[1] == "up" and guard.up_ts is None:
                    guard.up_ts = at

    def circuit_of(self, local_port: int, since_unix: float) -> str | None:
        """The circuit tor attached the stream from ``127.0.0.1:local_port`` to, if that stream
        started at ``since_unix`` or later (an earlier one had the port before)."""
        with self.lock:
            found = self._port_circuit.get(local_port)
        return found[0] if found is not None and found[1] >= since_unix else None

    def guards_json(self) -> list[dict]:
        with self.lock:
            return [g.as_json() for g in self.guards]

    def _guard(self, fingerprint: str, nickname: str) -> _Guard:
        for g in reversed(self.guards):
            if g.fingerprint == fingerprint and g.dropped_ts is None:
                return g
        g = _Guard(fingerprint, nickname)
        self.guards.append(g)
        return g

    def handle(self, event: object) -> None:
        """stem's listener: never raises (a malformed event is skipped)."""
        at = self.clock()  # stem's own arrived_at has whole seconds only
        name = type(event).__name__
        with self.lock:
            try:
                if name == "CircuitEvent":
                    self._on_circuit(event, at)
                elif name == "CircMinorEvent":
                    self._on_circuit_minor(event, at)
                elif name == "StreamEvent":
                    self._on_stream(event, at)
                elif name == "BuildTimeoutSetEvent":
                    self._on_build_timeout(event)
                elif name == "GuardEvent":
                    self._on_guard(event, at)
            except (AttributeError, TypeError, ValueError):
                pass
            done, self._done = self._done, []
        # handed over outside the lock: the sink takes the day files' lock, whose rendering
        # takes this one for the guards
        for record in done:
            self.sink(*record)

    def _on_circuit(self, ev, at: float) -> None:
        cid = int(ev.id)
        circ = self._circuits.setdefault(cid, _Circuit(cid))
        status, purpose = _text(ev.status), _text(ev.purpose)
        if status == "LAUNCHED" and circ.start is None:
            circ.start = at
            circ.build_timeout, circ.build_quantile, circ.cbt_set = (self._build_timeout, self._build_quantile,
                                                                     self._cbt_set)
        circ.events.append((f"{purpose}:{status}", at))
        if status == "EXTENDED" and ev.path:
            fp, nick = ev.path[-1]
            circ.path.append((f"${fp}~{nick or 'Unnamed'}", at))
        elif status == "FAILED":
            circ.failure_local = _text(ev.reason)
            if ev.remote_reason:
                circ.failure_remote = _text(ev.remote_reason)
        elif status == "BUILT":
            if circ.built is None:
                circ.built = at
            if purpose in _HS_PURPOSES and ev.hs_state:
                key = _text(ev.hs_state)
                circ.events.append((f"{key}:{ev.rend_query}" if ev.rend_query else str(key), at))
        if status in _ENDED:
            del self._circuits[cid]
            record = circ.record(at, self.guards)
            if record is not None:
                self._done.append(("circuit", str(cid), record, at))

    def _on_circuit_minor(self, ev, at: float) -> None:
        cid = int(ev.id)
        circ = self._circuits.setdefault(cid, _Circuit(cid))
        event, purpose = _text(ev.event), _text(ev.purpose)
        if purpose != _text(ev.old_purpose) or event != "PURPOSE_CHANGED":
            circ.events.append((f"{event}:{purpose}", at))
        if purpose in _HS_PURPOSES and ev.hs_state:
            key = _text(ev.hs_state)
            circ.events.append((f"{key}:{ev.rend_query}" if ev.rend_query else str(key), at))

    def _on_stream(self, ev, at: float) -> None:
        sid = int(ev.id)
        strm = self._streams.setdefault(sid, _Stream(sid))
        if ev.circ_id is not None:
            strm.circuit_id = str(ev.circ_id)
        if ev.purpose is not None:
            strm.purpose = _text(ev.purpose)
        status = _text(ev.status)
        strm.events.append((f"{strm.purpose}:{status}", at))
        strm.target = _text(ev.target)
        if status in _STREAM_START:
            if strm.start is None:
                strm.start = at
            strm.source = _text(ev.source_addr)
        elif status == "FAILED":
            strm.failure_local = _text(ev.reason)
            if ev.remote_reason:
                strm.failure_remote = _text(ev.remote_reason)
        port = _source_port(strm.source)
        if port is not None and strm.circuit_id is not None and strm.start is not None:
            self._port_circuit[port] = (strm.circuit_id, strm.start)
        if status in _ENDED:
            del self._streams[sid]
            record = strm.record(at)
            if record is not None:
                self._done.append(("stream", str(sid), record, at))

    def _on_build_timeout(self, ev) -> None:
        # 3.1's cbt_set: a computed timeout sets it, RESET clears it (metrics-sources.md §1.4)
        set_type = _text(ev.set_type)
        if set_type == "RESET":
            self._cbt_set = False
        elif set_type == "COMPUTED":
            self._cbt_set = True
        if ev.timeout is not None:
            self._build_timeout = int(ev.timeout)
        if ev.quantile is not None:
            self._build_quantile = float(ev.quantile)

    def _on_guard(self, ev, at: float) -> None:
        if _text(ev.guard_type) != "ENTRY" or not ev.endpoint_fingerprint:
            return
        fp, nick = str(ev.endpoint_fingerprint), _text(ev.endpoint_nickname) or str(ev.endpoint_fingerprint)
        guard = None
        for g in reversed(self.guards):
            if g.fingerprint == fp:
                guard = g
                break
        if guard is None or guard.dropped_ts is not None:
            guard = _Guard(fp, nick)
            self.guards.append(guard)
        status = _text(ev.status)
        field = {"NEW": "new_ts", "UP": "up_ts", "DOWN": "down_ts", "DROPPED": "dropped_ts"}.get(status or "")
        if field and getattr(guard, field) is None:
            setattr(guard, field, at)


def _source_port(source: str | None) -> int | None:
    if not source or ":" not in source:
        return None
    port = source.rsplit(":", 1)[1]
    return int(port) if port.isascii() and port.isdecimal() else None


# ---- day files --------------------------------------------------------------------------


class _Day:
    """One UTC day of one vantage point: each record kept as its JSON text, so a rewrite joins
    strings instead of encoding the whole day again."""

    def __init__(self, day: dt.date) -> None:
        self.day = day
        self.tgen: dict[str, str] = {}
        self.circuits: dict[str, str] = {}
        self.streams: dict[str, str] = {}
        self.dirty = True
        self.max_number = 0


class OnionPerfDayFiles:
    """The day files of one vantage point; thread-safe. ``flush`` writes every day that changed
    (temp file and rename) and forgets days whose file is final."""

    def __init__(self, out_dir: Path | str, vantage: str, *, measurement_ip: str = LOOPBACK,
                 guards: Callable[[], list[dict]] = list, grace_s: float = DAY_GRACE_S) -> None:
        if not _SOURCE_NAME.match(vantage):
            raise LocalNetError(f"vantage point name {vantage!r} is not an OnionPerf source name ([A-Za-z0-9-]+)")
        self.out_dir = Path(out_dir)
        self.vantage = vantage
        self.measurement_ip = measurement_ip
        self.guards = guards
        self.grace_s = grace_s
        self.late_records = 0  # records for a day already final and forgotten
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._days: dict[dt.date, _Day] = {}
        self._final: set[dt.date] = set()
        self._write_lock = threading.Lock()  # one flush at a time: an older rendering never lands last

    def path(self, day: dt.date) -> Path:
        return self.out_dir / day_file_name(day, self.vantage)

    def next_number(self) -> int:
        """A tgen stream id above every one in today's file (an earlier run's included)."""
        with self._lock:
            day = self._day(_utc_day(time.time()))
            return (day.max_number + 1) if day else 1

    def _day(self, day: dt.date) -> _Day | None:
        if day in self._final:
            return None
        entry = self._days.get(day)
        if entry is None:
            entry = self._days[day] = _Day(day)
            self._load_existing(entry)
        return entry

    def _load_existing(self, entry: _Day) -> None:
        """Extend an earlier run's file for the same day instead of overwriting it; a file that
        cannot be read is kept aside under another name."""
        path = self.path(entry.day)
        if not path.exists():
            return
        try:
            doc = json.loads(read_bounded_text(path, MAX_DAY_FILE_BYTES, "OnionPerf day file", LocalNetError))
            source = doc["data"][self.vantage]
            for key, rec in source["tgen"]["streams"].items():
                entry.tgen[key] = json.dumps(rec)
                first = str(key).split(":", 1)[0]
                if first.isdecimal():
                    entry.max_number = max(entry.max_number, int(first))
            for key, rec in source.get("tor", {}).get("circuits", {}).items():
                entry.circuits[str(key)] = json.dumps(rec)
            for key, rec in source.get("tor", {}).get("streams", {}).items():
                entry.streams[str(key)] = json.dumps(rec)
        except (LocalNetError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
            with contextlib.suppress(OSError):
                path.rename(aside)
            entry.tgen.clear(), entry.circuits.clear(), entry.streams.clear()
            self.problems.append(f"{path}: not a readable analysis file ({exc}); kept as {aside.name}")

    def add(self, kind: str, key: str, record: dict, end_unix: float) -> None:
        """Add a finished record (kind "tgen", "circuit" or "stream") to the day it ended on."""
        text = json.dumps(record)
        with self._lock:
            day = self._day(_utc_day(end_unix))
            if day is None:
                self.late_records += 1
                return
            {"tgen": day.tgen, "circuit": day.circuits, "stream": day.streams}[kind][key] = text
            if kind == "tgen":
                first = key.split(":", 1)[0]
                if first.isdecimal():
                    day.max_number = max(day.max_number, int(first))
            day.dirty = True

    @property
    def dirty(self) -> bool:
        with self._lock:
            return any(d.dirty for d in self._days.values())

    def render(self, day: dt.date) -> str:
        guards = json.dumps(self.guards())
        with self._lock:
            entry = self._days.get(day)
            return self._render(entry, guards) if entry else ""

    def _render(self, entry: _Day, guards: str) -> str:
        def obj(items: Mapping[str, str]) -> str:
            return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in items.items()) + "}"

        tor = f'{{"circuits": {obj(entry.circuits)}, "guards": {guards}, "streams": {obj(entry.streams)}}}'
        source = (f'{{"measurement_ip": {json.dumps(self.measurement_ip)}, "tgen": {{"streams": {obj(entry.tgen)}}}, '
                  f'"tor": {tor}}}')
        return (f'{{"data": {{{json.dumps(self.vantage)}: {source}}}, "type": "onionperf", '
                f'"version": "{ANALYSIS_VERSION}"}}\n')

    def flush(self, now_unix: float | None = None, force: bool = False) -> tuple[Path, ...]:
        """Write each day that changed (all days with ``force``); forget days over ``grace_s``
        past their end once written. Returns the files written."""
        with self._write_lock:
            return self._flush(time.time() if now_unix is None else now_unix, force)

    def _flush(self, now_unix: float, force: bool) -> tuple[Path, ...]:
        today = _utc_day(now_unix)
        written = []
        guards = json.dumps(self.guards())
        with self._lock:
            pending = [(d.day, self._render(d, guards)) for d in self._days.values() if d.dirty or force]
            for d in self._days.values():
                d.dirty = False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for day, text in pending:
            try:
                write_atomic(self.path(day), text.encode(), "OnionPerf day file", LocalNetError)
                written.append(self.path(day))
            except LocalNetError as exc:
                self.problems.append(str(exc))
                with self._lock:
                    if day in self._days:
                        self._days[day].dirty = True
        with self._lock:
            for day in list(self._days):
                ends = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone.utc).timestamp()
                if day < today and now_unix >= ends + self.grace_s and not self._days[day].dirty:
                    del self._days[day]
                    self._final.add(day)
        return tuple(written)

    def days_in_memory(self) -> tuple[dt.date, ...]:
        with self._lock:
            return tuple(sorted(self._days))


# ---- quiet-circuit latency sidecar -------------------------------------------------------------


@attrs.frozen
class InteractiveLines:
    """What ``read_interactive`` got from a sidecar: latency samples of answered probes, the
    number of failed probes, problems with lines it skipped, and the bytes of whole lines read
    (the offset to continue from)."""

    samples: tuple[Sample, ...]
    failures: int
    problems: tuple[str, ...]
    consumed: int
    last_failure: str = ""


def read_interactive(path: Path | str, *, source: str, instance: str, offset: int = 0,
                     max_bytes: int = 4 * 1024 * 1024, now: dt.datetime | None = None,
                     labels: Callable[[dt.datetime], tuple[Mapping[str, str], int | None]] | None = None,
                     ) -> InteractiveLines:
    """``quiet_circuit_latency_ms`` samples (labels ``instance`` and ``source``) from the whole
    lines of a sidecar from byte ``offset`` on, at most ``max_bytes`` of them. A line that is not a
    probe record (not JSON, no finite time, an answered probe without a finite non-negative
    ``rtt_ms``) is skipped with a problem naming it; a last line without its newline is left for
    the next read. ``labels(time)`` may add labels and a ``param_value`` per sample."""
    path = Path(path)
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            raw = fh.read(max_bytes)
    except OSError as exc:
        return InteractiveLines((), 0, (f"{path}: cannot read: {exc.strerror or exc}",), 0)
    end = raw.rfind(b"\n") + 1
    if end == 0 and len(raw) >= max_bytes:
        # no newline in a whole read: one over-long line; skip it rather than stall on it for ever
        return InteractiveLines((), 0, (f"{path}: a line at byte {offset} is longer than {max_bytes} bytes; "
                                         "skipped",), len(raw))
    samples: list[Sample] = []
    problems: list[str] = []
    failures = 0
    last_failure = ""
    position = offset
    for line in raw[:end].split(b"\n")[:-1]:
        where = f"{path}@{position}"
        position += len(line) + 1
        if not line.strip():
            continue
        try:
            if len(line) > MAX_SIDECAR_LINE:
                raise ValueError(f"line of {len(line)} bytes")
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
            at = _finite(rec.get("time"), "time")
            when = from_unix(at)
            check_time(when, "time", now)
            if rec.get("ok") is not True:
                failures += 1
                last_failure = f"{rec.get('error', 'MISC')}: {str(rec.get('detail', ''))[:120]}".rstrip(": ")
                continue
            rtt = _finite(rec.get("rtt_ms"), "rtt_ms")
        except (ValueError, OverflowError, RecursionError) as exc:
            problems.append(f"{where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; line skipped")
            continue
        extra, param_value = labels(when) if labels is not None else ({}, None)
        samples.append(Sample(when, rtt, {**extra, "instance": instance, "source": source}, param_value))
    return InteractiveLines(tuple(samples), failures, tuple(problems), end, last_failure)


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} {value!r} is not a number")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {value!r} is not a finite non-negative number")
    return x


class InteractiveInstrument:
    """An ``Instrument`` (kistexp.metrics.live) over one vantage point's interactive sidecars:
    each poll returns the probes written since the previous poll as ``quiet_circuit_latency_ms``
    samples, never the same one twice.

    The poll is a problem (a gap) when no sidecar exists, when every new probe failed, or when the
    sidecar has not grown for ``stale_after_s`` (the measurement is not running). Lines it had to
    skip are kept in ``problems``. With a ``watch`` (HeldConsensusWatch) each sample gets the label
    ``valid_after`` of the consensus the vantage's tor held then, and ``param_value`` the value of
    ``param`` in it."""

    kind = INTERACTIVE_KIND
    metrics = (QUIET_METRIC,)

    def __init__(self, out_dir: Path | str, vantage: str, *, name: str | None = None, watch: object = None,
                 param: str | None = None, stale_after_s: float | None = None,
                 max_bytes_per_poll: int = 4 * 1024 * 1024) -> None:
        self.out_dir = Path(out_dir)
        self.vantage = vantage
        self.name = name or f"{INTERACTIVE_KIND}:{vantage}"
        self.watch = watch
        self.param = param
        self.stale_after_s = stale_after_s
        self.max_bytes_per_poll = max_bytes_per_poll
        self.problems: list[str] = []
        self._offsets: dict[Path, int] = {}
        self._last_growth = time.monotonic()

    def _labels(self, when: dt.datetime) -> tuple[Mapping[str, str], int | None]:
        held = self.watch.held(self.vantage, when) if self.watch is not None else None  # type: ignore[attr-defined]
        if held is None or held.valid_after is None:
            return {}, None
        return {"valid_after": held.valid_after.isoformat()}, (held.param(self.param) if self.param else None)

    def poll(self, now: dt.datetime) -> Reading:
        """The probes new since the last poll; never raises (an unforeseen failure is a gap)."""
        try:
            pairs, problem = self._poll(now)
        except Exception as exc:  # the Instrument protocol: a poll never raises
            pairs, problem = (), f"{self.name}: unexpected {type(exc).__name__}: {exc}"
        problem = " ".join(problem.split())
        return Reading(self.name, self.kind, now, pairs, problem[:397] + "..." if len(problem) > 400 else problem)

    def _poll(self, now: dt.datetime) -> tuple[tuple[tuple[str, Sample], ...], str]:
        files = sorted(self.out_dir.glob(f"*.{self.vantage}.interactive.jsonl"))
        if not files:
            return (), f"{self.name}: no sidecar *.{self.vantage}.interactive.jsonl in {self.out_dir} yet"
        budget = self.max_bytes_per_poll
        samples: list[Sample] = []
        failures, skipped, last_failure = 0, [], ""
        for path in files:
            offset = self._offsets.get(path, 0)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size < offset:
                offset = 0  # the sidecar was replaced by a shorter one: read the new one from its start
            if size <= offset:
                continue
            got = read_interactive(path, source=self.vantage, instance=self.name, offset=offset, max_bytes=budget,
                                   now=now, labels=self._labels if self.watch is not None else None)
            self._offsets[path] = offset + got.consumed
            budget -= got.consumed
            samples.extend(got.samples)
            failures += got.failures
            skipped.extend(got.problems)
            last_failure = got.last_failure or last_failure
            if budget <= 0:
                break
        self.problems = (self.problems + skipped)[-100:]
        if samples or failures or skipped:
            self._last_growth = time.monotonic()
        pairs = tuple((QUIET_METRIC, s) for s in samples)
        problem = ""
        if not samples and failures:
            problem = f"{self.name}: {failures} probe(s) failed, the last with {last_failure or 'an error'}"
        elif not samples and skipped:
            problem = f"{self.name}: {len(skipped)} unreadable line(s), the first: {skipped[0]}"
        elif not samples and self.stale_after_s is not None and \
                time.monotonic() - self._last_growth > self.stale_after_s:
            problem = f"{self.name}: no probe recorded for over {self.stale_after_s:g} s"
        return pairs, problem

    def close(self) -> None:
        self._offsets.clear()


# ---- the measurement client -------------------------------------------------------------------


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


class _Vantage:
    """One client tor being measured: its threads, counters and files."""

    def __init__(self, client: MeasurementClient, nickname: str, socks_port: int) -> None:
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
