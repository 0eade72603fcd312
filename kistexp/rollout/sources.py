"""The engine's metric-source port (issue 32; rollout.md §2.4 ``collect``, §5 "Synthetic metrics").

One interface answers each collection: the samples of one catalogue metric in one window, each with
its time, the measuring instance it came from and the consensus (valid-after) its node held when
measured, plus the health of every instance asked. Three implementations plug into the same engine:

- predicted (``kistexp.rollout.dryrun.PredictedMetrics``): drawn from the population's predictions,
  for dry runs, and for a live run only when the user asks with ``--metrics predicted``;
- recorded (``kistexp.rollout.replay.RecordedMetrics``): samples of imported recordings, for replays;
- measured (``MeasuredMetrics`` here): what instruments (``kistexp.metrics.live``) measure now, for live runs.

A collection whose every instance failed is a gap (``values is None``): the engine journals it as
missing, which holds and never passes a criterion (rollout.md §1.3).
"""

from __future__ import annotations

import datetime as dt
import math
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import numpy as np

from kistexp.metrics import catalogue
from kistexp.metrics.live import Instrument, Reading
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore

PREDICTED, RECORDED, MEASURED = "predicted", "recorded", "measured"


@attrs.frozen
class InstanceHealth:
    """How one measuring instance answered one collection."""

    source: str
    instance: str
    ok: bool
    n_samples: int
    problem: str = ""


def _f8(a) -> np.ndarray:
    return np.asarray(a, dtype="<f8")


@attrs.frozen(eq=False)
class Collection:
    """One window of one metric from one source. ``values`` is None for a gap. Per sample:
    ``times`` (Unix seconds), ``instance`` (index into ``instances``) and ``held`` (the valid-after,
    Unix seconds, of the consensus the sample's node held; NaN when unknown). ``by_relay``: the
    instances are relays, so the judge compares each relay with its own baseline."""

    metric: str
    origin: str
    values: np.ndarray | None
    times: np.ndarray = attrs.field(factory=lambda: np.zeros(0), converter=_f8)
    instances: tuple[str, ...] = ()
    instance: np.ndarray = attrs.field(factory=lambda: np.zeros(0, dtype=np.int32))
    held: np.ndarray = attrs.field(factory=lambda: np.zeros(0), converter=_f8)
    by_relay: bool = False
    health: tuple[InstanceHealth, ...] = ()

    @property
    def missing(self) -> bool:
        return self.values is None

    def keep(self, mask: np.ndarray) -> Collection:
        """The samples where ``mask`` is true (the engine drops mid-switch samples this way)."""
        if self.values is None:
            return self
        return attrs.evolve(self, values=self.values[mask], times=self.times[mask], instance=self.instance[mask],
                            held=self.held[mask])

    def relay_runs(self) -> tuple[np.ndarray, tuple[tuple[str, int], ...] | None]:
        """The values as the journal keeps them: relay-keyed samples in sorted relay order with
        (relay, count) runs, or plain values."""
        if self.values is None:
            return np.zeros(0), None
        if not self.by_relay:
            return self.values, None
        order = sorted(range(len(self.instances)), key=lambda i: self.instances[i])
        parts, runs = [], []
        for i in order:
            v = self.values[self.instance == i]
            if v.size:
                parts.append(v)
                runs.append((self.instances[i], int(v.size)))
        return (np.concatenate(parts) if parts else np.zeros(0)), tuple(runs)


def plain(metric: str, origin: str, values, t0: dt.datetime, t1: dt.datetime, *, instance: str = "",
          held: float = math.nan) -> Collection:
    """A collection of values with no per-sample times (spread evenly over the window)."""
    if values is None:
        return Collection(metric, origin, None)
    v = _f8(values).ravel()
    n = v.size
    times = t0.timestamp() + (np.arange(n) + 0.5) / max(n, 1) * (t1 - t0).total_seconds()
    return Collection(metric, origin, v, times, (instance or origin,), np.zeros(n, dtype=np.int32),
                      np.full(n, held))


def by_relay(metric: str, origin: str, samples: Mapping[str, Sequence[float]], t0: dt.datetime,
             t1: dt.datetime) -> Collection:
    """A collection of relay -> values (each relay's samples spread over the window)."""
    relays = tuple(sorted(samples))
    parts = [_f8(samples[r]).ravel() for r in relays]
    values = np.concatenate(parts) if parts else np.zeros(0)
    idx = np.concatenate([np.full(p.size, i, dtype=np.int32) for i, p in enumerate(parts)]) if parts else \
        np.zeros(0, dtype=np.int32)
    times = np.concatenate([t0.timestamp() + (np.arange(p.size) + 0.5) / max(p.size, 1) * (t1 - t0).total_seconds()
                            for p in parts]) if parts else np.zeros(0)
    return Collection(metric, origin, values, times, relays, idx, np.full(values.size, math.nan), by_relay=True)


class MetricSource(Protocol):
    """The port: ``origin`` is predicted, recorded or measured; ``collect`` answers one window of one
    metric from one collector kind (``source``), never raising for a source that cannot be read."""

    origin: str

    def collect(self, source: str, metric: str, t0: dt.datetime, t1: dt.datetime) -> Collection: ...


# --- measured -------------------------------------------------------------------------------------

def _held_of(sample: Sample) -> float:
    text = sample.labels.get("valid_after")
    if not text:
        return math.nan
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return math.nan
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


class MeasuredMetrics:
    """A live run's measured source. At the first collection of a window for a collector kind every
    instrument of that kind is polled once; its new samples are kept in the experiment's metric store
    (``samples`` table, catalogue names, labels ``instance``/``relay``/``valid_after``: ``kistexp metrics
    list --dir EXP`` shows them) and make that window's batch. A window holds what *arrived* in it, not
    only what was measured in it: a 5 MiB transfer that starts before the hour ends and finishes after
    it still counts, in the next window, and which stage a sample belongs to is then decided by the
    consensus its node held when it was measured (the engine's mid-switch rule), not by its arrival."""

    origin = MEASURED

    def __init__(self, db_path: Path, instruments: Sequence[Instrument], clock, params_at=None) -> None:
        self.clock = clock
        self.instruments = list(instruments)
        # valid-after -> the params of that consensus, as the measured nodes held it (a local network's
        # held-consensus watch); the engine's own fetches answer the rounds it checked
        self.params_at = params_at
        # a connection of its own: the engine steps on the scheduler's threads, one at a time
        self._conn = sqlite3.connect(db_path, timeout=5.0, check_same_thread=False)
        self.store = MetricStore(self._conn)
        self._polled: dict[tuple[str, dt.datetime], tuple[tuple[InstanceHealth, ...], dict[str, list[Sample]]]] = {}

    def source_of(self, metric: str) -> str:
        """The collector kind the engine collects ``metric`` from: the first of the catalogue's
        collectors for it that an instrument of this run provides."""
        m = catalogue.get(metric)
        for kind in (m.collectors if m else ()):
            if any(metric in i.metrics for i in self.instruments if i.kind == kind):
                return kind
        return m.collectors[0] if m else "unknown"

    def _poll(self, source: str, t1: dt.datetime) -> tuple[tuple[InstanceHealth, ...], dict[str, list[Sample]]]:
        key = (source, t1)
        if key in self._polled:
            return self._polled[key]
        health = []
        arrived: dict[str, list[Sample]] = {}
        now = self.clock.now()
        for inst in self.instruments:
            if inst.kind != source:
                continue
            try:
                reading = inst.poll(now)
            except Exception as exc:  # an instrument's own bug must not stop the run: a gap for it
                reading = Reading(inst.name, inst.kind, now, (), f"{inst.name}: {type(exc).__name__}: {exc}")
            kept = 0
            for metric, sample in reading.samples:
                if catalogue.get(metric) is None or not math.isfinite(sample.value):
                    continue
                arrived.setdefault(metric, []).append(sample)
                kept += 1
            health.append(InstanceHealth(source, inst.name, reading.ok, kept, reading.problem))
        for metric, samples in arrived.items():
            self.store.add_samples(metric, samples)
        # one window back is enough: every metric of a kind is collected at the same instant
        self._polled = {k: v for k, v in self._polled.items() if k[1] >= t1 - dt.timedelta(days=1)}
        self._polled[key] = (tuple(health), arrived)
        return self._polled[key]

    def collect(self, source: str, metric: str, t0: dt.datetime, t1: dt.datetime) -> Collection:
        health, arrived = self._poll(source, t1)
        samples = sorted(arrived.get(metric, ()), key=lambda s: s.time)
        if not samples:
            # nothing measured arrived: a gap, whatever the instances said (a PASS needs data)
            if not health:
                health = (InstanceHealth(source, source, False, 0, f"no {source} instrument in this run"),)
            return Collection(metric, MEASURED, None, health=health)
        population = catalogue.get(metric).population if catalogue.get(metric) else "clients"
        relay_keyed = population == "relays" and all(s.labels.get("relay") for s in samples)

        def key_of(s: Sample) -> str:
            return (s.labels.get("relay") if relay_keyed else s.labels.get("instance")) or source

        keys = sorted({key_of(s) for s in samples})
        index = {n: i for i, n in enumerate(keys)}
        return Collection(metric, MEASURED, _f8([s.value for s in samples]), _f8([s.time.timestamp() for s in samples]),
                          tuple(keys), np.asarray([index[key_of(s)] for s in samples], dtype=np.int32),
                          _f8([_held_of(s) for s in samples]), by_relay=relay_keyed, health=health)

    def close(self) -> None:
        for inst in self.instruments:
            try:
                inst.close()
            except Exception:  # noqa: S110 - closing is best effort; the run is ending anyway
                pass
        self._conn.close()

