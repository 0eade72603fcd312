"""The rollout journal in the experiment database (rollout.md §3; tables in kistexp/store/schema.py).

Rules (§3.1): no external effect without a durable intent; effects are whole sets; success is
observed (votes, consensus), not an API's answer; the status is the journal's last status row.
Writers use ``BEGIN IMMEDIATE`` on an autocommit connection so a read-then-write never fails
half way with SQLITE_BUSY (§3.6). The run lock is ``flock`` on a separate ``run.lock`` (§3.7).

Every SQL statement on a ``rollout_*`` table lives in this package (tests/test_rollout_journal_sql.py
holds the rest of kistexp to it): ``Journal`` here is the writer (the engine's, the dry run's and the
control commands'); ``reader.JournalReader`` is the read-only reader of everything else (status,
history, the event feed, the exporter, the report); ``rows`` holds the frozen rows they return,
``codec`` how columns hold values, ``health`` the authorities' health derived from the journal.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kistexp.metrics.series import from_us, to_us
from kistexp.rollout.journal.codec import (
    Pairs,
    _finite,
    desired_params,
    loads,
    pairs,
    sequential_from_dict,
    sequential_to_dict,
    status_from_json,
    status_to_json,
    values_json,
)
from kistexp.rollout.journal.health import (
    CONSENSUS_MISSING,
    CONSENSUS_SIGNED,
    CONSENSUS_UNCHECKED,
    CONSENSUS_UNSIGNED,
    AuthorityOutage,
    ConsensusOutage,
    RoundHealth,
    _table_columns,
    authority_outages,
    consensus_outages,
    down_since,
    round_health,
)
from kistexp.rollout.journal.reader import JournalReader
from kistexp.rollout.journal.rows import (
    INTENT_STATES,
    AuthorityHealthRow,
    BatchInfoRow,
    BatchRow,
    CommandRow,
    ConsensusSeenRow,
    DecisionRow,
    ExposureRow,
    IntentRow,
    JournalMeta,
    OwnerRow,
    RunRow,
    SourceHealthRow,
    StatusRow,
    TransitionRow,
    VerdictRow,
    VoteSeenRow,
)
from kistexp.rollout.spec import RolloutError
from kistexp.rollout.state import Status, Transition
from kistexp.store.schema import open_db

__all__ = [
    "BUSY_TIMEOUT_S", "CONSENSUS_MISSING", "CONSENSUS_SIGNED", "CONSENSUS_UNCHECKED", "CONSENSUS_UNSIGNED",
    "HEARTBEAT_EVERY_S", "HEARTBEAT_STALE_S", "INTENT_STATES", "LOCK_NAME", "REHEARSAL_TABLES", "AuthorityHealthRow",
    "AuthorityOutage", "BatchInfoRow", "BatchRow", "CommandRow", "ConsensusOutage", "ConsensusSeenRow", "DecisionRow",
    "ExposureRow", "IntentRow", "Journal", "JournalLockedError", "JournalMeta", "JournalReader", "LockedError",
    "OwnerRow", "Pairs", "RoundHealth", "RunLock", "RunRow", "SourceHealthRow", "StatusRow", "TransitionRow",
    "VerdictRow", "VoteSeenRow", "_table_columns", "authority_outages", "consensus_outages",
    "desired_params", "down_since", "loads", "pairs", "round_health", "sequential_from_dict", "sequential_to_dict",
    "status_from_json", "status_to_json", "values_json",
]

LOCK_NAME = "run.lock"

# The rows a rehearsal (a dry run, a replay) writes: it empties them before it starts, its rows being a
# rehearsal and not a record. Runs, the owner and plan acknowledgements are records and stay. The
# sequential tests' states go too: a rerun starts each criterion's test afresh, as the first run did,
# instead of continuing the previous rehearsal's looks (reruns give the same decisions, rollout.md §7.10).
REHEARSAL_TABLES = ("rollout_intents", "rollout_transitions", "rollout_events", "rollout_status",
                    "rollout_decisions", "rollout_commands", "rollout_metric_batches", "rollout_verdicts",
                    "rollout_votes_seen", "rollout_consensus_seen", "rollout_source_health", "rollout_exposure",
                    "rollout_authority_health", "rollout_sequential")


# --- the lock ---------------------------------------------------------------------------------

class LockedError(RolloutError):
    """Another ``kistexp run`` holds the experiment directory."""


class RunLock:
    """``flock(LOCK_EX | LOCK_NB)`` on EXP/run.lock for the process lifetime: the kernel drops
    it when the process dies, kill -9 included, so it is never stale (§3.7)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, holder: str = "") -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockedError(f"{self.path.parent}: already being run{holder}; "
                              "stop that run first (control commands work alongside it)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- the journal ------------------------------------------------------------------------------

class JournalLockedError(RolloutError):
    """Another process holds the experiment database's write lock past the busy timeout."""


BUSY_TIMEOUT_S = 5.0
# an owner whose heartbeat is older than this is gone, whatever its pid says now (pid reuse)
HEARTBEAT_STALE_S = 30.0
HEARTBEAT_EVERY_S = 1.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class Journal:
    """The journal's writer: the engine's, the dry run's and the control commands' one connection,
    which also answers the engine's own reads (its dict-shaped readers). Read-only views use
    ``JournalReader``, which never takes a write lock."""

    def __init__(self, db_path: Path, *, durable: bool = True) -> None:
        self.path = Path(db_path)
        open_db(self.path).close()  # checks the file and brings the schema up to date
        # the live driver steps on APScheduler's pool threads, one at a time (max_instances=1)
        self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA foreign_keys = ON")  # explicit BEGIN IMMEDIATE below (§3.6)
            # FULL: a commit survives power loss, so a rollback intent is never lost (§3.6); dry runs NORMAL
            self.conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
        except sqlite3.OperationalError as exc:
            self.conn.close()
            raise self._refusal(exc) from None
        self._last_beat = 0.0

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._refusal(exc) from None
        try:
            yield self.conn
        except sqlite3.OperationalError as exc:
            self.conn.execute("ROLLBACK")
            raise self._refusal(exc) from None
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise self._refusal(exc) from None

    def _refusal(self, exc: sqlite3.Error) -> RolloutError:
        """A journal write that cannot happen, in one line; the transaction is rolled back, so
        nothing is half written and a rerun resumes from the last commit."""
        if "locked" in str(exc) or "busy" in str(exc):
            return JournalLockedError(f"{self.path}: the database is locked by another process (waited "
                                      f"{BUSY_TIMEOUT_S:.0f} s); nothing was written, rerun when it is free")
        return RolloutError(f"{self.path}: cannot write the rollout journal: {exc}")

    # meta
    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM rollout_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, **items: str) -> None:
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO rollout_meta (key, value) VALUES (?, ?)", items.items())

    def reset_for_rehearsal(self, **meta: str) -> None:
        """Empty the rows a rehearsal writes (``REHEARSAL_TABLES``) and set ``meta``, in one transaction:
        a reader never sees half of an old rehearsal beside the new one's meta."""
        with self.write() as c:
            for table in REHEARSAL_TABLES:
                c.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
            c.executemany("INSERT OR REPLACE INTO rollout_meta (key, value) VALUES (?, ?)", meta.items())

    # runs and owner (messages only; the lock is the flock)
    def begin_run(self, argv: list[str], now: dt.datetime) -> int:
        host, pid = socket.gethostname(), os.getpid()
        with self.write() as c:
            cur = c.execute("INSERT INTO rollout_runs (pid, host, argv, start_us) VALUES (?, ?, ?, ?)",
                            (pid, host, json.dumps(argv), to_us(now)))
            c.execute("INSERT OR REPLACE INTO rollout_owner (id, pid, host, since_us, heartbeat_us) "
                      "VALUES (1, ?, ?, ?, ?)", (pid, host, to_us(now), to_us(now)))
            return cur.lastrowid

    def end_run(self, run_id: int, now: dt.datetime, reason: str) -> None:
        with self.write() as c:
            c.execute("UPDATE rollout_runs SET end_us = ?, reason = ? WHERE id = ?", (to_us(now), reason, run_id))

    def heartbeat(self, now: dt.datetime, monotonic: float) -> None:
        """The owner's proof of life (§3.5 ``owner``), at most once a second."""
        if monotonic - self._last_beat < HEARTBEAT_EVERY_S:
            return
        self._last_beat = monotonic
        with self.write() as c:
            c.execute("UPDATE rollout_owner SET heartbeat_us = ? WHERE id = 1 AND pid = ? AND host = ?",
                      (to_us(now), os.getpid(), socket.gethostname()))

    def check_owner(self, now: dt.datetime) -> str:
        """After the flock is ours: the owner row names the previous run. A live owner (its pid
        runs on this host, or another host's heartbeat is fresh) means the lock file was replaced
        under it, so the run is refused; a dead or silent one is taken over, its run row closed
        at its last heartbeat. Returns what was taken over ("" if nothing)."""
        row = self.conn.execute("SELECT pid, host, since_us, heartbeat_us FROM rollout_owner WHERE id = 1").fetchone()
        if row is None:
            return ""
        pid, host, since, beat = row
        age = (now - from_us(beat)).total_seconds()
        me = (os.getpid(), socket.gethostname())
        if (pid, host) == me:
            return ""
        unfinished = self.conn.execute("SELECT id FROM rollout_runs WHERE pid = ? AND host = ? AND end_us IS NULL "
                                       "ORDER BY id DESC LIMIT 1", (pid, host)).fetchone()
        if unfinished is None:
            return ""  # it ended cleanly
        alive = _pid_alive(pid) if host == me[1] else True
        if alive and abs(age) < HEARTBEAT_STALE_S:
            raise LockedError(f"{self.path.parent}: already being run by pid {pid} on {host} since "
                              f"{from_us(since):%Y-%m-%d %H:%M:%S} UTC (heartbeat {age:.0f} s ago), although "
                              f"{LOCK_NAME} was free: was it deleted? stop that run first")
        with self.write() as c:
            c.execute("UPDATE rollout_runs SET end_us = ?, reason = ? WHERE id = ?",
                      (beat, f"taken over: no heartbeat since {from_us(beat):%H:%M:%S} UTC", unfinished[0]))
        return f"pid {pid} on {host}, last heartbeat {age:.1f} s ago"

    def owner_text(self) -> str:
        row = self.conn.execute("SELECT pid, host, since_us FROM rollout_owner WHERE id = 1").fetchone()
        if row is None:
            return ""
        return f" by pid {row[0]} on {row[1]} since {from_us(row[2]):%Y-%m-%d %H:%M:%S} UTC"

    # events and status
    def processed(self, event_key: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM rollout_events WHERE event_key = ?", (event_key,)).fetchone()
        return row is not None

    def last_fire(self, trigger: str) -> dt.datetime | None:
        row = self.conn.execute("SELECT MAX(due_us) FROM rollout_events WHERE trigger = ?", (trigger,)).fetchone()
        return None if row[0] is None else from_us(row[0])

    def status(self) -> Status | None:
        row = self.conn.execute("SELECT status FROM rollout_status ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else status_from_json(row[0])

    def record(self, c: sqlite3.Connection, *, event_key: str, trigger: str, due: dt.datetime, now: dt.datetime,
               before: Status, after: Status, transition: Transition | None = None,
               participants: tuple[str, ...] = (), experiment_id: str = "", decision: str = "",
               message: str = "") -> None:
        """Inside ``write()``: the processed event, the new status, and a transition with one
        intent per participating authority, all in one transaction (§3.1 step 1)."""
        c.execute("INSERT INTO rollout_events (event_key, trigger, due_us, processed_us, lateness_s) "
                  "VALUES (?, ?, ?, ?, ?)", (event_key, trigger, to_us(due), to_us(now),
                                             max(0.0, (now - due).total_seconds())))
        if after != before:
            c.execute("INSERT INTO rollout_status (event_key, at_us, state, status) VALUES (?, ?, ?, ?)",
                      (event_key, to_us(now), after.state, status_to_json(after)))
        if decision:
            c.execute("INSERT INTO rollout_decisions (event_key, at_us, decision, stage, valid_after_us, message) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
                      (event_key, to_us(now), decision, after.stage,
                       to_us(transition.target_va) if transition else None, message))
        if transition is not None:
            c.execute("UPDATE rollout_intents SET state = 'superseded', done_us = ? "
                      "WHERE state IN ('intended', 'acted', 'verified')", (to_us(now),))
            c.execute("INSERT INTO rollout_transitions (seq, at_us, from_state, to_state, stage, kind, targets, "
                      "valid_after_us, cause) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (transition.seq, to_us(now), before.state, after.state, after.stage, transition.kind,
                       values_json(transition.values), to_us(transition.target_va), transition.cause))
            desired = json.dumps(desired_params(transition.values), sort_keys=True)
            sha = hashlib.sha256(desired.encode()).hexdigest()[:16]
            for auth in participants:
                key = f"{experiment_id}:{transition.seq}:{auth}:{transition.target_va:%Y%m%dT%H%M%S}:{sha}"
                c.execute("INSERT INTO rollout_intents (idem_key, transition_seq, authority, desired, "
                          "valid_after_us, state, intended_us) VALUES (?, ?, ?, ?, ?, 'intended', ?)",
                          (key, transition.seq, auth, desired, to_us(transition.target_va), to_us(now)))

    # intents
    def intents(self, states: tuple[str, ...] = INTENT_STATES) -> list[dict]:
        marks = ",".join("?" * len(states))
        rows = self.conn.execute(
            f"SELECT id, idem_key, transition_seq, authority, desired, valid_after_us, state, attempts, evidence "
            f"FROM rollout_intents WHERE state IN ({marks}) ORDER BY id", states).fetchall()
        return [{"id": r[0], "idem_key": r[1], "seq": r[2], "authority": r[3], "desired": json.loads(r[4]),
                 "valid_after": from_us(r[5]), "state": r[6], "attempts": r[7], "evidence": r[8]} for r in rows]

    def mark_intent(self, intent_id: int, state: str, now: dt.datetime, *, evidence: str = "",
                    error: str = "", attempt: bool = False) -> None:
        column = {"acted": "acted_us", "verified": "verified_us", "done": "done_us", "failed": "done_us"}.get(state)
        sets = ["state = ?", "evidence = CASE WHEN ? = '' THEN evidence ELSE ? END", "error = ?"]
        args: list = [state, evidence, evidence, error]
        if column:
            sets.append(f"{column} = ?")
            args.append(to_us(now))
        if attempt:
            sets.append("attempts = attempts + 1")
        with self.write() as c:
            c.execute(f"UPDATE rollout_intents SET {', '.join(sets)} WHERE id = ?", (*args, intent_id))

    # observations
    def vote_seen(self, authority: str, valid_after: dt.datetime, params: dict | None, digest: str = "") -> None:
        with self.write() as c:
            c.execute("INSERT OR REPLACE INTO rollout_votes_seen (authority, valid_after_us, params, digest) "
                      "VALUES (?, ?, ?, ?)", (authority, to_us(valid_after), json.dumps(params), digest))

    def consensus_seen(self, valid_after: dt.datetime, params: dict | None, signers: list[str],
                       flavour: str = "microdesc") -> None:
        with self.write() as c:
            c.execute("INSERT OR REPLACE INTO rollout_consensus_seen (valid_after_us, flavour, params, signers) "
                      "VALUES (?, ?, ?, ?)", (to_us(valid_after), flavour, json.dumps(params), json.dumps(signers)))

    # metric batches and verdicts
    def add_batch(self, c: sqlite3.Connection, source: str, metric: str, window: dt.datetime, phase: str,
                  values: np.ndarray | None, relays: list[tuple[str, int]] | None = None, *, origin: str = "",
                  excluded: int = 0) -> None:
        missing = values is None
        arr = np.zeros(0) if values is None else np.asarray(values, dtype="<f8")
        payload = arr.tobytes()
        summary = {} if missing or not arr.size else {
            "mean": float(arr.mean()), "median": float(np.median(arr)), "min": float(arr.min()),
            "max": float(arr.max())}
        c.execute("INSERT OR IGNORE INTO rollout_metric_batches (source, metric, window_us, phase, n, missing, "
                  "summary, payload, sha256, relays, origin, excluded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (source, metric, to_us(window), phase, int(arr.size), int(missing), json.dumps(summary),
                   payload, hashlib.sha256(payload).hexdigest(), None if relays is None else json.dumps(relays),
                   origin, int(excluded)))

    def batches(self) -> list[BatchRow]:
        """Every batch that holds samples, in window order (the analysis rebuilds its input from them)."""
        rows = self.conn.execute("SELECT source, metric, phase, window_us, payload, relays, origin FROM "
                                 "rollout_metric_batches WHERE missing = 0 ORDER BY window_us").fetchall()
        return [BatchRow(r[0], r[1], r[2], from_us(r[3]), np.frombuffer(r[4], dtype="<f8"),
                         None if r[5] is None else tuple((a, int(n)) for a, n in json.loads(r[5])), r[6])
                for r in rows]

    def add_source_health(self, c: sqlite3.Connection, window: dt.datetime, h, now: dt.datetime) -> None:
        """One measuring instance's answer to one collection (a failing one is a metric gap)."""
        c.execute("INSERT OR IGNORE INTO rollout_source_health (window_us, source, instance, ok, n_samples, problem, "
                  "at_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (to_us(window), h.source, h.instance, int(h.ok), int(h.n_samples), h.problem, to_us(now)))

    def source_health(self, only_problems: bool = False) -> list[SourceHealthRow]:
        where = " WHERE ok = 0" if only_problems else ""
        rows = self.conn.execute("SELECT window_us, source, instance, ok, n_samples, problem, id FROM "
                                 f"rollout_source_health{where} ORDER BY window_us, id").fetchall()
        return [SourceHealthRow(from_us(r[0]), r[1], r[2], bool(r[3]), r[4], r[5], r[6]) for r in rows]

    def consensus_params_by_va(self) -> dict[int, dict]:
        """valid-after (µs) -> the params of the consensus seen for it (published ones only)."""
        return {r[0]: json.loads(r[1]) for r in self.conn.execute(
            "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE params != 'null'")}

    def consensus_at_or_before(self, valid_after: dt.datetime) -> tuple[dt.datetime, dict] | None:
        row = self.conn.execute(
            "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE valid_after_us <= ? "
            "AND params != 'null' ORDER BY valid_after_us DESC LIMIT 1", (to_us(valid_after),)).fetchone()
        return None if row is None else (from_us(row[0]), json.loads(row[1]))

    def add_exposure(self, c: sqlite3.Connection, e: ExposureRow) -> None:
        c.execute("INSERT OR REPLACE INTO rollout_exposure (at_us, stage, population, expected_share, observed_share, "
                  "n_nodes, n_on_target, n_pinned, n_unknown, short, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (to_us(e.at), e.stage, e.population, e.expected_share, e.observed_share, e.n_nodes, e.n_on_target,
                   e.n_pinned, e.n_unknown, int(e.short), e.detail))

    def exposures(self) -> list[ExposureRow]:
        rows = self.conn.execute("SELECT at_us, stage, population, expected_share, observed_share, n_nodes, "
                                 "n_on_target, n_pinned, n_unknown, short, detail, id FROM rollout_exposure "
                                 "ORDER BY at_us, population").fetchall()
        return [ExposureRow(from_us(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9]), r[10], r[11])
                for r in rows]

    def authority_health_seen(self, valid_after: dt.datetime, rows: list[tuple[str, bool, bool, str]]) -> None:
        """Per authority for one round: voted, signed, state (ok, down, stale, not-signing)."""
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO rollout_authority_health (valid_after_us, authority, voted, signed, "
                          "state) VALUES (?, ?, ?, ?, ?)",
                          [(to_us(valid_after), a, int(v), int(s), st) for a, v, s, st in rows])

    def authority_health(self) -> list[AuthorityHealthRow]:
        rows = self.conn.execute("SELECT valid_after_us, authority, voted, signed, state, rowid FROM "
                                 "rollout_authority_health ORDER BY valid_after_us, authority").fetchall()
        return [AuthorityHealthRow(from_us(r[0]), r[1], bool(r[2]), bool(r[3]), r[4], r[5]) for r in rows]

    # engine bookkeeping
    def last_fires(self) -> dict[str, dt.datetime]:
        """Each trigger's latest processed due time (the engine's catch-up point on resume)."""
        return {t: from_us(d) for t, d in self.conn.execute(
            "SELECT trigger, MAX(due_us) FROM rollout_events GROUP BY trigger")}

    def asked_before(self, authority: str, intent_id: int) -> list[dict]:
        """The sets the rollout asked of ``authority`` in intents before ``intent_id``."""
        return [json.loads(r[0]) for r in self.conn.execute(
            "SELECT desired FROM rollout_intents WHERE authority = ? AND id < ?", (authority, intent_id))]

    def judged_at(self, window_end: dt.datetime) -> set[str]:
        """Criteria that have a verdict for the look ending at ``window_end``."""
        return {r[0] for r in self.conn.execute(
            "SELECT criterion FROM rollout_verdicts WHERE window_end_us = ?", (to_us(window_end),))}

    def mark_round_done(self, c: sqlite3.Connection, valid_after: dt.datetime, now: dt.datetime) -> None:
        """Inside ``write()``: the intents of a round whose consensus carried the values are done."""
        c.execute("UPDATE rollout_intents SET state = 'done', done_us = ? WHERE valid_after_us = ? "
                  "AND state IN ('acted', 'verified')", (to_us(now), to_us(valid_after)))

    def add_plan_ack(self, old_sha: str, new_sha: str, diff: str, who: str, now: dt.datetime) -> None:
        with self.write() as c:
            c.execute("INSERT INTO rollout_plan_acks (old_sha256, new_sha256, diff, who, at_us) "
                      "VALUES (?, ?, ?, ?, ?)", (old_sha, new_sha, diff, who, to_us(now)))

    def batch_values(self, metric: str, phase: str) -> np.ndarray:
        rows = self.conn.execute("SELECT payload FROM rollout_metric_batches WHERE metric = ? AND phase = ? "
                                 "AND missing = 0 ORDER BY window_us", (metric, phase)).fetchall()
        if not rows:
            return np.zeros(0)
        return np.concatenate([np.frombuffer(r[0], dtype="<f8") for r in rows])

    def add_verdict(self, c: sqlite3.Connection, v, window_end: dt.datetime, stage: int, shadow: bool,
                    phase: str = "") -> None:
        """One look's verdict with the judge's whole record (effect, interval, n per side, rule)."""
        c.execute("INSERT OR IGNORE INTO rollout_verdicts (criterion, window_end_us, stage, outcome, effect, ci_low, "
                  "ci_high, n_baseline, n_stage, shadow, detail, phase, reason, rule, record) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (v.criterion, to_us(window_end), stage, v.outcome, _finite(v.effect), _finite(v.ci_low),
                   _finite(v.ci_high), v.n_baseline, v.n_stage, int(shadow), v.detail, phase, v.reason, v.rule,
                   v.record or "{}"))

    def save_sequential(self, c: sqlite3.Connection, criterion: str, phase: str, state, now: dt.datetime) -> None:
        c.execute("INSERT OR REPLACE INTO rollout_sequential (criterion, phase, state, looks, updated_us) "
                  "VALUES (?, ?, ?, ?, ?)", (criterion, phase, json.dumps(sequential_to_dict(state)),
                                             state.looks, to_us(now)))

    def sequential_states(self) -> dict[tuple[str, str], object]:
        rows = self.conn.execute("SELECT criterion, phase, state FROM rollout_sequential").fetchall()
        return {(r[0], r[1]): sequential_from_dict(json.loads(r[2])) for r in rows}

    # commands (queued by control commands, which take no lock)
    def queue_command(self, kind: str, args: dict, user: str, now: dt.datetime) -> int:
        with self.write() as c:
            return c.execute("INSERT INTO rollout_commands (kind, args, user, queued_us, state) "
                             "VALUES (?, ?, ?, ?, 'queued')", (kind, json.dumps(args, sort_keys=True), user,
                                                               to_us(now))).lastrowid

    def queued_commands(self) -> list[dict]:
        rows = self.conn.execute("SELECT id, kind, args, user, queued_us FROM rollout_commands "
                                 "WHERE state = 'queued' ORDER BY id").fetchall()
        return [{"id": r[0], "kind": r[1], "args": json.loads(r[2]), "user": r[3], "queued": from_us(r[4])}
                for r in rows]

    def command_result(self, c: sqlite3.Connection, command_id: int, state: str, result: str) -> None:
        c.execute("UPDATE rollout_commands SET state = ?, result = ? WHERE id = ?", (state, result, command_id))

    def command(self, command_id: int) -> dict | None:
        r = self.conn.execute("SELECT kind, state, result FROM rollout_commands WHERE id = ?",
                              (command_id,)).fetchone()
        return None if r is None else {"kind": r[0], "state": r[1], "result": r[2]}

    # reading back
    def decisions(self) -> list[dict]:
        rows = self.conn.execute("SELECT at_us, decision, stage, valid_after_us, message FROM rollout_decisions "
                                 "ORDER BY id").fetchall()
        return [{"at": from_us(r[0]), "decision": r[1], "stage": r[2],
                 "valid_after": None if r[3] is None else from_us(r[3]), "message": r[4]} for r in rows]

    def transitions(self) -> list[dict]:
        rows = self.conn.execute("SELECT seq, at_us, from_state, to_state, stage, kind, targets, valid_after_us, "
                                 "cause FROM rollout_transitions ORDER BY seq").fetchall()
        return [{"seq": r[0], "at": from_us(r[1]), "from": r[2], "to": r[3], "stage": r[4], "kind": r[5],
                 "targets": json.loads(r[6]), "valid_after": from_us(r[7]), "cause": r[8]} for r in rows]

    def verdicts(self) -> list[dict]:
        rows = self.conn.execute("SELECT criterion, window_end_us, stage, outcome, effect, n_baseline, n_stage, "
                                 "shadow, detail, ci_low, ci_high, reason, rule, record FROM rollout_verdicts "
                                 "ORDER BY window_end_us, id").fetchall()
        return [{"criterion": r[0], "window_end": from_us(r[1]), "stage": r[2], "outcome": r[3], "effect": r[4],
                 "n_baseline": r[5], "n_stage": r[6], "shadow": bool(r[7]), "detail": r[8], "ci_low": r[9],
                 "ci_high": r[10], "reason": r[11], "rule": r[12], "record": json.loads(r[13] or "{}")}
                for r in rows]

    def consensuses(self) -> list[dict]:
        rows = self.conn.execute("SELECT valid_after_us, params, signers FROM rollout_consensus_seen "
                                 "ORDER BY valid_after_us").fetchall()
        return [{"valid_after": from_us(r[0]), "params": json.loads(r[1]), "signers": json.loads(r[2])}
                for r in rows]

    def votes(self) -> list[dict]:
        rows = self.conn.execute("SELECT authority, valid_after_us, params FROM rollout_votes_seen "
                                 "ORDER BY valid_after_us, authority").fetchall()
        return [{"authority": r[0], "valid_after": from_us(r[1]), "params": json.loads(r[2])} for r in rows]

    def round_health(self, authorities: tuple[str, ...] | list[str]) -> tuple[RoundHealth, ...]:
        """Each round's votes and consensus signers (``health.round_health``), read only."""
        return round_health(self.conn, authorities)
