"""The measurement client's transfers, as OnionPerf's tgen makes them: one ``GET /bytes/N``
from the bulk server through the client tor's SocksPort, on a circuit of its own (a new SOCKS
username per transfer, tor's IsolateSOCKSAuth), timed step by step (``run_transfer``), and the
record tgen writes for it in an OnionPerf analysis file's ``tgen.streams`` (``tgen_stream``;
metrics-sources.md §1.2-§1.3).

A transfer that fails is an errored stream with tgen's error code, never an exception.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Mapping

import attrs

from kistexp.errors import LocalNetError
from kistexp.localnet.spec import LOOPBACK
from kistexp.localnet.traffic import socks_connect

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
#: An HTTP header longer than this is not the bulk server's.
MAX_HEADER_BYTES = 16 * 1024


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
