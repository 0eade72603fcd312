"""What the machine itself does to real tor's timing: CPU time its hypervisor takes, late timers.

Every tor of a local network runs on the same few cores, and on a virtual machine those cores
are themselves threads of a host that may run something else in their place.  Linux counts that
time as *steal* (the eighth figure of the ``cpu`` line of ``/proc/stat``, proc(5)), and while it
lasts no process of the guest runs: a KIST run due in 2 ms fires several milliseconds late, a cell
waits in a relay's queue, and the client's SENDMEs and the exit's reads wait with it.  Real tor's
latency-bound figures (KIST, KISTLite at short intervals) then measure the host as much as tor,
while the simulator gives every node a core of its own that is never held off.

Two measures, both printed beside real tor's figures so a reader can tell a gap of the model from
a machine that stalls:

* ``cpu_ticks`` / ``stolen_fraction``: the share of all cores' time the hypervisor took between
  two readings, e.g. over one timed transfer;
* ``peak_rss_mib``: the benchmarks' peak memory, of this process alone;
* ``probe_timers``: how late a 1 ms ``epoll_wait`` wakes up (libevent's loop, and so tor's KIST
  timer, sleeps in ``epoll_wait``).  On a machine of its own nearly every wake-up is within a
  fraction of a millisecond; the test machine of 2026-12-03 woke more than 1 ms late in about
  6-7 % of its sleeps, up to 11 ms, with nothing else running (docs/fidelity.md, "Known gaps and their
  causes": the machine).
"""

from __future__ import annotations

import math
import resource
import select
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

#: A wake-up later than this counts as late: a whole KIST interval at 1 ms, half of one at 2 ms.
LATE_MS = 1.0
#: From this share of stolen CPU time, or of late wake-ups, the fidelity report warns that real
#: tor's latency-bound rows measure the machine as well as tor.
STALL_WARN_FRACTION = 0.01

_PROC_STAT = Path("/proc/stat")


@attrs.frozen
class CpuTicks:
    """The machine's CPU time so far, all cores, in clock ticks (``/proc/stat``'s ``cpu`` line)."""

    total: int  # user, nice, system, idle, iowait, irq, softirq and steal
    steal: int  # taken by the hypervisor for other work while this machine wanted to run


def parse_cpu_line(line: str) -> CpuTicks | None:
    """The aggregate ``cpu`` line of ``/proc/stat``; steal is 0 on kernels that predate it.
    guest and guest_nice (fields 9 and 10) are already inside user and nice, so they are left out."""
    fields = line.split()
    if not fields or fields[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in fields[1:9]]
    except ValueError:
        return None
    if len(ticks) < 4:
        return None
    return CpuTicks(sum(ticks), ticks[7] if len(ticks) > 7 else 0)


def cpu_ticks(stat: Path = _PROC_STAT) -> CpuTicks | None:
    """Read the machine's CPU ticks now (None where ``/proc/stat`` is not there)."""
    try:
        with stat.open() as f:
            return parse_cpu_line(f.readline())
    except OSError:
        return None


def stolen_fraction(before: CpuTicks | None, after: CpuTicks | None) -> float | None:
    """Share of all cores' time the hypervisor took between two readings (None if either is
    missing or no tick passed)."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    return max(0, after.steal - before.steal) / total


@attrs.frozen
class TimerLateness:
    """How late ``sleeps`` sleeps of ``sleep_ms`` woke up, in ms past the time asked for."""

    sleep_ms: float
    sleeps: int
    median_ms: float
    p99_ms: float
    max_ms: float
    late_fraction: float  # woke more than LATE_MS late
    stolen_fraction: float | None  # of all cores' time, over the probe

    @classmethod
    def from_json(cls, data: object) -> TimerLateness | None:
        """The record of an earlier report, or None where it has none or not this shape."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**data)
        except TypeError:
            return None

    @property
    def stalls(self) -> bool:
        """The machine held its timers or its cores off often enough to slow real tor."""
        stolen = self.stolen_fraction or 0.0
        return self.late_fraction >= STALL_WARN_FRACTION or stolen >= STALL_WARN_FRACTION


def _quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def lateness_of(overshoots_ms: Sequence[float], sleep_ms: float, stolen: float | None = None) -> TimerLateness:
    """Summarise measured overshoots (ms past each sleep's end; early wake-ups count as 0)."""
    if not overshoots_ms:
        raise ValueError("no sleeps measured")
    ordered = sorted(max(0.0, x) for x in overshoots_ms)
    late = sum(1 for x in ordered if x > LATE_MS)
    return TimerLateness(sleep_ms, len(ordered), _quantile(ordered, 0.5), _quantile(ordered, 0.99), ordered[-1],
                         late / len(ordered), stolen)


def probe_timers(duration_s: float = 2.0, sleep_ms: float = 1.0) -> TimerLateness:
    """Sleep ``sleep_ms`` in ``epoll_wait`` (``time.sleep`` where there is no epoll) again and
    again for ``duration_s`` of the machine's real time, and measure how late each wake-up is.
    This measures the real machine, so it reads the real monotonic clock by design."""
    if not 0 < sleep_ms <= 1000 or not 0 < duration_s <= 600:
        raise ValueError(f"timer probe: sleep_ms in (0, 1000] and duration_s in (0, 600], got {sleep_ms}, {duration_s}")
    poller = select.epoll() if hasattr(select, "epoll") else None
    pause = sleep_ms / 1000.0
    overshoots: list[float] = []
    before = cpu_ticks()
    try:
        end = time.monotonic() + duration_s
        while True:
            t0 = time.monotonic()
            if t0 >= end:
                break
            if poller is not None:
                poller.poll(pause)
            else:
                time.sleep(pause)
            overshoots.append((time.monotonic() - t0) * 1000.0 - sleep_ms)
    finally:
        if poller is not None:
            poller.close()
    return lateness_of(overshoots, sleep_ms, stolen_fraction(before, cpu_ticks()))


def describe(t: TimerLateness) -> str:
    """One line for a report."""
    stolen = "" if t.stolen_fraction is None else f"; the hypervisor took {100 * t.stolen_fraction:.1f} % of CPU time"
    return (f"machine: {t.sleeps} sleeps of {t.sleep_ms:g} ms woke a median {t.median_ms:.2f} ms late, "
            f"{100 * t.late_fraction:.1f} % more than {LATE_MS:g} ms late (99th percentile {t.p99_ms:.1f} ms, "
            f"max {t.max_ms:.1f} ms){stolen}")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name, as benchmarks print beside every figure (machines differ up to
    3x per core); "unknown" where /proc/cpuinfo does not say."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def peak_rss_mib(status: Path = Path("/proc/self/status")) -> float:
    """The peak resident memory of this process since it started its program, in MiB (``VmHWM``).

    ``getrusage``'s ``ru_maxrss`` is not that: Linux carries it across ``execve``, so a benchmark's
    child process reports its parent's resident memory at the fork if that was larger (the parent of
    ``bench/sim_bench.py`` has just compiled the simulator, some 480 MiB, and its first children all
    reported it).  ``ru_maxrss`` only where ``/proc`` is missing."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
