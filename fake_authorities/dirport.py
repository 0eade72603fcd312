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
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

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

#: Bodies larger than this are refused on POST (a full vote is a few MB).
MAX_POST_BYTES = 16 * 1024 * 1024


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


def _looks_like_date(text: str) -> bool:
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError):
        return False


# --- sockets ------------------------------------------------------------------------

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
                 gate: Gate | None = None) -> None:
        require_loopback(host)
        self.handler = handler
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
            handler_cls = _make_handler(self.handler, self.gate)
            httpd = ThreadingHTTPServer((self.host, self.port), handler_cls)
            httpd.daemon_threads = True
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


def _make_handler(app: Callable[[DirRequest], DirResponse], gate: Gate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # §5.2: HTTP/1.0 status line, close after the body
        server_version = "kistexp-fake-authority"
        sys_version = ""
        timeout = 30

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # quiet: the operator API reports state

        def _serve(self, method: str) -> None:
            while gate.hang.is_set() and not gate.stopping.is_set():
                time.sleep(0.05)  # "not answering": hold the connection open
            if gate.stopping.is_set():
                return
            if gate.delay_s > 0:
                time.sleep(gate.delay_s)
            raw_length = (self.headers.get("Content-Length") or "0").strip()
            length = int(raw_length) if raw_length.isdigit() else -1
            if not 0 <= length <= MAX_POST_BYTES:
                self._send(error(400, "Bad Content-Length"), method)
                return
            body = self.rfile.read(length) if length > 0 else b""
            path, _, query = self.path.partition("?")
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                resp = app(DirRequest(method, path, headers, body, self.client_address[0], query))
            except Exception:  # a bug must not kill the server thread; report 503 like a busy tor
                resp = error(503)
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
