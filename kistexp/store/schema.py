"""THE schema of an experiment's SQLite database (``experiment.db``).

Every table of the experiment lives in this one module: metric series and samples,
simulator predictions, imported sources, consensus parameter history and, later, the
rollout journal. ``MIGRATIONS`` is append-only: migration *i* (1-based) brings a
database from ``PRAGMA user_version`` *i-1* to *i*; never edit a released migration,
add a new one instead. A database whose user_version is higher than ``len(MIGRATIONS)``
was written by a newer kistexp and is refused rather than misread.

Times are stored as integer microseconds since the Unix epoch, UTC, so that windows
compare as integers and no timezone text is ever parsed back.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from pathlib import Path

from kistexp.errors import KistexpError


class StoreError(KistexpError):
    """The experiment directory or its database cannot be used (corrupt, newer, unwritable)."""


_SQLITE_MAGIC = b"SQLite format 3\x00"
# Writers (an import beside an hourly judge run) wait this long for a lock instead of failing.
BUSY_TIMEOUT_MS = 10_000

_V1 = """
-- One named series: a catalogue metric plus its labels (canonical JSON, sorted keys).
CREATE TABLE series (
    id      INTEGER PRIMARY KEY,
    metric  TEXT NOT NULL,
    labels  TEXT NOT NULL,
    UNIQUE (metric, labels)
);
CREATE INDEX series_metric ON series (metric);

-- One measurement. param_value: the consensus value in effect for the measured relay or
-- client when it was taken (NULL = unknown), so propagation-time samples are not counted
-- for the wrong value. No uniqueness on time: tor's controller logs circuits at 10 ms
-- resolution, so distinct measurements share timestamps; re-importing a source replaces
-- its samples through source_id instead.
CREATE TABLE samples (
    id           INTEGER PRIMARY KEY,
    series_id    INTEGER NOT NULL REFERENCES series (id) ON DELETE CASCADE,
    t_us         INTEGER NOT NULL,
    value        REAL NOT NULL,
    param_value  INTEGER,
    source_id    INTEGER REFERENCES sources (id) ON DELETE CASCADE
);
CREATE INDEX samples_series_time ON samples (series_id, t_us);
CREATE INDEX samples_source ON samples (source_id);

-- What was imported, from where, and what was wrong with it.
CREATE TABLE sources (
    id           INTEGER PRIMARY KEY,
    kind         TEXT NOT NULL,
    location     TEXT NOT NULL,
    sha256       TEXT,
    imported_us  INTEGER NOT NULL,
    n_samples    INTEGER NOT NULL DEFAULT 0,
    n_rejected   INTEGER NOT NULL DEFAULT 0,
    problems     TEXT NOT NULL DEFAULT '[]'
);

-- The simulator's predicted distribution of a metric: one row per quantile level.
-- stage: "baseline", a stage name or "transition:<stage>"; relay_class "" for clients;
-- network: index of the independently sampled network.
CREATE TABLE predictions (
    stage        TEXT NOT NULL,
    metric       TEXT NOT NULL,
    relay_class  TEXT NOT NULL DEFAULT '',
    network      INTEGER NOT NULL,
    quantile     REAL NOT NULL CHECK (quantile >= 0.0 AND quantile <= 1.0),
    value        REAL NOT NULL,
    PRIMARY KEY (stage, metric, relay_class, network, quantile)
);

-- Consensus documents seen in an archive: one row per (valid-after, flavour).
CREATE TABLE consensuses (
    valid_after_us  INTEGER NOT NULL,
    flavour         TEXT NOT NULL,
    digest          TEXT NOT NULL,
    n_relays        INTEGER NOT NULL,
    n_signatures    INTEGER NOT NULL,
    n_valid         INTEGER NOT NULL,
    verified        INTEGER NOT NULL,
    location        TEXT NOT NULL,
    PRIMARY KEY (valid_after_us, flavour)
);

-- The params line of each consensus (absent key = tor's default, not stored).
CREATE TABLE consensus_params (
    valid_after_us  INTEGER NOT NULL,
    flavour         TEXT NOT NULL,
    name            TEXT NOT NULL,
    value           INTEGER NOT NULL,
    PRIMARY KEY (valid_after_us, flavour, name),
    FOREIGN KEY (valid_after_us, flavour) REFERENCES consensuses (valid_after_us, flavour) ON DELETE CASCADE
);

-- What each authority voted: one row per (vote, parameter); a vote with no params line
-- still gets a row in votes.
CREATE TABLE votes (
    valid_after_us  INTEGER NOT NULL,
    authority       TEXT NOT NULL,      -- v3 identity fingerprint, uppercase hex
    nickname        TEXT NOT NULL,
    digest          TEXT NOT NULL,
    verified        INTEGER NOT NULL,
    location        TEXT NOT NULL,
    PRIMARY KEY (valid_after_us, authority)
);
CREATE TABLE vote_params (
    valid_after_us  INTEGER NOT NULL,
    authority       TEXT NOT NULL,
    name            TEXT NOT NULL,
    value           INTEGER NOT NULL,
    PRIMARY KEY (valid_after_us, authority, name),
    FOREIGN KEY (valid_after_us, authority) REFERENCES votes (valid_after_us, authority) ON DELETE CASCADE
);
"""

# The rollout journal (rollout.md §3.5): intents before effects, evidence after, and every
# processed event, metric batch, verdict, decision and command. Status is the last
# status_log row; nothing about the run lives outside these tables.
_V2_ROLLOUT_JOURNAL = """
CREATE TABLE rollout_meta (
    key    TEXT PRIMARY KEY,   -- experiment_id, plan_path, plan_sha256, plan_canon_sha256, mode, spec
    value  TEXT NOT NULL
);
CREATE TABLE rollout_runs (
    id        INTEGER PRIMARY KEY,
    pid       INTEGER NOT NULL,
    host      TEXT NOT NULL,
    argv      TEXT NOT NULL,
    start_us  INTEGER NOT NULL,
    end_us    INTEGER,
    reason    TEXT
);
-- Who holds the run lock, for the refusal message only (the lock itself is flock on run.lock).
CREATE TABLE rollout_owner (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    pid           INTEGER NOT NULL,
    host          TEXT NOT NULL,
    since_us      INTEGER NOT NULL,
    heartbeat_us  INTEGER NOT NULL
);
CREATE TABLE rollout_events (
    id            INTEGER PRIMARY KEY,
    event_key     TEXT NOT NULL UNIQUE,   -- trigger:stage:iso-time
    trigger       TEXT NOT NULL,
    due_us        INTEGER NOT NULL,
    processed_us  INTEGER NOT NULL,
    lateness_s    REAL NOT NULL DEFAULT 0
);
CREATE TABLE rollout_status (
    id         INTEGER PRIMARY KEY,
    event_key  TEXT NOT NULL,
    at_us      INTEGER NOT NULL,
    state      TEXT NOT NULL,
    status     TEXT NOT NULL             -- the Status value as JSON
);
CREATE TABLE rollout_transitions (
    seq          INTEGER PRIMARY KEY,
    at_us        INTEGER NOT NULL,
    from_state   TEXT NOT NULL,
    to_state     TEXT NOT NULL,
    stage        INTEGER NOT NULL,
    kind         TEXT NOT NULL,          -- stage | rollback | reassert | retry | undo
    targets      TEXT NOT NULL,          -- JSON {param: value | "unset"}
    valid_after_us INTEGER NOT NULL,
    cause        TEXT NOT NULL
);
CREATE TABLE rollout_intents (
    id              INTEGER PRIMARY KEY,
    idem_key        TEXT NOT NULL UNIQUE,  -- experiment:seq:authority:T:sha(desired)
    transition_seq  INTEGER NOT NULL REFERENCES rollout_transitions (seq),
    authority       TEXT NOT NULL,
    desired         TEXT NOT NULL,         -- the full ConsensusParams set, JSON
    valid_after_us  INTEGER NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('intended', 'acted', 'verified', 'done', 'superseded', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    error           TEXT NOT NULL DEFAULT '',
    evidence        TEXT NOT NULL DEFAULT '',
    intended_us     INTEGER NOT NULL,
    acted_us        INTEGER,
    verified_us     INTEGER,
    done_us         INTEGER
);
CREATE INDEX rollout_intents_state ON rollout_intents (state);
CREATE TABLE rollout_decisions (
    id         INTEGER PRIMARY KEY,
    event_key  TEXT NOT NULL,
    at_us      INTEGER NOT NULL,
    decision   TEXT NOT NULL,
    stage      INTEGER NOT NULL,
    valid_after_us INTEGER,
    message    TEXT NOT NULL
);
CREATE TABLE rollout_commands (
    id         INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    args       TEXT NOT NULL,            -- JSON
    user       TEXT NOT NULL,
    queued_us  INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('queued', 'applied', 'refused')),
    result     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE rollout_metric_batches (
    id           INTEGER PRIMARY KEY,
    source       TEXT NOT NULL,
    metric       TEXT NOT NULL,
    window_us    INTEGER NOT NULL,       -- window start; windows are one plan hour
    phase        TEXT NOT NULL,          -- baseline | stage:<i>:<valid-after> | excluded
    n            INTEGER NOT NULL,
    missing      INTEGER NOT NULL DEFAULT 0,
    summary      TEXT NOT NULL,          -- JSON: mean, median, min, max
    payload      BLOB,                   -- float64 little-endian sample values
    sha256       TEXT NOT NULL,
    UNIQUE (source, metric, window_us)
);
CREATE TABLE rollout_verdicts (
    id          INTEGER PRIMARY KEY,
    criterion   TEXT NOT NULL,
    window_end_us INTEGER NOT NULL,
    stage       INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    effect      REAL,
    ci_low      REAL,
    ci_high     REAL,
    n_baseline  INTEGER NOT NULL,
    n_stage     INTEGER NOT NULL,
    shadow      INTEGER NOT NULL,
    detail      TEXT NOT NULL,
    UNIQUE (criterion, window_end_us)
);
CREATE TABLE rollout_votes_seen (
    authority       TEXT NOT NULL,
    valid_after_us  INTEGER NOT NULL,
    params          TEXT NOT NULL,       -- JSON, null when no vote was served
    digest          TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (authority, valid_after_us)
);
CREATE TABLE rollout_consensus_seen (
    valid_after_us  INTEGER NOT NULL,
    flavour         TEXT NOT NULL,
    params          TEXT NOT NULL,       -- JSON, null when no consensus was published
    signers         TEXT NOT NULL,       -- JSON list
    PRIMARY KEY (valid_after_us, flavour)
);
CREATE TABLE rollout_plan_acks (
    id              INTEGER PRIMARY KEY,
    old_sha256      TEXT NOT NULL,
    new_sha256      TEXT NOT NULL,
    diff            TEXT NOT NULL,
    who             TEXT NOT NULL,
    at_us           INTEGER NOT NULL
);
"""

# The engine judges criteria with kistexp.judge: each criterion's sequential test lives on
# across looks and restarts (rollout_sequential), each verdict keeps the judge's whole record,
# and metric batches may carry the relay each sample came from (per-relay paired comparisons).
_V3_SEQUENTIAL_JUDGE = """
CREATE TABLE rollout_sequential (
    criterion   TEXT NOT NULL,
    phase       TEXT NOT NULL,           -- stage:<i>:<valid-after>: one sequential test per stage entry
    state       TEXT NOT NULL,           -- JSON of kistexp.judge.SequentialState after the latest look
    looks       INTEGER NOT NULL,
    updated_us  INTEGER NOT NULL,
    PRIMARY KEY (criterion, phase)
);
ALTER TABLE rollout_verdicts ADD COLUMN phase TEXT NOT NULL DEFAULT '';
ALTER TABLE rollout_verdicts ADD COLUMN reason TEXT NOT NULL DEFAULT '';
ALTER TABLE rollout_verdicts ADD COLUMN rule TEXT NOT NULL DEFAULT '';
ALTER TABLE rollout_verdicts ADD COLUMN record TEXT NOT NULL DEFAULT '{}';  -- kistexp.judge Verdict.to_dict()
ALTER TABLE rollout_metric_batches ADD COLUMN relays TEXT;  -- JSON [[relay, n], ...] in payload order, or NULL
"""

# Live runs judge measured metrics (issue 32): each batch says where its samples came from and how
# many were left out because their node was mid-switch between consensuses; each poll of each
# measuring instance is a health row (a failing one is a metric gap for that instance); each look
# records the stage's exposure (who runs the stage's values) and each round the authorities' health.
_V4_MEASURED = """
ALTER TABLE rollout_metric_batches ADD COLUMN origin TEXT NOT NULL DEFAULT '';  -- predicted|recorded|measured
ALTER TABLE rollout_metric_batches ADD COLUMN excluded INTEGER NOT NULL DEFAULT 0;  -- mid-switch samples left out
CREATE TABLE rollout_source_health (
    id          INTEGER PRIMARY KEY,
    window_us   INTEGER NOT NULL,        -- the collection window's start
    source      TEXT NOT NULL,           -- collector kind (onionperf, metricsport, proc, ...)
    instance    TEXT NOT NULL,           -- the measuring instance (vantage point, relay)
    ok          INTEGER NOT NULL,
    n_samples   INTEGER NOT NULL,
    problem     TEXT NOT NULL DEFAULT '',
    at_us       INTEGER NOT NULL,
    UNIQUE (source, instance, window_us)
);
CREATE TABLE rollout_exposure (
    id             INTEGER PRIMARY KEY,
    at_us          INTEGER NOT NULL,
    stage          INTEGER NOT NULL,
    population     TEXT NOT NULL,        -- relays | clients
    expected_share REAL NOT NULL,        -- what propagation predicts at this instant
    observed_share REAL,                 -- NULL when no node could be asked
    n_nodes        INTEGER NOT NULL,
    n_on_target    INTEGER NOT NULL,
    n_pinned       INTEGER NOT NULL,     -- relays whose torrc pins the value: counted apart
    n_unknown      INTEGER NOT NULL,
    short          INTEGER NOT NULL,     -- 1 when exposure falls short of the prediction
    detail         TEXT NOT NULL DEFAULT '',
    UNIQUE (at_us, population)
);
CREATE TABLE rollout_authority_health (
    valid_after_us INTEGER NOT NULL,
    authority      TEXT NOT NULL,
    voted          INTEGER NOT NULL,     -- a vote for this valid-after was served
    signed         INTEGER NOT NULL,     -- its signature is on the consensus of this valid-after
    state          TEXT NOT NULL,        -- ok | down | stale | not-signing
    PRIMARY KEY (valid_after_us, authority)
);
"""

_V5_ATTACK_MEASURES = """
-- What a traffic-analysis attack achieves on a simulated stage (kistexp.anonymity, docs/anonymity.md):
-- one value per stage, measure (kistexp.metrics.catalogue.ATTACK_MEASURES) and sampled network.
-- stage: "baseline" or a stage name; network: as in predictions (the same sampled networks).
CREATE TABLE attack_measures (
    stage        TEXT NOT NULL,
    measure      TEXT NOT NULL,
    network      INTEGER NOT NULL,
    value        REAL NOT NULL,
    PRIMARY KEY (stage, measure, network)
);
-- How the stored predictions were made (kistexp simulate): one row per run that saved predictions.
-- rates: "full" (relays at their consensus NIC rates) or "fast" (NICs scaled down so that the offered
-- traffic fits a byte budget per network, `kistexp simulate --fast`), which the reports label.
CREATE TABLE prediction_runs (
    id               INTEGER PRIMARY KEY,
    made_us          INTEGER NOT NULL,
    rates            TEXT NOT NULL CHECK (rates IN ('full', 'fast')),
    population_scale REAL NOT NULL,
    relays           TEXT NOT NULL,      -- relays per sampled network, space-separated
    nic_scale_min    REAL NOT NULL,
    nic_scale_max    REAL NOT NULL,
    duration_s       REAL NOT NULL,
    wall_s           REAL NOT NULL
);
"""

# Append-only. Each entry is one SQL script; open_db runs it in a transaction together
# with the user_version bump.
MIGRATIONS: tuple[str, ...] = (_V1, _V2_ROLLOUT_JOURNAL, _V3_SEQUENTIAL_JUDGE, _V4_MEASURED, _V5_ATTACK_MEASURES)

SCHEMA_VERSION = len(MIGRATIONS)
_CREATED = re.compile(r"CREATE TABLE (\w+)")


def tables_at(version: int) -> tuple[str, ...]:
    """The tables a database at schema ``version`` holds: those its migrations created (none drops one)."""
    return tuple(name for script in MIGRATIONS[:version] for name in _CREATED.findall(script))


def missing_tables(conn: sqlite3.Connection, prefix: str = "") -> tuple[str, ...]:
    """Tables (starting with ``prefix``) that the database's schema version promises and it lacks:
    a table dropped by hand or lost to damage, which readers would otherwise take for an empty one."""
    version = min(conn.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return tuple(t for t in tables_at(version) if t.startswith(prefix) and t not in have)


@functools.cache
def columns_at(version: int) -> dict[str, tuple[str, ...]]:
    """Each table's columns in a database at schema ``version``, as its migrations leave them."""
    conn = sqlite3.connect(":memory:")
    try:
        for script in MIGRATIONS[:version]:
            conn.executescript(script)
        return {t: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({t})"))  # noqa: S608 - our own names
                for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def missing_columns(conn: sqlite3.Connection, prefix: str = "") -> tuple[str, ...]:
    """``table.column`` for each column that the database's schema version promises a table (starting
    with ``prefix``) it has and that the table lacks: a table dropped and made again by hand, which
    readers would otherwise read as a column of defaults."""
    version = min(conn.execute("PRAGMA user_version").fetchone()[0], SCHEMA_VERSION)
    out = []
    for table, columns in columns_at(version).items():
        if not table.startswith(prefix):
            continue
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - our own names
        if have:  # a missing table is missing_tables' to tell
            out += [f"{table}.{c}" for c in columns if c not in have]
    return tuple(out)


def _check_header(path: Path) -> None:
    """Only once SQLite has refused the file: reading it with a plain open() and close() while this
    process holds a connection to it drops every POSIX lock the process holds on it (fcntl locks
    belong to the process and go with the first close of any descriptor). A WAL connection that
    loses its shared lock lets another process's closing connection believe it is the last one,
    checkpoint and delete the WAL under the writer, whose later commits are then lost."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the experiment database: {exc.strerror or exc}") from None
    if head and head != _SQLITE_MAGIC:
        raise StoreError(f"{path}: not an SQLite database (corrupt or a different file)")


def open_db(path: Path) -> sqlite3.Connection:
    """Open (creating if absent) an experiment database and bring its schema up to date.

    WAL mode lets the judge read while an import writes; foreign keys are enforced; a
    locked database is waited for BUSY_TIMEOUT_MS. A corrupt file, a non-SQLite file or a
    database from a newer kistexp raises StoreError naming the file.
    """
    path = Path(path)
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        _check_header(path)
        raise StoreError(f"{path}: cannot open the experiment database: {exc}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        for attempt in range(LOCKED_RETRIES + 1):
            try:
                _prepare(conn, path)
                break
            except sqlite3.OperationalError as exc:
                # Processes creating one new database at once: while one switches it to WAL and
                # migrates it, SQLite can answer another's statement with SQLITE_BUSY without
                # calling the busy handler (seen once under load in the four-process test). Wait
                # for that writer through the busy handler, then run the steps again: each is
                # idempotent (a migration another process applied is skipped).
                if not _is_locked(exc) or attempt == LOCKED_RETRIES:
                    raise
                conn.execute("BEGIN IMMEDIATE")
                conn.rollback()
    except sqlite3.DatabaseError as exc:
        conn.close()
        if _is_locked(exc):
            raise StoreError(f"{path}: the experiment database stayed locked by another process "
                             f"({exc})") from None
        _check_header(path)
        raise StoreError(f"{path}: corrupt experiment database: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


#: how often open_db starts its set-up again after SQLite reported the database locked
LOCKED_RETRIES = 5


def _is_locked(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED, which sqlite3 reports only in the message."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    """WAL mode, foreign keys and the schema migrations of one opened connection."""
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"{path}: the database refused WAL mode (journal_mode is {mode})")
    conn.execute("PRAGMA foreign_keys = ON")
    _migrate(conn, path)
    lost = missing_tables(conn)
    if lost:
        raise StoreError(f"{path}: damaged experiment database: table {', '.join(lost)} is missing "
                         f"(schema version {_version(conn)})")


def _version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = _version(conn)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: database schema version {version} is newer than this kistexp understands "
            f"({SCHEMA_VERSION}); upgrade kistexp")
    for number in range(version + 1, SCHEMA_VERSION + 1):
        script = MIGRATIONS[number - 1]
        try:
            # BEGIN IMMEDIATE takes the write lock first: a second process opening the same
            # new database waits here instead of interleaving with this migration.
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.rollback()
            if _version(conn) >= number:
                continue  # another process applied it while this one waited for the lock
            if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
                raise  # open_db waits for the other writer and starts again
            raise StoreError(f"{path}: schema migration {number} failed: {exc}") from None
