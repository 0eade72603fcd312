"""Instruments: the measured metric sources a live run polls at each collection (issue 32).

An instrument is one measuring instance of one collector kind: an OnionPerf vantage point, one
relay's MetricsPort, one tor process's /proc entry, a consensus archive. Each poll returns the
samples that are new since the previous poll, named by the catalogue (kistexp/metrics/catalogue.py),
and says whether the instance answered. A poll never raises and never blocks past its own bound:
a source that cannot be read is a ``Reading`` with a one-line ``problem`` and no samples, which the
engine journals as a metric gap for that instance (a gap holds; it never passes a criterion).

Every sample an instrument returns carries the label ``instance`` (the instrument's name) and,
for relay metrics, ``relay`` (the relay's fingerprint or nickname), so the judge can pair each
relay with its own baseline. Where the instrument knows which consensus its node held when the
sample was taken it sets the label ``valid_after`` (ISO 8601 UTC) and ``Sample.param_value``.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import attrs

from kistexp.metrics.series import Sample


@attrs.frozen
class Reading:
    """What one poll of one instrument got: new samples (metric, sample), or why it got none."""

    instrument: str
    kind: str  # a collector kind of catalogue.COLLECTORS: onionperf, metricsport, proc, prometheus, ...
    at: dt.datetime
    samples: tuple[tuple[str, Sample], ...] = ()
    problem: str = ""  # empty when the instance answered; otherwise one line naming it and what went wrong

    @property
    def ok(self) -> bool:
        return not self.problem


class Instrument(Protocol):
    """One measuring instance. ``name`` is unique within a run (``onionperf:client000``,
    ``metricsport:relay003``); ``kind`` is its collector kind; ``metrics`` the catalogue names it can
    yield. ``poll`` returns the samples new since the last poll (none twice) within its own time
    bound; ``close`` releases whatever it holds."""

    name: str
    kind: str
    metrics: tuple[str, ...]

    def poll(self, now: dt.datetime) -> Reading: ...

    def close(self) -> None: ...
