"""Instruments beside one relay: its MetricsPort, its tor process's /proc entry, an exporter.

Each wraps the collector of its kind (``collectors.metricsport``, ``collectors.process``) and
labels every sample ``relay`` (fingerprint or nickname, as given) and ``instance``. Counters
only mean something as the change between two scrapes, so the first poll of a MetricsPort or
exporter sets the baseline: healthy, no samples (an exporter's memory gauge is returned at once).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx

from kistexp.metrics.collectors import metricsport, process
from kistexp.metrics.collectors.process import ProcSnapshot, proc_between, read_proc
from kistexp.metrics.collectors.prometheus import Exposition, Limits
from kistexp.metrics.instruments.base import Polled, labelled, metrics_of, summarise
from kistexp.metrics.series import Sample


class MetricsPortInstrument(Polled):
    """One relay's MetricsPort (``http://127.0.0.1:PORT/metrics``): relay_bandwidth_bytes_per_s,
    relay_global_rate_limit_reached and relay_oom_bytes between consecutive polls. Bounded by the
    prometheus limits (5 s, 4 MiB, 4 KiB lines, 1k families, 50k samples); a counter that goes
    down is a restart (the increase since it, never a negative rate); a series given twice with
    different values is left out, never summed."""

    kind = metricsport.KIND

    def __init__(self, relay: str, url: str, *, name: str | None = None, limits: Limits = Limits(), clock=None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.relay, self.url = relay, url
        self.name = name or f"{self.kind}:{relay}"
        self.metrics = metrics_of(self.kind)
        self.labels = {"relay": relay, "instance": self.name}
        self._collector = metricsport.MetricsPortCollector(url, self.labels, limits=limits, clock=clock,
                                                           transport=transport)

    def _poll(self, now: dt.datetime) -> tuple[list[tuple[str, Sample]], str]:
        pairs = self._collector.poll()
        cur = self._collector.poller.last
        problems = list(_scrape_problems(cur))
        if cur is not None and metricsport.TRAFFIC not in cur.samples:
            # Something answered, but not tor: a wrong port must not pass for a quiet relay.
            problems.append(f"{self.url}: no {metricsport.TRAFFIC} in the answer (not a tor MetricsPort?)")
        return labelled(pairs, {}, self.metrics), summarise(problems)


class ProcInstrument(Polled):
    """A local tor process by pid: relay_rss_bytes at every poll, relay_cpu_utilization (CPU
    seconds per wall second, 1.0 = one core) from the second. The process is pinned at the first
    poll by its start time and command name (/proc/PID/stat fields 22 and 2): a pid that is gone
    or now belongs to another process is a problem at every later poll, never samples of the
    wrong process. ``expect_name`` (e.g. "tor") also refuses a wrong process at the first poll."""

    kind = process.KIND

    def __init__(self, relay: str, pid: int, *, name: str | None = None, expect_name: str | None = None,
                 clock=None, proc: Path = Path("/proc")) -> None:
        self.relay, self.pid = relay, pid
        self.name = name or f"{self.kind}:{relay}"
        self.metrics = metrics_of(self.kind)
        self.labels = {"relay": relay, "instance": self.name}
        self.expect_name = expect_name
        self._clock, self._proc = clock, proc
        self._first: ProcSnapshot | None = None
        self._last: ProcSnapshot | None = None
        self._lost = ""  # once the process is gone, it stays gone: a new pid is a new instrument

    def _poll(self, now: dt.datetime) -> tuple[list[tuple[str, Sample]], str]:
        if self._lost:
            return [], self._lost
        where = f"{self._proc / str(self.pid)}"
        try:
            cur = read_proc(self.pid, clock=self._clock, proc=self._proc)
        except process.ProcessGone as exc:
            if self._first is None:
                return [], str(exc)
            self._lost = f"{exc}: relay {self.relay}'s process is gone (exited or restarted under another pid)"
            return [], self._lost
        if self._first is None:
            if self.expect_name is not None and cur.name != self.expect_name:
                return [], f"{where}: process {cur.name!r} is not {self.expect_name!r}; not measured"
            self._first = cur
        elif (cur.start_ticks, cur.name) != (self._first.start_ticks, self._first.name):
            self._lost = (f"{where}: pid {self.pid} now belongs to another process ({cur.name!r} started at tick "
                          f"{cur.start_ticks}, the one measured was {self._first.name!r} started at tick "
                          f"{self._first.start_ticks})")
            return [], self._lost
        pairs = proc_between(self._last, cur, self.labels)
        self._last = cur
        return labelled(pairs, {}, self.metrics), ""


class PrometheusInstrument(Polled):
    """A process-exporter (or node_exporter) endpoint beside a relay: the tor group's
    relay_cpu_utilization and relay_rss_bytes, through the process collector's exporter support
    (node_exporter gives host-wide CPU labelled ``scope=host``). An endpoint with neither
    exporter's families, or a process-exporter without ``group``, is a problem."""

    kind = process.EXPORTER_KIND

    def __init__(self, relay: str, url: str, *, group: str = "tor", name: str | None = None,
                 limits: Limits = Limits(), clock=None, transport: httpx.BaseTransport | None = None) -> None:
        self.relay, self.url, self.group = relay, url, group
        self.name = name or f"{self.kind}:{relay}"
        self.metrics = metrics_of(self.kind)
        self.labels = {"relay": relay, "instance": self.name}
        self._collector = process.ExporterCollector(url, group, self.labels, limits=limits, clock=clock,
                                                    transport=transport)

    def _poll(self, now: dt.datetime) -> tuple[list[tuple[str, Sample]], str]:
        pairs = self._collector.poll()
        cur = self._collector.poller.last
        problems = list(_scrape_problems(cur))
        if cur is not None:
            named = process.CPU in cur.samples or process.MEMORY in cur.samples
            if named and not (cur.labelled(process.CPU, groupname=self.group)
                              or cur.labelled(process.MEMORY, groupname=self.group)):
                problems.append(f"{self.url}: process-exporter has no group {self.group!r}")
            elif not named and process.NODE_CPU not in cur.samples:
                problems.append(f"{self.url}: neither process-exporter ({process.CPU}) nor node_exporter "
                                f"({process.NODE_CPU}) figures in the answer")
        return labelled(pairs, {}, self.metrics), summarise(problems)


def _scrape_problems(cur: Exposition | None) -> tuple[str, ...]:
    return () if cur is None else cur.problems
