"""Trigger objects computing fire times, shared by the live and the virtual driver (rollout.md §2.4, §2.5).

Every trigger answers APScheduler 3's ``get_next_fire_time(previous_fire_time, now)``
(aware datetime, or None when exhausted). Date and Interval triggers are APScheduler's own,
always built with an explicit UTC start and no jitter so no constructor reads the wall clock;
``TorScheduleTrigger`` reproduces tor's round instants (§2.1). Co-due triggers run in
(time, class, stage, name) order (§2.6).
"""

from __future__ import annotations

import datetime as dt

import attrs
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from kistexp.clock import UTC
from kistexp.rollout.spec import Cadence

# classes in processing order for co-due events (§2.6)
COMMANDS, CONSENSUS_CHECK, VOTE_CHECK, COLLECT, EVALUATE, WASHOUT_END, DECISION_DUE, ACT = range(8)
START = COMMANDS  # the baseline's start sorts first, nothing else is due then

PHASES = ("votes", "publish", "deadline", "window")


class TorScheduleTrigger(BaseTrigger):
    """An instant of tor's voting rounds: ``votes`` = voting_starts + δ (vote_check), ``publish`` =
    VA + δ (consensus_check), ``deadline`` = VA - (Vote+Dist) - margin (act at the latest), ``window``
    = VA - interval - (Vote+Dist) (act at the earliest, §2.1). With ``valid_after`` it fires once,
    for that round; otherwise every round."""

    __slots__ = ("cadence", "phase", "valid_after")

    def __init__(self, cadence: Cadence, phase: str, valid_after: dt.datetime | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        self.cadence, self.phase, self.valid_after = cadence, phase, valid_after

    def fire_time(self, va: dt.datetime) -> dt.datetime:
        c = self.cadence
        if self.phase == "votes":
            return dt.datetime.fromtimestamp(c.round(va).vote_at, tz=UTC) + dt.timedelta(seconds=c.check_delay_s)
        if self.phase == "publish":
            return va + dt.timedelta(seconds=c.check_delay_s)
        if self.phase == "deadline":
            return c.deadline(va)
        return c.window_opens(va)

    def get_next_fire_time(self, previous_fire_time: dt.datetime | None, now: dt.datetime) -> dt.datetime | None:
        if self.valid_after is not None:
            t = self.fire_time(self.valid_after)
            return t if previous_fire_time is None or previous_fire_time < t else None
        after = previous_fire_time if previous_fire_time is not None else now - dt.timedelta(microseconds=1)
        va = self.cadence.va_at_or_after(after - dt.timedelta(seconds=self.cadence.interval_s))
        while self.fire_time(va) <= after:
            va = self.cadence.next_va(va)
        return self.fire_time(va)

    def __str__(self) -> str:
        return f"tor-schedule[{self.phase}{'' if self.valid_after is None else f' {self.valid_after:%H:%M:%S}'}]"


def date_trigger(t: dt.datetime) -> DateTrigger:
    return DateTrigger(run_date=t, timezone=UTC)


def interval_trigger(every: dt.timedelta, start: dt.datetime) -> IntervalTrigger:
    return IntervalTrigger(seconds=every.total_seconds(), start_date=start, timezone=UTC, jitter=None)


@attrs.frozen
class NamedTrigger:
    """One trigger of the engine: ``name`` is its journal identity (the event key adds the time)."""

    name: str
    klass: int
    stage: int
    trigger: BaseTrigger = attrs.field(eq=False)
    anchor: dt.datetime | None = None  # a first run is computed from here, not from now

    def next_fire(self, previous: dt.datetime | None, now: dt.datetime) -> dt.datetime | None:
        if previous is None and self.anchor is not None:
            # an Interval trigger without a previous run skips to the first boundary after now;
            # the journal wants every window since the anchor, so the first one comes from there
            now = min(now, self.anchor)
        return self.trigger.get_next_fire_time(previous, now)


def event_key(name: str, t: dt.datetime) -> str:
    return f"{name}@{t.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}"
