"""CPU and resident memory of a tor process: from /proc/PID of a local tor, or from a
process-exporter endpoint beside a remote relay; host CPU and traffic from node_exporter
(metrics-sources.md §2.6).

relay_cpu_utilization = Δ(utime + stime) / CLK_TCK / Δwall (1.0 = one core), all
threads; relay_rss_bytes = VmRSS. A changed process start time means tor restarted:
the CPU interval is then not computed across the restart.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import httpx

from kistexp.clock import RealClock
from kistexp.errors import KistexpError
from kistexp.metrics.collectors.prometheus import Exposition, Limits, Poller, counter_delta
from kistexp.metrics.series import Sample

KIND = "proc"
EXPORTER_KIND = "prometheus"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ProcessGone(KistexpError):
    """The process to measure does not exist (any more) or cannot be read."""


@attrs.frozen
class ProcSnapshot:
    pid: int
    time: dt.datetime
    monotonic: float
    cpu_s: float  # utime + stime of all threads
    start_ticks: int  # field 22: start time after boot, in clock ticks
    rss_bytes: int
    threads: int
    name: str = ""  # the command name (stat field 2), to tell a reused pid from the process measured


def read_proc(pid: int, *, clock=None, proc: Path = Path("/proc")) -> ProcSnapshot:
    clock = clock or RealClock()
    base = proc / str(pid)
    try:
        stat = (base / "stat").read_text()
        status = (base / "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(f"{base}: no such process") from None
    except OSError as exc:
        raise ProcessGone(f"{base}: cannot read: {exc.strerror or exc}") from None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    head, _, rest = stat.rpartition(")")
    fields = rest.split()
    name = head.partition("(")[2]
    try:
        utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])
        info = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss_kb = int(info["VmRSS"].split()[0])
        threads = int(info["Threads"])
    except (IndexError, KeyError, ValueError) as exc:
        raise ProcessGone(f"{base}: unexpected stat/status format ({exc})") from None
    return ProcSnapshot(pid, clock.now(), clock.monotonic(), (utime + stime) / CLK_TCK, start, rss_kb * 1024, threads,
                        name)


def proc_between(prev: ProcSnapshot | None, cur: ProcSnapshot, labels: Mapping[str, str],
                 param_value: int | None = None) -> list[tuple[str, Sample]]:
    out = [("relay_rss_bytes", Sample(cur.time, cur.rss_bytes, labels, param_value))]
    if prev is not None and prev.start_ticks == cur.start_ticks and prev.pid == cur.pid:
        wall = cur.monotonic - prev.monotonic
        if wall > 0:
            out.append(("relay_cpu_utilization", Sample(cur.time, (cur.cpu_s - prev.cpu_s) / wall, labels,
                                                        param_value)))
    return out


class ProcessSampler:
    """Samples one local process: RSS on every poll, CPU from the second poll on."""

    def __init__(self, pid: int, labels: Mapping[str, str], *, clock=None, proc: Path = Path("/proc")) -> None:
        self.pid, self.labels, self.proc = pid, dict(labels), proc
        self.clock = clock or RealClock()
        self.last: ProcSnapshot | None = None

    def poll(self, param_value: int | None = None) -> list[tuple[str, Sample]]:
        cur = read_proc(self.pid, clock=self.clock, proc=self.proc)
        prev, self.last = self.last, cur
        return proc_between(prev, cur, self.labels, param_value)


# --- process-exporter (ncabatoff/process-exporter) -------------------------------------

CPU = "namedprocess_namegroup_cpu_seconds_total"
MEMORY = "namedprocess_namegroup_memory_bytes"
START = "namedprocess_namegroup_oldest_start_time_seconds"


def _usable(value: float | None) -> float | None:
    """``value`` if it can be a sample (finite, not negative), else None: an exporter's text may hold
    negative gauges or untyped negative counters, and sums of huge values overflow."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def exporter_between(prev: Exposition | None, cur: Exposition, groupname: str, labels: Mapping[str, str],
                     param_value: int | None = None) -> list[tuple[str, Sample]]:
    """Samples of one process group (e.g. "tor") between two process-exporter scrapes."""
    out = []
    rss = _usable(cur.value(MEMORY, groupname=groupname, memtype="resident"))
    if rss is not None:
        out.append(("relay_rss_bytes", Sample(cur.time, rss, labels, param_value)))
    if prev is not None:
        wall = (cur.time - prev.time).total_seconds()
        restarted = prev.value(START, groupname=groupname) != cur.value(START, groupname=groupname)
        cpu = counter_delta(_usable(prev.value(CPU, groupname=groupname)), _usable(cur.value(CPU, groupname=groupname)))
        if cpu is not None and wall > 0 and not restarted and (rate := _usable(cpu / wall)) is not None:
            out.append(("relay_cpu_utilization", Sample(cur.time, rate, labels, param_value)))
    return out


# --- node_exporter (whole host) --------------------------------------------------------

NODE_CPU = "node_cpu_seconds_total"
NODE_RX = "node_network_receive_bytes_total"
NODE_TX = "node_network_transmit_bytes_total"
# The labels that tell apart the series each collector here sums (a process group's CPU modes, a
# host's CPUs and interfaces): the same identity twice makes the family unusable for that scrape.
IDENTITY = {CPU: ("groupname", "mode"), MEMORY: ("groupname", "memtype"), START: ("groupname",),
            NODE_CPU: ("cpu", "mode"), NODE_RX: ("device",), NODE_TX: ("device",)}


def node_between(prev: Exposition | None, cur: Exposition, labels: Mapping[str, str],
                 param_value: int | None = None) -> list[tuple[str, Sample]]:
    """Host-wide figures from node_exporter, labelled ``scope=host``: CPU = non-idle
    CPU seconds of all cores per wall second (a dedicated relay host's tor, plus the
    rest of the system), bandwidth = bytes received + sent on every interface but lo."""
    if prev is None:
        return []
    wall = (cur.time - prev.time).total_seconds()
    if wall <= 0:
        return []
    host = {**labels, "scope": "host"}
    out = []

    def busy(e: Exposition) -> float | None:
        rows = [v for lab, v in e.labelled(NODE_CPU) if lab.get("mode") not in ("idle", "iowait", "steal")]
        return _usable(sum(rows)) if rows else None

    cpu = counter_delta(busy(prev), busy(cur))
    if cpu is not None and (rate := _usable(cpu / wall)) is not None:
        out.append(("relay_cpu_utilization", Sample(cur.time, rate, host, param_value)))

    def traffic(e: Exposition) -> float | None:
        rows = [v for name in (NODE_RX, NODE_TX) for lab, v in e.labelled(name) if lab.get("device") != "lo"]
        return _usable(sum(rows)) if rows else None

    moved = counter_delta(traffic(prev), traffic(cur))
    if moved is not None and (rate := _usable(moved / wall)) is not None:
        out.append(("relay_bandwidth_bytes_per_s", Sample(cur.time, rate, host, param_value)))
    return out


def exporter_samples(prev: Exposition | None, cur: Exposition, groupname: str, labels: Mapping[str, str],
                     param_value: int | None = None) -> list[tuple[str, Sample]]:
    """process-exporter figures of ``groupname`` if the endpoint has them, else
    node_exporter's host-wide ones."""
    if CPU in cur.samples or MEMORY in cur.samples:
        return exporter_between(prev, cur, groupname, labels, param_value)
    return node_between(prev, cur, labels, param_value)


class ExporterCollector:
    """Polls a process-exporter (or node_exporter) endpoint for one process group."""

    def __init__(self, url: str, groupname: str, labels: Mapping[str, str], *, limits: Limits = Limits(),
                 clock=None, transport: httpx.BaseTransport | None = None) -> None:
        self.groupname, self.labels = groupname, dict(labels)
        self.poller = Poller(url, limits=limits, clock=clock, transport=transport, identity=IDENTITY)

    def poll(self, param_value: int | None = None) -> list[tuple[str, Sample]]:
        prev, cur = self.poller.next()
        return exporter_samples(prev, cur, self.groupname, self.labels, param_value)
