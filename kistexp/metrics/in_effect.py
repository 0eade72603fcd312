"""Which consensus value was in effect for a relay or client when a sample was taken.

A consensus with valid-after V reaches the network over hours: directory caches fetch it
within about half an hour, clients within about two (kistexp/dirauth/propagation.py,
dirspec-params.md §3). At time t a node surely holds a consensus published at or before
t, and surely one at least as new as the latest V with V + T_full <= t (T_full: the time
until the whole node class has it). If every consensus in that range carries the same
value, that value was in effect; otherwise the sample was taken while a change was
propagating and its value is unknown, so it is counted for neither value.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Sequence

import attrs

from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.metrics import catalogue
from kistexp.metrics.series import Sample
from kistexp.metrics.store import ConsensusRecord

#: How each catalogue population fetches consensuses: relays are directory caches
#: (tor's default DirCache 1), clients fetch from caches.
POPULATION_CLASS = {"relays": NodeClass.CACHE, "clients": NodeClass.CLIENT}


class InEffect:
    """Answers "which value of ``name`` did a node of ``node_class`` run at t" from a
    consensus history (any flavour: params are the same in both)."""

    def __init__(self, history: Iterable[ConsensusRecord], name: str, node_class: NodeClass, *,
                 default: int | None = None, model: PropagationModel | None = None) -> None:
        self.model = model or PropagationModel()
        by_va: dict[dt.datetime, int | None] = {}
        for c in history:
            by_va[c.valid_after] = c.params.get(name, default)
        self.times = sorted(by_va)
        self.values = [by_va[t] for t in self.times]
        self.full_s = self.model.time_until(1.0, node_class)
        self.interval = dt.timedelta(seconds=self.model.interval_s)

    def at(self, t: dt.datetime) -> int | None:
        hi = bisect.bisect_right(self.times, t) - 1  # newest consensus published by t
        if hi < 0 or t - self.times[hi] >= self.interval:
            return None  # the next consensus is not in the history: it may have changed the value
        surely = t - dt.timedelta(seconds=self.full_s)
        lo = bisect.bisect_right(self.times, surely) - 1  # newest one every node has by t
        if lo < 0:
            return None  # the history does not reach back far enough to be sure
        window = range(lo, hi + 1)
        if any(self.times[i + 1] - self.times[i] > self.interval for i in range(lo, hi)):
            return None  # a missing consensus: its value is unknown
        values = {self.values[i] for i in window}
        return values.pop() if len(values) == 1 else None


def assign(metric: str, samples: Sequence[Sample], history: Sequence[ConsensusRecord], name: str, *,
           default: int | None = None, model: PropagationModel | None = None) -> list[Sample]:
    """``samples`` with param_value set where the value in effect is certain (samples that
    already carry one keep it)."""
    population = catalogue.get(metric).population if catalogue.get(metric) else "clients"
    oracle = InEffect(history, name, POPULATION_CLASS[population], default=default, model=model)
    return [s if s.param_value is not None else attrs.evolve(s, param_value=oracle.at(s.time)) for s in samples]
