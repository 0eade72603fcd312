"""The CLI contract scripts rely on: every command takes --json; errors are one line."""

import subprocess
import sys

import typer

from kistexp.cli import app


def _leaf_commands(command, path=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _leaf_commands(sub, (*path, name))
    else:
        yield path, command


def test_every_command_takes_json():
    root = typer.main.get_command(app)
    leaves = list(_leaf_commands(root))
    names = {" ".join(p) for p, _ in leaves}
    for expected in ("lint", "show", "params", "consensus inspect", "authorities whatif", "authorities status",
                     "authorities serve", "localnet up", "localnet down", "sim experiment", "fidelity"):
        assert expected in names
    missing = [" ".join(p) for p, cmd in leaves if not any("--json" in getattr(o, "opts", ()) for o in cmd.params)]
    assert missing == []


def test_unknown_command_and_bad_option_exit_nonzero_without_traceback():
    for argv in (["nosuchcommand"], ["lint"], ["show", "--bogus", "x"]):
        proc = subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
