"""The rollout journal in the experiment database (rollout.md §3; tables in kistexp/store/schema.py).

Rules (§3.1): no external effect without a durable intent; effects are whole sets; success is
observed (votes, consensus), not an API's answer; the status is the journal's last status row.
Writers use ``BEGIN IMMEDIATE`` on an autocommit connection so a read-then-write never fails
half way with SQLITE_BUSY (§3.6). The run lock is ``flock`` on a separate ``run.lock`` (§3.7).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np

from kistexp.metrics.series import from_us, to_us
from kistexp.rollout.spec import RolloutError
from kistexp.rollout.state import Counters, Status, Transition
from kistexp.store.schema import open_db

LOCK_NAME = "run.lock"
INTENT_STATES = ("intended", "acted", "verified", "done", "superseded", "failed")


# --- Status <-> JSON --------------------------------------------------------------------------

def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _dt(s: str | None) -> dt.datetime | None:
    return None if s is None else dt.datetime.fromisoformat(s)


def status_to_json(st: Status) -> str:
    d = attrs.asdict(st, recurse=False)
    d["values"] = [list(kv) for kv in st.values]
    for k in ("target_va", "stage_va", "decision_at"):
        d[k] = _iso(d[k])
    d["reasons"] = sorted(st.reasons)
    d["counters"] = [[name, attrs.asdict(c)] for name, c in st.counters]
    return json.dumps(d, sort_keys=True)


def status_from_json(text: str) -> Status:
    d = json.loads(text)
    d["values"] = tuple(tuple(kv) for kv in d["values"])
    for k in ("target_va", "stage_va", "decision_at"):
        d[k] = _dt(d[k])
    d["reasons"] = frozenset(d["reasons"])
    d["counters"] = tuple((name, Counters(**c)) for name, c in d["counters"])
    return Status(**d)


def values_json(values) -> str:
    return json.dumps({k: v for k, v in values}, sort_keys=True)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def sequential_to_dict(state) -> dict:
    d = attrs.asdict(state)
    d["fractions"] = list(state.fractions)
    return d


def sequential_from_dict(d: dict):
    from kistexp.judge import SequentialState

    return SequentialState(**{**d, "fractions": tuple(d["fractions"])})


def desired_params(values) -> dict[str, int]:
    """The ConsensusParams set an authority is asked to run: unset keys are left out."""
    return {k: int(v) for k, v in values if v != "unset"}


# --- the lock ---------------------------------------------------------------------------------

@attrs.frozen(eq=False)
class BatchRow:
    source: str
    metric: str
    phase: str
    window: dt.datetime
    values: np.ndarray
    relays: tuple[tuple[str, int], ...] | None
    origin: str


@attrs.frozen
class SourceHealthRow:
    window: dt.datetime
    source: str
    instance: str
    ok: bool
    n_samples: int
    problem: str


@attrs.frozen
class ExposureRow:
    at: dt.datetime
    stage: int
    population: str
    expected_share: float
    observed_share: float | None
    n_nodes: int
    n_on_target: int
    n_pinned: int
    n_unknown: int
    short: bool
    detail: str


@attrs.frozen
class AuthorityHealthRow:
    valid_after: dt.datetime
    authority: str
    voted: bool
    signed: bool
    state: str


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
        rows = self.conn.execute("SELECT window_us, source, instance, ok, n_samples, problem FROM "
                                 f"rollout_source_health{where} ORDER BY window_us, id").fetchall()
        return [SourceHealthRow(from_us(r[0]), r[1], r[2], bool(r[3]), r[4], r[5]) for r in rows]

    def consensus_params_by_va(self) -> dict[int, dict]:
        """valid-after (µs) -> the params of the consensus seen for it (published ones only)."""
        return {r[0]: json.loads(r[1]) for r in self.conn.execute(
            "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE params != 'null'")}

    def consensus_at_or_before(self, valid_after: dt.datetime) -> tuple[dt.datetime, dict] | None:
        row = self.conn.execute(
            "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE valid_after_us <= ? "
            "AND params != 'null' ORDER BY valid_after_us DESC LIMIT 1", (to_us(valid_after),)).fetchone()
        return None if row is None else (from_us(row[0]), json.loads(row[1]))

    def add_exposure(self, c: sqlite3.Connection, e) -> None:
        c.execute("INSERT OR REPLACE INTO rollout_exposure (at_us, stage, population, expected_share, observed_share, "
                  "n_nodes, n_on_target, n_pinned, n_unknown, short, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (to_us(e.at), e.stage, e.population, e.expected_share, e.observed_share, e.n_nodes, e.n_on_target,
                   e.n_pinned, e.n_unknown, int(e.short), e.detail))

    def exposures(self) -> list[ExposureRow]:
        rows = self.conn.execute("SELECT at_us, stage, population, expected_share, observed_share, n_nodes, "
                                 "n_on_target, n_pinned, n_unknown, short, detail FROM rollout_exposure "
                                 "ORDER BY at_us, population").fetchall()
        return [ExposureRow(from_us(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9]), r[10])
                for r in rows]

    def authority_health_seen(self, valid_after: dt.datetime, rows: list[tuple[str, bool, bool, str]]) -> None:
        """Per authority for one round: voted, signed, state (ok, down, stale, not-signing)."""
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO rollout_authority_health (valid_after_us, authority, voted, signed, "
                          "state) VALUES (?, ?, ?, ?, ?)",
                          [(to_us(valid_after), a, int(v), int(s), st) for a, v, s, st in rows])

    def authority_health(self) -> list[AuthorityHealthRow]:
        rows = self.conn.execute("SELECT valid_after_us, authority, voted, signed, state FROM "
                                 "rollout_authority_health ORDER BY valid_after_us, authority").fetchall()
        return [AuthorityHealthRow(from_us(r[0]), r[1], bool(r[2]), bool(r[3]), r[4]) for r in rows]

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
        """Each round's votes and consensus signers (``round_health`` below), read only."""
        return round_health(self.conn, authorities)


# --- authority health, read-only (rollout.md §3.5 votes_seen, consensus_seen) -------------------------
#
# These readers take any SQLite connection to the experiment database, a read-only one included
# (``kistexp status`` beside a live run, the feed, the exporter, the report), and never write. Tables
# and columns that newer schemas add (``rollout_authority_health``) are read when present, by name.

CONSENSUS_SIGNED, CONSENSUS_UNSIGNED, CONSENSUS_MISSING, CONSENSUS_UNCHECKED = (
    "signed", "unsigned", "missing", "unchecked")


@attrs.frozen
class RoundHealth:
    """One voting round as the journal saw it: whose vote was served, who signed its consensus.

    ``consensus`` is ``signed`` (published and signed by more than half of the configured
    authorities), ``unsigned`` (published with fewer names), ``missing`` (looked for, none
    published) or ``unchecked`` (the engine did not look at this round's consensus)."""

    valid_after: dt.datetime
    n_authorities: int
    voted: tuple[str, ...] = ()
    down: tuple[str, ...] = ()  # asked for their vote, none served
    stale: tuple[str, ...] = ()  # served an old vote (newer schemas' authority health only)
    signed: tuple[str, ...] = ()
    consensus: str = CONSENSUS_UNCHECKED
    params: tuple[tuple[str, int], ...] | None = None

    @property
    def majority(self) -> bool:
        return self.consensus == CONSENSUS_SIGNED

    @property
    def votes_checked(self) -> bool:
        return bool(self.voted or self.down or self.stale)


@attrs.frozen
class ConsensusOutage:
    """A stretch of consecutive rounds seen without a majority-signed consensus."""

    start: dt.datetime  # valid-after of the first round seen without one
    end: dt.datetime  # valid-after of the last such round
    rounds: int
    ongoing: bool  # no majority-signed consensus seen after it
    last_good: dt.datetime | None  # the majority-signed consensus seen before it
    recovered: dt.datetime | None  # the first majority-signed one seen after it
    down: tuple[str, ...]  # authorities that served no vote in any of its rounds

    def describe(self, fmt: str = "%Y-%m-%d %H:%M") -> str:
        span = (f"at {self.start:{fmt}}" if self.start == self.end
                else f"from {self.start:{fmt}} to {self.end:{fmt}}")
        words = [f"no majority-signed consensus {span} ({self.rounds} round{'s' if self.rounds != 1 else ''}"
                 + (", still none at the last look)" if self.ongoing else f"; back at {self.recovered:{fmt}})")]
        if self.down:
            words.append(f"no vote from {', '.join(self.down)}")
        if self.last_good is not None:
            words.append(f"last majority-signed consensus seen before it: {self.last_good:{fmt}}")
        return "; ".join(words)

    def to_json(self) -> dict:
        return {"start": self.start, "end": self.end, "rounds": self.rounds, "ongoing": self.ongoing,
                "last_good": self.last_good, "recovered": self.recovered, "down": list(self.down)}


@attrs.frozen
class AuthorityOutage:
    """Consecutive rounds in which one authority served no vote."""

    authority: str
    start: dt.datetime
    end: dt.datetime
    rounds: int
    ongoing: bool  # still without a vote in the last round whose votes were fetched

    def describe(self, fmt: str = "%Y-%m-%d %H:%M") -> str:
        span = f"at {self.start:{fmt}}" if self.start == self.end else f"from {self.start:{fmt}} to {self.end:{fmt}}"
        tail = ", still down at the last look" if self.ongoing else ""
        return f"{self.authority}: no vote {span} ({self.rounds} round{'s' if self.rounds != 1 else ''}{tail})"

    def to_json(self) -> dict:
        return attrs.asdict(self)


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """The columns of ``table`` ('' if it does not exist): newer schemas add some, older lack them."""
    try:
        return tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))  # noqa: S608 - our names
    except sqlite3.Error:
        return ()


def _loads(text) -> object:
    try:
        return json.loads(text) if isinstance(text, (str, bytes)) else None
    except ValueError:
        return None


def round_health(conn: sqlite3.Connection, authorities: tuple[str, ...] | list[str]) -> tuple[RoundHealth, ...]:
    """Every round the journal holds votes or a consensus for, oldest first, with who voted, who
    was down and who signed. ``authorities`` are the configured ones (the majority is more than
    half of them). A consensus the engine fetched went through the directory client, which accepts
    only one signed by a majority; one recorded without signer names is taken as that."""
    n = len(authorities)
    voted: dict[int, set[str]] = {}
    down: dict[int, set[str]] = {}
    stale: dict[int, set[str]] = {}
    signed: dict[int, set[str]] = {}
    seen_consensus: dict[int, tuple[object, list[str]]] = {}
    health_rounds: set[int] = set()  # rounds the engine wrote its own health rows for (newer schemas)
    if _table_columns(conn, "rollout_votes_seen"):
        for auth, va, params in conn.execute("SELECT authority, valid_after_us, params FROM rollout_votes_seen"):
            (down if _loads(params) is None else voted).setdefault(va, set()).add(auth)
    if _table_columns(conn, "rollout_consensus_seen"):
        # one flavour decides; microdesc is the one the engine fetches, others only where it is absent
        for va, params, signers in conn.execute(
                "SELECT valid_after_us, params, signers FROM rollout_consensus_seen "
                "ORDER BY valid_after_us, flavour = 'microdesc'"):
            names = _loads(signers)
            seen_consensus[va] = (_loads(params), [str(s) for s in names] if isinstance(names, list) else [])
    cols = _table_columns(conn, "rollout_authority_health")
    if {"valid_after_us", "authority"} <= set(cols):
        picked = [c for c in ("voted", "signed", "state") if c in cols]
        for row in conn.execute(f"SELECT valid_after_us, authority, {', '.join(picked) or 'NULL'} "  # noqa: S608
                                "FROM rollout_authority_health"):
            va, auth, rest = row[0], row[1], dict(zip(picked, row[2:], strict=True))
            if "signed" in rest:
                health_rounds.add(va)
            state = str(rest.get("state") or "")
            if state == "no-consensus":
                continue  # nothing was published to read who voted from: the round's votes stay as seen
            if rest.get("voted") is not None or state:
                # the health row is the engine's own verdict on the round: it replaces the vote rows'
                for bucket in (voted, down, stale):
                    bucket.get(va, set()).discard(auth)
                if state == "stale":
                    target = stale
                elif state == "down" or rest.get("voted") == 0:
                    target = down
                else:
                    target = voted
                target.setdefault(va, set()).add(auth)
            if rest.get("signed"):
                signed.setdefault(va, set()).add(auth)
    order = {a: i for i, a in enumerate(authorities)}

    def ordered(names) -> tuple[str, ...]:
        return tuple(sorted(names, key=lambda a: (order.get(a, len(order)), a)))

    out = []
    for va in sorted(set(voted) | set(down) | set(stale) | set(seen_consensus) | health_rounds):
        params, names = seen_consensus.get(va, (None, []))
        names_set = set(names) | signed.get(va, set())
        if va not in seen_consensus and va in health_rounds:
            # no consensus row, but the engine recorded who signed this round's: as many as signed it
            state = (CONSENSUS_SIGNED if len(names_set) * 2 > n else
                     CONSENSUS_UNSIGNED if names_set else CONSENSUS_MISSING)
        elif va not in seen_consensus:
            state = CONSENSUS_UNCHECKED
        elif not isinstance(params, dict):
            state = CONSENSUS_MISSING
        elif not names_set or len(names_set) * 2 > n:
            state = CONSENSUS_SIGNED
        else:
            state = CONSENSUS_UNSIGNED
        out.append(RoundHealth(
            valid_after=from_us(va), n_authorities=n, voted=ordered(voted.get(va, ())),
            down=ordered(down.get(va, ())), stale=ordered(stale.get(va, ())), signed=ordered(names_set),
            consensus=state,
            params=tuple(sorted((str(k), v) for k, v in params.items())) if isinstance(params, dict) else None))
    return tuple(out)


def _interval(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None) -> dt.timedelta | None:
    if interval is not None:
        return interval
    steps = [b.valid_after - a.valid_after for a, b in zip(rounds, rounds[1:], strict=False)]
    positive = [s for s in steps if s > dt.timedelta(0)]
    return min(positive) if positive else None


def consensus_outages(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None
                      ) -> tuple[ConsensusOutage, ...]:
    """Stretches of consecutive rounds checked without a majority-signed consensus. A stretch ends
    at a majority-signed one, and also where the checked rounds are more than one ``interval``
    apart: what happened in rounds nobody looked at is not claimed."""
    checked = tuple(r for r in rounds if r.consensus != CONSENSUS_UNCHECKED)
    step = _interval(checked, interval)
    out: list[ConsensusOutage] = []
    current: list[RoundHealth] = []
    last_good: dt.datetime | None = None

    def close(recovered: dt.datetime | None, ongoing: bool) -> None:
        if current:
            down = tuple(dict.fromkeys(a for r in current for a in r.down))  # in the order first seen
            out.append(ConsensusOutage(current[0].valid_after, current[-1].valid_after, len(current), ongoing,
                                       last_good, recovered, down))
            current.clear()

    for r in checked:
        if r.majority:
            close(r.valid_after, False)
            last_good = r.valid_after
            continue
        if current and step is not None and r.valid_after - current[-1].valid_after > step:
            close(None, False)  # a gap nobody looked at: the stretch seen ends here, its end unknown
        current.append(r)
    close(None, True)
    return tuple(out)


def authority_outages(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None
                      ) -> tuple[AuthorityOutage, ...]:
    """Per authority, stretches of consecutive rounds (votes fetched) in which it served no vote."""
    checked = tuple(r for r in rounds if r.votes_checked)
    step = _interval(checked, interval)
    open_: dict[str, list[dt.datetime]] = {}
    out: list[AuthorityOutage] = []
    prev: dt.datetime | None = None
    for r in checked:
        gap = prev is not None and step is not None and r.valid_after - prev > step
        for auth in list(open_):
            if gap or auth not in r.down:
                times = open_.pop(auth)
                out.append(AuthorityOutage(auth, times[0], times[-1], len(times), False))
        for auth in r.down:
            open_.setdefault(auth, []).append(r.valid_after)
        prev = r.valid_after
    for auth, times in open_.items():
        out.append(AuthorityOutage(auth, times[0], times[-1], len(times), True))
    return tuple(sorted(out, key=lambda o: (o.start, o.authority)))


def down_since(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None) -> dict[str, dt.datetime]:
    """The authorities without a vote in the last round whose votes were fetched, each with the
    first round of the stretch it has been down since."""
    return {o.authority: o.start for o in authority_outages(rounds, interval) if o.ongoing}
