"""`dry-run PLAN --replay FILE...`: recorded series judged by the plan's criteria on their own timestamps."""

import csv
import datetime as dt
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kistexp.plan.loader import load_plan
from kistexp.rollout.replay import ReplayError, replay
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import RELAY_CPU_CRITERION

# baseline, then two stages of 8 h each (the second behind a manual gate, approved), laid on the
# 2021-06-01 OnionPerf day
PLAN = VALID_PLAN.split("[[criteria]]")[0].replace('duration = "7d"', 'duration = "8h"').replace(
    'duration = "14d"', 'duration = "8h"') + RELAY_CPU_CRITERION + """
[[criteria]]
name = "circuit build"
metric = "circuit_build_time_s"
statistic = "median"
comparison = "relative-increase"
threshold = 0.5
min_samples = 100
on_fail = "revert-default"
"""
DAY = dt.datetime(2021, 6, 1, tzinfo=dt.timezone.utc)


def operator_csv(path, shift_from_hour=None, hours=24, relays=30):
    """Hourly CPU of ``relays`` relays; from ``shift_from_hour`` on, 50 % higher."""
    rng = np.random.default_rng(7)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["relay_fingerprint", "window_start_utc", "window_end_utc", "cpu_pct_core_mean"])
        for h in range(hours):
            for r in range(relays):
                v = rng.lognormal(np.log(40), 0.3) * (1.5 if shift_from_hour is not None and h >= shift_from_hour
                                                      else 1.0)
                a = DAY + dt.timedelta(hours=h, minutes=r)
                w.writerow([f"{r + 1:040X}", a.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            (a + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), f"{v:.3f}"])
    return path


@pytest.fixture
def plan(tmp_path):
    p = tmp_path / "plan.toml"
    p.write_text(PLAN)
    return load_plan(p)


def test_unshifted_recordings_fire_no_rollback(plan, onionperf_hk6a, tmp_path):
    r = replay(plan, [str(onionperf_hk6a), str(operator_csv(tmp_path / "ops.csv"))])
    assert r.first_rollback is None
    assert r.dry_run["final_state"] == "COMPLETED"
    # the plan is laid on the record: baseline from the first sample's hour, stages after it
    assert r.recorded_from.replace(minute=0, second=0, microsecond=0) == DAY
    assert [(w["name"], w["start"]) for w in r.windows] == [
        ("baseline", DAY), ("two", DAY + dt.timedelta(hours=8)), ("eight", DAY + dt.timedelta(hours=16))]
    # both criteria were judged from the recorded samples of each stage hour
    counts = r.dry_run["verdict_counts"]
    assert counts["relay CPU"].get("pass", 0) >= 2 and counts["circuit build"].get("pass", 0) >= 2
    assert "fail" not in counts["relay CPU"] and "fail" not in counts["circuit build"]
    assert {x["kind"] for x in r.recordings} == {"onionperf", "operator-report"}


def test_cpu_shifted_in_the_second_stage_fires_a_step_back_there(plan, onionperf_hk6a, tmp_path):
    r = replay(plan, [str(onionperf_hk6a), str(operator_csv(tmp_path / "ops.csv", shift_from_hour=16))])
    fb = r.first_rollback
    assert fb is not None
    assert fb["criterion"] == "relay CPU" and fb["kind"] == "step-back"
    assert fb["stage"] == 2 and fb["stage_name"] == "eight"
    assert fb["stage_window"] == [DAY + dt.timedelta(hours=16), DAY + dt.timedelta(hours=24)]
    # not before the shift, and within the failure limit's few hours after it
    assert DAY + dt.timedelta(hours=16) < fb["at"] <= DAY + dt.timedelta(hours=22)
    assert fb["verdict"]["outcome"].lower() == "fail" and fb["verdict"]["effect"] > 0.25
    assert fb["authorities_must_act"] and fb["relays_back_after_s"] > 0
    # the first stage, unshifted, passed
    assert r.dry_run["final_state"] != "COMPLETED"


def test_align_moves_the_plan_and_a_late_alignment_is_refused(plan, onionperf_hk6a, tmp_path):
    ops = [str(onionperf_hk6a), str(operator_csv(tmp_path / "ops.csv", shift_from_hour=16))]
    assert replay(plan, ops, align=DAY).first_rollback["stage"] == 2
    # aligned 8 h later, the shift falls in the first stage
    early = replay(plan, ops, align=DAY + dt.timedelta(hours=8))
    assert early.windows[1]["start"] == DAY + dt.timedelta(hours=16)
    assert early.first_rollback["stage"] == 1
    with pytest.raises(ReplayError, match="before the aligned baseline starts"):
        replay(plan, ops, align=DAY + dt.timedelta(days=3))


def test_recordings_without_the_plans_metrics_are_refused(plan, tmp_path):
    other = tmp_path / "mem.csv"
    other.write_text("relay_fingerprint,window_start_utc,window_end_utc,rss_mib_mean\n"
                     f"{'A' * 40},2021-06-01T00:00:00Z,2021-06-01T01:00:00Z,300\n")
    with pytest.raises(ReplayError, match="no samples of the plan's metrics"):
        replay(plan, [str(other)])


def test_cli_replay_json_and_text(plan, onionperf_hk6a, tmp_path):
    ops = str(operator_csv(tmp_path / "ops.csv", shift_from_hour=16))
    env = dict(os.environ, PYTHONPATH=os.getcwd())

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "kistexp", "dry-run", plan.path, *argv],
                              capture_output=True, text=True, env=env, timeout=120)

    js = run("--replay", str(onionperf_hk6a), "--replay", ops, "--dir", str(tmp_path / "exp"), "--json")
    assert js.returncode == 0, js.stderr
    out = json.loads(js.stdout)
    assert out["first_rollback"]["criterion"] == "relay CPU" and out["first_rollback"]["stage"] == 2
    assert (tmp_path / "exp" / "experiment.db").is_file()
    text = run("--replay", str(onionperf_hk6a), "--replay", ops)
    assert text.returncode == 0 and "rollback step-back would have fired" in text.stdout
    assert "stage 2 (eight)" in text.stdout
    bad = run("--replay", str(tmp_path / "missing.json"))
    assert bad.returncode == 1 and bad.stderr.startswith("kistexp: error:") and "missing.json" in bad.stderr
