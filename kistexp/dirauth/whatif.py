"""What-if questions on the params vote (dirspec-params.md §1.3, §1.4, §2.1).

"What must change for the consensus to say k=v?", "can we still roll back if these
authorities cannot be reached?", "what will the consensus be if only these votes arrive?".

The solver is direct. With ``n`` authorities listing a key, the low median is ``v`` iff
``#(values < v) <= (n-1)//2`` and ``#(values <= v) >= (n-1)//2 + 1`` (and ``n`` reaches the
inclusion threshold). Only a value's side of ``v`` matters, and three moves dominate all
others: convert a lister above ``v`` to ``v``, convert a lister below ``v`` to ``v``, or have a
silent authority start listing ``v`` (removing a lister or listing another value is never
better). For each number of recruits the conversions needed follow directly, so trying
every useful recruit count gives the exact minimum; tests check it against brute force over
every subset of authorities. Past 2n+4 recruits (n listers) every conversion is already
unneeded, so at most that many counts are tried and silent authorities are never built one by
one: N may be as large as tor can be configured with (MAX_N_AUTHORITIES) at no cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kistexp import jsonout
from kistexp.dirauth.paramsline import INT32_MAX, INT32_MIN
from kistexp.dirauth.voting import (
    Formation,
    Params,
    ParamTally,
    Vote,
    VoteRejected,
    VotingError,
    compute_consensus_params,
    formation,
    low_median,
    param_inclusion_threshold,
    parse_items,
    tally_params,
)

#: tor counts its configured authorities in a C ``int`` (dirlist.c ``get_n_authorities``) and
#: sets no other limit on DirAuthority lines, so N is at most INT_MAX.
MAX_N_AUTHORITIES = 2**31 - 1

_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _count(n: int, noun: str) -> str:
    word = _WORDS[n] if n < len(_WORDS) else str(n)
    if n == 1:
        return f"{word} {noun}"
    return f"{word} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


@attrs.frozen
class VoteChange:
    """One authority changing what it votes for a key (None = does not list the key)."""

    authority: str
    before: int | None
    after: int | None

    def describe(self) -> str:
        def show(v: int | None) -> str:
            return "silent" if v is None else str(v)

        return f"{self.authority}: {show(self.before)} -> {show(self.after)}"


@jsonout.shape(omit=("n_authorities",), rename={"target": "value", "bound": "new_values", "explanation": "words"},
               order=("key", "value", "current", "possible", "changes", "new_values", "result", "words"))
@attrs.frozen
class WhatIf:
    """The minimal change of votes that makes the consensus say ``key=target`` (None = absent)."""

    key: str
    target: int | None
    n_authorities: int
    current: int | None  # consensus value with the votes as they are (None = absent)
    possible: bool
    changes: tuple[VoteChange, ...]
    result: int | None  # consensus value after the changes (== target when possible)
    bound: str  # "<=", ">=", "=" or "any": which new values also work for the changed authorities
    explanation: str


@attrs.frozen
class _Auth:
    name: str
    value: int | None  # listed value, None = silent
    changeable: bool


def _value_of(params: Params, key: str) -> int | None:
    for k, v in params:
        if k == key:
            return v
    return None


def _silent_name(i: int) -> str:
    return f"another authority #{i + 1}"


def _electorate(
    votes: Sequence[Vote], n_authorities: int, key: str, frozen: Iterable[str], absent: Iterable[str]
) -> tuple[list[_Auth], int]:
    """Authorities whose votes arrive, and how many configured authorities have no vote in
    ``votes``: silent voters that could start listing the key ("another authority #i")."""
    names = [v.authority for v in votes]
    if len(set(names)) != len(names):
        raise VotingError("two votes from the same authority")
    if len(votes) > n_authorities:
        raise VotingError(f"{len(votes)} votes but only {n_authorities} configured authorities")
    frozen_set, absent_set = set(frozen), set(absent)
    for name in sorted(frozen_set | absent_set):
        if name not in names:
            raise VotingError(f"unknown authority {name}: name it with a vote first")
    out = [
        _Auth(v.authority, _value_of(v.params, key), v.authority not in frozen_set)
        for v in votes
        if v.authority not in absent_set
    ]
    return out, n_authorities - len(votes)


def _median_of(values: Sequence[int], n_authorities: int) -> int | None:
    if len(values) < param_inclusion_threshold(n_authorities):
        return None
    return low_median(values)


def _feasible(n: int, less: int, le: int, threshold: int) -> bool:
    m = (n - 1) // 2
    return n >= threshold and less <= m and le >= m + 1


def _plan_value(auths: list[_Auth], n_silent: int, target: int, threshold: int) -> list[VoteChange] | None:
    listed = [a for a in auths if a.value is not None]
    n = len(listed)
    less = sum(a.value < target for a in listed)
    le = sum(a.value <= target for a in listed)
    # nearest values first: the least surprising changes to ask for
    above = sorted((a for a in listed if a.changeable and a.value > target), key=lambda a: (a.value, a.name))
    below = sorted(
        (a for a in listed if a.changeable and a.value < target), key=lambda a: (-a.value, a.name)
    )
    silent = [a for a in auths if a.changeable and a.value is None]
    recruitable = len(silent) + n_silent
    best: tuple[int, int, int, int] | None = None
    # Two more recruits lower the conversions needed by at most one each side, so past 2n+4
    # recruits (b = 0 and a = 0 already) more only cost; N itself never bounds the loop.
    for c in range(min(recruitable, 2 * n + 4) + 1):
        # with c recruits the median index is fixed; take the fewest conversions it needs
        m = (n + c - 1) // 2
        b = max(0, less - m)
        a = max(0, m + 1 - le - c)
        if a <= len(above) and b <= len(below) and _feasible(n + c, less - b, le + a + c, threshold):
            key = (a + b + c, c, a, b)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    _, c, a, b = best
    recruits = [x.name for x in silent[:c]] + [_silent_name(i) for i in range(max(0, c - len(silent)))]
    chosen = [VoteChange(x.name, x.value, target) for x in above[:a] + below[:b]]
    return chosen + [VoteChange(name, None, target) for name in recruits]


def _plan_absent(auths: list[_Auth], threshold: int) -> list[VoteChange] | None:
    listed = [a for a in auths if a.value is not None]
    excess = len(listed) - threshold + 1
    if excess <= 0:
        return []
    movable = sorted((a for a in listed if a.changeable), key=lambda a: a.name)
    if len(movable) < excess:
        return None
    return [VoteChange(a.name, a.value, None) for a in movable[:excess]]


def _apply(auths: list[_Auth], changes: Sequence[VoteChange]) -> list[int]:
    """The listed values after ``changes``; a change to an unnamed silent authority adds one."""
    new = {c.authority: c.after for c in changes}
    values = []
    for a in auths:
        v = new.pop(a.name) if a.name in new else a.value
        if v is not None:
            values.append(v)
    values += [v for v in new.values() if v is not None]
    return values


def describe_tally(tally: ParamTally | None, key: str = "", n_authorities: int = 0) -> str:
    """The tally in words: "9 of 9 list it: 4 at 2, 5 at 10; the low median is 10"."""
    if tally is None or tally.n_listing == 0:
        of = f" (0 of {n_authorities})" if n_authorities else ""
        return f"no authority lists {key or 'it'}{of}; it is absent from the consensus"
    groups: dict[int, int] = {}
    for v in tally.values:
        groups[v] = groups.get(v, 0) + 1
    spread = ", ".join(f"{c} at {v}" for v, c in sorted(groups.items()))
    head = f"{tally.n_listing} of {tally.n_authorities} list it: {spread}"
    if tally.included:
        return f"{head}; the low median is {tally.median}"
    return f"{head}; it needs {tally.threshold} to be included, so it is absent from the consensus"


def _bound(auths: list[_Auth], changes: list[VoteChange], target: int, n_authorities: int) -> str:
    """Would any value <= target (or >= target) do for every changed authority?"""
    def works(shift: int) -> bool:
        if not INT32_MIN < target < INT32_MAX:
            return False
        moved = [VoteChange(c.authority, c.before, target + shift) for c in changes]
        return _median_of(_apply(auths, moved), n_authorities) == target

    low, high = works(-1), works(+1)
    if low and high:
        return "any"
    if low:
        return "<="
    if high:
        return ">="
    return "="


def solve_target(
    votes: Sequence[Vote],
    n_authorities: int,
    key: str,
    target: int | None,
    frozen: Iterable[str] = (),
    absent: Iterable[str] = (),
) -> WhatIf:
    """The fewest authorities that must change their vote so the consensus says ``key=target``.

    ``target=None`` asks for the key to leave the consensus. ``frozen`` authorities (e.g.
    operators unreachable for a rollback) keep voting as now; ``absent`` ones' votes do not
    arrive. Configured authorities not in ``votes`` are silent voters that may start listing.
    """
    if target is not None and not INT32_MIN <= target <= INT32_MAX:
        raise VotingError(f"target {key}={target} is outside the int32 range")
    frozen, absent = set(frozen), set(absent)
    auths, n_silent = _electorate(votes, n_authorities, key, frozen, absent)
    threshold = param_inclusion_threshold(n_authorities)
    held = [v for v in votes if v.authority not in absent]
    tally = next((t for t in tally_params(held, n_authorities) if t.key == key), None)
    current = tally.median if tally is not None and tally.included else None
    changes = (_plan_absent(auths, threshold) if target is None
               else _plan_value(auths, n_silent, target, threshold))
    possible = changes is not None
    changes = changes or []
    result = _median_of(_apply(auths, changes), n_authorities) if possible else current
    bound = "=" if target is None or not changes else _bound(auths, changes, target, n_authorities)
    want = "absent" if target is None else str(target)
    words = describe_tally(tally, key, n_authorities)
    if current == target:
        tail = f"it is already {want}"
    elif not possible:
        locked = sorted(a.name for a in auths if not a.changeable)
        why = f" with {', '.join(locked)} unchangeable" if locked else ""
        tail = f"no change of votes can make it {want}{why}"
    elif target is None:
        tail = f"{_count(len(changes), 'authority')} must stop listing it to make it absent"
    else:
        phrase = {
            "<=": f"at <= {target}",
            ">=": f"at >= {target}",
            "=": f"at {target}",
            "any": f"listing it (any value, e.g. {target})",
        }[bound]
        verb = "makes" if len(changes) == 1 else "make"
        tail = f"{_count(len(changes), 'more authority')} {phrase} {verb} it {target}"
    return WhatIf(
        key=key,
        target=target,
        n_authorities=n_authorities,
        current=current,
        possible=possible,
        changes=tuple(changes),
        result=result,
        bound=bound,
        explanation=f"{words}; {tail}",
    )


def rollback_possible(
    votes: Sequence[Vote], n_authorities: int, key: str, value: int | None, unreachable: Iterable[str]
) -> bool:
    """Can the reachable authorities alone bring ``key`` back to ``value`` (None = remove it)?"""
    return solve_target(votes, n_authorities, key, value, frozen=unreachable).possible


@attrs.frozen
class PartialConsensus:
    """What an authority computes if it holds only some of the votes (§2.1)."""

    arriving: tuple[str, ...]
    formation: Formation
    params: Params | None  # None when no consensus can be computed


def consensus_if_only(votes: Sequence[Vote], n_authorities: int, arriving: Iterable[str]) -> PartialConsensus:
    """The consensus params when only the votes of ``arriving`` authorities are held."""
    wanted = set(arriving)
    unknown = wanted - {v.authority for v in votes}
    if unknown:
        raise VotingError(f"unknown authority {sorted(unknown)[0]}: it has no vote")
    held = [v for v in votes if v.authority in wanted]
    form = formation(held, n_authorities)
    params = compute_consensus_params(held, n_authorities) if form.can_compute else None
    return PartialConsensus(tuple(v.authority for v in held), form, params)


# ---------------------------------------------------------------------------------------
# command-line forms

@jsonout.shape(omit=("vote",), rename={"dropped_because": "reason"})
@attrs.frozen
class VoteOption:
    """A parsed ``NAME='k=v k2=v2'`` option: the vote, or why tor would drop it."""

    authority: str
    vote: Vote | None
    dropped_because: str = ""


def parse_vote_option(spec: str) -> VoteOption:
    """Parse ``NAME=k=v k2=v2`` (any order; ``NAME=`` is an empty params line).

    Malformed text raises VotingError. A duplicate key or a non-int32 value is what tor
    itself rejects: the vote is dropped (the authority does not vote) and the reason kept.
    """
    name, sep, body = spec.partition("=")
    name = name.strip()
    if not sep or not name or any(c.isspace() for c in name):
        raise VotingError(f"--vote {spec!r}: expected NAME='key=value ...'")
    items = parse_items(body.split(), f"--vote {name}")
    try:
        return VoteOption(name, Vote(name, items))
    except VoteRejected as exc:
        return VoteOption(name, None, f"{exc}; tor drops {name}'s vote")


def parse_target(spec: str) -> tuple[str, int | None]:
    """``key=value``, or ``key=`` / ``key=absent`` for "not in the consensus"."""
    key, sep, raw = spec.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or any(c.isspace() for c in key):
        raise VotingError(f"--target {spec!r}: expected key=value")
    if raw in ("", "absent"):
        return key, None
    _, value = parse_items([f"{key}={raw}"], "--target")[0]
    if not INT32_MIN <= value <= INT32_MAX:
        raise VotingError(f"--target {key}={value} is outside the int32 range")
    return key, value


# a tally in `kistexp authorities whatif --json`, with its words
jsonout.shape(omit=("n_authorities", "threshold", "silent"), rename={"median": "low_median"},
              derived={"n_listing": lambda t: t.n_listing, "words": describe_tally},
              order=("key", "listed", "n_listing", "low_median", "included", "words"))(ParamTally)


@jsonout.shape(
    omit=("votes", "formation"),
    rename={"n_silent": "silent_authorities", "dropped": "dropped_votes", "tallies": "tally"},
    derived={"votes_held": lambda r: r.formation.n_votes, "votes_needed": lambda r: r.formation.votes_needed,
             "can_compute": lambda r: r.formation.can_compute, "formation": lambda r: r.formation.reason,
             "consensus_method": lambda r: r.formation.consensus_method,
             "inclusion_threshold": lambda r: param_inclusion_threshold(r.n_authorities)},
    order=("n_authorities", "silent_authorities", "votes_held", "votes_needed", "can_compute", "formation",
           "consensus_method", "consensus_params", "inclusion_threshold"))
@attrs.frozen
class WhatIfReport:
    """Everything ``kistexp authorities whatif`` prints."""

    n_authorities: int
    votes: tuple[Vote, ...]  # the named votes tor accepts
    n_silent: int  # configured authorities not named: they vote and list nothing
    dropped: tuple[VoteOption, ...]  # votes tor would refuse (their authorities do not vote)
    formation: Formation
    consensus_params: Params | None  # None when no consensus can be computed
    tallies: tuple[ParamTally, ...]
    target: WhatIf | None

    def tally_words(self) -> list[tuple[str, str]]:
        return [(t.key, describe_tally(t)) for t in self.tallies]


def whatif_report(
    vote_specs: Sequence[str],
    n_authorities: int,
    target: str | None = None,
    unreachable: Iterable[str] = (),
    absent: Iterable[str] = (),
) -> WhatIfReport:
    """Parse ``NAME='k=v ...'`` specs and answer the what-if; unnamed authorities are silent voters.

    Authority names are matched case-insensitively (as the plan loader does): ``--unreachable
    MORIA1`` names the ``--vote moria1=...`` authority, and ``Moria1`` and ``moria1`` are one."""
    if isinstance(n_authorities, bool) or not isinstance(n_authorities, int) or not (
            1 <= n_authorities <= MAX_N_AUTHORITIES):
        shown = n_authorities if isinstance(n_authorities, int) and abs(n_authorities) < 10**30 else "so large"
        raise VotingError(f"--n-authorities {shown}: expected 1 to {MAX_N_AUTHORITIES} (tor counts its "
                          "authorities in a C int)")
    options = [parse_vote_option(s) for s in vote_specs]
    canonical: dict[str, str] = {}
    for o in options:
        if o.authority.lower() in canonical:
            raise VotingError(f"--vote {o.authority} is given twice")
        canonical[o.authority.lower()] = o.authority
    if len(options) > n_authorities:
        raise VotingError(f"{len(options)} votes given but --n-authorities is {n_authorities}")

    def resolve(names: Iterable[str]) -> list[str]:
        out = []
        for name in names:
            if name.lower() not in canonical:
                shown = name if name.isprintable() else repr(name)
                raise VotingError(f"unknown authority {shown}: name it with --vote {shown}=...")
            out.append(canonical[name.lower()])
        return out

    unreachable, absent = resolve(unreachable), resolve(absent)
    dropped = tuple(o for o in options if o.vote is None)
    dropped_names = {o.authority for o in dropped}
    named = tuple(o.vote for o in options if o.vote is not None)
    n_silent = n_authorities - len(options)
    absent_set = set(absent)
    held = [v for v in named if v.authority not in absent_set]
    form = formation(held, n_authorities, silent=n_silent)
    solved = None
    if target is not None:
        key, value = parse_target(target)
        solved = solve_target(
            named,
            n_authorities,
            key,
            value,
            frozen=[n for n in unreachable if n not in dropped_names],
            absent=[n for n in absent if n not in dropped_names],
        )
    return WhatIfReport(
        n_authorities=n_authorities,
        votes=named,
        n_silent=n_silent,
        dropped=dropped,
        formation=form,
        consensus_params=compute_consensus_params(held, n_authorities) if form.can_compute else None,
        tallies=tally_params(held, n_authorities),
        target=solved,
    )
