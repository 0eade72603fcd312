"""Terminal-safe output: text from plans, documents and servers is printed literally, controls made visible."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.output import add_row, error_line, make_table, plain, print_table, say, visible

HOSTILE = "[/red] [bold]x[/bold] :warning: \x1b]0;pwned\x07 \x1b[2J \x9b31m \u202egnp.exe \x00"


def _run(argv, tmp_path):
    # a real process: the CLI's own error path and rich's console are exercised as a user meets them
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)


def _no_raw_controls(text: str) -> None:
    for ch in "\x1b\x07\x9b\u202e\x00":
        assert ch not in text, f"raw {ch!r} reached the terminal"


def test_visible_escapes_controls_and_keeps_text():
    assert visible("KISTSchedRunInterval=2 é 日本") == "KISTSchedRunInterval=2 é 日本"
    assert visible("a\x1b]0;t\x07b") == "a\\x1b]0;t\\x07b"
    assert visible("\x9b\x7f\u202e\u2028\udcff") == "\\x9b\\x7f\\u202e\\u2028\\udcff"
    assert visible("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert visible(42) == "42"
    assert error_line("bad\nline") == "kistexp: error: bad\\nline"


def test_say_and_tables_print_markup_literally(capsys):
    say(HOSTILE, plain(" [green]ok", "green"))
    table = make_table(HOSTILE, [HOSTILE, ("n", {"justify": "right"})])
    add_row(table, HOSTILE, plain("[red]x[/red]", "red"))
    print_table(table)
    out = capsys.readouterr().out
    _no_raw_controls(out)
    assert "[/red] [bold]x[/bold] :warning: \\x1b]0;pwned\\x07" in out
    assert " [green]ok" in out and "[red]x[/red]" in out


def _plan(tmp_path, owner=HOSTILE, stage="two"):
    text = VALID_PLAN.replace('owner = "network-team"', f"owner = {json.dumps(owner)}")
    text = text.replace('name = "two"', f"name = {json.dumps(stage)}")
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["show", "lint"])
def test_plan_text_is_not_markup_and_cannot_retitle_terminal(tmp_path, command):
    path = _plan(tmp_path, stage="[/red]two\x1b]0;x\x07")
    proc = _run([command, str(path), "--now", "2029-01-01T00:00:00Z"] if command == "lint"
                else [command, str(path)], tmp_path)
    assert "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr
    _no_raw_controls(proc.stdout + proc.stderr)
    if command == "show":
        assert proc.returncode == 0, proc.stderr
        assert "owner [/red] [bold]x[/bold]" in proc.stdout
        assert "[/red]two\\x1b]0;x\\x07" in proc.stdout


def test_lint_finding_text_with_markup_in_file_name(tmp_path):
    (tmp_path / "a[").mkdir()
    path = tmp_path / "a[" / "red]plan\x1b[2J.toml"  # the path holds "a[/red]plan"
    path.write_text(VALID_PLAN.replace("KISTSchedRunInterval = 8", "KISTSchedRunInterval = 500"))
    proc = _run(["lint", str(path), "--now", "2029-01-01T00:00:00Z"], tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    _no_raw_controls(proc.stdout)
    assert "a[/red]plan\\x1b[2J.toml" in proc.stdout


def test_error_line_is_one_visible_line(tmp_path):
    (tmp_path / "a[").mkdir()
    bad = tmp_path / "a[" / "red]\x1b]0;t\x07.toml"
    bad.write_text("[experiment\n")
    proc = _run(["show", str(bad)], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("kistexp: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    _no_raw_controls(proc.stderr)
    assert "a[/red]\\x1b]0;t\\x07.toml" in proc.stderr


_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["[/red]", "[bold]", "[", "]", "\\[x]", ":warning:", "\x1b]0;t\x07", "\x9b", "{", "}", "%s", "\udcff"])


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(title=_text, heads=st.lists(_text, min_size=1, max_size=4), cells=st.lists(_text, max_size=8))
def test_every_printer_prints_random_text_literally(capsys, title, heads, cells):
    say(title, *cells)
    table = make_table(title, heads)
    add_row(table, *cells[: len(heads)])
    print_table(table)
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\x9b\x00")
    flat = "".join(out.split())
    assert "".join(visible(title).split()) in flat or len(title) > 20  # long titles may wrap across lines


@settings(max_examples=40, deadline=5000)
@given(owner=_text, stage=_text.filter(lambda s: s.strip()))
def test_show_prints_any_owner_and_stage_or_one_line_error(owner, stage):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = _plan(Path(tmp), owner=owner, stage=stage)
        except UnicodeEncodeError:
            return  # a lone surrogate cannot be written into a UTF-8 plan file at all
        result = CliRunner().invoke(app, ["show", str(path)])
    if result.exception is not None:
        from kistexp.errors import KistexpError

        assert isinstance(result.exception, KistexpError), repr(result.exception)
        assert "\n" not in str(error_line(result.exception))
        return
    assert result.exit_code == 0
    assert not any(ch in result.output for ch in "\x1b\x07\x9b\x00")
