"""The timeline of a plan: when each stage's value can first be in a consensus, when
relays and clients run it, and what the authorities must do (dirspec-params.md §2-§3)."""

from __future__ import annotations

import datetime as dt
import functools
import math

import attrs

from kistexp import jsonout
from kistexp import params as tor_params
from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.dirauth.schedule import VotingRound, VotingSchedule
from kistexp.dirauth.voting import param_inclusion_threshold
from kistexp.durations import format_duration
from kistexp.plan.model import UNSET, ParamValue, Plan

# Whose adoption a metric follows -> the propagation model's node class.
_POPULATIONS = {"relays": NodeClass.CACHE, "clients": NodeClass.CLIENT}
LIVE_SCHEDULE = VotingSchedule()


def first_round(stage_start: dt.datetime, schedule: VotingSchedule = LIVE_SCHEDULE) -> VotingRound:
    """The round of the first consensus valid at or after ``stage_start``.

    A stage starts when the first consensus carrying its values becomes valid. The
    participating authorities must run the new ConsensusParams before that round's
    votes are built (VA - Dist - Vote: 10 minutes before VA on the live network).
    """
    return schedule.first_round_valid_from(stage_start)


def unplanned_change_delay(population: str, schedule: VotingSchedule = LIVE_SCHEDULE
                           ) -> tuple[dt.timedelta, dt.timedelta]:
    """(best, worst) time from an unscheduled authority change (a revert) until all of
    ``population`` run it: best just before a vote is built, worst just after."""
    vote, dist = schedule.effective_delays_s
    adopt = _adoption_offset_s(population, 1.0, schedule)
    best = vote + dist + adopt
    return dt.timedelta(seconds=best), dt.timedelta(seconds=best + schedule.interval_s)


@functools.lru_cache(maxsize=64)
def _adoption_offset_s(population: str, fraction: float, schedule: VotingSchedule) -> float:
    # whole seconds: the model is not finer than that, and it keeps printed times tidy
    return float(math.ceil(PropagationModel(schedule=schedule).time_until(fraction, _POPULATIONS[population])))


def adoption_time(valid_after: dt.datetime, population: str, fraction: float,
                  schedule: VotingSchedule = LIVE_SCHEDULE) -> dt.datetime:
    """When ``fraction`` of ``population`` ("relays" or "clients") holds the consensus of ``valid_after``."""
    return valid_after + dt.timedelta(seconds=_adoption_offset_s(population, fraction, schedule))


def propagation_delay(stage_start: dt.datetime, population: str,
                      schedule: VotingSchedule = LIVE_SCHEDULE) -> dt.timedelta:
    """From a stage's start until all of ``population`` run its values."""
    rnd = first_round(stage_start, schedule)
    return adoption_time(rnd.valid_after, population, 1.0, schedule) - stage_start


def sample_time(min_samples: int, samples_per_hour: float) -> dt.timedelta:
    """Time one measuring instance needs to gather ``min_samples`` samples."""
    return dt.timedelta(hours=math.ceil(min_samples / samples_per_hour * 60) / 60)


def authorities_needed(n_authorities: int, others: str) -> int:
    """Participating authorities needed to set a value (dirspec-params.md §1.3-§1.4).

    If the other authorities list the parameter, the low median moves only when a
    majority agrees: ceil(n/2) to push it down and floor(n/2)+1 to push it up, so a
    staged plan going both ways needs floor(n/2)+1 (5 of 9). If nobody else lists it,
    the value enters the consensus once min(3, floor(n/2)+1) authorities list it, and
    those alone set it.
    """
    if others == "listing":
        return n_authorities // 2 + 1
    return param_inclusion_threshold(n_authorities)


@jsonout.shape(rename={"relays_50": "relays_50pct", "relays_100": "relays_100pct", "clients_50": "clients_50pct",
                       "clients_100": "clients_100pct"})
@attrs.frozen
class TimelineRow:
    stage: str
    values: tuple[tuple[str, ParamValue], ...]
    start: dt.datetime
    end: dt.datetime
    gate: str
    vote_deadline: dt.datetime  # authorities must run the new ConsensusParams before this
    first_valid_after: dt.datetime
    relays_50: dt.datetime
    relays_100: dt.datetime
    clients_50: dt.datetime
    clients_100: dt.datetime
    authority_action: str

    @property
    def values_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values)


@jsonout.shape(rename={"rows": "stages"})
@attrs.frozen
class Timeline:
    plan: str
    baseline_start: dt.datetime
    rows: tuple[TimelineRow, ...]
    revert: str


def _action(plan: Plan, values: tuple[tuple[str, ParamValue], ...], deadline: dt.datetime) -> str:
    n = len(plan.authorities.authorities)
    need = authorities_needed(n, plan.authorities.others)
    have = len(plan.authorities.participating)
    parts = []
    for key, value in values:
        if value == UNSET:
            parts.append(f"remove {key}")
        else:
            parts.append(f"{key}={value}")
    return (f"{have} participating (need {need} of {n}) set {' '.join(parts)} in ConsensusParams "
            f"and reload before {deadline:%m-%d %H:%M}")


def build_timeline(plan: Plan, schedule: VotingSchedule = LIVE_SCHEDULE) -> Timeline:
    rows = []
    for stage, start, end in plan.stage_windows():
        rnd = first_round(start, schedule)
        va = rnd.valid_after
        rows.append(TimelineRow(
            stage=stage.name, values=stage.values, start=start, end=end, gate=stage.gate,
            vote_deadline=rnd.vote_at, first_valid_after=va,
            relays_50=adoption_time(va, "relays", 0.5, schedule),
            relays_100=adoption_time(va, "relays", 1.0, schedule),
            clients_50=adoption_time(va, "clients", 0.5, schedule),
            clients_100=adoption_time(va, "clients", 1.0, schedule),
            authority_action=_action(plan, stage.values, rnd.vote_at),
        ))
    relays = unplanned_change_delay("relays", schedule)
    clients = unplanned_change_delay("clients", schedule)
    defaults = []
    for name in plan.parameters:
        entry = tor_params.get(name)
        bounds = entry.bounds_in(plan.tor_versions) if entry else ()
        if len(bounds) == 1:
            defaults.append(f"{name}={bounds[0].default}")
        elif bounds:
            defaults.append(f"{name}=" + " / ".join(f"{b.default} (tor {b.versions})" for b in bounds))
    revert = (f"an unplanned revert reaches all relays {format_duration(relays[0])} to "
              f"{format_duration(relays[1])} and all clients {format_duration(clients[0])} to "
              f"{format_duration(clients[1])} after the authorities' change, depending on when in the "
              f"voting cycle it is made (tor default: {', '.join(defaults)})")
    return Timeline(plan=plan.name, baseline_start=plan.start - plan.baseline.duration, rows=tuple(rows),
                    revert=revert)
