"""Importing sources into the store: kind detection, live sources, labels and values."""

from __future__ import annotations

import datetime as dt
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kistexp.expdir import ExperimentDir
from kistexp.metrics import importer
from kistexp.metrics.store import MetricStore

UTC = dt.timezone.utc


class VirtualClock:
    """Time that moves only when slept through (so a 60 s interval takes no time)."""

    def __init__(self):
        self.t = dt.datetime(2026, 3, 1, tzinfo=UTC)

    def now(self):
        return self.t

    def monotonic(self):
        return (self.t - dt.datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()

    def sleep_until(self, t):
        self.t = max(self.t, t)


@pytest.fixture
def store(tmp_path):
    exp = ExperimentDir.create(tmp_path / "exp")
    yield MetricStore(exp.db)
    exp.close()


def test_detect_kind(tmp_path, onionperf_hk5, consensus_path, microdesc_consensus_path):
    assert importer.detect_kind("http://127.0.0.1:9035/metrics") == "metricsport"
    assert importer.detect_kind("proc:123") == "proc"
    assert importer.detect_kind(str(onionperf_hk5)) == "onionperf"
    assert importer.detect_kind(str(consensus_path)) == "consensus-archive"
    assert importer.detect_kind(str(microdesc_consensus_path)) == "consensus-archive"
    assert importer.detect_kind(str(tmp_path)) == "consensus-archive"
    assert importer.detect_kind("x.csv") == "operator-report"
    with pytest.raises(importer.SourceKindError, match="no such file"):
        importer.detect_kind(str(tmp_path / "missing"))


def test_metricsport_url_import_with_labels_and_value(store):
    count = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            count["n"] += 1
            body = (f"# TYPE tor_relay_traffic_bytes counter\ntor_relay_traffic_bytes{{direction=\"read\"}} "
                    f"{count['n'] * 6000}\ntor_relay_traffic_bytes{{direction=\"written\"}} 0\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        opts = importer.ImportOptions(labels={"relay": "A" * 40, "relay_class": "guard"}, param_value=3,
                                      scrapes=3, interval_s=60)
        result = importer.import_source(store, url, opts=opts, clock=VirtualClock())
    finally:
        server.shutdown()
    assert result.kind == "metricsport" and result.samples["relay_bandwidth_bytes_per_s"] == 2
    got = store.select("relay_bandwidth_bytes_per_s", labels={"relay_class": "guard"}, param_value=3)
    assert [s.value for s in got] == [100.0, 100.0]  # 6000 B per 60 s
    assert [s.time.minute for s in got] == [1, 2]
    with pytest.raises(importer.SourceKindError, match="--scrapes must be at least 2"):
        importer.import_source(store, url, opts=importer.ImportOptions(scrapes=1))


def test_proc_import_of_this_process(store):
    opts = importer.ImportOptions(labels={"node": "pytest"}, scrapes=2, interval_s=0.2)
    result = importer.import_source(store, f"proc:{os.getpid()}", opts=opts)
    assert result.samples == {"relay_rss_bytes": 2, "relay_cpu_utilization": 1}
    (cpu,) = store.select("relay_cpu_utilization", labels={"node": "pytest"})
    assert 0.0 <= cpu.value < 2.5
