"""The CLI contract scripts rely on: every command takes --json; errors are one line."""

import json
import subprocess
import sys
from pathlib import Path

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


# --- every command's --json reaches kistexp (issue 8 item 6) -------------------------------------------
#
# Each leaf command is run with --json and arguments that get past typer into kistexp: the outcome must be
# the one listed, "json" (exit 0, one JSON document on stdout) or "error" (a KistexpError: exit 1 with one
# `kistexp: error:` line). A usage error from typer (exit 2) fails the test, so does a command missing here.


def _contract_cases(tmp_path: Path, microdesc: Path) -> dict[str, tuple[list[str], str]]:
    from kistexp.localnet import LocalNetwork, NetworkSpec

    saved = tmp_path / "net"
    saved.mkdir()
    spec = NetworkSpec(authorities=1, relays=0, exits=0, clients=0, base_port=15000)
    LocalNetwork(saved, spec, {"pids": {}, "params": {}, "keys": {}})._save()
    (saved / "auth000").mkdir()
    plan = "plans/kist-run-interval-2020.toml"
    return {
        "lint": (["lint", plan, "--now", "2026-01-01T00:00:00Z", "--json"], "json"),
        "show": (["show", plan, "--json"], "json"),
        "params": (["params", "KISTSchedRunInterval", "--json"], "json"),
        "consensus inspect": (["consensus", "inspect", str(microdesc), "--json"], "json"),
        # nothing listens on port 9: no authority serves a consensus, nothing is written
        "consensus fetch": (["consensus", "fetch", "--authority",
                             "a=127.0.0.1:9/F533C81CEF0BC0267857C99B2F471ADF249FA232", "--timeout", "1",
                             "-o", str(tmp_path / "fetched"), "--json"], "error"),
        "authorities whatif": (["authorities", "whatif", "--n-authorities", "3", "--vote",
                                "a=KISTSchedRunInterval=2", "--vote", "b=KISTSchedRunInterval=2", "--json"], "json"),
        # nothing listens on port 9: each authority is reported unreachable, or the command refuses
        "authorities status": (["authorities", "status", "--authority", "a=127.0.0.1:9", "--timeout", "1",
                                "--retries", "0", "--json"], "json|error"),
        "authorities serve": (["authorities", "serve", "--host", "10.0.0.1", "--json"], "error"),
        "localnet up": (["localnet", "up", str(tmp_path / "new"), "--authorities", "0", "--json"], "error"),
        "localnet wait": (["localnet", "wait", str(saved), "--timeout", "0.3", "--json"], "error"),
        "localnet status": (["localnet", "status", str(saved), "--json"], "json"),
        "localnet params": (["localnet", "params", str(saved), "auth000", "KISTSchedRunInterval=3", "--json"], "json"),
        "localnet down": (["localnet", "down", str(saved), "--json"], "json"),
        "sim experiment": (["sim", "experiment", "ceiling", "--interval-ms", "1000", "--json"], "error"),
        "fidelity": (["fidelity", "--no-real", "--no-sim", "--json"], "json"),
        # a consensus without --certs cannot be verified: refused, and the experiment directory is created
        "metrics import": (["metrics", "import", str(microdesc), "--dir", str(tmp_path / "exp"), "--json"], "error"),
        "metrics list": (["metrics", "list", "--dir", str(tmp_path / "exp"), "--json"], "json"),
        "metrics show": (["metrics", "show", "client_ttlb_1mib_s", "--dir", str(tmp_path / "exp"), "--json"], "json"),
        "metrics params": (["metrics", "params", "--dir", str(tmp_path / "exp"), "--json"], "json"),
        # a file with no numbers is refused with its name
        "judge compare": (["judge", "compare", "--baseline", plan, "--stage", plan, "--statistic", "median",
                           "--comparison", "relative-increase", "--threshold", "0.1", "--json"], "error"),
        "judge plan": (["judge", "plan", plan, "--dir", str(tmp_path / "exp"), "--json"], "json|error"),
        "population paths": (["population", "paths", str(microdesc), "--circuits", "200", "--seed", "1",
                              "--json"], "json"),
        "population summary": (["population", "summary", str(microdesc), "--scale", "0.01", "--json"], "json"),
        # a load of 0 is refused before anything runs
        "simulate": (["simulate", plan, "--load", "0", "--dir", str(tmp_path / "sim"), "--json"], "error"),
        # rollouts: no predictions to draw from / no local network in that directory / no rollout in the metrics
        # directory
        "dry-run": (["dry-run", plan, "--json"], "error"),
        "run": (["run", plan, "--dir", str(tmp_path / "run"), "--authorities", "local", "--localnet",
                 str(tmp_path / "no-net"), "--json"], "error"),
        "status": (["status", str(tmp_path / "exp"), "--json"], "error"),
        "history": (["history", str(tmp_path / "exp"), "--json"], "json"),
        **{name: ([name, str(tmp_path / "exp"), "--json"], "error")
           for name in ("pause", "resume", "promote", "abort", "retry", "undo")},
        "rollback": (["rollback", str(tmp_path / "exp"), "--dry-run", "--json"], "error"),
        # the metrics directory above holds no rollout journal and no predictions
        "report": (["report", str(tmp_path / "exp"), "--json"], "error"),
        "announce": (["announce", plan, "--dir", str(tmp_path / "exp"), "--json"], "error"),
        # nothing listens on port 9: the scheduler is reported unreachable within the timeout
        "sweep": (["sweep", "plans/sweeps/kist-interval-small.toml", "--dask", "tcp://127.0.0.1:9",
                   "--dask-timeout", "1", "--cache", str(tmp_path / "sweep-cache"), "--json"], "error"),
    }


def test_every_json_invocation_reaches_kistexp(tmp_path, microdesc_consensus_path):
    from typer.testing import CliRunner

    from kistexp.errors import KistexpError
    from kistexp.output import error_line

    cases = _contract_cases(tmp_path, microdesc_consensus_path)
    names = {" ".join(p) for p, _ in _leaf_commands(typer.main.get_command(app))}
    assert set(cases) == names, f"give these commands a contract case: {sorted(names ^ set(cases))}"
    for name, (argv, expected) in cases.items():
        result = CliRunner().invoke(app, argv)
        exc = result.exception
        if isinstance(exc, KistexpError):
            outcome = "error"
            assert "\n" not in error_line(exc), (name, str(exc))
        else:
            assert exc is None or isinstance(exc, SystemExit) and result.exit_code == 0, (name, repr(exc),
                                                                                           result.output)
            assert result.exit_code == 0, (name, result.exit_code, result.output)
            json.loads(result.stdout)  # one JSON document, nothing else on stdout
            outcome = "json"
        assert outcome in expected.split("|"), (name, outcome, result.output[-300:])


def test_an_error_inside_a_progress_bar_leaves_only_its_line(tmp_path):
    """Without --json and with stderr piped (a script, a CI log), a command that fails while its progress bar
    would be up prints its error and nothing else: no blank line where a bar that never drew stood, nothing
    on stdout."""
    plan = "plans/kist-run-interval-2020.toml"
    for argv, message in (
        (["fidelity", "--real-from", str(tmp_path / "missing.json")], "cannot read a fidelity report"),
        (["simulate", plan, "--dir", str(tmp_path / "sim"), "--consensus", str(tmp_path / "none.txt")],
         "cannot read consensus: no such file"),
        (["metrics", "import", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--dir", str(tmp_path / "exp")],
         "a.json: cannot read"),
    ):
        proc = subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2])
        assert proc.returncode == 1, (argv, proc.stderr)
        assert proc.stdout == "", argv
        lines = proc.stderr.splitlines()
        assert lines and all(line.startswith("kistexp: ") for line in lines), (argv, proc.stderr)
        assert lines[-1].startswith("kistexp: error: ") and message in lines[-1], (argv, proc.stderr)
