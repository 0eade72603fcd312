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
        route = self._routes(host, port)
        if route is None:
            raise httpx.ConnectError(f"[Errno 111] Connection refused ({host}:{port})", request=request)
        handler, gate, listening = route
        if not listening():
            raise httpx.ConnectError(f"[Errno 111] Connection refused ({host}:{port})", request=request)
        timeout = (request.extensions.get("timeout") or {}).get("read") or 5.0
        if gate.hang.is_set():
            self._sleep(min(timeout, 30.0))
            raise httpx.ReadTimeout("timed out (authority not answering)", request=request)
        if gate.delay_s > 0:
            if gate.delay_s >= timeout:
                self._sleep(timeout)
                raise httpx.ReadTimeout("timed out (authority slow)", request=request)
            self._sleep(gate.delay_s)
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            resp = handler(DirRequest(request.method, request.url.path, headers, request.read(), "127.0.0.1",
                                      request.url.query.decode()))
        except Exception:  # as the socket server: a bug answers 503, it does not leak out
            resp = DirResponse(503)
        return httpx.Response(
            resp.status,
            headers=list(resp.headers),
            stream=_Body(resp.body),
            extensions={"reason_phrase": resp.reason_phrase.encode(), "http_version": b"HTTP/1.0"},
            request=request,
        )
