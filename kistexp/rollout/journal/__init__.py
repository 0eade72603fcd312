"""The rollout journal in the experiment database (rollout.md §3; tables in kistexp/store/schema.py).

Rules (§3.1): no external effect without a durable intent; effects are whole sets; success is
observed (votes, consensus), not an API's answer; the status is the journal's last status row.
Writers use ``BEGIN IMMEDIATE`` on an autocommit connection so a read-then-write never fails
half way with SQLITE_BUSY (§3.6). The run lock is ``flock`` on a separate ``run.lock`` (§3.7).

Every SQL statement on a ``rollout_*`` table lives in this package (tests/rollout/test_rollout_journal_sql.py
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
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kistexp.metrics.series import to_us
from kistexp.rollout.journal.codec import (
    BadValue,
    JournalDamageError,
    JournalTooNewError,
    Pairs,
    _finite,
    args_value,
    command_kind,
    desired_params,
    flag_value,
    int_value,
    json_value,
    names_value,
    pairs,
    params_value,
    real_value,
    relays_value,
    samples_value,
    sequential_from_dict,
    sequential_to_dict,
    sequential_value,
    status_from_json,
    status_to_json,
    text_value,
    time_value,
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
from kistexp.rollout.state import MachineVerdict, Status, Transition
from kistexp.store.schema import open_db

__all__ = [
    "BUSY_TIMEOUT_S", "CONSENSUS_MISSING", "CONSENSUS_SIGNED", "CONSENSUS_UNCHECKED", "CONSENSUS_UNSIGNED",
    "HEARTBEAT_EVERY_S", "HEARTBEAT_STALE_S", "INTENT_STATES", "LOCK_NAME", "REHEARSAL_TABLES", "AuthorityHealthRow",
    "AuthorityOutage", "BatchInfoRow", "BatchRow", "CommandRow", "ConsensusOutage", "ConsensusSeenRow", "DecisionRow",
    "ExposureRow", "IntentRow", "Journal", "JournalDamageError", "JournalInUseError", "JournalLockedError",
    "JournalTooNewError", "JournalMeta", "JournalReader",
    "LockedError", "REHEARSAL_MODE", "OwnerRow", "Pairs", "RoundHealth", "RunLock", "RunRow", "SourceHealthRow",
    "StatusRow", "TransitionRow", "VerdictRow", "VoteSeenRow", "_table_columns", "authority_outages",
    "consensus_outages", "desired_params", "down_since", "pairs", "round_health", "sequential_from_dict",
    "sequential_to_dict", "status_from_json", "status_to_json", "values_json",
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


# --- whose journal it is -------------------------------------------------------------------------

class JournalInUseError(RolloutError):
    """The directory holds a journal that is not this rehearsal's to replace."""


REHEARSAL_MODE = "dry-run"  # the journal mode of dry runs and replays (replays: metrics "recorded")


def _journal_kind(meta: dict[str, str]) -> str:
    """What kind of run a journal's meta says wrote it, as a phrase ("a dry run")."""
    mode = meta.get("mode")
    if mode == REHEARSAL_MODE:
        return "a replay" if meta.get("metrics") == "recorded" else "a dry run"
    return f"a live run (--authorities {_shown(mode)})"


def _shown(value: object) -> str:
    # a garbled meta value or an odd path is quoted, so the refusal stays one line
    text = str(value)
    return text if text.isprintable() else repr(text)


def _journal_plan(meta: dict[str, str]) -> str:
    """The plan's name a journal's meta names: a live run's canonical plan, else its experiment id
    ("dry-run:NAME", "NAME:STARTED")."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        name = json.loads(meta.get("plan_canon") or "{}").get("name")
        if isinstance(name, str):
            return name
    ident = str(meta.get("experiment_id") or "")  # a garbled row is still named, not a traceback
    if meta.get("mode") == REHEARSAL_MODE:
        return ident.split(":", 1)[-1]
    return ident.rsplit(":", 1)[0]


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
        # O_NOFOLLOW and O_NONBLOCK: a symlink put in its place is not followed, a FIFO does not block
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise RolloutError(f"{self.path}: cannot be the run lock ({exc.strerror or exc}); it must be a "
                               "regular file: remove it and rerun") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)  # a lock on a FIFO or a device would lock nothing another run looks at
            raise RolloutError(f"{self.path}: cannot be the run lock (not a regular file); remove it and rerun")
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

    def _decode(self, table: str, row: object, build):
        """``build()``, a value it cannot decode being the journal's damage, named by table and row."""
        try:
            return build()
        except BadValue as exc:
            raise JournalDamageError(self.path, table, row, str(exc)) from None

    # meta
    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM rollout_meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return self._decode("rollout_meta", key, lambda: text_value(row[0], "value"))

    def set_meta(self, **items: str) -> None:
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO rollout_meta (key, value) VALUES (?, ?)", items.items())

    def refuse_foreign(self, **meta: str) -> None:
        """Refuse (``JournalInUseError``) to let a rehearsal with ``meta`` (its ``mode``, ``metrics`` and
        ``experiment_id``) replace this journal unless it is empty (a new directory, or predictions only)
        or the same rehearsal's: a live run's journal is a record, and another plan's or another kind of
        rehearsal's is someone's result. One line naming the directory, what it holds and what to do."""
        found = dict(self.conn.execute("SELECT key, value FROM rollout_meta").fetchall())
        mine, where = _journal_kind(meta), _shown(self.path.parent)
        if "mode" not in found:
            used = [t for t in (*REHEARSAL_TABLES, "rollout_runs", "rollout_plan_acks")
                    if self.conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]  # noqa: S608 - fixed names
            if used:
                raise JournalInUseError(f"{where}: holds a rollout journal with no mode in rollout_meta "
                                        f"(rows in {used[0]}); {mine} never replaces it: pass another --dir")
            return
        theirs = _journal_kind(found)
        plan, own_plan = _journal_plan(found), _journal_plan(meta)
        if theirs != mine:
            raise JournalInUseError(f"{where}: holds the journal of {theirs} of plan {plan!r}; {mine} "
                                    "never replaces it: pass another --dir")
        if found.get("experiment_id") != meta.get("experiment_id"):
            raise JournalInUseError(f"{where}: holds the journal of {theirs} of plan {plan!r}, not "
                                    f"{own_plan!r}; {mine} never replaces it: pass another --dir")

    def reset_for_rehearsal(self, **meta: str) -> None:
        """Empty the rows a rehearsal writes (``REHEARSAL_TABLES``) and set ``meta``, in one transaction:
        a reader never sees half of an old rehearsal beside the new one's meta. Only the same rehearsal's
        journal (or none) is emptied (``refuse_foreign``, checked inside the transaction, so a live run
        that claimed the directory a moment ago is not wiped either)."""
        with self.write() as c:
            self.refuse_foreign(**meta)
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
        row = self._owner()
        if row is None:
            return ""
        pid, host, since, beat = row.pid, row.host, row.since, row.heartbeat
        age = (now - beat).total_seconds()
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
                              f"{since:%Y-%m-%d %H:%M:%S} UTC (heartbeat {age:.0f} s ago), although "
                              f"{LOCK_NAME} was free: was it deleted? stop that run first")
        with self.write() as c:
            c.execute("UPDATE rollout_runs SET end_us = ?, reason = ? WHERE id = ?",
                      (to_us(beat), f"taken over: no heartbeat since {beat:%H:%M:%S} UTC", unfinished[0]))
        return f"pid {pid} on {host}, last heartbeat {age:.1f} s ago"

    def owner_text(self) -> str:
        row = self._owner()
        if row is None:
            return ""
        return f" by pid {row.pid} on {row.host} since {row.since:%Y-%m-%d %H:%M:%S} UTC"

    def _owner(self) -> OwnerRow | None:
        row = self.conn.execute("SELECT pid, host, since_us, heartbeat_us FROM rollout_owner WHERE id = 1").fetchone()
        if row is None:
            return None
        return self._decode("rollout_owner", 1, lambda: OwnerRow(
            int_value(row[0], "pid"), text_value(row[1], "host"), time_value(row[2], "since_us"),
            time_value(row[3], "heartbeat_us")))

    # events and status
    def processed(self, event_key: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM rollout_events WHERE event_key = ?", (event_key,)).fetchone()
        return row is not None

    def last_fire(self, trigger: str) -> dt.datetime | None:
        row = self.conn.execute("SELECT MAX(due_us) FROM rollout_events WHERE trigger = ?", (trigger,)).fetchone()
        return None if row[0] is None else self._decode("rollout_events", f"of trigger {trigger!r}",
                                                        lambda: time_value(row[0], "due_us"))

    def status(self) -> Status | None:
        row = self.conn.execute("SELECT id, status FROM rollout_status ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else self._decode("rollout_status", row[0], lambda: status_from_json(row[1]))

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
        return [self._decode("rollout_intents", r[0], lambda r=r: {
            "id": r[0], "idem_key": text_value(r[1], "idem_key"), "seq": int_value(r[2], "transition_seq"),
            "authority": text_value(r[3], "authority"), "desired": dict(params_value(r[4], "desired")),
            "valid_after": time_value(r[5], "valid_after_us"), "state": r[6],
            "attempts": int_value(r[7], "attempts"), "evidence": text_value(r[8], "evidence")}) for r in rows]

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
        rows = self.conn.execute("SELECT id, source, metric, phase, window_us, payload, relays, origin, n FROM "
                                 "rollout_metric_batches WHERE missing = 0 ORDER BY window_us").fetchall()
        return [self._decode("rollout_metric_batches", r[0], lambda r=r: BatchRow(
            text_value(r[1], "source"), text_value(r[2], "metric"), text_value(r[3], "phase"),
            time_value(r[4], "window_us"), samples_value(r[5], r[8]),
            None if r[6] is None else relays_value(r[6], "relays"), text_value(r[7], "origin"))) for r in rows]

    def add_source_health(self, c: sqlite3.Connection, window: dt.datetime, h, now: dt.datetime) -> None:
        """One measuring instance's answer to one collection (a failing one is a metric gap)."""
        c.execute("INSERT OR IGNORE INTO rollout_source_health (window_us, source, instance, ok, n_samples, problem, "
                  "at_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (to_us(window), h.source, h.instance, int(h.ok), int(h.n_samples), h.problem, to_us(now)))

    def source_health(self, only_problems: bool = False) -> list[SourceHealthRow]:
        where = " WHERE ok = 0" if only_problems else ""
        rows = self.conn.execute("SELECT window_us, source, instance, ok, n_samples, problem, id FROM "
                                 f"rollout_source_health{where} ORDER BY window_us, id").fetchall()
        return [self._decode("rollout_source_health", r[6], lambda r=r: SourceHealthRow(
            time_value(r[0], "window_us"), text_value(r[1], "source"), text_value(r[2], "instance"),
            flag_value(r[3], "ok"), int_value(r[4], "n_samples"), text_value(r[5], "problem"), r[6])) for r in rows]

    def consensus_params_by_va(self) -> dict[int, dict]:
        """valid-after (µs) -> the params of the consensus seen for it (published ones only)."""
        out = {}
        for key, va, params in self.conn.execute(
                "SELECT rowid, valid_after_us, params FROM rollout_consensus_seen WHERE params != 'null'"):
            out[va] = self._decode("rollout_consensus_seen", key, lambda va=va, params=params: (
                time_value(va, "valid_after_us"), dict(params_value(params, "params")))[1])
        return out

    def consensus_at_or_before(self, valid_after: dt.datetime) -> tuple[dt.datetime, dict] | None:
        row = self.conn.execute(
            "SELECT rowid, valid_after_us, params FROM rollout_consensus_seen WHERE valid_after_us <= ? "
            "AND params != 'null' ORDER BY valid_after_us DESC LIMIT 1", (to_us(valid_after),)).fetchone()
        return None if row is None else self._decode("rollout_consensus_seen", row[0], lambda: (
            time_value(row[1], "valid_after_us"), dict(params_value(row[2], "params"))))

    def add_exposure(self, c: sqlite3.Connection, e: ExposureRow) -> None:
        c.execute("INSERT OR REPLACE INTO rollout_exposure (at_us, stage, population, expected_share, observed_share, "
                  "n_nodes, n_on_target, n_pinned, n_unknown, short, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (to_us(e.at), e.stage, e.population, e.expected_share, e.observed_share, e.n_nodes, e.n_on_target,
                   e.n_pinned, e.n_unknown, int(e.short), e.detail))

    def exposures(self) -> list[ExposureRow]:
        rows = self.conn.execute("SELECT at_us, stage, population, expected_share, observed_share, n_nodes, "
                                 "n_on_target, n_pinned, n_unknown, short, detail, id FROM rollout_exposure "
                                 "ORDER BY at_us, population").fetchall()
        return [self._decode("rollout_exposure", r[11], lambda r=r: ExposureRow(
            time_value(r[0], "at_us"), int_value(r[1], "stage"), text_value(r[2], "population"),
            real_value(r[3], "expected_share"), real_value(r[4], "observed_share", null=True),
            *(int_value(v, c) for v, c in zip(r[5:9], ("n_nodes", "n_on_target", "n_pinned", "n_unknown"),
                                              strict=True)),
            flag_value(r[9], "short"), text_value(r[10], "detail"), r[11])) for r in rows]

    def authority_health_seen(self, valid_after: dt.datetime, rows: list[tuple[str, bool, bool, str]]) -> None:
        """Per authority for one round: voted, signed, state (ok, down, stale, not-signing)."""
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO rollout_authority_health (valid_after_us, authority, voted, signed, "
                          "state) VALUES (?, ?, ?, ?, ?)",
                          [(to_us(valid_after), a, int(v), int(s), st) for a, v, s, st in rows])

    def authority_health(self) -> list[AuthorityHealthRow]:
        rows = self.conn.execute("SELECT valid_after_us, authority, voted, signed, state, rowid FROM "
                                 "rollout_authority_health ORDER BY valid_after_us, authority").fetchall()
        return [self._decode("rollout_authority_health", r[5], lambda r=r: AuthorityHealthRow(
            time_value(r[0], "valid_after_us"), text_value(r[1], "authority"), flag_value(r[2], "voted"),
            flag_value(r[3], "signed"), text_value(r[4], "state"), r[5])) for r in rows]

    # engine bookkeeping
    def last_fires(self) -> dict[str, dt.datetime]:
        """Each trigger's latest processed due time (the engine's catch-up point on resume)."""
        return {t: self._decode("rollout_events", f"of trigger {t!r}", lambda d=d: time_value(d, "due_us"))
                for t, d in self.conn.execute("SELECT trigger, MAX(due_us) FROM rollout_events GROUP BY trigger")}

    def asked_before(self, authority: str, intent_id: int) -> list[dict]:
        """The sets the rollout asked of ``authority`` in intents before ``intent_id``."""
        return [self._decode("rollout_intents", r[0], lambda r=r: dict(params_value(r[1], "desired")))
                for r in self.conn.execute("SELECT id, desired FROM rollout_intents WHERE authority = ? AND id < ?",
                                           (authority, intent_id))]

    def judged_at(self, window_end: dt.datetime) -> set[str]:
        """Criteria that have a verdict for the look ending at ``window_end``."""
        return {r[0] for r in self.conn.execute(
            "SELECT criterion FROM rollout_verdicts WHERE window_end_us = ?", (to_us(window_end),))}

    def verdicts_at(self, window_end: dt.datetime) -> tuple[MachineVerdict, ...]:
        """The look ending at ``window_end`` as the state machine takes it: a stage's end rests on it (the
        limit and whether extending can help come from the judge's record)."""
        rows = self.conn.execute("SELECT criterion, outcome, effect, ci_low, ci_high, n_baseline, n_stage, detail, "
                                 "reason, rule, record, id FROM rollout_verdicts WHERE window_end_us = ? ORDER BY id",
                                 (to_us(window_end),)).fetchall()

        def build(r) -> MachineVerdict:
            record = json_value(r[10] or "{}", "record", dict)
            bound, limited = record.get("bound"), record.get("limited_by") or ""
            return MachineVerdict(text_value(r[0], "criterion"), text_value(r[1], "outcome"),
                                  real_value(r[2], "effect", null=True), real_value(r[3], "ci_low", null=True),
                                  real_value(r[4], "ci_high", null=True), int_value(r[5], "n_baseline"),
                                  int_value(r[6], "n_stage"), text_value(r[7], "detail"), text_value(r[8], "reason"),
                                  text_value(r[9], "rule"), r[10] or "",
                                  bound=None if bound is None else real_value(bound, "record.bound"),
                                  limited_by=text_value(limited, "record.limited_by"))
        return tuple(self._decode("rollout_verdicts", r[11], lambda r=r: build(r)) for r in rows)

    def mark_round_done(self, c: sqlite3.Connection, valid_after: dt.datetime, now: dt.datetime) -> None:
        """Inside ``write()``: the intents of a round whose consensus carried the values are done."""
        c.execute("UPDATE rollout_intents SET state = 'done', done_us = ? WHERE valid_after_us = ? "
                  "AND state IN ('acted', 'verified')", (to_us(now), to_us(valid_after)))

    def add_plan_ack(self, old_sha: str, new_sha: str, diff: str, who: str, now: dt.datetime) -> None:
        with self.write() as c:
            c.execute("INSERT INTO rollout_plan_acks (old_sha256, new_sha256, diff, who, at_us) "
                      "VALUES (?, ?, ?, ?, ?)", (old_sha, new_sha, diff, who, to_us(now)))

    def batch_values(self, metric: str, phase: str) -> np.ndarray:
        rows = self.conn.execute("SELECT id, payload, n FROM rollout_metric_batches WHERE metric = ? AND phase = ? "
                                 "AND missing = 0 ORDER BY window_us", (metric, phase)).fetchall()
        if not rows:
            return np.zeros(0)
        return np.concatenate([self._decode("rollout_metric_batches", r[0], lambda r=r: samples_value(r[1], r[2]))
                               for r in rows])

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
        rows = self.conn.execute("SELECT rowid, criterion, phase, state FROM rollout_sequential").fetchall()
        return {(r[1], r[2]): self._decode("rollout_sequential", r[0], lambda r=r: sequential_value(r[3], "state"))
                for r in rows}

    # commands (queued by control commands, which take no lock)
    def queue_command(self, kind: str, args: dict, user: str, now: dt.datetime) -> int:
        with self.write() as c:
            return c.execute("INSERT INTO rollout_commands (kind, args, user, queued_us, state) "
                             "VALUES (?, ?, ?, ?, 'queued')", (kind, json.dumps(args, sort_keys=True), user,
                                                               to_us(now))).lastrowid

    def queued_commands(self) -> list[dict]:
        rows = self.conn.execute("SELECT id, kind, args, user, queued_us FROM rollout_commands "
                                 "WHERE state = 'queued' ORDER BY id").fetchall()
        return [self._decode("rollout_commands", r[0], lambda r=r: {
            "id": r[0], "kind": (kind := command_kind(r[1])), "args": dict(args_value(r[2], "args", kind)),
            "user": text_value(r[3], "user"), "queued": time_value(r[4], "queued_us")}) for r in rows]

    def command_result(self, c: sqlite3.Connection, command_id: int, state: str, result: str) -> None:
        c.execute("UPDATE rollout_commands SET state = ?, result = ? WHERE id = ?", (state, result, command_id))

    def command(self, command_id: int) -> dict | None:
        r = self.conn.execute("SELECT kind, state, result FROM rollout_commands WHERE id = ?",
                              (command_id,)).fetchone()
        return None if r is None else {"kind": r[0], "state": r[1], "result": r[2]}

    # reading back
    def decisions(self) -> list[dict]:
        rows = self.conn.execute("SELECT at_us, decision, stage, valid_after_us, message, id FROM rollout_decisions "
                                 "ORDER BY id").fetchall()
        return [self._decode("rollout_decisions", r[5], lambda r=r: {
            "at": time_value(r[0], "at_us"), "decision": text_value(r[1], "decision"),
            "stage": int_value(r[2], "stage"), "valid_after": time_value(r[3], "valid_after_us", null=True),
            "message": text_value(r[4], "message")}) for r in rows]

    def transitions(self) -> list[dict]:
        rows = self.conn.execute("SELECT seq, at_us, from_state, to_state, stage, kind, targets, valid_after_us, "
                                 "cause FROM rollout_transitions ORDER BY seq").fetchall()
        return [self._decode("rollout_transitions", r[0], lambda r=r: {
            "seq": r[0], "at": time_value(r[1], "at_us"), "from": text_value(r[2], "from_state"),
            "to": text_value(r[3], "to_state"), "stage": int_value(r[4], "stage"), "kind": text_value(r[5], "kind"),
            "targets": dict(params_value(r[6], "targets", unset=True)),
            "valid_after": time_value(r[7], "valid_after_us"), "cause": text_value(r[8], "cause")}) for r in rows]

    def verdicts(self) -> list[dict]:
        rows = self.conn.execute("SELECT criterion, window_end_us, stage, outcome, effect, n_baseline, n_stage, "
                                 "shadow, detail, ci_low, ci_high, reason, rule, record, id FROM rollout_verdicts "
                                 "ORDER BY window_end_us, id").fetchall()
        return [self._decode("rollout_verdicts", r[14], lambda r=r: {
            "criterion": text_value(r[0], "criterion"), "window_end": time_value(r[1], "window_end_us"),
            "stage": int_value(r[2], "stage"), "outcome": text_value(r[3], "outcome"),
            "effect": real_value(r[4], "effect", null=True), "n_baseline": int_value(r[5], "n_baseline"),
            "n_stage": int_value(r[6], "n_stage"), "shadow": flag_value(r[7], "shadow"),
            "detail": text_value(r[8], "detail"), "ci_low": real_value(r[9], "ci_low", null=True),
            "ci_high": real_value(r[10], "ci_high", null=True), "reason": text_value(r[11], "reason"),
            "rule": text_value(r[12], "rule"), "record": json_value(r[13] or "{}", "record", dict)}) for r in rows]

    def consensuses(self) -> list[dict]:
        rows = self.conn.execute("SELECT valid_after_us, params, signers, rowid FROM rollout_consensus_seen "
                                 "ORDER BY valid_after_us").fetchall()
        return [self._decode("rollout_consensus_seen", r[3], lambda r=r: {
            "valid_after": time_value(r[0], "valid_after_us"), "params": _params_dict(r[1]),
            "signers": list(names_value(r[2], "signers"))}) for r in rows]

    def votes(self) -> list[dict]:
        rows = self.conn.execute("SELECT authority, valid_after_us, params, rowid FROM rollout_votes_seen "
                                 "ORDER BY valid_after_us, authority").fetchall()
        return [self._decode("rollout_votes_seen", r[3], lambda r=r: {
            "authority": text_value(r[0], "authority"), "valid_after": time_value(r[1], "valid_after_us"),
            "params": _params_dict(r[2])}) for r in rows]

    def round_health(self, authorities: tuple[str, ...] | list[str]) -> tuple[RoundHealth, ...]:
        """Each round's votes and consensus signers (``health.round_health``), read only."""
        return round_health(self.conn, authorities, db=self.path)


def _params_dict(text) -> dict | None:
    pairs_ = params_value(text, "params", null=True)
    return None if pairs_ is None else dict(pairs_)
