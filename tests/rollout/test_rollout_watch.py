"""The event feed (kistexp.rollout.watch): the pure rows -> lines function, the journal tail, follow(),
and authority health in status, history, the dry run's table, rollback --dry-run and the report."""

import datetime as dt
import json
import re
import threading
from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.plan.loader import load_plan, parse_plan
from kistexp.rollout.journal import (
    Journal,
    authority_outages,
    consensus_outages,
    round_health,
    status_to_json,
)
from kistexp.rollout.spec import spec_from_plan
from kistexp.rollout.state import Counters, Status
from kistexp.rollout.watch import (
    CommandRow,
    ConsensusRow,
    DecisionRow,
    ExposureRow,
    Feed,
    FeedContext,
    FeedState,
    FeedThread,
    GapRow,
    HealthRow,
    IntentRow,
    JournalRows,
    StatusRow,
    TransitionRow,
    VerdictRow,
    VoteRow,
    effect_text,
    feed,
    follow,
    reminder,
    resolving_commands,
)
from tests.plan_helpers import short_plan
from tests.rollout_helpers import (
    FIVE_DOWN,
    KIST_EFFECTS,
    KIST_PLAN,
    RELAY_CPU_CRITERION,
    dry_run_kist,
    write_predictions,
)

PLAN = KIST_PLAN
SPEC = spec_from_plan(load_plan(PLAN))
CTX = FeedContext("/exp dir", SPEC)
T0 = dt.datetime(2027, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def cli(*argv):
    return CliRunner().invoke(app, list(argv))


def lines(events):
    return [e.line(CTX.fmt) for e in events]


# --- plain words ---------------------------------------------------------------------------------

def test_effects_are_said_as_relative_changes_with_interval_and_limit():
    # the journal keeps the judge's ratio stage/baseline: 1.706 is +70.6 %
    assert effect_text("relative-increase", 0.25, 1.706, 1.364, 2.133) == \
        "+70.6 % [+36.4 %, +113.3 %] vs limit +25 %"
    assert effect_text("relative-decrease", 0.1, 0.95, 0.9, 1.01) == "-5.0 % [-10.0 %, +1.0 %] vs limit -10 %"
    # absolute comparisons keep the difference, in the metric's unit
    assert effect_text("absolute-increase", 0.2, 0.05, -0.01, 0.11, "s") == "+0.05 s [-0.01 s, +0.11 s] vs limit +0.2 s"
    assert effect_text("above", 0.5, 0.42, 0.4, 0.44) == "0.42 [0.4, 0.44] vs limit above 0.5"
    assert effect_text("relative-increase", 0.25, None, None, None) == "(no estimate) vs limit +25 %"


@pytest.mark.parametrize(("reasons", "stage", "expected"), [
    ({"gate"}, 1, ["kistexp promote '/exp dir'", "kistexp abort '/exp dir'"]),
    ({"manual"}, 1, ["kistexp resume '/exp dir'", "kistexp abort '/exp dir'"]),
    ({"stepped-back"}, 0, ["kistexp promote '/exp dir'", "kistexp undo '/exp dir'", "kistexp abort '/exp dir'"]),
    ({"not-in-consensus"}, 2, ["kistexp undo '/exp dir' --to-stage 2 (once the authorities vote again)",
                               "kistexp abort '/exp dir'"]),
    ({"drift"}, 1, ["kistexp undo '/exp dir' (after checking the authority)", "kistexp abort '/exp dir'"]),
])
def test_a_pause_names_the_commands_the_state_machine_would_accept(reasons, stage, expected):
    st = Status(state="PAUSED", stage=stage, values=SPEC.values_of(stage), reasons=frozenset(reasons),
                resume_to="MEASURING" if stage else "BASELINE")
    assert list(resolving_commands(CTX, st)) == expected


def test_a_criterion_hold_after_a_fail_suggests_promote_force_not_a_refused_promote():
    st = Status(state="PAUSED", stage=1, values=SPEC.values_of(1), reasons=frozenset({"criterion-hold"}),
                resume_to="MEASURING", counters=(("relay CPU", Counters(failed=1, latest="fail")),))
    assert resolving_commands(CTX, st) == ("kistexp promote '/exp dir' --force", "kistexp abort '/exp dir'")


# --- the pure function on hand-made rows ---------------------------------------------------------

def _status(i, key, at, **kw):
    return StatusRow(i, key, at, Status(**kw))


def _intent(i, seq, authority, desired, va, state, attempts, error="", *, acted=None, done=None):
    return IntentRow(i, f"intent-{i}", seq, authority, desired, va, state, attempts, error, "", va - 12 * M,
                     acted, None, done)


def _exposure(at, stage, population, expected, observed, short, detail):
    return ExposureRow(at, stage, population, expected, observed, 6, 0, 0, 0, short, detail)


def test_rows_become_one_plain_line_each_in_time_order():
    base = SPEC.values_of(0)
    two = SPEC.values_of(1)
    rows = JournalRows(
        statuses=(
            _status(1, "start", T0 - 7 * 24 * H, state="BASELINE", values=base, decision_at=T0 - 12 * M),
            _status(2, "decide0", T0 - dt.timedelta(minutes=12), state="TRANSITIONING", stage=1, values=two,
                    target_va=T0, seq=1),
            _status(3, "check", T0 + dt.timedelta(minutes=1), state="WASHOUT", stage=1, values=two, stage_va=T0,
                    decision_at=T0 + 14 * 24 * H, seq=1),
            _status(4, "eval", T0 + 4 * H, state="ROLLING_BACK", stage=1, values=base, target_va=T0 + 5 * H,
                    rollback_kind="step-back", from_stage=1, seq=2),
            _status(5, "check2", T0 + 5 * H + dt.timedelta(minutes=1), state="PAUSED", stage=0, values=base,
                    stage_va=T0 + 5 * H, reasons=frozenset({"stepped-back"}), resume_to="BASELINE", seq=2),
        ),
        decisions=(
            DecisionRow(1, "decide0", T0 - 12 * M, "stage:1", 1, T0, "stage 1 (2ms): baseline complete"),
            DecisionRow(2, "check", T0 + dt.timedelta(minutes=1), "in-consensus:1", 1, None, "stage 1 in consensus"),
            DecisionRow(3, "eval", T0 + 4 * H, "rollback:step-back", 1, T0 + 5 * H,
                        "criterion 'relay CPU' failed (ratio 1.7) -> step-back"),
            DecisionRow(4, "check2", T0 + 5 * H + dt.timedelta(minutes=1), "stepped-back", 0, None,
                        "stepped back to baseline"),
            DecisionRow(5, "jump", T0 + 6 * H, "clock-jump", 0, None, "wall clock jumped forward 5.0 s"),
        ),
        transitions=(
            TransitionRow(1, T0 - 12 * M, "BASELINE", "TRANSITIONING", 1, "stage", (("KISTSchedRunInterval", 2),),
                          T0, "stage 1 (2ms): baseline complete"),
            TransitionRow(2, T0 + 4 * H, "MEASURING", "ROLLING_BACK", 1, "rollback", (("KISTSchedRunInterval", 10),),
                          T0 + 5 * H, "criterion 'relay CPU' failed (ratio 1.7) -> step-back"),
        ),
        verdicts=(
            VerdictRow(1, "relay CPU", T0 + 3 * H, 1, "inconclusive", 1.1, 0.9, 1.4, 600, 600, False, "", "straddles"),
            VerdictRow(2, "relay CPU", T0 + 4 * H, 1, "fail", 1.706, 1.364, 2.133, 600, 1200, False, ""),
            VerdictRow(3, "quiet circuits", T0 + 4 * H, 1, "error", None, None, None, 0, 0, False,
                       "no quiet_circuit_latency_ms samples for the last hour"),
        ),
        intents=(
            _intent(1, 1, "moria1", (("KISTSchedRunInterval", 2),), T0, "done", 1, done=T0 + dt.timedelta(minutes=1)),
            _intent(2, 1, "tor26", (("KISTSchedRunInterval", 2),), T0, "done", 1, done=T0 + dt.timedelta(minutes=1)),
            _intent(3, 2, "dizum", (("KISTSchedRunInterval", 10),), T0 + 5 * H, "intended", 2,
                    "HTTP 503:\n dizum is down"),
        ),
        commands=(CommandRow(1, "pause", (("freeze", False),), "alice", T0 + 2 * H, "refused", "cannot pause"),),
        votes=(VoteRow("dizum", T0 + 5 * H, False), VoteRow("moria1", T0 + 5 * H, True)),
        consensuses=(ConsensusRow(T0, (("KISTSchedRunInterval", 2),), SPEC.authorities),),
        gaps=(GapRow("prometheus", T0 + 2 * H, "relay_cpu_utilization", problem="connection refused"),),
        exposure=(_exposure(T0 + 3 * H, 1, "relays", 0.9, 0.4, True, "2 of 6 run it"),
                  _exposure(T0 + 3 * H, 1, "clients", 0.5, 0.5, False, "")),
    )
    events, state = feed(CTX, FeedState(), rows)
    text = lines(events)
    assert all("\n" not in t for t in text)  # one line each, even an actuator's multi-line error
    assert [e.at for e in events if e.at is not None] == sorted(e.at for e in events if e.at is not None)
    joined = "\n".join(text)
    assert "baseline started: KISTSchedRunInterval=10; decision due 2027-03-01 11:48" in joined
    assert ("stage 1 (2ms) next: participants vote KISTSchedRunInterval=2 for the consensus of 2027-03-01 12:00"
            in joined)
    assert "stage 1 (2ms) entered: the consensus of 2027-03-01 12:00 carries KISTSchedRunInterval=2; washout" in joined
    assert "relay CPU: FAIL +70.6 % [+36.4 %, +113.3 %] vs limit +25 %" in joined
    assert "relay CPU: INCONCLUSIVE +10.0 % [-10.0 %, +40.0 %] vs limit +25 % (straddles)" in joined
    assert "quiet circuits: ERROR no quiet_circuit_latency_ms samples for the last hour" in joined
    rollback = next(e for e in events if e.kind == "rollback")
    assert rollback.text.startswith("ROLLBACK step-back from stage 1 (2ms) after 'relay CPU' failed: participants "
                                    "vote KISTSchedRunInterval=10 for the consensus of 2027-03-01 17:00")
    # the engine's own planner: two of the six participants moving back is enough (docs/rollouts.md)
    assert dict(rollback.data)["authorities_must_act"] == ["dizum", "dannenberg"]
    fail = next(e for e in events if e.kind == "look" and "FAIL" in e.text)
    assert events.index(fail) < events.index(rollback)  # the look that caused it comes first
    pause = next(e for e in events if e.kind == "pause")
    assert pause.text == ("PAUSED (stepped-back) at baseline (stepped back to baseline); resolve with: "
                          "kistexp promote '/exp dir' | kistexp undo '/exp dir' | kistexp abort '/exp dir'")
    assert "intent done: the consensus of 2027-03-01 12:00 carries KISTSchedRunInterval=2 (moria1, tor26)" in joined
    assert "could not act on dizum yet (attempt 2): HTTP 503: dizum is down" in joined
    assert "authority outage in the round of 2027-03-01 17:00: no vote served by dizum (1 of 9 not voting)" in joined
    assert "consensus of 2027-03-01 12:00: KISTSchedRunInterval=2 (signed by 9 of 9)" in joined
    assert ("metric gap: no prometheus samples for 2027-03-01 14:00 .. 2027-03-01 15:00 (relay_cpu_utilization): "
            "connection refused") in joined
    assert "exposure short at stage 1 (2ms): 40 % of relays run its values, 90 % expected (2 of 6 run it)" in joined
    assert "clients" not in joined  # exposure that is not short is not a line
    assert "clock-jump: wall clock jumped forward 5.0 s" in joined
    assert "command pause (#1) by alice: refused: cannot pause" in joined
    # what notifications carry: the FAIL, the rollback, the pause; not the rest
    assert {e.kind for e in events if e.notify} == {"look", "rollback", "pause"}
    assert state.status.state == "PAUSED" and state.paused_at == T0 + 5 * H + dt.timedelta(minutes=1)


def test_state_carries_over_polls_so_each_change_is_told_once():
    intents = (_intent(1, 1, "moria1", (("KISTSchedRunInterval", 2),), T0, "intended", 0),)
    events, state = feed(CTX, FeedState(), JournalRows(intents=intents))
    assert events == ()  # written with its transition: the transition's line tells it
    acted = (attrs.evolve(intents[0], state="acted", acted=T0 - 12 * dt.timedelta(minutes=1)),)
    events, state = feed(CTX, state, JournalRows(intents=acted))
    assert lines(events) == ["2027-03-01 11:48 intent acted: moria1 set to KISTSchedRunInterval=2 for the "
                             "consensus of 2027-03-01 12:00"]
    events, state = feed(CTX, state, JournalRows(intents=acted))
    assert events == ()  # nothing changed: nothing said
    # an authority down for three rounds is one line when it goes and one when it is back
    said = []
    for i, served in enumerate((False, False, False, True)):
        events, state = feed(CTX, state, JournalRows(votes=(VoteRow("dizum", T0 + i * H, served),)))
        said += lines(events)
    assert said == ["2027-03-01 12:00 authority outage in the round of 2027-03-01 12:00: no vote served by dizum "
                    "(1 of 9 not voting)",
                    "2027-03-01 15:00 voting again in the round of 2027-03-01 15:00: dizum (down since "
                    "2027-03-01 12:00)"]
    # the engine's own health rows (newer schemas) say stale and not-signing too
    events, state = feed(CTX, state, JournalRows(health=(HealthRow(T0 + 4 * H, "tor26", "stale"),)))
    assert "an old vote served (not counted) by tor26" in lines(events)[0]


def test_rounds_without_a_majority_signed_consensus_are_a_stretch_with_a_start_and_an_end():
    state = FeedState()
    said, notified = [], []
    rows = [ConsensusRow(T0 - H, (("KISTSchedRunInterval", 10),), SPEC.authorities),
            ConsensusRow(T0, None, ()), ConsensusRow(T0 + H, None, ()),
            ConsensusRow(T0 + 2 * H, (("KISTSchedRunInterval", 10),), SPEC.authorities[:4]),  # 4 of 9: no majority
            ConsensusRow(T0 + 3 * H, None, ()),
            # the engine's health rows: published and signed by all, parameters read elsewhere
            ConsensusRow(T0 + 4 * H, None, SPEC.authorities, True),
            ConsensusRow(T0 + 4 * H, (("KISTSchedRunInterval", 2),), SPEC.authorities)]
    for r in rows:
        events, state = feed(CTX, state, JournalRows(consensuses=(r,)))
        said += lines(events)
        notified += [e.kind for e in events if e.notify]
    assert said == [
        "2027-03-01 11:00 consensus of 2027-03-01 11:00: KISTSchedRunInterval=10 (signed by 9 of 9)",
        "2027-03-01 12:00 no majority-signed consensus for the round of 2027-03-01 12:00 (none published); last "
        "majority-signed consensus 2027-03-01 11:00",
        # a long outage is told every third round, not every round
        "2027-03-01 14:00 still no majority-signed consensus: round of 2027-03-01 14:00, 3 rounds since 2027-03-01 "
        "12:00 (published but only signed by 4 of 9)",
        "2027-03-01 16:00 majority-signed consensus again for 2027-03-01 16:00 (signed by 9 of 9) after 4 rounds "
        "without one (2027-03-01 12:00 .. 2027-03-01 15:00)",
        # the round's parameters, from the row that has them, after the health row that ended the stretch
        "2027-03-01 16:00 consensus of 2027-03-01 16:00: KISTSchedRunInterval 10 -> 2 (signed by 9 of 9)"]
    assert notified == ["outage"]  # the stretch's start is notified, not every round of it
    # the same round read again (a resumed run looked at it once more) is told once
    events, state = feed(CTX, state, JournalRows(consensuses=(rows[-1],)))
    assert events == ()


def test_reminder_while_paused_says_since_when_why_that_collection_goes_on_and_what_resolves_it():
    paused = StatusRow(1, "k", T0, Status(state="PAUSED", stage=1, values=SPEC.values_of(1),
                                          reasons=frozenset({"gate"}), resume_to="MEASURING"))
    _, state = feed(CTX, FeedState(), JournalRows(statuses=(paused,)))
    _, state = feed(CTX, state, JournalRows(batches=(T0 - H, T0, T0 + H, T0 + H)))  # one was before the pause
    ev = reminder(CTX, state)
    assert ev.text == ("paused since 2027-03-01 12:00 (gate) at stage 1 (2ms); still collecting (3 metric batches "
                       "since); resolve with: kistexp promote '/exp dir' | kistexp abort '/exp dir'")
    resumed = StatusRow(2, "k2", T0 + 2 * H, Status(state="MEASURING", stage=1, values=SPEC.values_of(1),
                                                    decision_at=T0 + 14 * 24 * H))
    events, state = feed(CTX, state, JournalRows(statuses=(resumed,)))
    assert lines(events) == ["2027-03-01 14:00 resumed: stage 1 (2ms) measuring (KISTSchedRunInterval=2); "
                             "decision due 2027-03-15 12:00"]
    assert reminder(CTX, state) is None


def test_an_accelerated_run_shows_seconds():
    from kistexp.dirauth.schedule import AcceleratedSchedule
    from kistexp.rollout.spec import Cadence

    fast = FeedContext("e", spec_from_plan(load_plan(PLAN), Cadence.of(AcceleratedSchedule.scaled(10, 1, 1))))
    assert fast.fmt == "%H:%M:%S" and CTX.fmt == "%Y-%m-%d %H:%M"


# --- the journal tail on a journal being written ----------------------------------------------------

@pytest.fixture
def dry_journal(tmp_path):
    """An experiment directory with the plan, its predictions and a dry run's meta, and the journal's writer."""
    exp = tmp_path / "exp"
    write_predictions(exp, {"baseline": {}}).close()
    (exp / "plan.toml").write_text(Path(PLAN).read_text())
    j = Journal(exp / "experiment.db", durable=False)
    j.set_meta(cadence=json.dumps(attrs.asdict(SPEC.cadence)), start=SPEC.start.isoformat(), mode="dry-run",
               experiment_id="t")
    yield exp, j
    j.close()


def test_the_tail_reads_only_new_rows_sees_intents_change_and_a_rewritten_journal(dry_journal):
    exp, j = dry_journal
    f = Feed(exp, "exp")
    assert f.poll() == ()  # nothing yet
    with j.write() as c:
        c.execute("INSERT INTO rollout_status (event_key, at_us, state, status) VALUES ('a', ?, 'BASELINE', ?)",
                  (int(T0.timestamp() * 1e6), status_to_json(Status(state="BASELINE", values=SPEC.values_of(0)))))
        c.execute("INSERT INTO rollout_transitions (seq, at_us, from_state, to_state, stage, kind, targets, "
                  "valid_after_us, cause) VALUES (1, ?, 'BASELINE', 'TRANSITIONING', 1, 'stage', ?, ?, 'go')",
                  (int(T0.timestamp() * 1e6), json.dumps({"KISTSchedRunInterval": 2}), int((T0 + H).timestamp() * 1e6)))
        c.execute("INSERT INTO rollout_intents (idem_key, transition_seq, authority, desired, valid_after_us, state, "
                  "intended_us) VALUES ('k', 1, 'moria1', ?, ?, 'intended', ?)",
                  (json.dumps({"KISTSchedRunInterval": 2}), int((T0 + H).timestamp() * 1e6),
                   int(T0.timestamp() * 1e6)))
    first = [e.kind for e in f.poll()]
    assert first == ["stage", "transition"]
    assert f.poll() == ()  # read once
    (intent,) = j.intents()
    j.mark_intent(intent["id"], "acted", T0 + dt.timedelta(minutes=1))
    j.vote_seen("moria1", T0 + H, None)
    j.consensus_seen(T0 + H, None, [])
    assert [e.kind for e in f.poll()] == ["intent", "authority", "outage"]
    # a dry run in the same directory starts its journal afresh
    with j.write() as c:
        for table in ("rollout_status", "rollout_intents", "rollout_transitions"):
            c.execute(f"DELETE FROM {table}")
    rows = f.tail.poll()
    assert rows.rewritten
    f.close()


def test_follow_drains_after_stop_reminds_while_paused_and_an_emit_that_fails_ends_only_the_feed(dry_journal):
    exp, j = dry_journal
    with j.write() as c:
        c.execute("INSERT INTO rollout_status (event_key, at_us, state, status) VALUES ('a', ?, 'PAUSED', ?)",
                  (int(T0.timestamp() * 1e6), status_to_json(Status(state="PAUSED", stage=0, values=SPEC.values_of(0),
                                                                    reasons=frozenset({"manual"}),
                                                                    resume_to="BASELINE"))))
    clock = iter(float(i) for i in range(1000))
    got, stop = [], threading.Event()

    def emit(ev):
        got.append(ev)
        if sum(e.kind == "reminder" for e in got) == 2:
            stop.set()

    follow(exp, emit, stop, poll_s=0.01, reminder_s=3, monotonic=lambda: next(clock))
    kinds = [e.kind for e in got]
    assert kinds[0] == "pause" and kinds.count("reminder") == 2
    assert got[-1].text.startswith("paused since 2027-03-01 12:00 (manual) at baseline; no metric batch collected "
                                   "since; resolve with: kistexp resume")

    def broken(_ev):
        raise BrokenPipeError("stdout closed")

    t = FeedThread(Feed(exp), broken, poll_s=0.01).start()
    t.stop(timeout_s=5)
    assert isinstance(t.error, BrokenPipeError) and not t.alive


# --- authority health everywhere: the dry run with five of nine authorities down --------------------

DAY4 = SPEC.baseline_start + 3 * 24 * H  # the five authorities go down here
STAGE1 = SPEC.start  # the consensus stage 1 waits for; the pause follows nine rounds without one


@pytest.fixture(scope="module")
def five_down(tmp_path_factory):
    path = tmp_path_factory.mktemp("down") / "exp"
    dry_run_kist(path, [f"authority={a}:down@day4" for a in FIVE_DOWN])
    return path


def expected_stretch(exp) -> tuple[dt.datetime, dt.datetime]:
    """(first round without a majority-signed consensus, the last one signed before it). An engine that
    records every round's health (rollout_authority_health) saw the outage from day 4's next round; one
    that looks at the consensus only while a transition waits saw it from stage 1's consensus."""
    import sqlite3

    conn = sqlite3.connect(f"file:{exp / 'experiment.db'}?mode=ro", uri=True)
    try:
        every_round = conn.execute("SELECT COUNT(*) FROM rollout_authority_health").fetchone()[0] > 0
    except sqlite3.OperationalError:
        every_round = False
    finally:
        conn.close()
    return (DAY4 + H, DAY4) if every_round else (STAGE1, SPEC.baseline_start)


def test_health_from_the_journal_names_the_stretch_and_who_was_down(five_down):
    import sqlite3

    conn = sqlite3.connect(f"file:{five_down / 'experiment.db'}?mode=ro", uri=True)
    rounds = round_health(conn, SPEC.authorities)
    conn.close()
    (stretch,) = consensus_outages(rounds, SPEC.hour)
    start, last_good = expected_stretch(five_down)
    assert (stretch.start, stretch.end, stretch.last_good) == (start, STAGE1 + 8 * H, last_good)
    assert stretch.ongoing and stretch.rounds == (stretch.end - stretch.start) / H + 1 and stretch.down == FIVE_DOWN
    assert stretch.describe().startswith(f"no majority-signed consensus from {start:%Y-%m-%d %H:%M} to "
                                         "2027-03-01 20:00")
    assert {o.authority for o in authority_outages(rounds, SPEC.hour) if o.ongoing} == set(FIVE_DOWN)


def test_the_engines_own_health_rows_are_read_when_the_schema_has_them(tmp_path):
    import sqlite3

    j = Journal(tmp_path / "experiment.db", durable=False)
    if "rollout_authority_health" not in {r[0] for r in j.conn.execute("SELECT name FROM sqlite_master")}:
        pytest.skip("this schema has no rollout_authority_health")
    us = int(T0.timestamp() * 1e6)
    rows = [(a, 1, 1, "ok") for a in SPEC.authorities[4:8]] + [(a, 0, 0, "down") for a in FIVE_DOWN[:4]]
    rows += [(SPEC.authorities[8], 1, 0, "stale")]
    with j.write() as c:
        c.executemany("INSERT INTO rollout_authority_health (valid_after_us, authority, voted, signed, state) "
                      "VALUES (?, ?, ?, ?, ?)", [(us, *r) for r in rows])
    conn = sqlite3.connect(f"file:{tmp_path / 'experiment.db'}?mode=ro", uri=True)
    (r,) = round_health(conn, SPEC.authorities)
    conn.close()
    j.close()
    # four signers of nine is no majority, though no consensus row was written for the round
    assert r.consensus == "unsigned" and len(r.signed) == 4 and r.stale == ("faravahar",)
    assert set(r.down) == set(FIVE_DOWN[:4]) and (consensus_outages((r,))[0].rounds == 1)


def test_status_history_report_and_rollback_preview_say_there_was_no_majority_signed_consensus(five_down, tmp_path):
    start, _ = expected_stretch(five_down)
    stretch = f"no majority-signed consensus from {start:%Y-%m-%d %H:%M} to 2027-03-01 20:00"
    status = cli("status", str(five_down))
    assert status.exit_code == 0, status.output
    assert f"NOW: {stretch}" in status.output
    assert "4 of 9 voted; no vote from moria1 (down since 2027-03-01 12:00)" in status.output
    data = json.loads(cli("status", str(five_down), "--json").output)
    (o,) = data["authority_health"]["consensus_outages"]
    assert o["ongoing"] and o["down"] == list(FIVE_DOWN)
    history = cli("history", str(five_down))
    assert "no-consensus" in history.output and "authority-down" in history.output
    assert len(json.loads(cli("history", str(five_down), "--json").output)["authority_outages"]) == 5
    preview = cli("rollback", str(five_down), "--dry-run")
    assert "dizum (down since 2027-03-01 12:00), dannenberg (down since 2027-03-01 12:00)" in preview.output
    plans = json.loads(cli("rollback", str(five_down), "--dry-run", "--json").output)
    step_back = next(p for p in plans if p["kind"] == "step-back")
    assert step_back["authorities_must_act"] == ["dizum", "dannenberg"]  # the existing key is unchanged
    assert set(step_back["authorities_down"]) == {"dizum", "dannenberg"}
    assert "without_down" in step_back
    report = cli("report", str(five_down), "-o", str(tmp_path / "r.html"))
    assert report.exit_code == 0, report.output
    page = (tmp_path / "r.html").read_text()
    assert page.count(stretch) == 2  # summary and timeline


def test_the_dry_run_table_has_the_stretch(tmp_path):
    preds = tmp_path / "preds"
    write_predictions(preds, KIST_EFFECTS).close()
    args = [x for a in FIVE_DOWN for x in ("--inject", f"authority={a}:down@day4")]
    out = cli("dry-run", PLAN, "--predictions", str(preds), *args)  # no --dir: a scratch journal
    assert out.exit_code == 0, out.output
    assert "none published (no majority-signed consensus)" in out.output
    assert re.search(r"no majority-signed consensus from 2027-0[23]-\d\d \d\d:00 to 2027-03-01 20:00", out.output)
    data = json.loads(cli("dry-run", PLAN, "--predictions", str(preds), "--dir", str(tmp_path / "e"), *args,
                          "--json").output)
    assert data["authority_health"]["consensus_outages"][0]["down"] == list(FIVE_DOWN)


def test_a_directory_that_is_not_an_experiment_is_one_line(tmp_path):
    from kistexp.errors import KistexpError
    from kistexp.output import error_line

    for argv in (("status", str(tmp_path)), ("status", str(tmp_path), "--watch"), ("history", str(tmp_path)),
                 ("rollback", str(tmp_path), "--dry-run")):
        r = cli(*argv)
        assert r.exit_code == 1 and isinstance(r.exception, KistexpError), (argv, r.exception)
        assert "not an experiment directory" in error_line(r.exception) and "\n" not in error_line(r.exception)


def test_status_watch_ends_at_a_terminal_state_and_refuses_a_silly_interval(tmp_path):
    plan = tmp_path / "tiny.toml"
    plan.write_text(TINY_PLAN)
    preds = tmp_path / "preds"
    write_predictions(preds, {"baseline": {}, "one": {}}).close()
    assert cli("dry-run", str(plan), "--predictions", str(preds), "--dir", str(tmp_path / "e")).exit_code == 0
    r = cli("status", str(tmp_path / "e"), "--watch", "--interval", "0.5")
    assert r.exit_code == 0 and "COMPLETED" in r.output and "authorities, round of" in r.output
    j = cli("status", str(tmp_path / "e"), "--watch", "--json")
    assert j.exit_code == 0 and json.loads(j.output.strip().splitlines()[-1])["state"] == "COMPLETED"
    bad = cli("status", str(tmp_path / "e"), "--watch", "--interval", "0.01")
    assert bad.exit_code == 1 and "between 0.5 and 3600" in str(bad.exception)


TINY_PLAN = short_plan("tiny", {"one": 2}, RELAY_CPU_CRITERION)
assert parse_plan(TINY_PLAN).name == "tiny"


def test_status_watch_piped_prints_a_block_and_ends_quietly_on_ctrl_c(five_down):
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, PYTHONPATH=str(Path.cwd()))
    # Ctrl-C as at a terminal: a suite started in the background (nohup, &) passes SIGINT down ignored
    proc = subprocess.Popen([sys.executable, "-m", "kistexp", "status", str(five_down), "--watch", "--interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"--- {five_down} at ")
        seen = [first]
        while not any(s.startswith("NOW: no majority-signed consensus") for s in seen):
            seen.append(proc.stdout.readline())
        time.sleep(1.5)  # a few refreshes: nothing changed, so no second block
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == ""
    assert "".join(seen + [out]).count(f"--- {five_down} at ") == 1
