"""tor's rule for the consensus ``params`` line and the consensus-formation thresholds.

Everything here follows dirspec-params.md: §1.2 (an authority's own params), §1.3
(``dirvote_compute_params``), §2.1 (votes, consensus method and signatures needed) and §4
(how a relay reads a parameter). ``N`` is always the number of *configured* v3 authorities,
never the number of votes received (real-tor.md, Params results, exp 3).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Mapping, Sequence

import attrs

from kistexp import params as tor_params
from kistexp.dirauth.paramsline import INT32_MAX, INT32_MIN, sort_params, tor_item_key
from kistexp.errors import KistexpError
from kistexp.params import TorVersion

Params = tuple[tuple[str, int], ...]

MIN_VOTES_FOR_PARAM = 3  # dirvote.c: a key listed by this many votes is kept whatever N is
DEFAULT_AUTH_DIR_MAX_SERVERS_PER_ADDR = 2
AUTH_DIR_MAX_SERVERS_PER_ADDR = "AuthDirMaxServersPerAddr"  # the params key tor adds itself (§1.2)
SUPPORTED_CONSENSUS_METHODS = tuple(range(28, 34))  # tor 0.4.8 (§2.2)


class VotingError(KistexpError):
    """Bad input to the voting model (authority count, duplicate votes, unknown parameter)."""


class VoteRejected(VotingError):
    """tor would refuse this authority's own vote, so it does not vote this round (§1.2)."""


# ---------------------------------------------------------------------------------------
# votes


# A params keyword as a vote can carry it: printable ASCII without '=' or space. A vote is ASCII text that
# tor handles as a C string (a NUL ends the document early: the authority logs "Generated a networkstatus
# vote we couldn't parse" and stops voting), its tokenizer splits items on whitespace and '=' ends the key.
_KEYWORD_RE = re.compile(r"[!-<>-~]+")


def _params_converter(value: Mapping[str, int] | Iterable[tuple[str, int]]) -> Params:
    items = list(value.items()) if isinstance(value, Mapping) else list(value)
    seen: set[str] = set()
    for key, val in items:
        if not isinstance(key, str) or not _KEYWORD_RE.fullmatch(key):
            raise VoteRejected(f"params: bad keyword {key!r} (printable ASCII without '=' or spaces)")
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise VoteRejected(f"params: {key} has a non-integer value {val!r}")
        if not INT32_MIN <= val <= INT32_MAX:
            raise VoteRejected(f"params: {key}={val} is outside the int32 range")
        if key in seen:
            raise VoteRejected(f"params: {key} is listed twice")
        seen.add(key)
    return sort_params((k, int(v)) for k, v in items)


@attrs.frozen
class Vote:
    """One authority's vote as far as the params rule cares (§1.2, §2.1).

    ``params`` is kept in tor's order (strcmp on ``key=value``); a duplicate keyword or a
    non-int32 value raises VoteRejected, because tor cannot parse such a vote.
    """

    authority: str  # nickname
    params: Params = attrs.field(factory=tuple, converter=_params_converter)
    v3ident: str = ""
    consensus_methods: tuple[int, ...] = attrs.field(default=SUPPORTED_CONSENSUS_METHODS, converter=tuple)
    lists_running: bool = True  # known-flags contains Running (needed to compute, §2.1)

    def value(self, key: str) -> int | None:
        for k, v in self.params:
            if k == key:
                return v
        return None


VoteLike = Vote | Mapping[str, int] | Iterable[tuple[str, int]]


def _as_votes(votes: Iterable[VoteLike]) -> list[Vote]:
    out: list[Vote] = []
    for i, vote in enumerate(votes):
        out.append(vote if isinstance(vote, Vote) else Vote(f"vote{i + 1}", vote))
    names = [v.authority for v in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise VotingError(f"two votes from authority {dupes[0]}: an authority holds one vote per voter")
    return out


def _check_n(n_authorities: int, n_votes: int) -> None:
    if isinstance(n_authorities, bool) or not isinstance(n_authorities, int) or n_authorities < 1:
        raise VotingError(f"n_authorities must be a positive integer, got {n_authorities!r}")
    if n_votes > n_authorities:
        raise VotingError(
            f"{n_votes} votes but only {n_authorities} configured authorities: "
            "N counts configured authorities"
        )


_ITEM_RE = re.compile(r"^([^=\s]+)=([+-]?[0-9]+)\Z")


def parse_items(tokens: Iterable[str], where: str) -> list[tuple[str, int]]:
    """``key=integer`` tokens as pairs, in the given order (range and duplicates not checked)."""
    items = []
    for token in tokens:
        m = _ITEM_RE.fullmatch(token)
        if not m:
            raise VotingError(f"{where}: item {token!r} is not key=integer")
        if len(m[2].lstrip("+-").lstrip("0")) > 10:  # past int32 for sure; int() of 4,300+ digits would raise
            raise VotingError(f"{where}: {m[1]}={m[2][:20]}... is outside the int32 range")
        items.append((m[1], int(m[2])))
    return items


def own_vote_params(
    consensus_params: str | Sequence[str] | None,
    auth_dir_max_servers_per_addr: int = DEFAULT_AUTH_DIR_MAX_SERVERS_PER_ADDR,
) -> Params:
    """The params an authority puts in its own vote from its torrc ``ConsensusParams`` lines (§1.2).

    If any parameter is configured, ``AuthDirMaxServersPerAddr=<value>`` is appended and the
    list sorted. Raises VoteRejected when tor could not store its own vote (duplicate key —
    including AuthDirMaxServersPerAddr given by hand —, item without ``=``, non-int32 value).
    """
    lines = [consensus_params] if isinstance(consensus_params, str) else list(consensus_params or ())
    tokens = [tok for line in lines for tok in line.split()]
    if not tokens:
        return ()
    if any(tok.partition("=")[0] == AUTH_DIR_MAX_SERVERS_PER_ADDR for tok in tokens):
        raise VoteRejected(
            f"ConsensusParams must not list {AUTH_DIR_MAX_SERVERS_PER_ADDR}: tor appends "
            f"{AUTH_DIR_MAX_SERVERS_PER_ADDR}=<its torrc option> to the vote of every authority that has "
            "ConsensusParams (dirvote.c), so its vote would list it twice and the authority does not vote "
            "(\"Generated a networkstatus vote we couldn't parse\"); "
            f"set the torrc option {AUTH_DIR_MAX_SERVERS_PER_ADDR} instead")
    tokens.append(f"AuthDirMaxServersPerAddr={auth_dir_max_servers_per_addr}")
    try:
        return _params_converter(parse_items(tokens, "ConsensusParams"))
    except VotingError as exc:
        raise VoteRejected(f"{exc}: the authority does not vote (Couldn't store my own vote)") from None


# ---------------------------------------------------------------------------------------
# the params rule (§1.3)


def param_inclusion_threshold(n_authorities: int) -> int:
    """Votes that must list a key for it to enter the consensus: ``min(3, floor(N/2)+1)`` (§1.3)."""
    _check_n(n_authorities, 0)
    return min(MIN_VOTES_FOR_PARAM, n_authorities // 2 + 1)


def low_median(values: Sequence[int]) -> int:
    """tor's ``median_int32``: the element at index ``(n-1)//2`` of the sorted values."""
    if not values:
        raise VotingError("low median of no values")
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@attrs.frozen
class ParamTally:
    """How one key fared in the vote (§1.3)."""

    key: str
    n_authorities: int
    threshold: int
    listed: tuple[tuple[str, int], ...]  # (authority, value), sorted by value then name
    silent: tuple[str, ...]  # held votes that do not list the key
    median: int  # low median of the listed values
    included: bool

    @property
    def n_listing(self) -> int:
        return len(self.listed)

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(v for _, v in self.listed)

    @property
    def reason(self) -> str:
        n, th, big_n = self.n_listing, self.threshold, self.n_authorities
        rule = f"needs {th} = min(3, floor({big_n}/2)+1)"
        if not self.included:
            return f"left out: {n} of {big_n} authorities list it, {rule}"
        return (
            f"included: {n} of {big_n} authorities list it ({rule}); "
            f"low median of {list(sorted(self.values))} is {self.median}"
        )


def tally_params(votes: Iterable[VoteLike], n_authorities: int) -> tuple[ParamTally, ...]:
    """Tally every key listed in any held vote, in tor's output order (§1.3)."""
    held = _as_votes(votes)
    _check_n(n_authorities, len(held))
    threshold = param_inclusion_threshold(n_authorities)
    by_key: dict[str, list[tuple[str, int]]] = {}
    for vote in held:
        for key, value in vote.params:
            by_key.setdefault(key, []).append((vote.authority, value))
    tallies = []
    for key, listed in by_key.items():
        names = {a for a, _ in listed}
        ordered = tuple(sorted(listed, key=lambda av: (av[1], av[0])))
        tallies.append(
            ParamTally(
                key=key,
                n_authorities=n_authorities,
                threshold=threshold,
                listed=ordered,
                silent=tuple(v.authority for v in held if v.authority not in names),
                median=low_median([v for _, v in listed]),
                included=len(listed) >= threshold,
            )
        )
    return tuple(sorted(tallies, key=lambda t: tor_item_key((t.key, t.median))))


def compute_consensus_params(votes: Iterable[VoteLike], n_authorities: int) -> Params:
    """The consensus ``params`` items exactly as tor's ``dirvote_compute_params`` makes them (§1.3).

    A key enters iff ``n_k > floor(N/2)`` or ``n_k >= 3``; its value is the low median of
    the listed values; items are in strcmp order of ``key=value``.
    """
    return tuple((t.key, t.median) for t in tally_params(votes, n_authorities) if t.included)


# ---------------------------------------------------------------------------------------
# consensus formation (§2.1)


def votes_needed_to_compute(n_authorities: int) -> int:
    """An authority computes a consensus only with more than floor(N/2) votes (§2.1)."""
    _check_n(n_authorities, 0)
    return n_authorities // 2 + 1


def signatures_needed(n_authorities: int) -> int:
    """Good signatures needed to publish at VA and for a client to accept: floor(N/2)+1 (§2.1)."""
    _check_n(n_authorities, 0)
    return n_authorities // 2 + 1


@attrs.frozen
class Formation:
    """Whether an authority holding these votes computes a consensus, and with which method."""

    n_authorities: int
    n_votes: int
    votes_needed: int
    any_running: bool
    can_compute: bool
    consensus_method: int | None
    reason: str


def consensus_method(
    votes: Iterable[VoteLike], supported: Sequence[int] = SUPPORTED_CONSENSUS_METHODS, silent: int = 0
) -> int:
    """The method tor picks: the highest one listed by more than floor(2V/3) of the V votes (§2.1).

    If that method is not in ``supported`` the computing authority falls back to its own
    highest method (tor 0.4.x); with no method frequent enough tor uses 1. ``silent`` more
    votes list no params and the default methods: counted, never built one by one.
    """
    held = _as_votes(votes)
    floor_two_thirds = ((len(held) + silent) * 2) // 3
    counts: dict[int, int] = dict.fromkeys(SUPPORTED_CONSENSUS_METHODS, silent) if silent else {}
    for vote in held:
        for method in set(vote.consensus_methods):
            counts[method] = counts.get(method, 0) + 1
    frequent = [m for m, c in counts.items() if c > floor_two_thirds]
    method = max(frequent) if frequent else 1
    if method not in supported:
        return max(supported)
    return method


def formation(votes: Iterable[VoteLike], n_authorities: int, silent: int = 0) -> Formation:
    """Votes needed to compute (> floor(N/2), one listing Running) and the method (§2.1).

    ``silent`` more votes (no params, default methods, listing Running) are counted, not built."""
    held = _as_votes(votes)
    n_held = len(held) + silent
    _check_n(n_authorities, n_held)
    needed = votes_needed_to_compute(n_authorities)
    any_running = silent > 0 or any(v.lists_running for v in held)
    can = n_held >= needed and any_running
    if n_held < needed:
        reason = (
            f"not enough votes to generate a consensus: {n_held} of {n_authorities} held, "
            f"need more than {n_authorities // 2}"
        )
    elif not any_running:
        reason = "no held vote lists the Running flag"
    else:
        reason = f"{n_held} of {n_authorities} votes held (a consensus needs {needed})"
    return Formation(
        n_authorities=n_authorities,
        n_votes=n_held,
        votes_needed=needed,
        any_running=any_running,
        can_compute=can,
        consensus_method=consensus_method(held, silent=silent) if can else None,
        reason=reason,
    )


# ---------------------------------------------------------------------------------------
# how a relay reads a parameter (§4)

# Which key a tor reads depends on its role from some version on (§4); the bounds
# themselves come from the parameter catalogue (kistexp/params.py).
_CLIENT_KEY = {"KISTSchedRunInterval": ("KISTSchedRunIntervalClient", TorVersion(0, 4, 8, 2))}
_TORRC_MAX = {"KISTSchedRunInterval": 100}  # config.c rejects larger torrc values


def parse_tor_version(version: str) -> TorVersion:
    """``0.4.8.2-alpha`` -> TorVersion(0, 4, 8, 2); ``Tor 0.4.9.11 (git-...)`` is allowed."""
    text = version.strip()
    if text.lower().startswith("tor "):
        text = text[4:].strip()
    text = re.sub(r"\s*\(.*\)$", "", text)
    try:
        return TorVersion.parse(text)
    except ValueError:
        raise VotingError(f"tor version {version!r} is not like 0.4.8.13") from None


@attrs.frozen
class ParamBounds:
    key: str  # the consensus key this tor reads
    default: int
    minimum: int
    maximum: int


def param_bounds(name: str, tor_version: str, is_server: bool = True) -> ParamBounds:
    """Key read, default, min and max for ``name`` on this tor version and role (§4)."""
    version = parse_tor_version(tor_version)
    key = name
    client_key = _CLIENT_KEY.get(name)
    if client_key and not is_server and version >= client_key[1]:
        key = client_key[0]
    entry = tor_params.get(key)
    if entry is None:
        hint = tor_params.suggest(name)
        raise VotingError(f"no bounds known for consensus parameter {name}" + (f" (did you mean {hint}?)"
                                                                               if hint else ""))
    bounds = entry.bounds_for(version)
    if bounds is None:
        raise VotingError(f"{key} does not exist in tor {tor_version}")
    return ParamBounds(key=key, default=bounds.default, minimum=bounds.minimum, maximum=bounds.maximum)


def effective_value(
    consensus_params: Mapping[str, int] | Iterable[tuple[str, int]] | None,
    name: str,
    tor_version: str,
    torrc_value: int | None = None,
    is_server: bool = True,
) -> int:
    """The value a tor of ``tor_version`` runs for ``name`` (§4, ``networkstatus_get_param``).

    For parameters with a torrc override (KIST) a non-zero torrc value wins and is not
    clamped (tor rejects only > 100 at config load); otherwise the consensus key this tor
    reads (clients on 0.4.8.2+ read ``KISTSchedRunIntervalClient``) clamped to [min, max],
    or the compiled default when the key is absent.
    """
    bounds = param_bounds(name, tor_version, is_server)
    if torrc_value:
        torrc_max = _TORRC_MAX.get(name)
        if torrc_max is not None and torrc_value > torrc_max:
            raise VotingError(f"torrc {name} {torrc_value} is rejected by tor (maximum {torrc_max})")
        if torrc_value < 0:
            raise VotingError(f"torrc {name} {torrc_value} is negative")
    items = consensus_params.items() if isinstance(consensus_params, Mapping) else consensus_params or ()
    # first exact match, as get_net_param_from_list
    value = next((int(v) for k, v in items if k == bounds.key), None)
    version = parse_tor_version(tor_version)
    return tor_params.effective_value(bounds.key, value, version, torrc_value).value
