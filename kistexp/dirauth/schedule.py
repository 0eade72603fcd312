"""The v3 voting schedule (dirspec-params.md §2.2; voting_schedule.c, dirvote.c).

Times are UTC. Functions accept an aware datetime, a naive datetime (taken as UTC, the way
directory documents write times) or POSIX seconds, and return aware UTC datetimes.
``RoundTimes.compute`` is the one place a round's instants are derived from its valid-after;
``VotingSchedule`` (a real tor schedule, validated as tor's config check does) and
``AcceleratedSchedule`` (the hourly schedule run faster, for the fake authorities) both use it.
"""

from __future__ import annotations

import datetime as dt
import math

import attrs

from kistexp.errors import KistexpError

DAY_S = 24 * 60 * 60
MIN_INTERVAL_S = 300
MIN_INTERVAL_TESTING_S = 10
MIN_DELAY_S = 2  # dirvote.h MIN_VOTE_SECONDS / MIN_DIST_SECONDS


class ScheduleError(KistexpError):
    """A voting schedule tor would refuse (§2.2 limits)."""


TimeLike = dt.datetime | int | float


def _epoch(t: TimeLike) -> int:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return int(t.timestamp())
    return int(t)


def _utc(seconds: int | float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc)


def start_of_interval_after(now: TimeLike, interval_s: int, offset_s: int = 0) -> int:
    """tor's ``voting_sched_get_start_of_interval_after`` in POSIX seconds (§2.2).

    Intervals are aligned to 00:00 UTC, never cross midnight, and a start that would leave
    less than half an interval before midnight is skipped; ``offset_s`` is
    TestingV3AuthVotingStartOffset. tor's last step (``next - interval > now``) then steps
    back from midnight, so for 7 h the day's starts are 00, 07, 14, 17: the short interval
    comes before the last full one.
    """
    t = _epoch(now)
    midnight_today = t - t % DAY_S
    midnight_tomorrow = midnight_today + DAY_S
    nxt = midnight_today + ((t - midnight_today) // interval_s + 1) * interval_s
    if nxt > midnight_tomorrow:
        nxt = midnight_tomorrow
    if nxt + interval_s // 2 > midnight_tomorrow:
        nxt = midnight_tomorrow
    nxt += offset_s
    if nxt - interval_s > t:
        nxt -= interval_s
    return nxt


Seconds = int | float


def effective_delays(interval_s: Seconds, vote_delay_s: Seconds, dist_delay_s: Seconds) -> tuple[Seconds, Seconds]:
    """(vote, dist) after tor's rule: both become Interval/4 if their sum exceeds Interval/2 (§2.2).

    Whole seconds (a real schedule) use tor's integer division; an accelerated schedule's
    fractional delays are scaled exactly.
    """
    exact = isinstance(vote_delay_s, float) or isinstance(dist_delay_s, float)
    half, quarter = (interval_s / 2, interval_s / 4) if exact else (interval_s // 2, interval_s // 4)
    if vote_delay_s + dist_delay_s > half:
        return quarter, quarter
    return vote_delay_s, dist_delay_s


def first_valid_after_voting_from(when: Seconds, interval_s: int, lead_s: Seconds, offset_s: int = 0) -> int:
    """The valid-after of the first round whose vote is built (VA - ``lead_s``, with ``lead_s`` =
    Vote + Dist) at or after ``when`` (POSIX seconds, §2.2)."""
    va = start_of_interval_after(math.ceil(when) - 1, interval_s, offset_s)
    while va - lead_s < when:
        va = start_of_interval_after(va, interval_s, offset_s)
    return va


@attrs.frozen
class RoundTimes:
    """The instants of one voting round in POSIX seconds (§2.2; voting_schedule.c
    ``dirauth_sched_recalculate_timing``). ``VotingRound`` is the same as datetimes."""

    valid_after: Seconds
    vote_at: Seconds  # VA - Dist - Vote: build own vote, POST it
    late_vote_cutoff: Seconds  # VA - Dist - Vote/2: fetch missing votes; later uploads refused
    consensus_at: Seconds  # VA - Dist: compute consensus, POST detached signatures
    signature_fetch_at: Seconds  # VA - Dist/2: fetch missing signatures
    publish_at: Seconds  # VA: publish if enough signatures
    fresh_until: Seconds
    valid_until: Seconds

    @classmethod
    def compute(cls, valid_after: Seconds, interval_s: Seconds, vote_delay_s: Seconds, dist_delay_s: Seconds,
                n_intervals_valid: int) -> RoundTimes:
        """The round ending at ``valid_after``; the delays are the effective ones (``effective_delays``).
        Whole seconds halve as tor does (integer division), fractional ones exactly."""
        vote, dist = vote_delay_s, dist_delay_s
        exact = isinstance(vote, float) or isinstance(dist, float)
        half_vote, half_dist = (vote / 2, dist / 2) if exact else (vote // 2, dist // 2)
        return cls(
            valid_after=valid_after,
            vote_at=valid_after - dist - vote,
            late_vote_cutoff=valid_after - dist - half_vote,
            consensus_at=valid_after - dist,
            signature_fetch_at=valid_after - half_dist,
            publish_at=valid_after,
            fresh_until=valid_after + interval_s,
            valid_until=valid_after + interval_s * n_intervals_valid,
        )


@attrs.frozen
class VotingRound:
    """The instants of one voting round ending in a consensus valid from ``valid_after`` (§2.2)."""

    valid_after: dt.datetime
    vote_at: dt.datetime  # VA - Dist - Vote: build own vote, POST it
    late_vote_cutoff: dt.datetime  # VA - Dist - Vote/2: fetch missing votes; later uploads refused
    consensus_at: dt.datetime  # VA - Dist: compute consensus, POST detached signatures
    signature_fetch_at: dt.datetime  # VA - Dist/2: fetch missing signatures
    publish_at: dt.datetime  # VA: publish if enough signatures
    fresh_until: dt.datetime
    valid_until: dt.datetime

    @classmethod
    def of(cls, times: RoundTimes) -> VotingRound:
        return cls(*(_utc(t) for t in attrs.astuple(times)))


@attrs.frozen
class VotingSchedule:
    """V3AuthVotingInterval / VoteDelay / DistDelay / NIntervalsValid (+ start offset).

    Construction validates the values as an authority's config check does (§2.2 table) and
    raises ScheduleError. ``from_consensus`` instead takes the timings other authorities put
    in the live consensus, where tor applies the Interval/4 rule rather than refusing.
    """

    interval_s: int = 3600
    vote_delay_s: int = 300
    dist_delay_s: int = 300
    n_intervals_valid: int = 3
    start_offset_s: int = 0
    testing_network: bool = False
    lenient: bool = attrs.field(default=False, repr=False)

    def __attrs_post_init__(self) -> None:
        for name in ("interval_s", "vote_delay_s", "dist_delay_s", "n_intervals_valid", "start_offset_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ScheduleError(f"voting schedule: {name} must be an integer number, got {value!r}")
        floor_s = MIN_INTERVAL_TESTING_S if self.testing_network else MIN_INTERVAL_S
        if self.interval_s < floor_s:
            where = "in a testing network" if self.testing_network else "(TestingTorNetwork allows 10 s)"
            raise ScheduleError(
                f"voting schedule: V3AuthVotingInterval {self.interval_s} s is below {floor_s} s {where}"
            )
        if self.interval_s > DAY_S:
            raise ScheduleError(f"voting schedule: V3AuthVotingInterval {self.interval_s} s exceeds 24 h")
        if self.vote_delay_s < MIN_DELAY_S or self.dist_delay_s < MIN_DELAY_S:
            raise ScheduleError(
                f"voting schedule: V3AuthVoteDelay {self.vote_delay_s} s and V3AuthDistDelay "
                f"{self.dist_delay_s} s must each be >= {MIN_DELAY_S} s"
            )
        if self.n_intervals_valid < 2:
            raise ScheduleError(f"voting schedule: V3AuthNIntervalsValid {self.n_intervals_valid} is below 2")
        if not self.lenient and self.vote_delay_s + self.dist_delay_s >= self.interval_s // 2:
            raise ScheduleError(
                f"voting schedule: V3AuthVoteDelay + V3AuthDistDelay = "
                f"{self.vote_delay_s + self.dist_delay_s} s must be less than half of "
                f"V3AuthVotingInterval {self.interval_s} s"
            )

    @classmethod
    def testing(cls, interval_s: int = 10, vote_delay_s: int = 2, dist_delay_s: int = 2,
                n_intervals_valid: int = 2) -> VotingSchedule:
        """A TestingTorNetwork schedule; the defaults are the local network's (real-tor.md)."""
        return cls(interval_s, vote_delay_s, dist_delay_s, n_intervals_valid, testing_network=True)

    @classmethod
    def from_consensus(cls, valid_after: TimeLike, fresh_until: TimeLike, valid_until: TimeLike,
                       vote_delay_s: int, dist_delay_s: int) -> VotingSchedule:
        """The schedule authorities derive from a live consensus (FU - VA, ``voting-delay``)."""
        va, fu, vu = _epoch(valid_after), _epoch(fresh_until), _epoch(valid_until)
        interval = fu - va
        if interval <= 0 or vu <= fu:
            raise ScheduleError(
                f"consensus times are not increasing: valid-after {_utc(va)}, fresh-until {_utc(fu)}, "
                f"valid-until {_utc(vu)}"
            )
        return cls(
            interval,
            vote_delay_s,
            dist_delay_s,
            max(2, (vu - va) // interval),
            testing_network=interval < MIN_INTERVAL_S,
            lenient=True,
        )

    @property
    def effective_delays_s(self) -> tuple[int, int]:
        """(vote, dist) after tor's rule: both become Interval/4 if their sum exceeds Interval/2."""
        return effective_delays(self.interval_s, self.vote_delay_s, self.dist_delay_s)

    @property
    def lifetime_s(self) -> int:
        """VU - VA of the consensuses this schedule produces."""
        return self.interval_s * self.n_intervals_valid

    def next_valid_after(self, t: TimeLike) -> dt.datetime:
        """The first interval start strictly after ``t``."""
        return _utc(start_of_interval_after(t, self.interval_s, self.start_offset_s))

    def round_for(self, valid_after: TimeLike) -> VotingRound:
        """The instants of the round producing the consensus valid from ``valid_after``."""
        times = RoundTimes.compute(_epoch(valid_after), self.interval_s, *self.effective_delays_s,
                                   self.n_intervals_valid)
        return VotingRound.of(times)

    def next_round(self, t: TimeLike) -> VotingRound:
        """The round whose consensus is the next one to become valid after ``t``."""
        return self.round_for(self.next_valid_after(t))

    def first_round_valid_from(self, t: TimeLike) -> VotingRound:
        """The round of the first consensus valid at or after ``t`` (an interval start >= ``t``)."""
        return self.round_for(start_of_interval_after(_epoch(t) - 1, self.interval_s, self.start_offset_s))

    def first_round_voting_after(self, t: TimeLike) -> VotingRound:
        """The first round whose votes are built at or after ``t``: a ConsensusParams change
        reloaded at ``t`` first appears in that round's consensus (§1.2)."""
        va = first_valid_after_voting_from(_epoch(t), self.interval_s, sum(self.effective_delays_s),
                                           self.start_offset_s)
        return self.round_for(va)

    def rounds(self, start: TimeLike, end: TimeLike) -> list[VotingRound]:
        """Every round with ``start < valid_after <= end``, in order."""
        out: list[VotingRound] = []
        t, stop = _epoch(start), _epoch(end)
        while True:
            va = start_of_interval_after(t, self.interval_s, self.start_offset_s)
            if va > stop:
                return out
            out.append(self.round_for(va))
            t = va


LIVE_INTERVAL_S = 3600
LIVE_DELAY_S = 300  # V3AuthVoteDelay / V3AuthDistDelay defaults


@attrs.frozen
class AcceleratedSchedule:
    """The hourly schedule run faster, as the fake authorities vote (§2.2, every time scaled).

    One "hour" lasts ``interval_s`` real seconds; the vote and distribution delays default to
    the live 300 s scaled the same way, and tor's Interval/4 rule applies. Rounds are aligned
    like tor's (``start_of_interval_after``) and their instants come from ``RoundTimes.compute``
    as for a ``VotingSchedule``; only the limits differ: the interval may be as short as 2 s
    and the delays fractions of a second, which tor (and ``VotingSchedule``) would refuse.
    Instants are POSIX seconds (floats).
    """

    interval_s: int
    vote_delay_s: float
    dist_delay_s: float
    n_intervals_valid: int = 3

    @classmethod
    def scaled(cls, interval_s: int, vote_delay_s: float | None = None, dist_delay_s: float | None = None,
               n_intervals_valid: int = 3) -> AcceleratedSchedule:
        """``interval_s`` real seconds per hour; delays in real seconds (default: 300 s scaled)."""
        if isinstance(interval_s, bool) or not isinstance(interval_s, int) or interval_s < 2:
            raise ScheduleError(f"interval must be a whole number of seconds >= 2, got {interval_s!r}")
        scaled_delay = interval_s * LIVE_DELAY_S / LIVE_INTERVAL_S
        vote = float(vote_delay_s) if vote_delay_s is not None else scaled_delay
        dist = float(dist_delay_s) if dist_delay_s is not None else scaled_delay
        if vote <= 0 or dist <= 0:
            raise ScheduleError("vote and distribution delays must be positive")
        vote, dist = effective_delays(interval_s, vote, dist)
        return cls(interval_s, vote, dist, n_intervals_valid)

    @property
    def scale(self) -> float:
        """Real seconds per second of the hourly network."""
        return self.interval_s / LIVE_INTERVAL_S

    def round_for(self, valid_after: float) -> RoundTimes:
        return RoundTimes.compute(valid_after, self.interval_s, self.vote_delay_s, self.dist_delay_s,
                                  self.n_intervals_valid)

    def next_round(self, now: float) -> RoundTimes:
        """The first round whose vote is still to be built at ``now``."""
        return self.round_for(first_valid_after_voting_from(now, self.interval_s,
                                                            self.vote_delay_s + self.dist_delay_s))

    def voting_delay_line(self) -> tuple[int, int]:
        """Whole seconds for the documents' ``voting-delay`` line: at least tor's MIN_VOTE_SECONDS
        and MIN_DIST_SECONDS (2 s), below which tor refuses to parse the document (§2.2)."""
        return max(MIN_DELAY_S, round(self.vote_delay_s)), max(MIN_DELAY_S, round(self.dist_delay_s))
