"""The one bounded HTTP GET of the collectors: MetricsPort and exporter scrapes, OnionPerf day
files, consensus-archive listings and documents.

Every fetch stops at a total deadline, even when the server trickles its status line and
headers one byte at a time: the socket layer is the directory client's (``kistexp/directory/transport.py``,
``_DeadlineBackend``), which gives every connect, read and write only the time left before the
request's deadline; httpx's own timeouts bound each socket operation, not the request. On top of
that: at most ``max_bytes`` of body read off the wire (a larger ``Content-Length`` is refused
before reading), at most 64 response headers / 16 KiB (the directory client's bounds), no proxies
from the environment, no redirects followed, and ``Accept-Encoding: identity`` so the size cap is
the size of what is parsed (an ``.xz`` file is decompressed by the collector, bounded there).

Retries are bounded too: ``retries`` more attempts for failures worth another one (cannot
connect, timed out, cut mid-answer, HTTP 5xx and 429), with exponential backoff and full
jitter, and never past an overall ``until`` (a poll's own time bound).
"""

from __future__ import annotations

import random
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import httpcore
import httpx

from kistexp.directory.transport import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    _DeadlineBackend,
    _DeadlineStream,
    _DeadlineTransport,
)
from kistexp.errors import KistexpError
from kistexp.metrics.collectors import MiB, SourceTooLarge

USER_AGENT = "kistexp-metrics"


class ScrapeError(KistexpError):
    """An endpoint could not be read (refused, timed out, bad status)."""


class TransientError(ScrapeError):
    """A failure worth another attempt: cannot connect, timed out, cut mid-answer, HTTP 5xx/429."""


class StatusError(ScrapeError):
    """The server answered with a status that is not wanted (404, 403, 500, ...)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _TransientStatus(StatusError, TransientError):
    pass


@attrs.frozen
class FetchLimits:
    """Bounds on one GET. ``timeout_s`` is per attempt and covers connect, status line, headers
    and body together."""

    timeout_s: float = 5.0
    max_bytes: int = 4 * MiB
    retries: int = 0
    backoff_s: float = 0.5
    backoff_max_s: float = 4.0

    def worst_case_s(self) -> float:
        """The longest a ``get`` with these limits can take (every attempt and wait used up)."""
        waits = sum(min(self.backoff_max_s, self.backoff_s * 2**i) for i in range(self.retries))
        return (self.retries + 1) * self.timeout_s + waits


@attrs.frozen
class Answer:
    """A response: 200 with its body, or 304 (not modified) with none. Header names lower case."""

    url: str
    status: int
    headers: Mapping[str, str] = attrs.field(hash=False)
    body: bytes = b""


# --- TLS over the directory client's deadline sockets ----------------------------------------------
# DirPorts speak plain HTTP, so the directory client's streams refuse TLS; OnionPerf files and
# CollecTor are served over https, so these streams hand TLS to the inner socket, still clipped to
# the request deadline.


class _TlsDeadlineStream(_DeadlineStream):
    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._stream.start_tls(ssl_context, server_hostname,
                                       self._backend.clip(timeout, httpcore.ConnectTimeout))
        return _TlsDeadlineStream(inner, self._backend)


class _TlsDeadlineBackend(_DeadlineBackend):
    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, self.clip(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _TlsDeadlineStream(stream, self)


class DeadlineTransport(_DeadlineTransport):
    """An httpx transport whose every connect, read and write ends at the deadline last set with
    ``backend.set_deadline`` (time.monotonic seconds; None: no deadline), over TLS too. For requests
    other than the GETs of ``get``: the webhook POST of kistexp/rollout/notify.py and the fake
    authorities' operator API calls of kistexp/rollout/actuators.py."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        # the directory transport's pool, on the TLS-capable backend; certificates are verified
        # (httpcore's default context) unless the caller gives its own context
        self.backend = _TlsDeadlineBackend(time.monotonic)
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=self.backend,
                                             max_keepalive_connections=0)


# --- one attempt ---------------------------------------------------------------------------------

_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def _once(url: str, timeout_s: float, max_bytes: int, headers: Mapping[str, str],
          transport: httpx.BaseTransport | None, statuses: frozenset[int], clipped: bool = False,
          ssl_context: ssl.SSLContext | None = None) -> Answer:
    # Deadlines are real time even when the caller's clock is virtual: the sockets wait in real time.
    deadline = time.monotonic() + timeout_s
    within = f"within {timeout_s:.3g} s" + (" (what was left of the poll's time bound)" if clipped else "")
    own = DeadlineTransport(ssl_context) if transport is None else None
    if own is not None:
        own.backend.set_deadline(deadline)
    answered = False  # status line and headers in: a timeout after this is a body that did not finish
    try:
        with httpx.Client(transport=transport or own, timeout=httpx.Timeout(timeout_s), trust_env=False,
                          follow_redirects=False, headers={"User-Agent": USER_AGENT}) as client:
            with client.stream("GET", url, headers={"Accept-Encoding": "identity", **headers}) as resp:
                answered = True
                raw = resp.headers.raw
                header_bytes = sum(len(k) + len(v) + 4 for k, v in raw)
                if len(raw) > MAX_HEADERS or header_bytes > MAX_HEADER_BYTES:
                    raise ScrapeError(f"{url}: {len(raw)} response headers of {header_bytes} bytes, more than the "
                                      f"{MAX_HEADERS} headers / {MAX_HEADER_BYTES} bytes allowed")
                got = {k.lower(): v for k, v in resp.headers.items()}
                if resp.status_code not in statuses:
                    text = f"{url}: HTTP {resp.status_code} {resp.reason_phrase or ''}".rstrip()
                    if 300 <= resp.status_code < 400 and "location" in got:
                        text += f" (redirect to {got['location'][:200]!r} not followed)"
                    cls = _TransientStatus if resp.status_code in _TRANSIENT_STATUS else StatusError
                    raise cls(text, resp.status_code)
                if resp.status_code == 304:
                    return Answer(url, 304, got)
                declared = got.get("content-length", "")
                if declared.isdigit() and declared.isascii() and int(declared) > max_bytes:
                    raise SourceTooLarge(f"{url}: Content-Length {declared} is over the {max_bytes}-byte limit")
                body = bytearray()
                for chunk in resp.iter_raw():
                    body += chunk
                    if len(body) > max_bytes:
                        raise SourceTooLarge(f"{url}: answer is over the {max_bytes}-byte limit")
                    # an injected transport has no deadline sockets: the deadline is checked here too
                    if time.monotonic() > deadline:
                        raise TransientError(f"{url}: answer not complete {within}")
                return Answer(url, resp.status_code, got, bytes(body))
    except KistexpError:
        raise
    except (httpx.TimeoutException, httpcore.TimeoutException):
        what = "answer not complete" if answered else "no answer"
        raise TransientError(f"{url}: {what} {within}") from None
    except (httpx.ConnectError, httpcore.ConnectError) as exc:
        raise TransientError(f"{url}: ConnectError: {_short(exc)}") from None
    except (httpx.RemoteProtocolError, httpcore.RemoteProtocolError) as exc:
        raise TransientError(f"{url}: not a complete HTTP answer ({_short(exc)})") from None
    except (httpx.ReadError, httpx.WriteError, httpcore.ReadError, httpcore.WriteError) as exc:
        raise TransientError(f"{url}: connection failed mid-transfer ({_short(exc)})") from None
    except (httpx.HTTPError, httpx.InvalidURL, httpcore.ProtocolError, httpcore.NetworkError,
            httpcore.UnsupportedProtocol) as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {_short(exc)}") from None
    finally:
        if own is not None:
            own.backend.set_deadline(None)
            own.close()


def get(url: str, *, limits: FetchLimits = FetchLimits(), headers: Mapping[str, str] | None = None,
        statuses: Iterable[int] = (200,), transport: httpx.BaseTransport | None = None,
        until: float | None = None, sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None, ssl_context: ssl.SSLContext | None = None) -> Answer:
    """GET ``url`` within ``limits``; a status outside ``statuses`` raises StatusError (304 is
    only accepted when listed, for conditional requests). ``until`` is a ``time.monotonic()``
    instant no attempt or wait may pass. ``ssl_context`` replaces the default (verifying) TLS
    context, e.g. for a mirror with its own CA. Raises ScrapeError (TransientError, StatusError)
    or SourceTooLarge, each one line naming the URL."""
    wanted = frozenset(statuses)
    rng = rng or random.Random()
    for attempt in range(limits.retries + 1):
        timeout = limits.timeout_s
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                raise ScrapeError(f"{url}: not fetched: the poll's time bound was used up")
            timeout = min(timeout, left)
        try:
            return _once(url, timeout, limits.max_bytes, headers or {}, transport, wanted, timeout < limits.timeout_s,
                         ssl_context)
        except TransientError as exc:
            if attempt == limits.retries:
                if not limits.retries:
                    raise
                note = f"{exc} (after {attempt + 1} attempts)"
                if isinstance(exc, StatusError):
                    raise _TransientStatus(note, exc.status) from None
                raise TransientError(note) from None
            wait = rng.uniform(0.0, min(limits.backoff_max_s, limits.backoff_s * 2**attempt))
            if until is not None:
                wait = min(wait, max(0.0, until - time.monotonic()))
            sleep(wait)
    raise AssertionError("unreachable")
