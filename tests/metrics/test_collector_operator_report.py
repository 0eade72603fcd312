"""Operator report CSV (kistexp-operator-report/1, metrics-sources.md §4)."""

from __future__ import annotations

import pytest

from kistexp.metrics.collectors import CorruptSource
from kistexp.metrics.collectors import operator_report as rep

HEADER = ("relay_fingerprint,nickname,window_start_utc,window_end_utc,phase,param_name,param_value,"
          "cpu_pct_core_mean,rss_mib_mean,read_mbit_s_mean,write_mbit_s_mean,cpu_source,notes\n")


@pytest.fixture(scope="module")
def consensus_relays(consensus_path):
    return rep.known_relays(consensus_path)


def test_known_relays_from_the_real_consensus(consensus_relays):
    assert len(consensus_relays) == 6088
    assert consensus_relays["000A10D43011EA4928A35F610405F92B4433B4DC"] in {"exit", "guard", "middle", "guard+exit"}
    assert {"exit", "guard", "middle", "guard+exit"} == set(consensus_relays.values())


def test_good_rows(tmp_path, consensus_relays):
    fpr = "000A10D43011EA4928A35F610405F92B4433B4DC"
    f = tmp_path / "op.csv"
    f.write_text(HEADER +
                 f"{fpr},relay1,2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,baseline,KISTSchedRunInterval,2,"
                 "85.5,1536,120,118,proc,\"busy, shared host\"\n"
                 f"${fpr.lower()},relay1,2026-03-01T03:00:00+02:00,2026-03-01T02:00:00Z,treatment,"
                 "KISTSchedRunInterval,3,90,,40,,metricsport,\n")
    got = rep.collect(f, known=consensus_relays)
    assert got.problems == ()
    cpu = got.samples["relay_cpu_utilization"]
    assert [s.value for s in cpu] == [0.855, 0.90]
    assert [s.param_value for s in cpu] == [2, 3]
    assert cpu[1].time.isoformat() == "2026-03-01T01:00:00+00:00"
    assert dict(cpu[0].labels) == {"relay": fpr, "source": "op.csv", "phase": "baseline",
                                   "position": consensus_relays[fpr]}
    assert [s.value for s in got.samples["relay_rss_bytes"]] == [1536 * 1024 * 1024]
    assert [s.value for s in got.samples["relay_bandwidth_bytes_per_s"]] == [238e6 / 8, 40e6 / 8]


def test_bad_rows_are_named_and_good_rows_kept(tmp_path, consensus_relays):
    good = "000A10D43011EA4928A35F610405F92B4433B4DC"
    f = tmp_path / "report.csv"
    f.write_text(HEADER +
                 f"{good},a,2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,,,,50,100,1,1,,\n"  # line 2: good
                 f"{'F' * 40},b,2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,,,,50,100,1,1,,\n"  # 3: unknown relay
                 f"{good},a,2026-03-01T01:00:00Z,2026-03-01T02:00:00Z,,,,lots,100,1,1,,\n"  # 4: not a number
                 f"{good},a,2026-03-01T02:00:00,2026-03-01T03:00:00Z,,,,50,100,1,1,,\n"  # 5: naive time
                 f"{good},a,2026-03-01T03:00:00Z,2026-03-01T03:00:00Z,,,,50,100,1,1,,\n"  # 6: empty window
                 f"{good},a,2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,,,,50,100,1,1,,\n"  # 7: duplicate
                 f"{good},a,2026-03-01T04:00:00Z,2026-03-01T05:00:00Z,,,,-3,100,1,1,,\n"  # 8: negative
                 f"{good},a,2026-03-01T05:00:00Z,2026-03-01T06:00:00Z,,,,50,100,1,1,,\n")  # 9: good
    got = rep.collect(f, known=consensus_relays)
    assert [s.time.hour for s in got.samples["relay_cpu_utilization"]] == [0, 5]
    where = [p.split(": ", 1)[0] for p in got.problems]
    assert where == [f"{f}:{n}" for n in (3, 4, 5, 6, 7, 8)]
    assert got.problems[0] == f"{f}:3: relay {'F' * 40} is not in the consensus; row not imported"
    assert "cpu_pct_core_mean 'lots' is not a number" in got.problems[1]
    assert "no timezone" in got.problems[2]
    assert "not after" in got.problems[3] and "second row" in got.problems[4] and "non-negative" in got.problems[5]
    # without a consensus, any well-formed fingerprint is accepted
    assert len(rep.collect(f).samples["relay_cpu_utilization"]) == 3


def test_file_level_errors(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("relay_fingerprint,window_start_utc,window_end_utc,rss_gb_mean\n")
    with pytest.raises(CorruptSource, match=r"r\.csv:1: unknown column 'rss_gb_mean'"):
        rep.collect(f)
    f.write_text("relay_fingerprint,window_start_utc,cpu_pct_core_mean\n")
    with pytest.raises(CorruptSource, match="missing column 'window_end_utc'"):
        rep.collect(f)
    f.write_text("")
    with pytest.raises(CorruptSource, match="empty file"):
        rep.collect(f)
    f.write_bytes(b"relay_fingerprint,window_start_utc,window_end_utc\n\xff\xfe\n")
    with pytest.raises(CorruptSource, match="not UTF-8"):
        rep.collect(f)
    f.write_text(HEADER + "A" * 40 + ",x,2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,,,,1,1,1,1,,\n" * 3)
    with pytest.raises(CorruptSource, match="over 2 rows"):
        rep.collect(f, limits=rep.Limits(max_rows=2))
    with pytest.raises(CorruptSource, match="over the 100-byte limit"):
        rep.collect(f, limits=rep.Limits(max_bytes=100))
