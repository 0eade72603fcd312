"""The journal's read-only reader: ``kistexp status``, ``history`` and ``rollback --dry-run``, the event
feed, the Prometheus exporter and the report read the ``rollout_*`` tables through it, beside a live
run too (docs/rollouts.md, "The database").

It holds one read-only SQLite connection (a ``mode=ro`` URI) and never opens the database file any
other way: a plain open() and close() of it would drop the POSIX locks of a run in the same process
(kistexp/store/schema.py ``_check_header``). ``snapshot()`` makes several reads one read transaction,
so what one commit of the run wrote arrives whole (a status row and the decision written with it).

Rows come in the order they were written, each with its id (``after=N``: only the rows past id N, how
the feed tails the journal). Tables and columns are read by name: a table an older schema lacks
reads as empty and a column it lacks as its default, so the reader shows whatever the journal holds.

Every value is decoded by its column's type (kistexp.rollout.journal.codec): a row holding something
its table cannot (a time past the calendar, a status that is not JSON, a garbled cell) is refused with
one ``JournalDamageError`` naming the database, the table and the row, never skipped.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import numpy as np

from kistexp.expdir import DB_NAME
from kistexp.rollout.journal.codec import (
    ABSENT,
    BadValue,
    JournalDamageError,
    JournalTooNewError,
    args_value,
    command_kind,
    flag_value,
    int_value,
    json_value,
    names_value,
    params_value,
    real_value,
    samples_value,
    shown,
    status_from_json,
    text_value,
    time_value,
)
from kistexp.rollout.journal.health import RoundHealth, _table_columns, round_health
from kistexp.rollout.journal.rows import (
    COMMAND_STATES,
    INTENT_STATES,
    AuthorityHealthRow,
    BatchInfoRow,
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
from kistexp.rollout.state import Status
from kistexp.store.schema import SCHEMA_VERSION, missing_columns, missing_tables

T = TypeVar("T")
_VERDICT_COLUMNS = ("criterion", "window_end_us", "stage", "outcome", "effect", "ci_low", "ci_high", "n_baseline",
                    "n_stage", "shadow", "detail", "reason", "phase", "rule", "record")


def _int(v, column: str) -> int:
    return int_value(v, column)


def _verdict(r: dict) -> VerdictRow:
    return VerdictRow(r["_key"], text_value(r["criterion"], "criterion"),
                      time_value(r["window_end_us"], "window_end_us"), _int(r["stage"], "stage"),
                      text_value(r["outcome"], "outcome"), real_value(r["effect"], "effect", null=True),
                      real_value(r["ci_low"], "ci_low", null=True), real_value(r["ci_high"], "ci_high", null=True),
                      _int(r["n_baseline"], "n_baseline"), _int(r["n_stage"], "n_stage"),
                      flag_value(r["shadow"], "shadow"), text_value(r["detail"], "detail"),
                      text_value(r["reason"], "reason"), text_value(r["phase"], "phase"), text_value(r["rule"], "rule"),
                      _record(r["record"]))


def _record(v) -> str:
    """The judge's record: kept as JSON text (the report parses it), checked to be a JSON object."""
    if v is ABSENT:
        return "{}"
    json_value(v, "record", dict)
    return v


def phase_stage(phase: str) -> int | None:
    """The stage index of a metric batch's phase: ``baseline`` is 0, ``stage:<i>:<valid-after>`` is i,
    others (``excluded``) None; ``BadValue`` for a ``stage:`` phase without its index."""
    if phase == "baseline":
        return 0
    if not phase.startswith("stage:"):
        return None
    index = phase.split(":")[1]
    if not (index.isascii() and index.isdigit() and len(index) <= 6):
        raise BadValue(f"phase {phase[:40]!r} is not baseline, excluded or stage:<index>:<valid-after>")
    return int(index)


@contextlib.contextmanager
def _refusing_damage(where: str) -> Iterator[None]:
    """A database SQLite finds damaged (a garbled page, not a database at all) as one line naming it.
    Only that: a database busy a moment (an ``OperationalError``) stays an ``sqlite3.Error``, which
    the feed and the exporter retry at their next poll."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if type(exc) is not sqlite3.DatabaseError:
            raise
        raise JournalDamageError(where, None, None, f"cannot read the rollout journal: {exc}") from None


class _Cursor(sqlite3.Cursor):
    def execute(self, *args) -> _Cursor:
        with _refusing_damage(self.connection.shown):
            return super().execute(*args)

    def fetchone(self):
        with _refusing_damage(self.connection.shown):
            return super().fetchone()

    def fetchall(self) -> list:
        with _refusing_damage(self.connection.shown):
            return super().fetchall()

    def __next__(self):
        with _refusing_damage(self.connection.shown):
            return super().__next__()


class _Connection(sqlite3.Connection):
    """The reader's connection: every query's cursor turns damage SQLite finds into one line."""

    shown = ""

    def cursor(self, factory=_Cursor) -> sqlite3.Cursor:
        return super().cursor(factory)

    def execute(self, sql: str, parameters=()) -> sqlite3.Cursor:
        return self.cursor().execute(sql, parameters)


class JournalReader:
    """Read-only access to the journal in the experiment database ``db_path``
    (``JournalReader.of_experiment(EXP)`` for an experiment directory's).

    A missing or unreadable journal is refused in one line (``RolloutError`` naming the directory or
    the database). A damaged one (a table or column missing, a page SQLite finds garbled, a row whose
    value its column cannot hold) is a ``JournalDamageError`` naming the table and the row. Query
    methods raise an ``sqlite3.OperationalError`` as SQLite reports it (a database busy a moment): the
    feed retries at its next poll, the exporter reports itself down for that scrape."""

    def __init__(self, db_path: Path | str) -> None:
        self.path = Path(db_path)
        if not self.path.is_file():
            raise RolloutError(f"{self.path}: no such experiment database")
        self._columns: dict[str, tuple[str, ...]] = {}
        try:
            # autocommit: snapshot() opens its read transaction explicitly; the feed reads on its own thread
            self.conn = sqlite3.connect(f"file:{quote(str(self.path))}?mode=ro", uri=True, isolation_level=None,
                                        check_same_thread=False, factory=_Connection)
            self.conn.shown = str(self.path)
        except sqlite3.Error as exc:
            raise RolloutError(f"{self.path}: cannot read the rollout journal: {exc}") from None
        try:
            self.conn.execute("SELECT 1 FROM rollout_meta LIMIT 1")
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            lost = missing_tables(self.conn, "rollout_")
            lost_columns = missing_columns(self.conn, "rollout_")
        except sqlite3.Error as exc:
            self.conn.close()
            if type(exc) is sqlite3.DatabaseError:  # a garbled page or not a database: damage, not "busy"
                raise JournalDamageError(self.path, None, None, f"cannot read the rollout journal: {exc}") from None
            raise RolloutError(f"{self.path}: cannot read the rollout journal: {exc}") from None
        if version > SCHEMA_VERSION:
            self.conn.close()
            raise JournalTooNewError(f"{self.path}: journal schema version {version} is newer than this kistexp "
                                     f"understands ({SCHEMA_VERSION}); upgrade kistexp")
        if lost or lost_columns:
            self.conn.close()
            # an older schema lacks tables and reads with defaults; a table or column its version promises
            # and it lacks is damage, which would otherwise read as "nothing happened"
            if lost:
                what = f"table {', '.join(lost)} is missing"
            else:
                table = lost_columns[0].partition(".")[0]
                cols = [c.partition(".")[2] for c in lost_columns if c.startswith(table + ".")]
                what = f"table {table} lacks its column{'s' if len(cols) > 1 else ''} {', '.join(cols)}"
            raise JournalDamageError(self.path, None, None, f"damaged rollout journal: {what} (schema version "
                                     f"{version})")

    @classmethod
    def of_experiment(cls, exp_path: Path | str) -> JournalReader:
        """The reader of experiment directory ``exp_path``'s journal."""
        db = Path(exp_path) / DB_NAME
        if not db.is_file():
            raise RolloutError(f"{exp_path}: not an experiment directory (no {DB_NAME})")
        return cls(db)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[JournalReader]:
        """Reads inside are one read transaction: they see the journal as of one commit."""
        if self.conn.in_transaction:  # inside another snapshot: that one holds
            yield self
            return
        self.conn.execute("BEGIN")
        try:
            yield self
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")  # ends the read transaction; nothing was written

    # --- reading by name ------------------------------------------------------------------------

    def columns(self, table: str) -> tuple[str, ...]:
        """The columns ``table`` has (() when it does not exist), asked once per reader."""
        if table not in self._columns:
            self._columns[table] = _table_columns(self.conn, table)
        return self._columns[table]

    def _rows(self, table: str, columns: Sequence[str], *, key: str = "id", after: int = 0,
              order: str = "") -> list[dict]:
        """Rows of ``table`` with ``key`` past ``after``, as dicts of ``columns`` (``ABSENT`` for those the
        table lacks, an older schema's) and ``_key``; ordered by ``key`` unless ``order`` says otherwise."""
        have = self.columns(table)
        if not have:
            return []
        picked = [c for c in columns if c in have]
        rows = self.conn.execute(f"SELECT {', '.join([key, *picked])} FROM {table} WHERE {key} > ? "  # noqa: S608
                                 f"ORDER BY {order or key}", (after,)).fetchall()
        blank = dict.fromkeys(columns, ABSENT)
        return [{**blank, **dict(zip(picked, r[1:], strict=True)), "_key": r[0]} for r in rows]

    def _decoded(self, table: str, rows: list[dict], build: Callable[[dict], T]) -> list[T]:
        """Each row through ``build``; a value it cannot decode is the journal's damage, named by row."""
        out = []
        for r in rows:
            try:
                out.append(build(r))
            except BadValue as exc:
                raise JournalDamageError(self.path, table, r["_key"], str(exc)) from None
        return out

    def _last_id(self, table: str) -> int:
        if not self.columns(table):
            return 0
        return self.conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0  # noqa: S608

    # --- meta and status ------------------------------------------------------------------------

    def meta(self) -> JournalMeta:
        items = []
        for k, v in self.conn.execute("SELECT key, value FROM rollout_meta ORDER BY rowid"):
            # the keys and values are text; anything else was put there by hand or by damage
            if not isinstance(k, str):
                raise JournalDamageError(self.path, "rollout_meta", shown(k), "the key is not text")
            if not isinstance(v, str):
                raise JournalDamageError(self.path, "rollout_meta", k, f"the value is {shown(v)}, not text")
            items.append((k, v))
        return JournalMeta(tuple(items))

    def last_status(self) -> StatusRow | None:
        """The last status row (None before the first event changed the status)."""
        rows = self._rows("rollout_status", ("event_key", "at_us", "status"), order="id DESC LIMIT 1")
        return self._decoded("rollout_status", rows, _status_row)[0] if rows else None

    def latest_status(self) -> Status | None:
        """The rollout's status: the last status row's (None before the first event changed it)."""
        row = self.last_status()
        return None if row is None else row.status

    def last_status_id(self) -> int:
        return self._last_id("rollout_status")

    def last_decision_id(self) -> int:
        return self._last_id("rollout_decisions")

    def statuses(self, after: int = 0) -> list[StatusRow]:
        return self._decoded("rollout_status", self._rows("rollout_status", ("event_key", "at_us", "status"),
                                                          after=after), _status_row)

    def decisions(self, after: int = 0) -> list[DecisionRow]:
        return self._decoded("rollout_decisions", self._rows(
            "rollout_decisions", ("event_key", "at_us", "decision", "stage", "valid_after_us", "message"),
            after=after), lambda r: DecisionRow(
                r["_key"], text_value(r["event_key"], "event_key"), time_value(r["at_us"], "at_us"),
                text_value(r["decision"], "decision"), _int(r["stage"], "stage"),
                time_value(r["valid_after_us"], "valid_after_us", null=True), text_value(r["message"], "message")))

    def transitions(self, after: int = 0) -> list[TransitionRow]:
        """Transitions past sequence number ``after``, in sequence."""
        return self._decoded("rollout_transitions", self._rows(
            "rollout_transitions", ("at_us", "from_state", "to_state", "stage", "kind", "targets", "valid_after_us",
                                    "cause"), key="seq", after=after), lambda r: TransitionRow(
                r["_key"], time_value(r["at_us"], "at_us"), text_value(r["from_state"], "from_state"),
                text_value(r["to_state"], "to_state"), _int(r["stage"], "stage"), text_value(r["kind"], "kind"),
                params_value(r["targets"], "targets", unset=True), time_value(r["valid_after_us"], "valid_after_us"),
                text_value(r["cause"], "cause")))

    # --- judging ----------------------------------------------------------------------------------

    def verdicts(self, after: int = 0) -> list[VerdictRow]:
        """Verdicts as written (by id)."""
        return self._decoded("rollout_verdicts", self._rows("rollout_verdicts", _VERDICT_COLUMNS, after=after),
                             _verdict)

    def looks(self) -> list[VerdictRow]:
        """Every verdict in the order of the looks: by the end of the window looked at, then as written."""
        return self._decoded("rollout_verdicts", self._rows("rollout_verdicts", _VERDICT_COLUMNS,
                                                            order="window_end_us, id"), _verdict)

    def latest_verdicts(self) -> dict[str, VerdictRow]:
        """Each criterion's verdict at its latest look, criteria in the order they were first judged."""
        latest: dict[str, VerdictRow] = {}
        for v in self.looks():
            latest[v.criterion] = v
        return latest

    def metric_batches(self, after: int = 0) -> list[BatchInfoRow]:
        """Metric batches without their samples (``batch_values`` reads those)."""
        def build(r: dict) -> BatchInfoRow:
            phase = text_value(r["phase"], "phase")
            phase_stage(phase)
            return BatchInfoRow(r["_key"], text_value(r["source"], "source"), text_value(r["metric"], "metric"),
                                time_value(r["window_us"], "window_us"), phase, _int(r["n"], "n"),
                                flag_value(r["missing"], "missing"), text_value(r["origin"], "origin"),
                                _int(r["excluded"], "excluded"), text_value(r["problem"], "problem", null=True))

        return self._decoded("rollout_metric_batches", self._rows(
            "rollout_metric_batches", ("source", "metric", "window_us", "phase", "n", "missing", "origin", "excluded",
                                       "problem"), after=after), build)

    def metric_phases(self) -> list[tuple[str, str]]:
        """Each (metric, phase) that has batches."""
        if not self.columns("rollout_metric_batches"):
            return []
        rows = [{"_key": i, "metric": m, "phase": p} for i, m, p in self.conn.execute(
            "SELECT MIN(id), metric, phase FROM rollout_metric_batches GROUP BY metric, phase ORDER BY MIN(id)")]

        def build(r: dict) -> tuple[str, str]:
            phase = text_value(r["phase"], "phase")
            phase_stage(phase)
            return text_value(r["metric"], "metric"), phase

        return self._decoded("rollout_metric_batches", rows, build)

    def batch_values(self, metric: str, phase: str) -> np.ndarray:
        """The samples of ``metric`` judged in ``phase``, window after window."""
        rows = [{"_key": r[0], "payload": r[1], "n": r[2]} for r in self.conn.execute(
            "SELECT id, payload, n FROM rollout_metric_batches WHERE metric = ? AND phase = ? AND missing = 0 "
            "ORDER BY window_us", (metric, phase))]
        if not rows:
            return np.zeros(0)
        return np.concatenate(self._decoded("rollout_metric_batches", rows, _samples))

    def source_health(self, after: int = 0) -> list[SourceHealthRow]:
        return self._decoded("rollout_source_health", self._rows(
            "rollout_source_health", ("window_us", "source", "instance", "ok", "n_samples", "problem"), after=after),
            lambda r: SourceHealthRow(time_value(r["window_us"], "window_us"), text_value(r["source"], "source"),
                                      text_value(r["instance"], "instance"), flag_value(r["ok"], "ok"),
                                      _int(r["n_samples"], "n_samples"), text_value(r["problem"], "problem"),
                                      r["_key"]))

    def gaps_by_source(self) -> dict[str, int]:
        """Per source, the collection windows that delivered nothing plus its failed instance polls."""
        gaps: dict[str, int] = {}
        if {"source", "missing", "n"} <= set(self.columns("rollout_metric_batches")):
            for key, source, n in self.conn.execute("SELECT MIN(id), source, COUNT(*) FROM rollout_metric_batches "
                                                    "WHERE missing != 0 OR n = 0 GROUP BY source"):
                source = self._cell("rollout_metric_batches", key, text_value, source, "source")
                gaps[source] = gaps.get(source, 0) + n
        if {"source", "ok"} <= set(self.columns("rollout_source_health")):
            for key, source, n in self.conn.execute("SELECT MIN(id), source, COUNT(*) FROM rollout_source_health "
                                                    "WHERE ok = 0 GROUP BY source"):
                source = self._cell("rollout_source_health", key, text_value, source, "source")
                gaps[source] = gaps.get(source, 0) + n
        return gaps

    def _cell(self, table: str, row: object, decode: Callable, value, column: str, **kw):
        try:
            return decode(value, column, **kw)
        except BadValue as exc:
            raise JournalDamageError(self.path, table, row, str(exc)) from None

    def exposures(self, after: int = 0, *, order: str = "") -> list[ExposureRow]:
        return self._decoded("rollout_exposure", self._rows(
            "rollout_exposure", ("at_us", "stage", "population", "expected_share", "observed_share", "n_nodes",
                                 "n_on_target", "n_pinned", "n_unknown", "short", "detail"), after=after, order=order),
            lambda r: ExposureRow(time_value(r["at_us"], "at_us"), _int(r["stage"], "stage"),
                                  text_value(r["population"], "population"),
                                  real_value(r["expected_share"], "expected_share"),
                                  real_value(r["observed_share"], "observed_share", null=True),
                                  _int(r["n_nodes"], "n_nodes"), _int(r["n_on_target"], "n_on_target"),
                                  _int(r["n_pinned"], "n_pinned"), _int(r["n_unknown"], "n_unknown"),
                                  flag_value(r["short"], "short"), text_value(r["detail"], "detail"), r["_key"]))

    def latest_exposure(self) -> dict[str, ExposureRow]:
        """Each population's latest exposure row."""
        return {e.population: e for e in self.exposures(order="at_us, id")}

    # --- intents, commands, runs (small tables whose rows change state: read whole) ---------------

    def intents(self) -> list[IntentRow]:
        return self._decoded("rollout_intents", self._rows(
            "rollout_intents", ("idem_key", "transition_seq", "authority", "desired", "valid_after_us", "state",
                                "attempts", "error", "evidence", "intended_us", "acted_us", "verified_us", "done_us")),
            lambda r: IntentRow(
                r["_key"], text_value(r["idem_key"], "idem_key"), _int(r["transition_seq"], "transition_seq"),
                text_value(r["authority"], "authority"), params_value(r["desired"], "desired"),
                time_value(r["valid_after_us"], "valid_after_us"), _intent_state(r["state"]),
                _int(r["attempts"], "attempts"), text_value(r["error"], "error"),
                text_value(r["evidence"], "evidence"), time_value(r["intended_us"], "intended_us"),
                time_value(r["acted_us"], "acted_us", null=True),
                time_value(r["verified_us"], "verified_us", null=True),
                time_value(r["done_us"], "done_us", null=True)))

    def intent_counts(self) -> dict[str, int]:
        """Intents by state (states without one are absent)."""
        if not self.columns("rollout_intents"):
            return {}
        return {self._cell("rollout_intents", key, lambda v, _c: _intent_state(v), state, "state"): n
                for key, state, n in self.conn.execute("SELECT MIN(id), state, COUNT(*) FROM rollout_intents "
                                                       "GROUP BY state")}

    def commands(self) -> list[CommandRow]:
        return self._decoded("rollout_commands", self._rows(
            "rollout_commands", ("kind", "args", "user", "queued_us", "state", "result")),
            lambda r: CommandRow(r["_key"], (kind := command_kind(r["kind"])), args_value(r["args"], "args", kind),
                                 text_value(r["user"], "user"), time_value(r["queued_us"], "queued_us"),
                                 _command_state(r["state"]), text_value(r["result"], "result")))

    def runs(self) -> list[RunRow]:
        return self._decoded("rollout_runs", self._rows(
            "rollout_runs", ("pid", "host", "start_us", "end_us", "reason", "argv")),
            lambda r: RunRow(r["_key"], _int(r["pid"], "pid"), text_value(r["host"], "host"),
                             time_value(r["start_us"], "start_us"), time_value(r["end_us"], "end_us", null=True),
                             text_value(r["reason"], "reason", null=True), names_value(r["argv"], "argv")))

    def open_runs(self) -> int:
        """Runs whose row is still open: running, or killed before they could close it."""
        if not self.columns("rollout_runs"):
            return 0
        return self.conn.execute("SELECT COUNT(*) FROM rollout_runs WHERE end_us IS NULL").fetchone()[0]

    def owner(self) -> OwnerRow | None:
        rows = self._rows("rollout_owner", ("pid", "host", "since_us", "heartbeat_us"))
        return self._decoded("rollout_owner", rows, lambda r: OwnerRow(
            _int(r["pid"], "pid"), text_value(r["host"], "host"), time_value(r["since_us"], "since_us"),
            time_value(r["heartbeat_us"], "heartbeat_us")))[-1] if rows else None

    # --- what the authorities served ----------------------------------------------------------------

    def votes_seen(self, after: int = 0) -> list[VoteSeenRow]:
        return self._decoded("rollout_votes_seen", self._rows(
            "rollout_votes_seen", ("authority", "valid_after_us", "params", "digest"), key="rowid", after=after),
            lambda r: VoteSeenRow(r["_key"], text_value(r["authority"], "authority"),
                                  time_value(r["valid_after_us"], "valid_after_us"),
                                  params_value(r["params"], "params", null=True), text_value(r["digest"], "digest")))

    def vote_authorities(self) -> tuple[str, ...]:
        """Every authority a vote was asked of, by name."""
        if not self.columns("rollout_votes_seen"):
            return ()
        return tuple(self._cell("rollout_votes_seen", key, text_value, a, "authority") for key, a in self.conn.execute(
            "SELECT MIN(rowid), authority FROM rollout_votes_seen GROUP BY authority ORDER BY authority"))

    def consensus_seen(self, after: int = 0) -> list[ConsensusSeenRow]:
        return self._decoded("rollout_consensus_seen", self._rows(
            "rollout_consensus_seen", ("valid_after_us", "flavour", "params", "signers"), key="rowid", after=after),
            lambda r: ConsensusSeenRow(r["_key"], time_value(r["valid_after_us"], "valid_after_us"),
                                       text_value(r["flavour"], "flavour"),
                                       params_value(r["params"], "params", null=True),
                                       names_value(r["signers"], "signers")))

    def authority_health(self, after: int = 0) -> list[AuthorityHealthRow]:
        """The engine's own word on each authority's round (newer schemas)."""
        return self._decoded("rollout_authority_health", self._rows(
            "rollout_authority_health", ("valid_after_us", "authority", "voted", "signed", "state"), key="rowid",
            after=after),
            lambda r: AuthorityHealthRow(time_value(r["valid_after_us"], "valid_after_us"),
                                         text_value(r["authority"], "authority"), flag_value(r["voted"], "voted"),
                                         flag_value(r["signed"], "signed"), text_value(r["state"], "state"),
                                         r["_key"]))

    def round_health(self, authorities: Sequence[str]) -> tuple[RoundHealth, ...]:
        """Each round's votes and consensus signers (``kistexp.rollout.journal.round_health``)."""
        return round_health(self.conn, tuple(authorities), db=self.path)


def _status_row(r: dict) -> StatusRow:
    return StatusRow(r["_key"], text_value(r["event_key"], "event_key"), time_value(r["at_us"], "at_us"),
                     status_from_json(r["status"]))


def _samples(r: dict) -> np.ndarray:
    return samples_value(r["payload"], r["n"])


def _intent_state(v) -> str:
    if v not in INTENT_STATES:
        raise BadValue(f"state is {shown(v)}, not one of {', '.join(INTENT_STATES)}")
    return v


def _command_state(v) -> str:
    if v not in COMMAND_STATES:
        raise BadValue(f"state is {shown(v)}, not one of {', '.join(COMMAND_STATES)}")
    return v
