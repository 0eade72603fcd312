"""The v3 voting schedule (dirspec-params.md §2.2)."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from kistexp.dirauth.schedule import (
    AcceleratedSchedule,
    RoundTimes,
    ScheduleError,
    VotingSchedule,
    start_of_interval_after,
)
from kistexp.errors import KistexpError

UTC = dt.timezone.utc


def at(h: int, m: int = 0, s: int = 0, day: int = 1) -> dt.datetime:
    return dt.datetime(2024, 1, day, h, m, s, tzinfo=UTC)


def test_hourly_round_matches_the_spec_table():
    sched = VotingSchedule()
    r = sched.next_round(at(11, 42, 7))
    assert r.valid_after == at(12)
    assert r.vote_at == at(11, 50)
    assert r.late_vote_cutoff == at(11, 52, 30)
    assert r.consensus_at == at(11, 55)
    assert r.signature_fetch_at == at(11, 57, 30)
    assert r.publish_at == at(12)
    assert r.fresh_until == at(13)
    assert r.valid_until == at(15)


def test_next_valid_after_is_strictly_after():
    sched = VotingSchedule()
    assert sched.next_valid_after(at(12)) == at(13)
    assert sched.next_valid_after(at(11, 59, 59)) == at(12)
    # naive datetimes are UTC (as in directory documents), POSIX seconds too
    assert sched.next_valid_after(dt.datetime(2024, 1, 1, 12, 30)) == at(13)
    assert sched.next_valid_after(int(at(12, 30).timestamp())) == at(13)


def test_last_interval_of_the_day_and_midnight():
    # 7 h does not divide 24 h: 21:00 would leave 3 h < 3.5 h before midnight, so it is not
    # an interval start; tor's final "next - interval > now" step then makes the day
    # 00, 07, 14, 17 (= midnight - 7 h), 00: the short interval is 14:00-17:00.
    seven = VotingSchedule(interval_s=7 * 3600)
    assert seven.next_valid_after(at(6)) == at(7)
    assert seven.next_valid_after(at(14, 30)) == at(17)
    assert seven.next_valid_after(at(17)) == at(0, day=2)
    assert seven.next_valid_after(at(23, 59)) == at(0, day=2)
    assert [r.valid_after.hour for r in seven.rounds(at(0), at(23, 59))] == [7, 14, 17]
    # 5 h: 20:00 leaves 4 h >= 2.5 h, kept; the interval never crosses midnight
    five = VotingSchedule(interval_s=5 * 3600)
    assert five.next_valid_after(at(19)) == at(20)
    assert five.next_valid_after(at(21)) == at(0, day=2)


def test_start_offset():
    sched = VotingSchedule(start_offset_s=600)
    assert sched.next_valid_after(at(11, 55)) == at(12, 10)
    assert sched.next_valid_after(at(12, 5)) == at(12, 10)
    assert sched.next_valid_after(at(12, 10)) == at(13, 10)
    assert start_of_interval_after(at(12, 5), 3600, 600) == int(at(12, 10).timestamp())


def test_testing_network_ten_seconds():
    sched = VotingSchedule.testing()  # the local network: 10 s, 2 s, 2 s, 2 intervals valid
    r = sched.next_round(at(12, 0, 3))
    assert r.valid_after == at(12, 0, 10)
    assert (r.vote_at, r.late_vote_cutoff, r.consensus_at, r.signature_fetch_at) == (
        at(12, 0, 6),
        at(12, 0, 7),
        at(12, 0, 8),
        at(12, 0, 9),
    )
    assert r.fresh_until == at(12, 0, 20) and r.valid_until == at(12, 0, 30)
    assert [x.valid_after for x in sched.rounds(at(12), at(12, 0, 30))] == [
        at(12, 0, 10),
        at(12, 0, 20),
        at(12, 0, 30),
    ]


def test_interval_quarter_rule_from_a_consensus():
    # a live consensus whose voting-delay is too long for its interval: both become I/4
    sched = VotingSchedule.from_consensus(at(12), at(12, 0, 10), at(12, 0, 30), 5, 5)
    assert (sched.interval_s, sched.n_intervals_valid) == (10, 3)
    assert sched.effective_delays_s == (2, 2)
    hourly = VotingSchedule.from_consensus(at(12), at(13), at(15), 300, 300)
    assert hourly.effective_delays_s == (300, 300) and hourly.lifetime_s == 3 * 3600
    with pytest.raises(ScheduleError, match="not increasing"):
        VotingSchedule.from_consensus(at(13), at(12), at(15), 300, 300)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_s": 299}, "below 300 s"),
        ({"interval_s": 9, "vote_delay_s": 2, "dist_delay_s": 2, "testing_network": True}, "below 10 s"),
        ({"interval_s": 25 * 3600}, "exceeds 24 h"),
        ({"vote_delay_s": 1}, ">= 2 s"),
        ({"n_intervals_valid": 1}, "below 2"),
        ({"interval_s": 600, "vote_delay_s": 150, "dist_delay_s": 150}, "less than half"),
        ({"interval_s": 3600.5}, "integer"),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ScheduleError, match=message) as info:
        VotingSchedule(**kwargs)
    assert isinstance(info.value, KistexpError)
    assert "\n" not in str(info.value)


def test_testing_network_allows_short_intervals_only_when_set():
    assert VotingSchedule(interval_s=300, vote_delay_s=20, dist_delay_s=20).interval_s == 300
    fast = VotingSchedule(interval_s=10, vote_delay_s=2, dist_delay_s=2, testing_network=True)
    assert fast.interval_s == 10
    with pytest.raises(ScheduleError, match="TestingTorNetwork"):
        VotingSchedule(interval_s=10, vote_delay_s=2, dist_delay_s=2)


def test_first_round_voting_after_a_config_change():
    sched = VotingSchedule()
    assert sched.first_round_voting_after(at(11, 49)).valid_after == at(12)
    assert sched.first_round_voting_after(at(11, 50)).valid_after == at(12)  # vote built at 11:50
    assert sched.first_round_voting_after(at(11, 50, 1)).valid_after == at(13)
    assert sched.first_round_voting_after(at(12)).valid_after == at(13)
    fast = VotingSchedule.testing()
    assert fast.first_round_voting_after(at(12, 0, 7)).valid_after == at(12, 0, 20)


def test_first_round_valid_from_a_stage_start():
    sched = VotingSchedule()
    assert sched.first_round_valid_from(at(12)).valid_after == at(12)  # a start on the hour is that round
    assert sched.first_round_valid_from(at(12, 0, 1)).valid_after == at(13)


def test_accelerated_schedule_shares_the_round_arithmetic():
    # An accelerated schedule with the live numbers gives the live round, instant for instant.
    live = VotingSchedule()
    same = AcceleratedSchedule.scaled(3600)
    assert same.voting_delay_line() == (300, 300) and same.scale == 1.0
    va = at(12).timestamp()
    assert same.round_for(va) == RoundTimes(*(t.timestamp() for t in attrs.astuple(live.round_for(at(12)))))
    assert same.next_round(at(11, 50).timestamp()).valid_after == va  # vote built exactly now
    assert same.next_round(at(11, 50, 1).timestamp()).valid_after == at(13).timestamp()
    # 10 s = one hour: 300 s delays become 0.83 s; fractional delays halve exactly.
    fast = AcceleratedSchedule.scaled(10)
    r = fast.next_round(at(12).timestamp() - 1.7)  # its vote is built at VA - 1.67 s
    assert r.valid_after == at(12).timestamp()
    assert r.late_vote_cutoff == pytest.approx(r.valid_after - 10 / 12 - 10 / 24)
    assert r.valid_until == r.valid_after + 30
    with pytest.raises(ScheduleError, match="whole number of seconds >= 2"):
        AcceleratedSchedule.scaled(1)
    with pytest.raises(ScheduleError, match="must be positive"):
        AcceleratedSchedule.scaled(10, 0.0, 1.0)

