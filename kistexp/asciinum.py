"""Whole numbers as users, files and servers write them: ASCII digits only.

``str.isdigit()`` and ``int()`` accept far more than ``0-9``: ``"²".isdigit()`` is True (and ``int("²")``
then raises), ``int("١٢")`` (Arabic-Indic) is 12, ``int("1_000")`` is 1000, and ``int()`` of more than
4,300 digits raises ValueError. A port, a count or a duration is none of those, so every such field is
matched against ``[0-9]`` with fullmatch (a ``$`` would also let a trailing newline through) and a digit cap
that keeps ``int()`` cheap, before it is converted.
"""

from __future__ import annotations

import re

_UINT_RE = re.compile(r"[0-9]{1,18}")
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")


def ascii_uint(text: str) -> int | None:
    """``text`` as a non-negative integer if it is 1 to 18 ASCII digits, else None."""
    return int(text) if isinstance(text, str) and _UINT_RE.fullmatch(text) else None


def ascii_port(text: str) -> int | None:
    """A TCP port 1..65535 written in ASCII digits, else None."""
    value = ascii_uint(text)
    return value if value is not None and 0 < value < 65536 else None


def ascii_int(text: str) -> int | None:
    """``text`` as an integer if it is 1 to 18 ASCII digits with an optional sign, else None."""
    return int(text) if isinstance(text, str) and _INT_RE.fullmatch(text) else None
