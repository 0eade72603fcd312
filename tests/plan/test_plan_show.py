import datetime as dt
import json
import subprocess
import sys

from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.plan import parse_plan
from kistexp.plan.timeline import authorities_needed, build_timeline, first_round, propagation_delay

UTC = dt.timezone.utc


def test_first_round_and_vote_deadline():
    rnd = first_round(dt.datetime(2030, 1, 7, 12, 0, tzinfo=UTC))
    assert rnd.valid_after == dt.datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    assert rnd.vote_at == dt.datetime(2030, 1, 7, 11, 50, tzinfo=UTC)
    rnd = first_round(dt.datetime(2030, 1, 7, 12, 1, tzinfo=UTC))
    assert rnd.valid_after == dt.datetime(2030, 1, 7, 13, 0, tzinfo=UTC)


def test_timeline_propagation_matches_dirspec():
    timeline = build_timeline(parse_plan(VALID_PLAN, "p.toml"))
    row = timeline.rows[0]
    va = dt.datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    assert row.first_valid_after == va
    # caches: ~50 % at V+17 min, all by ~V+33 min; clients: ~49 % at V+60, all by V+112 (dirspec §3.1)
    assert 15 <= (row.relays_50 - va).total_seconds() / 60 <= 19
    assert 31 <= (row.relays_100 - va).total_seconds() / 60 <= 34
    assert 55 <= (row.clients_50 - va).total_seconds() / 60 <= 65
    assert 108 <= (row.clients_100 - va).total_seconds() / 60 <= 113
    assert "need 5 of 9" in row.authority_action
    assert propagation_delay(va, "relays") < propagation_delay(va, "clients")


def test_authorities_needed_rule():
    assert authorities_needed(9, "listing") == 5
    assert authorities_needed(9, "silent") == 3
    assert authorities_needed(3, "silent") == 2
    assert authorities_needed(1, "silent") == 1


def test_show_json_and_table():
    runner = CliRunner()
    result = runner.invoke(app, ["show", "plans/kist-run-interval-2020.toml", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [s["values"]["KISTSchedRunInterval"] for s in data["stages"]] == [2, 5, 10]
    assert data["stages"][0]["first_valid_after"] == "2027-03-01T12:00:00Z"
    assert data["stages"][0]["vote_deadline"] == "2027-03-01T11:50:00Z"
    result = runner.invoke(app, ["show", "plans/kist-run-interval-2020.toml"])
    assert result.exit_code == 0 and "back-to-10ms" in result.output


def test_cli_bad_plan_is_one_line_error_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment\n")
    proc = subprocess.run([sys.executable, "-m", "kistexp", "show", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "TOML syntax error" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_params_command():
    runner = CliRunner()
    result = runner.invoke(app, ["params", "KISTSchedRunInterval", "--json"])
    data = json.loads(result.output)
    assert [(b["default"], b["min"], b["max"]) for b in data["bounds"]] == [(10, 0, 100), (2, 2, 100)]
    assert "non-zero" in data["torrc_override"]
    result = runner.invoke(app, ["params", "kistschedruninterval"])
    assert result.exit_code == 1
    assert "did you mean KISTSchedRunInterval" in str(result.exception)
    result = runner.invoke(app, ["params", "--json"])
    names = {p["name"] for p in json.loads(result.output)}
    assert {"KISTSchedRunInterval", "KISTSchedRunIntervalClient", "CircuitPriorityHalflifeMsec", "circwindow",
            "cc_alg", "cbtquantile", "AuthDirMaxServersPerAddr"} <= names
