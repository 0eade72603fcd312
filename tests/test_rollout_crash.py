"""kill -9 a live run against fake authorities at random instants; each resume must lose and repeat nothing.

KISTEXP_CRASH_KILLS sets the number of kills (default 6, to keep the wall time near a minute)."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kistexp.plan.loader import parse_plan
from kistexp.rollout.spec import spec_from_plan
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import write_predictions

PLAN = (VALID_PLAN.replace('duration = "7d"', 'duration = "2h"').replace('duration = "14d"', 'duration = "3h"')
        .replace('gate = "manual"', 'gate = "auto"')
        .replace('metric = "client_ttlb_1mib_s"', 'metric = "relay_cpu_utilization"')
        .replace('min_samples = 100', 'min_samples = 50'))
EFFECTS = {"baseline": {}, "two": {}, "eight": {}}
KILLS = int(os.environ.get("KISTEXP_CRASH_KILLS", "6"))

RUNNER = """
import sys
from pathlib import Path
from kistexp.rollout.runs import live_run
st = live_run(Path(sys.argv[1]), Path(sys.argv[2]), "fake", interval_s=4, key_bits=(1024, 1024), timeout_s=240)
print(st.state)
"""


def start(plan, exp):
    env = dict(os.environ, PYTHONPATH=str(Path.cwd()))
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(plan), str(exp)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.skip(reason="issue 11 open: since the engine judges with kistexp.judge, this plan's short stages stay "
                         "INCONCLUSIVE and hold, so the live run does not finish in time; the plan needs stages the "
                         "sequential judge can decide")
def test_kill_minus_nine_at_random_instants_then_resume(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    exp = tmp_path / "exp"
    write_predictions(exp, EFFECTS).close()
    rng = random.Random(7)
    kills = 0
    proc = start(plan, exp)
    # a second run on the same directory is refused within a second, naming the holder (§7.11)
    time.sleep(4)
    t0 = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "kistexp", "run", str(plan), "--dir", str(exp)],
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(Path.cwd())))
    assert second.returncode == 1 and "already being run by pid" in second.stderr
    assert time.monotonic() - t0 < 5
    while kills < KILLS:
        try:
            # the fake authorities live in the killed process: kills closer than a couple of rounds
            # can leave three consensuses unpublished, which rightly pauses (not-in-consensus)
            proc.wait(timeout=rng.uniform(4, 9))
            break  # finished before the next kill
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            db = sqlite3.connect(exp / "experiment.db")
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # §7.13
            db.close()
            proc = start(plan, exp)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == "COMPLETED"
    assert kills >= 3
    db = sqlite3.connect(exp / "experiment.db")
    # §7.2: every intent finished; keys unique by the schema
    states = {r[0] for r in db.execute("SELECT state FROM rollout_intents")}
    assert states <= {"done", "superseded"}
    # §7.3: the stages' transitions happened once each (re-asserts only after a slipped round)
    kinds = [r[0] for r in db.execute("SELECT kind FROM rollout_transitions ORDER BY seq")]
    assert kinds.count("stage") == 2 and set(kinds) <= {"stage", "reassert"}
    # §7.11: runs never overlap
    runs = db.execute("SELECT start_us, end_us FROM rollout_runs ORDER BY id").fetchall()
    assert len(runs) == kills + 1
    for (_, end), (nxt, _) in zip(runs, runs[1:], strict=False):
        assert end is None or end <= nxt
    # no event processed twice, decisions in a legal order
    decisions = [r[0] for r in db.execute("SELECT decision FROM rollout_decisions ORDER BY id")]
    assert decisions[0] == "baseline" and decisions[-1] == "complete"
    assert decisions.count("stage:1") == 1 and decisions.count("stage:2") == 1
    # the authorities were left at the last stage's values
    spec = spec_from_plan(parse_plan(PLAN))
    saved = json.loads((exp / "fake-authorities" / "consensus-params.json").read_text())
    last = [f"{k}={v}" for k, v in spec.values_of(spec.n_stages)]
    base = [f"{k}={v}" for k, v in spec.baseline_values]
    assert all(saved[a] == last for a in spec.participating), saved
    assert all(saved[a] == base for a in saved if a not in spec.participating), saved
