"""Durations as plans, options and the fake authorities write them: "14d", "36h", "90m", "1w2d", "30s"."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
# ASCII digits only (\d also matches "١٢"), at most 12 per part (more than ten years anyway; int() of
# thousands of digits is slow and past 4,300 raises).
_PART_RE = re.compile(r"([0-9]{1,12})([wdhms])")
_WHOLE_RE = re.compile(r"(?:[0-9]{1,12}[wdhms])+")


def parse_duration(text: str) -> dt.timedelta:
    """Parse a positive duration; raises ValueError with a short reason."""
    if not isinstance(text, str):
        raise ValueError(f"expected a duration string such as \"14d\", got {type(text).__name__}")
    shown = text if len(text) <= 40 else text[:40] + "..."
    compact = text.strip().replace(" ", "")
    if compact.startswith("-"):
        raise ValueError(f"duration {shown!r} is negative")
    if not compact or not _WHOLE_RE.fullmatch(compact):
        raise ValueError(f"{shown!r} is not a duration (use e.g. \"14d\", \"36h\", \"90m\", \"1w2d\")")
    seconds = sum(int(n) * _UNITS[u] for n, u in _PART_RE.findall(compact))
    if seconds <= 0:
        raise ValueError(f"duration {shown!r} must be longer than zero")
    if seconds > 10 * 365 * 86400:
        raise ValueError(f"duration {shown!r} is longer than ten years")
    return dt.timedelta(seconds=seconds)


def format_duration(delta: dt.timedelta, resolution_s: int = 60) -> str:
    """Shortest form, rounded up to ``resolution_s``: 1209600 s -> "14d", 5400 s -> "1h30m"."""
    seconds = int(delta.total_seconds())
    if resolution_s > 1 and seconds % resolution_s:
        seconds += resolution_s - seconds % resolution_s if seconds > 0 else -(seconds % resolution_s)
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    parts = []
    for unit in ("d", "h", "m", "s"):
        n, seconds = divmod(seconds, _UNITS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return sign + "".join(parts)
