"""A relay's MetricsPort (tor's Prometheus exporter) -> relay samples.

tor exports process-lifetime counters (metrics-sources.md §2.2, §2.4), so a sample is
the change between two scrapes: bandwidth = Δ(tor_relay_traffic_bytes read + written)/Δt,
global rate-limit hits per hour, bytes freed by the OOM handler in the interval. Increases
are taken series by series and summed (``counter_increase``); a series that goes down means
tor restarted (SIGHUP does not reset, §2.4): the new values are the increase since the
restart, never a negative rate. Each family is summed over the series its ``IDENTITY`` label tells
apart (``direction`` for traffic): a scrape that gives two ``direction="read"`` series, told apart
only by some other label, leaves the family out rather than count the same bytes twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import httpx

from kistexp.metrics.collectors.prometheus import Exposition, Limits, Poller, counter_increase
from kistexp.metrics.series import Sample

KIND = "metricsport"

TRAFFIC = "tor_relay_traffic_bytes"
RATE_LIMIT = "tor_relay_load_global_rate_limit_reached_total"
OOM = "tor_relay_load_oom_bytes_total"
# The labels tor sets on each summed family (metrics-sources.md §2.5): one series per value.
IDENTITY = {TRAFFIC: ("direction",), RATE_LIMIT: ("side",), OOM: ("subsys",)}


def _rate(value: float | None) -> float | None:
    """``value`` if it is a usable sample (finite, not negative), else None: parse keeps only finite,
    non-negative counters, but their sum over series or their quotient can still overflow."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def between(prev: Exposition, cur: Exposition, labels: Mapping[str, str],
            param_value: int | None = None) -> list[tuple[str, Sample]]:
    """Catalogue samples for the interval between two scrapes of one relay, stamped at
    the later scrape."""
    dt_s = (cur.time - prev.time).total_seconds()
    if dt_s <= 0:
        return []
    out = []
    traffic = counter_increase(prev, cur, TRAFFIC)
    if (rate := _rate(None if traffic is None else traffic / dt_s)) is not None:
        out.append(("relay_bandwidth_bytes_per_s", Sample(cur.time, rate, labels, param_value)))
    hits = counter_increase(prev, cur, RATE_LIMIT)
    if (rate := _rate(None if hits is None else hits * 3600.0 / dt_s)) is not None:
        out.append(("relay_global_rate_limit_reached", Sample(cur.time, rate, labels, param_value)))
    oom = _rate(counter_increase(prev, cur, OOM))
    if oom is not None:
        out.append(("relay_oom_bytes", Sample(cur.time, oom, labels, param_value)))
    return out


class MetricsPortCollector:
    """Polls one relay's MetricsPort; each poll after the first yields samples for the
    interval since the previous one. ``labels`` should name the relay (fingerprint) and
    its class."""

    def __init__(self, url: str, labels: Mapping[str, str], *, limits: Limits = Limits(), clock=None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.labels = dict(labels)
        self.poller = Poller(url, limits=limits, clock=clock, transport=transport, identity=IDENTITY)

    def poll(self, param_value: int | None = None) -> list[tuple[str, Sample]]:
        prev, cur = self.poller.next()
        return [] if prev is None else between(prev, cur, self.labels, param_value)
