"""The authorities' vote on the params line, per parameter, next to the consensus (§1.3).

The model behind ``kistexp authorities status``: each authority's current vote (or why it could not
be had), the consensus value of each parameter and tor's tally of the votes held (dirvote.c
``dirvote_compute_params``: the value predicted and, in words, how it was reached). The votes and the
consensus come in as parsed documents (``kistexp.directory.authorities_status`` fetches them); nothing
here does HTTP.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import attrs

from kistexp import jsonout
from kistexp.dirauth.documents import NetworkStatus
from kistexp.dirauth.paramsline import sort_params
from kistexp.dirauth.voting import Vote, tally_params
from kistexp.dirauth.whatif import describe_tally
from kistexp.errors import KistexpError


@jsonout.shape(rename={"valid_after": "vote_valid_after"}, derived={"reachable": lambda a: a.error is None},
               order=("nickname", "url", "v3ident", "pinned", "reachable"))
@attrs.frozen
class AuthorityVote:
    """One authority's current vote, or why it could not be had."""

    nickname: str
    url: str
    v3ident: str
    error: str | None
    valid_after: dt.datetime | None  # of the vote; None on error
    params: tuple[tuple[str, int], ...]
    pinned: bool = True  # False: configured without a v3ident, so its vote's identity is unchecked


@attrs.frozen
class ParamStatus:
    """One parameter: each authority's vote, the consensus value and tor's tally of the votes."""

    name: str
    votes: tuple[tuple[str, int | None], ...]  # (nickname, value or None when silent), reachable ones
    consensus_value: int | None  # None: absent from the consensus (or no consensus)
    predicted_value: int | None  # what tor's rule gives from the votes fetched
    included: bool
    tally: str  # the tally in words


def _consensus_json(s: AuthoritiesStatus) -> dict:
    return {"flavour": s.consensus_flavour, "valid_after": s.consensus_valid_after,
            "fresh_until": s.consensus_fresh_until, "signatures": s.consensus_signatures,
            "error": s.consensus_error, "verified": s.verified}


@jsonout.shape(omit=("consensus_flavour", "consensus_valid_after", "consensus_fresh_until", "consensus_signatures",
                     "consensus_error"), derived={"consensus": _consensus_json},
               order=("n_authorities", "verified", "consensus"))
@attrs.frozen
class AuthoritiesStatus:
    n_authorities: int
    authorities: tuple[AuthorityVote, ...]
    consensus_flavour: str
    consensus_valid_after: dt.datetime | None
    consensus_fresh_until: dt.datetime | None
    consensus_signatures: str
    consensus_error: str | None
    params: tuple[ParamStatus, ...]
    verified: bool = False  # a consensus verified against the pinned identities is shown


@attrs.frozen
class HeldVote:
    """What asking one configured authority for its current vote gave: the vote (checked by the
    client) or the error. ``v3ident``: the identity it was configured with, empty when unpinned."""

    nickname: str
    url: str
    v3ident: str
    got: NetworkStatus | KistexpError


def authorities_status_of(held: Sequence[HeldVote], n_authorities: int, flavour: str,
                          consensus: NetworkStatus | None, signatures: str, consensus_error: str | None,
                          parameters: Sequence[str] = ()) -> AuthoritiesStatus:
    """The report on ``parameters`` (every one a vote or the consensus lists when empty): a row per
    authority asked, and per parameter the votes, the value in ``consensus`` (the verified one shown,
    None when there is none) and tor's tally of the votes held, out of ``n_authorities``."""
    rows: list[AuthorityVote] = []
    votes: list[Vote] = []
    for h in held:
        got = h.got
        if isinstance(got, KistexpError):
            rows.append(AuthorityVote(h.nickname, h.url, h.v3ident, str(got), None, (), bool(h.v3ident)))
            continue
        ident = got.authorities[0].v3ident
        rows.append(AuthorityVote(h.nickname, h.url, ident, None, got.valid_after, got.params, bool(h.v3ident)))
        votes.append(Vote(h.nickname, got.params, ident, got.consensus_methods, "Running" in got.known_flags))
    names = list(parameters)
    if not names:
        keys = {k for v in votes for k, _ in v.params} | (set(dict(consensus.params)) if consensus else set())
        names = [k for k, _ in sort_params({k: 0 for k in keys})]
    tallies = {t.key: t for t in tally_params(votes, n_authorities)} if votes else {}
    params = []
    for name in names:
        t = tallies.get(name)
        params.append(ParamStatus(
            name=name,
            votes=tuple((v.authority, v.value(name)) for v in votes),
            consensus_value=dict(consensus.params).get(name) if consensus else None,
            predicted_value=t.median if t is not None and t.included else None,
            included=bool(t and t.included),
            tally=describe_tally(t, name, n_authorities),
        ))
    return AuthoritiesStatus(
        n_authorities=n_authorities,
        authorities=tuple(rows),
        consensus_flavour=flavour,
        consensus_valid_after=consensus.valid_after if consensus else None,
        consensus_fresh_until=consensus.fresh_until if consensus else None,
        consensus_signatures=signatures,
        consensus_error=consensus_error,
        params=tuple(params),
        verified=consensus is not None,
    )
