"""`kistexp metrics import|list|show|params`."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys

from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import KistexpError

runner = CliRunner()


def _ok(args):
    result = runner.invoke(app, ["metrics", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _kistexp(*args):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-m", "kistexp", *args], capture_output=True, text=True, env=env)


def test_import_list_show_params(tmp_path, onionperf_hk5, onionperf_hk6a, consensus_path, certs_path):
    exp = tmp_path / "exp"
    out = json.loads(_ok(["import", str(onionperf_hk5), str(onionperf_hk6a), "--dir", str(exp), "--json",
                          "--param-value", "2", "--label", "stage=baseline"]).stdout)
    assert [r["samples"]["circuit_build_time_s"] for r in out["imported"]] == [897, 5841]
    assert out["failed"] == []
    # importing the same file again replaces its samples
    _ok(["import", str(onionperf_hk5), "--dir", str(exp), "--json", "--param-value", "2"])
    # kind detected from content: a consensus file without a suffix
    arch = json.loads(_ok(["import", str(consensus_path), "--certs", str(certs_path), "--dir", str(exp),
                           "--json"]).stdout)
    assert arch["imported"][0]["kind"] == "consensus-archive" and arch["imported"][0]["consensuses"] == 1
    listed = json.loads(_ok(["list", "--dir", str(exp), "--json"]).stdout)
    by = {m["metric"]: m for m in listed["metrics"]}
    assert by["circuit_build_time_s"]["n_samples"] == 897 + 5841
    assert by["client_ttlb_5mib_s"]["param_values"] == [2]
    assert listed["consensuses"] == 1
    shown = json.loads(_ok(["show", "client_ttlb_5mib_s", "--dir", str(exp), "--label", "server=public",
                            "--label", "source=op-hk6a", "--json"]).stdout)
    (series,) = shown["series"]
    assert series["n"] == 5 and series["median"] == 10.787324 and shown["unit"] == "s"
    window = json.loads(_ok(["show", "client_ttlb_5mib_s", "--dir", str(exp), "--from", "2021-06-01T00:00:00Z",
                             "--to", "2021-06-01T01:00:00Z", "--samples", "--json"]).stdout)
    assert [round(s["value"], 6) for s in window["samples"]] == [9.095904, 10.992984, 20.517444, 10.787324]
    png = tmp_path / "ttlb.png"
    _ok(["show", "circuit_build_time_s", "--dir", str(exp), "--plot", str(png), "--json"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    none = json.loads(_ok(["show", "client_ttlb_5mib_s", "--dir", str(exp), "--param-value", "3",
                           "--json"]).stdout)
    assert none["series"] == []
    params = json.loads(_ok(["params", "KISTSchedRunInterval", "--dir", str(exp), "--json"]).stdout)
    assert params["history"]["KISTSchedRunInterval"][0]["value"] == 2
    table = _ok(["list", "--dir", str(exp)]).stdout
    assert "circuit_build_time_s" in table and "op-hk6a" in table


def test_bad_sources_one_line_errors_and_good_data_kept(tmp_path, onionperf_hk5):
    exp = tmp_path / "exp"
    trunc = tmp_path / "t.onionperf.analysis.json.xz"
    trunc.write_bytes(onionperf_hk5.read_bytes()[:60000])
    report = tmp_path / "op.csv"
    report.write_text("relay_fingerprint,window_start_utc,window_end_utc,cpu_pct_core_mean\n"
                      f"{'A' * 40},2026-03-01T00:00:00Z,2026-03-01T01:00:00Z,50\n"
                      f"{'A' * 40},2026-03-01T01:00:00Z,2026-03-01T02:00:00Z,fifty\n")
    proc = _kistexp("metrics", "import", str(trunc), str(report), str(onionperf_hk5), "--dir", str(exp))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    error = [ln for ln in proc.stderr.splitlines() if ln.startswith("kistexp: error:")]
    assert error == [f"kistexp: error: {trunc}: truncated xz file (compressed data ended before the end-of-stream "
                     "marker) (1 more problem; 928 samples from 2 source(s) imported)"]
    assert f"kistexp: warning: {report}:3: cpu_pct_core_mean 'fifty' is not a number; row not imported" \
        in proc.stderr
    listed = json.loads(_ok(["list", "--dir", str(exp), "--json"]).stdout)
    assert {m["metric"]: m["n_samples"] for m in listed["metrics"]}["relay_cpu_utilization"] == 1


def _error(args) -> str:
    result = runner.invoke(app, ["metrics", *args])
    assert isinstance(result.exception, KistexpError), result.output
    return str(result.exception)


def test_usage_errors(tmp_path):
    assert _error(["show", "cpu", "--dir", str(tmp_path / "none")]).startswith("unknown metric 'cpu'")
    assert "no such experiment directory" in _error(["list", "--dir", str(tmp_path / "none")])
    junk = tmp_path / "junk.bin"
    junk.write_bytes(lzma.compress(b"x")[:3] + b"garbage")
    assert "cannot tell what kind of source" in _error(["import", str(junk), "--dir", str(tmp_path / "e")])
    assert "--kind 'ftp'" in _error(["import", str(junk), "--kind", "ftp", "--dir", str(tmp_path / "e")])
    assert "expected KEY=VALUE" in _error(["show", "client_ttfb_s", "--label", "x", "--dir", str(tmp_path / "e")])
    assert "not an ISO 8601 time" in _error(["show", "client_ttfb_s", "--from", "monday", "--dir",
                                             str(tmp_path / "e")])
