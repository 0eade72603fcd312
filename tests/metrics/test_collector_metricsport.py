"""MetricsPort / Prometheus scraping and /proc process sampling: a real tor relay on
loopback, and servers that hang, drip or answer without end."""

from __future__ import annotations

import datetime as dt
import subprocess
import time

import pytest
from conftest import RawServer, free_port, have_real_tor
from hypothesis import given, settings
from hypothesis import strategies as st

from kistexp.metrics.collectors import CorruptSource, SourceTooLarge
from kistexp.metrics.collectors import metricsport as mp
from kistexp.metrics.collectors import process as pr
from kistexp.metrics.collectors import prometheus as prom

UTC = dt.timezone.utc
T = dt.datetime(2026, 3, 1, tzinfo=UTC)

# Lines of a real scrape of Debian's tor 0.4.9.11 (metrics-sources.md §2.5), with the
# label value with a space tor writes unescaped.
REAL_LINES = """# HELP tor_relay_traffic_bytes Traffic related counters
# TYPE tor_relay_traffic_bytes counter
tor_relay_traffic_bytes{direction="read"} 86
tor_relay_traffic_bytes{direction="written"} 0
# HELP tor_relay_load_socket_total Total number of opened sockets
# TYPE tor_relay_load_socket_total gauge
tor_relay_load_socket_total{state="opened"} 3
tor_relay_load_socket_total 19968
# HELP tor_relay_connections_total Total number of created/rejected connections
# TYPE tor_relay_connections_total counter
tor_relay_connections_total{type="OR listener",direction="initiated",state="created",family="ipv4"} 0
# HELP tor_relay_load_oom_bytes_total Total number of bytes the OOM has freed by subsystem
# TYPE tor_relay_load_oom_bytes_total counter
tor_relay_load_oom_bytes_total{subsys="cell"} 0
tor_relay_load_oom_bytes_total{subsys="dns"} 0
# HELP tor_relay_load_global_rate_limit_reached_total Global rate limit reached
# TYPE tor_relay_load_global_rate_limit_reached_total counter
tor_relay_load_global_rate_limit_reached_total{side="read"} 0
tor_relay_load_global_rate_limit_reached_total{side="write"} 0
"""


def test_parse_real_lines_trusts_type_over_total_suffix():
    e = prom.parse(REAL_LINES, "cap", time=T)
    assert e.problems == ()
    assert e.value("tor_relay_traffic_bytes", direction="read") == 86
    assert e.types["tor_relay_load_socket_total"] == "gauge"
    assert e.value("tor_relay_load_socket_total", state="opened") == 3
    assert e.labelled("tor_relay_connections_total")[0][0]["type"] == "OR listener"


def test_garbage_lines_are_reported_and_the_rest_kept():
    text = REAL_LINES.replace('tor_relay_traffic_bytes{direction="written"} 0\n',
                              'tor_relay_traffic_bytes{direction="written"} 0\nthis is not { a sample\n'
                              "# TYPE tor_broken nonsense\n")
    e = prom.parse(text, "http://127.0.0.1:1/metrics", time=T)
    assert len(e.problems) == 2
    assert e.problems[0].startswith("http://127.0.0.1:1/metrics:5: not a Prometheus sample")
    assert e.problems[1].startswith("http://127.0.0.1:1/metrics:6: malformed TYPE line")
    assert e.value("tor_relay_traffic_bytes") == 86
    assert e.value("tor_relay_load_global_rate_limit_reached_total") == 0


def test_nothing_valid_and_limits():
    with pytest.raises(CorruptSource, match="no valid Prometheus samples"):
        prom.parse("<html>500 Internal Error</html>\n", "u", time=T)
    with pytest.raises(CorruptSource, match="over 3 samples"):
        prom.parse(REAL_LINES, "u", time=T, limits=prom.Limits(max_samples=3))
    long = REAL_LINES + 'tor_x{a="' + "y" * 5000 + '"} 1\n'
    e = prom.parse(long, "u", time=T)
    assert "over the 4096 limit" in e.problems[0] and e.value("tor_relay_traffic_bytes") == 86


def test_rates_between_scrapes_and_counter_reset():
    a = prom.parse(REAL_LINES, "u", time=T)
    b = prom.parse(REAL_LINES.replace("} 86", "} 10086").replace('side="read"} 0', 'side="read"} 2'), "u",
                   time=T + dt.timedelta(seconds=10))
    got = dict((m, s.value) for m, s in mp.between(a, b, {"relay": "A" * 40}, 2))
    assert got == {"relay_bandwidth_bytes_per_s": 1000.0, "relay_global_rate_limit_reached": 720.0,
                   "relay_oom_bytes": 0.0}
    # restart: 10086 -> 40 counts the 40 bytes since the restart, never a negative rate
    c = prom.parse(REAL_LINES.replace("} 86", "} 40"), "u", time=T + dt.timedelta(seconds=20))
    assert dict(mp.between(b, c, {}))["relay_bandwidth_bytes_per_s"].value == 4.0


# --- bounded scraping ---------------------------------------------------------------------

@pytest.fixture
def serve():
    servers = []

    def make(handler):
        servers.append(RawServer(handler))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_hanging_server_times_out(serve):
    s = serve(lambda server, conn: server.stop.wait(30))
    t0 = time.monotonic()
    with pytest.raises(prom.ScrapeError, match=r"no answer within 1 s"):
        prom.scrape(s.url + "/metrics", limits=prom.Limits(timeout_s=1.0))
    assert time.monotonic() - t0 < 2.5


def test_dripping_server_is_cut_at_the_deadline(serve):
    def drip(server, conn):
        server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        while not server.stop.is_set():
            server.send(conn, b"# x\n")
            time.sleep(0.2)
    s = serve(drip)
    t0 = time.monotonic()
    with pytest.raises(prom.ScrapeError, match=r"answer not complete within 1 s"):
        prom.scrape(s.url + "/metrics", limits=prom.Limits(timeout_s=1.0))
    assert time.monotonic() - t0 < 2.5


def test_endless_answer_stops_at_the_size_cap(serve):
    def flood(server, conn):
        server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        chunk = b"tor_relay_traffic_bytes 1\n" * 4096
        while not server.stop.is_set():  # as much as the client will take: 10 GB if it kept reading
            server.send(conn, chunk)
    s = serve(flood)
    t0 = time.monotonic()
    with pytest.raises(SourceTooLarge, match=r"answer is over the 4194304-byte limit"):
        prom.scrape(s.url + "/metrics")
    assert time.monotonic() - t0 < 5


def test_declared_10gb_is_refused_before_reading(serve):
    def big(server, conn):
        server.send(conn, b"HTTP/1.0 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
        server.stop.wait(5)
    s = serve(big)
    with pytest.raises(SourceTooLarge, match="Content-Length 10000000000"):
        prom.scrape(s.url + "/metrics")


def test_refused_and_bad_status(serve):
    port = free_port()
    with pytest.raises(prom.ScrapeError, match=f"127.0.0.1:{port}/metrics: ConnectError"):
        prom.scrape(f"http://127.0.0.1:{port}/metrics")
    s = serve(lambda server, conn: server.send(conn, b"HTTP/1.0 404 Not Found\r\n\r\n"))
    with pytest.raises(prom.ScrapeError, match="HTTP 404 Not Found"):
        prom.scrape(s.url + "/metrics")


# --- process CPU / RSS ------------------------------------------------------------------

def test_proc_of_a_busy_child():
    # the child says when it spins: on a loaded machine its start-up (imports, page faults
    # waiting on the disk) can take longer than the interval measured, which then holds no
    # CPU time at all
    child = subprocess.Popen(
        ["python3", "-c", "print('spinning', flush=True)\nwhile True: pass"],
        stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"spinning\n"
        sampler = pr.ProcessSampler(child.pid, {"node": "busy"})
        first = dict(sampler.poll())
        assert set(first) == {"relay_rss_bytes"} and first["relay_rss_bytes"].value > 1_000_000
        time.sleep(1.5)
        second = dict(sampler.poll())
        # a spinning process uses about one core; less while the other test worker and its
        # tor processes share the machine's two cores, but never nothing and never more than one
        assert 0.1 < second["relay_cpu_utilization"].value <= 1.2
    finally:
        child.kill()
        child.wait()
    with pytest.raises(pr.ProcessGone, match=f"/proc/{child.pid}: no such process"):
        pr.read_proc(child.pid)


EXPORTER = """# HELP namedprocess_namegroup_cpu_seconds_total Cpu user usage in seconds
# TYPE namedprocess_namegroup_cpu_seconds_total counter
namedprocess_namegroup_cpu_seconds_total{groupname="tor",mode="system"} {sys}
namedprocess_namegroup_cpu_seconds_total{groupname="tor",mode="user"} {user}
namedprocess_namegroup_cpu_seconds_total{groupname="sshd",mode="user"} 99
# HELP namedprocess_namegroup_memory_bytes number of bytes of memory in use
# TYPE namedprocess_namegroup_memory_bytes gauge
namedprocess_namegroup_memory_bytes{groupname="tor",memtype="resident"} 4.8832512e+07
namedprocess_namegroup_memory_bytes{groupname="tor",memtype="virtual"} 1.2e+08
# HELP namedprocess_namegroup_oldest_start_time_seconds start time in seconds since 1970/01/01
# TYPE namedprocess_namegroup_oldest_start_time_seconds gauge
namedprocess_namegroup_oldest_start_time_seconds{groupname="tor"} 1.7e+09
"""


def test_process_exporter_format():
    a = prom.parse(EXPORTER.replace("{sys}", "10").replace("{user}", "100"), "pe", time=T)
    b = prom.parse(EXPORTER.replace("{sys}", "12").replace("{user}", "133"), "pe", time=T + dt.timedelta(minutes=1))
    got = dict(pr.exporter_between(a, b, "tor", {"relay": "A" * 40}))
    assert got["relay_cpu_utilization"].value == pytest.approx(35 / 60)
    assert got["relay_rss_bytes"].value == 48832512


# --- a real tor relay ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    if not have_real_tor():
        pytest.skip("Debian's tor is not installed")
    root = tmp_path_factory.mktemp("relay")
    data = root / "data"
    data.mkdir(mode=0o700)
    or_port, metrics_port, closed = free_port(), free_port(), free_port()
    # One DirAuthority on a closed loopback port: the relay never reaches the real network.
    (root / "torrc").write_text(
        f"DataDirectory {data}\nORPort 127.0.0.1:{or_port}\nAssumeReachable 1\nPublishServerDescriptor 0\n"
        f"SocksPort 0\nMetricsPort 127.0.0.1:{metrics_port}\nMetricsPortPolicy accept 127.0.0.1\n"
        f"Nickname kxmetrics\nContactInfo kistexp-test\nLog notice file {root / 'notice.log'}\n"
        f"DirAuthority fake orport={closed} no-v2 v3ident={'A' * 40} 127.0.0.1:{closed} {'B' * 40}\n")
    proc = subprocess.Popen(["tor", "-f", str(root / "torrc")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (data / "fingerprint").exists():
            try:
                prom.scrape(url, limits=prom.Limits(timeout_s=1))
                break
            except prom.ScrapeError:
                pass
        if proc.poll() is not None:
            pytest.fail(f"tor exited: {(root / 'notice.log').read_text()[-500:]}")
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("tor's MetricsPort did not answer within 30 s")
    fingerprint = (data / "fingerprint").read_text().split()[1]
    yield proc, url, fingerprint
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.realtor
def test_scrape_a_real_relay(relay):
    proc, url, fingerprint = relay
    e = prom.scrape(url)
    assert e.problems == ()
    assert e.types["tor_relay_traffic_bytes"] == "counter"
    assert e.value("tor_relay_traffic_bytes", direction="read") is not None
    assert e.value("tor_relay_load_socket_total", state="opened") >= 1
    assert e.types["tor_relay_load_socket_total"] == "gauge"
    assert len(e.samples) >= 20
    collector = mp.MetricsPortCollector(url, {"relay": fingerprint, "relay_class": "middle"})
    assert collector.poll() == []
    time.sleep(1.1)
    got = dict(collector.poll(param_value=2))
    assert set(got) == {"relay_bandwidth_bytes_per_s", "relay_global_rate_limit_reached", "relay_oom_bytes"}
    assert got["relay_bandwidth_bytes_per_s"].value >= 0
    assert got["relay_oom_bytes"].labels["relay"] == fingerprint and got["relay_oom_bytes"].param_value == 2
    # the same tor's CPU and memory from /proc
    snap = pr.read_proc(proc.pid)
    assert snap.rss_bytes > 5_000_000 and snap.threads >= 1 and snap.cpu_s > 0
    sampler = pr.ProcessSampler(proc.pid, {"relay": fingerprint})
    sampler.poll()
    time.sleep(0.5)
    figures = dict(sampler.poll())
    assert 0.0 <= figures["relay_cpu_utilization"].value < 2.0  # an idle relay, at most a core or two
    assert figures["relay_rss_bytes"].value == pytest.approx(snap.rss_bytes, rel=0.5)


NODE = """# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} {idle}
node_cpu_seconds_total{cpu="0",mode="user"} {user}
node_cpu_seconds_total{cpu="0",mode="system"} 5
node_cpu_seconds_total{cpu="1",mode="idle"} {idle}
node_cpu_seconds_total{cpu="1",mode="user"} {user}
node_cpu_seconds_total{cpu="1",mode="system"} 5
# TYPE node_network_receive_bytes_total counter
node_network_receive_bytes_total{device="eth0"} {rx}
node_network_receive_bytes_total{device="lo"} 999999999
# TYPE node_network_transmit_bytes_total counter
node_network_transmit_bytes_total{device="eth0"} {rx}
"""


def test_node_exporter_host_figures():
    def expo(idle, user, rx, sec):
        text = NODE.replace("{idle}", str(idle)).replace("{user}", str(user)).replace("{rx}", str(rx))
        return prom.parse(text, "ne", time=T + dt.timedelta(seconds=sec))
    a, b = expo(1000, 100, 10**9, 0), expo(1030, 130, 10**9 + 6 * 10**6, 60)
    got = dict(pr.exporter_samples(a, b, "tor", {"relay": "A" * 40}))
    assert got["relay_cpu_utilization"].value == pytest.approx(1.0)  # 2 x 30 s of user time in 60 s
    assert got["relay_bandwidth_bytes_per_s"].value == pytest.approx(200_000)  # (6 + 6) MB / 60 s, lo excluded
    assert got["relay_cpu_utilization"].labels["scope"] == "host"
    assert pr.exporter_samples(None, b, "tor", {}) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(REAL_LINES.splitlines()), st.text(max_size=40)), max_size=25))
def test_any_text_is_parsed_or_refused_in_one_line(lines):
    text = "\n".join(lines) + "\n"
    try:
        e = prom.parse(text, "fuzz", time=T)
    except CorruptSource as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz: ")
        return
    assert all(p.startswith("fuzz:") and "\n" not in p for p in e.problems)
