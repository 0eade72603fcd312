"""The measured metric sources a live run polls (``kistexp.metrics.live``'s Instrument protocol).

- ``OnionPerfInstrument``: one OnionPerf vantage point's day files (Tor Metrics' layout), new
  transfers and circuits at each poll;
- ``MetricsPortInstrument``: one relay's MetricsPort, bandwidth / rate-limit / OOM between polls;
- ``ProcInstrument``: one local tor process's /proc entry, CPU and RSS;
- ``PrometheusInstrument``: a process-exporter or node_exporter beside a relay, CPU and RSS;
- ``ConsensusArchivePoller``: a CollecTor-style consensus archive, new verified consensuses
  (not an Instrument: its poll returns consensuses, not samples).

``parse_source`` builds any of them from the text given on the command line. Every poll is
bounded in time and size and never raises; a source that fails is a reading with a one-line
problem, which the engine journals as a metric gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import httpx

from kistexp.dirauth.documents import KeyCertificate
from kistexp.errors import KistexpError
from kistexp.metrics.instruments.archive import (
    ArchivedConsensus,
    ArchiveLimits,
    ArchiveReading,
    ConsensusArchivePoller,
)
from kistexp.metrics.instruments.onionperf import OnionPerfInstrument, OnionPerfLimits
from kistexp.metrics.instruments.relay import MetricsPortInstrument, ProcInstrument, PrometheusInstrument
from kistexp.metrics.live import Instrument, Reading

__all__ = ["ArchiveLimits", "ArchiveReading", "ArchivedConsensus", "ConsensusArchivePoller", "Instrument",
           "MetricsPortInstrument", "OnionPerfInstrument", "OnionPerfLimits", "ProcInstrument",
           "PrometheusInstrument", "Reading", "SOURCE_FORMS", "SourceError", "parse_source"]

SOURCE_FORMS = ("onionperf:VANTAGE=URL_OR_DIR", "metricsport:RELAY=URL", "proc:RELAY=PID", "prometheus:RELAY=URL",
                "consensus-archive=URL_OR_DIR")
_NAMED = {"onionperf": "VANTAGE", "metricsport": "RELAY", "proc": "RELAY", "prometheus": "RELAY"}
# OnionPerf source names (metrics-sources.md §1.1); the name is part of a file name, so no '/' or '.'.
_VANTAGE = re.compile(r"[A-Za-z0-9-]{1,64}")
# A relay's fingerprint (a leading '$' allowed) or nickname, or a local network's node name.
_RELAY = re.compile(r"\$?[A-Za-z0-9_-]{1,64}")
_PID = re.compile(r"[0-9]{1,7}")
MAX_PID = 4_194_304  # Linux's pid_max ceiling (2^22)


class SourceError(KistexpError):
    """A source given on the command line that cannot be used as written."""


def parse_source(text: str, *, certificates: Sequence[KeyCertificate] = (), trusted: Iterable[str] | None = None,
                 clock=None, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] | None = None) -> Instrument | ConsensusArchivePoller:
    """An instrument (or the archive poller) from ``onionperf:VANTAGE=URL_OR_DIR``,
    ``metricsport:RELAY=URL``, ``proc:RELAY=PID``, ``prometheus:RELAY=URL`` or
    ``consensus-archive=URL_OR_DIR``. ``certificates`` and ``trusted`` are the archive's signature
    check; ``clock``, ``transport`` and ``sleep`` are passed to the instruments that take them.
    Raises SourceError, one line naming ``text`` and what is wrong. Hosts outside loopback are
    allowed (the real network); nothing is contacted here."""
    head, eq, target = text.partition("=")
    kind, colon, name = head.partition(":")
    kind = kind.strip()
    forms = ", ".join(SOURCE_FORMS)
    if not eq:
        raise SourceError(f"source {text!r}: expected one of {forms}")
    if kind == "consensus-archive":
        if colon:
            raise SourceError(f"source {text!r}: consensus-archive takes no name (consensus-archive=URL_OR_DIR)")
        base = _url_or_dir(text, target)
        kwargs = {} if sleep is None else {"sleep": sleep}
        return ConsensusArchivePoller(base, certificates=certificates, trusted=trusted, transport=transport, **kwargs)
    if kind not in _NAMED:
        known = ", ".join([*_NAMED, "consensus-archive"])
        raise SourceError(f"source {text!r}: unknown kind {kind!r} (known: {known})")
    label = _NAMED[kind]
    if not colon or not name:
        raise SourceError(f"source {text!r}: missing the {label} name ({kind}:{label}=...)")
    pattern = _VANTAGE if kind == "onionperf" else _RELAY
    if not pattern.fullmatch(name):
        allowed = ("letters, digits and '-'" if kind == "onionperf"
                   else "a fingerprint or nickname: letters, digits, '_' and '-'")
        raise SourceError(f"source {text!r}: {label} name {name!r} is not {allowed} (at most 64)")
    if not target:
        raise SourceError(f"source {text!r}: nothing after '='")
    if kind == "onionperf":
        kwargs = {} if sleep is None else {"sleep": sleep}
        return OnionPerfInstrument(name, _url_or_dir(text, target), transport=transport, **kwargs)
    relay = name[1:].upper() if name.startswith("$") else name
    if kind == "proc":
        if not _PID.fullmatch(target) or not 0 < int(target) <= MAX_PID:
            raise SourceError(f"source {text!r}: PID {target!r} is not a process id (1 to {MAX_PID})")
        return ProcInstrument(relay, int(target), clock=clock)
    url = _url(text, target)
    if kind == "metricsport":
        return MetricsPortInstrument(relay, url, clock=clock, transport=transport)
    return PrometheusInstrument(relay, url, clock=clock, transport=transport)


def _url(text: str, target: str) -> str:
    try:
        url = httpx.URL(target)
    except (httpx.InvalidURL, ValueError) as exc:
        raise SourceError(f"source {text!r}: {target!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https"):
        what = f"scheme {url.scheme!r}" if url.scheme else "no scheme"
        raise SourceError(f"source {text!r}: {target!r} has {what}; expected an http:// or https:// URL")
    if not url.host:
        raise SourceError(f"source {text!r}: {target!r} names no host")
    if url.userinfo:
        # a password in a source would be copied into the run's journal and report (and this error)
        shown = text.replace(url.userinfo.decode("ascii", "replace") + "@", "***@")
        raise SourceError(f"source {shown!r}: credentials in the URL are not accepted")
    return target


def _url_or_dir(text: str, target: str) -> str | Path:
    if "://" in target:
        return _url(text, target)
    if not target:
        raise SourceError(f"source {text!r}: nothing after '='")
    path = Path(target)
    if not path.is_dir():
        raise SourceError(f"source {text!r}: {target!r} is neither an http(s) URL nor a directory")
    return path
