"""Nothing a user runs destroys a journal or writes through a device (issue 34, points 1 and 7).

* a dry run or a replay refuses a directory holding a live run's journal, another plan's or the other kind of
  rehearsal's, and leaves it byte for byte as it was; its own earlier journal, or predictions only, it takes;
* a plan edited while a run goes on pauses it once (the second ``plan-changed`` used to stop the run on the
  journal's unique event key);
* output files go only to new names or regular files: FIFOs, devices, directories and symlinks are refused
  without blocking and without a rename;
* a sweep's name never places its output outside the sweeps directory;
* replays honour ``--inject`` and ``--command``; ``abort=hold`` pauses with the votes unchanged.
"""

from __future__ import annotations

import datetime as dt
import gc
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kistexp.clock import VirtualClock
from kistexp.errors import KistexpError, SweepError
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import load_plan
from kistexp.rollout.drivers import VirtualDriver
from kistexp.rollout.dryrun import InjectionError, PredictedMetrics, dry_run, initial_configs, load_curves
from kistexp.rollout.engine import Engine
from kistexp.rollout.journal import Journal, JournalInUseError, RunLock
from kistexp.rollout.replay import replay
from kistexp.rollout.runs import open_run, plan_hashes, plan_watch
from kistexp.rollout.spec import LIVE_CADENCE, spec_from_plan
from kistexp.safeio import OutputPathError, check_output_path, open_output, write_atomic
from kistexp.sweep.spec import parse_sweep
from tests.model_authorities import SimulatedAuthorities
from tests.plan_helpers import short_plan
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

# a 2 h baseline and two 3 h stages: a dry run of it takes about a second
TINY = short_plan("tiny", {"one": 2, "two": 5}, RELAY_CPU_CRITERION)
OTHER = short_plan("other", {"one": 2, "two": 5}, RELAY_CPU_CRITERION)
EFFECTS = {"baseline": {}, "one": {}, "two": {}}


def kistexp(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def snapshot(directory: Path) -> dict[str, str]:
    """Each file of ``directory`` by its SHA-256 (the run lock file is only ever opened, never written)."""
    gc.collect()  # connections a refused command left to the collector are closed before the bytes are read
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def plans(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "other.toml").write_text(OTHER)
    return tmp_path / "tiny.toml", tmp_path / "other.toml"


@pytest.fixture
def live(tmp_path, plans):
    """An experiment directory holding a live run's journal (instructions mode) and the plan's predictions."""
    exp = tmp_path / "live"
    setup = open_run(plans[0], exp, "instructions", LIVE_CADENCE, VirtualClock(dt.datetime(2030, 1, 1,
                                                                                          tzinfo=dt.timezone.utc)))
    setup.journal.close()
    setup.lock.release()
    write_predictions(exp, EFFECTS).close()
    return exp


# --- 1. a dry run or replay never replaces a journal that is not its own ----------------------------------

def test_dry_run_on_a_live_runs_directory_is_refused_and_leaves_it_byte_identical(live, plans):
    before = snapshot(live)
    with pytest.raises(JournalInUseError) as refused:
        dry_run(load_plan(plans[0]), live)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{live}: holds the journal of a live run "
                                                       "(--authorities instructions) of plan 'tiny'")
    assert message.endswith("pass another --dir")
    assert snapshot(live) == before  # the journal and its plan.toml untouched
    # from the command line: one line, exit 1, and still nothing written
    proc = kistexp("dry-run", str(plans[1]), "--dir", str(live))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "live run (--authorities instructions)" in proc.stderr
    assert snapshot(live) == before


def test_dry_run_beside_a_live_run_going_on_is_refused(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    lock = RunLock(exp)
    lock.acquire()  # a live run holds the directory (it would die if its journal were emptied under it)
    try:
        before = snapshot(exp)
        with pytest.raises(JournalInUseError, match=rf"^{exp}: a run holds its run.lock now; .*another --dir$"):
            dry_run(load_plan(plans[0]), exp)
        assert snapshot(exp) == before
    finally:
        lock.release()


def test_dry_run_on_another_plans_dry_run_is_refused(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    dry_run(load_plan(plans[0]), exp)
    before = snapshot(exp)
    with pytest.raises(JournalInUseError, match=r"holds the journal of a dry run of plan 'tiny', not 'other'; "
                                                r"a dry run never replaces it: pass another --dir"):
        dry_run(load_plan(plans[1]), exp)
    assert snapshot(exp) == before
    assert (exp / "plan.toml").read_text() == TINY


def test_the_same_dry_run_reruns_on_its_own_predictions_directory(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()  # predictions only, as `kistexp simulate` leaves it
    first = dry_run(load_plan(plans[0]), exp)
    again = dry_run(load_plan(plans[0]), exp, commands=["stage1+1h:pause"])
    third = dry_run(load_plan(plans[0]), exp)
    assert first.final_state == third.final_state == "COMPLETED" and again.final_state == "PAUSED"
    assert [d["decision"] for d in first.decisions] == [d["decision"] for d in third.decisions]


def test_a_replay_never_replaces_a_dry_run_nor_a_dry_run_a_replay(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    dry_run(load_plan(plans[0]), exp)
    before = snapshot(exp)
    with pytest.raises(JournalInUseError, match=r"holds the journal of a dry run of plan 'tiny'; a replay never"):
        replay(load_plan(plans[0]), [str(operator_csv(tmp_path / "ops.csv"))], exp)
    assert snapshot(exp) == before
    replayed = tmp_path / "r"
    replay(load_plan(plans[0]), [str(tmp_path / "ops.csv")], replayed)
    write_predictions(replayed, EFFECTS).close()
    with pytest.raises(JournalInUseError, match=r"holds the journal of a replay of plan 'tiny'; a dry run never"):
        dry_run(load_plan(plans[0]), replayed)


def test_a_journal_without_a_mode_is_not_taken_for_an_empty_one(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    journal = Journal(exp / "experiment.db")
    journal.begin_run(["kistexp", "run"], dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    journal.close()
    with pytest.raises(JournalInUseError, match=r"no mode in rollout_meta \(rows in rollout_runs\)"):
        dry_run(load_plan(plans[0]), exp)


_META_TEXT = st.one_of(st.sampled_from(["dry-run", "fake", "local", "instructions", "predicted", "recorded",
                                         "dry-run:tiny", "dry-run:other", "tiny:20300101T000000"]),
                       st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=8))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["mode", "metrics", "experiment_id", "plan_canon"]), _META_TEXT))
def test_a_rehearsal_takes_only_its_own_journal_whatever_the_meta_holds(tmp_path, found):
    journal = Journal(tmp_path / "experiment.db", durable=False)
    try:
        journal.conn.execute("DELETE FROM rollout_meta")
        journal.conn.executemany("INSERT INTO rollout_meta (key, value) VALUES (?, ?)", found.items())
        own = {"mode": "dry-run", "metrics": "predicted", "experiment_id": "dry-run:tiny"}
        mine = (found.get("mode") == "dry-run" and found.get("metrics") != "recorded"
                and found.get("experiment_id") == "dry-run:tiny")
        try:
            journal.refuse_foreign(**own)
        except JournalInUseError as exc:
            assert "\n" not in str(exc) and str(exc).endswith("pass another --dir")
            assert "mode" in found and not mine
        else:
            assert "mode" not in found or mine
    finally:
        journal.close()


# --- 1. a plan edited while a run goes on pauses it once ---------------------------------------------------

def test_a_plan_edited_mid_run_pauses_it_once_without_a_crash(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    plan_path = plans[0]
    spec = spec_from_plan(load_plan(plan_path))
    journal = Journal(exp / "experiment.db", durable=False)
    raw, canon_sha, canon = plan_hashes(plan_path)
    journal.set_meta(plan_sha256=raw, plan_canon_sha256=canon_sha, plan_canon=json.dumps(canon, sort_keys=True))
    clock = VirtualClock(spec.baseline_start)
    sim = SimulatedAuthorities(spec.authorities, initial_configs(spec), spec.cadence, clock)
    curves, levels = load_curves(MetricStore(journal.conn), spec, str(plan_path))
    engine = Engine(spec, journal, sim, PredictedMetrics(spec, curves, levels, sim), clock,
                    plan_check=plan_watch(plan_path, journal), experiment_id="edited")
    driver = VirtualDriver(engine, clock)
    driver.run(until=spec.start - dt.timedelta(minutes=30))  # the baseline, before stage 1's intents
    assert engine.status.state == "BASELINE"
    plan_path.write_text(TINY.replace('duration = "3h"', 'duration = "4h"', 1))  # edited under the run
    driver.run(until=spec.start + dt.timedelta(hours=4))  # the act trigger and the transition both see it
    pauses = [d for d in journal.decisions() if d["decision"] == "pause:plan-changed"]
    assert len(pauses) == 1 and "stages[0].duration" in pauses[0]["message"]
    assert engine.status.state == "PAUSED" and "plan-changed" in engine.status.reasons
    # nothing was sent under the edited plan: intents wait (or are superseded by the next round's), none acted
    assert {i["state"] for i in journal.intents()} <= {"intended", "superseded"}
    assert sim.changes == []
    journal.close()


# --- 1. output files: regular files or new names only ------------------------------------------------------

def _in_thread(fn, *args):
    """``fn(*args)`` in a thread; its exception, or a failure if it is still running after 10 s (it blocked)."""
    box: dict = {}

    def target():
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the write blocked"
    return box.get("exc")


def test_fifos_symlinks_and_directories_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "report.html"
    to_fifo.symlink_to(fifo)
    target = tmp_path / "target.html"
    target.write_text("kept")
    to_file = tmp_path / "link.html"
    to_file.symlink_to(target)
    for path, found in ((fifo, "a FIFO"), (to_fifo, "a symbolic link"), (to_file, "a symbolic link"),
                        (tmp_path, "a directory")):
        exc = _in_thread(write_atomic, path, b"x", "the report", KistexpError)
        assert isinstance(exc, KistexpError) and str(exc).startswith(f"{path}: cannot write the report: it is {found}")
        exc = _in_thread(open_output, path, "the partial results")
        assert isinstance(exc, OutputPathError) and "cannot write the partial results" in str(exc)
    assert fifo.exists() and os.path.islink(to_fifo) and target.read_text() == "kept" and os.path.islink(to_file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "pipe", "report.html", "target.html"]


def test_a_fifo_with_a_reader_is_still_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a writer's open would now succeed
    try:
        exc = _in_thread(open_output, fifo, "the partial results")
        assert isinstance(exc, OutputPathError) and "a FIFO" in str(exc)
    finally:
        os.close(reader)


def test_dev_null_is_refused_before_any_temporary_file_or_rename(tmp_path, monkeypatch):
    import tempfile

    calls = []
    monkeypatch.setattr(os, "replace", lambda *a: calls.append(("replace", a)))
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: calls.append(("mkstemp", a)))
    with pytest.raises(KistexpError, match=r"^/dev/null: cannot write the report: it is a character device"):
        write_atomic("/dev/null", b"<html>", "the report", KistexpError)
    assert calls == []


def test_regular_files_and_new_names_are_written(tmp_path):
    old = tmp_path / "old.csv"
    old.write_text("a much longer old content\n")
    write_atomic(old, b"new\n", "the results")
    assert old.read_text() == "new\n"
    with open_output(old, "the partial results", encoding="utf-8") as fh:
        fh.write("x\n")
    assert old.read_text() == "x\n"  # truncated, then written
    write_atomic(tmp_path / "new.csv", b"y", "the results")
    assert (tmp_path / "new.csv").read_bytes() == b"y"
    with pytest.raises(OutputPathError, match="the name holds a NUL byte"):
        check_output_path("a\0b", "the report")
    odd = tmp_path / "a\nb"  # a name with a line break is quoted: the error stays one line
    os.mkfifo(odd)
    with pytest.raises(OutputPathError) as refused:
        check_output_path(odd, "the report")
    assert "\n" not in str(refused.value) and "a\\nb" in str(refused.value)


def test_the_cli_refuses_a_fifo_as_the_judges_state_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    base, stage = tmp_path / "base.csv", tmp_path / "stage.csv"
    rng = np.random.default_rng(1)
    for path in (base, stage):
        path.write_text("value\n" + "\n".join(f"{v:.4f}" for v in rng.lognormal(0, 0.3, 200)) + "\n")
    proc = kistexp("judge", "compare", "--baseline", f"{base}:value", "--stage", f"{stage}:value",
                   "--statistic", "median", "--comparison", "relative-increase", "--threshold", "0.1",
                   "--state", str(fifo))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{fifo}: cannot write the sequential state: it is a FIFO" in proc.stderr


# --- 1. a sweep's name never leads out of the sweeps directory ---------------------------------------------

SWEEP = """name = {name}
duration = "5s"
[values]
KISTSchedRunInterval = [2, 10]
"""


def toml_string(text: str) -> str:
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


@pytest.mark.parametrize("name", ["../../x", "/abs", "a/b", "..", ".", "a\\b", "x\0y", "/"])
def test_sweep_names_that_are_paths_are_refused_naming_the_key(name):
    with pytest.raises(SweepError) as refused:
        parse_sweep(SWEEP.format(name=toml_string(name)), "s.toml")
    assert str(refused.value).startswith("s.toml:1: name: ") and "\n" not in str(refused.value)


def test_a_plain_sweep_name_is_kept():
    assert parse_sweep(SWEEP.format(name='"kist grid, 2030"'), "s.toml").name == "kist grid, 2030"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40))
def test_no_sweep_name_places_its_output_outside_the_sweeps_directory(tmp_path_factory, name):
    try:
        sweep = parse_sweep(SWEEP.format(name=toml_string(name)), "s.toml")
    except SweepError as exc:
        assert str(exc).startswith("s.toml:") and "\n" not in str(exc)
        return
    root = Path("/srv/sweeps")
    out = (root / sweep.name).resolve()  # as `kistexp sweep` makes it: sweeps/<name>
    assert out.parent == root


# --- 7. replays honour --inject and --command; abort=hold pauses with the votes unchanged ------------------

DAY = dt.datetime(2021, 6, 1, tzinfo=dt.timezone.utc)


def operator_csv(path: Path, hours: int = 12, relays: int = 120) -> Path:
    """Hourly CPU of ``relays`` relays over ``hours`` hours from DAY, no change anywhere (enough samples for
    the 2 h baseline to be judged: min_samples is 100)."""
    rng = np.random.default_rng(7)
    lines = ["relay_fingerprint,window_start_utc,window_end_utc,cpu_pct_core_mean"]
    for h in range(hours):
        for r in range(relays):
            a = DAY + dt.timedelta(hours=h, seconds=20 * r)
            lines.append(f"{r + 1:040X},{a:%Y-%m-%dT%H:%M:%SZ},{a + dt.timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ},"
                         f"{rng.lognormal(np.log(40), 0.3):.3f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_honours_a_metric_shift_injection(tmp_path, plans):
    csv = str(operator_csv(tmp_path / "ops.csv"))
    plain = replay(load_plan(plans[0]), [csv])
    assert plain.first_rollback is None
    shifted = replay(load_plan(plans[0]), [csv], tmp_path / "r", injections=["stage=1:relay_cpu_utilization=+60%"])
    fb = shifted.first_rollback
    assert fb is not None and fb["criterion"] == "relay CPU" and fb["stage"] == 1 and fb["kind"] == "step-back"
    meta = dict(Journal(tmp_path / "r" / "experiment.db").conn.execute("SELECT key, value FROM rollout_meta"))
    assert json.loads(meta["injections"]) == ["stage=1:relay_cpu_utilization=+60%"] and meta["metrics"] == "recorded"


def test_replay_honours_commands_and_refuses_one_after_its_end(tmp_path, plans):
    csv = str(operator_csv(tmp_path / "ops.csv"))
    r = replay(load_plan(plans[0]), [csv], tmp_path / "r", commands=["stage1+1h:abort=hold"])
    assert r.dry_run["final_state"] == "PAUSED" and "criterion-hold" in r.dry_run["status"]
    assert [d["decision"] for d in r.dry_run["decisions"]][-1] == "rollback:hold"
    with pytest.raises(InjectionError, match=r"^--command 'day9:pause': at 2021-06-09 00:00 UTC, after the replay "
                                             r"ends at 2021-06-01 08:00 UTC"):
        replay(load_plan(plans[0]), [csv], tmp_path / "late", commands=["day9:pause"])
    with pytest.raises(InjectionError, match=r"^--inject 'authority=moria1:down@day3': at .* after the replay ends"):
        replay(load_plan(plans[0]), [csv], tmp_path / "late", injections=["authority=moria1:down@day3"])
    with pytest.raises(InjectionError, match=r"^--inject 'stage=9:relay_cpu_utilization=\+5%': stage must be"):
        replay(load_plan(plans[0]), [csv], injections=["stage=9:relay_cpu_utilization=+5%"])
    assert not (tmp_path / "late").exists()  # refused before the directory was made


def test_the_cli_passes_inject_and_command_to_a_replay(tmp_path, plans):
    csv = str(operator_csv(tmp_path / "ops.csv"))
    proc = kistexp("dry-run", str(plans[0]), "--replay", csv, "--inject", "stage=1:relay_cpu_utilization=+60%",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["first_rollback"]["stage"] == 1
    bad = kistexp("dry-run", str(plans[0]), "--replay", csv, "--command", "day9:pause")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "after the replay ends" in bad.stderr
    preds = kistexp("dry-run", str(plans[0]), "--replay", csv, "--predictions", str(tmp_path))
    assert preds.returncode == 1 and "a replay judges the recordings" in preds.stderr


def test_abort_with_kind_hold_pauses_and_leaves_the_votes_as_they_are(tmp_path, plans):
    exp = tmp_path / "e"
    write_predictions(exp, EFFECTS).close()
    r = dry_run(load_plan(plans[0]), exp, commands=["stage1+1h:abort=hold"])
    assert r.final_state == "PAUSED" and r.status.startswith("PAUSED (criterion-hold) at stage 1")
    assert r.rollbacks == ()  # no vote changed: the consensus keeps stage 1's value
    assert r.consensus_changes[-1]["params"]["KISTSchedRunInterval"] == 2
    assert [t["kind"] for t in r.transitions] == ["stage"]
    # from the command line the same kind is accepted by `kistexp abort DIR --kind hold` too
    journal = Journal(exp / "experiment.db")
    (cmd,) = journal.conn.execute("SELECT kind, args, state FROM rollout_commands").fetchall()
    assert cmd == ("abort", '{"kind": "hold"}', "applied")
    journal.close()

