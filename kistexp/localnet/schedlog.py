"""Scheduler runs read from tor's ``[sched]debug`` log (kist-ewma.md §5.2, §12).

The messages (tor 0.4.9, src/core/or/scheduler_kist.c and scheduler_vanilla.c):

* KIST / KISTLite: ``kist_scheduler_run(): Running the scheduler. N channels pending``
  starts a run, then one ``update_socket_written(): chan=C wrote 543 bytes, old was W``
  per cell moved to the channel's outbuf (514-byte cell + 29 bytes TLS overhead counted).
* Vanilla: ``vanilla_scheduler_run(): We have a chance to run the scheduler`` starts a
  run, then ``Scheduler flushed N cells onto pending channel C at ...`` per channel.

From these: the real run period (time between consecutive runs that both moved cells on
the busiest channel, i.e. while it stayed backlogged) and the cells per run on that
channel. Log timestamps have millisecond resolution with ``LogTimeGranularity 1``.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from collections.abc import Iterable
from pathlib import Path

import attrs

from kistexp.errors import LocalNetError

#: CELL_MAX_NETWORK_SIZE (514) + TLS_PER_CELL_OVERHEAD (29): what KIST counts per cell.
KIST_BYTES_PER_CELL = 543
#: Gaps longer than this are idle spells, not the period of a backlogged channel.
MAX_BUSY_GAP_MS = 250.0

_LINE = re.compile(r"^(\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)\.(\d{3}) \[debug\] (\w+)\(\): (.*)$")
_KIST_RUN = re.compile(r"^Running the scheduler\. (\d+) channels pending")
_KIST_WROTE = re.compile(r"^chan=(\d+) wrote (\d+) bytes")
_VANILLA_RUN = "We have a chance to run the scheduler"
_VANILLA_FLUSHED = re.compile(r"^Scheduler flushed (\d+) cells onto pending channel (\d+)")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}


@attrs.frozen
class SchedulerRun:
    at_ms: float  # milliseconds since the first line read
    cells: tuple[tuple[int, int], ...]  # (channel id, cells moved to its outbuf)

    def cells_on(self, channel: int) -> int:
        return sum(n for c, n in self.cells if c == channel)


@attrs.frozen
class RunStats:
    """Summary of the scheduler runs in one stretch of log."""

    runs: int
    busy_channel: int | None
    busy_runs: int
    period_ms_median: float | None
    period_ms_mean: float | None
    cells_per_run_median: float | None
    cells_per_run_mean: float | None
    cells_total: int


def _stamp_ms(m: re.Match[str], year: int) -> float:
    month = _MONTHS.get(m.group(1), 1)
    t = dt.datetime(year, month, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                    int(m.group(6)) * 1000)
    return t.timestamp() * 1000.0


def parse_runs(lines: Iterable[str], year: int | None = None) -> list[SchedulerRun]:
    """The scheduler runs in ``lines`` of a tor debug log, in order."""
    year = year or dt.datetime.now().year
    runs: list[SchedulerRun] = []
    origin: float | None = None
    at: float | None = None
    cells: dict[int, int] = {}

    def close() -> None:
        if at is not None:
            runs.append(SchedulerRun(at - (origin or 0.0), tuple(sorted(cells.items()))))

    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        func, msg = m.group(7), m.group(8)
        if func == "kist_scheduler_run" and _KIST_RUN.match(msg) or (
            func == "vanilla_scheduler_run" and msg.startswith(_VANILLA_RUN)
        ):
            close()
            at = _stamp_ms(m, year)
            origin = at if origin is None else origin
            cells = {}
        elif at is None:
            continue
        elif func == "update_socket_written":
            w = _KIST_WROTE.match(msg)
            if w:
                chan = int(w.group(1))
                cells[chan] = cells.get(chan, 0) + int(w.group(2)) // KIST_BYTES_PER_CELL
        elif func == "vanilla_scheduler_run":
            f = _VANILLA_FLUSHED.match(msg)
            if f:
                chan = int(f.group(2))
                cells[chan] = cells.get(chan, 0) + int(f.group(1))
    close()
    return runs


def summarise(runs: list[SchedulerRun]) -> RunStats:
    """Run period and cells per run on the channel that moved the most cells."""
    totals: dict[int, int] = {}
    for run in runs:
        for chan, n in run.cells:
            totals[chan] = totals.get(chan, 0) + n
    if not totals:
        return RunStats(len(runs), None, 0, None, None, None, None, 0)
    busy = max(totals, key=lambda c: (totals[c], -c))
    busy_runs = [r for r in runs if r.cells_on(busy) > 0]
    gaps = []
    previous: SchedulerRun | None = None
    for run in runs:
        if run.cells_on(busy) == 0:
            previous = None  # the channel went idle: the next gap is not a period
            continue
        if previous is not None and run.at_ms - previous.at_ms <= MAX_BUSY_GAP_MS:
            gaps.append(run.at_ms - previous.at_ms)
        previous = run
    per_run = [r.cells_on(busy) for r in busy_runs]
    return RunStats(
        runs=len(runs),
        busy_channel=busy,
        busy_runs=len(busy_runs),
        period_ms_median=statistics.median(gaps) if gaps else None,
        period_ms_mean=statistics.fmean(gaps) if gaps else None,
        cells_per_run_median=statistics.median(per_run) if per_run else None,
        cells_per_run_mean=statistics.fmean(per_run) if per_run else None,
        cells_total=totals[busy],
    )


def read_runs(path: Path, offset: int = 0) -> RunStats:
    """Summarise the runs logged in ``path`` from byte ``offset`` on (the start of a measurement)."""
    try:
        with Path(path).open("r", errors="replace") as fh:
            fh.seek(offset)
            return summarise(parse_runs(fh))
    except FileNotFoundError:
        raise LocalNetError(f"{path}: no scheduler debug log (enable it with sched_debug)") from None


def log_size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return 0
