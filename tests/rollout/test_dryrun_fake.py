"""Dry runs against embedded fake authorities: the operator API with its token, signed votes and
consensuses read through the directory client, and the fakes' own faults for ``--inject``."""

import datetime as dt

import pytest

from kistexp.plan.loader import parse_plan
from kistexp.rollout.actuators import ActuationError, FakeAuthoritiesActuator, Intent
from kistexp.rollout.dryrun import dry_run, initial_configs
from kistexp.rollout.journal import Journal
from kistexp.rollout.rehearsal import EmbeddedAuthorities, rehearsal_clock
from kistexp.rollout.spec import spec_from_plan
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import write_predictions

SHORT_PLAN = VALID_PLAN.replace('duration = "7d"', 'duration = "2d"').replace('duration = "14d"', 'duration = "2d"')
SHORT_EFFECTS = {"baseline": {}, "two": {"client_ttlb_1mib_s": -0.04}, "eight": {"client_ttlb_1mib_s": -0.02}}
KIST = "KISTSchedRunInterval"
NINE = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg", "maatuska", "longclaw", "bastet", "faravahar"]


def test_embedded_authorities_act_through_the_operator_api_and_show_it_in_signed_votes():
    spec = spec_from_plan(parse_plan(SHORT_PLAN))
    clock = rehearsal_clock(spec)
    with EmbeddedAuthorities(spec, clock, initial_configs(spec), spec.start) as auth:
        clock.run_until(spec.baseline_start + dt.timedelta(minutes=2))
        params, signers = auth.history.fetch_consensus(spec.baseline_start)
        assert params == {KIST: 10} and sorted(signers) == sorted(NINE)  # published and verified
        assert auth.actuator.current("moria1") == {KIST: 10}
        # the operator API is token-protected in-process as on a socket
        intruder = FakeAuthoritiesActuator(auth.net.operator_url, "not-the-token", auth.directory, clock,
                                           transport=auth.net.transport())
        with pytest.raises(ActuationError, match="HTTP 401"):
            intruder.apply(Intent("moria1", {KIST: 2}, "k0"))
        auth.actuator.apply(Intent("moria1", {KIST: 2}, "k1"))
        va = spec.baseline_start + dt.timedelta(hours=1)
        clock.run_until(va - dt.timedelta(minutes=5))  # after the 10-minutes-before vote
        assert auth.actuator.fetch_vote("moria1", va) == {KIST: 2}  # next/authority, signature checked
        assert auth.actuator.fetch_vote("tor26", va) == {KIST: 10}
        clock.run_until(va + dt.timedelta(minutes=2))
        # one of nine moved: the consensus keeps the low median, 10
        assert auth.actuator.fetch_consensus(va)[0] == {KIST: 10}
        assert auth.actuator.fetch_vote("moria1", va) == {KIST: 2}  # current/authority after VA


@pytest.mark.slow
def test_a_stale_authority_is_refused_by_the_others_and_the_rollout_goes_on(tmp_path):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    plan = parse_plan(SHORT_PLAN)
    r = dry_run(plan, tmp_path / "e", injections=["authority=moria1:stale@day2"])
    assert r.final_state == "COMPLETED"
    assert [c["params"][KIST] for c in r.consensus_changes] == [10, 2, 8]
    j = Journal(tmp_path / "e" / "experiment.db", durable=False)
    stale_from = spec_from_plan(plan).baseline_start + dt.timedelta(days=1)
    later = [c for c in j.consensuses() if c["valid_after"] > stale_from + dt.timedelta(hours=1)]
    assert later and all("moria1" not in c["signers"] and len(c["signers"]) == 8 for c in later)
    # the engine fetched moria1's vote at each transition: it only ever served the old one
    assert {v["params"] is None for v in j.votes() if v["authority"] == "moria1"} == {True}
    assert all(v["params"] is not None for v in j.votes() if v["authority"] == "tor26")
    j.close()


def test_scripted_commands_act_at_their_time_and_a_later_resume_lifts_the_pause(tmp_path):
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    plan = parse_plan(SHORT_PLAN)
    spec = spec_from_plan(plan)
    r = dry_run(plan, tmp_path / "e", commands=["stage1+3h:pause", "stage1+20h:resume",
                                                 "stage2+2h:abort=step-back"])
    by = {d["decision"]: d for d in r.decisions}
    stage2 = spec.start + spec.stages[0].duration
    # each command acts at the hour the operator would have typed it, not at the engine's next event
    assert by["pause:manual"]["at"] == spec.start + dt.timedelta(hours=3)
    assert by["resume"]["at"] == spec.start + dt.timedelta(hours=20)
    assert by["rollback:step-back"]["at"] == stage2 + dt.timedelta(hours=2)
    assert "dry-run --command stage2+2h:abort=step-back" in by["rollback:step-back"]["message"]
    # the step-back reached the consensus: 10 (baseline), 2 (stage 1), 8 (stage 2), back to 2
    assert [c["params"][KIST] for c in r.consensus_changes] == [10, 2, 8, 2]
    assert r.rollbacks and r.rollbacks[0]["kind"] == "step-back"


@pytest.mark.parametrize("option, message", [
    ("day1+2h", "expected WHEN:COMMAND"),
    ("day1:reboot", "command must be one of pause, resume, promote, abort, retry, undo"),
    ("day1:abort=sideways", "abort takes a rollback kind"),
    ("day1:pause=full", "pause takes freeze, not 'full'"),
    ("day0:pause", "days count from day1"),
    ("stage9:pause", "the plan has stages 1..2"),
])
def test_a_malformed_command_is_one_line_naming_it(tmp_path, option, message):
    from kistexp.rollout.dryrun import InjectionError, parse_command

    spec = spec_from_plan(parse_plan(SHORT_PLAN))
    with pytest.raises(InjectionError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        parse_command(option, spec)
    assert "\n" not in str(e.value) and option in str(e.value)


def test_a_bad_command_time_names_the_command_option():
    from kistexp.rollout.dryrun import InjectionError, parse_command

    with pytest.raises(InjectionError) as e:
        parse_command("day0:pause", spec_from_plan(parse_plan(SHORT_PLAN)))
    assert str(e.value).startswith("--command 'day0:pause': days count from day1")
