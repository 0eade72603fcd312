"""Property: every table and line printer of the commands, fed random text with markup and control
characters, prints it literally (no MarkupError, no raw control character) in bounded time."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.commands.fidelity import _print_report
from kistexp.commands.localnet import _print_status
from kistexp.commands.sim import _print_result
from kistexp.errors import KistexpError
from kistexp.fidelity import FIDELITY_SCENARIOS, Case, Report, Row
from kistexp.output import error_line

RAW = ("\x1b", "\x07", "\x9b", "\x00", "\u202e", "\x08", "\r")
HOSTILE = st.sampled_from(["[/red]", "[bold]", "[", "]", "[link=x]", ":warning:", "\x1b]0;title\x07", "\x1b[2J",
                           "\x9b31m", "\u202e", "\x00", "\r", "\n", "{", "}", "%s", "\\", "\udcff"])
TEXT = st.lists(st.text(max_size=12) | HOSTILE, max_size=5).map("".join)
FAST = settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _clean(out: str) -> None:
    for ch in RAW:
        assert ch not in out, f"raw {ch!r} printed"


@FAST
@given(nick=TEXT, role=TEXT, params=TEXT, root=TEXT, service=TEXT, served_by=TEXT)
def test_localnet_status_table(capsys, nick, role, params, root, service, served_by):
    status = {"root": root, "running": 1, "service": service,
              "nodes": [{"nickname": nick, "role": role, "pid": 1, "running": True, "or_port": 1, "dir_port": 2,
                         "control_port": 3, "socks_port": None, "consensus_params": params}],
              "consensus": {"valid_after": "2030-01-01 00:00:00", "served_by": served_by, "relays": 1,
                            "signatures": 1, "params": params}}
    _print_status(status)
    _clean(capsys.readouterr().out)


@FAST
@given(name=TEXT, figures=st.dictionaries(TEXT, TEXT | st.floats() | st.integers(), max_size=4),
       curve_key=TEXT, record=st.dictionaries(TEXT, TEXT, min_size=1, max_size=3))
def test_sim_result_tables(capsys, name, figures, curve_key, record):
    _print_result(name, {**figures, curve_key: [dict(record, scheduler=name), record]})
    _clean(capsys.readouterr().out)


@FAST
@given(scenario=st.sampled_from(sorted(FIDELITY_SCENARIOS)), scheduler=TEXT,
       notes=st.lists(TEXT, min_size=4, max_size=4))
def test_fidelity_report_table(capsys, scenario, scheduler, notes):
    # scenario names come from the registry (an unknown one is refused by parse_cases); notes and the
    # scheduler column carry text from logs and options
    row = Row(case=Case(scenario, scheduler, 2), real=None, sim=None, real_note=notes[0], sim_note=notes[1])
    _print_report(Report(rows=(row,), repetitions=1, size_mb=1.0, real_skipped=notes[2], sim_skipped=notes[3]))
    _clean(capsys.readouterr().out)


def _invoke(argv: list[str]) -> str:
    result = CliRunner().invoke(app, argv)
    if isinstance(result.exception, KistexpError):
        assert "\n" not in error_line(result.exception)
        return error_line(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.output


@settings(max_examples=40, deadline=5000)
@given(owner=TEXT, first=TEXT, second=TEXT, contact=TEXT)
def test_show_and_lint_print_any_plan_text(owner, first, second, contact):
    """Owner, contact and stage names reach `show`'s lines and table and `lint`'s KX104 finding."""
    text = (VALID_PLAN.replace('owner = "network-team"', f"owner = {json.dumps(owner)}")
            .replace('contact = "ops@example.org"', f"contact = {json.dumps(contact)}")
            .replace('name = "two"', f"name = {json.dumps(first)}")
            .replace('name = "five"', f"name = {json.dumps(second)}")
            .replace("KISTSchedRunInterval = 5 }", "KISTSchedRunInterval = 2 }"))  # KX104 names both stages
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.toml"
        try:
            path.write_text(text, encoding="utf-8")
        except UnicodeEncodeError:
            return  # a lone surrogate cannot be written into a plan file
        for argv in (["show", str(path)], ["lint", str(path), "--now", "2029-01-01T00:00:00Z"]):
            _clean(_invoke(argv))
