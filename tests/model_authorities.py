"""A model of the authorities for the engine's own tests (rollout.md §7.3).

``SimulatedAuthorities`` votes what each authority was configured with at each round's
voting_starts (a reload changes the next vote built, never the pending one, §2.1) and forms the
consensus by tor's rule (kistexp.dirauth.voting), without documents, and keeps an exact change
log (``changes``) that crash-resume tests compare run against run. Dry runs and replays drive the
embedded fake authorities instead (kistexp.rollout.rehearsal).
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Mapping

import attrs

from kistexp.clock import Clock
from kistexp.dirauth.voting import Vote, compute_consensus_params, votes_needed_to_compute
from kistexp.rollout.actuators import ActuationError, Intent, Params
from kistexp.rollout.spec import Cadence


@attrs.frozen
class Change:
    """One state change of an authority's configuration (the change log of §3.10)."""

    at: dt.datetime
    authority: str
    old: tuple[tuple[str, int], ...]
    new: tuple[tuple[str, int], ...]
    idem_key: str


class SimulatedAuthorities:
    name = "simulated"

    def __init__(self, authorities: tuple[str, ...], initial: Mapping[str, Params], cadence: Cadence,
                 clock: Clock) -> None:
        self.authorities = authorities
        self.cadence = cadence
        self.clock = clock
        # per authority: sorted change times and the params from then on
        self._times: dict[str, list[dt.datetime]] = {a: [] for a in authorities}
        self._params: dict[str, list[Params]] = {a: [] for a in authorities}
        self._initial = {a: dict(initial.get(a, {})) for a in authorities}
        self.changes: list[Change] = []
        self._keys: set[str] = set()
        self.down_from: dict[str, dt.datetime] = {}
        self.stale_from: dict[str, dt.datetime] = {}

    def _config_at(self, authority: str, t: dt.datetime) -> Params:
        i = bisect.bisect_right(self._times[authority], t)
        return dict(self._params[authority][i - 1]) if i else dict(self._initial[authority])

    def _down(self, authority: str, t: dt.datetime) -> bool:
        return authority in self.down_from and t >= self.down_from[authority]

    def current(self, authority: str) -> Params | None:
        now = self.clock.now()
        if self._down(authority, now):
            return None
        return self._config_at(authority, now)

    def apply(self, intent: Intent) -> str:
        authority, desired, idem_key = intent.authority, intent.desired, intent.idem_key
        now = self.clock.now()
        if self._down(authority, now):
            raise ActuationError(f"{authority}: not answering")
        if idem_key in self._keys:
            return "unchanged (idempotency key seen)"
        old = self._config_at(authority, now)
        self._keys.add(idem_key)
        if old == desired:
            return "unchanged"
        self._times[authority].append(now)
        self._params[authority].append(dict(desired))
        self.changes.append(Change(now, authority, tuple(sorted(old.items())), tuple(sorted(desired.items())),
                                   idem_key))
        return "set; used from the next vote"

    def _vote_for(self, authority: str, va: dt.datetime) -> tuple[dt.datetime, Params] | None:
        """(valid-after the vote is for, its params), as the authority serves it."""
        vote_at = dt.datetime.fromtimestamp(self.cadence.round(va).vote_at, tz=dt.timezone.utc)
        if self._down(authority, vote_at):
            return None
        stale = self.stale_from.get(authority)
        if stale is not None and vote_at >= stale:
            old_va = self.cadence.va_at_or_after(stale)
            old_vote_at = dt.datetime.fromtimestamp(self.cadence.round(old_va).vote_at, tz=dt.timezone.utc)
            return old_va, self._config_at(authority, old_vote_at)
        return va, self._config_at(authority, vote_at)

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None:
        if self._down(authority, self.clock.now()):
            return None
        got = self._vote_for(authority, valid_after)
        return None if got is None else got[1]

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        votes = []
        for a in self.authorities:
            got = self._vote_for(a, valid_after)
            if got is not None and got[0] == valid_after:  # an old valid-after is refused
                votes.append(Vote(a, got[1]))
        if len(votes) < votes_needed_to_compute(len(self.authorities)):
            return None, []
        return dict(compute_consensus_params(votes, len(self.authorities))), [v.authority for v in votes]
