"""The `params` line of votes and consensuses (dir-spec; dirspec-params.md §1.1).

tor sorts and checks the whole ``key=value`` strings with strcmp, not the keywords, so
``Foo1=1 Foo=2`` is the correct order (``1`` < ``=``). Any mis-ordering, duplicate key,
item without ``=`` or non-int32 value makes tor reject the whole document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kistexp.errors import DocumentError

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# tor's keyword: anything up to '=' without whitespace; values are decimal int32.
_VALUE_RE = re.compile(r"^[+-]?[0-9]+\Z")


def tor_item_key(item: tuple[str, int]) -> bytes:
    """Sort key tor uses for params items: the bytes of ``key=value`` (strcmp order)."""
    return f"{item[0]}={item[1]}".encode()


def sort_params(params: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """Items in tor's order (strcmp on ``key=value``)."""
    items = params.items() if isinstance(params, Mapping) else params
    return tuple(sorted(((str(k), int(v)) for k, v in items), key=tor_item_key))


def format_params(params: Mapping[str, int] | Iterable[tuple[str, int]]) -> str:
    """The space-separated ``k=v`` body, in tor's order."""
    return " ".join(f"{k}={v}" for k, v in sort_params(params))


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
        value = int(raw)
        if not INT32_MIN <= value <= INT32_MAX:
            raise DocumentError(f"{where}: {key}={raw} is outside the int32 range")
        if key in seen:
            raise DocumentError(f"{where}: {key} is listed twice")
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
