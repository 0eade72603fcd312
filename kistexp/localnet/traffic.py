"""Real traffic through a local tor network: a bulk HTTP server on 127.0.0.2, SOCKS5
downloads through a client over a pinned 3-hop path, and throughput figures
(real-tor.md, "Throughput"; issue 4 point 7).

The service listens on 127.0.0.2, never 127.0.0.1: 127.0.0.1 is every relay's address, so
the client would treat the exit as an enclave and build 4-hop circuits (real-tor.md
problem 2). Distinct SOCKS usernames give distinct circuits (tor's IsolateSOCKSAuth,
on by default), all over the same pinned guard -> middle -> exit channels.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attrs

from kistexp.asciinum import ascii_uint
from kistexp.errors import LocalNetError
from kistexp.localnet.spec import LOOPBACK, SERVICE_ADDRESS

MB = 1_000_000
_CHUNK = b"\x5a" * (64 * 1024)
_SOCKS_ERRORS = {
    1: "general SOCKS server failure",
    2: "connection not allowed by ruleset",
    3: "network unreachable",
    4: "host unreachable (no circuit could be built)",
    5: "connection refused",
    6: "TTL expired (tor timed out building the circuit)",
    7: "command not supported",
    8: "address type not supported",
}


#: What the echo path reads and writes back at a time: interactive probes are tens of bytes.
_ECHO_CHUNK = 4096


class _BulkHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/echo":
            self._echo()
            return
        parts = self.path.strip("/").split("/")
        count = ascii_uint(parts[1]) if len(parts) == 2 and parts[0] == "bytes" else None
        if count is None:
            self.send_error(404, "use /bytes/<count> or /echo")
            return
        remaining = count
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(remaining))
        self.end_headers()
        try:
            while remaining > 0:
                piece = _CHUNK[: min(len(_CHUNK), remaining)]
                self.wfile.write(piece)
                remaining -= len(piece)
        except ConnectionError:
            pass

    def _echo(self) -> None:
        """``GET /echo``: after the 200 header, every byte the client sends comes straight back until
        it closes. The quiet-circuit latency probe (kistexp.localnet.measure) times these echoes; it
        shares the bulk service's port because the exit policy allows no other (real-tor.md problem 1)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        try:
            self.wfile.flush()
            while True:
                # read1: what the request's buffered reader already holds, else one recv
                data = self.rfile.read1(_ECHO_CHUNK)
                if not data:
                    break
                self.wfile.write(data)
                self.wfile.flush()
        except OSError:
            pass  # the client went away mid-echo: its probe records that, not the server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence access logs
        return


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hangs up early (a cancelled download) is not an error worth a traceback.
        return


def _require_loopback(address: str) -> None:
    """Servers and traffic stay on 127.0.0.0/8 (or ::1): anything else is refused before use."""
    if not ipaddress.ip_address(address).is_loopback:
        raise LocalNetError(f"bulk server address {address} is not a loopback address")


class BulkServer:
    """``GET /bytes/N`` answers N bytes, ``GET /echo`` echoes what the client sends; runs in a background
    thread on 127.0.0.2:port."""

    def __init__(self, port: int, address: str = SERVICE_ADDRESS) -> None:
        _require_loopback(address)
        try:
            self._server = _QuietServer((address, port), _BulkHandler)
        except OSError as exc:
            raise LocalNetError(f"cannot listen on {address}:{port} for the bulk server: {exc.strerror}") from None
        self.address, self.port = address, port
        self._thread = threading.Thread(target=self._server.serve_forever, name="bulk-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> BulkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How long the bulk server's process may take to start and listen.
SERVER_START_S = 30.0


class BulkServerProcess:
    """:class:`BulkServer` in a process of its own, as the fidelity harness runs it.

    In the measuring process the server's writes and the download's reads take turns at one
    interpreter lock, and real tor's figures came out lower. Measured on real tor (2026-12-02 06:04 UTC;
    docs/fidelity.md, "What is measured", CPU: 8-11 % on the means): one circuit under KIST at 2 ms moved
    9.21 MB/s with the server as a thread and 9.91 with it in a process of its own, in
    alternating runs on one network.

    The child exits when its standard input closes, so a measurer that dies leaves no server.
    ``pid`` is there for CPU accounting.
    """

    def __init__(self, port: int, address: str = SERVICE_ADDRESS, timeout_s: float = SERVER_START_S) -> None:
        _require_loopback(address)
        self.address, self.port = address, port
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kistexp.localnet.traffic", address, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline().strip() if ready else ""
        if line != "ready":
            self.close()
            raise LocalNetError(line.removeprefix("error: ") if line.startswith("error: ") else
                                f"bulk server on {address}:{port} did not start within {timeout_s:g} s")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> BulkServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(address: str, port: str) -> int:
    """The child of :class:`BulkServerProcess`: serve until standard input closes."""
    try:
        server = BulkServer(int(port), address)
    except LocalNetError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    print("ready", flush=True)
    sys.stdin.read()
    server.close()
    return 0


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise LocalNetError(f"SOCKS: connection closed during {what}")
        data += piece
    return data


#: ``socks_connect``'s steps, named as tgen names them (usecs-to-<step> in OnionPerf's time_info).
SOCKS_STEPS = ("socket-create", "socket-connect", "proxy-init", "proxy-choice", "proxy-request", "proxy-response")


def socks_connect(
    socks_port: int, host: str, port: int, username: str, timeout_s: float = 30.0,
    on_step: Callable[[str, socket.socket], None] | None = None,
) -> socket.socket:
    """Open a stream through tor's SocksPort (SOCKS5, RFC 1928) with a username/password
    (RFC 1929) that selects the circuit; returns the connected socket.

    ``on_step(step, sock)`` is called as each of SOCKS_STEPS completes (a measurement records
    when, and may shorten the socket's timeout to what is left of its own bound)."""
    def step(name: str) -> None:
        if on_step is not None:
            on_step(name, sock)

    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise LocalNetError(f"SOCKS port {socks_port}: cannot make a socket: {exc.strerror or exc}") from None
    try:
        step("socket-create")
        try:
            sock.settimeout(timeout_s)
            sock.connect((LOOPBACK, socks_port))
        except OSError as exc:
            raise LocalNetError(f"SOCKS port {socks_port}: cannot connect: {exc.strerror or exc}") from None
        step("socket-connect")
        user = username.encode()[:255]
        sock.sendall(b"\x05\x01\x02")
        step("proxy-init")
        if _recv_exact(sock, 2, "method selection") != b"\x05\x02":
            raise LocalNetError(f"SOCKS port {socks_port} refused username authentication")
        step("proxy-choice")
        sock.sendall(b"\x01" + bytes([len(user)]) + user + b"\x01x")
        if _recv_exact(sock, 2, "authentication")[1] != 0:
            raise LocalNetError(f"SOCKS port {socks_port} rejected the username")
        addr = socket.inet_aton(host)
        sock.sendall(b"\x05\x01\x00\x01" + addr + struct.pack(">H", port))
        step("proxy-request")
        reply = _recv_exact(sock, 4, "connect reply")
        if reply[1] != 0:
            reason = _SOCKS_ERRORS.get(reply[1], f"code {reply[1]}")
            raise LocalNetError(f"SOCKS connect to {host}:{port} via port {socks_port} failed: {reason}")
        tail = {1: 6, 4: 18}.get(reply[3])
        if tail is None:
            tail = _recv_exact(sock, 1, "reply address")[0] + 2
        _recv_exact(sock, tail, "reply address")
        step("proxy-response")
    except OSError as exc:
        sock.close()
        raise LocalNetError(f"SOCKS port {socks_port}: {exc}") from None
    except BaseException:  # LocalNetError above, or whatever on_step raised: the socket is not handed out
        sock.close()
        raise
    return sock


@attrs.frozen
class Transfer:
    """One download: bytes received and monotonic times of request, first and last byte."""

    username: str
    body_bytes: int
    requested_at: float
    first_byte_at: float
    last_byte_at: float

    @property
    def seconds(self) -> float:
        return self.last_byte_at - self.requested_at

    @property
    def throughput_mbytes_per_s(self) -> float:
        return self.body_bytes / MB / self.seconds if self.seconds > 0 else 0.0


#: How long a client waits for tor to attach a new stream: tor's own bound, ``SocksTimeout``
#: (default 2 minutes), after which tor itself gives up the stream.  It must exceed the local
#: network's fixed 60 s ``CircuitBuildTimeout``: on a loaded machine the first build for a new
#: isolation username can time out, and tor then builds another circuit for the same stream.
SOCKS_WAIT_S = 120.0


def _connect_retrying(socks_port: int, host: str, port: int, username: str, timeout_s: float) -> socket.socket:
    """A new client may not yet hold descriptors for the pinned relays: retry until the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socks_connect(socks_port, host, port, username, timeout_s=max(1.0, deadline - time.monotonic()))
        except LocalNetError:
            if time.monotonic() + 1.0 >= deadline:
                raise
            time.sleep(0.5)


def _download_on(sock: socket.socket, host: str, size: int, username: str) -> Transfer:
    request = f"GET /bytes/{size} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode()
    t_req = time.monotonic()
    sock.sendall(request)
    buf = bytearray()
    first = None
    header_end = -1
    body = 0
    while True:
        piece = sock.recv(256 * 1024)
        if not piece:
            break
        if first is None:
            first = time.monotonic()
        if header_end < 0:
            buf += piece
            header_end = buf.find(b"\r\n\r\n")
            if header_end >= 0:
                if not buf.startswith(b"HTTP/1.0 200") and not buf.startswith(b"HTTP/1.1 200"):
                    raise LocalNetError(f"bulk server answered {bytes(buf[:40])!r} through the circuit")
                body = len(buf) - header_end - 4
        else:
            body += len(piece)
    t_end = time.monotonic()
    if body != size:
        raise LocalNetError(f"download through circuit {username!r} ended after {body} of {size} bytes")
    return Transfer(username, body, t_req, first or t_end, t_end)


def download(
    socks_port: int, host: str, port: int, size: int, username: str, timeout_s: float = 120.0
) -> Transfer:
    """Download ``size`` bytes from the bulk server through one new circuit."""
    sock = _connect_retrying(socks_port, host, port, username, timeout_s=min(timeout_s, SOCKS_WAIT_S))
    try:
        sock.settimeout(timeout_s)
        return _download_on(sock, host, size, username)
    except OSError as exc:
        raise LocalNetError(f"download through circuit {username!r} failed: {exc}") from None
    finally:
        sock.close()


@attrs.frozen
class Measurement:
    """Throughput of one or more simultaneous circuits over the same pinned path."""

    circuits: int
    total_bytes: int
    seconds: float
    transfers: tuple[Transfer, ...]

    @property
    def throughput_mbytes_per_s(self) -> float:
        return self.total_bytes / MB / self.seconds if self.seconds > 0 else 0.0


def parallel_download(
    socks_port: int,
    host: str,
    port: int,
    size_per_circuit: int,
    usernames: Sequence[str],
    timeout_s: float = 180.0,
) -> Measurement:
    """Open one circuit per username, then start every download at once; the figure is all
    bytes over the time from the first request to the last byte."""
    socks = []
    try:
        for name in usernames:
            socks.append(_connect_retrying(socks_port, host, port, name, timeout_s=SOCKS_WAIT_S))
        results: list[Transfer | BaseException | None] = [None] * len(socks)
        barrier = threading.Barrier(len(socks))

        def run(i: int) -> None:
            try:
                socks[i].settimeout(timeout_s)
                barrier.wait(timeout=30)
                results[i] = _download_on(socks[i], host, size_per_circuit, usernames[i])
            except BaseException as exc:  # reported below, in the caller's thread
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(socks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 35)
    finally:
        for s in socks:
            s.close()
    transfers = []
    for name, res in zip(usernames, results, strict=True):
        if isinstance(res, LocalNetError):
            raise res
        if not isinstance(res, Transfer):
            raise LocalNetError(f"download through circuit {name!r} failed: {res!r}")
        transfers.append(res)
    start = min(t.requested_at for t in transfers)
    end = max(t.last_byte_at for t in transfers)
    return Measurement(len(transfers), sum(t.body_bytes for t in transfers), end - start, tuple(transfers))


if __name__ == "__main__":
    sys.exit(_serve(*sys.argv[1:3]))
