"""The one clock seam: everything that waits or reads the time takes a ``Clock``.

``RealClock`` is the wall clock. ``VirtualClock`` is simulated time: it jumps straight to the
next due call, so a dry run replays weeks of voting rounds in seconds (rollout.md §2.5).
Times are aware UTC datetimes; ``timestamp()`` gives POSIX seconds for code that counts in
seconds (the fake authorities' schedule).
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

UTC = dt.timezone.utc


def as_utc(t: dt.datetime | float | int) -> dt.datetime:
    """An aware UTC datetime from a datetime (naive = UTC, as directory documents write) or POSIX seconds."""
    if isinstance(t, dt.datetime):
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return dt.datetime.fromtimestamp(float(t), tz=UTC)


class Timer:
    """A call scheduled with ``call_at``; ``cancel()`` stops it if it has not run."""

    def __init__(self, when: dt.datetime, fn: Callable[[], object]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False
        self._thread: threading.Timer | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self._thread is not None:
            self._thread.cancel()


@runtime_checkable
class Clock(Protocol):
    def now(self) -> dt.datetime: ...

    def timestamp(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep_until(self, t: dt.datetime) -> None: ...

    def call_at(self, t: dt.datetime, fn: Callable[[], object]) -> Timer: ...


class RealClock:
    """Wall-clock time; ``call_at`` runs ``fn`` on a timer thread."""

    virtual = False

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)

    def timestamp(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep_until(self, t: dt.datetime) -> None:
        # short naps: a wall-clock jump (NTP step, suspend) is noticed within a second
        target = as_utc(t).timestamp()
        while True:
            left = target - time.time()
            if left <= 0:
                return
            time.sleep(min(left, 1.0))

    def call_at(self, t: dt.datetime, fn: Callable[[], object]) -> Timer:
        timer = Timer(as_utc(t), fn)

        def run() -> None:
            if not timer.cancelled:
                fn()

        timer._thread = threading.Timer(max(0.0, as_utc(t).timestamp() - time.time()), run)
        timer._thread.daemon = True
        timer._thread.start()
        return timer


class VirtualClock:
    """Simulated time that advances only when asked, straight to the next due call.

    ``run_until(t)`` (or ``sleep_until(t)`` with ``auto_advance``, the default) runs every call
    due up to ``t`` in time order (ties in the order they were scheduled), with ``now()`` equal
    to each call's time while it runs, then leaves the clock at ``t``. Calls may schedule
    further calls. With ``auto_advance=False`` other threads' ``sleep_until`` block until the
    driving thread moves time past their wake-up, which is how threads of the fake authorities
    follow a clock driven from elsewhere.
    """

    virtual = True

    def __init__(self, start: dt.datetime | float, *, auto_advance: bool = True) -> None:
        self._now = as_utc(start)
        self._start = self._now
        self._heap: list[tuple[dt.datetime, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.RLock())
        self.auto_advance = auto_advance

    def now(self) -> dt.datetime:
        with self._cond:
            return self._now

    def timestamp(self) -> float:
        return self.now().timestamp()

    def monotonic(self) -> float:
        return (self.now() - self._start).total_seconds()

    def call_at(self, t: dt.datetime, fn: Callable[[], object]) -> Timer:
        timer = Timer(as_utc(t), fn)
        with self._cond:
            heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
            self._cond.notify_all()
        return timer

    def next_due(self) -> dt.datetime | None:
        """Time of the earliest pending call, or None."""
        with self._cond:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
            return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Advance to the next due call and run it; False when none is pending."""
        with self._cond:
            due = self.next_due()
            if due is None:
                return False
            _, _, timer = heapq.heappop(self._heap)
            if timer.when > self._now:
                self._now = timer.when
            self._cond.notify_all()
        timer.fn()
        return True

    def run_until(self, t: dt.datetime) -> None:
        target = as_utc(t)
        while True:
            due = self.next_due()
            if due is None or due > target:
                break
            self.step()
        with self._cond:
            if target > self._now:
                self._now = target
            self._cond.notify_all()

    def advance(self, seconds: float) -> None:
        self.run_until(self.now() + dt.timedelta(seconds=seconds))

    def sleep_until(self, t: dt.datetime) -> None:
        target = as_utc(t)
        if self.auto_advance:
            self.run_until(target)
            return
        with self._cond:
            while self._now < target:
                self._cond.wait(0.5)
