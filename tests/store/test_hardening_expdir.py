"""A damaged experiment directory is refused in one line, never a traceback (issue 34, points 2 and 8).

One dry run's directory is damaged one way at a time (a journal table dropped or garbled, a status row
empty or not JSON, a bad cadence or start, times past the calendar, a command row with bad arguments,
a database from a newer schema, a garbled page) and each command that reads the journal is run on it:
``status`` (table, ``--json``, ``--watch --json``), ``history``, ``rollback --dry-run``, ``pause``,
``report``, the Prometheus exporter and the run's event feed. A command that reads the damaged row
refuses with one line naming the database, the table and the row, prints nothing on stdout and writes
no file; one that does not read it answers as usual. Property tests feed the journal's readers
arbitrary values in every column of every table: each gives a typed row or a ``JournalDamageError``
naming that table and that row, nothing else.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import KistexpError
from kistexp.output import error_line
from kistexp.rollout.exporter import JournalCollector
from kistexp.rollout.journal import Journal, JournalDamageError, JournalReader, RunLock
from kistexp.rollout.journal.codec import BadValue, status_from_json, status_to_json
from kistexp.rollout.state import PAUSE_REASONS, STATES, Counters, Status
from kistexp.rollout.watch import Feed
from kistexp.store.schema import SCHEMA_VERSION, columns_at
from tests.rollout_helpers import STEP_BACK, dry_run_kist

HUGE = 2**62  # microseconds: year 146,000
PAST_9999 = 253_402_300_800_000_001  # one microsecond past 9999-12-31T23:59:59.999999 UTC
NOW_US = 1_796_426_855_876_582


def _last(table: str, key: str = "id") -> str:
    return f"{key} = (SELECT MAX({key}) FROM {table})"


def _status_set(path: str, json_value: str) -> str:
    return (f"UPDATE rollout_status SET status = json_set(status, '$.{path}', json('{json_value}')) "
            f"WHERE {_last('rollout_status')}")


def _loose(table: str, columns: str) -> str:
    """``table`` made again without types or constraints (as a hand repair might), rows kept."""
    return (f"CREATE TABLE tmp AS SELECT * FROM {table}; DROP TABLE {table}; CREATE TABLE {table} ({columns}); "
            f"INSERT INTO {table} SELECT * FROM tmp; DROP TABLE tmp;")


def _command(kind: str, args: str, queued_us: int = NOW_US, state: str = "queued") -> str:
    return (f"INSERT INTO rollout_commands (kind, args, user, queued_us, state) "
            f"VALUES ('{kind}', '{args}', 'u', {queued_us}, '{state}')")


def _corrupt_status_page(db: Path) -> None:
    conn = sqlite3.connect(db)
    (root,), (size,) = (conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'rollout_status'").fetchone(),
                        conn.execute("PRAGMA page_size").fetchone())
    conn.close()
    data = bytearray(db.read_bytes())
    data[(root - 1) * size: root * size] = b"\xff" * size
    db.write_bytes(bytes(data))


@attrs.frozen
class Damage:
    """What is done to the journal (SQL on it, or a function of the database's path), the fault a
    command that reads it must name (a regular expression), and the commands that never read it."""

    change: str | object
    fault: str
    spared: frozenset[str] = frozenset()


# the commands below: every one reads the journal
NO_COMMANDS = frozenset({"status", "status-json", "rollback", "pause", "watch-json", "exporter"})
REPORT_ONLY = frozenset({"status", "status-json", "history", "history-json", "rollback", "pause", "watch-json",
                         "exporter", "feed"})

DAMAGES = {
    # tables
    "table dropped": Damage("DROP TABLE rollout_status", r"experiment\.db: damaged (rollout journal|experiment "
                            r"database): table rollout_status is missing \(schema version 5\)$", frozenset({"feed"})),
    "table garbled": Damage("DROP TABLE rollout_decisions; CREATE TABLE rollout_decisions (x, y)",
                            r"table rollout_decisions lacks its columns id, event_key, at_us, decision, stage",
                            frozenset({"feed"})),
    "garbled page": Damage(_corrupt_status_page, r"experiment\.db: cannot read the rollout journal: database disk "
                           r"image is malformed$"),
    # the feed of a run waits for a journal it can open: the run's own opening refuses this one
    "newer schema": Damage("PRAGMA user_version = 99", r"schema version 99 is newer than this kistexp "
                           r"understands \(5\); upgrade kistexp$", frozenset({"feed"})),
    # status rows
    "status NULL": Damage(_loose("rollout_status", "id INTEGER PRIMARY KEY, event_key, at_us, state, status")
                          + f"UPDATE rollout_status SET status = NULL WHERE {_last('rollout_status')}",
                          r"rollout_status row \d+: status is NULL, not JSON text$"),
    "status empty": Damage(f"UPDATE rollout_status SET status = '' WHERE {_last('rollout_status')}",
                           r"rollout_status row \d+: status is empty, not JSON$"),
    "status not JSON": Damage(f"UPDATE rollout_status SET status = 'garbage{{' WHERE {_last('rollout_status')}",
                              r"rollout_status row \d+: status is not JSON$"),
    "status a list": Damage(f"UPDATE rollout_status SET status = '[]' WHERE {_last('rollout_status')}",
                            r"rollout_status row \d+: status is a JSON list, not a JSON object$"),
    "status {}": Damage(f"UPDATE rollout_status SET status = '{{}}' WHERE {_last('rollout_status')}",
                        r"rollout_status row \d+: status lacks its 'state' field$"),
    "status nested deep": Damage(f"UPDATE rollout_status SET status = '{'[' * 100_000}' "
                                 f"WHERE {_last('rollout_status')}",
                                 r"rollout_status row \d+: status is JSON nested too deeply$"),
    "status state unknown": Damage(_status_set("state", '"BOGUS"'),
                                   r"rollout_status row \d+: status.state is 'BOGUS', not a rollout state$"),
    "status time naive": Damage(_status_set("stage_va", '"2027-03-01T12:00:00"'),
                                r"status.stage_va '2027-03-01T12:00:00' has no UTC offset$"),
    "status of a newer engine": Damage(_status_set("newfield", "1"), r"status has fields this kistexp does not "
                                       r"know \(newfield\): written by a newer kistexp\?$"),
    "status stage past the plan": Damage(_status_set("stage", "99"), r"rollout_status row \d+: status.stage 99 is "
                                         r"not a stage of .*plan\.toml \(0 = baseline to 3\)$"),
    "status value past 32 bits": Damage(_status_set("values[0][1]", "99999999999999"),
                                        r"status.values\[0\] is 99999999999999, not a 32-bit integer$"),
    "status time past the calendar": Damage(f"UPDATE rollout_status SET at_us = {HUGE}",
                                            rf"rollout_status row \d+: at_us {HUGE} is outside the times kistexp "
                                            r"computes with \(0002-01-02 to 9998-12-30 UTC\)$"),
    # rollout_meta: the cadence and start the plan was laid on
    "cadence not JSON": Damage("UPDATE rollout_meta SET value = 'x' WHERE key = 'cadence'",
                               r"experiment\.db: rollout_meta row cadence: cadence is not JSON$"),
    "cadence interval 0": Damage("UPDATE rollout_meta SET value = json_set(value, '$.interval_s', 0) "
                                 "WHERE key = 'cadence'", r"rollout_meta row cadence: cadence interval_s 0 is not a "
                                 r"whole number of seconds from 2 to 86400$"),
    "cadence interval infinite": Damage("UPDATE rollout_meta SET value = '{\"interval_s\": 1e999, \"vote_s\": 300, "
                                        "\"dist_s\": 300}' WHERE key = 'cadence'",
                                        r"rollout_meta row cadence: cadence interval_s is inf, not a finite number$"),
    "cadence delays too long": Damage("UPDATE rollout_meta SET value = json_set(value, '$.vote_s', 99999) "
                                      "WHERE key = 'cadence'", r"rollout_meta row cadence: cadence vote_s 99999 and "
                                      r"dist_s 300 are not positive delays within half of interval_s 3600$"),
    "start not a time": Damage("UPDATE rollout_meta SET value = 'yesterday' WHERE key = 'start'",
                               r"rollout_meta row start: start 'yesterday' is not an ISO 8601 time$"),
    "start without offset": Damage("UPDATE rollout_meta SET value = '2027-03-01T12:00:00' WHERE key = 'start'",
                                   r"rollout_meta row start: start '2027-03-01T12:00:00' has no UTC offset$"),
    "start in 9999": Damage("UPDATE rollout_meta SET value = '9999-12-31T23:00:00+00:00' WHERE key = 'start'",
                            r"rollout_meta row start: start '9999-12-31T23:00:00\+00:00' is outside the times"),
    "start missing": Damage("DELETE FROM rollout_meta WHERE key = 'start'",
                            r"rollout_meta row start: missing: the run's start is not recorded$"),
    "meta value a blob": Damage("UPDATE rollout_meta SET value = x'00' WHERE key = 'experiment_id'",
                                r"rollout_meta row experiment_id: the value is a blob of 1 bytes, not text$"),
    "injections not JSON": Damage("UPDATE rollout_meta SET value = '{' WHERE key = 'injections'",
                                  r"rollout_meta row injections: injections is not JSON$", REPORT_ONLY),
    # the other rows, each read by some commands
    "decision past 9999": Damage(f"UPDATE rollout_decisions SET valid_after_us = {PAST_9999} "
                                 f"WHERE {_last('rollout_decisions')}",
                                 rf"rollout_decisions row \d+: valid_after_us {PAST_9999} is outside the times",
                                 frozenset({"status", "status-json", "rollback", "pause", "watch-json", "exporter"})),
    "decision stage text": Damage(f"UPDATE rollout_decisions SET stage = 'two' WHERE {_last('rollout_decisions')}",
                                  r"rollout_decisions row \d+: stage is 'two', not an integer$",
                                  frozenset({"status", "status-json", "rollback", "pause", "watch-json",
                                             "exporter"})),
    "transition past the plan": Damage("UPDATE rollout_transitions SET stage = 99",
                                       r"rollout_transitions row 1: stage 99 is not a stage of .*plan\.toml",
                                       REPORT_ONLY - {"feed"}),
    "transition targets not JSON": Damage(f"UPDATE rollout_transitions SET targets = 'x' "
                                          f"WHERE {_last('rollout_transitions', 'seq')}",
                                          r"rollout_transitions row \d+: targets is not JSON$",
                                          REPORT_ONLY - {"feed"}),
    "verdict effect text": Damage(f"UPDATE rollout_verdicts SET effect = 'big' WHERE {_last('rollout_verdicts')}",
                                  r"rollout_verdicts row \d+: effect is 'big', not a number$",
                                  frozenset({"status-json", "history", "history-json", "rollback", "pause",
                                             "watch-json"})),
    "vote params not JSON": Damage("UPDATE rollout_votes_seen SET params = 'x' "
                                   "WHERE rowid = (SELECT MAX(rowid) FROM rollout_votes_seen)",
                                   r"rollout_votes_seen row \d+: params is not JSON$", frozenset({"pause"})),
    "consensus signers not JSON": Damage("UPDATE rollout_consensus_seen SET signers = '{' "
                                         "WHERE rowid = (SELECT MAX(rowid) FROM rollout_consensus_seen)",
                                         r"rollout_consensus_seen row \d+: signers is not JSON$",
                                         frozenset({"pause"})),
    "health flag 7": Damage("UPDATE rollout_authority_health SET voted = 7 "
                            "WHERE rowid = (SELECT MAX(rowid) FROM rollout_authority_health)",
                            r"rollout_authority_health row \d+: voted is 7, not 0 or 1$", frozenset({"pause"})),
    "intent desired not JSON": Damage(f"UPDATE rollout_intents SET desired = 'x' WHERE {_last('rollout_intents')}",
                                      r"rollout_intents row \d+: desired is not JSON$",
                                      frozenset({"status", "status-json", "history", "history-json", "rollback",
                                                 "pause", "watch-json", "exporter"})),
    "command args not JSON": Damage(_command("pause", "not json"), r"rollout_commands row \d+: args is not JSON$",
                                    NO_COMMANDS),
    "command arg unknown": Damage(_command("pause", '{"explode": true}'),
                                  r"rollout_commands row \d+: args: pause takes freeze, not 'explode'$",
                                  frozenset({"status", "status-json", "rollback", "pause", "watch-json",
                                             "exporter"})),
    "command arg of another type": Damage(_command("pause", '{"freeze": "maybe"}'),
                                          r"rollout_commands row \d+: args: pause freeze is 'maybe', which pause "
                                          r"does not take$",
                                          frozenset({"status", "status-json", "rollback", "pause", "watch-json",
                                                     "exporter"})),
    "command kind unknown": Damage(_command("explode", "{}", state="applied"),
                                   r"rollout_commands row \d+: kind is 'explode', not one of pause, resume, promote",
                                   frozenset({"status", "status-json", "rollback", "pause", "watch-json",
                                              "exporter"})),
    "command time past the calendar": Damage(_command("pause", "{}", HUGE), rf"rollout_commands row \d+: queued_us "
                                             rf"{HUGE} is outside the times",
                                             frozenset({"status", "status-json", "rollback", "pause", "watch-json",
                                                        "exporter"})),
    "batch payload cut": Damage("UPDATE rollout_metric_batches SET payload = x'000102' WHERE id = (SELECT MAX(id) "
                                "FROM rollout_metric_batches WHERE missing = 0 AND phase = 'baseline')",
                                r"rollout_metric_batches row \d+: payload holds 3 bytes, not the \d+ float64 "
                                r"samples its n says$", REPORT_ONLY),
    "batch phase garbled": Damage(f"UPDATE rollout_metric_batches SET phase = 'stage:x:y' "
                                  f"WHERE {_last('rollout_metric_batches')}",
                                  r"rollout_metric_batches row \d+: phase 'stage:x:y' is not baseline, excluded or "
                                  r"stage:<index>:<valid-after>$", REPORT_ONLY - {"feed"}),
    "exposure share text": Damage("INSERT INTO rollout_exposure (at_us, stage, population, expected_share, "
                                  f"observed_share, n_nodes, n_on_target, n_pinned, n_unknown, short) VALUES ({NOW_US},"
                                  " 1, 'relays', 'lots', 0.4, 10, 4, 0, 0, 1)",
                                  r"rollout_exposure row \d+: expected_share is 'lots', not a number$",
                                  REPORT_ONLY - {"exporter", "feed"} | {"report"}),
    "source health past the calendar": Damage(
        "INSERT INTO rollout_source_health (window_us, source, instance, ok, n_samples, problem, at_us) "
        f"VALUES ({HUGE}, 's', 'i', 0, 0, '', 0)",
        rf"rollout_source_health row \d+: window_us {HUGE} is outside the times",
        frozenset({"status", "status-json", "history", "history-json", "rollback", "pause", "watch-json",
                   "exporter"})),
    "run argv not JSON": Damage(f"INSERT INTO rollout_runs (pid, host, argv, start_us) VALUES (1, 'h', '{{', {NOW_US})",
                                r"rollout_runs row \d+: argv is not JSON$", REPORT_ONLY - {"feed"} | {"report"}),
    "owner heartbeat past the calendar": Damage(
        f"INSERT INTO rollout_owner (id, pid, host, since_us, heartbeat_us) VALUES (1, 1, 'h', {NOW_US}, {HUGE})",
        rf"rollout_owner row 1: heartbeat_us {HUGE} is outside the times", REPORT_ONLY - {"exporter"} | {"report"}),
}

COMMANDS = {
    "status": ["status", "{exp}"],
    "status-json": ["status", "{exp}", "--json"],
    "watch-json": ["status", "{exp}", "--watch", "--json", "--interval", "0.5"],
    "history": ["history", "{exp}"],
    "history-json": ["history", "{exp}", "--json"],
    "rollback": ["rollback", "{exp}", "--dry-run"],
    "pause": ["pause", "{exp}"],
    "report": ["report", "{exp}", "-o", "{out}"],
    "exporter": None,  # a scrape, in this process
    "feed": None,  # the event feed of `kistexp run`, one poll
}


@pytest.fixture(scope="module")
def dry_run_dir(tmp_path_factory) -> Path:
    """A dry run that stepped back (status rows, decisions, transitions, verdicts, intents, votes,
    consensuses, authority health, metric batches); each test damages a copy of it."""
    path = tmp_path_factory.mktemp("expdir") / "exp"
    dry_run_kist(path, [STEP_BACK])
    return path


def _damaged(base: Path, tmp_path: Path, damage: Damage) -> Path:
    exp = tmp_path / "exp"
    shutil.copytree(base, exp)
    db = exp / "experiment.db"
    if callable(damage.change):
        damage.change(db)
    else:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.executescript(damage.change)
        conn.close()
    return exp


def _scrape(exp: Path) -> str | None:
    """The exporter's answer: None when it read the journal, else the problem it reports."""
    families = list(JournalCollector(exp).collect())
    samples = {s.name: s for f in families for s in f.samples}
    if samples["kistexp_rollout_up"].value == 1:
        return None
    damaged = samples.get("kistexp_rollout_journal_damaged")
    return damaged.labels["problem"] if damaged is not None else "down without a word"


# A report that reads none of the damaged rows renders whole (seconds): it is made for one such damage only.
RENDERED = "owner heartbeat past the calendar"
CASES = [(name, command) for name, damage in DAMAGES.items() for command in COMMANDS
         if not (command == "report" and command in damage.spared and name != RENDERED)]


@pytest.mark.parametrize(("name", "command"), CASES)
def test_a_damaged_journal_is_refused_in_one_line_naming_table_and_row(dry_run_dir, tmp_path, monkeypatch, name,
                                                                        command):
    damage = DAMAGES[name]
    exp = _damaged(dry_run_dir, tmp_path, damage)
    if command == "exporter":
        problem = _scrape(exp)
        if command in damage.spared:
            assert problem is None, problem
        else:
            assert problem is not None and re.search(damage.fault, problem), problem
        return
    if command == "feed":
        feed = Feed(exp)
        try:
            if command in damage.spared:
                feed.poll()
            else:
                with pytest.raises(JournalDamageError) as err:
                    feed.poll()
                assert re.search(damage.fault, str(err.value)) and "\n" not in str(err.value), str(err.value)
        finally:
            feed.close()
        return

    def stop(_seconds):  # `status --watch` ends at its first wait, as at a Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", stop)
    out = tmp_path / "report.html"
    argv = [a.format(exp=exp, out=out) for a in COMMANDS[command]]
    result = CliRunner().invoke(app, argv)
    if command in damage.spared:
        assert result.exit_code == 0, (result.output, result.exception)
        return
    exc = result.exception
    assert isinstance(exc, KistexpError), (result.output, exc)  # main() prints it in one line and exits 1
    line = error_line(exc)
    assert line.startswith(f"kistexp: error: {exp}") and "\n" not in line, line
    assert re.search(damage.fault, line), line
    assert result.stdout == "" and not out.exists(), result.stdout  # nothing half written
    assert not [p for p in exp.parent.iterdir() if p.name != "exp"]


@pytest.mark.parametrize(("name", "command"), [("status not JSON", "status"), ("table garbled", "history"),
                                               ("decision past 9999", "report"), ("cadence interval 0", "rollback")])
def test_end_to_end_exit_1_one_line_on_stderr_nothing_on_stdout(dry_run_dir, tmp_path, name, command):
    damage = DAMAGES[name]
    exp = _damaged(dry_run_dir, tmp_path, damage)
    out = tmp_path / "report.html"
    argv = [a.format(exp=exp, out=out) for a in COMMANDS[command]]
    proc = subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.startswith(f"kistexp: error: {exp}") and proc.stderr.count("\n") == 1, proc.stderr
    assert re.search(damage.fault, proc.stderr.rstrip("\n")), proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_a_run_lock_that_is_not_a_regular_file_is_refused_in_one_line(dry_run_dir, tmp_path):
    for make in (Path.mkdir, lambda p: p.symlink_to("/dev/null")):
        exp = tmp_path / f"exp{len(list(tmp_path.iterdir()))}"
        shutil.copytree(dry_run_dir, exp)
        (exp / "run.lock").unlink(missing_ok=True)  # a dry run may leave its own
        make(exp / "run.lock")
        with pytest.raises(KistexpError, match=rf"^{re.escape(str(exp / 'run.lock'))}: cannot be the run lock "
                                               r"\(.*\); .*remove it and rerun$"):
            RunLock(exp).acquire()
        result = CliRunner().invoke(app, ["run", "plans/kist-run-interval-2020.toml", "--dir", str(exp),
                                          "--metrics", "predicted"])
        assert isinstance(result.exception, KistexpError) and "run.lock: cannot be the run lock" in str(
            result.exception), (result.output, result.exception)
        assert (exp / "run.lock").is_dir() or (exp / "run.lock").is_symlink()  # left as it was


def test_a_damage_written_while_status_watch_runs_ends_the_watch(dry_run_dir, tmp_path, monkeypatch):
    """A busy database keeps the last view; a damaged row appearing later ends the watch with its line."""
    exp = _damaged(dry_run_dir, tmp_path, Damage("", ""))
    damage = DAMAGES["status not JSON"]

    def damage_it(_seconds):
        conn = sqlite3.connect(exp / "experiment.db", isolation_level=None)
        conn.executescript(damage.change)
        conn.close()

    monkeypatch.setattr(time, "sleep", damage_it)
    result = CliRunner().invoke(app, ["status", str(exp), "--watch", "--json", "--interval", "0.5"])
    assert isinstance(result.exception, JournalDamageError), (result.output, result.exception)
    assert re.search(damage.fault, str(result.exception))
    assert result.stdout.count("\n") == 1  # the view read before the damage, then nothing


def test_the_engines_own_readers_refuse_a_damaged_row(dry_run_dir, tmp_path):
    """The writer's readers (a resumed run's status, queued commands, sequential states) name the row too."""
    exp = _damaged(dry_run_dir, tmp_path, Damage(
        _command("pause", '{"freeze": "maybe"}') + "; UPDATE rollout_sequential SET state = '{';"
        + f"UPDATE rollout_status SET status = '[' WHERE {_last('rollout_status')};", ""))
    j = Journal(exp / "experiment.db", durable=False)
    try:
        for read, fault in ((j.status, r"rollout_status row \d+: status is not JSON$"),
                            (j.queued_commands, r"rollout_commands row \d+: args: pause freeze is 'maybe'"),
                            (j.sequential_states, r"rollout_sequential row \d+: state is not JSON$")):
            with pytest.raises(JournalDamageError, match=fault):
                read()
    finally:
        j.close()


# --- property tests: the journal's readers on any value in any column ------------------------------------------

# Each reader method and the table it reads; the writer's own readers too (a resumed run reads them).
READERS = {
    "rollout_status": ("statuses", "last_status", "latest_status"),
    "rollout_decisions": ("decisions",),
    "rollout_transitions": ("transitions",),
    "rollout_verdicts": ("verdicts", "looks", "latest_verdicts"),
    "rollout_metric_batches": ("metric_batches", "metric_phases", "gaps_by_source", "batch_values"),
    "rollout_intents": ("intents", "intent_counts"),
    "rollout_commands": ("commands",),
    "rollout_runs": ("runs",),
    "rollout_owner": ("owner",),
    "rollout_votes_seen": ("votes_seen", "vote_authorities", "round_health"),
    "rollout_consensus_seen": ("consensus_seen", "round_health"),
    "rollout_authority_health": ("authority_health", "round_health"),
    "rollout_exposure": ("exposures", "latest_exposure"),
    "rollout_source_health": ("source_health", "gaps_by_source"),
}
WRITER_READERS = {
    "rollout_status": ("status",),
    "rollout_decisions": ("decisions",),
    "rollout_transitions": ("transitions",),
    "rollout_verdicts": ("verdicts",),
    "rollout_metric_batches": ("batches", "batch_values"),
    "rollout_intents": ("intents", "asked_before"),
    "rollout_commands": ("queued_commands",),
    "rollout_owner": ("owner_text",),
    "rollout_votes_seen": ("votes", "round_health"),
    "rollout_consensus_seen": ("consensuses", "consensus_params_by_va", "round_health"),
    "rollout_authority_health": ("authority_health",),
    "rollout_exposure": ("exposures",),
    "rollout_source_health": ("source_health",),
    "rollout_sequential": ("sequential_states",),
}
KEYS = {"rollout_transitions": "seq", "rollout_votes_seen": "rowid", "rollout_consensus_seen": "rowid",
        "rollout_authority_health": "rowid", "rollout_sequential": "rowid"}


def _args(method: str) -> tuple:
    return {"batch_values": ("m", "baseline"), "round_health": (("moria1", "tor26"),),
            "asked_before": ("moria1", 10**6)}.get(method, ())


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
cells = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=30),
                  st.binary(max_size=24), json_values.map(json.dumps),
                  st.sampled_from(["baseline", "stage:1:x", "stage:x", "pause", "queued", "done", "{}", "[]", "null",
                                   '{"freeze": true}', '{"KISTSchedRunInterval": 10}', '["moria1"]', "m", "moria1"]),
                  st.integers(-1, 2) | st.integers(1_700_000_000_000_000, 1_900_000_000_000_000))


@pytest.fixture(scope="module")
def loose():
    """A journal at the current schema whose ``rollout_*`` tables take any value in any column (their types
    and constraints dropped, as a hand-made repair could leave them), with its reader and its writer open:
    each example's rows are written afresh and read through both."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "experiment.db"
        Journal(db, durable=False).close()
        conn = sqlite3.connect(db, isolation_level=None)
        for table, columns in columns_at(SCHEMA_VERSION).items():
            if table.startswith("rollout_") and table != "rollout_meta":
                cols = [f"{c} INTEGER PRIMARY KEY" if c in ("id", "seq") else c for c in columns]
                conn.executescript(f"DROP TABLE {table}; CREATE TABLE {table} ({', '.join(cols)});")
        reader, journal = JournalReader(db), Journal(db, durable=False)
        yield db, conn, reader, journal
        reader.close()
        journal.close()
        conn.close()


def _fill(conn: sqlite3.Connection, table: str, rows: list[list]) -> None:
    conn.execute(f"DELETE FROM {table}")  # noqa: S608 - our table names
    columns = [c for c in columns_at(SCHEMA_VERSION)[table] if c not in ("id", "seq")]
    for row in rows:
        conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",  # noqa: S608
                     row[: len(columns)])


def _check(call, table: str, db: Path) -> None:
    try:
        call()
    except JournalDamageError as exc:
        text = str(exc)
        assert exc.table == table and text.startswith(f"{db}: {table} row ") and "\n" not in text, text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize("table", sorted(set(READERS) | set(WRITER_READERS)))
def test_any_cell_reads_as_a_typed_row_or_a_damage_naming_table_and_row(loose, table, data):
    db, conn, reader, journal = loose
    width = len(columns_at(SCHEMA_VERSION)[table])
    rows = data.draw(st.lists(st.lists(cells, min_size=width, max_size=width), min_size=1, max_size=3))
    _fill(conn, table, rows)
    try:
        for method in READERS.get(table, ()):
            _check(lambda m=method: getattr(reader, m)(*_args(m)), table, db)
        for method in WRITER_READERS.get(table, ()):
            _check(lambda m=method: getattr(journal, m)(*_args(m)), table, db)
    finally:
        _fill(conn, table, [])


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60), json_values.map(json.dumps), st.binary(max_size=20), st.none(),
                 st.fixed_dictionaries({k: json_values for k in ("state", "stage", "values", "reasons")}).map(
                     json.dumps)))
def test_any_status_cell_is_a_status_or_a_bad_value(text):
    try:
        st_ = status_from_json(text)
    except BadValue as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert isinstance(st_, Status) and st_.state in STATES


aware = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(9000, 1, 1),
                     timezones=st.just(dt.timezone.utc))
statuses = st.builds(
    Status, state=st.sampled_from(STATES), stage=st.integers(0, 20),
    values=st.lists(st.tuples(st.text(min_size=1, max_size=10),
                              st.integers(-(2**31), 2**31 - 1) | st.just("unset")), max_size=3).map(tuple),
    target_va=st.none() | aware, rounds_waited=st.integers(0, 100), rounds_missing=st.integers(0, 100),
    stage_va=st.none() | aware, decision_at=st.none() | aware, extensions=st.integers(0, 50),
    reasons=st.frozensets(st.sampled_from(PAUSE_REASONS)), rollback_kind=st.text(max_size=12),
    from_stage=st.integers(0, 20),
    counters=st.lists(st.tuples(st.text(max_size=10), st.builds(
        Counters, *(st.integers(0, 10) for _ in range(4)), latest=st.text(max_size=10))), max_size=3).map(
        lambda c: tuple(sorted(dict(c).items()))),
    aborted_stage=st.none() | st.integers(0, 20), fast=st.booleans(), promoted=st.booleans(),
    resume_to=st.text(max_size=10), seq=st.integers(0, 1000))


@settings(max_examples=200, deadline=None)
@given(statuses)
def test_every_status_the_engine_writes_reads_back_whole(status):
    assert status_from_json(status_to_json(status)) == status
