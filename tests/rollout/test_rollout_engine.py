"""The engine over the journal: dry runs, injections, resume after a crash at every hook, the lock."""

import datetime as dt
import json

import pytest

from kistexp.clock import VirtualClock
from kistexp.dirauth.voting import Vote, compute_consensus_params
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import load_plan, parse_plan
from kistexp.rollout.drivers import VirtualDriver
from kistexp.rollout.dryrun import (
    InjectionError,
    NoPredictions,
    PredictedMetrics,
    dry_run,
    initial_configs,
    load_curves,
    parse_injection,
)
from kistexp.rollout.engine import Engine
from kistexp.rollout.journal import Journal, LockedError, RunLock
from kistexp.rollout.spec import spec_from_plan
from tests.model_authorities import SimulatedAuthorities
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import KIST_EFFECTS, write_predictions

SHORT_PLAN = VALID_PLAN.replace('duration = "7d"', 'duration = "2d"').replace('duration = "14d"', 'duration = "2d"')
SHORT_EFFECTS = {"baseline": {}, "two": {"client_ttlb_1mib_s": -0.04}, "eight": {"client_ttlb_1mib_s": -0.02}}
KIST = "KISTSchedRunInterval"


@pytest.fixture(scope="module")
def kist_exp(tmp_path_factory):
    path = tmp_path_factory.mktemp("kist") / "exp"
    write_predictions(path, KIST_EFFECTS)
    return path


def decision_log(result):
    return [(d["decision"], d["stage"], d["valid_after"]) for d in result.decisions]


@pytest.mark.slow  # seven weeks of hourly rounds of nine fake authorities
def test_bundled_plan_dry_run_completes_with_each_stage_in_consensus(kist_exp):
    plan = load_plan("plans/kist-run-interval-2020.toml")
    r = dry_run(plan, kist_exp)
    assert r.final_state == "COMPLETED"
    assert [c["params"][KIST] for c in r.consensus_changes] == [10, 2, 5, 10]
    # each stage's value is first in the consensus valid at its planned start
    starts = [c["valid_after"] for c in r.consensus_changes[1:]]
    assert starts == [plan.start + dt.timedelta(days=14 * i) for i in range(3)]
    # the two manual gates were approved by journaled promotes, nothing was rolled back
    assert [d for d, _, _ in decision_log(r)].count("pause:gate") == 2
    assert r.rollbacks == ()
    j = Journal(kist_exp / "experiment.db", durable=False)
    # §7.8: each consensus seen equals the voting rule over that round's votes
    votes = {}
    for v in j.votes():
        votes.setdefault(v["valid_after"], []).append(Vote(v["authority"], v["params"] or {}))
    for c in j.consensuses():
        if c["valid_after"] in votes:
            assert dict(compute_consensus_params(votes[c["valid_after"]], 9)) == c["params"]
    # §7.2: every intent finished
    assert {i["state"] for i in j.intents()} <= {"done", "superseded"}
    # §7.9: no stage statistic uses a sample from a transition or washout
    phases = {r[0] for r in j.conn.execute("SELECT DISTINCT phase FROM rollout_metric_batches")}
    assert "excluded" in phases
    first_stage_window = j.conn.execute("SELECT MIN(window_us) FROM rollout_metric_batches "
                                        "WHERE phase LIKE 'stage:1:%'").fetchone()[0]
    from kistexp.metrics.series import from_us
    assert from_us(first_stage_window) == plan.start + dt.timedelta(hours=2)  # after the 2 h washout
    j.close()


def test_dry_run_reruns_give_the_same_decision_log(kist_exp):
    plan = load_plan("plans/kist-run-interval-2020.toml")
    a = dry_run(plan, kist_exp, injections=["stage=1:relay_cpu_utilization=+50%"])
    b = dry_run(plan, kist_exp, injections=["stage=1:relay_cpu_utilization=+50%"])
    assert decision_log(a) == decision_log(b)


def test_rehearsed_cpu_rollback_steps_back_in_stage_one(kist_exp):
    plan = load_plan("plans/kist-run-interval-2020.toml")
    r = dry_run(plan, kist_exp, injections=["stage=1:relay_cpu_utilization=+50%"])
    assert len(r.rollbacks) == 1
    rb = r.rollbacks[0]
    assert rb["kind"] == "step-back" and rb["from_stage"] == 1  # the relay CPU criterion's on_fail
    assert "relay CPU" in rb["cause"]
    # fires at the first judged hour: 2 h washout + 1 h window after the 12:00 consensus
    assert rb["at"] == plan.start + dt.timedelta(hours=3)
    assert rb["valid_after"] == "2027-03-01T16:00:00Z"
    assert len(rb["authorities_must_act"]) == 2
    assert 0 < rb["relays_back_after_s"] < rb["clients_back_after_s"] <= 3600 + 112 * 60
    assert r.final_state == "PAUSED" and "stepped-back" in r.status
    assert r.consensus_changes[-1]["params"][KIST] == 10


def test_an_authority_down_from_day_two_does_not_stop_the_rollout(tmp_path):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    r = dry_run(parse_plan(SHORT_PLAN), tmp_path / "e", injections=["authority=moria1:down@day2"])
    assert r.final_state == "COMPLETED"
    assert [c["params"][KIST] for c in r.consensus_changes] == [10, 2, 8]  # eight of nine still carry it
    j = Journal(tmp_path / "e" / "experiment.db", durable=False)
    stuck = [i for i in j.intents() if i["authority"] == "moria1" and i["state"] == "superseded"]
    assert stuck  # moria1 never acted: its intents were superseded, not silently dropped
    signers = j.consensuses()[-1]["signers"]
    assert "moria1" not in signers and len(signers) == 8
    j.close()


def test_a_metrics_gap_holds_and_is_journaled_as_error(tmp_path):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    plan = parse_plan(SHORT_PLAN)
    r = dry_run(plan, tmp_path / "e", injections=["metrics=onionperf:gap@day3+4h+for=3h"])
    j = Journal(tmp_path / "e" / "experiment.db", durable=False)
    errors = [v for v in j.verdicts() if v["outcome"] == "error"]
    assert len(errors) == 3 and "no client_ttlb_1mib_s samples" in errors[0]["detail"]
    missing = j.conn.execute("SELECT COUNT(*) FROM rollout_metric_batches WHERE missing = 1").fetchone()[0]
    assert missing == 3
    assert r.final_state == "COMPLETED"
    j.close()


def test_missing_predictions_say_how_to_make_them(tmp_path):
    plan = parse_plan(SHORT_PLAN)
    with pytest.raises(NoPredictions, match="kistexp simulate"):
        dry_run(plan, tmp_path / "none")


@pytest.mark.parametrize("option, message", [
    ("stage=9:relay_cpu_utilization=+50%", "baseline or 1..2"),
    ("stage=1:cpu=+50%", "unknown metric"),
    ("authority=nobody:down@day2", "no authority"),
    ("metrics=prometheus:gap@day2", "no metric source"),
    ("authority=moria1:melt@day2", "down and stale"),
    ("weather=rain", "expected"),
    ("metrics=onionperf:gap@tomorrow", "not dayD"),
])
def test_bad_injections_get_one_line(option, message):
    spec = spec_from_plan(parse_plan(SHORT_PLAN))
    with pytest.raises(InjectionError, match=message):
        parse_injection(option, spec)


class Killed(Exception):
    pass


def _engine(spec, journal, sim, clock, store, hook=None):
    curves, levels = load_curves(store, spec, "plan")
    return Engine(spec, journal, sim, PredictedMetrics(spec, curves, levels, sim), clock, hook=hook,
                  experiment_id="crash")


HOOKS = ("before_intent", "after_intent", "after_act", "after_verify", "before_done", "mid_batch")


@pytest.mark.parametrize("hook_name", HOOKS)
@pytest.mark.parametrize("nth", [1, 2])
def test_resume_after_a_crash_at_each_hook_loses_and_repeats_nothing(tmp_path, hook_name, nth):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    plan = parse_plan(SHORT_PLAN)
    spec = spec_from_plan(plan)
    store = MetricStore(Journal(tmp_path / "e" / "experiment.db").conn)

    def run(db, kill_at=None):
        seen = {"n": 0}

        def hook(name, journal):
            if name == kill_at:
                seen["n"] += 1
                if seen["n"] == nth:
                    raise Killed(name)

        return run_with_restarts(spec, db, store, hook)

    clean, clean_sim, _ = run(tmp_path / "e" / "experiment.db")
    import shutil
    shutil.copy(tmp_path / "e" / "experiment.db", tmp_path / "clean.db")
    (tmp_path / "k").mkdir()
    write_predictions(tmp_path / "k", SHORT_EFFECTS)
    killed, killed_sim, kills = run(tmp_path / "k" / "experiment.db", hook_name)
    assert kills == 1
    assert [(d["decision"], d["stage"], d["valid_after"]) for d in killed.decisions()] == \
        [(d["decision"], d["stage"], d["valid_after"]) for d in clean.decisions()]
    # §7.3: per authority the same state changes, once each, in order
    def changes(sim):
        return [(c.authority, c.old, c.new) for c in sim.changes]
    assert changes(killed_sim) == changes(clean_sim)
    assert {i["state"] for i in killed.intents()} <= {"done", "superseded"}
    assert killed.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def run_with_restarts(spec, db, store, hook):
    """Run to the end on the virtual clock; ``hook(name, journal)`` may raise Killed, after
    which a new engine resumes from the journal alone. -> (journal, authorities, kills)."""
    journal = Journal(db, durable=False)
    clock = VirtualClock(spec.baseline_start)
    sim = SimulatedAuthorities(spec.authorities, initial_configs(spec), spec.cadence, clock)
    kills = 0
    while True:
        engine = _engine(spec, journal, sim, clock, store, lambda name, j=journal: hook(name, j))
        try:
            VirtualDriver(engine, clock).run(on_step=_approve(journal, clock))
            break
        except Killed:
            kills += 1
            journal.close()
            journal = Journal(db, durable=False)  # the process is gone: only the journal remains
    return journal, sim, kills


def _approve(journal, clock):
    def operator(engine):
        if engine.status.state == "PAUSED" and engine.status.reasons == {"gate"}:
            journal.queue_command("promote", {}, "test", clock.now())
            engine.step(clock.now())
    return operator


def test_second_run_on_the_same_directory_is_refused(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    with pytest.raises(LockedError, match="already being run by pid 4711"):
        RunLock(tmp_path).acquire(" by pid 4711 on h since 10:02 UTC")
    first.release()
    again = RunLock(tmp_path)
    again.acquire()
    again.release()


def test_queued_commands_are_journaled_with_their_result(tmp_path):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    spec = spec_from_plan(parse_plan(SHORT_PLAN))
    journal = Journal(tmp_path / "e" / "experiment.db", durable=False)
    clock = VirtualClock(spec.baseline_start)
    sim = SimulatedAuthorities(spec.authorities, initial_configs(spec), spec.cadence, clock)
    engine = _engine(spec, journal, sim, clock, MetricStore(journal.conn))
    VirtualDriver(engine, clock).run(until=spec.start + dt.timedelta(hours=5))
    assert engine.status.state == "MEASURING"
    refused = journal.queue_command("retry", {}, "alice", clock.now())
    paused = journal.queue_command("pause", {}, "alice", clock.now())
    engine.step(clock.now())
    assert journal.command(refused)["state"] == "refused"
    assert journal.command(paused) == {"kind": "pause", "state": "applied", "result": "paused"}
    assert journal.status().state == "PAUSED"
    assert json.loads(journal.conn.execute("SELECT status FROM rollout_status ORDER BY id DESC").fetchone()[0])[
        "reasons"] == ["manual"]
