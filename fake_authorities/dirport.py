"""The DirPort side of a fake authority: URL table, compression, 304 rules (dirspec-params.md §5).

``DirPortApp`` is a pure request -> response function over an authority's state, so the same
code answers over a real loopback socket (``DirPortServer``) and in-process through an httpx
transport (``fake_authorities.transport``).
"""

from __future__ import annotations

import email.utils
import functools
import gzip
import lzma
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO, Protocol

import attrs

# §5.2: precompressed documents prefer lzma > zstd > deflate > gzip > identity.
ENCODING_PREFERENCE = ("x-tor-lzma", "x-zstd", "deflate", "gzip", "identity")

REASONS = {
    200: "OK",
    304: "Not modified",
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    503: "Directory busy, try again later",
}

#: Bodies larger than this are refused on POST (a full vote is a few MB); tor's MAX_DIR_UL_SIZE is 2^24-1.
MAX_POST_BYTES = 16 * 1024 * 1024
#: Request line plus headers, as tor's MAX_HEADERS_SIZE (directory.c): more is refused before the body.
MAX_HEADER_BYTES = 50_000
#: Connections one listening socket serves at once; more get "503 busy" without a thread or a read.
MAX_CONNECTIONS = 64
#: Request bodies all servers of this process hold in memory at once (nine authorities exchanging full
#: votes need far less); a body that does not fit waits for nothing: it is refused with 503 before it is read.
MAX_BODY_BUFFER_BYTES = 64 * 1024 * 1024
#: Seconds a client has to send its whole request (line, headers, body); then the socket is shut.
REQUEST_DEADLINE_S = 30.0


@attrs.frozen
class DirRequest:
    method: str
    path: str  # without query string
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    peer: str = "127.0.0.1"
    query: str = ""


@attrs.frozen
class DirResponse:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    reason: str = ""

    @property
    def reason_phrase(self) -> str:
        return self.reason or REASONS.get(self.status, "Error")


def error(status: int, reason: str = "") -> DirResponse:
    """Error replies carry no body (§5.2)."""
    return DirResponse(status, b"", (), reason)


@attrs.frozen
class ServedConsensus:
    """A published consensus as the DirPort needs it."""

    text: bytes
    valid_after: float  # POSIX seconds
    fresh_until: float
    valid_until: float
    sha3_hex: str  # SHA3-256 of the signed part (tor's digest_sha3_as_signed): X-Or-Diff-From-Consensus
    signer_v3idents: tuple[str, ...]


class AuthorityView(Protocol):
    """What the DirPort reads from an authority (implemented by FakeAuthority)."""

    def served_consensus(self, flavour: str) -> ServedConsensus | None: ...
    def pending_consensus(self, flavour: str) -> bytes | None: ...
    def pending_detached_signatures(self) -> bytes | None: ...
    def own_vote(self, which: str) -> bytes | None: ...
    def votes_by_ident(self, which: str, idents: Iterable[str]) -> list[bytes]: ...
    def votes_by_digest(self, digests: Iterable[str]) -> list[bytes]: ...
    def key_certificates(self, selector: str, values: list[str]) -> list[bytes]: ...
    def receive_vote(self, body: bytes) -> tuple[int, str]: ...
    def receive_signatures(self, body: bytes) -> tuple[int, str]: ...
    def now(self) -> float: ...


# --- compression --------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def compress(data: bytes, encoding: str) -> bytes:
    """``data`` in one Content-Encoding; cached, as tor keeps documents precompressed."""
    if encoding == "identity":
        return data
    if encoding == "deflate":  # a zlib stream, not raw deflate (§5.2)
        return zlib.compress(data, 9)
    if encoding == "gzip":
        return gzip.compress(data, 9, mtime=0)
    if encoding == "x-zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=10).compress(data)
    if encoding == "x-tor-lzma":
        return lzma.compress(data, format=lzma.FORMAT_ALONE)
    raise ValueError(encoding)


def acceptable_encodings(accept_header: str | None, dot_z: bool) -> set[str]:
    """Parse Accept-Encoding as tor does: tokens, q-values ignored; identity always ok."""
    ok = {"identity"}
    if dot_z:
        ok.add("deflate")
    for token in (accept_header or "").split(","):
        name = token.split(";")[0].strip().lower()
        if name in ENCODING_PREFERENCE:
            ok.add(name)
    return ok


def choose_encoding(accepted: set[str]) -> str:
    return next(e for e in ENCODING_PREFERENCE if e in accepted)


# --- the URL table ------------------------------------------------------------------

_HEX = re.compile(r"^[0-9A-Fa-f]+\Z")
_CONSENSUS_RE = re.compile(r"^/tor/status-vote/current/consensus(?P<flav>-microdesc|-ns)?(?:/(?P<rest>.*))?\Z")


def _http_date(when: float) -> str:
    return email.utils.formatdate(when, usegmt=True)


def _hex_list(text: str) -> list[str] | None:
    items = [x for x in text.split("+") if x]
    if not items or not all(_HEX.match(x) for x in items):
        return None
    return [x.upper() for x in items]


class DirPortApp:
    """Answers DirPort requests for one authority from an AuthorityView."""

    def __init__(self, authority: AuthorityView) -> None:
        self.authority = authority

    def handle(self, req: DirRequest) -> DirResponse:
        path = req.path
        dot_z = path.endswith(".z")
        if dot_z:
            path = path[:-2]
        if req.method == "POST":
            return self._post(path, req)
        if req.method not in ("GET", "HEAD"):
            return error(405)
        accepted = acceptable_encodings(req.headers.get("accept-encoding"), dot_z)
        if path == "/tor/robots.txt":
            return self._ok(b"User-agent: *\nDisallow: /\n", accepted, expires_s=86400, length=True)
        m = _CONSENSUS_RE.match(path)
        if m:
            return self._consensus(m["flav"], m["rest"], req, accepted)
        if path.startswith("/tor/keys/"):
            return self._keys(path[len("/tor/keys/"):], accepted)
        if path in ("/tor/status-vote/next/consensus", "/tor/status-vote/next/consensus-microdesc"):
            doc = self.authority.pending_consensus("microdesc" if path.endswith("-microdesc") else "ns")
            return self._ok(doc, accepted, no_cache=True) if doc else error(404)
        if path == "/tor/status-vote/next/consensus-signatures":
            doc = self.authority.pending_detached_signatures()
            return self._ok(doc, accepted, no_cache=True) if doc else error(404)
        for which in ("current", "next"):
            prefix = f"/tor/status-vote/{which}/"
            if path.startswith(prefix):
                return self._votes(which, path[len(prefix):], accepted)
        return error(404)

    # -- replies ---------------------------------------------------------------------

    def _ok(self, body: bytes, accepted: set[str], *, expires_s: float | None = None,
            expires_at: float | None = None, no_cache: bool = False, length: bool = True,
            extra: tuple[tuple[str, str], ...] = ()) -> DirResponse:
        encoding = choose_encoding(accepted)
        data = compress(body, encoding)
        now = self.authority.now()
        headers: list[tuple[str, str]] = [("Date", _http_date(now)), ("Content-Type", "text/plain"),
                                          ("Content-Encoding", encoding)]
        if length:
            headers.append(("Content-Length", str(len(data))))
        if no_cache:
            headers.append(("Pragma", "no-cache"))
        elif expires_at is not None:
            headers.append(("Expires", _http_date(expires_at)))
        elif expires_s is not None:
            headers.append(("Expires", _http_date(now + expires_s)))
        headers.extend(extra)
        return DirResponse(200, data, tuple(headers))

    def _consensus(self, flav: str | None, rest: str | None, req: DirRequest, accepted: set[str]) -> DirResponse:
        flavour = "microdesc" if flav == "-microdesc" else "ns"
        served = self.authority.served_consensus(flavour)
        if served is None:
            return error(404)
        now = self.authority.now()
        if rest:
            if rest.startswith("diff/"):
                return error(404, "No such diff available")
            prefixes = _hex_list(rest)
            if prefixes is None:
                return error(400)
            # §5.1: 404 unless more than half of the listed (even-length) prefixes signed it.
            usable = [p for p in prefixes if len(p) % 2 == 0]
            signed = sum(1 for p in usable if any(s.startswith(p) for s in served.signer_v3idents))
            if signed * 2 <= len(usable):
                return error(404, "Consensus not signed by sufficient number of requested authorities")
        if served.valid_after > now + 24 * 3600:
            return error(404, "Consensus is too new")
        if served.valid_until < now - 24 * 3600:
            return error(404, "Consensus is too old")
        ims = req.headers.get("if-modified-since")
        if ims:
            parsed = email.utils.parsedate_to_datetime(ims) if _looks_like_date(ims) else None
            if parsed is not None and served.valid_after < parsed.timestamp():
                return error(304)
        diff_from = req.headers.get("x-or-diff-from-consensus", "")
        # tor lists the digests of the consensuses it holds separated by spaces (dirclient.c)
        if diff_from and served.sha3_hex.lower() in diff_from.replace(",", " ").lower().split():
            return error(304)
        # Consensus replies never carry Content-Length (they are spooled, §5.2).
        return self._ok(served.text, accepted, expires_at=served.fresh_until, length=False,
                        extra=(("Vary", "X-Or-Diff-From-Consensus"),))

    def _keys(self, rest: str, accepted: set[str]) -> DirResponse:
        if rest in ("all", "authority"):
            certs = self.authority.key_certificates(rest, [])
        else:
            selector, _, values = rest.partition("/")
            if selector not in ("fp", "sk", "fp-sk") or not values:
                return error(404)
            items = [x for x in values.split("+") if x]
            if selector == "fp-sk":
                pairs = [x.split("-") for x in items]
                if not all(len(p) == 2 and _HEX.match(p[0]) and _HEX.match(p[1]) for p in pairs):
                    return error(400)
                items = [f"{a.upper()}-{b.upper()}" for a, b in pairs]
            else:
                hexes = _hex_list(values)
                if hexes is None:
                    return error(400)
                items = hexes
            certs = self.authority.key_certificates(selector, items)
        if not certs:
            return error(404)
        return self._ok(b"".join(certs), accepted, expires_s=3600)

    def _votes(self, which: str, rest: str, accepted: set[str]) -> DirResponse:
        if rest == "authority":
            doc = self.authority.own_vote(which)
            docs = [doc] if doc else []
        elif rest.startswith("d/"):
            digests = _hex_list(rest[2:])
            if digests is None:
                return error(400)
            docs = self.authority.votes_by_digest(digests)
        elif rest in ("consensus-signatures", "bandwidth", "consensus"):
            return error(404)
        else:
            idents = _hex_list(rest)
            if idents is None:
                return error(404)
            docs = self.authority.votes_by_ident(which, idents)
        if not docs:
            return error(404)
        return self._ok(b"".join(docs), accepted, expires_s=60)

    def _post(self, path: str, req: DirRequest) -> DirResponse:
        if len(req.body) > MAX_POST_BYTES:
            return error(400, "Body too large")
        if path == "/tor/post/vote":
            status, reason = self.authority.receive_vote(req.body)
        elif path == "/tor/post/consensus-signature":
            status, reason = self.authority.receive_signatures(req.body)
        else:
            return error(404)
        return DirResponse(status, b"", (), reason)


POST_PATHS = frozenset({"/tor/post/vote", "/tor/post/consensus-signature"})


def dirport_admit(method: str, path: str, headers: dict[str, str]) -> DirResponse | None:
    """A DirPort reads a body only for the two uploads authorities make to each other (§5.2)."""
    if method == "POST":
        return None if path.removesuffix(".z") in POST_PATHS else error(404)
    if (headers.get("content-length") or "0").strip() not in ("", "0"):
        return error(400, "Unexpected body")
    return None


def _looks_like_date(text: str) -> bool:
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError):
        return False


# --- sockets ------------------------------------------------------------------------


class BodyBudget:
    """Bytes of request bodies held in memory at once, shared by every server of the process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def try_take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.used -= n


BODY_BUDGET = BodyBudget(MAX_BODY_BUFFER_BYTES)

#: Called with (method, path, lower-case headers) before any body byte is read: a response refuses the
#: request (e.g. 401 without the operator token), None lets it through.
Admission = Callable[[str, str, dict[str, str]], "DirResponse | None"]
#: How a server words its refusals (the operator API answers JSON, a DirPort an empty body).
Refusal = Callable[[int, str], "DirResponse"]

_CONTENT_LENGTH_RE = re.compile(r"[0-9]{1,12}")  # ASCII digits only: int() also takes "²" and "١٢"


class _CappedReader:
    """The request stream with a byte allowance: headers get MAX_HEADER_BYTES, the body what it declared."""

    def __init__(self, raw: BinaryIO, allowance: int) -> None:
        self.raw = raw
        self.allowance = allowance
        self.exhausted = False

    def _size(self, size: int | None) -> int:
        if self.allowance <= 0:
            self.exhausted = True
            return 0
        return self.allowance if size is None or size < 0 else min(size, self.allowance)

    def readline(self, size: int | None = -1) -> bytes:
        n = self._size(size)
        line = self.raw.readline(n) if n else b""
        self.allowance -= len(line)
        if self.allowance <= 0 and not line.endswith(b"\n"):
            self.exhausted = True
        return line

    def read(self, size: int | None = -1) -> bytes:
        n = self._size(size)
        data = self.raw.read(n) if n else b""
        self.allowance -= len(data)
        return data

    def close(self) -> None:
        self.raw.close()


class _BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``max_connections`` handler threads; the rest are told 503 at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(f"HTTP/1.0 503 {REASONS[503]}\r\n\r\n".encode())
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

LOOPBACK_RE = re.compile(r"^127\.\d{1,3}\.\d{1,3}\.\d{1,3}\Z")


def require_loopback(host: str) -> None:
    """Only loopback may be bound (project rule; the fakes must never face a network)."""
    if not LOOPBACK_RE.match(host) and host != "localhost":
        raise ValueError(f"refusing to bind {host!r}: fake authorities listen on 127.0.0.0/8 only")


class Gate:
    """Fault hooks the socket server consults per request (down / slow)."""

    def __init__(self) -> None:
        self.hang = threading.Event()  # accept and never answer while set
        self.delay_s = 0.0
        self.stopping = threading.Event()


class DirPortServer:
    """A threaded HTTP/1.0 server for one Handler function on 127.0.0.1:port.

    ``stop_listening()`` closes the socket (connection refused) and ``listen()`` reopens the
    same port, which is how the "down" fault is played.
    """

    def __init__(self, handler: Callable[[DirRequest], DirResponse], host: str, port: int,
                 gate: Gate | None = None, *, admit: Admission | None = None, refuse: Refusal | None = None,
                 max_body_bytes: int = MAX_POST_BYTES, max_connections: int = MAX_CONNECTIONS,
                 budget: BodyBudget = BODY_BUDGET) -> None:
        require_loopback(host)
        self.handler = handler
        self.limits = _Limits(admit, refuse or error, max_body_bytes, max_connections, budget)
        self.host = host
        self.port = port
        self.gate = gate or Gate()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def listening(self) -> bool:
        return self._httpd is not None

    def listen(self) -> None:
        with self._lock:
            if self._httpd is not None:
                return
            handler_cls = _make_handler(self.handler, self.gate, self.limits)
            httpd = _BoundedHTTPServer((self.host, self.port), handler_cls, self.limits.max_connections)
            self.port = httpd.server_address[1]
            self._httpd = httpd
            self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"dirport-{self.port}", daemon=True)
            self._thread.start()

    def stop_listening(self) -> None:
        with self._lock:
            httpd, thread = self._httpd, self._thread
            self._httpd = self._thread = None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def close(self) -> None:
        self.gate.stopping.set()
        self.stop_listening()


@attrs.frozen
class _Limits:
    admit: Admission | None
    refuse: Refusal
    max_body_bytes: int
    max_connections: int
    budget: BodyBudget


def _make_handler(app: Callable[[DirRequest], DirResponse], gate: Gate,
                  limits: _Limits) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # §5.2: HTTP/1.0 status line, close after the body
        server_version = "kistexp-fake-authority"
        sys_version = ""
        timeout = 30

        def setup(self) -> None:
            super().setup()
            self.rfile = _CappedReader(self.rfile, MAX_HEADER_BYTES)  # type: ignore[assignment]
            # One deadline for the whole request, however slowly it trickles in (a per-read timeout alone
            # lets a client send a byte every 29 s for ever).
            self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._cut)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # quiet: the operator API reports state

        def _serve(self, method: str) -> None:
            reader: _CappedReader = self.rfile  # type: ignore[assignment]
            if reader.exhausted:
                self._send(limits.refuse(400, f"request line and headers exceed {MAX_HEADER_BYTES} bytes"), method)
                return
            path, _, query = self.path.partition("?")
            headers = {k.lower(): v for k, v in self.headers.items()}
            refused = limits.admit(method, path, headers) if limits.admit else None
            if refused is not None:  # decided on the headers: not one body byte is read
                self._send(refused, method)
                return
            raw_length = (self.headers.get("Content-Length") or "0").strip()
            if not _CONTENT_LENGTH_RE.fullmatch(raw_length):
                self._send(limits.refuse(400, "Bad Content-Length"), method)
                return
            length = int(raw_length)
            if length > limits.max_body_bytes:
                self._send(limits.refuse(400, f"Bad Content-Length: a body of {length} bytes exceeds the "
                                              f"{limits.max_body_bytes}-byte limit"), method)
                return
            if length and not limits.budget.try_take(length):
                self._send(limits.refuse(503, "too many request bodies in memory; try again later"), method)
                return
            try:
                reader.allowance = length
                body = reader.read(length) if length > 0 else b""
                self._deadline.cancel()  # the request is in: the reply may take as long as the gate says
                if len(body) < length:
                    return  # the client hung up or missed the deadline: nobody to answer
                while gate.hang.is_set() and not gate.stopping.is_set():
                    time.sleep(0.05)  # "not answering": hold the connection open
                if gate.stopping.is_set():
                    return
                if gate.delay_s > 0:
                    time.sleep(gate.delay_s)
                try:
                    resp = app(DirRequest(method, path, headers, body, self.client_address[0], query))
                except Exception:  # a bug must not kill the server thread; report 503 like a busy tor
                    resp = error(503)
                del body
            finally:
                if length:
                    limits.budget.give_back(length)
            self._send(resp, method)

        def _send(self, resp: DirResponse, method: str) -> None:
            try:
                self.send_response_only(resp.status, resp.reason_phrase)
                for k, v in resp.headers:
                    self.send_header(k, v)
                self.end_headers()
                if resp.body and method != "HEAD":
                    self.wfile.write(resp.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (timed out): nothing to tell it

        def do_GET(self) -> None:  # noqa: N802
            self._serve("GET")

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve("HEAD")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._serve("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._serve("DELETE")

    return Handler
