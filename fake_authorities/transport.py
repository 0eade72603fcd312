"""An httpx transport that delivers requests to fake authorities in-process.

``DirectoryClient(..., transport=network.transport())`` then talks to the fakes without
sockets; faults behave as over TCP: ``down`` refuses the connection (or, in ``hang`` mode,
times out), ``slow`` delays the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx

from fake_authorities.dirport import DirRequest, DirResponse, Gate

Route = tuple[Callable[[DirRequest], DirResponse], Gate, Callable[[], bool]]


class _Body(httpx.SyncByteStream):
    """The body in 16 KiB chunks, streamed as a socket would deliver it."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __iter__(self) -> Iterator[bytes]:
        for i in range(0, len(self._data), 16384):
            yield self._data[i : i + 16384]


class Unreachable(Exception):
    """The peer did not answer: ``refused`` (connection refused) or timed out."""

    def __init__(self, message: str, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


def deliver(route: Route | None, req: DirRequest, timeout_s: float,
            sleep: Callable[[float], None] = time.sleep) -> DirResponse:
    """One request to an in-process DirPort, with the faults a socket would show: a route
    that is missing or not listening refuses, a hanging gate times out, a slow one answers
    after its delay or times out. Raises ``Unreachable``."""
    if route is None:
        raise Unreachable("[Errno 111] Connection refused", refused=True)
    handler, gate, listening = route
    if not listening():
        raise Unreachable("[Errno 111] Connection refused", refused=True)
    if gate.hang.is_set():
        sleep(min(timeout_s, 30.0))
        raise Unreachable("timed out (authority not answering)", refused=False)
    if gate.delay_s > 0:
        if gate.delay_s >= timeout_s:
            sleep(timeout_s)
            raise Unreachable("timed out (authority slow)", refused=False)
        sleep(gate.delay_s)
    try:
        return handler(req)
    except Exception:  # as the socket server: a bug answers 503, it does not leak out
        return DirResponse(503)


class InProcessTransport(httpx.BaseTransport):
    """Route ``http://host:port/...`` to the handler registered for that port."""

    def __init__(self, routes: Callable[[str, int], Route | None],
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._routes = routes
        # A network on a virtual clock passes a no-op: its "slow" and "hang" cost no real time,
        # only the outcome (answer or timeout) is decided against the request's timeout.
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        port = request.url.port or 80
        timeout = (request.extensions.get("timeout") or {}).get("read") or 5.0
        headers = {k.lower(): v for k, v in request.headers.items()}
        req = DirRequest(request.method, request.url.path, headers, request.read(), "127.0.0.1",
                         request.url.query.decode())
        try:
            resp = deliver(self._routes(host, port), req, timeout, self._sleep)
        except Unreachable as exc:
            if exc.refused:
                raise httpx.ConnectError(f"{exc} ({host}:{port})", request=request) from None
            raise httpx.ReadTimeout(str(exc), request=request) from None
        return httpx.Response(
            resp.status,
            headers=list(resp.headers),
            stream=_Body(resp.body),
            extensions={"reason_phrase": resp.reason_phrase.encode(), "http_version": b"HTTP/1.0"},
            request=request,
        )
