"""`kistexp dry-run`, `status`, `history`, control commands and `rollback --dry-run` from the command line."""

import json
import os
import subprocess
import sys

import pytest

from tests.rollout_helpers import KIST_EFFECTS, write_predictions

PLAN = "plans/kist-run-interval-2020.toml"


def kistexp(*argv):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture(scope="module")
def preds(tmp_path_factory):
    path = tmp_path_factory.mktemp("preds") / "exp"
    write_predictions(path, KIST_EFFECTS).close()
    return path


def test_dry_run_with_a_rehearsed_rollback_names_kind_authorities_and_times(preds, tmp_path):
    proc = kistexp("dry-run", PLAN, "--predictions", str(preds), "--dir", str(tmp_path / "e"),
                   "--inject", "stage=1:relay_cpu_utilization=+50%", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["final_state"] == "PAUSED"
    (rb,) = out["rollbacks"]
    assert rb["kind"] == "step-back" and len(rb["authorities_must_act"]) == 2
    assert rb["relays_back_after_s"] > 0 and rb["clients_99pct"] > rb["relays_99pct"]
    assert any(d["decision"] == "rollback:step-back" for d in out["decisions"])
    assert out["wall_s"] < 60
    # the journal it wrote answers status, history and the read-only rollback preview
    status = json.loads(kistexp("status", str(tmp_path / "e"), "--json").stdout)
    assert status["state"] == "PAUSED" and status["reasons"] == ["stepped-back"]
    history = json.loads(kistexp("history", str(tmp_path / "e"), "--json").stdout)
    assert [d["decision"] for d in history["decisions"]][-2:] == ["rollback:step-back", "stepped-back"]


def test_dry_run_text_timeline_and_bad_input(preds):
    # (the whole plan to COMPLETED is tests/rollout/test_rollout_engine.py's; the text form is the same code)
    proc = kistexp("dry-run", PLAN, "--predictions", str(preds), "--inject", "stage=1:relay_cpu_utilization=+50%")
    assert proc.returncode == 0, proc.stderr
    assert "KISTSchedRunInterval=2" in proc.stdout and "rollback:step-back" in proc.stdout
    assert "rollback step-back from stage 1" in proc.stdout and "PAUSED (stepped-back)" in proc.stdout
    bad = kistexp("dry-run", PLAN, "--predictions", str(preds), "--inject", "stage=7:relay_cpu_utilization=+5%")
    assert bad.returncode == 1 and bad.stderr.startswith("kistexp: error: --inject") and "Traceback" not in bad.stderr
    none = kistexp("dry-run", PLAN)
    assert none.returncode == 1 and "kistexp simulate" in none.stderr


def test_commands_are_checked_then_queued_and_rollback_preview_touches_nothing(preds, tmp_path):
    exp = tmp_path / "e"
    assert kistexp("dry-run", PLAN, "--predictions", str(preds), "--dir", str(exp),
                   "--inject", "stage=1:relay_cpu_utilization=+50%").returncode == 0
    refused = kistexp("retry", str(exp), "--json")
    assert refused.returncode == 1 and "retry restarts an aborted stage" in refused.stderr
    ok = json.loads(kistexp("promote", str(exp), "--json").stdout)
    assert ok["state"] == "queued"
    db = exp / "experiment.db"
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    (exp / "run.lock").unlink()  # the dry run's lock: the preview must not take one
    preview = kistexp("rollback", str(exp), "--dry-run", "--json")
    assert preview.returncode == 0, preview.stderr
    kinds = {p["kind"]: p for p in json.loads(preview.stdout)}
    assert set(kinds) == {"step-back", "revert-default", "remove-param", "hold"}
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before  # §7.14
    assert not (exp / "run.lock").exists()
