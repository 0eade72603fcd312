"""The local network's measurement client (kistexp.localnet.measure) and held-consensus watch
(kistexp.localnet.heldconsensus): OnionPerf 3.1 day files that kistexp's own OnionPerf collector
reads (metrics-sources.md §1), the quiet-circuit latency sidecar and its instrument, and what each
node's tor holds.

Fast tests build records from synthetic transfers and fake control-port events, or run transfers
through a minimal SOCKS5 relay; the real-tor test runs the client against a private network of
3 authorities, 2 relays, 1 exit and 2 clients, then kills one client's tor.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import socket
import statistics
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
from conftest import free_port, have_real_tor

from kistexp.errors import LocalNetError
from kistexp.localnet.heldconsensus import (
    HeldConsensusWatch,
    params_of,
    parse_pinned,
    parse_valid_after,
)
from kistexp.localnet.measure import (
    InteractiveInstrument,
    MeasurementClient,
    MeasurementConfig,
    OnionPerfDayFiles,
    TorEvents,
    TransferTrace,
    day_file_name,
    read_interactive,
    run_transfer,
    sidecar_name,
    tgen_stream,
)
from kistexp.localnet.spec import SERVICE_ADDRESS
from kistexp.localnet.traffic import BulkServer, socks_connect
from kistexp.metrics.collectors import onionperf
from tests.localnet.test_localnet_traffic import Socks5Relay

# OnionPerf 3.1 schema (metrics-sources.md §1.4): both tor object kinds have additionalProperties false
CIRCUIT_KEYS = {"build_quantile", "build_timeout", "cbt_set", "current_guards", "buildtime_seconds", "circuit_id",
                "elapsed_seconds", "failure_reason_local", "failure_reason_remote", "filtered_out", "path",
                "unix_ts_end", "unix_ts_start"}
TOR_STREAM_KEYS = {"circuit_id", "elapsed_seconds", "failure_reason_local", "failure_reason_remote", "source",
                   "stream_id", "target", "unix_ts_end", "unix_ts_start"}
TGEN_REQUIRED = {"byte_info", "is_complete", "is_error", "is_success", "stream_id", "stream_info", "time_info",
                 "transport_info", "unix_ts_end", "unix_ts_start"}
TIME_INFO_REQUIRED = {"created-ts", "now-ts", "usecs-to-checksum-recv", "usecs-to-checksum-send", "usecs-to-command",
                      "usecs-to-first-byte-recv", "usecs-to-first-byte-send", "usecs-to-last-byte-recv",
                      "usecs-to-last-byte-send", "usecs-to-proxy-choice", "usecs-to-proxy-init",
                      "usecs-to-proxy-request", "usecs-to-proxy-response", "usecs-to-response",
                      "usecs-to-socket-connect", "usecs-to-socket-create"}
STREAM_INFO_REQUIRED = {"error", "id", "name", "peername", "recvsize", "recvstate", "sendsize", "sendstate",
                        "vertexid"}
FP = "A" * 40


def _trace(number: int = 7, size: int = 5242880, *, end_unix: float = 1_700_000_100.0, error: str = "NONE",
           local_port: int = 40001) -> TransferTrace:
    """A transfer created at monotonic 1000.0: SOCKS done at +0.5 s, first byte at +1.0 s, every
    threshold k at +1.0 + k/size * 4 s, last byte at +5.0 s."""
    c = 1000.0
    steps = {"socket-create": c + 0.0001, "socket-connect": c + 0.0002, "proxy-init": c + 0.0003,
             "proxy-choice": c + 0.0004, "proxy-request": c + 0.0005, "proxy-response": c + 0.5,
             "command": c + 0.5001, "response": c + 1.0, "first-byte-recv": c + 1.0}
    received = size if error == "NONE" else size // 2
    marks = {m: c + 1.0 + 4.0 * m / size for m in (10240, 20480, 51200, 102400, 204800, 512000, 1048576, 2097152,
                                                   5242880) if m <= received}
    progress = {f"{k / 10:.1f}": c + 1.0 + 4.0 * k / 10 for k in range(11) if k / 10 * size <= received}
    steps["last-byte-recv"] = c + 1.0 + 4.0 * received / size
    return TransferTrace(vantage="client006", number=number, size=size, username="u", socks_port=15406,
                         host=SERVICE_ADDRESS, port=15500, created=c, ended=c + 5.25, end_unix=end_unix, steps=steps,
                         local_port=local_port, fd=9, payload_recv=received, total_recv=received + 90, total_sent=48,
                         thresholds=marks, progress=progress, error=error,
                         recv_state="RECV_SUCCESS" if error == "NONE" else "RECV_PAYLOAD")


# ---- the tgen stream record and day files ------------------------------------------------------


def test_synthetic_transfer_round_trips_through_the_onionperf_collector(tmp_path: Path) -> None:
    files = OnionPerfDayFiles(tmp_path, "client006")
    ok, timeout = _trace(), _trace(number=8, size=1048576, error="TIMEOUT", local_port=40002)
    for t in (ok, timeout):
        files.add("tgen", t.key, tgen_stream(t), t.end_unix)
    written = files.flush(now_unix=1_700_000_200.0)
    day = dt.date(2023, 11, 14)
    assert written == (tmp_path / day_file_name(day, "client006"),)
    doc = json.loads(written[0].read_text())
    assert doc["type"] == "onionperf" and doc["version"] == "3.1" and "filters" not in doc
    stream = doc["data"]["client006"]["tgen"]["streams"][ok.key]
    assert TGEN_REQUIRED <= set(stream) and TIME_INFO_REQUIRED <= set(stream["time_info"])
    assert STREAM_INFO_REQUIRED <= set(stream["stream_info"])
    assert stream["transport_info"]["local"] == "localhost:127.0.0.1:40001"
    assert stream["time_info"]["usecs-to-last-byte-recv"] == "5000000"
    assert stream["unix_ts_start"] == pytest.approx(1_700_000_100.0 - 5.25)
    # elapsed_seconds only on streams without an error (metrics-sources.md §1.3)
    assert "elapsed_seconds" not in doc["data"]["client006"]["tgen"]["streams"][timeout.key]
    assert doc["data"]["client006"]["tgen"]["streams"][timeout.key]["stream_info"]["error"] == "TIMEOUT"

    a = onionperf.load(written[0])
    assert a.version == (3, 1) and not a.problems
    by_size = {t.size: t for t in a.transfers}
    good, bad = by_size[5242880], by_size[1048576]
    assert good.success and good.ttfb_s == pytest.approx(1.0) and good.ttlb_s == pytest.approx(5.0)
    assert good.partial_s[51200] == pytest.approx(1.0 + 4.0 * 51200 / 5242880, abs=1e-6)
    assert good.partial_s[1048576] == pytest.approx(1.8, abs=1e-6)
    assert good.local_port == 40001 and good.server == "public"
    assert not bad.success and bad.error == "TIMEOUT" and bad.ttlb_s is None
    assert bad.last_byte_s == pytest.approx(3.0)  # the last byte it got, as tgen records it (§1.3)
    samples = onionperf.samples(a).samples
    assert [s.value for s in samples["client_ttlb_5mib_s"]] == pytest.approx([5.0])
    assert [s.value for s in samples["client_ttlb_50kib_s"]] == pytest.approx([1.0 + 4.0 * 51200 / 5242880], abs=1e-6)
    assert sorted(s.value for s in samples["client_transfer_failure_ratio"]) == [0.0, 1.0]
    # 4 MiB between the 1 MiB and 5 MiB marks in 3.2 s
    assert samples["client_throughput_mbytes_per_s"][0].value == pytest.approx(4194304 / 3.2 / 1e6, rel=1e-4)


class CircuitEvent(SimpleNamespace):
    pass


class CircMinorEvent(SimpleNamespace):
    pass


class StreamEvent(SimpleNamespace):
    pass


class BuildTimeoutSetEvent(SimpleNamespace):
    pass


class GuardEvent(SimpleNamespace):
    pass


def _circ(cid: int, status: str, path=(), **kw) -> CircuitEvent:
    fields = {"id": str(cid), "status": status, "purpose": "GENERAL", "path": list(path), "reason": None,
              "remote_reason": None, "hs_state": None, "rend_query": None}
    return CircuitEvent(**{**fields, **kw})


def _stream(sid: int, status: str, circ: str | None, source: str | None = None, **kw) -> StreamEvent:
    fields = {"id": str(sid), "status": status, "circ_id": circ, "target": f"{SERVICE_ADDRESS}:15500",
              "source_addr": source, "purpose": "USER" if status == "NEW" else None, "reason": None,
              "remote_reason": None}
    return StreamEvent(**{**fields, **kw})


def test_tor_events_become_onionperf_circuits_and_streams_that_join(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    files = OnionPerfDayFiles(tmp_path, "client006")
    events = TorEvents(files.add, clock=lambda: now[0])
    files.guards = events.guards_json
    events.reset(build_timeout_ms=60000)
    events.seed_guards(f"${FP}~relay003 up\n${'B' * 40}~relay004 never-connected\n", at=now[0] - 10)

    def feed(event, at: float) -> None:
        now[0] = at
        events.handle(event)

    t0 = 1_700_000_000.0
    feed(_circ(5, "EXTENDED", [(FP, "relay003")]), t0 - 1)  # launched before the listener: dropped
    feed(_circ(5, "CLOSED"), t0 - 0.5)
    feed(BuildTimeoutSetEvent(set_type="COMPUTED", timeout=1500, quantile=0.8), t0)
    feed(_circ(7, "LAUNCHED"), t0 + 1.0)
    for i, hop in enumerate([(FP, "relay003"), ("C" * 40, "relay004"), ("D" * 40, "exit005")]):
        feed(_circ(7, "EXTENDED", [hop]), t0 + 1.1 + 0.1 * i)
    feed(_circ(7, "BUILT"), t0 + 1.35)
    feed(CircMinorEvent(id="7", event="PURPOSE_CHANGED", purpose="GENERAL", old_purpose="GENERAL", hs_state=None,
                        rend_query=None), t0 + 1.4)  # same purpose: OnionPerf skips it
    feed(_stream(30, "NEW", None, "127.0.0.1:40001"), t0 + 2.0)
    feed(_stream(30, "SENTCONNECT", "7"), t0 + 2.001)
    assert events.circuit_of(40001, since_unix=t0 + 1.9) == "7"
    assert events.circuit_of(40001, since_unix=t0 + 2.5) is None  # a later transfer on a reused port
    feed(_stream(30, "SUCCEEDED", "7"), t0 + 2.2)
    feed(_stream(30, "CLOSED", "7"), t0 + 7.0)
    feed(BuildTimeoutSetEvent(set_type="RESET", timeout=60000, quantile=0.8), t0 + 7.5)
    feed(_circ(8, "LAUNCHED"), t0 + 8.0)
    feed(_circ(8, "FAILED", reason="TIMEOUT", remote_reason="CHANNEL_CLOSED"), t0 + 9.0)
    feed(_circ(7, "CLOSED", reason="REQUESTED"), t0 + 10.0)
    feed(GuardEvent(guard_type="ENTRY", endpoint_fingerprint="E" * 40, endpoint_nickname="relay009", status="NEW"),
         t0 + 11)
    events.handle(CircuitEvent(id="not a number"))  # malformed: skipped, never raised

    a_tgen = _trace(number=1, size=51200, end_unix=t0 + 7.0, local_port=40001)
    files.add("tgen", a_tgen.key, tgen_stream(a_tgen), a_tgen.end_unix)
    (path,) = files.flush(now_unix=t0 + 12)
    doc = json.loads(path.read_text())["data"]["client006"]["tor"]
    assert sorted(doc["circuits"]) == ["7", "8"]
    seven, eight = doc["circuits"]["7"], doc["circuits"]["8"]
    for circ in (seven, eight):
        assert set(circ) <= CIRCUIT_KEYS
        assert circ["filtered_out"] is False
    assert seven["buildtime_seconds"] == pytest.approx(0.35)
    assert [hop for hop, _ in seven["path"]] == [f"${FP}~relay003", f"${'C' * 40}~relay004", f"${'D' * 40}~exit005"]
    assert seven["cbt_set"] is True and seven["build_timeout"] == 1500 and seven["build_quantile"] == 0.8
    assert [g["nickname"] for g in seven["current_guards"]] == ["relay003"]
    assert [k for k, _ in seven["elapsed_seconds"]] == ["GENERAL:LAUNCHED"] + ["GENERAL:EXTENDED"] * 3 + [
        "GENERAL:BUILT", "GENERAL:CLOSED"]
    assert eight["cbt_set"] is False and eight["build_timeout"] == 60000 and "buildtime_seconds" not in eight
    assert eight["failure_reason_local"] == "TIMEOUT" and eight["failure_reason_remote"] == "CHANNEL_CLOSED"
    (stream,) = doc["streams"].values()
    assert set(stream) <= TOR_STREAM_KEYS
    assert stream["circuit_id"] == "7" and stream["source"] == "127.0.0.1:40001" and stream["stream_id"] == 30
    assert [k for k, _ in stream["elapsed_seconds"]][0] == "USER:NEW"
    assert {g["nickname"] for g in doc["guards"]} == {"relay003", "relay004", "relay009"}

    a = onionperf.load(path)
    assert a.stream_circuit == {("client006", 40001): 7}
    builds = onionperf.samples(a).samples["circuit_build_time_s"]
    assert [s.value for s in builds] == pytest.approx([0.35])


def test_day_files_roll_over_at_utc_midnight_and_forget_final_days(tmp_path: Path) -> None:
    midnight = dt.datetime(2026, 3, 2, tzinfo=dt.timezone.utc).timestamp()
    files = OnionPerfDayFiles(tmp_path, "client006", grace_s=60)
    before, after = _trace(number=1, end_unix=midnight - 5), _trace(number=2, end_unix=midnight + 5)
    for t in (before, after):
        files.add("tgen", t.key, tgen_stream(t), t.end_unix)
    written = files.flush(now_unix=midnight + 10)
    assert [p.name for p in written] == ["2026-03-01.client006.onionperf.analysis.json",
                                         "2026-03-02.client006.onionperf.analysis.json"]
    for path, key in zip(written, (before.key, after.key), strict=True):
        assert list(json.loads(path.read_text())["data"]["client006"]["tgen"]["streams"]) == [key]
    assert files.days_in_memory() == (dt.date(2026, 3, 1), dt.date(2026, 3, 2))
    assert files.flush(now_unix=midnight + 30) == ()  # nothing changed, nothing rewritten
    files.flush(now_unix=midnight + 61)
    assert files.days_in_memory() == (dt.date(2026, 3, 2),)
    late = _trace(number=3, end_unix=midnight - 1)
    files.add("tgen", late.key, tgen_stream(late), late.end_unix)
    assert files.late_records == 1
    assert len(json.loads(written[0].read_text())["data"]["client006"]["tgen"]["streams"]) == 1


def test_a_later_run_extends_the_day_file_and_numbers_after_it(tmp_path: Path) -> None:
    now = time.time()
    first = OnionPerfDayFiles(tmp_path, "client006")
    t1 = _trace(number=41, end_unix=now)
    first.add("tgen", t1.key, tgen_stream(t1), t1.end_unix)
    first.flush()
    second = OnionPerfDayFiles(tmp_path, "client006")
    assert second.next_number() == 42
    t2 = _trace(number=42, end_unix=now)
    second.add("tgen", t2.key, tgen_stream(t2), t2.end_unix)
    (path,) = second.flush()
    assert len(onionperf.load(path).transfers) == 2
    # an unreadable day file is kept aside, not overwritten or fatal
    path.write_text("{not json")
    third = OnionPerfDayFiles(tmp_path, "client006")
    assert third.next_number() == 1
    assert third.problems and "kept as" in third.problems[0]
    assert any(p.name.startswith(path.name + ".unreadable-") for p in tmp_path.iterdir())


# ---- transfers through a SOCKS5 relay (no tor) ---------------------------------------------------


@pytest.fixture
def bulk():
    server = BulkServer(free_port(SERVICE_ADDRESS))
    yield server
    server.close()


def test_run_transfer_records_tgen_steps_and_errors(bulk: BulkServer) -> None:
    relay = Socks5Relay()
    try:
        t = run_transfer(vantage="client006", number=1, size=1048576, socks_port=relay.port, host=SERVICE_ADDRESS,
                         port=bulk.port, username="u1", timeout_s=20)
        assert t.success and t.payload_recv == 1048576 and t.total_recv > 1048576
        order = ["socket-create", "socket-connect", "proxy-init", "proxy-choice", "proxy-request", "proxy-response",
                 "command", "response", "first-byte-recv", "last-byte-recv"]
        assert [t.steps[s] for s in order] == sorted(t.steps[s] for s in order)
        assert sorted(t.thresholds) == [10240, 20480, 51200, 102400, 204800, 512000, 1048576]
        assert set(t.progress) == {f"{k / 10:.1f}" for k in range(11)}
        assert t.local_port > 0 and t.start_unix < t.end_unix

        # the relay refuses the CONNECT: a PROXY error at the SOCKS reply, never an exception
        relay.refuse = True
        t = run_transfer(vantage="client006", number=2, size=51200, socks_port=relay.port, host=SERVICE_ADDRESS,
                         port=bulk.port, username="u2", timeout_s=5)
        assert (t.error, t.transport_error, t.transport_state) == ("PROXY", "PROXY_STATUS", "RESPONSE_STATUS")
        assert "host unreachable" in t.detail and not tgen_stream(t)["is_success"]
        relay.refuse = False
    finally:
        relay.close()
    closed = free_port()
    t = run_transfer(vantage="client006", number=3, size=51200, socks_port=closed, host=SERVICE_ADDRESS,
                     port=bulk.port, username="u3", timeout_s=5)
    assert (t.error, t.transport_error, t.local_port) == ("PROXY", "CONNECT", 0)


def test_run_transfer_is_bounded_by_its_timeout_and_counts_a_short_body() -> None:
    silent = socket.create_server((SERVICE_ADDRESS, 0))
    port = silent.getsockname()[1]
    accepted: list[socket.socket] = []

    def serve(short: bool) -> None:
        conn, _ = silent.accept()
        accepted.append(conn)
        if short:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 51200\r\n\r\n" + b"x" * 1000)
            conn.close()

    relay = Socks5Relay()
    try:
        threading.Thread(target=serve, args=(False,), daemon=True).start()
        t0 = time.monotonic()
        t = run_transfer(vantage="client006", number=1, size=51200, socks_port=relay.port, host=SERVICE_ADDRESS,
                         port=port, username="slow", timeout_s=1.0)
        assert time.monotonic() - t0 < 3.0
        assert t.error == "TIMEOUT" and t.recv_state == "RECV_HEADER"
        threading.Thread(target=serve, args=(True,), daemon=True).start()
        t = run_transfer(vantage="client006", number=2, size=51200, socks_port=relay.port, host=SERVICE_ADDRESS,
                         port=port, username="short", timeout_s=5.0)
        assert t.error == "READEOF" and t.payload_recv == 1000 and t.recv_state == "RECV_PAYLOAD"
        assert tgen_stream(t)["byte_info"]["payload-progress-recv"] == "1.95%"
    finally:
        relay.close()
        silent.close()
        for conn in accepted:
            conn.close()


def test_bulk_server_echo_path_returns_what_the_client_sends(bulk: BulkServer) -> None:
    relay = Socks5Relay()
    try:
        sock = socks_connect(relay.port, SERVICE_ADDRESS, bulk.port, "echo", timeout_s=5)
        with sock:
            sock.sendall(f"GET /echo HTTP/1.0\r\nHost: {SERVICE_ADDRESS}\r\n\r\n".encode())
            header = b""
            while b"\r\n\r\n" not in header:
                header += sock.recv(1024)
            assert header.startswith(b"HTTP/1.0 200") and header.endswith(b"\r\n\r\n")
            for message in (b"ping-1\n", b"x" * 300):
                sock.sendall(message)
                got = b""
                while len(got) < len(message):
                    got += sock.recv(4096)
                assert got == message
    finally:
        relay.close()


class _RelayNet:
    """A 'network' whose one client is a SOCKS5 relay and whose tor never answers on its
    ControlPort: the measurement client's whole life without tor."""

    def __init__(self, socks_port: int, service_port: int) -> None:
        self.client = SimpleNamespace(nickname="client006", socks_port=socks_port, role="client")
        self.spec = SimpleNamespace(service_port=service_port)

    def by_role(self, role: str) -> tuple:
        return {"client": (self.client,), "exit": (SimpleNamespace(nickname="exit005"),)}.get(role, ())

    def control(self, name: str):
        raise LocalNetError(f"{name} is not running; its ControlPort is closed")


def test_measurement_client_runs_and_stops_within_its_bound_without_tor(tmp_path: Path, bulk: BulkServer) -> None:
    relay = Socks5Relay()
    config = MeasurementConfig(out_dir=tmp_path, period_s=0.3, sizes=(51200, 1048576), transfer_timeout_s=10,
                               interactive_period_s=0.1, interactive_timeout_s=2, service_port=bulk.port,
                               attach_wait_s=0.2, reconnect_s=0.2, write_interval_s=0.2)
    client = MeasurementClient(_RelayNet(relay.port, bulk.port), config)
    with pytest.raises(LocalNetError, match="not a client"):
        MeasurementClient(_RelayNet(relay.port, bulk.port), attrs.evolve(config, vantages=("client999",)))
    try:
        client.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and client.health()["client006"].transfers_ok < 4:
            time.sleep(0.1)
        health = client.health()["client006"]
        assert health.transfers_ok >= 4 and health.probes_ok >= 3, health
        # no ControlPort: not healthy, and it says why
        assert not health.healthy and not health.control_connected and "not running" in health.last_problem
        with pytest.raises(LocalNetError, match="started already"):
            client.start()
    finally:
        t0 = time.monotonic()
        left = client.stop(3.0)
        relay.close()
    assert time.monotonic() - t0 < 3.5 and left == ()
    assert not [t for t in threading.enumerate() if t.name.startswith("measure-")]
    a = onionperf.load(client.day_file("client006"))
    assert {t.size for t in a.transfers if t.success} == {51200, 1048576}
    assert all(t.local_port for t in a.transfers)
    got = read_interactive(client.sidecar("client006"), source="client006", instance="i")
    assert len(got.samples) >= 3 and not got.problems


# ---- the quiet-circuit latency sidecar ---------------------------------------------------------


def test_sidecar_reader_skips_garbage_with_problems(tmp_path: Path) -> None:
    t = 1_700_000_000.0
    lines = [
        json.dumps({"time": t, "rtt_ms": 12.5, "ok": True}),
        "not json at all",
        "[1, 2, 3]",
        '{"time": 1700000001.0, "rtt_ms": NaN, "ok": true}',
        json.dumps({"time": t + 2, "rtt_ms": -3.0, "ok": True}),
        json.dumps({"time": t + 3, "rtt_ms": "7", "ok": True}),
        json.dumps({"rtt_ms": 5.0, "ok": True}),
        json.dumps({"time": 1e300, "rtt_ms": 5.0, "ok": True}),
        "[" * 3000,
        json.dumps({"time": t + 4, "rtt_ms": None, "ok": False, "error": "TIMEOUT", "detail": "no echo within 5 s"}),
        "",
        json.dumps({"time": t + 5, "rtt_ms": 0.8, "ok": True}),
    ]
    path = tmp_path / "x.interactive.jsonl"
    path.write_text("\n".join(lines) + "\n" + '{"time": 1700000006.0, "rtt')  # a line still being written
    got = read_interactive(path, source="client006", instance="interactive:client006")
    assert [s.value for s in got.samples] == [12.5, 0.8]
    assert all(s.labels == {"instance": "interactive:client006", "source": "client006"} for s in got.samples)
    assert got.failures == 1 and got.last_failure.startswith("TIMEOUT")
    assert len(got.problems) == 8 and all("line skipped" in p and "@" in p for p in got.problems)
    assert any("nan" in p.lower() for p in got.problems) and any("-3.0" in p for p in got.problems)
    assert got.consumed == path.read_bytes().rfind(b"\n") + 1
    again = read_interactive(path, source="client006", instance="i", offset=got.consumed)
    assert again.samples == () and again.problems == () and again.consumed == 0


def test_interactive_instrument_returns_new_samples_once(tmp_path: Path) -> None:
    day = dt.date(2026, 3, 1)
    inst = InteractiveInstrument(tmp_path, "client006")
    assert inst.kind == "interactive" and inst.metrics == ("quiet_circuit_latency_ms",)
    now = dt.datetime.now(dt.timezone.utc)
    first = inst.poll(now)
    assert not first.ok and "no sidecar" in first.problem
    base = dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc).timestamp()
    path = tmp_path / sidecar_name(day, "client006")
    with path.open("a") as fh:
        for i in range(3):
            fh.write(json.dumps({"time": base + i, "rtt_ms": 10.0 + i, "ok": True}) + "\n")
    reading = inst.poll(now)
    assert reading.ok and [s.value for _, s in reading.samples] == [10.0, 11.0, 12.0]
    assert {m for m, _ in reading.samples} == {"quiet_circuit_latency_ms"}
    assert inst.poll(now).samples == ()
    with path.open("a") as fh:
        fh.write(json.dumps({"time": base + 3, "rtt_ms": None, "ok": False, "error": "READEOF"}) + "\n")
    failed = inst.poll(now)
    assert failed.samples == () and "1 probe(s) failed" in failed.problem and "READEOF" in failed.problem

    # with a held-consensus watch, each sample carries the consensus its vantage held
    held = SimpleNamespace(valid_after=dt.datetime(2026, 3, 1, 11, 59, 50, tzinfo=dt.timezone.utc),
                           param=lambda name: {"KISTSchedRunInterval": 3}.get(name))
    watch = SimpleNamespace(held=lambda node, at: held if node == "client006" else None)
    labelled = InteractiveInstrument(tmp_path, "client006", watch=watch, param="KISTSchedRunInterval")
    samples = [s for _, s in labelled.poll(now).samples]
    assert len(samples) == 3 and all(s.param_value == 3 for s in samples)
    assert samples[0].labels["valid_after"] == "2026-03-01T11:59:50+00:00"


def test_measurement_config_refuses_nonsense_with_one_line(tmp_path: Path) -> None:
    for kwargs, words in (({"period_s": 0}, "period_s"), ({"transfer_timeout_s": math.nan}, "transfer_timeout_s"),
                          ({"sizes": (0,)}, "sizes"), ({"max_concurrent": 0}, "max_concurrent"),
                          ({"interactive_bytes": 4000}, "interactive_bytes"), ({"service_port": 70000}, "port")):
        with pytest.raises(LocalNetError, match=words):
            MeasurementConfig(out_dir=tmp_path, **kwargs)


# ---- the held-consensus watch, without tor ---------------------------------------------------------


def test_consensus_answers_parse() -> None:
    doc = ("network-status-version 3 microdesc\nvalid-after 2026-12-04 20:31:30\n"
           "params AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=3\ndir-source auth000 X\n")
    assert params_of(doc, "t") == {"AuthDirMaxServersPerAddr": 0, "KISTSchedRunInterval": 3}
    assert params_of("network-status-version 3\ndir-source a\nparams x=1\n", "t") == {}
    with pytest.raises(LocalNetError, match="params"):
        params_of("params KISTSchedRunInterval=three\n", "t")
    assert parse_pinned(["0"], "n") is None and parse_pinned(["0 msec"], "n") is None
    assert parse_pinned(["7 msec"], "n") == 7 and parse_pinned([], "n") is None
    with pytest.raises(LocalNetError, match="not a number of msec"):
        parse_pinned(["7 seconds"], "n")
    assert parse_valid_after("2026-12-04 20:31:30") == dt.datetime(2026, 12, 4, 20, 31, 30, tzinfo=dt.timezone.utc)


class _FakeNet:
    """Nodes whose ControlPort refuses, or hangs, like a dead or stopped tor."""

    def __init__(self, hang: set[str]) -> None:
        self.hang = hang
        self.release = threading.Event()

    def node(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(nickname=name)

    def control(self, name: str):
        if name in self.hang:
            self.release.wait(10)
        raise LocalNetError(f"{name} is not running; its ControlPort is closed")


def test_watch_records_unreachable_nodes_and_bounds_each_call(tmp_path: Path) -> None:
    net = _FakeNet(hang={"relay004"})
    watch = HeldConsensusWatch(net, ["relay003", "relay004"], tmp_path, period_s=0.2, call_timeout_s=0.5)
    try:
        t0 = time.monotonic()
        states = watch.poll_once()
        assert time.monotonic() - t0 < 2.0
        assert not states["relay003"].reachable and "not running" in states["relay003"].problem
        assert not states["relay004"].reachable and "within 0.5 s" in states["relay004"].problem
        assert watch.held("relay003") is None and watch.snapshot() == {"relay003": None, "relay004": None}
        watch.poll_once()  # the same answers: no new line
        lines = (tmp_path / "relay003.held-consensus.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["reachable"] is False
        with pytest.raises(LocalNetError, match="not watched"):
            watch.state("exit005")
    finally:
        net.release.set()
        t0 = time.monotonic()
        watch.stop(2.0)
        assert time.monotonic() - t0 < 3.0


# ---- real tor --------------------------------------------------------------------------------------

PINNED_EXIT_MS = 7
CONSENSUS_KIST = 3


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A running network measured for about 30 s by both clients, with the watch over every relay,
    exit and client. Yields (net, client, watch, out_dir, started)."""
    if not have_real_tor():
        pytest.skip("needs Debian's tor and tor-gencert")
    from kistexp.localnet import LocalNetwork, NetworkSpec
    from kistexp.localnet.network import free_base_port

    root = tmp_path_factory.mktemp("measure")
    params = (("KISTSchedRunInterval", CONSENSUS_KIST),)
    spec = NetworkSpec(authorities=3, relays=2, exits=1, clients=2, base_port=free_base_port(8),
                       consensus_params=(params, params, params),
                       role_options=(("exit", f"KISTSchedRunInterval {PINNED_EXIT_MS} msec"),))
    net = LocalNetwork.create(root / "net", spec)
    client = watch = None
    try:
        net.start()
        net.wait_bootstrapped(60)
        nodes = [n.nickname for n in net.nodes if n.role != "authority"]
        watch = HeldConsensusWatch(net, nodes, root / "out", period_s=1.0)
        watch.start()
        config = MeasurementConfig(out_dir=root / "out", period_s=1.2, transfer_timeout_s=20.0,
                                   interactive_period_s=0.5, interactive_timeout_s=5.0, reconnect_s=1.0)
        client = MeasurementClient(net, config)
        started = dt.datetime.now(dt.timezone.utc)
        client.start()
        time.sleep(30)
        yield net, client, watch, root / "out", started
    finally:
        if client is not None:
            client.stop(10)
        if watch is not None:
            watch.stop(5)
        net.stop()


@pytest.mark.realtor
@pytest.mark.slow
@pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor and tor-gencert")
@pytest.mark.timeout(240)
# stem 1.8 starts its threads with Thread.setDaemon; ControlPort silences that with warnings.catch_warnings,
# which is not thread-safe, and here control connections open in several threads at once
@pytest.mark.filterwarnings("ignore:setDaemon\\(\\) is deprecated:DeprecationWarning")
def test_real_tor_day_files_interactive_watch_and_a_dying_client(measured) -> None:
    net, client, watch, out, started = measured
    client.flush()

    # -- day files: every vantage has successes of all three sizes, 1 MiB slower than 50 KiB
    for vantage in ("client006", "client007"):
        paths = sorted(out.glob(f"*.{vantage}.onionperf.analysis.json"))
        assert paths, f"no day file for {vantage}"
        transfers, circuits, joined = [], [], {}
        for path in paths:
            a = onionperf.load(path)
            assert a.version == (3, 1) and not a.problems, a.problems
            transfers += a.transfers
            circuits += a.circuits
            joined.update(a.stream_circuit)
            raw = json.loads(path.read_text())["data"][vantage]
            assert all(set(c) <= CIRCUIT_KEYS for c in raw["tor"]["circuits"].values())
            assert all(set(s) <= TOR_STREAM_KEYS for s in raw["tor"]["streams"].values())
        ok = [t for t in transfers if t.success]
        assert len(ok) >= 12, [(t.size, t.error) for t in transfers]
        ttlb = {size: [t.ttlb_s for t in ok if t.size == size] for size in (51200, 1048576, 5242880)}
        assert all(ttlb.values()), {k: len(v) for k, v in ttlb.items()}
        assert all(x > 0 for values in ttlb.values() for x in values)
        assert statistics.median(ttlb[1048576]) > statistics.median(ttlb[51200])
        # the tgen stream's local port finds its tor stream and circuit (metrics-sources.md §1.6)
        built = {c.circuit_id for c in circuits}
        matched = [joined.get((vantage, t.local_port)) for t in ok]
        assert sum(1 for cid in matched if cid in built) >= len(ok) - 2, (matched, sorted(built))
        collected = onionperf.samples(a).samples
        assert collected["circuit_build_time_s"] and all(s.value > 0 for s in collected["circuit_build_time_s"])

    # -- quiet-circuit latency: new samples only, each poll
    inst = client.interactive_instrument("client006", watch=watch, param="KISTSchedRunInterval")
    first = inst.poll(dt.datetime.now(dt.timezone.utc))
    assert first.ok, first.problem
    values = [s for _, s in first.samples]
    assert len(values) >= 20 and all(s.value > 0 for s in values)
    assert all(s.labels["source"] == "client006" for s in values)
    assert any(s.param_value == CONSENSUS_KIST for s in values)
    second = inst.poll(dt.datetime.now(dt.timezone.utc))
    assert {s.time for _, s in second.samples}.isdisjoint({s.time for s in values})

    # -- the watch: each relay's and client's consensus, its params, the exit's pinned interval
    snap = watch.snapshot()
    for name, held in snap.items():
        assert held is not None, name
        assert held.valid_after is not None and held.valid_after >= started - dt.timedelta(minutes=1)
        assert held.param("KISTSchedRunInterval") == CONSENSUS_KIST, (name, dict(held.params))
        assert held.pinned_ms == (PINNED_EXIT_MS if name == "exit005" else None), name
    assert (out / "relay003.held-consensus.jsonl").exists()

    # -- one client's tor dies: failed transfers, unhealthy, the watch marks it unreachable
    before = client.health()["client007"]
    assert before.healthy and before.transfers_ok >= 4
    net.stop_node("client007")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        health = client.health()["client007"]
        if health.transfers_failed >= before.transfers_failed + 2 and not health.healthy:
            break
        time.sleep(0.5)
    health = client.health()
    assert not health["client007"].healthy and not health["client007"].control_connected
    assert health["client007"].transfers_failed >= before.transfers_failed + 2, health["client007"]
    assert health["client006"].control_connected, health["client006"]
    assert health["client006"].transfers_ok > health["client006"].transfers_failed, health["client006"]
    time.sleep(1.5)
    assert watch.held("client007") is None and not watch.state("client007").reachable
    t0 = time.monotonic()
    left = client.stop(8.0)
    assert time.monotonic() - t0 < 9.0 and left == ()
    assert not [t for t in threading.enumerate() if t.name.startswith("measure-")]
    path = client.day_file("client007")
    failed = [t for t in onionperf.load(path).transfers if not t.success]
    assert len(failed) >= 2 and {t.error for t in failed} <= {"PROXY", "READEOF", "READ", "TIMEOUT"}
    inst.poll(dt.datetime.now(dt.timezone.utc))  # what client006 probed while client007 died
    time.sleep(1.0)  # two probe periods: a stopped client writes nothing more
    assert inst.poll(dt.datetime.now(dt.timezone.utc)).samples == ()
