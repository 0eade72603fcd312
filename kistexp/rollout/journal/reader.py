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
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np

from kistexp.expdir import DB_NAME
from kistexp.metrics.series import from_us
from kistexp.rollout.journal.codec import Pairs, loads, pairs, status_from_json
from kistexp.rollout.journal.health import RoundHealth, _table_columns, round_health
from kistexp.rollout.journal.rows import (
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

_VERDICT_COLUMNS = ("criterion", "window_end_us", "stage", "outcome", "effect", "ci_low", "ci_high", "n_baseline",
                    "n_stage", "shadow", "detail", "reason", "phase", "rule", "record")


def _time(us) -> dt.datetime | None:
    return None if us is None else from_us(us)


def _pairs(text) -> Pairs:
    value = loads(text)
    return pairs(value) if isinstance(value, dict) else ()


def _params(text) -> Pairs | None:
    """A vote's or consensus's parameters; None where the journal holds ``null`` (none served or published)."""
    value = loads(text)
    return pairs(value) if isinstance(value, dict) else None


def _verdict(r: dict) -> VerdictRow:
    return VerdictRow(r["_key"], r["criterion"], from_us(r["window_end_us"]), r["stage"], r["outcome"], r["effect"],
                      r["ci_low"], r["ci_high"], r["n_baseline"] or 0, r["n_stage"] or 0, bool(r["shadow"]),
                      r["detail"] or "", r["reason"] or "", r["phase"] or "", r["rule"] or "", r["record"] or "{}")


class JournalReader:
    """Read-only access to the journal in the experiment database ``db_path``
    (``JournalReader.of_experiment(EXP)`` for an experiment directory's).

    A missing or unreadable journal is refused in one line (``RolloutError`` naming the directory or
    the database). Query methods raise ``sqlite3.Error`` as SQLite reports it (a database busy a
    moment, replaced under the reader): the feed retries at its next poll, the exporter reports
    itself down for that scrape."""

    def __init__(self, db_path: Path | str) -> None:
        self.path = Path(db_path)
        if not self.path.is_file():
            raise RolloutError(f"{self.path}: no such experiment database")
        self._columns: dict[str, tuple[str, ...]] = {}
        try:
            # autocommit: snapshot() opens its read transaction explicitly; the feed reads on its own thread
            self.conn = sqlite3.connect(f"file:{quote(str(self.path))}?mode=ro", uri=True, isolation_level=None,
                                        check_same_thread=False)
        except sqlite3.Error as exc:
            raise RolloutError(f"{self.path}: cannot read the rollout journal: {exc}") from None
        try:
            self.conn.execute("SELECT 1 FROM rollout_meta LIMIT 1")
        except sqlite3.Error as exc:
            self.conn.close()
            raise RolloutError(f"{self.path}: cannot read the rollout journal: {exc}") from None

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
        """Rows of ``table`` with ``key`` past ``after``, as dicts of ``columns`` (None for those the
        table lacks) and ``_key``; ordered by ``key`` unless ``order`` says otherwise."""
        have = self.columns(table)
        if not have:
            return []
        picked = [c for c in columns if c in have]
        rows = self.conn.execute(f"SELECT {', '.join([key, *picked])} FROM {table} WHERE {key} > ? "  # noqa: S608
                                 f"ORDER BY {order or key}", (after,)).fetchall()
        blank = dict.fromkeys(columns)
        return [{**blank, **dict(zip(picked, r[1:], strict=True)), "_key": r[0]} for r in rows]

    def _last_id(self, table: str) -> int:
        if not self.columns(table):
            return 0
        return self.conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0  # noqa: S608

    # --- meta and status ------------------------------------------------------------------------

    def meta(self) -> JournalMeta:
        return JournalMeta(tuple((str(k), str(v)) for k, v in self.conn.execute("SELECT key, value FROM rollout_meta")))

    def latest_status(self) -> Status | None:
        """The rollout's status: the last status row (None before the first event changed it)."""
        row = self.conn.execute("SELECT status FROM rollout_status ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else status_from_json(row[0])

    def last_status_id(self) -> int:
        return self._last_id("rollout_status")

    def last_decision_id(self) -> int:
        return self._last_id("rollout_decisions")

    def statuses(self, after: int = 0) -> list[StatusRow]:
        out = []
        for r in self._rows("rollout_status", ("event_key", "at_us", "status"), after=after):
            try:
                out.append(StatusRow(r["_key"], r["event_key"], from_us(r["at_us"]), status_from_json(r["status"])))
            except (TypeError, ValueError, KeyError):
                continue  # a status written by a newer engine this reader cannot parse: skipped, not fatal
        return out

    def decisions(self, after: int = 0) -> list[DecisionRow]:
        return [DecisionRow(r["_key"], r["event_key"], from_us(r["at_us"]), r["decision"], r["stage"],
                            _time(r["valid_after_us"]), r["message"] or "")
                for r in self._rows("rollout_decisions", ("event_key", "at_us", "decision", "stage", "valid_after_us",
                                                          "message"), after=after)]

    def transitions(self, after: int = 0) -> list[TransitionRow]:
        """Transitions past sequence number ``after``, in sequence."""
        return [TransitionRow(r["_key"], from_us(r["at_us"]), r["from_state"], r["to_state"], r["stage"], r["kind"],
                              _pairs(r["targets"]), from_us(r["valid_after_us"]), r["cause"] or "")
                for r in self._rows("rollout_transitions", ("at_us", "from_state", "to_state", "stage", "kind",
                                                            "targets", "valid_after_us", "cause"),
                                    key="seq", after=after)]

    # --- judging ----------------------------------------------------------------------------------

    def verdicts(self, after: int = 0) -> list[VerdictRow]:
        """Verdicts as written (by id)."""
        return [_verdict(r) for r in self._rows("rollout_verdicts", _VERDICT_COLUMNS, after=after)]

    def looks(self) -> list[VerdictRow]:
        """Every verdict in the order of the looks: by the end of the window looked at, then as written."""
        return [_verdict(r) for r in self._rows("rollout_verdicts", _VERDICT_COLUMNS, order="window_end_us, id")]

    def latest_verdicts(self) -> dict[str, VerdictRow]:
        """Each criterion's verdict at its latest look, criteria in the order they were first judged."""
        latest: dict[str, VerdictRow] = {}
        for v in self.looks():
            latest[v.criterion] = v
        return latest

    def metric_batches(self, after: int = 0) -> list[BatchInfoRow]:
        """Metric batches without their samples (``batch_values`` reads those)."""
        return [BatchInfoRow(r["_key"], r["source"] or "", r["metric"] or "", from_us(r["window_us"]), r["phase"] or "",
                             r["n"] or 0, bool(r["missing"]), r["origin"] or "", r["excluded"] or 0,
                             str(r["problem"] or ""))
                for r in self._rows("rollout_metric_batches", ("source", "metric", "window_us", "phase", "n", "missing",
                                                               "origin", "excluded", "problem"), after=after)]

    def metric_phases(self) -> list[tuple[str, str]]:
        """Each (metric, phase) that has batches."""
        if not self.columns("rollout_metric_batches"):
            return []
        return [(m, p) for m, p in self.conn.execute("SELECT DISTINCT metric, phase FROM rollout_metric_batches")]

    def batch_values(self, metric: str, phase: str) -> np.ndarray:
        """The samples of ``metric`` judged in ``phase``, window after window."""
        rows = self.conn.execute("SELECT payload FROM rollout_metric_batches WHERE metric = ? AND phase = ? "
                                 "AND missing = 0 ORDER BY window_us", (metric, phase)).fetchall()
        if not rows:
            return np.zeros(0)
        return np.concatenate([np.frombuffer(r[0], dtype="<f8") for r in rows])

    def source_health(self, after: int = 0) -> list[SourceHealthRow]:
        return [SourceHealthRow(from_us(r["window_us"]), r["source"] or "", r["instance"] or "", bool(r["ok"]),
                                r["n_samples"] or 0, str(r["problem"] or ""), r["_key"])
                for r in self._rows("rollout_source_health", ("window_us", "source", "instance", "ok", "n_samples",
                                                              "problem"), after=after)]

    def gaps_by_source(self) -> dict[str, int]:
        """Per source, the collection windows that delivered nothing plus its failed instance polls."""
        gaps: dict[str, int] = {}
        if {"source", "missing", "n"} <= set(self.columns("rollout_metric_batches")):
            for source, n in self.conn.execute("SELECT source, COUNT(*) FROM rollout_metric_batches "
                                               "WHERE missing != 0 OR n = 0 GROUP BY source"):
                gaps[source] = gaps.get(source, 0) + n
        if {"source", "ok"} <= set(self.columns("rollout_source_health")):
            for source, n in self.conn.execute("SELECT source, COUNT(*) FROM rollout_source_health WHERE ok = 0 "
                                               "GROUP BY source"):
                gaps[source] = gaps.get(source, 0) + n
        return gaps

    def exposures(self, after: int = 0, *, order: str = "") -> list[ExposureRow]:
        return [ExposureRow(from_us(r["at_us"]), r["stage"] or 0, r["population"] or "", r["expected_share"],
                            r["observed_share"], r["n_nodes"] or 0, r["n_on_target"] or 0, r["n_pinned"] or 0,
                            r["n_unknown"] or 0, bool(r["short"]), str(r["detail"] or ""), r["_key"])
                for r in self._rows("rollout_exposure", ("at_us", "stage", "population", "expected_share",
                                                         "observed_share", "n_nodes", "n_on_target", "n_pinned",
                                                         "n_unknown", "short", "detail"), after=after, order=order)]

    def latest_exposure(self) -> dict[str, ExposureRow]:
        """Each population's latest exposure row."""
        return {e.population: e for e in self.exposures(order="at_us, id")}

    # --- intents, commands, runs (small tables whose rows change state: read whole) ---------------

    def intents(self) -> list[IntentRow]:
        return [IntentRow(r["_key"], r["idem_key"] or "", r["transition_seq"], r["authority"], _pairs(r["desired"]),
                          from_us(r["valid_after_us"]), r["state"], r["attempts"] or 0, r["error"] or "",
                          r["evidence"] or "", from_us(r["intended_us"]), _time(r["acted_us"]),
                          _time(r["verified_us"]), _time(r["done_us"]))
                for r in self._rows("rollout_intents", ("idem_key", "transition_seq", "authority", "desired",
                                                        "valid_after_us", "state", "attempts", "error", "evidence",
                                                        "intended_us", "acted_us", "verified_us", "done_us"))]

    def intent_counts(self) -> dict[str, int]:
        """Intents by state (states without one are absent)."""
        if not self.columns("rollout_intents"):
            return {}
        return dict(self.conn.execute("SELECT state, COUNT(*) FROM rollout_intents GROUP BY state"))

    def commands(self) -> list[CommandRow]:
        return [CommandRow(r["_key"], r["kind"], _pairs(r["args"]), r["user"] or "", from_us(r["queued_us"]),
                           r["state"], r["result"] or "")
                for r in self._rows("rollout_commands", ("kind", "args", "user", "queued_us", "state", "result"))]

    def runs(self) -> list[RunRow]:
        out = []
        for r in self._rows("rollout_runs", ("pid", "host", "start_us", "end_us", "reason", "argv")):
            argv = loads(r["argv"], [])
            out.append(RunRow(r["_key"], r["pid"], r["host"], from_us(r["start_us"]), _time(r["end_us"]),
                              r["reason"] or "", tuple(str(a) for a in argv) if isinstance(argv, list) else ()))
        return out

    def open_runs(self) -> int:
        """Runs whose row is still open: running, or killed before they could close it."""
        if not self.columns("rollout_runs"):
            return 0
        return self.conn.execute("SELECT COUNT(*) FROM rollout_runs WHERE end_us IS NULL").fetchone()[0]

    def owner(self) -> OwnerRow | None:
        row = self.conn.execute("SELECT pid, host, since_us, heartbeat_us FROM rollout_owner WHERE id = 1").fetchone()
        return None if row is None else OwnerRow(row[0], row[1], from_us(row[2]), from_us(row[3]))

    # --- what the authorities served ----------------------------------------------------------------

    def votes_seen(self, after: int = 0) -> list[VoteSeenRow]:
        return [VoteSeenRow(r["_key"], r["authority"], from_us(r["valid_after_us"]), _params(r["params"]),
                            r["digest"] or "")
                for r in self._rows("rollout_votes_seen", ("authority", "valid_after_us", "params", "digest"),
                                    key="rowid", after=after)]

    def vote_authorities(self) -> tuple[str, ...]:
        """Every authority a vote was asked of, by name."""
        if not self.columns("rollout_votes_seen"):
            return ()
        return tuple(r[0] for r in self.conn.execute("SELECT DISTINCT authority FROM rollout_votes_seen "
                                                     "ORDER BY authority"))

    def consensus_seen(self, after: int = 0) -> list[ConsensusSeenRow]:
        out = []
        for r in self._rows("rollout_consensus_seen", ("valid_after_us", "flavour", "params", "signers"),
                            key="rowid", after=after):
            signers = loads(r["signers"], [])
            out.append(ConsensusSeenRow(r["_key"], from_us(r["valid_after_us"]), r["flavour"] or "",
                                        _params(r["params"]),
                                        tuple(str(s) for s in signers) if isinstance(signers, list) else ()))
        return out

    def authority_health(self, after: int = 0) -> list[AuthorityHealthRow]:
        """The engine's own word on each authority's round (newer schemas)."""
        return [AuthorityHealthRow(from_us(r["valid_after_us"]), r["authority"], bool(r["voted"]), bool(r["signed"]),
                                   str(r["state"] or ""), r["_key"])
                for r in self._rows("rollout_authority_health", ("valid_after_us", "authority", "voted", "signed",
                                                                 "state"), key="rowid", after=after)]

    def round_health(self, authorities: Sequence[str]) -> tuple[RoundHealth, ...]:
        """Each round's votes and consensus signers (``kistexp.rollout.journal.round_health``)."""
        return round_health(self.conn, tuple(authorities))
