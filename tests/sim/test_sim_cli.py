"""`kistexp sim experiment ...` (issue 4 point 8)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import SimConfigError

runner = CliRunner()


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, ["sim", "experiment", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_first_run_json_has_unit_keys_and_53_cells():
    d = _json(["kist-first-run"])
    assert d["first_run_cells"] == 53
    assert d["mss_bytes"] == 1448 and d["initial_cwnd_segments"] == 10


def test_ceiling_json_follows_scheduler_and_interval_options():
    d = _json(["ceiling", "--scheduler", "kistlite", "--interval-ms", "2", "--circuits", "4"])
    assert d["scheduler"] == "kistlite" and d["interval_ms"] == 2 and d["circuits"] == 4
    assert d["cells_per_run_mode"] == 64
    assert d["throughput_mbytes_per_s"] == pytest.approx(8.22, rel=0.03)


def test_ewma_one_interval_json_keys():
    d = _json(["ewma", "--interval-ms", "10", "--seed", "3"])
    (point,) = d["points"]
    assert point["interval_ms"] == 10
    assert point["interactive_delay_ms_p50"] < point["bulk_delay_ms_p50"]


def test_circuit_options_streams_client_interval_and_cc_alg():
    d = _json(["circuit", "--scheduler", "kistlite", "--interval-ms", "2", "--streams", "4", "--cc-alg", "0",
               "--client-interval-ms", "10"])
    assert (d["streams"], d["cc_alg"], d["flow_control"]) == (4, 0, "sendme")
    assert d["interval_ms"] == 2 and d["client_interval_ms"] == 10 and d["finished"]
    d = _json(["circuit", "--scheduler", "kistlite", "--interval-ms", "2"])
    assert (d["streams"], d["cc_alg"], d["flow_control"], d["client_interval_ms"]) == (1, 2, "vegas", 2)


def test_ceiling_path_circuits_and_cc_alg():
    d = _json(["ceiling-path", "--scheduler", "kistlite", "--interval-ms", "10", "--circuits", "2", "--cc-alg", "0"])
    assert d["circuits"] == 2 and d["cc_alg"] == 0 and d["flow_control"] == "sendme" and d["finished"]


def test_human_output_is_a_table_of_figures():
    result = runner.invoke(app, ["sim", "experiment", "kist-first-run"])
    assert result.exit_code == 0, result.output
    assert "first_run_cells" in result.stdout and "53" in result.stdout
    result = runner.invoke(app, ["sim", "experiment", "kernel-queue", "--scheduler", "kist"])
    assert result.exit_code == 0, result.output
    assert "kernel_delay_ms_p50" in result.stdout and "kist" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["nosuch"], "unknown experiment"),
    (["ceiling", "--scheduler", "fifo"], "unknown scheduler"),
    (["circuit", "--interval-ms", "0"], "kist_interval_ms"),
    (["circuit", "--interval-ms", "101"], "kist_interval_ms"),
    (["ewma", "--client-interval-ms", "1000"], "kist_interval_ms"),
    (["ceiling", "--circuits", "0"], "circuits"),
    (["circuit", "--circuits", "4"], "does not apply"),
    (["circuit", "--streams", "0"], "streams=0"),
    (["ceiling-path", "--streams", "2"], "--streams applies only to circuit"),
    (["circuit", "--cc-alg", "1"], "cc_alg=1 must be 0"),
    (["ewma", "--cc-alg", "0"], "--cc-alg applies only to circuit and ceiling-path"),
])
def test_bad_options_exit_1_with_one_line(args, words):
    for extra in ([], ["--json"]):
        result = runner.invoke(app, ["sim", "experiment", *args, *extra])
        assert result.exit_code == 1
        assert isinstance(result.exception, SimConfigError)
        message = str(result.exception)
        assert words in message and "\n" not in message


def test_main_prints_the_error_line_and_exits_1():
    proc = subprocess.run([sys.executable, "-m", "kistexp", "sim", "experiment", "nosuch"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("kistexp: error: sim experiment: unknown experiment 'nosuch'")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
