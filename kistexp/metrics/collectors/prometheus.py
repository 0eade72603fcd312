"""Fetching and parsing Prometheus text exposition, bounded in time and size.

Used by the MetricsPort collector (tor's own counters) and the process collector (a
process-exporter or node_exporter beside the relay). Fetching is the collectors' one bounded
GET (``httpfetch``: a total deadline even against a server that trickles its headers). Parsing
is prometheus_client's parser; kistexp only isolates bad lines so that one garbage line does
not lose a scrape, and refuses a series given twice with different values (a sum over it would
count it twice). A value that is NaN or infinite, or a counter below zero, leaves its whole name
out of the scrape with a problem: no rate is computed from it or from the name's other series.
Families whose series a collector sums (tor's traffic counter, the exporters' CPU seconds) can be
given an identity, the labels that tell their series apart (``direction`` for tor's traffic): two
series with the same identity, told apart only by some other label, make the family unusable for
that scrape, since their sum would count the same counter twice. Limits: metrics-sources.md §5.3
(5 s, 4 MiB body, 4 KiB line, 1k families, 50k samples).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from types import MappingProxyType

import attrs
import httpx
from prometheus_client.parser import text_string_to_metric_families

from kistexp.clock import RealClock
from kistexp.metrics.collectors import CorruptSource, MiB, httpfetch
from kistexp.metrics.collectors.httpfetch import ScrapeError

__all__ = ["Exposition", "Limits", "Poller", "ScrapeError", "counter_delta", "counter_increase", "fetch", "parse",
           "scrape"]


@attrs.frozen
class Limits:
    timeout_s: float = 5.0
    max_bytes: int = 4 * MiB
    max_line: int = 4096
    max_families: int = 1000
    max_samples: int = 50_000


@attrs.frozen
class Exposition:
    """One parsed scrape: samples by sample name, the family type of each sample name,
    and the lines left out (as "SOURCE:LINE: what")."""

    location: str
    time: dt.datetime
    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]] = attrs.field(hash=False)
    types: Mapping[str, str] = attrs.field(hash=False)
    problems: tuple[str, ...] = ()

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels`` (None if none)."""
        found = [v for lab, v in self.samples.get(name, ()) if all(lab.get(k) == x for k, x in labels.items())]
        return sum(found) if found else None

    def labelled(self, name: str, **labels: str) -> tuple[tuple[Mapping[str, str], float], ...]:
        return tuple((lab, v) for lab, v in self.samples.get(name, ())
                     if all(lab.get(k) == x for k, x in labels.items()))


def fetch(url: str, *, limits: Limits = Limits(), clock=None, transport: httpx.BaseTransport | None = None) -> bytes:
    """GET ``url`` and return the body, within ``limits.timeout_s`` in total (a server
    that drips bytes, in its headers or its body, is cut off too) and ``limits.max_bytes``.
    ``clock`` is accepted for symmetry with ``scrape``; deadlines are real time."""
    del clock
    answer = httpfetch.get(url, limits=httpfetch.FetchLimits(limits.timeout_s, limits.max_bytes), transport=transport)
    return answer.body


_TYPE_NAME = re.compile(r"^# TYPE ([A-Za-z_:][A-Za-z0-9_:]*) ", re.M)
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram",
                    "unknown"})


def _good_lines(text: str, location: str, limits: Limits) -> tuple[str, list[str]]:
    """The lines prometheus_client accepts one by one, and a problem per other line."""
    keep, problems = [], []
    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > limits.max_line:
            problems.append(f"{location}:{no}: line of {len(line)} characters is over the {limits.max_line} limit")
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "TYPE" and (len(parts) != 4 or parts[3].strip() not in _TYPES):
                problems.append(f"{location}:{no}: malformed TYPE line: {line[:80]!r}")
                continue
            keep.append(line)
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError, TypeError) as exc:
            problems.append(f"{location}:{no}: not a Prometheus sample ({exc}): {line[:80]!r}")
            continue
        keep.append(line)
    return "\n".join(keep) + "\n", problems


#: The labels that tell apart the series of a family a collector sums, by family name.
Identity = Mapping[str, tuple[str, ...]]


def parse(text: str | bytes, location: str, *, time: dt.datetime, limits: Limits = Limits(),
          identity: Identity | None = None) -> Exposition:
    """Parse Prometheus text 0.0.4. Bad lines are left out and reported; the rest is kept.
    ``identity`` names, for families that are summed, the labels that identify one series: a
    family with two series of the same identity is left out (see the module's docstring).
    Raises CorruptSource only if nothing usable remains or a count limit is exceeded."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    problems: list[str] = []
    # Count sample lines before the parser builds objects for them: a million-series answer
    # is refused in one pass over the text, not after a million Sample objects.
    lines = text.split("\n")
    n_lines = sum(1 for line in lines if line.strip() and not line.startswith("#"))
    if n_lines > limits.max_samples:
        raise CorruptSource(f"{location}: over {limits.max_samples} samples ({n_lines} sample lines)")
    families = None
    if all(len(line) <= limits.max_line for line in lines):
        try:
            families = list(text_string_to_metric_families(text))
        except (ValueError, IndexError, TypeError):
            families = None
    if families is None:
        cleaned, problems = _good_lines(text, location, limits)
        try:
            families = list(text_string_to_metric_families(cleaned))
        except (ValueError, IndexError, TypeError) as exc:
            raise CorruptSource(f"{location}: not Prometheus text even without its bad lines: {exc}") from None
    if len(families) > limits.max_families:
        raise CorruptSource(f"{location}: {len(families)} metric families is over the limit of {limits.max_families}")
    # prometheus_client names a counter family without "_total" and its samples with it,
    # whatever the text said; kistexp keys samples by the name tor wrote (its TYPE line).
    typed = set(_TYPE_NAME.findall(text))
    samples: dict[str, list] = {}
    types: dict[str, str] = {}
    seen: dict[tuple[str, frozenset], float] = {}
    conflicting: set[str] = set()
    unusable: dict[str, list[str]] = {}  # name -> its series left out (one problem per name)
    unusable_type: dict[str, str] = {}
    n = 0
    for fam in families:
        for s in fam.samples:
            n += 1
            if n > limits.max_samples:
                raise CorruptSource(f"{location}: over {limits.max_samples} samples")
            name = s.name
            if fam.type == "counter" and name == fam.name + "_total" and fam.name in typed:
                name = fam.name
            value = float(s.value)
            # NaN, infinities and negative counters are legal text but no rate can come of them: a
            # NaN once made the whole import end in a traceback, -1e308 an infinite rate
            if not math.isfinite(value) or (fam.type == "counter" and value < 0):
                unusable.setdefault(name, []).append(_series(name, s.labels) + f" {value!r}")
                unusable_type[name] = fam.type
                continue
            # The same series twice (a repeated family or line) must not be summed: the same
            # value again is dropped, a different one makes the whole name unusable.
            key = (name, frozenset(s.labels.items()))
            if key in seen:
                if seen[key] == value or (seen[key] != seen[key] and value != value):
                    problems.append(f"{location}: series {_series(name, s.labels)} given twice; repeat ignored")
                else:
                    conflicting.add(name)
                continue
            seen[key] = value
            samples.setdefault(name, []).append((MappingProxyType(dict(s.labels)), value))
            types[name] = fam.type
    for name, bad in sorted(unusable.items()):
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        what = "a finite non-negative counter value" if unusable_type[name] == "counter" else "a finite value"
        # the whole name goes: a sum over the series left would pass for the whole (read bytes
        # without the written ones)
        problems.append(f"{location}: {bad[0]}{more}: not {what}; {name} left out")
        samples.pop(name, None)
        types.pop(name, None)
    for name in sorted(conflicting - set(unusable)):
        problems.append(f"{location}: {name} has a series given twice with different values; {name} left out")
        del samples[name], types[name]
    for name, keys in (identity or {}).items():
        twice = _same_identity(samples.get(name, ()), keys)
        if twice:
            problems.append(f"{location}: {name} has {twice[1]} series for {twice[0]}, told apart only by other "
                            f"labels; {name} left out (their sum would count one series {twice[1]} times)")
            del samples[name], types[name]
    if not samples and problems:
        raise CorruptSource(f"{location}: no valid Prometheus samples; first problem: {problems[0]}")
    return Exposition(location, time, {k: tuple(v) for k, v in samples.items()}, types, tuple(problems))


def _same_identity(series, keys: tuple[str, ...]) -> tuple[str, int] | None:
    """The first identity (as ``k="v",...``) held by more than one of ``series``, and how many hold it."""
    counts: dict[tuple[str, ...], int] = {}
    for labels, _ in series:
        ident = tuple(labels.get(k, "") for k in keys)
        counts[ident] = counts.get(ident, 0) + 1
    for ident, count in counts.items():
        if count > 1:
            return ",".join(f'{k}="{v}"' for k, v in zip(keys, ident, strict=True))[:200] or "no labels", count
    return None


def _series(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"[:200] if labels else name[:200]


def scrape(url: str, *, limits: Limits = Limits(), clock=None, transport: httpx.BaseTransport | None = None,
           identity: Identity | None = None) -> Exposition:
    """Fetch and parse one endpoint; the exposition's time is when the answer arrived."""
    clock = clock or RealClock()
    body = fetch(url, limits=limits, clock=clock, transport=transport)
    return parse(body, url, time=clock.now(), limits=limits, identity=identity)


def counter_increase(prev: Exposition, cur: Exposition, name: str) -> float | None:
    """Increase of counter ``name`` summed over its series between two scrapes, series by series
    as Prometheus' rate() does. A series that went down means the process restarted (every
    series of a process restarts together, metrics-sources.md §2.4): the increase is then the
    current total. A series that vanished, or a counter absent from either scrape, gives None:
    nothing is known about that interval (a garbage line must not pass for a restart)."""
    before = {frozenset(lab.items()): v for lab, v in prev.samples.get(name, ())}
    after = {frozenset(lab.items()): v for lab, v in cur.samples.get(name, ())}
    if not before or not after or any(k not in after for k in before):
        return None
    if any(after[k] < v for k, v in before.items()):
        return sum(after.values())
    return sum(v - before.get(k, 0.0) for k, v in after.items())


def counter_delta(prev: float | None, cur: float | None) -> float | None:
    """Increase of a counter between two scrapes; a decrease means the process restarted
    and counted again from zero (Prometheus' rate() rule, metrics-sources.md §2.4)."""
    if prev is None or cur is None:
        return None
    return cur if cur < prev else cur - prev


class Poller:
    """Scrapes one endpoint repeatedly and remembers the previous answer, since counters
    only mean something as the change between two scrapes."""

    def __init__(self, url: str, *, limits: Limits = Limits(), clock=None,
                 transport: httpx.BaseTransport | None = None, identity: Identity | None = None) -> None:
        self.url, self.limits, self.transport, self.identity = url, limits, transport, identity
        self.clock = clock or RealClock()
        self.last: Exposition | None = None

    def next(self) -> tuple[Exposition | None, Exposition]:
        cur = scrape(self.url, limits=self.limits, clock=self.clock, transport=self.transport, identity=self.identity)
        prev, self.last = self.last, cur
        return prev, cur
