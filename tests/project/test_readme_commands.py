"""README's command table matches the CLI: each command it lists exists, with the options it names and the
values it gives them (``--authorities fake|local|instructions``), and every command the CLI has is listed."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer

from kistexp.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def table_rows(text: str) -> list[str]:
    """The first cell of each row of the table under "## Commands", ``\\|`` unescaped."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `kistexp"):
            continue
        cell = re.split(r"(?<!\\)\|", line)[1].strip()
        rows.append(cell.strip("`").replace("\\|", "|"))
    return rows


def _leaves(command, path=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield path


def resolve(root, words: list[str]) -> tuple[tuple[str, ...], click.Command]:
    """The command ``words`` run, as click resolves them (``judge PLAN`` is ``judge plan``)."""
    path, command = (), root
    while hasattr(command, "commands") and words:
        name, command, words = command.resolve_command(click.Context(command), list(words))
        path = (*path, name)
    return path, command


def expand(usage: str) -> list[list[str]]:
    """``localnet up/down DIR`` -> [[localnet, up, DIR], [localnet, down, DIR]]: one per slashed alternative."""
    words = usage.split()[1:]
    for i, word in enumerate(words):
        if "/" in word and re.fullmatch(r"[a-z-]+(/[a-z-]+)+", word):
            return [w for alt in word.split("/") for w in expand(" ".join(["kistexp", *words[:i], alt,
                                                                          *words[i + 1:]]))]
    return [words]


def named_options(words: list[str]) -> list[tuple[str, list[str]]]:
    """Each option a usage names, with the values it lists (``fake|local|instructions``), if any."""
    out = []
    for i, word in enumerate(words):
        opt = word.strip("[]")
        if re.fullmatch(r"--?[a-z][a-z0-9-]*", opt):
            nxt = words[i + 1].strip("[]") if i + 1 < len(words) else ""
            values = nxt.split("|") if re.fullmatch(r"[a-z0-9-]+(\|[a-z0-9-]+)+", nxt) else []
            out.append((opt, values))
    return out


def command_words(words: list[str]) -> list[str]:
    """The leading words that name commands (before the first argument metavar, option or bracket)."""
    out = []
    for word in words:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        out.append(word)
    return out


def mismatches(rows: list[str], root) -> list[str]:
    problems, listed = [], set()
    for row in rows:
        for words in expand(row):
            names = command_words(words)
            try:
                path, command = resolve(root, names + [w for w in words[len(names):] if not w.startswith(("-", "["))])
            except click.UsageError as exc:
                problems.append(f"{row}: {' '.join(names)}: {exc.format_message()}")
                continue
            if hasattr(command, "commands"):
                problems.append(f"{row}: {' '.join(path)} is a group, not a command")
                continue
            listed.add(path)
            params = {opt: p for p in command.params for opt in (*getattr(p, "opts", ()), *getattr(p,
                                                                                              "secondary_opts", ()))}
            for opt, values in named_options(words):
                param = params.get(opt)
                if param is None:
                    problems.append(f"{row}: {' '.join(path)} has no option {opt}")
                    continue
                said = " ".join(map(str, getattr(param.type_descriptor, "choices", None) or ())) + " " + \
                    (param.help or "")
                for value in values:
                    if not re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", said):
                        problems.append(f"{row}: {' '.join(path)} {opt} does not take {value!r} (help: {param.help})")
    for path in _leaves(root):
        if path not in listed:
            problems.append(f"kistexp {' '.join(path)} is not in README's command table")
    return problems


def test_readme_command_table_matches_the_cli():
    rows = table_rows(README.read_text(encoding="utf-8"))
    assert len(rows) > 20
    assert mismatches(rows, typer.main.get_command(app)) == []


@pytest.mark.parametrize(("row", "problem"), [
    ("kistexp run PLAN --dir EXP --authorities fake|remote", "run --authorities does not take 'remote'"),
    ("kistexp run PLAN --speed N", "run has no option --speed"),
    ("kistexp localnet up/sideways DIR", "localnet up/sideways DIR: localnet sideways: No such command"),
    ("kistexp judge", "judge is a group, not a command"),
])
def test_the_check_finds_what_the_table_gets_wrong(row, problem):
    found = mismatches([row], typer.main.get_command(app))
    assert any(problem in p for p in found), found
    assert "kistexp lint is not in README's command table" in found


def test_slashed_alternatives_and_default_subcommand():
    assert expand("kistexp pause/resume DIR") == [["pause", "DIR"], ["resume", "DIR"]]
    root = typer.main.get_command(app)
    assert resolve(root, ["judge", "PLAN"])[0] == ("judge", "plan")
    assert named_options("[--workers N | --dask ADDRESS] --format text|markdown".split()) == [
        ("--workers", []), ("--dask", []), ("--format", ["text", "markdown"])]
