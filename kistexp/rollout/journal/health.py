"""Authority health from the journal, read-only: each round's votes and consensus signers
(``rollout_votes_seen``, ``rollout_consensus_seen``, ``rollout_authority_health``), the stretches
without a majority-signed consensus and each authority's outages."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import attrs

from kistexp import jsonout
from kistexp.metrics.series import from_us
from kistexp.rollout.journal.codec import (
    BadValue,
    JournalDamageError,
    flag_value,
    names_value,
    params_value,
    text_value,
    time_value,
)

# --- authority health, read-only (rollout.md §3.5 votes_seen, consensus_seen) -------------------------
#
# These readers take any SQLite connection to the experiment database, a read-only one included
# (``kistexp status`` beside a live run, the feed, the exporter, the report), and never write. Tables
# and columns that newer schemas add (``rollout_authority_health``) are read when present, by name.

CONSENSUS_SIGNED, CONSENSUS_UNSIGNED, CONSENSUS_MISSING, CONSENSUS_UNCHECKED = (
    "signed", "unsigned", "missing", "unchecked")


@jsonout.shape(omit=("n_authorities",))  # the last round in `status --json`
@attrs.frozen
class RoundHealth:
    """One voting round as the journal saw it: whose vote was served, who signed its consensus.

    ``consensus`` is ``signed`` (published and signed by more than half of the configured
    authorities), ``unsigned`` (published with fewer names), ``missing`` (looked for, none
    published) or ``unchecked`` (the engine did not look at this round's consensus)."""

    valid_after: dt.datetime
    n_authorities: int
    voted: tuple[str, ...] = ()
    down: tuple[str, ...] = ()  # asked for their vote, none served
    stale: tuple[str, ...] = ()  # served an old vote (newer schemas' authority health only)
    signed: tuple[str, ...] = ()
    consensus: str = CONSENSUS_UNCHECKED
    params: tuple[tuple[str, int], ...] | None = None

    @property
    def majority(self) -> bool:
        return self.consensus == CONSENSUS_SIGNED

    @property
    def votes_checked(self) -> bool:
        return bool(self.voted or self.down or self.stale)


@attrs.frozen
class ConsensusOutage:
    """A stretch of consecutive rounds seen without a majority-signed consensus."""

    start: dt.datetime  # valid-after of the first round seen without one
    end: dt.datetime  # valid-after of the last such round
    rounds: int
    ongoing: bool  # no majority-signed consensus seen after it
    last_good: dt.datetime | None  # the majority-signed consensus seen before it
    recovered: dt.datetime | None  # the first majority-signed one seen after it
    down: tuple[str, ...]  # authorities that served no vote in any of its rounds

    def describe(self, fmt: str = "%Y-%m-%d %H:%M") -> str:
        span = (f"at {self.start:{fmt}}" if self.start == self.end
                else f"from {self.start:{fmt}} to {self.end:{fmt}}")
        words = [f"no majority-signed consensus {span} ({self.rounds} round{'s' if self.rounds != 1 else ''}"
                 + (", still none at the last look)" if self.ongoing else f"; back at {self.recovered:{fmt}})")]
        if self.down:
            words.append(f"no vote from {', '.join(self.down)}")
        if self.last_good is not None:
            words.append(f"last majority-signed consensus seen before it: {self.last_good:{fmt}}")
        return "; ".join(words)


@attrs.frozen
class AuthorityOutage:
    """Consecutive rounds in which one authority served no vote."""

    authority: str
    start: dt.datetime
    end: dt.datetime
    rounds: int
    ongoing: bool  # still without a vote in the last round whose votes were fetched

    def describe(self, fmt: str = "%Y-%m-%d %H:%M") -> str:
        span = f"at {self.start:{fmt}}" if self.start == self.end else f"from {self.start:{fmt}} to {self.end:{fmt}}"
        tail = ", still down at the last look" if self.ongoing else ""
        return f"{self.authority}: no vote {span} ({self.rounds} round{'s' if self.rounds != 1 else ''}{tail})"


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """The columns of ``table`` ('' if it does not exist): newer schemas add some, older lack them."""
    try:
        return tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))  # noqa: S608 - our names
    except sqlite3.Error:
        return ()


def round_health(conn: sqlite3.Connection, authorities: tuple[str, ...] | list[str], *,
                 db: Path | str | None = None) -> tuple[RoundHealth, ...]:
    """Every round the journal holds votes or a consensus for, oldest first, with who voted, who
    was down and who signed. ``authorities`` are the configured ones (the majority is more than
    half of them). A consensus the engine fetched went through the directory client, which accepts
    only one signed by a majority; one recorded without signer names is taken as that. A row that
    cannot be read is a ``JournalDamageError`` naming ``db`` (default: the connection's file), its
    table and its row."""
    n = len(authorities)
    voted: dict[int, set[str]] = {}
    down: dict[int, set[str]] = {}
    stale: dict[int, set[str]] = {}
    signed: dict[int, set[str]] = {}
    seen_consensus: dict[int, tuple[object, list[str]]] = {}
    health_rounds: set[int] = set()  # rounds the engine wrote its own health rows for (newer schemas)

    def decoded(table: str, row: object, build):
        try:
            return build()
        except BadValue as exc:
            where = db if db is not None else conn.execute("PRAGMA database_list").fetchone()[2]
            raise JournalDamageError(where, table, row, str(exc)) from None

    def when(va) -> int:
        time_value(va, "valid_after_us")
        return va

    if _table_columns(conn, "rollout_votes_seen"):
        for key, auth, va, params in conn.execute("SELECT rowid, authority, valid_after_us, params "
                                                  "FROM rollout_votes_seen"):
            va, auth, params = decoded("rollout_votes_seen", key, lambda va=va, auth=auth, params=params: (
                when(va), text_value(auth, "authority"), params_value(params, "params", null=True)))
            (down if params is None else voted).setdefault(va, set()).add(auth)
    if _table_columns(conn, "rollout_consensus_seen"):
        # one flavour decides; microdesc is the one the engine fetches, others only where it is absent
        for key, va, params, signers in conn.execute(
                "SELECT rowid, valid_after_us, params, signers FROM rollout_consensus_seen "
                "ORDER BY valid_after_us, flavour = 'microdesc'"):
            va, params, names = decoded("rollout_consensus_seen", key,
                                        lambda va=va, params=params, signers=signers: (
                                            when(va), params_value(params, "params", null=True),
                                            names_value(signers, "signers")))
            seen_consensus[va] = (None if params is None else dict(params), list(names))
    cols = _table_columns(conn, "rollout_authority_health")
    if {"valid_after_us", "authority"} <= set(cols):
        picked = [c for c in ("voted", "signed", "state") if c in cols]
        for row in conn.execute(f"SELECT rowid, valid_after_us, authority, {', '.join(picked) or 'NULL'} "  # noqa: S608
                                "FROM rollout_authority_health"):
            va, auth, rest = decoded("rollout_authority_health", row[0], lambda row=row: (
                when(row[1]), text_value(row[2], "authority"),
                {c: (text_value(v, c) if c == "state" else flag_value(v, c))
                 for c, v in zip(picked, row[3:], strict=True)}))
            if "signed" in rest:
                health_rounds.add(va)
            state = str(rest.get("state") or "")
            if state == "no-consensus":
                continue  # nothing was published to read who voted from: the round's votes stay as seen
            if rest.get("voted") is not None or state:
                # the health row is the engine's own verdict on the round: it replaces the vote rows'
                for bucket in (voted, down, stale):
                    bucket.get(va, set()).discard(auth)
                if state == "stale":
                    target = stale
                elif state == "down" or rest.get("voted") is False:
                    target = down
                else:
                    target = voted
                target.setdefault(va, set()).add(auth)
            if rest.get("signed"):
                signed.setdefault(va, set()).add(auth)
    order = {a: i for i, a in enumerate(authorities)}

    def ordered(names) -> tuple[str, ...]:
        return tuple(sorted(names, key=lambda a: (order.get(a, len(order)), a)))

    out = []
    for va in sorted(set(voted) | set(down) | set(stale) | set(seen_consensus) | health_rounds):
        params, names = seen_consensus.get(va, (None, []))
        names_set = set(names) | signed.get(va, set())
        if va not in seen_consensus and va in health_rounds:
            # no consensus row, but the engine recorded who signed this round's: as many as signed it
            state = (CONSENSUS_SIGNED if len(names_set) * 2 > n else
                     CONSENSUS_UNSIGNED if names_set else CONSENSUS_MISSING)
        elif va not in seen_consensus:
            state = CONSENSUS_UNCHECKED
        elif not isinstance(params, dict):
            state = CONSENSUS_MISSING
        elif not names_set or len(names_set) * 2 > n:
            state = CONSENSUS_SIGNED
        else:
            state = CONSENSUS_UNSIGNED
        out.append(RoundHealth(
            valid_after=from_us(va), n_authorities=n, voted=ordered(voted.get(va, ())),
            down=ordered(down.get(va, ())), stale=ordered(stale.get(va, ())), signed=ordered(names_set),
            consensus=state,
            params=tuple(sorted((str(k), v) for k, v in params.items())) if isinstance(params, dict) else None))
    return tuple(out)


def _interval(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None) -> dt.timedelta | None:
    if interval is not None:
        return interval
    steps = [b.valid_after - a.valid_after for a, b in zip(rounds, rounds[1:], strict=False)]
    positive = [s for s in steps if s > dt.timedelta(0)]
    return min(positive) if positive else None


def consensus_outages(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None
                      ) -> tuple[ConsensusOutage, ...]:
    """Stretches of consecutive rounds checked without a majority-signed consensus. A stretch ends
    at a majority-signed one, and also where the checked rounds are more than one ``interval``
    apart: what happened in rounds nobody looked at is not claimed."""
    checked = tuple(r for r in rounds if r.consensus != CONSENSUS_UNCHECKED)
    step = _interval(checked, interval)
    out: list[ConsensusOutage] = []
    current: list[RoundHealth] = []
    last_good: dt.datetime | None = None

    def close(recovered: dt.datetime | None, ongoing: bool) -> None:
        if current:
            down = tuple(dict.fromkeys(a for r in current for a in r.down))  # in the order first seen
            out.append(ConsensusOutage(current[0].valid_after, current[-1].valid_after, len(current), ongoing,
                                       last_good, recovered, down))
            current.clear()

    for r in checked:
        if r.majority:
            close(r.valid_after, False)
            last_good = r.valid_after
            continue
        if current and step is not None and r.valid_after - current[-1].valid_after > step:
            close(None, False)  # a gap nobody looked at: the stretch seen ends here, its end unknown
        current.append(r)
    close(None, True)
    return tuple(out)


def authority_outages(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None
                      ) -> tuple[AuthorityOutage, ...]:
    """Per authority, stretches of consecutive rounds (votes fetched) in which it served no vote."""
    checked = tuple(r for r in rounds if r.votes_checked)
    step = _interval(checked, interval)
    open_: dict[str, list[dt.datetime]] = {}
    out: list[AuthorityOutage] = []
    prev: dt.datetime | None = None
    for r in checked:
        gap = prev is not None and step is not None and r.valid_after - prev > step
        for auth in list(open_):
            if gap or auth not in r.down:
                times = open_.pop(auth)
                out.append(AuthorityOutage(auth, times[0], times[-1], len(times), False))
        for auth in r.down:
            open_.setdefault(auth, []).append(r.valid_after)
        prev = r.valid_after
    for auth, times in open_.items():
        out.append(AuthorityOutage(auth, times[0], times[-1], len(times), True))
    return tuple(sorted(out, key=lambda o: (o.start, o.authority)))


def down_since(rounds: tuple[RoundHealth, ...], interval: dt.timedelta | None = None) -> dict[str, dt.datetime]:
    """The authorities without a vote in the last round whose votes were fetched, each with the
    first round of the stretch it has been down since."""
    return {o.authority: o.start for o in authority_outages(rounds, interval) if o.ongoing}
