"""Typed reading of parsed TOML tables with located errors, shared by the plan loader
(kistexp/plan/loader.py) and the sweep loader (kistexp/sweep/spec.py).

A ``Source`` is the file being loaded; a ``Table`` is one of its tables with its key path and
getters that check types and bounds. Every problem is a PlanError whose message names the
file, the line of the key (kistexp/plan/locate.py), the key path and what is wrong.
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Mapping
from typing import Any

from kistexp.durations import parse_duration
from kistexp.errors import PlanError
from kistexp.plan.locate import index_lines, line_of

#: The longest string a table's getters accept.
MAX_STRING = 10_000


class Source:
    """The file being loaded: raises located errors."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self._text = text
        self._index: dict[str, int] | None = None

    def error(self, key: str, problem: str) -> PlanError:
        if self._index is None:
            self._index = index_lines(self._text)
        line = line_of(self._index, key) if key else None
        where = f"{self.path}:{line}" if line else self.path
        message = f"{where}: {key}: {problem}" if key else f"{where}: {problem}"
        return PlanError(message, file=self.path, line=line, key=key, problem=problem)


class Table:
    """A TOML table with its key path; typed getters that fail with located errors."""

    def __init__(self, src: Source, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise src.error(path, f"expected a table, got {type_name(data)}")
        self.src, self.data, self.path = src, data, path

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(allowed)})"
                raise self.src.error(self.key(str(key)), f"unknown key{hint}")

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, required: bool, default: Any) -> Any:
        """The value under ``name`` as TOML gave it (``default`` when absent and not required)."""
        if name not in self.data:
            if required:
                raise self.src.error(self.path, f"missing required key {name!r}")
            return default
        return self.data[name]

    def string(self, name: str, required: bool = True, default: str = "") -> str:
        value = self.raw(name, required, default)
        if not isinstance(value, str):
            raise self.src.error(self.key(name), f"expected a string, got {type_name(value)}")
        if len(value) > MAX_STRING:
            raise self.src.error(self.key(name), f"string is longer than {MAX_STRING} characters")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.string(name, required=default is None, default=default or "")
        if value not in choices:
            raise self.src.error(self.key(name), f"{value!r} is not one of {', '.join(choices)}")
        return value

    def integer(self, name: str, low: int, high: int, required: bool = True, default: int = 0) -> int:
        value = self.raw(name, required, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.src.error(self.key(name), f"expected an integer, got {type_name(value)}")
        if not low <= value <= high:
            raise self.src.error(self.key(name), f"{value} is outside {low}..{high}")
        return value

    def number(self, name: str, required: bool = True, default: float = 0.0) -> float:
        value = self.raw(name, required, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.src.error(self.key(name), f"expected a number, got {type_name(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise self.src.error(self.key(name), "expected a finite number")
        try:
            return float(value)
        except OverflowError:  # an integer such as 10**400 has no float
            raise self.src.error(self.key(name), f"{str(value)[:12]}... ({len(str(value))} digits) is too large "
                                                 "for a number (at most about 1.8e308)") from None

    def duration(self, name: str, required: bool = True, default: str = "") -> dt.timedelta:
        text = self.string(name, required, default)
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise self.src.error(self.key(name), str(exc)) from None

    def table(self, name: str, required: bool = True) -> Table | None:
        value = self.raw(name, required, None)
        return None if value is None else Table(self.src, value, self.key(name))

    def array(self, name: str, required: bool = True, limit: int = 1000) -> list[Any]:
        value = self.raw(name, required, [])
        if not isinstance(value, list):
            raise self.src.error(self.key(name), f"expected an array, got {type_name(value)}")
        if len(value) > limit:
            raise self.src.error(self.key(name), f"has {len(value)} entries, more than the limit of {limit}")
        return value

    def strings(self, name: str, required: bool = True, limit: int = 1000) -> tuple[str, ...]:
        items = self.array(name, required, limit)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.src.error(f"{self.key(name)}[{i}]", f"expected a string, got {type_name(item)}")
        return tuple(items)


def type_name(value: Any) -> str:
    """What a TOML value is, for messages: "an integer", "a table", ..."""
    return {
        bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
        dict: "a table", dt.datetime: "a date-time", dt.date: "a date", dt.time: "a time",
    }.get(type(value), type(value).__name__)
