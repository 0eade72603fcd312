"""The v3 voting schedule (dirspec-params.md §2.2; voting_schedule.c, dirvote.c).

Times are UTC. Functions accept an aware datetime, a naive datetime (taken as UTC, the way
directory documents write times) or POSIX seconds, and return aware UTC datetimes.
"""

from __future__ import annotations

import datetime as dt

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


def _utc(seconds: int) -> dt.datetime:
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
        if self.vote_delay_s + self.dist_delay_s > self.interval_s // 2:
            return self.interval_s // 4, self.interval_s // 4
        return self.vote_delay_s, self.dist_delay_s

    @property
    def lifetime_s(self) -> int:
        """VU - VA of the consensuses this schedule produces."""
        return self.interval_s * self.n_intervals_valid

    def next_valid_after(self, t: TimeLike) -> dt.datetime:
        """The first interval start strictly after ``t``."""
        return _utc(start_of_interval_after(t, self.interval_s, self.start_offset_s))

    def round_for(self, valid_after: TimeLike) -> VotingRound:
        """The instants of the round producing the consensus valid from ``valid_after``."""
        va = _epoch(valid_after)
        vote, dist = self.effective_delays_s
        return VotingRound(
            valid_after=_utc(va),
            vote_at=_utc(va - dist - vote),
            late_vote_cutoff=_utc(va - dist - vote // 2),
            consensus_at=_utc(va - dist),
            signature_fetch_at=_utc(va - dist // 2),
            publish_at=_utc(va),
            fresh_until=_utc(va + self.interval_s),
            valid_until=_utc(va + self.lifetime_s),
        )

    def next_round(self, t: TimeLike) -> VotingRound:
        """The round whose consensus is the next one to become valid after ``t``."""
        return self.round_for(self.next_valid_after(t))

    def first_round_voting_after(self, t: TimeLike) -> VotingRound:
        """The first round whose votes are built at or after ``t``: a ConsensusParams change
        reloaded at ``t`` first appears in that round's consensus (§1.2)."""
        when = _epoch(t)
        va = start_of_interval_after(when - 1, self.interval_s, self.start_offset_s)
        while True:
            r = self.round_for(va)
            if _epoch(r.vote_at) >= when:
                return r
            va = start_of_interval_after(va, self.interval_s, self.start_offset_s)

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
