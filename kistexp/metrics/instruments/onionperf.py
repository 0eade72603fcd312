"""One OnionPerf vantage point, read from its day files in Tor Metrics' layout.

``<base>/YYYY-MM-DD.<vantage>.onionperf.analysis.json.xz`` (or ``.json``), one file per vantage
point per UTC day (CollecTor's ``recent/onionperf/``, metrics-sources.md §3.1), where ``<base>``
is an http(s) URL or a local directory. A day's file grows until the day ends, so each poll
reads today's file and, during the first hours of a day, yesterday's (its last transfers land
after midnight). Unchanged files cost nothing: conditional requests (``If-None-Match`` with the
ETag, ``If-Modified-Since``) answered 304, or an unchanged size, mtime and inode for a local file.

A changed file is parsed whole by the OnionPerf collector and only the transfers and circuits
not returned before are returned: keyed by (source, stream or circuit id, start time), held
for the days in view only, so a re-served, re-written or re-analysed file is never counted twice
and memory stays within two days of the collector's limits (50k streams, 500k circuits each).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx

from kistexp import safeio
from kistexp.metrics.collectors import CorruptSource, httpfetch
from kistexp.metrics.collectors import onionperf as op
from kistexp.metrics.collectors.httpfetch import FetchLimits, StatusError
from kistexp.metrics.instruments.base import Polled, labelled, metrics_of, summarise
from kistexp.metrics.series import Sample, to_us

KIND = op.KIND
SUFFIXES = (".json.xz", ".json")  # Tor Metrics serves .xz; a vantage's own directory may hold either
_MISSING_STATUS = frozenset({404, 410})


@attrs.frozen
class OnionPerfLimits:
    """Bounds of one poll. A full day of a fast vantage is about 3 MB of xz (31 MB of JSON,
    metrics-sources.md §5.2): 60 s per attempt is 50 KB/s."""

    timeout_s: float = 60.0  # one attempt at one file: connect, headers and body
    retries: int = 2  # more attempts after a failure worth one (cannot connect, timeout, 5xx)
    backoff_s: float = 1.0
    backoff_max_s: float = 8.0
    poll_s: float = 240.0  # the whole poll, every file, attempt and wait: well inside a 5-minute cadence
    grace: dt.timedelta = dt.timedelta(hours=1)  # today's file may be missing this long into the day
    previous_day: dt.timedelta = dt.timedelta(hours=3)  # yesterday's file is read this long into the day
    max_remembered_problems: int = 10_000  # per day: bad records are reported once, not at every poll
    analysis: op.Limits = op.Limits()  # the collector's: 64 MiB compressed, 1 GiB raw, 50k streams, 500k circuits

    def fetch(self) -> FetchLimits:
        return FetchLimits(self.timeout_s, self.analysis.max_compressed, self.retries, self.backoff_s,
                           self.backoff_max_s)


@attrs.define
class _Day:
    """What is known of one day's file between polls."""

    location: str = ""  # URL or path of the file that answered
    etag: str | None = None
    last_modified: str | None = None
    stat_key: tuple[int, int, int] | None = None  # size, mtime_ns, inode of a local file
    sha256: str | None = None  # of the last body parsed: the same body again is not parsed again
    failure: str = ""  # the unchanged file is still unusable for this reason
    seen: set[int] = attrs.field(factory=set)  # transfer and circuit keys returned
    reported: set[str] = attrs.field(factory=set)  # record problems already reported


class _Missing(Exception):
    """No file for the day (HTTP 404/410 or no such file)."""


class OnionPerfInstrument(Polled):
    """Polls one vantage point's day files; each poll returns the transfers (client_* metrics)
    and circuits (circuit_build_time_s) new since the last one, labelled as the collector labels
    them (source, server, size) plus ``instance``. The first poll returns what the files in view
    already hold, except transfers started and circuits launched before ``since``, if given."""

    kind = KIND

    def __init__(self, vantage: str, base: str | Path, *, name: str | None = None,
                 limits: OnionPerfLimits = OnionPerfLimits(), honour_filters: bool = False,
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep,
                 since: dt.datetime | None = None) -> None:
        self.vantage = vantage
        self.since = since
        self.name = name or f"{KIND}:{vantage}"
        self.metrics = metrics_of(KIND)
        self.limits = limits
        self.honour_filters = honour_filters
        self.remote = isinstance(base, str) and base.startswith(("http://", "https://"))
        self.base: str | Path = base.rstrip("/") if self.remote else Path(base)  # type: ignore[union-attr]
        self._transport = transport
        self._sleep = sleep
        self._suffix: str | None = None  # the suffix the vantage's files have, once one was found
        self._days: dict[dt.date, _Day] = {}

    def location(self, day: dt.date, suffix: str = SUFFIXES[0]) -> str:
        name = f"{day:%Y-%m-%d}.{self.vantage}.onionperf.analysis{suffix}"
        return f"{self.base}/{name}" if self.remote else str(Path(self.base) / name)

    def close(self) -> None:
        self._days.clear()

    # -- one poll -------------------------------------------------------------------------------

    def _poll(self, now: dt.datetime) -> tuple[list[tuple[str, Sample]], str]:
        now = now.astimezone(dt.timezone.utc)
        today = now.date()
        into_day = now - dt.datetime.combine(today, dt.time(), dt.timezone.utc)
        days = ([today - dt.timedelta(days=1)] if into_day < self.limits.previous_day else []) + [today]
        for gone in set(self._days) - set(days):  # a day out of view: its keys are not needed any more
            del self._days[gone]
        until = time.monotonic() + self.limits.poll_s
        pairs: list[tuple[str, Sample]] = []
        problems: list[str] = []
        for day in days:
            state = self._days.setdefault(day, _Day())
            try:
                analysis = self._read(day, state, now, until)
            except _Missing:
                if day == today and into_day >= self.limits.grace:
                    problems.append(f"{self.location(day, self._suffix or '.json[.xz]')}: no file for {day} "
                                    f"{_hm(into_day)} into the day (the vantage writes nothing, or elsewhere)")
                elif day != today and state.location:
                    problems.append(f"{state.location}: the file of {day} disappeared")
                continue
            except CorruptSource as exc:
                state.failure = str(exc)
                problems.append(state.failure)
                continue
            except Exception as exc:  # one day's failure must not lose the other day's samples
                problems.append(str(exc) or type(exc).__name__)
                continue
            if analysis is None:  # not modified since the last poll
                if state.failure:
                    problems.append(state.failure)
                continue
            state.failure = ""
            pairs += self._new(analysis, state)
            problems += self._new_problems(analysis, state)
        return pairs, summarise(problems)

    def _read(self, day: dt.date, state: _Day, now: dt.datetime, until: float) -> op.Analysis | None:
        """The day's file parsed, None if unchanged since the last poll; _Missing if there is none."""
        suffixes = (self._suffix,) if self._suffix else SUFFIXES
        for suffix in suffixes:
            where = self.location(day, suffix)
            body = self._fetch(where, state, until) if self.remote else self._read_local(Path(where), state)
            if body is _ABSENT:
                continue
            self._suffix = suffix
            if body is None:
                return None
            digest = hashlib.sha256(body).hexdigest()
            if digest == state.sha256:
                return None  # the same bytes again (a server without validators): nothing new in them
            state.location, state.sha256 = where, digest
            return op.load_bytes(body, where, limits=self.limits.analysis, now=now)
        raise _Missing

    def _fetch(self, url: str, state: _Day, until: float) -> bytes | None | object:
        headers = {}
        if state.location == url:  # validators belong to the URL that gave them
            if state.etag:
                headers["If-None-Match"] = state.etag
            if state.last_modified:
                headers["If-Modified-Since"] = state.last_modified
        try:
            answer = httpfetch.get(url, limits=self.limits.fetch(), headers=headers, statuses=(200, 304),
                                   transport=self._transport, until=until, sleep=self._sleep)
        except StatusError as exc:
            if exc.status in _MISSING_STATUS:
                return _ABSENT
            raise
        if answer.status == 304:
            return None
        state.location = url
        state.etag = answer.headers.get("etag")
        state.last_modified = answer.headers.get("last-modified")
        return answer.body

    def _read_local(self, path: Path, state: _Day) -> bytes | None | object:
        try:
            st = path.stat()
        except FileNotFoundError:
            return _ABSENT
        except OSError as exc:
            raise CorruptSource(f"{path}: cannot read: {exc.strerror or exc}") from None
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if state.location == str(path) and state.stat_key == key:
            return None
        # A vantage rewriting its file while it is read makes safeio refuse it ("grew while it was
        # read"): read again, a bounded number of times, before calling it a problem.
        for attempt in range(self.limits.retries + 1):
            try:
                data = safeio.read_bounded(path, self.limits.analysis.max_compressed, "OnionPerf analysis",
                                           CorruptSource)
                break
            except CorruptSource:
                if attempt == self.limits.retries:
                    raise
                self._sleep(min(self.limits.backoff_max_s, self.limits.backoff_s * 2**attempt))
        state.location, state.stat_key = str(path), key
        return data

    def _new(self, a: op.Analysis, state: _Day) -> list[tuple[str, Sample]]:
        """Samples of the transfers and circuits of ``a`` not returned before by this instrument."""
        held = [d.seen for d in self._days.values()]  # a record is returned once, whichever day's file holds it

        def fresh(key: int) -> bool:
            if any(key in s for s in held):
                return False
            state.seen.add(key)
            return True

        since = self.since
        transfers = [t for t in op.kept_transfers(a, honour_filters=self.honour_filters)
                     if (since is None or t.start >= since)
                     and fresh(hash(("t", t.source, t.stream_id, to_us(t.start))))]
        circuits = [c for c in op.kept_circuits(a, honour_filters=self.honour_filters)
                    if (since is None or c.launched >= since)
                    and fresh(hash(("c", c.source, c.circuit_id, to_us(c.launched))))]
        pairs = op.transfer_samples(transfers) + op.circuit_samples(circuits)
        return labelled(pairs, {"instance": self.name}, self.metrics)

    def _new_problems(self, a: op.Analysis, state: _Day) -> list[str]:
        """The file's bad records, each reported at the first poll that meets it only."""
        new = [p for p in a.problems if p not in state.reported]
        room = self.limits.max_remembered_problems - len(state.reported)
        state.reported.update(new[:max(room, 0)])
        return new


_ABSENT = object()  # no such file (as opposed to None: unchanged)


def _hm(span: dt.timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"
