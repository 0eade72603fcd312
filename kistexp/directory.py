"""A hardened client for directory authorities' DirPorts (dirspec-params.md §5).

It talks to real authorities, to a local tor network or to ``fake_authorities`` (over
sockets, or in-process through an httpx transport) and never hands back a document it
has not checked:

* every request is bounded: connect/read timeouts plus an overall deadline, a maximum
  number of body bytes read off the wire, and a decompression guard (hard cap on the
  decoded size and tor's ratio rule, §5.2 encodings deflate/gzip/x-zstd/x-tor-lzma);
* a ``Content-Encoding`` that does not match the body, or one that was not offered, is
  reported as a lie, not guessed around;
* a consensus is returned only if at least floor(N/2)+1 of the configured authorities
  signed it with keys certified by their certificates (§2.1); otherwise a
  DocumentError is raised and the previously accepted consensus is kept. As in tor
  (networkstatus.c ``networkstatus_check_consensus_signature``), a certificate must be
  current *now*, not at the consensus's valid-after; the consensus itself is not refused
  for being past its valid-until, since tor keeps using one for 24 h after it
  ("reasonably live", §2.2).

Errors are DirectoryError / DocumentError with one line naming the authority and URL.
"""

from __future__ import annotations

import datetime as dt
import io
import lzma
import math
import random
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpcore
import httpx

from kistexp.clock import Clock, RealClock
from kistexp.dirauth import documents
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES, DirectoryAuthority, parse_nickname, parse_v3ident
from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES
from kistexp.dirauth.documents import KeyCertificate, NetworkStatus, SignatureCheck
from kistexp.dirauth.paramsline import sort_params
from kistexp.dirauth.voting import Vote, tally_params
from kistexp.dirauth.whatif import describe_tally
from kistexp.errors import DirectoryError, DocumentError, KistexpError

#: What tor clients offer, best first (§5: lzma > zstd > deflate > gzip > identity).
ACCEPT_ENCODINGS: tuple[str, ...] = ("x-tor-lzma", "x-zstd", "deflate", "gzip", "identity")

#: tor's compression-bomb rule (src/lib/compress/compress.c): once 64 KiB have been
#: produced, more than 25 output bytes per input byte is a bomb.
BOMB_CHECK_AFTER_BYTES = 64 * 1024
BOMB_MAX_RATIO = 25

#: Largest decoded piece produced per step, so memory stays bounded whatever the input.
_DECODE_STEP = 64 * 1024

CONSENSUS_PATHS = {
    "ns": "/tor/status-vote/current/consensus",
    "microdesc": "/tor/status-vote/current/consensus-microdesc",
}


@attrs.frozen
class Endpoint:
    """A DirPort to talk to; ``v3ident`` is empty when only host:port is known."""

    nickname: str
    host: str
    port: int
    v3ident: str = ""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def of(cls, item: DirectoryAuthority | Endpoint | tuple[str, int] | str) -> Endpoint:
        if isinstance(item, Endpoint):
            return item
        if isinstance(item, DirectoryAuthority):
            return cls(item.nickname, item.address, item.dirport, item.v3ident.upper())
        if isinstance(item, str):
            return parse_authority_spec(item)
        host, port = item
        return cls(f"{host}:{port}", str(host), int(port))


_SPEC_RE = re.compile(
    r"(?:(?P<nick>[^=]{1,40})=)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})"
    r"(?:/(?P<ident>[^/]*))?")


def parse_authority_spec(spec: str) -> Endpoint:
    """Parse ``NICK=HOST:PORT/V3IDENT`` as given to ``--authority``.

    The v3ident pins the authority's identity, as a DirAuthority line does; without it
    (``NICK=HOST:PORT`` or ``HOST:PORT``) the server can be asked for its vote but nothing it
    serves can be verified, and it adds no trusted identity.
    """
    m = _SPEC_RE.fullmatch(spec)
    if not m or not 0 < int(m["port"]) < 65536:
        raise DirectoryError(f"--authority {spec!r}: expected NICK=HOST:PORT/V3IDENT, e.g. "
                             "moria1=127.0.0.1:7001/F533C81CEF0BC0267857C99B2F471ADF249FA232")
    host = m["host"].strip("[]")
    nick = parse_nickname(m["nick"], f"--authority {spec!r}") if m["nick"] else f"{host}:{m['port']}"
    ident = parse_v3ident(m["ident"], f"--authority {spec!r}") if m["ident"] is not None else ""
    return Endpoint(nick, host, int(m["port"]), ident)


#: Response headers: a DirPort sends about five. httpcore refuses a header block over
#: 100 KiB while reading it (h11 max_incomplete_event_size); these refuse anything past them.
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16 * 1024


@attrs.frozen
class Limits:
    """Bounds on one response; the defaults leave room for a full live vote."""

    max_body_bytes: int = MAX_DOCUMENT_BYTES  # bytes read off the wire
    max_decoded_bytes: int = MAX_DOCUMENT_BYTES  # bytes after decompression: no parser takes more
    max_ratio: int = BOMB_MAX_RATIO
    ratio_check_after_bytes: int = BOMB_CHECK_AFTER_BYTES
    max_headers: int = MAX_HEADERS
    max_header_bytes: int = MAX_HEADER_BYTES


@attrs.frozen
class Fetched:
    """One decoded response body and how it arrived."""

    endpoint: Endpoint
    url: str
    status: int
    content_encoding: str
    wire_bytes: int
    body: bytes
    headers: dict[str, str]
    elapsed_s: float


class _Retryable(DirectoryError):
    """A failure worth another attempt (network trouble, timeouts, 5xx)."""


# --- decoding -----------------------------------------------------------------------


def detect_compression(head: bytes) -> str:
    """The encoding a body's first bytes show, as tor's ``detect_compression_method``."""
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
        return "deflate"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "x-zstd"
    if head[:3] == b"\x5d\x00\x00" or head[:6] == b"\xfd7zXZ\x00":
        return "x-tor-lzma"
    return "identity"


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (for zstandard's stream reader)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _decode_stream(encoding: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Decoded pieces of at most _DECODE_STEP bytes each; raises ValueError on bad data."""
    if encoding == "identity":
        yield from chunks
        return
    if encoding == "x-zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(_ChunkReader(chunks), read_size=16384)
        try:
            while piece := reader.read(_DECODE_STEP):
                yield piece
        except zstandard.ZstdError as exc:
            raise ValueError(f"bad zstd data ({exc})") from None
        return
    if encoding == "x-tor-lzma":
        dec: Any = lzma.LZMADecompressor(format=lzma.FORMAT_AUTO)
        errors: tuple[type[Exception], ...] = (lzma.LZMAError, EOFError)
    else:
        dec = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
        errors = (zlib.error,)
    try:
        for chunk in chunks:
            data = chunk
            while data:
                if dec.eof:
                    raise ValueError("data after the end of the compressed stream")
                piece = dec.decompress(data, _DECODE_STEP)
                yield piece
                if encoding != "x-tor-lzma" and dec.unused_data:
                    raise ValueError("data after the end of the compressed stream")
                data = dec.unconsumed_tail if encoding != "x-tor-lzma" else b""
                # lzma keeps unconsumed input inside; drain it with empty calls.
                while encoding == "x-tor-lzma" and not dec.eof and not dec.needs_input:
                    yield dec.decompress(b"", _DECODE_STEP)
        if not dec.eof:
            raise ValueError("compressed stream is truncated")
    except errors as exc:
        raise ValueError(f"bad {encoding} data ({exc})") from None


# --- a total deadline per request ---------------------------------------------------


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend with every connect, read and write clipped to the deadline of
    the request under way. httpx's timeouts bound each socket operation, not the request: a
    server that sends its status line and headers one byte at a time would never trip them."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._inner = httpcore.SyncBackend()
        self._local = threading.local()
        self._monotonic = monotonic  # the client's clock: a virtual clock's deadlines are virtual too

    def set_deadline(self, deadline: float | None) -> None:
        self._local.deadline = deadline

    def clip(self, timeout: float | None, expired: type[Exception]) -> float | None:
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - self._monotonic()
        if left <= 0:
            raise expired("the request deadline passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self.clip(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("directory authorities are reached over TCP only")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, backend: _DeadlineBackend) -> None:
        self._stream = stream
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._backend.clip(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._backend.clip(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("DirPorts speak plain HTTP")

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        if hasattr(self._stream, "close"):
            self._stream.close()


class _DeadlineTransport(httpx.BaseTransport):
    """httpx over httpcore's connection pool and the deadline backend. httpcore's errors are
    left as they are; ``fetch_once`` names both families."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.backend = _DeadlineBackend(monotonic)
        self._pool = httpcore.ConnectionPool(network_backend=self.backend, max_keepalive_connections=0)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions)
        resp = self._pool.handle_request(req)
        return httpx.Response(status_code=resp.status, headers=resp.headers, stream=_Body(resp.stream),
                              extensions=resp.extensions)

    def close(self) -> None:
        self._pool.close()


# --- the client ---------------------------------------------------------------------


def _sleeper(clock: Clock) -> Callable[[float], None]:
    """Waits of ``seconds`` on ``clock`` (virtual time passes at once on a VirtualClock)."""
    return lambda seconds: clock.sleep_until(clock.now() + dt.timedelta(seconds=seconds))


class DirectoryClient:
    """Fetch consensuses, votes and key certificates from a list of DirPorts.

    ``authorities``: DirectoryAuthority objects (today's nine by default), Endpoints,
    ``(host, port)`` pairs or ``NICK=HOST:PORT/V3IDENT`` strings. Trust is pinned to their
    v3idents, as tor pins its DirAuthority lines: only certificates of those identities are
    kept and only their signatures count; an authority given without one adds no identity,
    and with none at all nothing can be verified. ``n_authorities`` is the N of the signature
    rule: the number of configured authorities, which it may raise but never lower.
    ``transport`` is any httpx transport (e.g. ``fake_authorities`` in-process). Each attempt
    at a request has ``timeout_s`` in total for connect, headers and body (``deadline_s``
    overrides it). Backoff between attempts is exponential with full jitter:
    U(0, min(backoff_max_s, backoff_s * 2**attempt)). ``clock`` (a ``kistexp.clock.Clock``,
    the wall clock by default) gives the "now" certificates must be current at, the request
    deadlines and the backoff waits, so a virtual clock drives all three; a bare function of
    POSIX seconds sets only the time certificates must be current at (the wall clock keeps
    the deadlines and ``sleep`` the waits).
    """

    def __init__(
        self,
        authorities: Iterable[DirectoryAuthority | Endpoint | tuple[str, int] | str] = DEFAULT_AUTHORITIES,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
        deadline_s: float | None = None,
        retries: int = 2,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        limits: Limits | None = None,
        accept_encodings: Sequence[str] = ACCEPT_ENCODINGS,
        n_authorities: int | None = None,
        certificates: Iterable[KeyCertificate] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Clock | Callable[[], float] | None = None,
    ) -> None:
        self.endpoints: tuple[Endpoint, ...] = tuple(Endpoint.of(a) for a in authorities)
        if not self.endpoints:
            raise DirectoryError("no directory authorities given")
        if len(self.endpoints) > MAX_AUTHORITIES:
            raise DirectoryError(f"{len(self.endpoints)} directory authorities given; at most {MAX_AUTHORITIES}")
        _check_unique(self.endpoints)
        bad = [e for e in accept_encodings if e not in ACCEPT_ENCODINGS]
        if bad:
            raise DirectoryError(f"unsupported Accept-Encoding value(s): {', '.join(bad)}")
        self.accept_encodings = tuple(accept_encodings) if "identity" in accept_encodings else (
            *accept_encodings, "identity")
        self.timeout_s = _seconds(timeout_s, "--timeout")
        self.deadline_s = _seconds(deadline_s, "deadline") if deadline_s is not None else self.timeout_s
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise DirectoryError(f"--retries {retries!r}: expected a whole number from 0 to {MAX_RETRIES}")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.limits = limits or Limits()
        configured = len(self.endpoints)
        if n_authorities is not None and not configured <= n_authorities <= MAX_AUTHORITIES:
            raise DirectoryError(f"--n-authorities {n_authorities}: N counts the configured authorities, so it "
                                 f"must be from {configured} to {MAX_AUTHORITIES}")
        self.n_authorities = n_authorities or configured
        self._rng = rng or random.Random()
        clock = RealClock() if clock is None else clock
        if isinstance(clock, Clock):
            self._clock: Callable[[], float] = clock.timestamp
            self._monotonic: Callable[[], float] = clock.monotonic
            self._sleep = sleep or _sleeper(clock)
        else:
            self._clock, self._monotonic = clock, time.monotonic
            self._sleep = sleep or time.sleep
        self._deadlines = _DeadlineTransport(self._monotonic) if transport is None else None
        self._http = httpx.Client(
            transport=transport or self._deadlines,
            timeout=httpx.Timeout(self.timeout_s),
            follow_redirects=False,
            headers={"User-Agent": "kistexp-directory-client"},
        )
        # State kept across calls; replaced only by documents that passed every check.
        self.certificates: dict[str, KeyCertificate] = {}
        self.consensus: dict[str, NetworkStatus] = {}
        if certificates is not None:
            self._adopt_certificates(certificates)

    # -- plumbing -------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DirectoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def endpoint(self, name: str) -> Endpoint:
        for e in self.endpoints:
            if e.nickname.lower() == name.lower() or (e.v3ident and e.v3ident == name.upper()):
                return e
        raise DirectoryError(f"unknown authority {name!r} (known: {', '.join(e.nickname for e in self.endpoints)})")

    def _backoff(self, attempt: int) -> None:
        self._sleep(self._rng.uniform(0.0, min(self.backoff_max_s, self.backoff_s * 2**attempt)))

    def fetch_once(self, endpoint: Endpoint, path: str, headers: dict[str, str] | None = None) -> Fetched:
        """One GET, fully bounded; raises DirectoryError naming the authority and URL."""
        url = endpoint.base_url + path
        where = f"{endpoint.nickname} {url}"
        lim = self.limits
        req_headers = {"Accept-Encoding": ", ".join(self.accept_encodings), **(headers or {})}
        start = self._monotonic()
        deadline = start + self.deadline_s
        if self._deadlines is not None:
            self._deadlines.backend.set_deadline(deadline)
        try:
            with self._http.stream("GET", url, headers=req_headers) as resp:
                status = resp.status_code
                raw_headers = resp.headers.raw
                header_bytes = sum(len(k) + len(v) + 4 for k, v in raw_headers)
                if len(raw_headers) > lim.max_headers or header_bytes > lim.max_header_bytes:
                    raise DirectoryError(f"{where}: {len(raw_headers)} response headers of {header_bytes} bytes, "
                                         f"more than the {lim.max_headers} headers / {lim.max_header_bytes} "
                                         "bytes allowed")
                resp_headers = {k.lower(): v for k, v in resp.headers.items()}
                if status == 304:
                    return Fetched(endpoint, url, 304, "", 0, b"", resp_headers, self._monotonic() - start)
                if status != 200:
                    reason = resp.reason_phrase or ""
                    cls = _Retryable if status >= 500 else DirectoryError
                    raise cls(f"{where}: HTTP {status} {reason}".rstrip())
                declared = resp_headers.get("content-encoding", "identity").strip().lower() or "identity"
                if declared not in self.accept_encodings:
                    raise DirectoryError(f"{where}: server sent Content-Encoding {declared!r}, "
                                         f"which was not offered ({', '.join(self.accept_encodings)})")
                length = resp_headers.get("content-length")
                if length is not None and _DIGITS.fullmatch(length) and int(length) > lim.max_body_bytes:
                    raise DirectoryError(f"{where}: Content-Length {length} exceeds the "
                                         f"{lim.max_body_bytes}-byte limit")
                wire = 0

                def raw() -> Iterator[bytes]:
                    nonlocal wire
                    for chunk in resp.iter_raw():
                        wire += len(chunk)
                        if wire > lim.max_body_bytes:
                            raise DirectoryError(f"{where}: body exceeds the {lim.max_body_bytes}-byte limit")
                        if self._monotonic() > deadline:
                            raise _Retryable(f"{where}: transfer exceeded the {self.deadline_s:g} s deadline")
                        yield chunk

                body = self._decode(where, declared, raw())
                return Fetched(endpoint, url, status, declared, wire, body, resp_headers,
                               self._monotonic() - start)
        except KistexpError:
            raise
        except (httpx.TimeoutException, httpcore.TimeoutException):
            raise _Retryable(f"{where}: timed out: no complete answer within the "
                             f"{self.deadline_s:g} s deadline") from None
        except (httpx.ConnectError, httpcore.ConnectError) as exc:
            raise _Retryable(f"{where}: cannot connect ({_short(exc)})") from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError) as exc:
            raise _Retryable(f"{where}: connection failed mid-transfer ({_short(exc)})") from None
        except (httpx.HTTPError, httpcore.ProtocolError, httpcore.NetworkError) as exc:
            raise DirectoryError(f"{where}: {type(exc).__name__}: {_short(exc)}") from None
        finally:
            if self._deadlines is not None:
                self._deadlines.backend.set_deadline(None)

    def _decode(self, where: str, declared: str, raw: Iterator[bytes]) -> bytes:
        lim = self.limits
        # Peek at the first bytes to catch a Content-Encoding that lies about the body.
        head = b""
        for chunk in raw:
            head += chunk
            if len(head) >= 6:
                break
        if not head:
            return b""
        actual = detect_compression(head)
        if actual != declared:
            body_kind = "uncompressed text" if actual == "identity" else f"{actual} data"
            raise DirectoryError(f"{where}: Content-Encoding says {declared} but the body is {body_kind}")
        wire_in = 0

        def counted() -> Iterator[bytes]:
            nonlocal wire_in
            wire_in += len(head)
            yield head
            for chunk in raw:
                wire_in += len(chunk)
                yield chunk

        out = bytearray()
        try:
            for piece in _decode_stream(declared, counted()):
                out += piece
                if len(out) > lim.max_decoded_bytes:
                    raise DirectoryError(f"{where}: decoded body exceeds the {lim.max_decoded_bytes}-byte "
                                         "limit (decompression bomb?)")
                if (declared != "identity" and len(out) >= lim.ratio_check_after_bytes
                        and len(out) > lim.max_ratio * max(wire_in, 1)):
                    raise DirectoryError(f"{where}: decompression bomb: {wire_in} {declared} bytes "
                                         f"expand to more than {len(out)} (ratio > {lim.max_ratio})")
        except ValueError as exc:
            raise DirectoryError(f"{where}: cannot decode {declared} body: {exc}") from None
        return bytes(out)

    def fetch(self, endpoint: Endpoint | str, path: str, headers: dict[str, str] | None = None) -> Fetched:
        """GET from one authority, retrying transient failures with jittered backoff."""
        ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
        for attempt in range(self.retries + 1):
            try:
                return self.fetch_once(ep, path, headers)
            except _Retryable as exc:
                if attempt == self.retries:
                    raise DirectoryError(f"{exc} (after {attempt + 1} attempts)") from None
                self._backoff(attempt)
        raise AssertionError("unreachable")

    def _from_any(self, path: str, accept: Callable[[Fetched], Any], what: str) -> Any:
        """Try authorities in random order (as tor picks one) until ``accept`` takes a body."""
        order = list(self.endpoints)
        self._rng.shuffle(order)
        problems: list[str] = []
        for ep in order:  # like tor, move straight on to another authority
            try:
                return accept(self.fetch_once(ep, path))
            except KistexpError as exc:
                problems.append(str(exc))
        # one line a person can read: a long path (nine certificate fingerprints) is shown once, clipped
        short = path if len(path) <= _PATH_SHOWN else path[:_PATH_SHOWN - 3] + "..."
        raise DirectoryError(f"no authority served {what}: " + "; ".join(p.replace(path, short) for p in problems))

    # -- key certificates ----------------------------------------------------------

    def trusted_v3idents(self) -> frozenset[str]:
        """The pinned identities: the configured authorities' v3idents, nothing else."""
        return frozenset(e.v3ident for e in self.endpoints if e.v3ident)

    def unpinned(self) -> tuple[Endpoint, ...]:
        """Configured authorities given without a v3ident: asked, never trusted."""
        return tuple(e for e in self.endpoints if not e.v3ident)

    def _require_identities(self, what: str) -> frozenset[str]:
        trusted = self.trusted_v3idents()
        if not trusted:
            raise DocumentError(f"{what}: not verified: no authority identity (v3ident) is configured, so "
                                "nothing served can be checked; give --authority NICK=HOST:PORT/V3IDENT")
        return trusted

    def _adopt_certificates(self, certs: Iterable[KeyCertificate]) -> int:
        """Keep the certificates of pinned identities; any other is useless and dropped."""
        trusted = self.trusted_v3idents()
        n = 0
        for cert in certs:
            if cert.fingerprint in trusted:
                self.certificates[cert.fingerprint] = cert
                n += 1
        return n

    def load_certificates(self, path: str | Path) -> int:
        """Take the configured authorities' key certificates from a file (e.g. tor's cached-certs);
        certificates of other identities in it are ignored."""
        p = Path(path)
        data = documents.read_document_file(p, "key certificates")
        return self._adopt_certificates(documents.parse_key_certificates(data, str(p)))

    def fetch_certificates(self) -> int:
        """Fetch the pinned authorities' key certificates (§5.1 ``/tor/keys/fp/..``).

        Any authority may serve them, as in tor: a certificate is signed by the identity key
        whose SHA-1 is the pinned v3ident, so no server can forge another's; certificates of
        identities not asked for are dropped.
        """
        known = sorted(self._require_identities("key certificates"))
        path = "/tor/keys/fp/" + "+".join(known)

        def accept(f: Fetched) -> int:
            n = self._adopt_certificates(documents.parse_key_certificates(f.body, f"{f.endpoint.nickname} {f.url}"))
            if not n:
                raise DocumentError(f"{f.endpoint.nickname} {f.url}: no certificate of a configured authority")
            return n

        return self._from_any(path, accept, "key certificates")

    # -- documents -----------------------------------------------------------------

    def verify_consensus(self, doc: NetworkStatus, where: str) -> SignatureCheck:
        """The signature check of §2.1 with certificates checked at the current time (a
        live fetch, as tor does); DocumentError unless >= floor(N/2)+1 verify."""
        trusted = self._require_identities(where)
        if not self.certificates:
            raise DocumentError(f"{where}: no authority key certificates to check the consensus against")
        now = dt.datetime.fromtimestamp(int(self._clock()), tz=dt.timezone.utc)
        check = documents.verify_signatures(doc, list(self.certificates.values()),
                                            n_authorities=self.n_authorities, at=now, authorities=trusted)
        if not check.ok:
            raise DocumentError(f"{where}: consensus rejected: {check.summary()}")
        return check

    def fetch_consensus(self, flavour: str = "microdesc", endpoint: Endpoint | str | None = None) -> NetworkStatus:
        """A verified consensus (``ns`` or ``microdesc``); kept as ``self.consensus[flavour]``.

        Without ``endpoint`` the authorities are tried in random order. A body that does
        not parse, is older than the one held, or lacks enough valid signatures is
        rejected with a clear error and the consensus held so far is kept.
        """
        return self.fetch_consensus_document(flavour, endpoint)[0]

    def fetch_consensus_document(self, flavour: str = "microdesc",
                                 endpoint: Endpoint | str | None = None) -> tuple[NetworkStatus, Fetched]:
        """``fetch_consensus`` with the response it came in (``Fetched.body``: the document's exact bytes,
        decoded), for saving the document as served."""
        check_flavour(flavour)
        self._require_identities(f"{flavour} consensus")
        if not self.certificates:
            self.fetch_certificates()
        path = CONSENSUS_PATHS[flavour]

        def accept(f: Fetched) -> tuple[NetworkStatus, Fetched]:
            where = f"{f.endpoint.nickname} {f.url}"
            doc = documents.parse_network_status(f.body, where)
            if doc.is_vote or doc.flavor != flavour:
                raise DocumentError(f"{where}: expected a {flavour} consensus, got {_describe(doc)}")
            self.verify_consensus(doc, where)
            held = self.consensus.get(flavour)
            if held is not None and doc.valid_after < held.valid_after:
                raise DocumentError(f"{where}: consensus valid-after {doc.valid_after} is older than the "
                                    f"one held ({held.valid_after})")
            self.consensus[flavour] = doc
            return doc, f

        if endpoint is not None:
            ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
            return accept(self.fetch(ep, path))
        return self._from_any(path, accept, f"a valid {flavour} consensus")

    def fetch_vote(self, endpoint: Endpoint | str, which: str = "current") -> NetworkStatus:
        """An authority's own vote (``current`` or ``next``, §5.1), parsed and checked: its
        embedded certificate must verify, belong to that authority (when its v3ident is
        known) and certify the key that signed the vote."""
        if which not in ("current", "next"):
            raise DirectoryError(f"vote must be 'current' or 'next', not {which!r}")
        ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
        f = self.fetch(ep, f"/tor/status-vote/{which}/authority")
        where = f"{ep.nickname} {f.url}"
        doc = documents.parse_network_status(f.body, where)
        if not doc.is_vote:
            raise DocumentError(f"{where}: expected a vote, got {_describe(doc)}")
        cert = doc.key_certificate
        voter = doc.authorities[0].v3ident
        if ep.v3ident and voter != ep.v3ident:
            raise DocumentError(f"{where}: vote is from {voter}, not from {ep.nickname} ({ep.v3ident})")
        try:
            cert.verify()
        except DocumentError as exc:
            raise DocumentError(f"{where}: embedded key certificate: {exc}") from None
        check = documents.verify_signatures(doc, [cert], n_authorities=1, authorities=[voter])
        if not check.ok:
            raise DocumentError(f"{where}: vote signature does not verify: {check.summary()}")
        return doc

    def fetch_votes(self, which: str = "current") -> dict[str, NetworkStatus | KistexpError]:
        """Every authority's own vote; an unreachable one maps to its DirectoryError."""
        out: dict[str, NetworkStatus | KistexpError] = {}
        for ep in self.endpoints:
            try:
                out[ep.nickname] = self.fetch_vote(ep, which)
            except KistexpError as exc:
                out[ep.nickname] = exc
        return out


#: Most authorities one client asks (one request each per question): tor sets no cap on
#: DirAuthority lines; nine are live and test networks use a few, so 64 only bounds the work.
MAX_AUTHORITIES = 64
#: Attempts per request are retries + 1; more than this is a mistake, not persistence.
MAX_RETRIES = 10
#: Longest --timeout: a whole consensus over a slow link fits well within it.
MAX_TIMEOUT_S = 3600.0
_DIGITS = re.compile(r"[0-9]{1,20}")
#: Longest URL path an error about several authorities repeats in full.
_PATH_SHOWN = 48


def check_flavour(flavour: str) -> str:
    if flavour not in CONSENSUS_PATHS:
        raise DirectoryError(f"--flavour {flavour!r}: unknown consensus flavour (ns or microdesc)")
    return flavour


def _seconds(value: float, option: str) -> float:
    try:
        ok = math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S
    except TypeError:
        ok = False
    if not ok:
        raise DirectoryError(f"{option} {value!r}: expected seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return float(value)


def _check_unique(endpoints: Sequence[Endpoint]) -> None:
    seen: dict[str, str] = {}
    for e in endpoints:
        for key in (e.nickname.lower(), e.v3ident):
            if key and key in seen:
                raise DirectoryError(f"authority {e.nickname} repeats {seen[key]}'s "
                                     f"{'v3ident' if key == e.v3ident else 'nickname'}")
            if key:
                seen[key] = e.nickname


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def _describe(doc: NetworkStatus) -> str:
    return f"a {doc.flavor} {doc.vote_status}"


# --- status of the authorities' vote (``kistexp authorities status``) -----------------


@attrs.frozen
class AuthorityVote:
    """One authority's current vote, or why it could not be had."""

    nickname: str
    url: str
    v3ident: str
    error: str | None
    valid_after: dt.datetime | None  # of the vote; None on error
    params: tuple[tuple[str, int], ...]
    pinned: bool = True  # False: configured without a v3ident, so its vote's identity is unchecked


@attrs.frozen
class ParamStatus:
    """One parameter: each authority's vote, the consensus value and tor's tally of the votes."""

    name: str
    votes: tuple[tuple[str, int | None], ...]  # (nickname, value or None when silent), reachable ones
    consensus_value: int | None  # None: absent from the consensus (or no consensus)
    predicted_value: int | None  # what tor's rule gives from the votes fetched
    included: bool
    tally: str  # the tally in words


@attrs.frozen
class AuthoritiesStatus:
    n_authorities: int
    authorities: tuple[AuthorityVote, ...]
    consensus_flavour: str
    consensus_valid_after: dt.datetime | None
    consensus_fresh_until: dt.datetime | None
    consensus_signatures: str
    consensus_error: str | None
    params: tuple[ParamStatus, ...]
    verified: bool = False  # a consensus verified against the pinned identities is shown

    def to_json(self) -> dict[str, Any]:
        return {
            "n_authorities": self.n_authorities,
            "verified": self.verified,
            "consensus": {
                "flavour": self.consensus_flavour,
                "valid_after": self.consensus_valid_after,
                "fresh_until": self.consensus_fresh_until,
                "signatures": self.consensus_signatures,
                "error": self.consensus_error,
                "verified": self.verified,
            },
            "authorities": [
                {"nickname": a.nickname, "url": a.url, "v3ident": a.v3ident, "pinned": a.pinned,
                 "reachable": a.error is None, "error": a.error, "vote_valid_after": a.valid_after,
                 "params": dict(a.params)}
                for a in self.authorities
            ],
            "params": [
                {"name": p.name, "votes": dict(p.votes), "consensus_value": p.consensus_value,
                 "predicted_value": p.predicted_value, "included": p.included, "tally": p.tally}
                for p in self.params
            ],
        }


def authorities_status(client: DirectoryClient, parameters: Sequence[str] = (),
                       flavour: str = "microdesc") -> AuthoritiesStatus:
    """Each authority's current vote for ``parameters`` (all voted ones when empty), the
    verified current consensus and tor's tally of the votes (§1.3). An unreachable authority
    or a consensus that cannot be had is reported, not raised; ``verified`` says whether the
    consensus shown passed the signature check against the pinned identities."""
    check_flavour(flavour)
    fetched = client.fetch_votes("current")
    rows: list[AuthorityVote] = []
    votes: list[Vote] = []
    for ep in client.endpoints:
        got = fetched[ep.nickname]
        url = ep.base_url + "/tor/status-vote/current/authority"
        if isinstance(got, KistexpError):
            rows.append(AuthorityVote(ep.nickname, url, ep.v3ident, str(got), None, (), bool(ep.v3ident)))
            continue
        ident = got.authorities[0].v3ident
        rows.append(AuthorityVote(ep.nickname, url, ident, None, got.valid_after, got.params, bool(ep.v3ident)))
        votes.append(Vote(ep.nickname, got.params, ident, got.consensus_methods, "Running" in got.known_flags))
    consensus = None
    consensus_error = None
    signatures = ""
    try:
        consensus = client.fetch_consensus(flavour)
        signatures = client.verify_consensus(consensus, consensus.source).summary()
    except KistexpError as exc:
        consensus_error = str(exc)
        consensus = client.consensus.get(flavour)  # an earlier verified one, if any
    names = list(parameters)
    if not names:
        keys = {k for v in votes for k, _ in v.params} | (set(dict(consensus.params)) if consensus else set())
        names = [k for k, _ in sort_params({k: 0 for k in keys})]
    tallies = {t.key: t for t in tally_params(votes, client.n_authorities)} if votes else {}
    params = []
    for name in names:
        t = tallies.get(name)
        params.append(ParamStatus(
            name=name,
            votes=tuple((v.authority, v.value(name)) for v in votes),
            consensus_value=dict(consensus.params).get(name) if consensus else None,
            predicted_value=t.median if t is not None and t.included else None,
            included=bool(t and t.included),
            tally=describe_tally(t, name, client.n_authorities),
        ))
    return AuthoritiesStatus(
        n_authorities=client.n_authorities,
        authorities=tuple(rows),
        consensus_flavour=flavour,
        consensus_valid_after=consensus.valid_after if consensus else None,
        consensus_fresh_until=consensus.fresh_until if consensus else None,
        consensus_signatures=signatures,
        consensus_error=consensus_error,
        params=tuple(params),
        verified=consensus is not None,
    )
