"""Faults a live run meets (issue 11, "Bad input and faults"; rollout.md §2.6, §3.3, §3.7): drift before
acting, a consensus that never comes, clock jumps, a stale or live owner, a locked, corrupt or foreign
journal. Each refusal is one line."""

import datetime as dt
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kistexp.clock import UTC, RealClock, VirtualClock
from kistexp.dirauth.schedule import AcceleratedSchedule
from kistexp.metrics.series import to_us
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import parse_plan
from kistexp.rollout import journal as journal_mod
from kistexp.rollout.actuators import Intent
from kistexp.rollout.drivers import LiveDriver, VirtualDriver
from kistexp.rollout.dryrun import PredictedMetrics, dry_run, initial_configs, load_curves
from kistexp.rollout.engine import Engine
from kistexp.rollout.journal import Journal, JournalLockedError, LockedError
from kistexp.rollout.machine import MISSING_ROUNDS_FACTOR, initial_status, step
from kistexp.rollout.runs import open_run
from kistexp.rollout.spec import LIVE_CADENCE, Cadence, RolloutError, spec_from_plan
from kistexp.rollout.state import PAUSED, TRANSITIONING, ConsensusCheck, DecisionDue, Start
from tests.model_authorities import SimulatedAuthorities
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

KIST = "KISTSchedRunInterval"
SHORT = (VALID_PLAN.replace('duration = "7d"', 'duration = "2h"').replace('duration = "14d"', 'duration = "3h"')
         .replace('gate = "manual"', 'gate = "auto"'))
SHORT = SHORT[: SHORT.index("[[criteria]]")] + RELAY_CPU_CRITERION
NO_EFFECTS = {"baseline": {}, "two": {}, "eight": {}}


def _engine(tmp_path, spec, clock, name="e"):
    write_predictions(tmp_path / name, NO_EFFECTS).close()
    journal = Journal(tmp_path / name / "experiment.db", durable=False)
    sim = SimulatedAuthorities(spec.authorities, initial_configs(spec), spec.cadence, clock)
    curves, levels = load_curves(MetricStore(journal.conn), spec, "plan")
    return Engine(spec, journal, sim, PredictedMetrics(spec, curves, levels, sim), clock), sim, journal


def _until_transition(engine, clock):
    """Step the virtual clock until stage 1's intents are written but before they are acted."""
    intents_at = {}

    def hook(name):
        if name == "before_intent" and not intents_at:
            intents_at["t"] = clock.now()
    engine.hook = hook
    VirtualDriver(engine, clock).run(stop=lambda e: e.status.state != "BASELINE")
    return intents_at


# --- drift: re-read each authority before acting (§3.3) --------------------------------------------

def test_an_authority_changed_by_someone_else_pauses_with_drift_and_is_left_alone(tmp_path):
    spec = spec_from_plan(parse_plan(SHORT))
    clock = VirtualClock(spec.baseline_start)
    engine, sim, journal = _engine(tmp_path, spec, clock)
    # an operator sets dizum to 7 by hand during the baseline
    VirtualDriver(engine, clock).run(until=spec.baseline_start + 1.5 * spec.hour)
    sim.apply(Intent("dizum", {KIST: 7}, "dizum's operator"))
    VirtualDriver(engine, clock).run(stop=lambda e: e.status.state == PAUSED)
    st = engine.status
    assert st.state == PAUSED and "drift" in st.reasons and st.resume_to == TRANSITIONING
    d = journal.decisions()[-1]
    assert d["decision"] == "pause:drift"
    assert d["message"] == (f"drift: dizum has {KIST}=7, neither the target {KIST}=2 nor a value the rollout set "
                            "before; not changing it (abort or undo to continue)")
    assert [(c.authority, c.new) for c in sim.changes if c.authority == "dizum"] == [("dizum", ((KIST, 7),))]
    assert sim.current("dizum") == {KIST: 7}
    n = len(sim.changes)
    VirtualDriver(engine, clock).run(until=clock.now() + 3 * spec.hour)  # nothing is sent while it drifts
    assert len(sim.changes) == n
    # an abort is the way back: its rollback is sent whatever dizum has
    journal.queue_command("abort", {}, "alice", clock.now())
    VirtualDriver(engine, clock).run()
    assert engine.status.state == "ABORTED"
    assert sim.current("dizum") == {KIST: 10}


def test_a_resumed_run_finds_its_change_already_applied_and_sends_nothing(tmp_path):
    spec = spec_from_plan(parse_plan(SHORT))
    clock = VirtualClock(spec.baseline_start)
    engine, sim, journal = _engine(tmp_path, spec, clock)

    class Killed(Exception):
        pass

    def hook(name):
        if name == "after_intent":
            # the change reached dizum, then the process died before the journal said so
            intent = next(i for i in journal.intents(("intended",)) if i["authority"] == "dizum")
            sim.apply(Intent("dizum", intent["desired"], intent["idem_key"]))
            raise Killed
    engine.hook = hook
    with pytest.raises(Killed):
        VirtualDriver(engine, clock).run()
    before = len(sim.changes)
    resumed = Engine(spec, journal, sim, engine.metrics, clock)
    VirtualDriver(resumed, clock).run(stop=lambda e: e.status.state == "MEASURING")
    dizum = [c for c in sim.changes if c.authority == "dizum"]
    assert [c.new for c in dizum] == [((KIST, 2),)]  # once, not twice
    assert len(sim.changes) == before + len(spec.participating) - 1
    done = next(i for i in journal.intents() if i["authority"] == "dizum" and i["seq"] == 1)
    assert done["state"] == "done" and "already set" in done["evidence"]


# --- a consensus that never shows the value, or never comes (§1.4) -----------------------------------

def test_consensus_never_published_is_counted_apart_then_pauses_saying_so():
    spec = spec_from_plan(parse_plan(VALID_PLAN))
    st = step(spec, initial_status(spec), Start(spec.baseline_start)).status
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    st, va = out.status, out.transition.target_va
    hour = dt.timedelta(hours=1)
    limit = MISSING_ROUNDS_FACTOR * spec.consensus_rounds
    for k in range(limit - 1):
        out = step(spec, st, ConsensusCheck(va + k * hour, va + k * hour, None))
        assert out.transition.kind == "reassert" and "was not published" in out.transition.cause
        st = out.status
        assert st.rounds_waited == 0 and st.rounds_missing == k + 1
    out = step(spec, st, ConsensusCheck(st.target_va, st.target_va, None))
    assert out.status.state == PAUSED and "not-in-consensus" in out.status.reasons
    assert out.message.startswith(f"no consensus published for {limit} rounds")


def test_a_late_check_reasserts_for_a_round_still_feasible():
    spec = spec_from_plan(parse_plan(VALID_PLAN))
    st = step(spec, initial_status(spec), Start(spec.baseline_start)).status
    out = step(spec, st, DecisionDue(st.decision_at, 0))
    va = out.transition.target_va
    late = va + dt.timedelta(hours=5, minutes=20)  # resumed five hours after the round
    out = step(spec, out.status, ConsensusCheck(late, va, None, late=True))
    assert out.transition.target_va == spec.cadence.next_feasible_va(late) == va + dt.timedelta(hours=6)
    # directory servers serve only the newest consensus: one looked for that late is unknown, not missing
    assert out.status.rounds_missing == 0 and out.status.rounds_waited == 0
    assert "could not be checked in time" in out.transition.cause


# --- clock jumps (§2.6) ----------------------------------------------------------------------------

class JumpingClock(RealClock):
    """The wall clock with an offset a test can step, as NTP or an operator would; monotonic time
    is untouched."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC) + self.offset

    def timestamp(self) -> float:
        return self.now().timestamp()


@pytest.mark.slow
def test_clock_jumps_are_journaled_and_fire_nothing_twice_and_skip_nothing(tmp_path):
    clock = JumpingClock()
    cadence = Cadence.of(AcceleratedSchedule.scaled(2), margin_s=0.5)
    spec = spec_from_plan(parse_plan(SHORT), cadence, start=clock.now() + dt.timedelta(seconds=5))
    engine, sim, journal = _engine(tmp_path, spec, clock)
    driver = LiveDriver(engine, clock, poll_s=0.2)

    def jumps():
        time.sleep(4)
        clock.offset += dt.timedelta(seconds=7)  # forward: 3.5 plan hours at once
        time.sleep(4)
        clock.offset -= dt.timedelta(seconds=5)  # backward

    t = threading.Thread(target=jumps, daemon=True)
    t.start()
    driver.run(timeout_s=90)
    t.join()
    assert engine.status.state == "COMPLETED"
    notes = [d["message"] for d in journal.decisions() if d["decision"] == "clock-jump"]
    assert len(notes) == 2
    assert notes[0].startswith("wall clock jumped forward 7.") and notes[1].startswith("wall clock jumped backward 5.")
    # every hourly collection from the first to the last, once each: none skipped by the jump forward,
    # none repeated after the jump back
    windows = [r[0] for r in journal.conn.execute("SELECT window_us FROM rollout_metric_batches ORDER BY window_us")]
    step_us = to_us(spec.baseline_start + spec.hour) - to_us(spec.baseline_start)
    assert windows == list(range(windows[0], windows[-1] + 1, step_us))
    # and each transition's values reached each participant once
    changed = [(c.authority, c.new) for c in sim.changes]
    assert len(changed) == len(set(changed)) == 2 * len(spec.participating)


# --- the owner: heartbeat and takeover (§3.7) -------------------------------------------------------

def _plan(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN)
    return plan


def _owner(exp, pid, host, beat_ago_s):
    now = dt.datetime.now(UTC)
    db = sqlite3.connect(exp / "experiment.db")
    with db:
        db.execute("INSERT INTO rollout_runs (pid, host, argv, start_us) VALUES (?, ?, '[]', ?)",
                   (pid, host, to_us(now - dt.timedelta(minutes=5))))
        db.execute("INSERT OR REPLACE INTO rollout_owner (id, pid, host, since_us, heartbeat_us) "
                   "VALUES (1, ?, ?, ?, ?)", (pid, host, to_us(now - dt.timedelta(minutes=5)),
                                              to_us(now - dt.timedelta(seconds=beat_ago_s))))
    db.close()


def _open(plan, exp):
    setup = open_run(plan, exp, "instructions", LIVE_CADENCE, RealClock())
    setup.journal.close()
    setup.lock.release()
    return setup


def test_a_killed_owner_is_taken_over_and_its_run_closed_at_its_last_heartbeat(tmp_path):
    plan, exp = _plan(tmp_path), tmp_path / "exp"
    _open(plan, exp)
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: this pid runs nothing now
    _owner(exp, dead.pid, socket.gethostname(), beat_ago_s=1)
    _open(plan, exp)
    db = sqlite3.connect(exp / "experiment.db")
    reason, end = db.execute("SELECT reason, end_us FROM rollout_runs WHERE pid = ?", (dead.pid,)).fetchone()
    assert reason.startswith("taken over: no heartbeat since") and end is not None
    db.close()


def test_a_live_owner_is_refused_even_when_the_lock_file_was_replaced(tmp_path):
    plan, exp = _plan(tmp_path), tmp_path / "exp"
    _open(plan, exp)
    alive = subprocess.Popen(["sleep", "30"])
    try:
        _owner(exp, alive.pid, socket.gethostname(), beat_ago_s=2)
        with pytest.raises(LockedError) as err:
            _open(plan, exp)
        msg = str(err.value)
        assert f"already being run by pid {alive.pid} on {socket.gethostname()}" in msg
        assert "run.lock was free: was it deleted?" in msg and "\n" not in msg
        # another host's fresh heartbeat is refused too; a silent one is taken over
        _owner(exp, 4711, "elsewhere", beat_ago_s=3)
        with pytest.raises(LockedError, match="pid 4711 on elsewhere"):
            _open(plan, exp)
        _owner(exp, 4711, "elsewhere", beat_ago_s=journal_mod.HEARTBEAT_STALE_S + 5)
        _open(plan, exp)
    finally:
        alive.kill()
        alive.wait()


# --- the database: locked, corrupt, another plan's, a dry run's -----------------------------------------

def test_a_locked_database_is_a_one_line_refusal_and_nothing_is_half_written(tmp_path, monkeypatch):
    plan, exp = _plan(tmp_path), tmp_path / "exp"
    _open(plan, exp)
    monkeypatch.setattr(journal_mod, "BUSY_TIMEOUT_S", 0.3)
    other = sqlite3.connect(exp / "experiment.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        j = Journal(exp / "experiment.db")
        before = j.conn.execute("SELECT COUNT(*) FROM rollout_commands").fetchone()[0]
        with pytest.raises(JournalLockedError) as err:
            j.queue_command("pause", {}, "alice", dt.datetime.now(UTC))
        assert str(err.value) == (f"{exp / 'experiment.db'}: the database is locked by another process (waited 0 s); "
                                  "nothing was written, rerun when it is free")
        other.execute("ROLLBACK")
        assert j.conn.execute("SELECT COUNT(*) FROM rollout_commands").fetchone()[0] == before
        j.queue_command("pause", {}, "alice", dt.datetime.now(UTC))  # free again: it works
        j.close()
    finally:
        other.close()


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(Path.cwd())))


@pytest.mark.parametrize("content", [os.urandom(4096), b"SQLite format 3\x00" + os.urandom(8192)])
def test_run_on_a_corrupt_database_is_one_line(tmp_path, content):
    plan, exp = _plan(tmp_path), tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.db").write_bytes(content)
    r = _cli("run", str(plan), "--dir", str(exp), "--authorities", "instructions", "--metrics", "predicted")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"kistexp: error: {exp / 'experiment.db'}: ")
    assert "not an SQLite database" in r.stderr or "corrupt experiment database" in r.stderr


def test_a_dry_runs_journal_is_refused_for_a_live_run(tmp_path):
    write_predictions(tmp_path / "exp", NO_EFFECTS).close()
    plan = _plan(tmp_path)
    dry_run(parse_plan(SHORT), tmp_path / "exp")
    with pytest.raises(RolloutError, match=r"holds a dry run's journal; use another directory for a live run$"):
        _open(plan, tmp_path / "exp")


def test_a_reader_closing_in_another_process_loses_no_later_commit(tmp_path):
    """The live run opens the experiment database more than once (journal, metric store); none of
    those opens may drop the process's locks, or another process's closing reader deletes the WAL
    under the journal and every commit after it is lost (found by the crash test)."""
    from kistexp.store.schema import open_db

    db = tmp_path / "experiment.db"
    open_db(db).close()
    j = Journal(db)
    open_db(db).close()  # a second open in the same process, as MetricStore's
    reader = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
              "print(c.execute('SELECT COUNT(*) FROM rollout_commands').fetchone()[0]); c.close()")
    assert subprocess.run([sys.executable, "-c", reader, str(db)], capture_output=True, text=True).stdout == "0\n"
    j.queue_command("pause", {}, "alice", dt.datetime.now(UTC))  # after the reader closed
    seen = subprocess.run([sys.executable, "-c", reader, str(db)], capture_output=True, text=True).stdout
    j.close()
    assert seen == "1\n"
