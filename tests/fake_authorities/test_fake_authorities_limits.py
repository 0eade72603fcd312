"""Fake authorities stay bounded for anyone without a token, and refuse with 400 what tor could not vote with."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_authorities import dirport
from fake_authorities.dirport import BodyBudget, DirPortServer, DirRequest, DirResponse, Gate
from fake_authorities.network import FakeAuthorityNetwork, generate_keys
from fake_authorities.operator import MAX_BODY_BYTES, OperatorApi

TOKEN = "limits-token"
PREFIX = "/kistexp/operator"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def net():
    network = FakeAuthorityNetwork(count=3, interval_s=10, port=0, keys=generate_keys(3, (1024, 1024)),
                                   token=TOKEN)
    network.start()
    try:
        yield network
    finally:
        network.stop()


def _op_port(net) -> int:
    return net.operator_server.port


def _exchange(port: int, head: bytes, body_chunks=(), timeout=5.0) -> tuple[bytes, float]:
    """Send a request head (and body chunks while the server still reads); the reply and how long it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        try:
            for chunk in body_chunks:
                s.sendall(chunk)
        except OSError:
            pass  # the server refused and closed: what we test
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
    return out, time.monotonic() - start


def _status(reply: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", reply)
    assert m, reply[:200]
    return int(m[1])


def test_token_is_checked_before_the_body_is_read(net):
    # 16 MiB announced, not one byte sent: the old server waited to read the body before looking at the token.
    head = f"PUT {PREFIX}/authorities/moria1/params HTTP/1.0\r\nContent-Length: {16 * MiB}\r\n\r\n".encode()
    reply, took = _exchange(_op_port(net), head, timeout=10)
    assert _status(reply) == 401 and took < 3
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"].startswith("missing or wrong operator token")


def test_operator_body_capped_before_it_is_read(net):
    head = (f"PUT {PREFIX}/authorities/moria1/params HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    reply, took = _exchange(_op_port(net), head, timeout=10)
    assert _status(reply) == 400 and took < 3
    assert f"{MAX_BODY_BYTES}-byte limit" in json.loads(reply.partition(b"\r\n\r\n")[2])["error"]


def test_non_ascii_content_length_is_a_400(net):
    for value in ("²", "١٢", "1_0", "-1", " "):
        head = (f"POST /tor/post/vote HTTP/1.0\r\nContent-Length: {value}\r\n\r\n").encode()
        reply, _ = _exchange(net.authority("moria1").dirport, head)
        assert _status(reply) == 400, value


def test_dirport_reads_no_body_but_for_uploads(net):
    port = net.authority("moria1").dirport
    reply, took = _exchange(port, f"POST /tor/nothing HTTP/1.0\r\nContent-Length: {16 * MiB}\r\n\r\n".encode())
    assert _status(reply) == 404 and took < 3
    reply, took = _exchange(port, f"GET /tor/robots.txt HTTP/1.0\r\nContent-Length: {MiB}\r\n\r\n".encode())
    assert _status(reply) == 400 and took < 3


def test_headers_capped(net):
    head = b"GET /tor/robots.txt HTTP/1.0\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 900) for i in range(60))
    reply, _ = _exchange(net.authority("moria1").dirport, head + b"\r\n")
    assert _status(reply) == 400 and b"exceed" in reply.split(b"\r\n")[0]


def _server(handler=None, **limits) -> DirPortServer:
    srv = DirPortServer(handler or (lambda req: DirResponse(200, b"ok")), "127.0.0.1", 0, Gate(), **limits)
    srv.listen()
    return srv


def test_connections_capped_and_the_rest_told_busy():
    srv = _server(max_connections=3)
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
    try:
        time.sleep(0.2)  # the three are accepted and hold their handler threads (sending nothing)
        reply, took = _exchange(srv.port, b"GET / HTTP/1.0\r\n\r\n")
        assert _status(reply) == 503 and took < 2
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    reply, _ = _exchange(srv.port, b"GET / HTTP/1.0\r\n\r\n")
    assert _status(reply) == 200  # slots come back when connections end
    srv.close()


def test_a_trickling_request_is_cut_at_the_deadline(monkeypatch):
    monkeypatch.setattr(dirport, "REQUEST_DEADLINE_S", 0.6)
    srv = _server()
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        try:
            for ch in b"GET /tor/robots.txt HTTP/1.0\r\nX-Slow: " + b"a" * 100:
                s.sendall(bytes([ch]))
                time.sleep(0.1)
        except OSError:
            pass
        try:
            while s.recv(100):
                pass
        except OSError:
            pass
    assert time.monotonic() - start < 3
    srv.close()


def test_bodies_in_memory_share_one_budget():
    gate = Gate()
    gate.hang.set()  # the first request holds its body while "not answering"
    srv = DirPortServer(lambda req: DirResponse(200), "127.0.0.1", 0, gate, budget=BodyBudget(1500),
                        max_body_bytes=1000)
    srv.listen()
    head = b"POST /tor/post/vote HTTP/1.0\r\nContent-Length: 1000\r\n\r\n"
    first = socket.create_connection(("127.0.0.1", srv.port))
    first.sendall(head + b"x" * 1000)
    time.sleep(0.3)
    reply, took = _exchange(srv.port, head, [b"y" * 1000])
    assert _status(reply) == 503 and took < 2
    gate.hang.clear()
    first.close()
    srv.close()


def _rss_kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M)[1])


@pytest.mark.slow
def test_forty_unauthenticated_16_mib_posts_do_not_grow_memory(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "fake_authorities", "--count", "1", "--port", "0",
                             "--interval", "10s", "--token", TOKEN], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("operator token" in x for x in lines):
            lines.append(proc.stdout.readline())
        text = "".join(lines)
        op_port = int(re.search(r"operator API: http://127\.0\.0\.1:(\d+)/", text)[1])
        dir_port = int(re.search(r"v3ident", text) and re.search(r"  \S+\s+http://127\.0\.0\.1:(\d+)", text)[1])
        time.sleep(0.5)
        body = b"x" * MiB

        def post(port: int, path: str) -> None:
            head = f"POST {path} HTTP/1.0\r\nContent-Length: {16 * MiB}\r\n\r\n".encode()
            _exchange(port, head, [body] * 16, timeout=30)

        def peak_growth_mib(port: int, path: str) -> float:
            before = _rss_kib(proc.pid, "VmHWM")
            threads = [threading.Thread(target=post, args=(port, path)) for _ in range(20)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            return (_rss_kib(proc.pid, "VmHWM") - before) / 1024

        # 320 MiB sent to each; without the token the operator API reads none of it, and the DirPorts hold at
        # most MAX_BODY_BUFFER_BYTES (64 MiB) of bodies at once.
        operator = peak_growth_mib(op_port, f"{PREFIX}/population")
        dirport_growth = peak_growth_mib(dir_port, "/tor/post/vote")
        print(f"peak RSS growth: operator API {operator:.0f} MiB, DirPort {dirport_growth:.0f} MiB")
        assert operator < 16, f"operator API: peak RSS grew by {operator:.0f} MiB"
        assert dirport_growth < 64 + 32, f"DirPort: peak RSS grew by {dirport_growth:.0f} MiB"
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        proc.wait(10)


# --- what the operator API refuses ---------------------------------------------------------------------


def _api(net, method: str, path: str, body: bytes | str | object = b"", token: str | None = TOKEN):
    raw = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    headers = {"authorization": f"Bearer {token}"} if token else {}
    resp = OperatorApi(net).handle(DirRequest(method, f"{PREFIX}/{path}", headers, raw))
    return resp.status, json.loads(resp.body) if resp.body else None


@pytest.mark.parametrize("body, words", [
    ({"params": "KIST\x00SchedRunInterval=2"}, "bad keyword"),
    ({"params": "KISTSchedRunInterval=2 a\x1bb=3"}, "bad keyword"),
    ({"params": {"é": 1}}, "bad keyword"),
    ({"params": "KISTSchedRunInterval=2147483648"}, "int32"),
    ({"params": "KISTSchedRunInterval=-2147483649"}, "int32"),
    ({"params": "KISTSchedRunInterval=" + "9" * 5000}, "int32"),
    ({"params": {"KISTSchedRunInterval": 2**31}}, "int32"),
    ({"params": {"KISTSchedRunInterval": 1.5}}, "integers"),
    ({"params": {"KISTSchedRunInterval": True}}, "integers"),
    ({"params": [5]}, "strings"),
    ({"params": "AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=3"}, "set the torrc option"),
])
def test_params_tor_could_not_vote_with_are_a_400(net, body, words):
    status, reply = _api(net, "PUT", "authorities/moria1/params", body)
    assert status == 400 and words in reply["error"], reply
    assert "\x00" not in net.authority("moria1").consensus_params  # nothing was stored


@pytest.mark.parametrize("body, words", [
    ({"caches": 1, "clients": 1, "seed": -1}, "seed must be within"),
    ({"caches": 1.5}, "caches must be an integer"),
    ({"caches": "12"}, "caches must be an integer"),
    ({"clients": True}, "clients must be an integer"),
    ({"caches": 10**30}, "caches must be within"),
    ([1, 2], "expected"),
    (b'{"caches": NaN}', "not a JSON number"),
    (b'{"caches": 1e999}', "out of range"),
    (b'{"caches": ' + b"1" * 5000 + b"}", "not JSON"),
    (b"[" * 20 + b"]" * 20, "nested more than"),
    (b"[" * 60000, "nested more than"),
    (b"\xff\xfe", "not JSON"),
    (b"x" * (MAX_BODY_BYTES + 1), "limit"),
])
def test_bad_population_bodies_are_a_400(net, body, words):
    status, reply = _api(net, "POST", "population", body)
    assert status == 400 and words in reply["error"], reply


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
_paths = st.sampled_from(["status", "consensus", "population", "authorities/moria1", "authorities/moria1/params",
                          "authorities/moria1/faults", "authorities/moria1/faults/slow", "authorities/nosuch",
                          "authorities/moria1/faults/nosuch", "nosuch"])
_bodies = _json.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=200) | st.fixed_dictionaries(
    {"params": st.text(max_size=30)}).map(lambda v: json.dumps(v).encode()) | st.fixed_dictionaries(
    {"kind": st.sampled_from(["slow", "down", "malformed"]), "delay_s": _json}).map(
    lambda v: json.dumps(v).encode())


@settings(max_examples=200, deadline=3000)
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]), path=_paths, body=_bodies)
def test_operator_api_never_answers_5xx_to_any_body(net, method, path, body):
    try:
        status, reply = _api(net, method, path, body)
        assert status < 500, reply
        assert reply is not None and (status < 300 or isinstance(reply.get("error"), str))
    finally:
        net.clear_fault("moria1")
        net.set_params("moria1", "")
        if net.population is not None:
            net.population.stop()
            net.population = None


@pytest.mark.parametrize("fault", [{"kind": "slow", "delay_s": True}, {"kind": "slow", "delay_s": "5"},
                                   {"kind": "slow", "delay_s": 10**400}, {"kind": "down", "mode": ["hang"]},
                                   {"kind": "slow", "delay_s": 601}, {"kind": 5}])
def test_bad_faults_are_a_400(net, fault):
    status, reply = _api(net, "POST", "authorities/moria1/faults", fault)
    assert status == 400 and reply["error"], reply
    assert not net.authority("moria1").faults


def test_the_network_is_what_the_operator_api_needs(net):
    """OperatorApi is typed against the OperatedNetwork protocol: the network has every member of it."""
    from fake_authorities.operator import OperatedNetwork

    members = {name for name in vars(OperatedNetwork) if not name.startswith("_")}
    assert {"token", "authorities", "status", "set_params", "attach_population"} <= members
    assert [name for name in sorted(members) if not hasattr(net, name)] == []
