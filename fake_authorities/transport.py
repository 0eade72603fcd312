"""An httpx transport that delivers requests to fake authorities in-process.

``DirectoryClient(..., transport=network.transport())`` then talks to the fakes without
sockets; faults behave as over TCP: ``down`` refuses the connection (or, in ``hang`` mode,
times out), ``slow`` delays the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from fake_authorities.dirport import DirRequest, DirResponse, Gate

Route = tuple[Callable[[DirRequest], DirResponse], Gate, Callable[[], bool]]


class InProcessTransport(httpx.BaseTransport):
    """Route ``http://host:port/...`` to the handler registered for that port."""

    def __init__(self, routes: Callable[[str, int], Route | None]) -> None:
        self._routes = routes

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
            time.sleep(min(timeout, 30.0))
            raise httpx.ReadTimeout("timed out (authority not answering)", request=request)
        if gate.delay_s > 0:
            if gate.delay_s >= timeout:
                time.sleep(timeout)
                raise httpx.ReadTimeout("timed out (authority slow)", request=request)
            time.sleep(gate.delay_s)
        headers = {k.lower(): v for k, v in request.headers.items()}
        resp = handler(DirRequest(request.method, request.url.path, headers, request.read(), "127.0.0.1"))
        return httpx.Response(
            resp.status_code if hasattr(resp, "status_code") else resp.status,
            headers=list(resp.headers),
            content=resp.body,
            extensions={"reason_phrase": resp.reason_phrase.encode(), "http_version": b"HTTP/1.0"},
            request=request,
        )
