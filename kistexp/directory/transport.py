"""What bounds one DirPort request in time and size, and when it is tried again.

* ``Limits``: the bounds on one response (body bytes off the wire, decoded bytes, the compression
  ratio, header count and size);
* the deadline transport: httpx over httpcore's socket backend with every connect, read and write
  clipped to the deadline of the request under way, so a server trickling its status line and
  headers a byte at a time cannot hold a request past its total deadline (httpx's own timeouts bound
  each socket operation, not the request). The metric collectors' bounded GET
  (``kistexp.metrics.collectors.httpfetch``) is built on the same backend;
* retries: a ``_Retryable`` failure (network trouble, timeouts, 5xx) is tried again after an
  exponential backoff with full jitter, a bounded number of times.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import attrs
import httpcore
import httpx

from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES
from kistexp.directory.decode import BOMB_CHECK_AFTER_BYTES, BOMB_MAX_RATIO
from kistexp.errors import DirectoryError

#: Response headers: a DirPort sends about five. httpcore refuses a header block over
#: 100 KiB while reading it (h11 max_incomplete_event_size); these refuse anything past them.
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16 * 1024

#: Attempts per request are retries + 1; more than this is a mistake, not persistence.
MAX_RETRIES = 10

_T = TypeVar("_T")


@attrs.frozen
class Limits:
    """Bounds on one response; the defaults leave room for a full live vote."""

    max_body_bytes: int = MAX_DOCUMENT_BYTES  # bytes read off the wire
    max_decoded_bytes: int = MAX_DOCUMENT_BYTES  # bytes after decompression: no parser takes more
    max_ratio: int = BOMB_MAX_RATIO
    ratio_check_after_bytes: int = BOMB_CHECK_AFTER_BYTES
    max_headers: int = MAX_HEADERS
    max_header_bytes: int = MAX_HEADER_BYTES


class _Retryable(DirectoryError):
    """A failure worth another attempt (network trouble, timeouts, 5xx)."""


# --- retries --------------------------------------------------------------------------


def backoff_s(rng: random.Random, attempt: int, base_s: float, max_s: float) -> float:
    """The wait after failed attempt ``attempt`` (0 first): exponential backoff with full jitter,
    U(0, min(max_s, base_s * 2**attempt))."""
    return rng.uniform(0.0, min(max_s, base_s * 2**attempt))


def with_retries(attempt: Callable[[], _T], retries: int, wait: Callable[[int], None]) -> _T:
    """``attempt()``, tried again after ``wait(n)`` (n: the failed attempt, 0 first) while it fails with
    a ``_Retryable``, at most ``retries`` times; the last failure is a DirectoryError that says how many
    attempts were made. Any other error is raised at once."""
    for n in range(retries + 1):
        try:
            return attempt()
        except _Retryable as exc:
            if n == retries:
                raise DirectoryError(f"{exc} (after {n + 1} attempts)") from None
            wait(n)
    raise AssertionError("unreachable")


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
    left as they are; ``DirectoryClient.fetch_once`` names both families."""

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
