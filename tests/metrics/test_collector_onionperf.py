"""OnionPerf 3.0/3.1/4.0 and tgen analysis files, against the spec's real values
(metrics-sources.md §1.8, §1.9)."""

from __future__ import annotations

import json
import lzma
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kistexp.metrics.collectors import CorruptSource, SourceTooLarge
from kistexp.metrics.collectors import onionperf as op


@pytest.fixture(scope="module")
def hk5(onionperf_hk5):
    return op.load(onionperf_hk5)


@pytest.fixture(scope="module")
def hk6a(onionperf_hk6a):
    return op.load(onionperf_hk6a)


def test_hk5_transfers(hk5):
    assert hk5.type == "onionperf" and hk5.version == (3, 0) and not hk5.has_filters
    assert hk5.measurement_ip == {"op-hk5": "18.163.35.183"}
    assert [t.ttlb_s for t in hk5.transfers] == [34.725328, 11.817973, 18.613478, 26.635889, 11.187625]
    assert [t.server for t in hk5.transfers] == ["onion", "public", "public", "onion", "public"]
    assert [t.ttfb_s for t in hk5.transfers] == [4.134508, 1.129437, 11.376374, 4.29965, 1.49145]
    assert hk5.transfers[0].start.timestamp() == pytest.approx(1609459309.410935, abs=1e-6)
    assert all(t.success and t.size == 5242880 for t in hk5.transfers)
    public = [t.ttlb_s for t in hk5.transfers if t.server == "public"]
    onion = [t.ttlb_s for t in hk5.transfers if t.server == "onion"]
    assert statistics.median(public) == 11.817973
    assert statistics.median(onion) == pytest.approx(30.6806085)
    assert hk5.problems == ()


def test_hk5_tor_metrics_method(hk5):
    assert sorted(op.tor_metrics_times_ms(hk5, 5242880, "public")) == [11190, 11820, 18620]
    assert op.tor_metrics_quartiles(hk5, 5242880, "public") == (11505, 11820, 15220)
    assert op.tor_metrics_quartiles(hk5, 5242880, "onion") == (28662, 30685, 32707)
    assert op.tor_metrics_times_ms(hk5, 51200, "public") == [1510, 11770, 1830]
    assert op.tor_metrics_times_ms(hk5, 51200, "onion") == [4590, 4860]
    assert op.tor_metrics_times_ms(hk5, 1048576, "public") == [3560, 13190, 4000]
    assert op.tor_metrics_times_ms(hk5, 1048576, "onion") == [10050, 9130]


def test_hk5_circuits(hk5):
    assert len(hk5.circuits) == 1038
    built = [c.build_time_s for c in hk5.circuits if c.build_time_s is not None]
    assert len(built) == 897
    assert statistics.median(built) == pytest.approx(1.64, abs=0.005)
    assert sum(c.build_timeout_ms == 1500 for c in hk5.circuits) == 1037
    local = [c.failure_local for c in hk5.circuits if c.failure_local]
    assert {k: local.count(k) for k in set(local)} == {"TIMEOUT": 118, "DESTROYED": 21, "CHANNEL_CLOSED": 5,
                                                       "TORPROTOCOL": 1}
    remote = [c.failure_remote for c in hk5.circuits if c.failure_remote]
    assert {k: remote.count(k) for k in set(remote)} == {"CONNECTFAILED": 11, "CHANNEL_CLOSED": 10}
    # circuits launched before UTC midnight are missing from the day file (§1.6)
    assert hk5.stream_circuit[("op-hk5", 36176)] == 124977
    assert 124977 not in {c.circuit_id for c in hk5.circuits}


def test_hk5_samples(hk5):
    got = op.samples(hk5)
    assert {k: len(v) for k, v in got.samples.items()} == {
        "client_transfer_failure_ratio": 5, "client_ttfb_s": 5, "client_ttlb_50kib_s": 5, "client_ttlb_1mib_s": 5,
        "client_ttlb_5mib_s": 5, "client_throughput_mbytes_per_s": 5, "circuit_build_time_s": 897}
    first = got.samples["client_ttlb_5mib_s"][0]
    assert first.value == 34.725328
    assert dict(first.labels) == {"server": "onion", "size": "5242880", "source": "op-hk5"}
    # 50 KiB of a 5 MiB transfer: the PARTIAL51200 time, s since the start
    assert got.samples["client_ttlb_50kib_s"][0].value == 4.592524
    assert all(s.value == 0.0 for s in got.samples["client_transfer_failure_ratio"])


def test_hk6a_version_31_filters_and_timeout(hk6a):
    assert hk6a.version == (3, 1) and hk6a.has_filters
    assert hk6a.measurement_ip == {"op-hk6a": "18.162.44.244"}
    public = [t.ttlb_s for t in hk6a.transfers if t.server == "public"]
    assert public == [9.095904, 10.992984, 20.517444, 10.787324, 10.061804]
    assert statistics.median(public) == 10.787324
    (timeout,) = [t for t in hk6a.transfers if not t.success]
    assert timeout.server == "onion" and timeout.error == "TIMEOUT" and timeout.ttlb_s is None
    # tgen keeps the errored stream's last-byte time; Tor Metrics counts it as 286020 ms
    assert timeout.last_byte_s == 286.022849 and timeout.read_bytes >= 4975806
    assert op.tor_metrics_times_ms(hk6a, 5242880, "onion") == [286020]
    assert op.tor_metrics_quartiles(hk6a, 5242880, "public") == (10060, 10790, 11000)
    stream = next(t for t in hk6a.transfers if t.stream_id.startswith("64081:"))
    assert stream.partial_s[5242880] == stream.ttlb_s == 20.517444


def test_hk6a_circuits_and_filtered_out(hk6a):
    assert len(hk6a.circuits) == 7175
    assert sum(c.build_time_s is not None for c in hk6a.circuits) == 5841
    built = [c.build_time_s for c in hk6a.circuits if c.build_time_s is not None]
    assert statistics.median(built) == pytest.approx(0.88, abs=0.005)
    assert sum(c.filtered_out for c in hk6a.circuits) == 221
    # what OnionPerf keeps with its filters: streams whose circuit is not filtered out
    kept = op.kept_transfers(hk6a, honour_filters=True)
    assert sorted(t.local_port for t in kept) == [35138, 35794, 42980]
    assert len(op.kept_transfers(hk6a)) == 6
    default = op.samples(hk6a)
    assert len(default.samples["circuit_build_time_s"]) == 5841
    assert len(default.samples["client_transfer_failure_ratio"]) == 6
    assert sum(s.value for s in default.samples["client_transfer_failure_ratio"]) == 1.0
    filtered = op.samples(hk6a, honour_filters=True)
    assert len(filtered.samples["client_transfer_failure_ratio"]) == 3
    assert len(filtered.samples["circuit_build_time_s"]) < 5841


def test_tgen_only_file(tgen_analysis):
    a = op.load(tgen_analysis)
    assert a.type == "tgen" and a.version == (1, 0) and a.circuits == ()
    assert len(a.transfers) == 90
    assert sum(t.success for t in a.transfers) == 73
    assert sum(t.error == "TIMEOUT" for t in a.transfers) == 17
    by = op.tgentools_ttlb(a)
    assert {k: len(v) for k, v in by.items()} == {("public", 51200): 54, ("public", 1048576): 12,
                                                  ("public", 5242880): 4, ("onion", 51200): 1,
                                                  ("onion", 1048576): 1, ("onion", 5242880): 1}
    assert statistics.median(by[("public", 51200)]) == pytest.approx(1.1645655)
    assert statistics.median(by[("public", 1048576)]) == pytest.approx(2.6148695)
    assert statistics.median(by[("public", 5242880)]) == pytest.approx(7.169539)
    assert by[("onion", 5242880)] == [pytest.approx(18.196239)]
    assert len(op.samples(a).samples["client_transfer_failure_ratio"]) == 90


# --- bad input --------------------------------------------------------------------------

def _write_xz(path, doc):
    path.write_bytes(lzma.compress(json.dumps(doc).encode()))
    return path


def test_truncated_xz(tmp_path, onionperf_hk5):
    bad = tmp_path / "trunc.onionperf.analysis.json.xz"
    bad.write_bytes(onionperf_hk5.read_bytes()[:60000])
    with pytest.raises(CorruptSource, match=r"trunc\.onionperf\.analysis\.json\.xz: truncated xz"):
        op.load(bad)


def test_not_xz_and_not_json(tmp_path, onionperf_hk5):
    fake = tmp_path / "x.json.xz"
    fake.write_bytes(b"{not xz at all")
    with pytest.raises(CorruptSource, match=r"x\.json\.xz: not a valid xz file"):
        op.load(fake)
    partial = tmp_path / "partial.json"
    partial.write_bytes(lzma.decompress(onionperf_hk5.read_bytes())[:50000])
    with pytest.raises(CorruptSource, match=r"partial\.json:\d+: not valid JSON") as err:
        op.load(partial)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("version, pattern", [("0.9", "version 0.9 is not supported"),
                                              ("6.0", "version 6.0 is not supported"),
                                              ("three", "version 'three' is not of the form"),
                                              (None, "version None")])
def test_wrong_version(tmp_path, version, pattern):
    f = _write_xz(tmp_path / "v.json.xz", {"type": "onionperf", "version": version, "data": {}})
    with pytest.raises(CorruptSource, match=pattern):
        op.load(f)


def test_wrong_type(tmp_path):
    f = _write_xz(tmp_path / "t.json.xz", {"type": "torperf", "version": "3.0", "data": {}})
    with pytest.raises(CorruptSource, match="key 'type' is 'torperf'"):
        op.load(f)


def test_bad_stream_is_reported_and_the_others_kept(tmp_path, onionperf_hk5):
    doc = json.loads(lzma.decompress(onionperf_hk5.read_bytes()))
    streams = doc["data"]["op-hk5"]["tgen"]["streams"]
    victim = sorted(streams)[0]
    del streams[victim]["time_info"]
    circ = next(iter(doc["data"]["op-hk5"]["tor"]["circuits"]))
    doc["data"]["op-hk5"]["tor"]["circuits"][circ]["unix_ts_start"] = "yesterday"
    a = op.parse(doc, "edited.json")
    assert len(a.transfers) == 4 and len(a.circuits) == 1037
    assert len(a.problems) == 2
    assert a.problems[0].startswith(f"edited.json: data.op-hk5.tgen.streams['{victim}']: missing key 'time_info'")
    assert "tor.circuits" in a.problems[1]


def test_decompression_and_count_limits(tmp_path, onionperf_hk5):
    with pytest.raises(SourceTooLarge, match="decompresses to over 1000000 bytes"):
        op.load(onionperf_hk5, limits=op.Limits(max_raw=1_000_000))
    with pytest.raises(SourceTooLarge, match="over the 1000-byte limit"):
        op.load(onionperf_hk5, limits=op.Limits(max_compressed=1000))
    with pytest.raises(CorruptSource, match="1038 circuits is over the limit of 100"):
        op.load(onionperf_hk5, limits=op.Limits(max_circuits=100))
    with pytest.raises(CorruptSource, match="5 streams is over the limit of 4"):
        op.load(onionperf_hk5, limits=op.Limits(max_streams=4))


def test_xz_bomb_is_stopped_without_filling_memory(tmp_path):
    import tracemalloc
    bomb = tmp_path / "bomb.json.xz"
    with lzma.open(bomb, "wb", preset=0) as fh:
        chunk = b" " * (16 * 1024 * 1024)
        for _ in range(4):  # 64 MiB of spaces, about 10 KiB compressed
            fh.write(chunk)
    tracemalloc.start()
    try:
        with pytest.raises(SourceTooLarge, match="decompresses to over"):
            op.load(bomb, limits=op.Limits(max_raw=8 * 1024 * 1024))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 * 1024 * 1024  # the limit plus one 4 MiB chunk, not 64 MiB


def test_version_40_filters_and_filtered_out(onionperf_hk5):
    # OnionPerf 0.8's 4.0 format: 3.0 plus `filters` and `filtered_out` written by
    # `onionperf filter` (schema/onionperf-4.0.json)
    doc = json.loads(lzma.decompress(onionperf_hk5.read_bytes()))
    doc["version"] = "4.0"
    doc["filters"] = {"tor/circuits": [{"name": "exclude_fingerprints", "filepath": "exclude.txt"}]}
    circuits = doc["data"]["op-hk5"]["tor"]["circuits"]
    circuits["124978"]["filtered_out"] = True  # the circuit of the transfer on port 36250
    a = op.parse(doc, "four.json")
    assert a.version == (4, 0) and a.has_filters and len(a.transfers) == 5
    kept = op.kept_transfers(a, honour_filters=True)
    # 36176 and 36216 used circuits launched before midnight (not in the file): unknown, dropped
    assert sorted(t.local_port for t in kept) == [36262, 36280]
    assert len(op.samples(a, honour_filters=True).samples["circuit_build_time_s"]) == 896
    # without `filters`, `filtered_out` is not honoured (upstream's analysis_no_filters case)
    del doc["filters"]
    assert len(op.kept_transfers(op.parse(doc, "x"), honour_filters=True)) == 5


def test_legacy_transfers_of_versions_1_and_2():
    # the record layout of OnionPerf's README_JSON.md (1.0, robgjansen) with 2.0's payload_bytes
    record = {"elapsed_seconds": {"command": 0.319006, "first_byte": 0.6, "last_byte": 2.5, "response": 0.6,
                                  "payload_bytes": {"51200": 0.9, "1048576": 2.5}},
              "endpoint_local": "localhost:127.0.0.1:45416", "endpoint_remote": "server1:216.17.99.183:6666",
              "error_code": "NONE", "filesize_bytes": 1048576, "is_error": False, "is_success": True,
              "total_bytes_read": 1048676, "unix_ts_start": 1456699868.006196, "unix_ts_end": 1456699870.5}
    failed = dict(record, error_code="READ", is_error=True, is_success=False,
                  elapsed_seconds={"command": 0.3, "first_byte": 0.0, "last_byte": 0.0})
    for version in (1.0, "2.0"):
        doc = {"type": "onionperf", "version": version,
               "data": {"phantomtrain": {"tgen": {"transfers": {"transfer1m:1": record, "transfer1m:2": failed}}}}}
        a = op.parse(doc, "legacy.json")
        ok, bad = a.transfers
        assert (ok.size, ok.ttfb_s, ok.ttlb_s, ok.partial_s[51200], ok.local_port) == (1048576, 0.6, 2.5, 0.9, 45416)
        assert not bad.success and bad.error == "READ" and bad.ttlb_s is None
        got = op.samples(a).samples
        assert [s.value for s in got["client_ttlb_1mib_s"]] == [2.5]
        assert [s.value for s in got["client_ttlb_50kib_s"]] == [0.9]
        assert [s.value for s in got["client_transfer_failure_ratio"]] == [0.0, 1.0]


@pytest.fixture(scope="module")
def small_doc(onionperf_hk5):
    doc = json.loads(lzma.decompress(onionperf_hk5.read_bytes()))
    tor = doc["data"]["op-hk5"]["tor"]
    tor["circuits"] = dict(list(tor["circuits"].items())[:20])
    tor["streams"] = dict(list(tor["streams"].items())[:20])
    return doc


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), junk=st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(),
                                      st.text(max_size=5), st.lists(st.integers(), max_size=2),
                                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_any_damaged_field_is_an_error_or_a_problem_never_a_crash(small_doc, data, junk):
    import copy

    doc = copy.deepcopy(small_doc)
    paths = [p for p in _paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = junk
    try:
        a = op.parse(doc, "fuzz.json")
    except CorruptSource as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.json")
        return
    op.samples(a)  # whatever was kept still converts to samples
    assert all(p.startswith("fuzz.json: ") for p in a.problems)


def test_deeply_nested_json(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CorruptSource, match="deep.json"):
        op.load(f)
