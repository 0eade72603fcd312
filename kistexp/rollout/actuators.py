"""Actuators: how the engine changes authorities' ConsensusParams and observes the result (rollout.md §4).

Interface per authority: ``current``, ``apply(desired, idem_key)`` (the whole set, never a delta),
``fetch_vote(T)``; and ``fetch_consensus(T)``. Success is what the votes and the consensus show,
never an API's answer.

``FakeAuthoritiesActuator`` drives ``fake_authorities`` (live ``kistexp run --authorities fake``,
and dry runs and replays on the virtual clock, ``kistexp.rollout.rehearsal``);
``InstructionsActuator`` the real network, through its operators.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol

import attrs

from kistexp.clock import Clock
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import KistexpError
from kistexp.rollout.spec import Cadence

Params = dict[str, int]


#: the longest one call of the fake authorities' operator API may take, all of it
CALL_TIMEOUT_S = 10.0


class ActuationError(KistexpError):
    """An authority could not be reached or refused the change."""


@attrs.frozen
class Intent:
    """What one authority is asked to vote (rollout.md §3.1): the whole set of ``desired`` params,
    for the consensus of ``valid_after``, under the journal's idempotency key, for transition ``seq``."""

    authority: str
    desired: Params = attrs.field(hash=False)
    idem_key: str
    valid_after: dt.datetime | None = None
    seq: int = 0


class Actuator(Protocol):
    name: str

    def current(self, authority: str) -> Params | None: ...

    def apply(self, intent: Intent) -> str: ...

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None: ...

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]: ...


# --- fake authorities' operator API ----------------------------------------------------------------

def _parse_lines(lines) -> Params:
    out: Params = {}
    for line in lines if isinstance(lines, list) else [lines]:
        for token in str(line).split():
            k, _, v = token.partition("=")
            out[k] = int(v)
    return out


OWN_KEYS = ("AuthDirMaxServersPerAddr",)  # keys an authority adds to its own vote (§1.2)


@attrs.frozen
class RoundSeen:
    """Which authorities' votes a round's consensus counted (its ``dir-source`` entries) and which
    signed it (its ``directory-signature`` entries), by nickname."""

    valid_after: dt.datetime
    voters: tuple[str, ...]
    signers: tuple[str, ...]


def round_seen(doc) -> RoundSeen:
    names = {a.v3ident.upper(): a.nickname for a in doc.authorities}
    signers = tuple(sorted({names.get(s.identity.upper(), s.identity) for s in doc.signatures}))
    return RoundSeen(doc.valid_after, tuple(sorted(a.nickname for a in doc.authorities)), signers)


class DirectoryObserver:
    """Votes and consensuses as DirPorts serve them, through the directory client's checks:
    ``next/authority`` before VA, ``current/authority`` after (rollout.md §3.1 step 3)."""

    def __init__(self, directory, clock: Clock) -> None:
        self.directory, self.clock = directory, clock

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None:
        which = "next" if self.clock.now() < valid_after else "current"
        try:
            doc = self.directory.fetch_vote(authority, which)
        except KistexpError:
            return None
        if doc.valid_after != valid_after:
            return None
        return {k: v for k, v in doc.params if k not in OWN_KEYS}

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        try:
            doc = self.directory.fetch_consensus("microdesc")
        except KistexpError:
            return None, []
        if doc.valid_after != valid_after:
            return None, []
        return ({k: v for k, v in doc.params if k not in OWN_KEYS},
                [a.nickname for a in doc.authorities])

    def fetch_round(self, valid_after: dt.datetime | None = None) -> RoundSeen | None:
        """The voters and signers of the consensus of ``valid_after``, or of the newest one served
        (None: no valid consensus served, or not that one)."""
        try:
            doc = self.directory.fetch_consensus("microdesc")
        except KistexpError:
            return None
        return round_seen(doc) if valid_after is None or doc.valid_after == valid_after else None


class FakeAuthoritiesActuator:
    """``fake_authorities``' operator API (bearer token) to act; their DirPorts, through the
    directory client and its signature checks, to observe (rollout.md §4)."""

    name = "fake"

    def __init__(self, operator_url: str, token: str, directory, clock: Clock, *, transport=None) -> None:
        import httpx

        self.base = operator_url.rstrip("/") + "/kistexp/operator"
        self._token = token  # never logged
        from kistexp.metrics.collectors.httpfetch import DeadlineTransport

        self.observer = DirectoryObserver(directory, clock)
        # each call ends within CALL_TIMEOUT_S in all (httpx's timeout bounds one socket operation);
        # an injected transport (tests, in-process authorities) has no sockets to bound
        self._deadline = DeadlineTransport() if transport is None else None
        self._http = httpx.Client(transport=transport or self._deadline, timeout=CALL_TIMEOUT_S, trust_env=False,
                                  headers={"Authorization": f"Bearer {token}"})

    def _call(self, method: str, path: str, **kw):
        import httpcore
        import httpx

        if self._deadline is not None:
            self._deadline.backend.set_deadline(time.monotonic() + CALL_TIMEOUT_S)
        try:
            r = self._http.request(method, self.base + path, **kw)
        except (httpx.HTTPError, httpcore.TimeoutException, httpcore.NetworkError) as exc:
            raise ActuationError(f"{self.base}{path}: {type(exc).__name__}: {exc}") from None
        finally:
            if self._deadline is not None:
                self._deadline.backend.set_deadline(None)
        if r.status_code != 200:
            raise ActuationError(f"{self.base}{path}: HTTP {r.status_code}: {r.text.strip()[:200]}")
        return r.json()

    def current(self, authority: str) -> Params | None:
        try:
            return _parse_lines(self._call("GET", f"/authorities/{authority}/params")["consensus_params"])
        except ActuationError:
            return None

    def apply(self, intent: Intent) -> str:
        try:
            body = {"params": ConsensusParams(intent.desired).format()}
        except KistexpError as exc:  # a set no authority could vote: refused here as the API would refuse it
            raise ActuationError(f"{intent.authority}: {exc}") from None
        got = self._call("PUT", f"/authorities/{intent.authority}/params", json=body,
                         headers={"Idempotency-Key": intent.idem_key})
        return f"set {got.get('vote_params', '')}; applies from {got.get('applies_from', 'next vote')}"

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None:
        return self.observer.fetch_vote(authority, valid_after)

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        return self.observer.fetch_consensus(valid_after)

    def fetch_round(self, valid_after: dt.datetime | None = None) -> RoundSeen | None:
        return self.observer.fetch_round(valid_after)


# --- real authorities: generated instructions ------------------------------------------------------

def render_instructions(plan_name: str, stage_text: str, authority: str, desired: Params, valid_after: dt.datetime,
                        cadence: Cadence, observed: Params | None, tz: dt.tzinfo = dt.timezone.utc) -> str:
    """The message for one authority operator (rollout.md §4): the complete ConsensusParams line, the diff
    against what their vote shows, the window in UTC and the plan's timezone, and how to check."""
    line = f"ConsensusParams {ConsensusParams(desired)}"
    opens = cadence.window_opens(valid_after)
    closes = valid_after - dt.timedelta(seconds=cadence.lead_s)

    def both(t: dt.datetime) -> str:
        local = t.astimezone(tz)
        zone = "" if local.utcoffset() == dt.timedelta(0) else f" ({local:%Y-%m-%d %H:%M %Z})"
        return f"{t:%Y-%m-%d %H:%M} UTC{zone}"

    changes = []
    for k, v in sorted(desired.items()):
        was = None if observed is None else observed.get(k)
        if was != v:
            changes.append(f"your vote lists {k}={was if was is not None else '(absent)'}; replace it with {v}")
    return "\n".join([
        f"Subject: [{plan_name}] {stage_text}: {authority}, set before {closes:%Y-%m-%d %H:%M} UTC",
        "",
        f"Please set, in {authority}'s torrc, exactly one line:",
        "",
        f"    {line}",
        "",
        *(f"- {c}" for c in changes),
        "- keep your other ConsensusParams keys on the same line; do not add a second entry for a key",
        "",
        f"Reload tor (SIGHUP) after {both(opens)} and before {both(closes)}",
        f"(advised: {both(valid_after - dt.timedelta(minutes=60))} .. {both(valid_after - dt.timedelta(minutes=15))}).",
        f"The first consensus carrying it is the one valid from {both(valid_after)}.",
        "A reload before the window lands a round early; after it, the change slips one round (one hour).",
        "",
        "Check: GETCONF ConsensusParams; after the vote is built, /tor/status-vote/next/authority lists it;",
        "consensus-health's parameter table shows your vote.",
    ]) + "\n"


class InstructionsActuator:
    """For the real network, which kistexp never touches: each ``apply`` writes the operator's
    instructions to ``EXP/outbox/<idem-key>.txt`` (temp, fsync, rename: idempotent), and
    observation is by public votes and consensuses through the directory client."""

    name = "instructions"

    def __init__(self, outbox, plan_name: str, cadence: Cadence, directory, clock: Clock,
                 tz: dt.tzinfo = dt.timezone.utc) -> None:
        from pathlib import Path

        self.outbox = Path(outbox)
        self.plan_name, self.cadence, self.directory, self.clock, self.tz = plan_name, cadence, directory, clock, tz
        self.observer = DirectoryObserver(directory, clock)

    def current(self, authority: str) -> Params | None:
        return None  # what the operator configured is only known from their next vote

    def apply(self, intent: Intent) -> str:
        import os

        if intent.valid_after is None:
            raise ActuationError(f"{intent.authority}: an instruction needs the consensus it is for (valid-after)")
        va = intent.valid_after
        text = render_instructions(self.plan_name, f"transition {intent.seq}", intent.authority, intent.desired, va,
                                   self.cadence, self.fetch_vote(intent.authority, va - dt.timedelta(
                                       seconds=self.cadence.interval_s)), self.tz)
        idem_key = intent.idem_key
        self.outbox.mkdir(parents=True, exist_ok=True)
        name = idem_key.replace(":", "_").replace("/", "_") + ".txt"
        final = self.outbox / name
        if final.exists():
            return f"instructions already written: {final}"
        tmp = final.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        return f"instructions written: {final}"

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None:
        return self.observer.fetch_vote(authority, valid_after)

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        return self.observer.fetch_consensus(valid_after)

    def fetch_round(self, valid_after: dt.datetime | None = None) -> RoundSeen | None:
        return self.observer.fetch_round(valid_after)
