"""Two drivers over the same triggers (rollout.md §2.5).

``VirtualDriver``: pop the earliest fire time, move the virtual clock there, step; no sleeping.
``LiveDriver``: APScheduler 3 as the alarm clock only: one ``kistexp-wakeup`` DateTrigger job at
the engine's earliest fire time, re-armed after every step, plus a command poll. ``coalesce``,
``max_instances=1`` and ``misfire_grace_time=None`` because the 3.x default grace of 1 s drops a
late run as EVENT_JOB_MISSED and would stall the engine after a suspend.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

from apscheduler.schedulers.background import BackgroundScheduler

from kistexp.clock import UTC, RealClock, VirtualClock
from kistexp.rollout.engine import Engine
from kistexp.rollout.triggers import date_trigger, interval_trigger


class VirtualDriver:
    def __init__(self, engine: Engine, clock: VirtualClock) -> None:
        self.engine, self.clock = engine, clock

    def run(self, until: dt.datetime | None = None, on_step=None, stop=None) -> None:
        """Step until terminal, past ``until``, or ``stop(engine)`` says so."""
        self.engine.step(self.clock.now())  # on resume: queued commands and overdue events first
        while not self.engine.status.terminal and not (stop is not None and stop(self.engine)):
            t = self.engine.next_wakeup(self.clock.now())
            if t is None or (until is not None and t > until):
                # nothing more for the engine before ``until``: the clock's other calls (the
                # authorities' rounds) still run up to it; a finished run leaves the clock alone
                if until is not None and self.clock.now() < until:
                    self.clock.run_until(until)
                break
            if t > self.clock.now():
                self.clock.run_until(t)
            self.engine.step(max(t, self.clock.now()))
            if on_step is not None:
                on_step(self.engine)


class _SkipWhileRunning(logging.Filter):
    """Drops APScheduler's warning that a wakeup was skipped because the previous one still runs:
    the poll and the armed wakeup share one step under a lock, so a step longer than the poll
    period skips polls by design (the next one catches up); a user's terminal should not fill
    with that. Errors and every other message pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and "maximum number of running instances" in record.msg)


_SCHEDULER_LOG = logging.getLogger("kistexp.rollout.wakeup")
_SCHEDULER_LOG.addFilter(_SkipWhileRunning())


class LiveDriver:
    """Steps the engine in real time. Each step compares how far the wall clock and the monotonic
    clock moved since the last one: a difference over ``JUMP_S`` is a clock jump (NTP step, suspend
    resume, an operator setting the date). The engine's events are keyed by their due times and
    journaled, so a jump backward cannot fire one twice and a jump forward processes every skipped
    one, late and in order; the jump itself is journaled and the wakeup re-armed (rollout.md §2.6).
    APScheduler is armed with a delay from now, so its own reading of the wall clock cannot put the
    wakeup an hour off after a jump."""

    JOB = "kistexp-wakeup"
    JUMP_S = 2.0

    def __init__(self, engine: Engine, clock: RealClock, poll_s: float = 2.0, stop=None, heartbeat=None) -> None:
        self.engine, self.clock, self.poll_s, self.stop = engine, clock, poll_s, stop
        self.heartbeat = heartbeat
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sched = BackgroundScheduler(timezone=UTC, logger=_SCHEDULER_LOG)
        self._last: tuple[dt.datetime, float] | None = None
        self.jumps: list[float] = []

    def _check_jump(self) -> None:
        wall, mono = self.clock.now(), self.clock.monotonic()
        if self._last is not None:
            jump = (wall - self._last[0]).total_seconds() - (mono - self._last[1])
            if abs(jump) > self.JUMP_S:
                self.jumps.append(jump)
                self.engine.clock_jump(wall, jump)
        self._last = (wall, mono)

    def _wake(self) -> None:
        with self._lock:
            if self.done.is_set():
                return  # the run is ending (see run): no step, and above all no re-arming
            try:
                self._check_jump()
                if self.heartbeat is not None:
                    self.heartbeat(self.clock.now(), self.clock.monotonic())
                self.engine.step(self.clock.now())
            except BaseException as exc:  # surface to run(); the journal keeps the place
                self.error = exc
                self.done.set()
                return
            if self.engine.status.terminal or (self.stop is not None and self.stop(self.engine)):
                self.done.set()
                return
            self._arm()

    def _arm(self) -> None:
        now = self.clock.now()
        t = self.engine.next_wakeup(now)
        if t is None:
            self.done.set()
            return
        delay = max(t - now, dt.timedelta(0))
        self._sched.add_job(self._wake, date_trigger(dt.datetime.now(UTC) + delay), id=self.JOB,
                            replace_existing=True, coalesce=True, max_instances=1, misfire_grace_time=None)

    def run(self, timeout_s: float | None = None) -> None:
        self._sched.start()
        try:
            self._sched.add_job(self._wake, interval_trigger(dt.timedelta(seconds=self.poll_s),
                                                             dt.datetime.now(UTC) + dt.timedelta(seconds=self.poll_s)),
                                id="kistexp-poll", coalesce=True, max_instances=1, misfire_grace_time=None)
            self._wake()
            if not self.done.wait(timeout_s):
                raise TimeoutError(f"live run not finished within {timeout_s} s")
        finally:
            # Interrupted (Ctrl-C, SIGTERM) while a step runs on a pool thread, that step re-arms the wakeup
            # when it ends, and add_job needs the job store lock that shutdown(wait=True) holds while it waits
            # for the step: a deadlock. So the step under way finishes first (it holds self._lock), and
            # `done` keeps every later wakeup from stepping or re-arming.
            with self._lock:
                self.done.set()
            self._sched.shutdown(wait=True)
        if self.error is not None:
            raise self.error
