"""The `params` line of votes and consensuses (dir-spec; dirspec-params.md §1.1).

tor sorts and checks the whole ``key=value`` strings with strcmp, not the keywords, so
``Foo1=1 Foo=2`` is the correct order (``1`` < ``=``). Any mis-ordering, duplicate key,
item without ``=`` or non-int32 value makes tor reject the whole document
(ns_parse.c ``networkstatus_parse_vote_from_string``: "Bad element '%s' in params",
"params not in order", "Duplicate in parameters").

``ConsensusParams`` is the value type: an immutable name -> int mapping kept in tor's order,
parsed with ``parse_params``, checked with ``check_pairs`` and sorted with ``sort_params``; the
functions stay for callers that hold plain pairs.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable, Iterator, Mapping

import attrs

from kistexp import params as tor_params
from kistexp.errors import DocumentError
from kistexp.params import INT32_MAX, INT32_MIN, Bounds, TorVersion

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "ConsensusParams",
    "OutOfBounds",
    "ParamsDiff",
    "check_pairs",
    "format_params",
    "parse_params",
    "sort_params",
    "tor_item_key",
]

# tor's keyword: anything up to '=' without whitespace; values are decimal int32.
_VALUE_RE = re.compile(r"^[+-]?[0-9]+\Z")


def _check_int32(key: str, value: int, raw: str, where: str) -> None:
    # tor_parse_long(eq+1, 10, INT32_MIN, INT32_MAX, &ok, NULL): "Bad element '%s' in params"
    if not INT32_MIN <= value <= INT32_MAX:
        raise DocumentError(f"{where}: {key}={raw} is outside the int32 range")


def _check_new(key: str, seen: set[str], where: str) -> None:
    # "Duplicate value for %s parameter" / "Duplicate in parameters"
    if key in seen:
        raise DocumentError(f"{where}: {key} is listed twice")


def tor_item_key(item: tuple[str, int]) -> bytes:
    """Sort key tor uses for params items: the bytes of ``key=value`` (strcmp order)."""
    return f"{item[0]}={item[1]}".encode()


def sort_params(params: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """Items in tor's order (strcmp on ``key=value``)."""
    items = params.items() if isinstance(params, Mapping) else params
    return tuple(sorted(((str(k), int(v)) for k, v in items), key=tor_item_key))


def _join(pairs: Iterable[tuple[str, int]]) -> str:
    return " ".join(f"{k}={v}" for k, v in pairs)


def format_params(params: Mapping[str, int] | Iterable[tuple[str, int]]) -> str:
    """The space-separated ``k=v`` body, in tor's order."""
    return _join(sort_params(params))


def parse_params(body: str, where: str = "params line") -> tuple[tuple[str, int], ...]:
    """Parse the body of a params line (everything after ``params``) as tor does.

    Returns the items in document order. Raises DocumentError naming ``where`` if tor
    would reject the document: bad item, value outside int32, duplicate keyword or
    items not strictly increasing in strcmp order of ``key=value``.
    """
    items: list[tuple[str, int]] = []
    seen: set[str] = set()
    previous: bytes | None = None
    for token in body.split():
        key, sep, raw = token.partition("=")
        if not sep or not key:
            raise DocumentError(f"{where}: item {token!r} is not key=value")
        if not _VALUE_RE.match(raw):
            raise DocumentError(f"{where}: {key} has a non-integer value {raw!r}")
        if len(raw.lstrip("+-").lstrip("0")) > 10:  # past int32 for sure; int() of 4,300+ digits would raise
            raise DocumentError(f"{where}: {key}={raw[:20]}... is outside the int32 range")
        value = int(raw)
        _check_int32(key, value, raw, where)
        _check_new(key, seen, where)
        current = token.encode()
        if previous is not None and current <= previous:
            raise DocumentError(
                f"{where}: {token} is out of order after {previous.decode()} "
                "(tor requires strictly increasing key=value strings)"
            )
        seen.add(key)
        previous = current
        items.append((key, value))
    return tuple(items)


def check_pairs(params: Mapping[str, int] | Iterable[tuple[str, int]],
                where: str = "params") -> tuple[tuple[str, int], ...]:
    """``(name, value)`` items checked by the rules ``parse_params`` applies to a line, in tor's order.

    A keyword is what tor's parser can read back from the line: non-empty, without ``=`` (tor splits
    an item at its first ``=``, ``strchr``) or whitespace (the tokenizer splits items on it); a value
    is an integer (not a bool) within int32; a keyword appears once. Raises DocumentError naming
    ``where`` otherwise.
    """
    items = params.items() if isinstance(params, Mapping) else params
    seen: set[str] = set()
    out: list[tuple[str, int]] = []
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            raise DocumentError(f"{where}: {item!r} is not a (name, value) pair") from None
        if not isinstance(key, str) or "=" in key or key.split() != [key]:
            raise DocumentError(f"{where}: bad keyword {key!r} (non-empty, without '=' or whitespace)")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise DocumentError(f"{where}: {key} has a non-integer value {value!r}")
        value = int(value)
        _check_int32(key, value, str(value), where)
        _check_new(key, seen, where)
        seen.add(key)
        out.append((key, value))
    return sort_params(out)


ParamsLike = Mapping[str, int] | Iterable[tuple[str, int]]


@attrs.frozen
class OutOfBounds:
    """A value tor accepts in the document but clamps when it reads it (``networkstatus_get_param``)."""

    name: str
    value: int
    bounds: Bounds

    @property
    def clamped(self) -> int:
        """The value tor runs with."""
        return self.bounds.clamp(self.value)

    def __str__(self) -> str:
        return (f"{self.name}={self.value} is outside [{self.bounds.minimum}, {self.bounds.maximum}] for tor "
                f"{self.bounds.versions}: tor runs {self.clamped}")


@attrs.frozen
class ParamsDiff:
    """What changed from one params set to another: keys added (with their new values), removed
    (with their old values) and changed (name, old, new), each in tor's order."""

    added: ConsensusParams
    removed: ConsensusParams
    changed: tuple[tuple[str, int, int], ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def __str__(self) -> str:
        parts = []
        if self.added:
            parts.append(f"added {self.added}")
        if self.removed:
            parts.append(f"removed {self.removed}")
        if self.changed:
            parts.append("changed " + " ".join(f"{k} {old}->{new}" for k, old, new in self.changed))
        return "; ".join(parts) or "no change"


@attrs.frozen(init=False, repr=False)
class ConsensusParams(Mapping[str, int]):
    """A params line as a value: an immutable mapping name -> int32, iterated in tor's order.

    Built from a mapping or ``(name, value)`` pairs in any order (``check_pairs``: an item tor could
    not read back raises DocumentError), or parsed from a line with ``parse`` (``parse_params``: tor's
    rules, order included). ``format()`` / ``str()`` is the body tor writes after ``params`` in a vote
    or consensus (strcmp order of ``key=value``). Two values are equal when they hold the same items;
    a ConsensusParams never equals a plain dict (compare ``as_dict()``).
    """

    pairs: tuple[tuple[str, int], ...]  # in tor's order
    _index: Mapping[str, int] = attrs.field(eq=False)
    _line: str = attrs.field(eq=False)

    def __init__(self, params: ParamsLike = (), where: str = "params") -> None:
        if isinstance(params, ConsensusParams):
            self.__attrs_init__(params.pairs, params._index, params._line)
            return
        if isinstance(params, (str, bytes)):
            raise TypeError("ConsensusParams takes a mapping or (name, value) pairs: "
                            "use ConsensusParams.parse for a params line")
        pairs = check_pairs(params, where)
        self.__attrs_init__(pairs, dict(pairs), _join(pairs))

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def parse(cls, line: str, where: str = "params line") -> ConsensusParams:
        """A params line as tor reads it, with or without its ``params`` keyword.

        Raises DocumentError naming ``where`` for anything tor rejects the document for (item
        without ``=``, non-integer or non-int32 value, a keyword twice, items not in strictly
        increasing strcmp order of ``key=value``).
        """
        words = line.split(None, 1)
        body = (words[1] if len(words) > 1 else "") if words[:1] == ["params"] else line
        return cls(parse_params(body, where), where)

    @classmethod
    def from_pairs(cls, pairs: ParamsLike, where: str = "params") -> ConsensusParams:
        """From ``(name, value)`` pairs (or a mapping) in any order; DocumentError naming ``where``
        for a bad keyword, a non-int32 value or a keyword twice."""
        return cls(pairs, where)

    # -- the mapping ---------------------------------------------------------------------------

    def __getitem__(self, name: str) -> int:
        return self._index[name]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def as_dict(self) -> dict[str, int]:
        """A plain dict, in tor's order."""
        return dict(self.pairs)

    # -- text ----------------------------------------------------------------------------------

    def format(self) -> str:
        """The line's body as tor writes it: ``k=v`` items in strcmp order of ``key=value``, one space
        apart ("" when empty)."""
        return self._line

    def __str__(self) -> str:
        return self._line

    def __repr__(self) -> str:
        return f"ConsensusParams.parse({self._line!r})"

    # -- new values ----------------------------------------------------------------------------

    def with_values(self, values: ParamsLike = (), /, **named: int) -> ConsensusParams:
        """These params with ``values`` (and keyword arguments) set, added or replaced."""
        merged = dict(self.pairs)
        merged.update(ConsensusParams(values).pairs)
        merged.update(ConsensusParams(named).pairs)
        return ConsensusParams(merged)

    def merge(self, other: ParamsLike) -> ConsensusParams:
        """Every key of both; ``other``'s value wins where both have one."""
        return self.with_values(other)

    def without(self, names: str | Iterable[str]) -> ConsensusParams:
        """These params less ``names`` (one name or several; names not present are ignored)."""
        drop = {names} if isinstance(names, str) else set(names)
        return ConsensusParams(tuple((k, v) for k, v in self.pairs if k not in drop))

    def diff(self, other: ParamsLike) -> ParamsDiff:
        """What changes from these params to ``other``."""
        new = other if isinstance(other, ConsensusParams) else ConsensusParams(other)
        return ParamsDiff(
            added=ConsensusParams((k, v) for k, v in new.pairs if k not in self._index),
            removed=ConsensusParams((k, v) for k, v in self.pairs if k not in new),
            changed=tuple((k, self._index[k], v) for k, v in new.pairs if k in self._index and self._index[k] != v),
        )

    # -- tor's bounds --------------------------------------------------------------------------

    def validate(self, version: TorVersion | str | None = None) -> tuple[OutOfBounds, ...]:
        """Values a tor of ``version`` (default: the newest) clamps when it reads them, in tor's order.

        A ConsensusParams always holds what tor accepts in a document (int32 values, keywords once);
        a value outside a parameter's bounds is accepted too, and raised to the minimum or lowered
        to the maximum by ``networkstatus_get_param``. Only parameters of ``kistexp.params``'
        catalogue have known bounds; others, and parameters that version does not read, are skipped.
        """
        if isinstance(version, str):
            version = TorVersion.parse(version)
        out = []
        for name, value in self.pairs:
            entry = tor_params.get(name)
            if entry is None:
                continue
            bounds = entry.current if version is None else entry.bounds_for(version)
            if bounds is not None and not bounds.minimum <= value <= bounds.maximum:
                out.append(OutOfBounds(name, value, bounds))
        return tuple(out)
