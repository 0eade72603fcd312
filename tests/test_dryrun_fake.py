"""Dry runs against embedded fake authorities: the operator API with its token, signed votes and
consensuses read through the directory client, and the fakes' own faults for ``--inject``."""

import datetime as dt

import pytest

from kistexp.plan.loader import parse_plan
from kistexp.rollout.actuators import ActuationError, FakeAuthoritiesActuator
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
            intruder.apply("moria1", {KIST: 2}, "k0")
        auth.actuator.apply("moria1", {KIST: 2}, "k1")
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
