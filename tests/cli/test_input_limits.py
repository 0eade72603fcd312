"""No traceback on any input: dates at the ends of the calendar, numbers too big for a float or for int(),
non-ASCII digits, NaN waits; and no params line tor cannot vote with reaches a local authority."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from fake_authorities.serve import parse_interval, parse_population
from kistexp.cli import app
from kistexp.durations import parse_duration
from kistexp.errors import KistexpError, LocalNetError, PlanError
from kistexp.localnet import LocalNetwork, NetworkSpec, parse_params_arg
from kistexp.output import error_line
from kistexp.plan import parse_plan
from kistexp.plan.lint import lint_paths

START = "start = 2030-01-07T12:00:00Z"


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """Run the CLI in-process as ``kistexp.cli.main`` would: a KistexpError becomes its one error line."""
    result = CliRunner().invoke(app, list(argv))
    exc = result.exception
    if isinstance(exc, KistexpError):
        return subprocess.CompletedProcess(argv, 1, result.stdout, error_line(exc) + "\n")
    if exc is not None and not isinstance(exc, SystemExit):
        raise exc  # a traceback: what these tests exist to catch
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, "")


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("kistexp: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("start", [
    "9999-12-31T23:00:00Z", "9999-11-01T00:00:00Z", "0001-01-01T00:00:00Z", "0001-01-08T00:00:00Z",
    "9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00",
])
def test_start_at_the_ends_of_the_calendar_is_a_located_plan_error(tmp_path, start):
    text = VALID_PLAN.replace(START, f"start = {start}")
    with pytest.raises(PlanError) as info:
        parse_plan(text, "p.toml")
    assert info.value.line == 7 and info.value.key == "experiment.start"
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert "p.toml:7: experiment.start: " in _one_line_error(_cli("show", str(path)))
    report = lint_paths([str(path)])
    assert [(f.code, f.line) for f in report.findings] == [("KX001", 7)]


@pytest.mark.parametrize("now", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_now_outside_the_calendar_is_one_line(now):
    assert "--now" in _one_line_error(_cli("lint", "plans/kist-run-interval-2020.toml", "--now", now))


def test_now_near_9999_lints():
    proc = _cli("lint", "plans/kist-run-interval-2020.toml", "--now", "9999-12-31T23:59:59Z")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "KX501" in proc.stdout


def test_threshold_too_big_for_a_float():
    with pytest.raises(PlanError, match=r"criteria\[0\]\.threshold: .*401 digits\) is too large") as info:
        parse_plan(VALID_PLAN.replace("threshold = 0.1", "threshold = 1" + "0" * 400), "p.toml")
    assert info.value.line == 33


@pytest.mark.parametrize("old, new", [
    ("threshold = 0.1", "threshold = 1" + "0" * 5000),
    ("min_samples = 100", "min_samples = " + "9" * 4400),
    ("KISTSchedRunInterval = 8 }", "KISTSchedRunInterval = 1" + "0" * 5000 + " }"),
])
def test_integers_past_python_digit_limit(old, new):
    with pytest.raises(PlanError, match="more than 4,300 digits") as info:
        parse_plan(VALID_PLAN.replace(old, new), "p.toml")
    assert info.value.line is not None and "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["١٤d", "١٤", "14d\n1d", "1_4d", "²d", "9" * 5000 + "d"])
def test_durations_take_ascii_digits_only(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("port", ["²", "١٢", "7000\\n", "1_000", "99999"])
def test_plan_dirport_takes_ascii_port_only(port):
    custom = (f'custom = [{{ nickname = "mine", v3ident = "{"A" * 40}", dirport = "127.0.0.1:{port}" }}]\n'
              'participating = ["mine"]\n')
    text = VALID_PLAN.replace('participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]\n', custom)
    with pytest.raises(PlanError, match="is not HOST:PORT"):
        parse_plan(text, "p.toml")
    fixed = parse_plan(text.replace(f"127.0.0.1:{port}", "127.0.0.1:7000"), "p.toml")
    assert fixed.authorities.authorities[0].dirport == 7000


@pytest.mark.parametrize("value", ["١٢", "²", "1_0", "+", "9" * 5000])
def test_localnet_params_values_take_ascii_digits_only(value):
    with pytest.raises(LocalNetError, match="non-integer value|int32"):
        parse_params_arg(f"KISTSchedRunInterval={value}", "x")


def test_fake_authorities_cli_values_take_ascii_digits_only():
    from fake_authorities.network import NetworkError

    for text in ("١٠", "١٠s", "9" * 5000, "²"):
        with pytest.raises(NetworkError):
            parse_interval(text)
    with pytest.raises(NetworkError, match="at most 24 h"):
        parse_interval("100000")
    with pytest.raises(NetworkError):
        parse_population("١,٢")


# --- what tor cannot vote with never reaches a local authority (item 8) ---------------------------------


def _saved_network(tmp_path: Path) -> LocalNetwork:
    spec = NetworkSpec(authorities=3, relays=0, exits=0, clients=0, base_port=15000)
    net = LocalNetwork(tmp_path, spec, {"pids": {}, "params": {}, "keys": {}})
    net._save()
    return net


@pytest.mark.parametrize("line, words", [
    ("AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=3", "set the torrc option AuthDirMaxServersPerAddr"),
    ("KISTSchedRunInterval=3 KISTSchedRunInterval=4", "given twice"),
    ("KISTSchedRunInterval=2147483648", "int32"),
    ("KISTSchedRunInterval=١٢", "non-integer"),
])
def test_localnet_params_refuses_before_writing(tmp_path, line, words):
    _saved_network(tmp_path)
    proc = _cli("localnet", "params", str(tmp_path), "auth000", line)
    assert words in _one_line_error(proc)
    assert not (tmp_path / "auth000" / "params.inc").exists()
    assert json.loads((tmp_path / "network.json").read_text())["params"] == {}


def test_localnet_up_param_refused_before_anything_is_created(tmp_path):
    proc = _cli("localnet", "up", str(tmp_path / "net"), "--param", "0=AuthDirMaxServersPerAddr=0")
    assert "AuthDirMaxServersPerAddr" in _one_line_error(proc)
    assert not (tmp_path / "net").exists()


@pytest.mark.parametrize("argv", [
    ["localnet", "wait", "{d}", "--timeout", "nan"], ["localnet", "down", "{d}", "--timeout", "inf"],
    ["localnet", "params", "{d}", "auth000", "a=1", "--timeout", "-1"],
    ["localnet", "params", "{d}", "auth²", "a=1"], ["localnet", "up", "{d}/new", "--interval", "١٠s"],
    ["localnet", "up", "{d}/new", "--param", "auth²=KISTSchedRunInterval=2"],
    ["localnet", "up", "{d}/new", "--interval", "100000"],
])
def test_localnet_arguments_are_one_line_errors(tmp_path, argv):
    _saved_network(tmp_path)
    proc = _cli(*(a.format(d=tmp_path) for a in argv))
    _one_line_error(proc)


def test_linter_rejects_a_plan_that_sets_auth_dir_max_servers_per_addr(tmp_path):
    text = VALID_PLAN.replace('parameters = ["KISTSchedRunInterval"]',
                              'parameters = ["KISTSchedRunInterval", "AuthDirMaxServersPerAddr"]')
    for value in (10, 2, 8):  # baseline and both stages
        text = text.replace(f"values = {{ KISTSchedRunInterval = {value} }}",
                            f"values = {{ KISTSchedRunInterval = {value}, AuthDirMaxServersPerAddr = 0 }}")
    path = tmp_path / "p.toml"
    path.write_text(text)
    report = lint_paths([str(path)], now=None)
    codes = [(f.code, f.severity, f.line) for f in report.findings]
    assert codes == [("KX105", "error", 13), ("KX105", "error", 18), ("KX105", "error", 24)], codes
    message = next(f.message for f in report.findings if f.code == "KX105")
    assert "torrc option AuthDirMaxServersPerAddr" in message
    result = CliRunner().invoke(app, ["lint", str(path), "--now", "2029-01-01T00:00:00Z"])
    assert result.exit_code == 1 and "KX105" in result.output


@pytest.mark.parametrize("argv", [["--port", "٧٠٠٠"], ["--count", "²"], ["--count", "9" * 5000]])
def test_python_m_fake_authorities_takes_ascii_numbers(argv, capsys):
    from fake_authorities.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "not a whole number in ASCII digits" in capsys.readouterr().err
