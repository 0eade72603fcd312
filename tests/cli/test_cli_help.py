"""`--help` shows plain metavars (TEXT, INTEGER, PATH; nothing for a flag), never Python types."""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.commands import _plain_name

runner = CliRunner()
PYTHON_METAVAR = re.compile(r"<(str|int|float|bool|path|file|dir|list\[[^\]]*\]|[a-z]+ range)>")


def _help(*words: str) -> str:
    r = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "160"}, terminal_width=160)
    assert r.exit_code == 0, r.output
    return r.output


def _row(text: str, option: str) -> str:
    """The help row that starts with ``option`` (not a mention of it in another option's text)."""
    (line,) = [ln for ln in text.splitlines() if re.match(rf"\W*{re.escape(option)}(?![\w-])", ln)]
    return line


@pytest.mark.parametrize("words", [(), ("run",), ("dry-run",), ("judge", "compare"), ("metrics", "import"),
                                   ("authorities", "serve"), ("sweep",), ("simulate",)])
def test_help_has_no_python_type_metavars(words):
    text = _help(*words)
    assert "--help" in text
    assert not PYTHON_METAVAR.search(text), PYTHON_METAVAR.search(text).group(0)


def test_run_help_shows_click_style_metavars_and_bare_flags():
    text = _help("run")
    assert re.search(r"--interval\s+INTEGER\s", _row(text, "--interval"))
    assert re.search(r"--authorities\s+TEXT\s", _row(text, "--authorities"))
    assert re.search(r"--remind-every\s+FLOAT\s", _row(text, "--remind-every"))
    assert re.search(r"--source\s+TEXT\s", _row(text, "--source"))
    for flag in ("--accept-plan-change", "--json", "--help"):
        assert re.search(rf"{flag}\s+[A-Z][a-z]", _row(text, flag)), _row(text, flag)  # straight to the help text
    assert re.search(r"PLAN\s+TEXT\s", text)


def test_metrics_import_help_paths_and_variadic_argument():
    text = _help("metrics", "import")
    assert re.search(r"--dir\s+PATH\s", _row(text, "--dir"))
    assert re.search(r"sources\.\.\.\s+TEXT\s", text)


class _Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(("annotation", "shown"), [
    (str, "TEXT"), (int, "INTEGER"), (float, "FLOAT"), (bool, "BOOLEAN"), (Path, "PATH"),
    (int | None, "INTEGER"), (list[str], "TEXT"), (tuple[int, str], "INTEGER TEXT"), (_Colour, "[red|blue]"),
])
def test_plain_names(annotation, shown):
    assert _plain_name(annotation) == shown
