"""The metric store: catalogue-named series of samples, predictions and the consensus
parameter history, all in the experiment database (schema: kistexp/store/schema.py).

Windows are half-open, ``t0 <= time < t1``, and may also be restricted to the samples
taken while a given consensus value was in effect for the measured relay or client.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

import attrs

from kistexp.errors import KistexpError
from kistexp.metrics import catalogue
from kistexp.metrics.series import AttackValue, Prediction, PredictionRun, Sample, from_us, to_us

_EPOCH_SAMPLE_TIME = from_us(0)
# Series named one by one in a window query; beyond this, the query joins on the metric.
_MAX_IN = 500
# Rows per executemany batch: bounds memory when a collector streams millions of samples.
_BATCH = 5_000


class UnknownMetricError(KistexpError):
    """A metric name that is not in kistexp/metrics/catalogue.py."""


def require_metric(name: str) -> catalogue.Metric:
    metric = catalogue.get(name)
    if metric is None:
        raise UnknownMetricError(
            f"unknown metric {name!r}; known metrics: {', '.join(catalogue.names())}")
    return metric


def _labels_key(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"), ensure_ascii=False)


@attrs.frozen
class SeriesInfo:
    metric: str
    labels: Mapping[str, str] = attrs.field(hash=False)
    n_samples: int
    first: dt.datetime | None
    last: dt.datetime | None


@attrs.frozen
class MetricSummary:
    metric: str
    unit: str
    n_series: int
    n_samples: int
    first: dt.datetime | None
    last: dt.datetime | None
    param_values: tuple[int, ...]  # distinct known consensus values among the samples


@attrs.frozen
class SourceRecord:
    id: int
    kind: str
    location: str
    sha256: str | None
    imported: dt.datetime
    n_samples: int
    n_rejected: int
    problems: tuple[str, ...]


@attrs.frozen
class ConsensusRecord:
    """One consensus of an archive and its params line."""

    valid_after: dt.datetime
    flavour: str  # "ns" or "microdesc"
    digest: str
    n_relays: int
    n_signatures: int
    n_valid: int  # signatures that verified against a known authority certificate
    verified: bool  # enough valid signatures from trusted authorities
    location: str
    params: Mapping[str, int] = attrs.field(hash=False)


@attrs.frozen
class VoteRecord:
    """One authority's vote: what it asked for in its params line."""

    valid_after: dt.datetime
    authority: str  # v3 identity fingerprint
    nickname: str
    digest: str
    verified: bool
    location: str
    params: Mapping[str, int] = attrs.field(hash=False)


class MetricStore:
    """Samples and predictions of one experiment, on an open experiment database."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._series_ids: dict[tuple, int] = {}

    # --- samples --------------------------------------------------------------------

    def _series_id(self, metric: str, labels: Mapping[str, str]) -> int:
        # Sample labels are sorted already; the JSON text is only built for a new series.
        cache_key = (metric, tuple(labels.items()))
        sid = self._series_ids.get(cache_key)
        if sid is None:
            key = (metric, _labels_key(labels))
            self.conn.execute("INSERT OR IGNORE INTO series (metric, labels) VALUES (?, ?)", key)
            sid = self.conn.execute("SELECT id FROM series WHERE metric = ? AND labels = ?", key).fetchone()[0]
            self._series_ids[cache_key] = sid
        return sid

    def add_samples(self, metric: str, samples: Iterable[Sample], *, source_id: int | None = None) -> int:
        """Store samples of one catalogue metric; returns how many were written.

        Atomic: on error nothing of this call is kept. Samples are appended; to make
        re-importing a file replace its samples, pass the ``source_id`` from
        ``record_source`` (which drops what an earlier import of the same content added).
        """
        require_metric(metric)
        sql = "INSERT INTO samples (series_id, t_us, value, param_value, source_id) VALUES (?, ?, ?, ?, ?)"
        try:
            with self.conn:
                n = self._insert(sql, samples, metric, source_id)
        except BaseException:
            # the rolled-back transaction may have taken new series rows with it
            self._series_ids.clear()
            raise
        return n

    def _insert(self, sql: str, samples: Iterable[Sample], metric: str, source_id: int | None) -> int:
        n = 0
        batch: list[tuple] = []
        for s in samples:
            if not isinstance(s, Sample):
                raise TypeError(f"expected a Sample, got {type(s).__name__}")
            batch.append((self._series_id(metric, s.labels), to_us(s.time), s.value, s.param_value, source_id))
            if len(batch) >= _BATCH:
                self.conn.executemany(sql, batch)
                n += len(batch)
                batch.clear()
        if batch:
            self.conn.executemany(sql, batch)
            n += len(batch)
        return n

    def select(self, metric: str, t0: dt.datetime | None = None, t1: dt.datetime | None = None,
               labels: Mapping[str, str] | None = None, param_value: int | None = None) -> list[Sample]:
        """Samples of ``metric`` with ``t0 <= time < t1`` (None = unbounded), whose labels
        include all of ``labels``, and, if ``param_value`` is given, taken while that
        consensus value was in effect (samples of unknown value are then left out).
        Ordered by time."""
        require_metric(metric)
        want = dict(labels or {})
        series = {}
        for sid, text in self.conn.execute("SELECT id, labels FROM series WHERE metric = ?", (metric,)):
            lab = json.loads(text)
            if all(lab.get(k) == v for k, v in want.items()):
                series[sid] = Sample(_EPOCH_SAMPLE_TIME, 0.0, lab).labels  # validated once per series
        if not series:
            return []
        # A few series: name them (each uses the (series_id, t_us) index). Many (one per
        # relay): join on the metric instead of binding thousands of parameters.
        if len(series) <= _MAX_IN:
            where = [f"x.series_id IN ({','.join('?' * len(series))})"]
            args: list = list(series)
        else:
            where = ["s.metric = ?"]
            args = [metric]
        if t0 is not None:
            where.append("x.t_us >= ?")
            args.append(to_us(t0))
        if t1 is not None:
            where.append("x.t_us < ?")
            args.append(to_us(t1))
        if param_value is not None:
            where.append("x.param_value = ?")
            args.append(int(param_value))
        rows = self.conn.execute(
            "SELECT x.series_id, x.t_us, x.value, x.param_value FROM samples x JOIN series s ON s.id = x.series_id "
            f"WHERE {' AND '.join(where)} ORDER BY x.t_us, x.series_id", args)
        return [Sample(from_us(t), v, series[sid], pv) for sid, t, v, pv in rows if sid in series]

    def values(self, metric: str, t0: dt.datetime | None = None, t1: dt.datetime | None = None,
               labels: Mapping[str, str] | None = None, param_value: int | None = None) -> list[float]:
        """Just the values of ``select`` (what a judge criterion compares)."""
        return [s.value for s in self.select(metric, t0, t1, labels, param_value)]

    def series(self, metric: str | None = None) -> list[SeriesInfo]:
        """Every stored series (of one metric, or all) with its sample count and span."""
        sql = ("SELECT s.metric, s.labels, COUNT(x.t_us), MIN(x.t_us), MAX(x.t_us) FROM series s "
               "LEFT JOIN samples x ON x.series_id = s.id")
        args: tuple = ()
        if metric is not None:
            require_metric(metric)
            sql += " WHERE s.metric = ?"
            args = (metric,)
        sql += " GROUP BY s.id ORDER BY s.metric, s.labels"
        return [SeriesInfo(m, json.loads(lab), n, _opt_time(a), _opt_time(b))
                for m, lab, n, a, b in self.conn.execute(sql, args)]

    def summary(self) -> list[MetricSummary]:
        """One line per catalogue metric that has samples."""
        out = []
        rows = self.conn.execute(
            "SELECT s.metric, COUNT(DISTINCT s.id), COUNT(x.t_us), MIN(x.t_us), MAX(x.t_us) FROM series s "
            "JOIN samples x ON x.series_id = s.id GROUP BY s.metric ORDER BY s.metric").fetchall()
        for metric, n_series, n, a, b in rows:
            pvs = tuple(r[0] for r in self.conn.execute(
                "SELECT DISTINCT x.param_value FROM samples x JOIN series s ON x.series_id = s.id "
                "WHERE s.metric = ? AND x.param_value IS NOT NULL ORDER BY 1", (metric,)))
            unit = catalogue.get(metric).unit if catalogue.get(metric) else "?"
            out.append(MetricSummary(metric, unit, n_series, n, _opt_time(a), _opt_time(b), pvs))
        return out

    # --- sources --------------------------------------------------------------------

    def record_source(self, kind: str, location: str, sha256: str | None = None, *, n_samples: int = 0,
                      n_rejected: int = 0, problems: Sequence[str] = (), now: dt.datetime | None = None) -> int:
        """Note an imported source; returns its id (to pass to add_samples).

        If a source of the same kind with the same ``sha256`` was imported before, it and
        its samples are removed first: importing a file twice does not double its samples.
        """
        t = now or dt.datetime.now(dt.timezone.utc)
        with self.conn:
            if sha256:
                self.conn.execute("DELETE FROM sources WHERE kind = ? AND sha256 = ?", (kind, sha256))
            cur = self.conn.execute(
                "INSERT INTO sources (kind, location, sha256, imported_us, n_samples, n_rejected, problems) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (kind, location, sha256, to_us(t), n_samples, n_rejected, json.dumps(list(problems))))
        return int(cur.lastrowid)

    def update_source(self, source_id: int, *, n_samples: int, n_rejected: int, problems: Sequence[str]) -> None:
        with self.conn:
            self.conn.execute("UPDATE sources SET n_samples = ?, n_rejected = ?, problems = ? WHERE id = ?",
                              (n_samples, n_rejected, json.dumps(list(problems)), source_id))

    def sources(self) -> list[SourceRecord]:
        return [SourceRecord(i, k, loc, sha, from_us(t), n, r, tuple(json.loads(p)))
                for i, k, loc, sha, t, n, r, p in self.conn.execute(
                    "SELECT id, kind, location, sha256, imported_us, n_samples, n_rejected, problems "
                    "FROM sources ORDER BY id")]

    # --- predictions ----------------------------------------------------------------

    def save_predictions(self, records: Iterable[Prediction]) -> int:
        """Store predicted quantiles; a row with the same (stage, metric, relay_class,
        network, quantile) replaces the stored one. Returns the number written."""
        rows = []
        for p in records:
            if not isinstance(p, Prediction):
                raise TypeError(f"expected a Prediction, got {type(p).__name__}")
            rows.append((p.stage, p.metric, p.relay_class, p.network, p.quantile, p.value))
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO predictions (stage, metric, relay_class, network, quantile, value) "
                "VALUES (?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def load_predictions(self, stage: str | None = None, metric: str | None = None) -> list[Prediction]:
        """Stored predictions, optionally of one stage and/or metric, ordered by stage,
        metric, relay class, network and quantile."""
        where, args = [], []
        if stage is not None:
            where.append("stage = ?")
            args.append(stage)
        if metric is not None:
            require_metric(metric)
            where.append("metric = ?")
            args.append(metric)
        sql = "SELECT stage, metric, relay_class, network, quantile, value FROM predictions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY stage, metric, relay_class, network, quantile"
        return [Prediction(*row) for row in self.conn.execute(sql, args)]

    def save_attack_values(self, records: Iterable[AttackValue]) -> int:
        """Store attack measures per stage and network (``kistexp.anonymity``); a row with the same
        (stage, measure, network) replaces the stored one. Returns the number written."""
        rows = []
        for a in records:
            if not isinstance(a, AttackValue):
                raise TypeError(f"expected an AttackValue, got {type(a).__name__}")
            rows.append((a.stage, a.measure, a.network, a.value))
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO attack_measures (stage, measure, network, value) VALUES (?, ?, ?, ?)", rows)
        return len(rows)

    def load_attack_values(self, stage: str | None = None) -> list[AttackValue]:
        """Stored attack measures, optionally of one stage, ordered by stage, measure and network."""
        sql = "SELECT stage, measure, network, value FROM attack_measures"
        args: list[str] = []
        if stage is not None:
            sql += " WHERE stage = ?"
            args.append(stage)
        sql += " ORDER BY stage, measure, network"
        return [AttackValue(*row) for row in self.conn.execute(sql, args)]

    def save_prediction_run(self, run: PredictionRun) -> None:
        """Record how the predictions just saved were made (the reports label fast-mode ones)."""
        with self.conn:
            self.conn.execute(
                "INSERT INTO prediction_runs (made_us, rates, population_scale, relays, nic_scale_min, nic_scale_max,"
                " duration_s, wall_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (to_us(run.made), run.rates, run.population_scale, " ".join(map(str, run.relays)),
                 run.nic_scale_min, run.nic_scale_max, run.duration_s, run.wall_s))

    def load_prediction_runs(self) -> list[PredictionRun]:
        """Every recorded prediction run, oldest first (the last made the predictions stored now)."""
        rows = self.conn.execute("SELECT made_us, rates, population_scale, relays, nic_scale_min, nic_scale_max, "
                                 "duration_s, wall_s FROM prediction_runs ORDER BY id").fetchall()
        return [PredictionRun(from_us(r[0]), r[1], r[2], tuple(int(x) for x in r[3].split()), r[4], r[5], r[6], r[7])
                for r in rows]

    # --- consensus parameter history --------------------------------------------------

    def save_consensus(self, rec: ConsensusRecord) -> None:
        va = to_us(rec.valid_after)
        with self.conn:
            self.conn.execute("DELETE FROM consensuses WHERE valid_after_us = ? AND flavour = ?", (va, rec.flavour))
            self.conn.execute(
                "INSERT INTO consensuses (valid_after_us, flavour, digest, n_relays, n_signatures, n_valid, verified,"
                " location) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (va, rec.flavour, rec.digest, rec.n_relays, rec.n_signatures, rec.n_valid, int(rec.verified),
                 rec.location))
            self.conn.executemany(
                "INSERT INTO consensus_params (valid_after_us, flavour, name, value) VALUES (?, ?, ?, ?)",
                [(va, rec.flavour, k, int(v)) for k, v in sorted(rec.params.items())])

    def save_vote(self, rec: VoteRecord) -> None:
        va = to_us(rec.valid_after)
        with self.conn:
            self.conn.execute("DELETE FROM votes WHERE valid_after_us = ? AND authority = ?", (va, rec.authority))
            self.conn.execute(
                "INSERT INTO votes (valid_after_us, authority, nickname, digest, verified, location) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (va, rec.authority, rec.nickname, rec.digest, int(rec.verified), rec.location))
            self.conn.executemany(
                "INSERT INTO vote_params (valid_after_us, authority, name, value) VALUES (?, ?, ?, ?)",
                [(va, rec.authority, k, int(v)) for k, v in sorted(rec.params.items())])

    def consensuses(self, flavour: str | None = None) -> list[ConsensusRecord]:
        """Stored consensuses in valid-after order, with their params."""
        sql = ("SELECT valid_after_us, flavour, digest, n_relays, n_signatures, n_valid, verified, location "
               "FROM consensuses")
        args: tuple = ()
        if flavour is not None:
            sql += " WHERE flavour = ?"
            args = (flavour,)
        out = []
        for va, fl, digest, n_relays, n_sig, n_valid, verified, loc in self.conn.execute(
                sql + " ORDER BY valid_after_us, flavour", args).fetchall():
            params = dict(self.conn.execute(
                "SELECT name, value FROM consensus_params WHERE valid_after_us = ? AND flavour = ? ORDER BY name",
                (va, fl)).fetchall())
            out.append(ConsensusRecord(from_us(va), fl, digest, n_relays, n_sig, n_valid, bool(verified), loc,
                                       params))
        return out

    def votes(self, valid_after: dt.datetime | None = None) -> list[VoteRecord]:
        sql = "SELECT valid_after_us, authority, nickname, digest, verified, location FROM votes"
        args: tuple = ()
        if valid_after is not None:
            sql += " WHERE valid_after_us = ?"
            args = (to_us(valid_after),)
        out = []
        for va, auth, nick, digest, verified, loc in self.conn.execute(
                sql + " ORDER BY valid_after_us, nickname", args).fetchall():
            params = dict(self.conn.execute(
                "SELECT name, value FROM vote_params WHERE valid_after_us = ? AND authority = ? ORDER BY name",
                (va, auth)).fetchall())
            out.append(VoteRecord(from_us(va), auth, nick, digest, bool(verified), loc, params))
        return out


def _opt_time(us: int | None) -> dt.datetime | None:
    return None if us is None else from_us(us)
