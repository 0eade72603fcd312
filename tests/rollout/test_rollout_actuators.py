"""Actuators: fake authorities' operator API verified through their DirPorts; operator instructions."""

import datetime as dt

import pytest

from fake_authorities import FakeAuthorityNetwork
from fake_authorities.network import generate_keys
from kistexp.clock import UTC, RealClock
from kistexp.directory import DirectoryClient
from kistexp.rollout.actuators import FakeAuthoritiesActuator, InstructionsActuator, Intent, render_instructions
from kistexp.rollout.spec import LIVE_CADENCE

KIST = "KISTSchedRunInterval"


@pytest.mark.slow
def test_fake_authorities_actuator_acts_and_observes_through_dirports():
    net = FakeAuthorityNetwork(count=5, interval_s=4, port=0, listen=False, token="tok",
                               keys=generate_keys(5, (1024, 1024)), vote_delay_s=0.6, dist_delay_s=0.6,
                               initial_params={KIST: 10})
    net.start()
    try:
        first = net.wait_for_consensus(timeout_s=16)
        client = DirectoryClient(net.directory_authorities(), transport=net.transport(), retries=0)
        act = FakeAuthoritiesActuator(net.operator_url, "tok", client, RealClock(), transport=net.transport())
        assert act.current("moria1") == {KIST: 10}
        for name in ("moria1", "tor26", "dizum"):
            assert "set" in act.apply(Intent(name, {KIST: 2}, f"test:1:{name}"))
        assert act.current("moria1") == {KIST: 2}
        pub = net.wait_for_consensus(lambda c: dict(c.params).get(KIST) == 2, after=first.valid_after,
                                     timeout_s=16)
        va = dt.datetime.fromtimestamp(pub.valid_after, tz=UTC)
        params, signers = act.fetch_consensus(va)
        assert params == {KIST: 2} and len(signers) == 5
        assert act.fetch_vote("moria1", va) == {KIST: 2}  # AuthDirMaxServersPerAddr, tor's own key, left out
        assert act.fetch_vote("dannenberg", va) == {KIST: 10}
        wrong = FakeAuthoritiesActuator(net.operator_url, "nope", client, RealClock(), transport=net.transport())
        assert wrong.current("moria1") is None  # 401: the token is checked
    finally:
        net.stop()


def test_instructions_name_the_line_the_window_and_the_diff(tmp_path):
    va = dt.datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
    text = render_instructions("kist-run-interval-2020", "stage 1 (2ms)", "moria1", {KIST: 2}, va, LIVE_CADENCE,
                               {KIST: 10, "AuthDirMaxServersPerAddr": 2})
    assert "    ConsensusParams KISTSchedRunInterval=2\n" in text
    assert "your vote lists KISTSchedRunInterval=10; replace it with 2" in text
    # the window for the 12:00 consensus: after 10:50, before 11:50 UTC (§2.1)
    assert "after 2027-03-01 10:50 UTC and before 2027-03-01 11:50 UTC" in text
    assert "set before 2027-03-01 11:50 UTC" in text
    act = InstructionsActuator(tmp_path / "outbox", "p", LIVE_CADENCE, None, RealClock())
    act.observer.fetch_vote = lambda a, t: None
    key = "exp:1:moria1:20270301T120000:abcd"
    first = act.apply(Intent("moria1", {KIST: 2}, key, va, 1))
    again = act.apply(Intent("moria1", {KIST: 2}, key, va, 1))
    assert "written" in first and "already" in again
    assert len(list((tmp_path / "outbox").iterdir())) == 1


def test_local_network_authorities_map_by_nickname_else_by_position_and_counts_must_agree():
    from kistexp.rollout.actuator_local import authority_names, local_cadence
    from kistexp.rollout.spec import RolloutError

    local = ("auth000", "auth001", "auth002")
    assert authority_names(("auth002", "auth000", "auth001"), local, "net") == {n: n for n in local}
    assert authority_names(("moria1", "tor26", "dizum"), local, "net") == dict(
        zip(("moria1", "tor26", "dizum"), local, strict=True))
    with pytest.raises(RolloutError, match=r"net: the plan configures 9 authorities, the local network 3 "
                                           r"\(auth000, auth001, auth002\)"):
        authority_names(tuple(f"a{i}" for i in range(9)), local, "net")
    # tor's 10 s testing schedule: votes at VA-4 s; the engine acts by VA-6.5 s and no earlier than VA-14 s
    c = local_cadence(10, 2)
    va = dt.datetime(2026, 12, 1, 12, 0, 10, tzinfo=UTC)
    assert (c.lead_s, c.n_valid) == (4.0, 2)
    assert c.deadline(va) == va - dt.timedelta(seconds=6.5)
    assert c.window_opens(va) == va - dt.timedelta(seconds=14)
    assert c.next_feasible_va(va - dt.timedelta(seconds=7)) == va
    assert c.next_feasible_va(va - dt.timedelta(seconds=6)) == va + dt.timedelta(seconds=10)
