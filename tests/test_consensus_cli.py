"""`kistexp consensus inspect`: in process through typer's CliRunner (the consensus sub-app alone) and
once through the real entry point (exit code and the one-line `kistexp: error:` message)."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import typer
from typer.testing import CliRunner

from kistexp.commands import consensus as consensus_cmd
from kistexp.errors import KistexpError


@attrs.frozen
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _run(*args: str) -> Outcome:
    app = typer.Typer()
    consensus_cmd.register(app)
    result = CliRunner().invoke(app, ["consensus", "inspect", *args])
    if isinstance(result.exception, KistexpError):
        # what kistexp.cli.main prints for any KistexpError
        return Outcome(1, result.stdout, f"kistexp: error: {result.exception}\n")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return Outcome(result.exit_code, result.stdout, "")


def _run_entry_point(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kistexp", "consensus", "inspect", *args],
        capture_output=True, text=True, timeout=60,
    )


def test_inspect_real_consensus_with_certs(consensus_path, certs_path):
    res = _run(str(consensus_path), "--certs", str(certs_path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["flavor"] == "ns" and out["vote_status"] == "consensus"
    assert out["valid_after"] == "2022-11-19T10:00:00Z"
    assert out["fresh_until"] == "2022-11-19T11:00:00Z"
    assert out["valid_until"] == "2022-11-19T13:00:00Z"
    assert out["relay_count"] == 6088
    assert out["params"]["KISTSchedRunInterval"] == 2
    sig = out["signatures"]
    assert (sig["valid"], sig["total"], sig["needed"], sig["ok"]) == (8, 8, 5, True)


def test_inspect_human_output(microdesc_consensus_path, certs_path):
    res = _run(str(microdesc_consensus_path), "--certs", str(certs_path))
    assert res.returncode == 0, res.stderr
    assert "microdesc consensus" in res.stdout
    assert "KISTSchedRunInterval=2" in res.stdout
    assert "8/8 valid, 5 needed" in res.stdout


def test_inspect_corrupted_copy_fails(tmp_path, consensus_path, certs_path):
    data = consensus_path.read_bytes().replace(b"KISTSchedRunInterval=2", b"KISTSchedRunInterval=3", 1)
    forged = tmp_path / "forged-consensus"
    forged.write_bytes(data)
    res = _run_entry_point(str(forged), "--certs", str(certs_path))
    assert res.returncode == 1
    err = res.stderr.strip()
    assert err.count("\n") == 0
    assert err.startswith(f"kistexp: error: {forged}: not enough valid signatures: 0/8")
    # without certificates it is only inspected
    res = _run(str(forged), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["params"]["KISTSchedRunInterval"] == 3


def test_inspect_bad_files(tmp_path, consensus_path, certs_path):
    truncated = tmp_path / "truncated"
    truncated.write_bytes(consensus_path.read_bytes()[:100_000])
    for path, expected in ((truncated, "truncated"), (tmp_path / "missing", "cannot read")):
        res = _run(str(path))
        assert res.returncode == 1
        assert res.stderr.startswith(f"kistexp: error: {path}") and expected in res.stderr
        assert res.stderr.strip().count("\n") == 0 and "Traceback" not in res.stderr
    # more configured authorities than signers: 8 valid < 9 needed for N=17
    res = _run(str(consensus_path), "--certs", str(certs_path), "--n-authorities", "17")
    assert res.returncode == 1 and "8/8 signatures valid, 9 needed (N=17)" in res.stderr
