"""The experiment directory, its database schema and the metric store."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.metrics.series import Prediction, Sample
from kistexp.metrics.store import ConsensusRecord, MetricStore, VoteRecord
from kistexp.store import schema
from kistexp.store.schema import StoreError, open_db

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
FPR_A = "A" * 40
FPR_B = "B" * 40


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


# --- schema -------------------------------------------------------------------------

def test_open_db_wal_foreign_keys_and_version(tmp_path):
    conn = open_db(tmp_path / "x.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"series", "samples", "predictions", "sources", "consensuses", "consensus_params",
            "votes", "vote_params"} <= tables
    conn.close()
    # reopening applies nothing twice
    conn = open_db(tmp_path / "x.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)


def test_open_db_refuses_newer_schema(tmp_path):
    path = tmp_path / "x.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(schema.MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(StoreError, match=r"x\.db: database schema version \d+ is newer"):
        open_db(path)


@pytest.mark.parametrize("content", [b"this is a plan, not a database\n" * 10, b"SQLite format 3\x00" + b"\xff" * 5000])
def test_open_db_refuses_non_sqlite_and_corrupt(tmp_path, content):
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        open_db(path)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg


# --- experiment directory -------------------------------------------------------------

def test_create_and_open(tmp_path):
    plan = tmp_path / "p.toml"
    plan.write_text("[experiment]\nname = 'x'\n")
    exp = ExperimentDir.create(tmp_path / "exp", plan_path=plan)
    assert (tmp_path / "exp" / "experiment.db").is_file()
    assert exp.plan_path.read_text() == plan.read_text()
    exp.close()
    again = ExperimentDir.open(tmp_path / "exp")
    assert again.path == tmp_path / "exp"
    assert again.db.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)


def test_create_refuses_file_existing_and_unwritable(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        ExperimentDir.create(f)
    with pytest.raises(StoreError, match="is a file"):
        ExperimentDir.open(f)
    ExperimentDir.create(tmp_path / "e").close()
    with pytest.raises(StoreError, match="already holds an experiment"):
        ExperimentDir.create(tmp_path / "e")
    with pytest.raises(StoreError, match="not an experiment directory"):
        ExperimentDir.open(tmp_path)
    with pytest.raises(StoreError, match="no such experiment directory"):
        ExperimentDir.open(tmp_path / "missing")
    # below a file: cannot be created (works even as root, unlike a chmod test)
    with pytest.raises(StoreError, match="cannot create"):
        ExperimentDir.create(f / "sub")


def test_unwritable_directory(tmp_path):
    import os

    if os.geteuid() == 0:
        # root writes through file modes; a directory of the kernel's proc filesystem refuses it
        ro = Path("/proc/self")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
    try:
        with pytest.raises(StoreError, match=f"{ro}: experiment directory is not writable"):
            ExperimentDir.create(ro)
    finally:
        if ro != Path("/proc/self"):
            ro.chmod(0o700)


# --- samples ------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path):
    exp = ExperimentDir.create(tmp_path / "exp")
    yield MetricStore(exp.db)
    exp.close()


def test_unknown_metric_is_refused(store):
    with pytest.raises(KistexpError, match="unknown metric 'cpu'"):
        store.add_samples("cpu", [Sample(at(0), 1.0)])
    with pytest.raises(KistexpError, match="unknown metric"):
        store.select("cpu", at(0), at(1))


def test_sample_validation():
    with pytest.raises(ValueError, match="naive"):
        Sample(dt.datetime(2026, 1, 1), 1.0)
    with pytest.raises(ValueError, match="finite"):
        Sample(at(0), float("nan"))
    with pytest.raises(ValueError, match="label key"):
        Sample(at(0), 1.0, {"Relay Name": "x"})
    s = Sample(dt.datetime(2026, 3, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))), 3, {"relay": FPR_A})
    assert s.time == T0 and s.value == 3.0 and s.labels["relay"] == FPR_A


def test_window_by_time_labels_and_value_in_effect(store):
    # Relay A adopts the new value (5) at minute 30, relay B only at minute 50: the
    # samples B takes between 30 and 50 still belong to the old value (2).
    samples_a = [Sample(at(m), 0.10 + m / 1000, {"relay": FPR_A, "relay_class": "guard"}, 2 if m < 30 else 5)
                 for m in range(0, 60, 10)]
    samples_b = [Sample(at(m), 0.50 + m / 1000, {"relay": FPR_B, "relay_class": "exit"}, 2 if m < 50 else 5)
                 for m in range(0, 60, 10)]
    assert store.add_samples("relay_cpu_utilization", samples_a + samples_b) == 12
    assert len(store.select("relay_cpu_utilization", at(0), at(60))) == 12
    # half-open window
    got = store.select("relay_cpu_utilization", at(10), at(30))
    assert [s.time for s in got] == [at(10), at(10), at(20), at(20)]
    new = store.select("relay_cpu_utilization", at(30), at(60), param_value=5)
    assert sorted((s.labels["relay"][0], s.time) for s in new) == [
        ("A", at(30)), ("A", at(40)), ("A", at(50)), ("B", at(50))]
    old = store.values("relay_cpu_utilization", at(30), at(60), param_value=2)
    assert old == pytest.approx([0.53, 0.54])
    only_a = store.select("relay_cpu_utilization", None, None, labels={"relay": FPR_A})
    assert len(only_a) == 6 and all(s.labels == {"relay": FPR_A, "relay_class": "guard"} for s in only_a)
    assert store.select("relay_cpu_utilization", labels={"relay_class": "middle"}) == []


def test_unknown_value_is_not_counted_for_any_value(store):
    store.add_samples("client_ttfb_s", [Sample(at(1), 1.0), Sample(at(2), 2.0, param_value=2)])
    assert store.values("client_ttfb_s", param_value=2) == [2.0]
    assert store.values("client_ttfb_s") == [1.0, 2.0]


def test_reimport_replaces_instead_of_doubling(store):
    # two transfers may share a timestamp (torctl logs at 10 ms): both are kept
    rows = [Sample(at(m), m, {"source": "op-hk5", "size": "5242880"}) for m in (0, 0, 2, 3, 4)]
    for _ in range(2):
        sid = store.record_source("onionperf", "hk5.json.xz", "abc123")
        store.add_samples("client_ttlb_5mib_s", rows, source_id=sid)
    assert len(store.select("client_ttlb_5mib_s")) == 5
    assert len(store.sources()) == 1
    other = store.record_source("onionperf", "other.json.xz", "def456")
    store.add_samples("client_ttlb_5mib_s", rows[:1], source_id=other)
    assert len(store.select("client_ttlb_5mib_s")) == 6
    (info,) = store.series("client_ttlb_5mib_s")
    assert info.n_samples == 6 and info.first == at(0) and info.last == at(4)
    (summary,) = store.summary()
    assert (summary.metric, summary.unit, summary.n_series, summary.n_samples) == ("client_ttlb_5mib_s", "s", 1, 6)


def test_add_samples_is_atomic(store):
    def gen():
        yield Sample(at(0), 1.0, {"relay": FPR_A})
        raise ValueError("bad row")
    with pytest.raises(ValueError):
        store.add_samples("relay_rss_bytes", gen())
    assert store.select("relay_rss_bytes") == []
    store.add_samples("relay_rss_bytes", [Sample(at(0), 5.0, {"relay": FPR_A})])
    assert store.values("relay_rss_bytes") == [5.0]


def test_concurrent_reader_sees_committed_samples(tmp_path):
    exp = ExperimentDir.create(tmp_path / "e")
    MetricStore(exp.db).add_samples("relay_rss_bytes", [Sample(at(0), 7.0)])
    other = ExperimentDir.open(tmp_path / "e")
    assert MetricStore(other.db).values("relay_rss_bytes") == [7.0]


# --- predictions ----------------------------------------------------------------------

def test_predictions_round_trip_and_filters(store):
    qs = [i / 100 for i in range(101)]
    recs = [Prediction(stage, "client_ttlb_1mib_s", "", net, q, 1.0 + q * (2 if stage == "baseline" else 3))
            for stage in ("baseline", "canary", "transition:canary") for net in (0, 1) for q in qs]
    assert store.save_predictions(recs) == len(recs)
    store.save_predictions(recs)  # idempotent
    got = store.load_predictions(stage="canary")
    assert len(got) == 2 * 101 and got[0] == Prediction("canary", "client_ttlb_1mib_s", "", 0, 0.0, 1.0)
    assert got[-1].value == pytest.approx(4.0)
    assert len(store.load_predictions(metric="client_ttlb_1mib_s")) == len(recs)
    assert store.load_predictions(metric="relay_rss_bytes") == []
    with pytest.raises(ValueError, match="quantile"):
        Prediction("baseline", "client_ttfb_s", "", 0, 1.5, 1.0)
    with pytest.raises(ValueError, match="unknown metric"):
        Prediction("baseline", "latency", "", 0, 0.5, 1.0)


# --- consensus history ------------------------------------------------------------------

def test_consensus_and_vote_records(store):
    va = dt.datetime(2022, 11, 19, 10, tzinfo=UTC)
    store.save_consensus(ConsensusRecord(va, "ns", "D" * 40, 6088, 8, 8, True, "c1",
                                         {"KISTSchedRunInterval": 2, "cc_alg": 2}))
    store.save_consensus(ConsensusRecord(va, "ns", "D" * 40, 6088, 8, 8, True, "c1",
                                         {"KISTSchedRunInterval": 2, "cc_alg": 2}))
    store.save_vote(VoteRecord(va, FPR_A, "moria1", "E" * 40, True, "v1", {"KISTSchedRunInterval": 3}))
    (c,) = store.consensuses()
    assert c.params == {"KISTSchedRunInterval": 2, "cc_alg": 2} and c.n_relays == 6088 and c.verified
    (v,) = store.votes(va)
    assert v.nickname == "moria1" and v.params == {"KISTSchedRunInterval": 3}


def test_docs_list_every_catalogue_metric_with_its_unit():

    from kistexp.metrics import catalogue

    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2].strip()
            for line in text.splitlines() if line.startswith("| `")}
    for m in catalogue.METRICS:
        assert rows.get(m.name) == m.unit, m.name


def test_window_over_thousands_of_relays(store):
    # one series per relay, as a network-wide MetricsPort collection has
    fprs = [f"{i:040X}" for i in range(1200)]
    store.add_samples("relay_bandwidth_bytes_per_s",
                      [Sample(at(m), i, {"relay": f, "relay_class": "exit" if i % 4 == 0 else "guard"}, 2)
                       for i, f in enumerate(fprs) for m in (0, 10)])
    assert len(store.select("relay_bandwidth_bytes_per_s", at(0), at(5))) == 1200
    exits = store.select("relay_bandwidth_bytes_per_s", at(5), at(20), {"relay_class": "exit"}, 2)
    assert len(exits) == 300 and all(s.labels["relay_class"] == "exit" and s.time == at(10) for s in exits)
    one = store.values("relay_bandwidth_bytes_per_s", labels={"relay": fprs[7]})
    assert one == [7.0, 7.0]


def test_two_processes_creating_one_database(tmp_path):
    # both open a new experiment database at once: one migrates, the other waits and sees it done
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from kistexp.store.schema import open_db; "
            "c = open_db(Path(sys.argv[1])); print(c.execute('PRAGMA user_version').fetchone()[0])")
    env_path = str(Path(__file__).resolve().parents[2])
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "x.db")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": env_path})
             for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [o[0].strip() for o in outs] == [str(len(schema.MIGRATIONS))] * 4, outs
