"""Fake authorities on a VirtualClock: voting rounds, fetcher fleet adoption and the directory
client's deadlines all follow simulated time, with no real waiting."""

from __future__ import annotations

import datetime as dt
import time

import httpx
import pytest

from fake_authorities.faults import Fault
from fake_authorities.network import FakeAuthorityNetwork, NetworkError, generate_keys
from kistexp.clock import VirtualClock
from kistexp.directory import DirectoryClient
from kistexp.errors import DirectoryError

START = dt.datetime(2020, 3, 1, 11, 50, tzinfo=dt.timezone.utc)  # long before the wall clock's now
HOUR = 3600
KIST = "KISTSchedRunInterval"


@pytest.fixture(scope="module")
def keys():
    # certificates published at the virtual start, so they are current in simulated time
    return generate_keys(5, (1024, 1024), clock=VirtualClock(START))


def network(keys, clock: VirtualClock, **kw) -> FakeAuthorityNetwork:
    return FakeAuthorityNetwork(count=5, interval_s=HOUR, listen=False, keys=keys, token="t", clock=clock, **kw)


def test_a_day_of_hourly_rounds_in_virtual_time(keys):
    clock = VirtualClock(START)
    net = network(keys, clock).start()
    try:
        t0 = time.monotonic()
        net.set_params("moria1", "KISTSchedRunInterval=2")
        net.set_params("tor26", "KISTSchedRunInterval=2")
        net.set_params("dizum", "KISTSchedRunInterval=2")
        first = net.wait_for_consensus()
        clock.run_until(START + dt.timedelta(hours=24))
        elapsed = time.monotonic() - t0
        assert net.rounds_done == 24  # 12:00 .. next day 11:00: one consensus per simulated hour
        latest = net.latest()
        assert latest is not None
        assert latest.valid_after == (START + dt.timedelta(hours=23, minutes=10)).timestamp()
        assert first.valid_after == (START + dt.timedelta(minutes=10)).timestamp()
        assert dict(latest.params)[KIST] == 2  # three of five voted it: the median
        assert len(latest.signers) == 5
        assert elapsed < 30  # a simulated day costs no real day (real signing only)
    finally:
        net.stop()


def test_down_authority_in_virtual_time_costs_no_real_wait(keys):
    clock = VirtualClock(START)
    net = network(keys, clock).start()
    try:
        net.inject_fault("moria1", Fault("down", mode="hang"))
        t0 = time.monotonic()
        pub = net.wait_for_consensus()
        assert time.monotonic() - t0 < 15
        assert "moria1" not in pub.signers and len(pub.signers) == 4
    finally:
        net.stop()


def test_directory_client_on_the_virtual_clock(keys):
    clock = VirtualClock(START)
    net = network(keys, clock).start()
    try:
        net.wait_for_consensus()
        with DirectoryClient(net.directory_authorities(), transport=net.transport(), retries=0,
                             clock=clock) as c:
            c.fetch_certificates()
            got = c.fetch_consensus("microdesc")
            # certificates are checked at the virtual time (2020), where they are current
            assert got.valid_after == START.replace(minute=0) + dt.timedelta(hours=1)
    finally:
        net.stop()


def test_virtual_network_refuses_sockets(keys):
    with pytest.raises(NetworkError, match="virtual clock"):
        FakeAuthorityNetwork(count=5, interval_s=HOUR, listen=True, port=0, keys=keys, clock=VirtualClock(START))


def test_directory_deadline_runs_on_the_injected_clock(keys):
    """A body that takes 10 s of virtual time per chunk trips a 15 s deadline in virtual time."""
    clock = VirtualClock(START)

    class Slow(httpx.SyncByteStream):
        def __iter__(self):
            for _ in range(5):
                clock.advance(10)
                yield b"network-status-version 3 microdesc\n"

    transport = httpx.MockTransport(lambda req: httpx.Response(200, stream=Slow()))
    t0 = time.monotonic()
    with DirectoryClient(["a=127.0.0.1:9001"], transport=transport, retries=0, timeout_s=15.0,
                         clock=clock) as c:
        with pytest.raises(DirectoryError, match="15 s deadline"):
            c.fetch_once(c.endpoints[0], "/tor/status-vote/current/consensus-microdesc")
    assert time.monotonic() - t0 < 2
    assert clock.monotonic() >= 15  # stopped by the virtual deadline, not by a real one


def test_a_down_authority_cannot_be_reloaded_through_the_operator_api(keys):
    clock = VirtualClock(START)
    net = network(keys, clock).start()
    try:
        net.inject_fault("moria1", Fault("down"))
        url = f"{net.operator_url}/kistexp/operator/authorities"
        with httpx.Client(transport=net.transport(), headers={"Authorization": "Bearer t"}) as c:
            down = c.put(f"{url}/moria1/params", json={"params": "KISTSchedRunInterval=2"})
            up = c.put(f"{url}/tor26/params", json={"params": "KISTSchedRunInterval=2"})
        assert down.status_code == 503 and "moria1 is down" in down.json()["error"]
        assert net.authority("moria1").consensus_params == ()  # unchanged
        assert up.status_code == 200 and net.authority("tor26").consensus_params == ("KISTSchedRunInterval=2",)
    finally:
        net.stop()
