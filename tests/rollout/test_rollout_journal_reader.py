"""The journal's read-only reader (kistexp.rollout.journal.JournalReader): typed rows, "rows after id N",
one-line refusals, snapshots beside a writer, older schemas, and the rehearsal reset of the writer."""

from __future__ import annotations

import builtins
import datetime as dt
import io
import sqlite3
import types

import numpy as np
import pytest

from kistexp.rollout.journal import (
    CommandRow,
    DecisionRow,
    Journal,
    JournalReader,
    StatusRow,
    TransitionRow,
    VerdictRow,
)
from kistexp.rollout.spec import RolloutError
from kistexp.rollout.state import Status, Transition
from kistexp.store.schema import MIGRATIONS

UTC = dt.timezone.utc
T0 = dt.datetime(2027, 3, 1, 12, tzinfo=UTC)
H = dt.timedelta(hours=1)
KIST = "KISTSchedRunInterval"


def _verdict(criterion: str, outcome: str, effect: float | None = 1.1):
    return types.SimpleNamespace(criterion=criterion, outcome=outcome, effect=effect, ci_low=0.9, ci_high=1.3,
                                 n_baseline=600, n_stage=300, detail="", reason="straddles", rule="rule",
                                 record='{"looks": 1}')


def _step(j: Journal, key: str, at: dt.datetime, before: Status, after: Status, decision: str = "",
          transition: Transition | None = None) -> None:
    with j.write() as c:
        j.record(c, event_key=key, trigger="eval", due=at, now=at, before=before, after=after, transition=transition,
                 participants=("moria1", "tor26"), experiment_id="t", decision=decision, message=f"{decision} at {at}")


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path / "experiment.db", durable=False)
    j.set_meta(experiment_id="t", mode="dry-run", cadence="{}", start=T0.isoformat())
    yield j
    j.close()


def test_rows_are_typed_and_after_reads_only_what_is_new(journal, tmp_path):
    base = Status(state="BASELINE", values=((KIST, "10"),))
    moving = Status(state="TRANSITIONING", stage=1, values=((KIST, "2"),), target_va=T0 + H)
    go = Transition(seq=1, kind="stage", values=((KIST, "2"),), target_va=T0 + H, cause="baseline complete")
    _step(journal, "a", T0, Status(), base, "baseline")
    _step(journal, "b", T0 + H / 2, base, moving, "stage:1", go)
    with journal.write() as c:
        journal.add_verdict(c, _verdict("relay CPU", "inconclusive"), T0 + 2 * H, 1, False, "stage:1:x")
        journal.add_batch(c, "predicted", "relay_cpu_utilization", T0, "baseline", np.array([1.0, 2.0]))
        journal.add_batch(c, "onionperf", "client_ttlb_1mib_s", T0, "baseline", None)
    journal.vote_seen("moria1", T0 + H, {KIST: 2})
    journal.vote_seen("tor26", T0 + H, None)
    journal.consensus_seen(T0 + H, {KIST: 2}, ["moria1", "tor26"])
    cid = journal.queue_command("pause", {"freeze": False}, "alice", T0 + H)

    with JournalReader.of_experiment(tmp_path) as r:
        assert r.meta().experiment_id == "t" and r.meta().get("mode") == "dry-run" and r.meta().get("nope") is None
        assert r.latest_status() == moving
        (s1, s2) = r.statuses()
        assert isinstance(s2, StatusRow) and s2.status == moving and s2.event_key == "b"
        assert r.statuses(after=s1.id) == [s2] and r.statuses(after=s2.id) == []
        assert r.last_status_id() == s2.id
        d1, d2 = r.decisions()
        assert isinstance(d2, DecisionRow) and (d2.decision, d2.stage, d2.valid_after) == ("stage:1", 1, T0 + H)
        assert d1.valid_after is None and r.decisions(after=d1.id) == [d2] and r.last_decision_id() == d2.id
        (t,) = r.transitions()
        assert t == TransitionRow(1, T0 + H / 2, "BASELINE", "TRANSITIONING", 1, "stage", ((KIST, "2"),), T0 + H,
                                  "baseline complete")
        assert r.transitions(after=1) == []
        (v,) = r.verdicts()
        assert isinstance(v, VerdictRow) and (v.outcome, v.phase, v.reason, v.record) == (
            "inconclusive", "stage:1:x", "straddles", '{"looks": 1}')
        assert r.looks() == [v] and r.latest_verdicts() == {"relay CPU": v}
        intents = r.intents()
        assert [i.authority for i in intents] == ["moria1", "tor26"]
        assert intents[0].desired == ((KIST, 2),) and intents[0].state == "intended" and intents[0].changed is None
        assert r.intent_counts() == {"intended": 2}
        assert r.commands() == [CommandRow(cid, "pause", (("freeze", False),), "alice", T0 + H, "queued", "")]
        votes = r.votes_seen()
        assert [(x.authority, x.served, x.params) for x in votes] == [("moria1", True, ((KIST, 2),)),
                                                                     ("tor26", False, None)]
        assert r.votes_seen(after=votes[0].id) == votes[1:] and r.vote_authorities() == ("moria1", "tor26")
        (cs,) = r.consensus_seen()
        assert (cs.flavour, cs.params, cs.signers) == ("microdesc", ((KIST, 2),), ("moria1", "tor26"))
        batches = r.metric_batches()
        assert [(b.source, b.n, b.gap) for b in batches] == [("predicted", 2, False), ("onionperf", 0, True)]
        assert r.gaps_by_source() == {"onionperf": 1}
        assert list(r.batch_values("relay_cpu_utilization", "baseline")) == [1.0, 2.0]
        assert sorted(r.metric_phases()) == [("client_ttlb_1mib_s", "baseline"), ("relay_cpu_utilization", "baseline")]
        (rh,) = r.round_health(("moria1", "tor26", "dizum"))
        assert rh.voted == ("moria1",) and rh.down == ("tor26",) and rh.majority
        assert r.runs() == [] and r.open_runs() == 0 and r.owner() is None


def test_runs_owner_health_exposure_and_source_health(journal, tmp_path):
    run = journal.begin_run(["kistexp", "run"], T0)
    journal.authority_health_seen(T0 + H, [("moria1", True, True, "ok"), ("tor26", False, False, "down")])
    with journal.write() as c:
        e = types.SimpleNamespace(at=T0, stage=1, population="relays", expected_share=0.9, observed_share=None,
                                  n_nodes=6, n_on_target=2, n_pinned=1, n_unknown=3, short=True, detail="2 of 6")
        journal.add_exposure(c, e)
        journal.add_exposure(c, types.SimpleNamespace(**{**vars(e), "at": T0 + H, "short": False}))
        h = types.SimpleNamespace(source="onionperf", instance="op1", ok=False, n_samples=0, problem="refused")
        journal.add_source_health(c, T0, h, T0)
    with JournalReader.of_experiment(tmp_path) as r:
        (rr,) = r.runs()
        assert (rr.id, rr.argv, rr.end) == (run, ("kistexp", "run"), None) and r.open_runs() == 1
        owner = r.owner()
        assert owner is not None and owner.heartbeat == T0
        health = r.authority_health()
        assert [(a.authority, a.voted, a.state) for a in health] == [("moria1", True, "ok"), ("tor26", False, "down")]
        assert r.authority_health(after=health[0].id) == health[1:]
        ex = r.exposures()
        assert [x.short for x in ex] == [True, False] and ex[0].observed_share is None
        assert r.latest_exposure()["relays"].at == T0 + H
        (sh,) = r.source_health()
        assert (sh.ok, sh.problem) == (False, "refused") and r.gaps_by_source() == {"onionperf": 1}
    journal.end_run(run, T0 + 2 * H, "stopped")
    with JournalReader.of_experiment(tmp_path) as r:
        assert r.open_runs() == 0 and r.runs()[0].reason == "stopped"


def test_a_snapshot_sees_one_commit_and_the_next_read_sees_the_writers_later_ones(journal, tmp_path):
    r = JournalReader(tmp_path / "experiment.db")
    try:
        journal.queue_command("pause", {}, "a", T0)
        with r.snapshot():
            assert len(r.commands()) == 1
            journal.queue_command("resume", {}, "b", T0)  # the writer is not held up by the reader
            assert len(r.commands()) == 1  # the snapshot holds
            with r.snapshot():  # nested: the outer one holds
                assert len(r.commands()) == 1
        assert [c.kind for c in r.commands()] == ["pause", "resume"]
    finally:
        r.close()


def test_refusals_are_one_line_naming_the_directory_or_the_database(tmp_path):
    cases = []
    with pytest.raises(RolloutError) as err:
        JournalReader.of_experiment(tmp_path / "nowhere")
    cases.append((err.value, f"{tmp_path / 'nowhere'}: not an experiment directory (no experiment.db)"))
    with pytest.raises(RolloutError) as err:
        JournalReader(tmp_path / "missing.db")
    cases.append((err.value, f"{tmp_path / 'missing.db'}: no such experiment database"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "experiment.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(RolloutError) as err:
        JournalReader.of_experiment(tmp_path / "bad")
    cases.append((err.value, f"{tmp_path / 'bad' / 'experiment.db'}: cannot read the rollout journal: "))
    (tmp_path / "plain").mkdir()
    sqlite3.connect(tmp_path / "plain" / "experiment.db").execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(RolloutError) as err:
        JournalReader.of_experiment(tmp_path / "plain")
    cases.append((err.value, f"{tmp_path / 'plain' / 'experiment.db'}: cannot read the rollout journal: no such "
                             "table: rollout_meta"))
    for exc, start in cases:
        assert str(exc).startswith(start) and "\n" not in str(exc), (str(exc), start)


def test_a_path_sqlite_would_read_as_uri_syntax_is_read_as_a_path(tmp_path):
    odd = tmp_path / "a dir?x=1#%20"
    odd.mkdir()
    j = Journal(odd / "experiment.db", durable=False)
    j.set_meta(cadence="{}")
    j.close()
    with JournalReader.of_experiment(odd) as r:
        assert r.meta().cadence == "{}"


def test_the_reader_never_opens_the_database_file_itself(journal, tmp_path, monkeypatch):
    """A plain open() and close() of the database drops the process's POSIX locks on it, the writer's
    included (kistexp/store/schema.py ``_check_header``)."""
    journal.queue_command("pause", {}, "a", T0)
    real_open = builtins.open

    def guarded(file, *args, **kwargs):
        assert "experiment.db" not in str(file), f"plain open() of {file}"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
    with JournalReader.of_experiment(tmp_path) as r, r.snapshot():
        assert r.commands() and r.meta().experiment_id == "t" and r.intents() == [] and r.looks() == []


def test_an_older_schema_reads_with_defaults_for_what_it_lacks(tmp_path):
    db = tmp_path / "experiment.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(MIGRATIONS[0] + MIGRATIONS[1] + "PRAGMA user_version = 2;")
    conn.execute("INSERT INTO rollout_meta VALUES ('cadence', '{}')")
    conn.execute("INSERT INTO rollout_verdicts (criterion, window_end_us, stage, outcome, effect, ci_low, ci_high, "
                 "n_baseline, n_stage, shadow, detail) VALUES ('c', 0, 1, 'pass', 1.0, 0.9, 1.1, 5, 5, 0, '')")
    conn.execute("INSERT INTO rollout_metric_batches (source, metric, window_us, phase, n, summary, payload, sha256) "
                 "VALUES ('s', 'm', 0, 'baseline', 0, '{}', x'', '')")
    conn.close()
    with JournalReader(db) as r:
        (v,) = r.verdicts()
        assert (v.reason, v.phase, v.rule, v.record) == ("", "", "", "{}")
        (b,) = r.metric_batches()
        assert (b.origin, b.excluded, b.gap) == ("", 0, True)
        assert r.exposures() == [] and r.source_health() == [] and r.authority_health() == []
        assert r.gaps_by_source() == {"s": 1}
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 2  # read, never migrated


def test_reset_for_rehearsal_empties_the_rehearsals_rows_sets_meta_and_keeps_the_record(journal, tmp_path):
    run = journal.begin_run(["kistexp", "dry-run"], T0)
    _step(journal, "a", T0, Status(), Status(state="BASELINE"), "baseline")
    journal.vote_seen("moria1", T0, {KIST: 10})
    # the same rehearsal's journal (another's is refused: tests/rollout/test_hardening_journal.py)
    journal.reset_for_rehearsal(mode="dry-run", experiment_id="t", start=(T0 + H).isoformat())
    with JournalReader.of_experiment(tmp_path) as r:
        assert r.statuses() == [] and r.decisions() == [] and r.votes_seen() == []
        assert [x.id for x in r.runs()] == [run]
        meta = r.meta()
        assert (meta.experiment_id, meta.start, meta.cadence) == ("t", (T0 + H).isoformat(), "{}")
