"""Live instruments against loopback servers: the real OnionPerf day file served as it grows
during the day, MetricsPort and exporter scrapes, /proc, a CollecTor-style consensus archive,
and servers that refuse, hang, trickle, flood, lie or fail. Every poll must answer within its
bound with samples or a one-line problem, never a traceback."""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import ipaddress
import json
import lzma
import math
import os
import re
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import RawServer, free_port

from kistexp.dirauth.documents import load_key_certificates
from kistexp.metrics.collectors import httpfetch
from kistexp.metrics.collectors import prometheus as prom
from kistexp.metrics.collectors.onionperf import Limits as AnalysisLimits
from kistexp.metrics.instruments import (
    ArchiveLimits,
    ConsensusArchivePoller,
    MetricsPortInstrument,
    OnionPerfInstrument,
    OnionPerfLimits,
    ProcInstrument,
    PrometheusInstrument,
    SourceError,
    parse_source,
)

UTC = dt.timezone.utc
JUNE1 = dt.datetime(2021, 6, 1, tzinfo=UTC)
DAY_FILE = "/2021-06-01.op-hk6a.onionperf.analysis.json.xz"
# Fast bounds for the hostile cases: 1 s per attempt, one retry, 4 s per poll.
QUICK = OnionPerfLimits(timeout_s=1.0, retries=1, backoff_s=0.05, backoff_max_s=0.1, poll_s=4.0)
# The signers of the 2022 consensus (tor 0.4.7.10's nine; see test_collector_consensus_archive.py).
PINNED_2022 = ("D586D18309DED4CD6D57C18FDB97EFA96D330566", "14C131DFC5C6F93646BE72FA1401C02A8DF2E8B4",
               "E8A9C45EDE6D711294FADF8E7951F4DE6CA56B58", "ED03BB616EB2F60BEC80151114BB25CEF515B226",
               "0232AF901C31A04EE9848595AF9BB7620D4C5B2E", "49015F787433103580E3B66A1707A00E60F2D15B",
               "EFCBE720AB3A82B99F9E953CD5BF50F7EEFC7B97", "23D15D965BC35114467363C165C4F724B64B4F66",
               "27102BC123E7AF1D4741AE047E160C91ADC76B21")


# --- servers ------------------------------------------------------------------------------------

class FileServer:
    """Serves bytes by path over HTTP/1.0 with ETag and Last-Modified, answering conditional
    requests with 304 (unless ``conditional`` is off); logs (path, status) of every request."""

    def __init__(self, conditional: bool = True) -> None:
        self.files: dict[str, tuple[bytes, str, str]] = {}
        self.log: list[tuple[str, int]] = []
        self.conditional = conditional
        self._stamp = 1622505600  # each put is one second later: a distinct Last-Modified
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                entry = server.files.get(self.path)
                if entry is None:
                    return self._answer(404, b"not found", {})
                body, etag, modified = entry
                if server.conditional:
                    since = self.headers.get("If-Modified-Since")
                    if self.headers.get("If-None-Match") == etag or (
                            since and email.utils.parsedate_to_datetime(since)
                            >= email.utils.parsedate_to_datetime(modified)):
                        return self._answer(304, b"", {"ETag": etag})
                    return self._answer(200, body, {"ETag": etag, "Last-Modified": modified})
                return self._answer(200, body, {})

            def _answer(self, status, body, headers):
                server.log.append((self.path, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if status != 304:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def put(self, path: str, body: bytes) -> None:
        self._stamp += 1
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + f'-{self._stamp}"'
        self.files[path] = (body, etag, email.utils.formatdate(self._stamp, usegmt=True))

    def statuses(self, path: str) -> list[int]:
        return [s for p, s in self.log if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(kind=FileServer, *args, **kwargs):
        made.append(kind(*args, **kwargs))
        return made[-1]
    yield make
    for s in made:
        s.close()


# --- OnionPerf: the real day file as it grows -----------------------------------------------------

@pytest.fixture(scope="module")
def hk6a_doc(onionperf_hk6a):
    return json.loads(lzma.decompress(onionperf_hk6a.read_bytes()))


@pytest.fixture(scope="module")
def hk5_doc(onionperf_hk5):
    return json.loads(lzma.decompress(onionperf_hk5.read_bytes()))


def day_until(doc: dict, cutoff: float) -> dict:
    """The analysis file as it stood at unix time ``cutoff``: the tgen streams that had ended,
    the circuits launched and the tor streams ended by then."""
    out = {**doc, "data": {}}
    for source, body in doc["data"].items():
        tor = body["tor"]
        out["data"][source] = {
            **body,
            "tgen": {"streams": {k: s for k, s in body["tgen"]["streams"].items() if s["unix_ts_end"] <= cutoff}},
            "tor": {**tor, "circuits": {k: c for k, c in tor["circuits"].items() if c["unix_ts_start"] < cutoff},
                    "streams": {k: s for k, s in tor["streams"].items() if s.get("unix_ts_end", 0) <= cutoff}},
        }
    return out


def xz(doc: dict) -> bytes:
    return lzma.compress(json.dumps(doc).encode(), preset=0)


def built_between(doc: dict, lo: float, hi: float) -> int:
    """Circuits of the raw file with a build time, launched in [lo, hi): computed from the JSON
    itself, not by the collector."""
    return sum(1 for body in doc["data"].values() for c in body["tor"]["circuits"].values()
               if "buildtime_seconds" in c and lo <= c["unix_ts_start"] < hi)


def values(reading, metric: str) -> list[float]:
    return [s.value for m, s in reading.samples if m == metric]


def at(hours: float) -> dt.datetime:
    return JUNE1 + dt.timedelta(hours=hours)


def test_onionperf_day_file_growing_over_http(servers, hk6a_doc):
    srv = servers()
    inst = OnionPerfInstrument("op-hk6a", srv.url + "/recent/onionperf/")
    path = "/recent/onionperf" + DAY_FILE
    midnight = JUNE1.timestamp()
    cut1, cut2 = midnight + 60, midnight + 2 * 3600  # 00:01 and 02:00
    cuts = [0.0, cut1, cut2, math.inf]

    # 00:00:30: nothing written yet, half an hour into the day: healthy, nothing
    r = inst.poll(at(0.5 / 60))
    assert r.ok and r.samples == () and r.kind == "onionperf" and r.instrument == "onionperf:op-hk6a"

    srv.put(path, xz(day_until(hk6a_doc, cut1)))
    r1 = inst.poll(at(1 / 60))
    assert r1.ok, r1.problem
    assert values(r1, "client_ttlb_5mib_s") == [9.095904, 10.992984]
    assert values(r1, "client_transfer_failure_ratio") == [0.0, 0.0]
    assert len(values(r1, "circuit_build_time_s")) == built_between(hk6a_doc, cuts[0], cuts[1])
    for _metric, s in r1.samples:
        assert s.labels["instance"] == "onionperf:op-hk6a" and s.labels["source"] == "op-hk6a"
    ttlb = next(s for m, s in r1.samples if m == "client_ttlb_5mib_s")
    assert ttlb.labels["server"] == "public" and ttlb.labels["size"] == "5242880"

    srv.put(path, xz(day_until(hk6a_doc, cut2)))
    r2 = inst.poll(at(2))
    assert r2.ok, r2.problem
    assert values(r2, "client_ttlb_5mib_s") == [20.517444, 10.787324]
    # the onion TIMEOUT at 01:29:46 is a failure, never a download time
    assert values(r2, "client_transfer_failure_ratio") == [0.0, 0.0, 1.0]
    assert len(values(r2, "circuit_build_time_s")) == built_between(hk6a_doc, cuts[1], cuts[2])

    # the day's last transfers land after midnight: at 00:10 the next day yesterday's file is read
    srv.put(path, xz(hk6a_doc))
    r3 = inst.poll(at(24 + 1 / 6))
    assert r3.ok, r3.problem  # today's (2021-06-02) file missing 10 minutes into the day is no problem
    assert values(r3, "client_ttlb_5mib_s") == [10.061804]
    assert len(values(r3, "circuit_build_time_s")) == built_between(hk6a_doc, cuts[2], cuts[3])
    total = sum(len(values(r, "circuit_build_time_s")) for r in (r1, r2, r3))
    assert total == 5841  # every circuit with a build time (metrics-sources.md §1.8), each once

    # unchanged: the server answers 304, a healthy poll with nothing new
    before = srv.statuses(path).count(304)
    r4 = inst.poll(at(24 + 0.25))
    assert r4.ok and r4.samples == () and srv.statuses(path).count(304) == before + 1

    # the same file re-written (new ETag and date): fetched again, nothing counted twice
    srv.put(path, xz(hk6a_doc))
    r5 = inst.poll(at(24 + 0.3))
    assert r5.ok and r5.samples == () and srv.statuses(path)[-1] == 200

    # past the previous-day window yesterday's keys are dropped; a missing today is now a problem
    r6 = inst.poll(at(24 + 4))
    assert not r6.ok and "2021-06-02.op-hk6a.onionperf.analysis.json" in r6.problem
    assert "no file for 2021-06-02" in r6.problem and "\n" not in r6.problem
    assert list(inst._days) == [dt.date(2021, 6, 2)]
    inst.close()


def test_onionperf_server_without_validators_is_not_double_counted(servers, hk6a_doc):
    srv = servers(FileServer, conditional=False)
    srv.put(DAY_FILE, xz(day_until(hk6a_doc, JUNE1.timestamp() + 100)))
    first = OnionPerfInstrument("op-hk6a", srv.url)
    r1 = first.poll(at(12))
    assert values(r1, "client_ttlb_5mib_s") == [9.095904, 10.992984, 20.517444]
    again = first.poll(at(12.1))  # the whole file again, no 304: nothing new
    assert again.ok and again.samples == ()
    srv.put(DAY_FILE, xz(hk6a_doc))
    r2 = first.poll(at(12.2))
    assert values(r2, "client_ttlb_5mib_s") == [10.787324, 10.061804]
    # a second instrument is a second view: it sees the whole day once, or what came after ``since``
    other = OnionPerfInstrument("op-hk6a", srv.url, name="onionperf:second")
    assert len(values(other.poll(at(12.3)), "client_ttlb_5mib_s")) == 5
    late = OnionPerfInstrument("op-hk6a", srv.url, name="onionperf:late", since=at(1))
    r = late.poll(at(12.3))
    assert values(r, "client_ttlb_5mib_s") == [10.061804] and values(r, "client_transfer_failure_ratio") == [1.0, 0.0]
    assert min(s.time for _, s in r.samples) >= at(1)


def test_onionperf_local_directory(tmp_path, hk5_doc):
    day = dt.datetime(2021, 1, 1, tzinfo=UTC)
    streams = hk5_doc["data"]["op-hk5"]["tgen"]["streams"]
    ends = sorted(s["unix_ts_end"] for s in streams.values())
    target = tmp_path / "2021-01-01.op-hk5.onionperf.analysis.json"
    target.write_text(json.dumps(day_until(hk5_doc, ends[1])))
    inst = OnionPerfInstrument("op-hk5", tmp_path)
    r1 = inst.poll(day + dt.timedelta(hours=12))
    assert r1.ok, r1.problem
    assert values(r1, "client_ttlb_5mib_s") == [34.725328, 11.817973]  # in start order: onion, public
    assert inst.poll(day + dt.timedelta(hours=12.1)).samples == ()  # same size, mtime, inode
    target.write_text(json.dumps(hk5_doc))
    r2 = inst.poll(day + dt.timedelta(hours=13))
    assert values(r2, "client_ttlb_5mib_s") == [18.613478, 26.635889, 11.187625]
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, content the same
    r3 = inst.poll(day + dt.timedelta(hours=14))
    assert r3.ok and r3.samples == ()


def test_onionperf_bad_records_dropped_as_problems(servers, hk5_doc):
    doc = json.loads(json.dumps(hk5_doc))
    streams = doc["data"]["op-hk5"]["tgen"]["streams"]
    keys = sorted(streams, key=lambda k: streams[k]["unix_ts_start"])
    streams[keys[0]]["unix_ts_start"] = float("nan")  # json.dumps writes NaN, json.loads reads it
    streams[keys[2]]["unix_ts_start"] = -5.0
    srv = servers()
    srv.put("/2021-01-01.op-hk5.onionperf.analysis.json", json.dumps(doc).encode())
    inst = OnionPerfInstrument("op-hk5", srv.url)
    r = inst.poll(dt.datetime(2021, 1, 1, 12, tzinfo=UTC))
    assert values(r, "client_ttlb_5mib_s") == [11.817973, 26.635889, 11.187625]
    assert all(math.isfinite(s.value) and s.value >= 0 for _, s in r.samples)
    assert "record skipped" in r.problem and "(and 1 more problem)" in r.problem
    assert "2021-01-01.op-hk5.onionperf.analysis.json" in r.problem
    # the .xz name was tried first and was not there; the plain name is then kept
    assert srv.statuses("/2021-01-01.op-hk5.onionperf.analysis.json.xz") == [404]
    again = inst.poll(dt.datetime(2021, 1, 1, 12, 5, tzinfo=UTC))
    assert again.ok and again.samples == ()  # 304; the bad records were reported once
    assert srv.statuses("/2021-01-01.op-hk5.onionperf.analysis.json.xz") == [404]


def _never_answers(server, conn):
    server.stop.wait(10)


def _trickles_headers(server, conn):
    for byte in b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n":
        if server.stop.wait(0.5):
            return
        server.send(conn, bytes([byte]))


def _floods(server, conn):
    server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
    chunk = b"\xfd7zXZ\x00" + b"x" * (1024 * 1024 - 6)
    for _ in range(100):  # 100 MB if the client kept reading
        if server.stop.is_set():
            return
        server.send(conn, chunk)


def _declares_100mb(server, conn):
    server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Length: 100000000\r\n\r\n")
    server.stop.wait(5)


def _garbage_body(server, conn):
    server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Length: 23\r\n\r\nthis is not an xz file!")


def _garbage_answer(server, conn):
    server.send(conn, b"\x00\xff\x13 SSH-2.0-OpenSSH garbage\r\n\r\n")


def _fails(server, conn):
    server.send(conn, b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize("handler, expected", [
    (None, r"ConnectError: .* \(after 2 attempts\)"),
    (_never_answers, r"no answer within 1 s \(after 2 attempts\)"),
    (_trickles_headers, r"no answer within 1 s \(after 2 attempts\)"),
    (_floods, r"answer is over the 4194304-byte limit"),
    (_declares_100mb, r"Content-Length 100000000 is over the 4194304-byte limit"),
    (_garbage_body, r"not a valid xz file"),
    (_garbage_answer, r"not a complete HTTP answer"),
    (_fails, r"HTTP 500 Internal Server Error \(after 2 attempts\)"),
], ids=["unreachable", "never-answers", "trickles-headers", "100MB-body", "declares-100MB", "garbage-body",
        "garbage-answer", "http-500"])
def test_onionperf_hostile_servers_are_one_line_problems(servers, handler, expected):
    if handler is None:
        base = f"http://127.0.0.1:{free_port()}"
        server = None
    else:
        server = servers(RawServer, handler)
        base = server.url
    limits = OnionPerfLimits(timeout_s=QUICK.timeout_s, retries=QUICK.retries, backoff_s=QUICK.backoff_s,
                             backoff_max_s=QUICK.backoff_max_s, poll_s=QUICK.poll_s,
                             analysis=AnalysisLimits(max_compressed=4 * 1024 * 1024))
    inst = OnionPerfInstrument("op-hk6a", base, limits=limits)
    t0 = time.monotonic()
    r = inst.poll(at(12))
    elapsed = time.monotonic() - t0
    assert r.samples == () and not r.ok
    assert re.search(expected, r.problem), r.problem
    assert r.problem.startswith(base + DAY_FILE) and "\n" not in r.problem and "Traceback" not in r.problem
    assert elapsed < QUICK.poll_s + 0.5
    if server is not None:
        assert server.sent < 20 * 1024 * 1024  # the 100 MB were never all read


def test_onionperf_poll_bound_holds_across_files(servers):
    # yesterday's and today's file both on a server that never answers: the poll's own bound
    # (not 2 files x 2 attempts x timeout) ends it
    server = servers(RawServer, _never_answers)
    limits = OnionPerfLimits(timeout_s=1.0, retries=1, backoff_s=0.05, backoff_max_s=0.1, poll_s=1.5)
    inst = OnionPerfInstrument("op-hk6a", server.url, limits=limits)
    t0 = time.monotonic()
    r = inst.poll(at(0.5))
    assert time.monotonic() - t0 < 2.2
    assert not r.ok and "2021-05-31.op-hk6a.onionperf.analysis.json.xz: no answer within" in r.problem
    assert "2021-06-01.op-hk6a.onionperf.analysis.json.xz: not fetched: the poll's time bound was used up" in r.problem


def _self_signed(tmp_path):
    """A certificate for 127.0.0.1 signed by itself (its own CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kistexp test")])
    now = dt.datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_https_is_verified_and_bounded(tmp_path, servers, hk5_doc):
    cert_file, key_file = _self_signed(tmp_path)
    srv = servers()
    srv.put("/2021-01-01.op-hk5.onionperf.analysis.json.xz", xz(hk5_doc))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert_file, key_file)
    srv.httpd.socket = server_ctx.wrap_socket(srv.httpd.socket, server_side=True)
    base = srv.url.replace("http://", "https://")
    # a certificate nobody vouches for: refused (verification is on), one line, no samples
    r = OnionPerfInstrument("op-hk5", base, limits=QUICK).poll(dt.datetime(2021, 1, 1, 12, tzinfo=UTC))
    assert not r.ok and r.samples == () and "CERTIFICATE_VERIFY_FAILED" in r.problem
    # with its CA the same fetch goes through the same deadline sockets
    answer = httpfetch.get(base + "/2021-01-01.op-hk5.onionperf.analysis.json.xz",
                           ssl_context=ssl.create_default_context(cafile=str(cert_file)))
    assert answer.status == 200 and lzma.decompress(answer.body).startswith(b"{")


# --- MetricsPort ------------------------------------------------------------------------------------

class StepClock:
    def __init__(self, start: dt.datetime) -> None:
        self.t = start

    def now(self) -> dt.datetime:
        return self.t

    def monotonic(self) -> float:
        return self.t.timestamp()


def metricsport_text(read: int, written: int, limit_hits: int = 0, oom: int = 0) -> bytes:
    return (f"# HELP tor_relay_traffic_bytes Traffic related counters\n"
            f"# TYPE tor_relay_traffic_bytes counter\n"
            f'tor_relay_traffic_bytes{{direction="read"}} {read}\n'
            f'tor_relay_traffic_bytes{{direction="written"}} {written}\n'
            f"# TYPE tor_relay_load_global_rate_limit_reached_total counter\n"
            f'tor_relay_load_global_rate_limit_reached_total{{side="read"}} {limit_hits}\n'
            f'tor_relay_load_global_rate_limit_reached_total{{side="write"}} 0\n'
            f"# TYPE tor_relay_load_oom_bytes_total counter\n"
            f'tor_relay_load_oom_bytes_total{{subsys="cell"}} {oom}\n').encode()


def test_metricsport_baseline_rates_reset_and_duplicates(servers):
    srv = servers()
    clock = StepClock(at(12))
    inst = MetricsPortInstrument("A" * 40, srv.url + "/metrics", clock=clock)
    assert inst.name == "metricsport:" + "A" * 40

    srv.put("/metrics", metricsport_text(1000, 5000))
    first = inst.poll(clock.now())
    assert first.ok and first.samples == ()  # the baseline

    clock.t += dt.timedelta(seconds=60)
    srv.put("/metrics", metricsport_text(7000, 65000, limit_hits=2, oom=4096))
    r = inst.poll(clock.now())
    assert r.ok, r.problem
    got = {m: s for m, s in r.samples}
    assert got["relay_bandwidth_bytes_per_s"].value == (6000 + 60000) / 60
    assert got["relay_global_rate_limit_reached"].value == 2 * 3600 / 60
    assert got["relay_oom_bytes"].value == 4096
    assert got["relay_oom_bytes"].labels == {"relay": "A" * 40, "instance": inst.name}

    # tor restarted: every counter went back; the increase since the restart, never negative
    clock.t += dt.timedelta(seconds=60)
    srv.put("/metrics", metricsport_text(86, 600))
    r = inst.poll(clock.now())
    assert r.ok and dict(r.samples)["relay_bandwidth_bytes_per_s"].value == (86 + 600) / 60
    assert all(s.value >= 0 for _, s in r.samples)

    # the read series given twice with the same value: counted once, not summed
    clock.t += dt.timedelta(seconds=60)
    text = metricsport_text(686, 600)
    srv.put("/metrics", text + b'tor_relay_traffic_bytes{direction="read"} 686\n')
    r = inst.poll(clock.now())
    assert dict(r.samples)["relay_bandwidth_bytes_per_s"].value == 600 / 60
    assert "given twice; repeat ignored" in r.problem

    # ... twice with different values: the family is left out, no bandwidth sample at all
    clock.t += dt.timedelta(seconds=60)
    srv.put("/metrics", metricsport_text(1286, 600) + b'tor_relay_traffic_bytes{direction="read"} 99999999\n')
    r = inst.poll(clock.now())
    assert "relay_bandwidth_bytes_per_s" not in dict(r.samples)
    assert "no tor_relay_traffic_bytes in the answer" in r.problem
    assert "given twice with different values" in r.problem


def test_metricsport_limits_and_hostile_endpoints(servers):
    srv = servers()
    clock = StepClock(at(12))
    # a million series: past the 4 MiB body cap; with a larger cap, past the 50k-sample limit
    million = b"".join(b'tor_relay_x{i="%d"} 1\n' % i for i in range(1_000_000))
    srv.put("/metrics", million)
    r = MetricsPortInstrument("relay1", srv.url + "/metrics", clock=clock).poll(clock.now())
    assert not r.ok and "over the 4194304-byte limit" in r.problem
    t0 = time.monotonic()
    big = prom.Limits(max_bytes=64 * 1024 * 1024)
    r = MetricsPortInstrument("relay1", srv.url + "/metrics", clock=clock, limits=big).poll(clock.now())
    assert not r.ok and "over 50000 samples" in r.problem and r.samples == ()
    assert time.monotonic() - t0 < 10

    # something that answers Prometheus text, but is not tor
    srv.put("/other", b"# TYPE up gauge\nup 1\n")
    r = MetricsPortInstrument("relay1", srv.url + "/other", clock=clock).poll(clock.now())
    assert not r.ok and "not a tor MetricsPort?" in r.problem

    # the shared fetch's total deadline against headers trickled one byte every 0.5 s
    server = servers(RawServer, _trickles_headers)
    t0 = time.monotonic()
    r = MetricsPortInstrument("relay1", server.url + "/metrics", clock=clock,
                              limits=prom.Limits(timeout_s=1.0)).poll(clock.now())
    assert time.monotonic() - t0 < 1.8
    assert r.problem == f"{server.url}/metrics: no answer within 1 s"

    r = MetricsPortInstrument("relay1", f"http://127.0.0.1:{free_port()}/metrics", clock=clock).poll(clock.now())
    assert not r.ok and "ConnectError" in r.problem


# --- /proc -------------------------------------------------------------------------------------------

def test_proc_instrument_of_a_child_until_it_exits():
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(10000))"])
    try:
        inst = ProcInstrument("relay1", child.pid)
        first = inst.poll(at(12))
        assert first.ok and [m for m, _ in first.samples] == ["relay_rss_bytes"]
        time.sleep(0.3)
        r = inst.poll(at(12))
        got = dict(r.samples)
        assert r.ok and 0.0 <= got["relay_cpu_utilization"].value < 2.5 and got["relay_rss_bytes"].value > 1e6
        assert got["relay_cpu_utilization"].labels == {"relay": "relay1", "instance": "proc:relay1"}
    finally:
        child.kill()
        child.wait()
    r = inst.poll(at(12))
    assert not r.ok and r.samples == () and f"/proc/{child.pid}: no such process" in r.problem


def _fake_proc(root, pid: int, name: str, start: int, utime: int, rss_kb: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 10 + [str(utime), "0"] + ["0"] * 6 + [str(start)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")
    (d / "status").write_text(f"Name:\t{name}\nVmRSS:\t{rss_kb} kB\nThreads:\t3\n")


def test_proc_pid_reused_by_another_program_is_a_problem(tmp_path):
    _fake_proc(tmp_path, 4242, "tor", start=1000, utime=100, rss_kb=47688)
    inst = ProcInstrument("relay1", 4242, proc=tmp_path, expect_name="tor")
    assert inst.poll(at(12)).ok
    assert dict(inst.poll(at(12)).samples)["relay_rss_bytes"].value == 47688 * 1024
    _fake_proc(tmp_path, 4242, "bash", start=5000, utime=3, rss_kb=2000)  # tor gone, pid reused
    for _ in range(2):  # and it stays a problem: no samples of the wrong process, ever
        r = inst.poll(at(12))
        assert r.samples == () and "pid 4242 now belongs to another process ('bash'" in r.problem
    _fake_proc(tmp_path, 77, "bash", start=1, utime=1, rss_kb=1)
    r = ProcInstrument("relay1", 77, proc=tmp_path, expect_name="tor").poll(at(12))
    assert r.samples == () and "process 'bash' is not 'tor'" in r.problem


# --- process-exporter -------------------------------------------------------------------------------

def exporter_text(cpu_user: float, rss: int, group: str = "tor") -> bytes:
    return (f"# TYPE namedprocess_namegroup_cpu_seconds_total counter\n"
            f'namedprocess_namegroup_cpu_seconds_total{{groupname="{group}",mode="user"}} {cpu_user}\n'
            f'namedprocess_namegroup_cpu_seconds_total{{groupname="{group}",mode="system"}} 1\n'
            f"# TYPE namedprocess_namegroup_memory_bytes gauge\n"
            f'namedprocess_namegroup_memory_bytes{{groupname="{group}",memtype="resident"}} {rss}\n'
            f"# TYPE namedprocess_namegroup_oldest_start_time_seconds gauge\n"
            f'namedprocess_namegroup_oldest_start_time_seconds{{groupname="{group}"}} 1700000000\n').encode()


def test_prometheus_process_exporter(servers):
    srv = servers()
    clock = StepClock(at(12))
    srv.put("/metrics", exporter_text(10, 50_000_000))
    inst = PrometheusInstrument("relay1", srv.url + "/metrics", clock=clock)
    first = inst.poll(clock.now())
    assert first.ok and [m for m, _ in first.samples] == ["relay_rss_bytes"]
    clock.t += dt.timedelta(seconds=60)
    srv.put("/metrics", exporter_text(40, 60_000_000))
    got = dict(inst.poll(clock.now()).samples)
    assert got["relay_cpu_utilization"].value == 0.5 and got["relay_rss_bytes"].value == 60_000_000
    assert got["relay_cpu_utilization"].labels["instance"] == "prometheus:relay1"
    srv.put("/other", exporter_text(1, 1, group="nginx"))
    r = PrometheusInstrument("relay1", srv.url + "/other", clock=clock).poll(clock.now())
    assert not r.ok and "process-exporter has no group 'tor'" in r.problem
    srv.put("/neither", b"# TYPE up gauge\nup 1\n")
    r = PrometheusInstrument("relay1", srv.url + "/neither", clock=clock).poll(clock.now())
    assert not r.ok and "neither process-exporter" in r.problem


# --- consensus archive -------------------------------------------------------------------------------

LISTING = "/recent/relay-descriptors/consensuses/"


def listing_html(names) -> bytes:
    rows = "".join(f'<tr><td><a href="{n}">{n}</a></td></tr>\n' for n in names)
    return f"<html><body><table>\n<tr><td><a href=\"../\">Parent</a></td></tr>\n{rows}</table></body></html>".encode()


def test_consensus_archive_over_http(servers, consensus_path, certs_path):
    srv = servers()
    real = b"@type network-status-consensus-3 1.0\n" + consensus_path.read_bytes()
    good, misnamed = "2022-11-19-10-00-00-consensus", "2022-11-19-11-00-00-consensus"
    old = "2022-11-18-10-00-00-consensus"
    srv.put(LISTING + good, real)
    srv.put(LISTING + misnamed, real)
    # links that lead elsewhere are never followed: only names of the listed form, under the listing
    srv.put(LISTING, listing_html([good, old, "http://127.0.0.1:1/2022-11-19-09-00-00-consensus-x",
                                   "../../etc/passwd", "2022-13-45-10-00-00-consensus"]))
    poller = ConsensusArchivePoller(srv.url, certificates=load_key_certificates(certs_path), trusted=PINNED_2022)
    r = poller.poll(dt.datetime(2022, 11, 19, 10, 30, tzinfo=UTC))
    assert r.ok, r.problem
    (c,) = r.consensuses
    assert c.valid_after == dt.datetime(2022, 11, 19, 10, tzinfo=UTC)
    assert c.params["KISTSchedRunInterval"] == 2 and len(c.params) == 33
    assert len(c.signers) == 8 and "dannenberg" not in c.signer_nicknames and "moria1" in c.signer_nicknames
    assert c.record.verified and c.record.n_relays == 6088
    assert srv.statuses(LISTING + old) == []  # older than the first poll's look-back: not fetched

    again = poller.poll(dt.datetime(2022, 11, 19, 10, 45, tzinfo=UTC))
    assert again.ok and again.consensuses == ()
    srv.put(LISTING, listing_html([good, misnamed]))
    r = poller.poll(dt.datetime(2022, 11, 19, 11, 30, tzinfo=UTC))
    assert r.consensuses == () and "is not the time its name says" in r.problem
    assert poller.poll(dt.datetime(2022, 11, 19, 11, 45, tzinfo=UTC)).ok  # refused once, not fetched again
    assert srv.statuses(LISTING + misnamed) == [200]


def test_consensus_archive_local_directory_and_failures(tmp_path, consensus_path, certs_path, servers):
    folder = tmp_path / "recent" / "relay-descriptors" / "consensuses"
    folder.mkdir(parents=True)
    (folder / "2022-11-19-10-00-00-consensus").write_bytes(consensus_path.read_bytes())
    certs = load_key_certificates(certs_path)
    at_1030 = dt.datetime(2022, 11, 19, 10, 30, tzinfo=UTC)
    (c,) = ConsensusArchivePoller(tmp_path, certificates=certs, trusted=PINNED_2022).poll(at_1030).consensuses
    assert c.params["cc_alg"] == 2
    # today's nine do not include three of 2022's signers, but 5 of 8 is still a majority
    (c,) = ConsensusArchivePoller(folder, certificates=certs).poll(at_1030).consensuses
    assert len(c.signers) == 5
    # without certificates nothing verifies: a problem, not a consensus
    r = ConsensusArchivePoller(folder, trusted=PINNED_2022).poll(at_1030)
    assert r.consensuses == () and "consensus not verified" in r.problem
    limits = ArchiveLimits(timeout_s=1.0, retries=0, poll_s=2.0)
    r = ConsensusArchivePoller(f"http://127.0.0.1:{free_port()}", limits=limits).poll(at_1030)
    assert not r.ok and "ConnectError" in r.problem and LISTING in r.problem
    server = servers(RawServer, _floods)
    r = ConsensusArchivePoller(server.url, limits=limits).poll(at_1030)
    assert not r.ok and "answer is over the 1048576-byte limit" in r.problem


# --- command-line sources ----------------------------------------------------------------------------

def test_parse_source(tmp_path):
    op = parse_source("onionperf:op-hk6a=http://127.0.0.1:9/recent/onionperf")
    assert isinstance(op, OnionPerfInstrument) and op.name == "onionperf:op-hk6a"
    assert op.location(dt.date(2021, 6, 1)) == "http://127.0.0.1:9/recent/onionperf" + DAY_FILE
    assert parse_source(f"onionperf:op-x={tmp_path}").remote is False
    mp = parse_source("metricsport:$" + "a" * 40 + "=http://127.0.0.1:9035/metrics")
    assert isinstance(mp, MetricsPortInstrument) and mp.labels == {"relay": "A" * 40, "instance": mp.name}
    assert isinstance(parse_source(f"proc:relay1={os.getpid()}"), ProcInstrument)
    assert isinstance(parse_source("prometheus:relay1=https://relay.example.org:9256/metrics"), PrometheusInstrument)
    assert isinstance(parse_source(f"consensus-archive={tmp_path}"), ConsensusArchivePoller)
    bad = {
        "kistexp": "expected one of onionperf:VANTAGE=URL_OR_DIR",
        "snmp:relay1=http://127.0.0.1:1/": "unknown kind 'snmp'",
        "metricsport=http://127.0.0.1:1/": "missing the RELAY name",
        "onionperf:=http://127.0.0.1:1/": "missing the VANTAGE name",
        "onionperf:../x=http://127.0.0.1:1/": "VANTAGE name '../x' is not letters",
        "metricsport:relay1=ftp://127.0.0.1/metrics": "scheme 'ftp'; expected an http:// or https:// URL",
        "metricsport:relay1=127.0.0.1:9035": "expected an http:// or https:// URL",
        "prometheus:relay1=http:///metrics": "names no host",
        "proc:relay1=12x": "PID '12x' is not a process id",
        "proc:relay1=0": "PID '0' is not a process id",
        f"onionperf:op-x={tmp_path / 'missing'}": "is neither an http(s) URL nor a directory",
        "consensus-archive:x=http://127.0.0.1:1/": "consensus-archive takes no name",
        "metricsport:relay1=": "nothing after '='",
    }
    for text, why in bad.items():
        with pytest.raises(SourceError) as err:
            parse_source(text)
        message = str(err.value)
        assert why in message and message.startswith(f"source {text!r}") and "\n" not in message
    with pytest.raises(SourceError) as err:
        parse_source("metricsport:relay1=http://user:hunter2@127.0.0.1:1/metrics")
    assert "hunter2" not in str(err.value) and "credentials" in str(err.value)
