"""OnionPerf analysis files as Tor Metrics publishes them: one
``YYYY-MM-DD.<vantage>.onionperf.analysis.json`` (version 3.1) per vantage point and UTC day,
holding the day's tgen streams and the client tor's circuits and streams
(``OnionPerfDayFiles``). A file is rewritten whole (temporary file and rename) while its day
grows, extends an earlier run's file of the same day instead of overwriting it, and leaves
memory once final.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kistexp.errors import LocalNetError
from kistexp.localnet.spec import LOOPBACK
from kistexp.safeio import read_bounded_text, write_atomic

ANALYSIS_VERSION = "3.1"
#: OnionPerf's data source names (schema ``propertyNames``); client nicknames fit.
_SOURCE_NAME = re.compile(r"^[A-Za-z0-9-]+$")
#: A day file is re-read at start (to extend, not overwrite, an earlier run's day); OnionPerf's
#: busiest day holds 31 MB raw (§5.2).
MAX_DAY_FILE_BYTES = 256 * 1024 * 1024
#: A day's records stay in memory this long after UTC midnight, for transfers and circuits that
#: end just after it but are handed over a little later.
DAY_GRACE_S = 300.0


def _utc_day(unix: float) -> dt.date:
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).date()


def day_file_name(day: dt.date, vantage: str) -> str:
    """Tor Metrics' name of an OnionPerf analysis day file (uncompressed)."""
    return f"{day:%Y-%m-%d}.{vantage}.onionperf.analysis.json"


class _Day:
    """One UTC day of one vantage point: each record kept as its JSON text, so a rewrite joins
    strings instead of encoding the whole day again."""

    def __init__(self, day: dt.date) -> None:
        self.day = day
        self.tgen: dict[str, str] = {}
        self.circuits: dict[str, str] = {}
        self.streams: dict[str, str] = {}
        self.dirty = True
        self.max_number = 0


class OnionPerfDayFiles:
    """The day files of one vantage point; thread-safe. ``flush`` writes every day that changed
    (temp file and rename) and forgets days whose file is final."""

    def __init__(self, out_dir: Path | str, vantage: str, *, measurement_ip: str = LOOPBACK,
                 guards: Callable[[], list[dict]] = list, grace_s: float = DAY_GRACE_S) -> None:
        if not _SOURCE_NAME.match(vantage):
            raise LocalNetError(f"vantage point name {vantage!r} is not an OnionPerf source name ([A-Za-z0-9-]+)")
        self.out_dir = Path(out_dir)
        self.vantage = vantage
        self.measurement_ip = measurement_ip
        self.guards = guards
        self.grace_s = grace_s
        self.late_records = 0  # records for a day already final and forgotten
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._days: dict[dt.date, _Day] = {}
        self._final: set[dt.date] = set()
        self._write_lock = threading.Lock()  # one flush at a time: an older rendering never lands last

    def path(self, day: dt.date) -> Path:
        return self.out_dir / day_file_name(day, self.vantage)

    def next_number(self) -> int:
        """A tgen stream id above every one in today's file (an earlier run's included)."""
        with self._lock:
            day = self._day(_utc_day(time.time()))
            return (day.max_number + 1) if day else 1

    def _day(self, day: dt.date) -> _Day | None:
        if day in self._final:
            return None
        entry = self._days.get(day)
        if entry is None:
            entry = self._days[day] = _Day(day)
            self._load_existing(entry)
        return entry

    def _load_existing(self, entry: _Day) -> None:
        """Extend an earlier run's file for the same day instead of overwriting it; a file that
        cannot be read is kept aside under another name."""
        path = self.path(entry.day)
        if not path.exists():
            return
        try:
            doc = json.loads(read_bounded_text(path, MAX_DAY_FILE_BYTES, "OnionPerf day file", LocalNetError))
            source = doc["data"][self.vantage]
            for key, rec in source["tgen"]["streams"].items():
                entry.tgen[key] = json.dumps(rec)
                first = str(key).split(":", 1)[0]
                if first.isdecimal():
                    entry.max_number = max(entry.max_number, int(first))
            for key, rec in source.get("tor", {}).get("circuits", {}).items():
                entry.circuits[str(key)] = json.dumps(rec)
            for key, rec in source.get("tor", {}).get("streams", {}).items():
                entry.streams[str(key)] = json.dumps(rec)
        except (LocalNetError, ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.unreadable-{int(time.time())}")
            with contextlib.suppress(OSError):
                path.rename(aside)
            entry.tgen.clear(), entry.circuits.clear(), entry.streams.clear()
            self.problems.append(f"{path}: not a readable analysis file ({exc}); kept as {aside.name}")

    def add(self, kind: str, key: str, record: dict, end_unix: float) -> None:
        """Add a finished record (kind "tgen", "circuit" or "stream") to the day it ended on."""
        text = json.dumps(record)
        with self._lock:
            day = self._day(_utc_day(end_unix))
            if day is None:
                self.late_records += 1
                return
            {"tgen": day.tgen, "circuit": day.circuits, "stream": day.streams}[kind][key] = text
            if kind == "tgen":
                first = key.split(":", 1)[0]
                if first.isdecimal():
                    day.max_number = max(day.max_number, int(first))
            day.dirty = True

    @property
    def dirty(self) -> bool:
        with self._lock:
            return any(d.dirty for d in self._days.values())

    def render(self, day: dt.date) -> str:
        guards = json.dumps(self.guards())
        with self._lock:
            entry = self._days.get(day)
            return self._render(entry, guards) if entry else ""

    def _render(self, entry: _Day, guards: str) -> str:
        def obj(items: Mapping[str, str]) -> str:
            return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in items.items()) + "}"

        tor = f'{{"circuits": {obj(entry.circuits)}, "guards": {guards}, "streams": {obj(entry.streams)}}}'
        source = (f'{{"measurement_ip": {json.dumps(self.measurement_ip)}, "tgen": {{"streams": {obj(entry.tgen)}}}, '
                  f'"tor": {tor}}}')
        return (f'{{"data": {{{json.dumps(self.vantage)}: {source}}}, "type": "onionperf", '
                f'"version": "{ANALYSIS_VERSION}"}}\n')

    def flush(self, now_unix: float | None = None, force: bool = False) -> tuple[Path, ...]:
        """Write each day that changed (all days with ``force``); forget days over ``grace_s``
        past their end once written. Returns the files written."""
        with self._write_lock:
            return self._flush(time.time() if now_unix is None else now_unix, force)

    def _flush(self, now_unix: float, force: bool) -> tuple[Path, ...]:
        today = _utc_day(now_unix)
        written = []
        guards = json.dumps(self.guards())
        with self._lock:
            pending = [(d.day, self._render(d, guards)) for d in self._days.values() if d.dirty or force]
            for d in self._days.values():
                d.dirty = False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for day, text in pending:
            try:
                write_atomic(self.path(day), text.encode(), "OnionPerf day file", LocalNetError)
                written.append(self.path(day))
            except LocalNetError as exc:
                self.problems.append(str(exc))
                with self._lock:
                    if day in self._days:
                        self._days[day].dirty = True
        with self._lock:
            for day in list(self._days):
                ends = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone.utc).timestamp()
                if day < today and now_unix >= ends + self.grace_s and not self._days[day].dirty:
                    del self._days[day]
                    self._final.add(day)
        return tuple(written)

    def days_in_memory(self) -> tuple[dt.date, ...]:
        with self._lock:
            return tuple(sorted(self._days))
