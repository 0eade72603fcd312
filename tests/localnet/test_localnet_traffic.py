"""Bulk server, SOCKS5 client and throughput measurement, exercised through a minimal
SOCKS5 relay on loopback (tor's SocksPort speaks the same RFC 1928/1929 subset)."""

from __future__ import annotations

import os
import socket
import socketserver
import struct
import threading

import pytest
from conftest import free_port

from kistexp.errors import LocalNetError
from kistexp.localnet import procs
from kistexp.localnet.procs import port_in_use
from kistexp.localnet.spec import SERVICE_ADDRESS
from kistexp.localnet.traffic import BulkServer, BulkServerProcess, download, parallel_download, socks_connect


class Socks5Relay(socketserver.ThreadingTCPServer):
    """Accepts username/password SOCKS5 CONNECTs and pipes bytes; records the usernames."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, refuse: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Socks5Handler)
        self.port = self.server_address[1]
        self.users: list[str] = []
        self.refuse = refuse
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Socks5Handler(socketserver.BaseRequestHandler):
    server: Socks5Relay

    def handle(self) -> None:
        conn = self.request
        conn.recv(3)
        conn.sendall(b"\x05\x02")
        head = conn.recv(2)
        user = conn.recv(head[1]).decode()
        conn.recv(conn.recv(1)[0])
        self.server.users.append(user)
        conn.sendall(b"\x01\x00")
        req = conn.recv(10)
        host, port = socket.inet_ntoa(req[4:8]), struct.unpack(">H", req[8:10])[0]
        if self.server.refuse:
            conn.sendall(b"\x05\x04\x00\x01" + b"\0" * 6)
            return
        with socket.create_connection((host, port)) as up:
            conn.sendall(b"\x05\x00\x00\x01" + b"\0" * 6)
            threading.Thread(target=_pipe, args=(conn, up), daemon=True).start()
            _pipe(up, conn)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


@pytest.fixture
def bulk():
    server = BulkServer(free_port(SERVICE_ADDRESS))
    yield server
    server.close()


def test_one_download_counts_every_byte(bulk: BulkServer) -> None:
    relay = Socks5Relay()
    try:
        t = download(relay.port, SERVICE_ADDRESS, bulk.port, 3_000_000, "circ-a")
    finally:
        relay.close()
    assert t.body_bytes == 3_000_000
    assert t.requested_at <= t.first_byte_at <= t.last_byte_at
    assert t.throughput_mbytes_per_s == pytest.approx(3.0 / t.seconds)
    assert relay.users == ["circ-a"]


def test_parallel_downloads_use_one_username_each(bulk: BulkServer) -> None:
    relay = Socks5Relay()
    names = [f"c{i}" for i in range(8)]
    try:
        m = parallel_download(relay.port, SERVICE_ADDRESS, bulk.port, 500_000, names)
    finally:
        relay.close()
    assert m.circuits == 8 and m.total_bytes == 4_000_000
    assert sorted(relay.users) == names
    assert m.seconds >= max(t.seconds for t in m.transfers) - 1e-9
    assert m.throughput_mbytes_per_s == pytest.approx(4.0 / m.seconds)


def test_socks_failure_is_a_clear_error(bulk: BulkServer) -> None:
    relay = Socks5Relay(refuse=True)
    try:
        with pytest.raises(LocalNetError, match="host unreachable"):
            socks_connect(relay.port, SERVICE_ADDRESS, bulk.port, "x", timeout_s=5)
    finally:
        relay.close()
    closed = free_port("127.0.0.1")
    with pytest.raises(LocalNetError, match=f"SOCKS port {closed}"):
        socks_connect(closed, SERVICE_ADDRESS, bulk.port, "x", timeout_s=2)


def test_bulk_server_answers_only_byte_counts(bulk: BulkServer) -> None:
    with socket.create_connection((bulk.address, bulk.port), timeout=5) as s:
        s.sendall(b"GET /etc/passwd HTTP/1.0\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.0 404")
    assert port_in_use(bulk.address, bulk.port)
    with pytest.raises(LocalNetError, match="is not a loopback address"):
        BulkServer(1, address="10.0.0.1")
    with pytest.raises(LocalNetError, match=f"cannot listen on {bulk.address}:{bulk.port}"):
        BulkServer(bulk.port)


def test_bulk_server_process_serves_from_a_process_of_its_own() -> None:
    port = free_port(SERVICE_ADDRESS)
    with BulkServerProcess(port) as server:
        assert server.pid != os.getpid()
        assert procs.cpu_seconds(server.pid) is not None
        relay = Socks5Relay()
        try:
            t = download(relay.port, SERVICE_ADDRESS, port, 2_000_000, "circ-p")
        finally:
            relay.close()
        assert t.body_bytes == 2_000_000
        # a second server on the same port is refused with the child's one-line reason
        with pytest.raises(LocalNetError, match=f"cannot listen on {SERVICE_ADDRESS}:{port}"):
            BulkServerProcess(port)
    # closing ends (and reaps) the child and frees the port
    assert procs.cpu_seconds(server.pid) is None
    assert not port_in_use(SERVICE_ADDRESS, port)
    with pytest.raises(LocalNetError, match="is not a loopback address"):
        BulkServerProcess(1, address="10.0.0.1")
