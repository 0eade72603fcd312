"""Exposure checks (issue 32; experimentation platforms call it a sample-ratio-mismatch check).

At every look the engine asks an ``ExposureProbe`` what share of the relays and of the measurement
clients actually run the stage's values, and compares it with what propagation predicts for that
instant (``kistexp.dirauth.propagation``; rollout.md §2.3). A stage whose exposure falls short is not
judged as if applied: every criterion holds (INCONCLUSIVE, "exposure short: ..."), and the row is
journaled (``rollout_exposure``). Relays that pin ``KISTSchedRunInterval`` in their torrc never read
the consensus (tor's ``kist_scheduler_run_interval``, rollout.md §1.7): they are counted apart, never
as on or off the stage.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs
import numpy as np

from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.rollout.journal.rows import ExposureRow
from kistexp.rollout.spec import Cadence

#: How far the observed share may fall below the predicted one before the stage is held. A small
#: network moves in steps of 1/n (one relay of six is 17 %), and a node polled a second before it
#: fetched the consensus is not a problem worth holding a stage for.
TOLERANCE = 0.25


class ExposureProbe(Protocol):
    def measure(self, stage: int, want: Mapping[str, int], stage_va: dt.datetime | None,
                at: dt.datetime) -> list[ExposureRow]: ...


@attrs.frozen
class NodeView:
    """What one node runs: the params of the consensus it holds (None: unknown or unreachable) and
    the value its torrc pins (None: not pinned)."""

    node: str
    population: str
    params: Mapping[str, int] | None
    pinned: Mapping[str, int] = attrs.field(factory=dict)


class PropagationShare:
    """The share of a population that holds a consensus ``since_s`` seconds after its valid-after,
    by the propagation model on the run's own schedule (scaled for accelerated networks)."""

    def __init__(self, cadence: Cadence) -> None:
        model = PropagationModel(schedule=cadence.schedule())
        grid = np.linspace(0, 4 * model.interval_s, 2001)
        factor = cadence.interval_s / model.interval_s
        self._curves = {pop: (grid * factor, np.asarray(model.adoption(cls, grid)))
                        for pop, cls in (("relays", NodeClass.CACHE), ("clients", NodeClass.CLIENT))}

    def __call__(self, population: str, since_s: float) -> float:
        grid, curve = self._curves[population]
        return float(np.interp(since_s, grid, curve)) if since_s >= 0 else 0.0


def assess(views: Sequence[NodeView], want: Mapping[str, int], stage: int, population: str, expected: float,
           at: dt.datetime, tolerance: float = TOLERANCE) -> ExposureRow:
    """Count the nodes of ``population`` on the stage's values, pinned ones apart."""
    mine = [v for v in views if v.population == population]
    pinned = [v for v in mine if any(k in v.pinned for k in want)]
    unknown = [v for v in mine if v not in pinned and v.params is None]
    counted = [v for v in mine if v not in pinned and v.params is not None]
    on = [v for v in counted if all(v.params.get(k) == x for k, x in want.items())]
    observed = len(on) / len(counted) if counted else None
    short = observed is None or observed + tolerance < expected
    wanted = ConsensusParams(want).format()
    if observed is None:
        detail = f"{population}: none of {len(mine)} could be asked which consensus it holds"
    else:
        detail = (f"{population}: {len(on)} of {len(counted)} run {wanted} ({observed:.0%}; propagation predicts "
                  f"{expected:.0%})")
    if pinned:
        detail += f"; {len(pinned)} pin it in their torrc ({', '.join(v.node for v in pinned[:5])})"
    if unknown:
        detail += f"; {len(unknown)} did not answer"
    return ExposureRow(at, stage, population, round(expected, 4), None if observed is None else round(observed, 4),
                    len(mine), len(on), len(pinned), len(unknown), short, detail)


class NodeExposureProbe:
    """Exposure from what each node says it holds: ``views(at)`` gives a NodeView per relay and
    measurement client (a local network's control ports, ``kistexp.localnet``)."""

    def __init__(self, views, cadence: Cadence, populations: Sequence[str] = ("relays", "clients")) -> None:
        self.views, self.share, self.populations = views, PropagationShare(cadence), tuple(populations)

    def measure(self, stage: int, want: Mapping[str, int], stage_va: dt.datetime | None,
                at: dt.datetime) -> list[ExposureRow]:
        seen = list(self.views(at))
        since = (at - stage_va).total_seconds() if stage_va is not None else 0.0
        return [assess(seen, want, stage, pop, self.share(pop, since), at) for pop in self.populations
                if any(v.population == pop for v in seen)]


def version_share(versions: Sequence[tuple[str, int]], want: Mapping[str, int]) -> tuple[float, int] | None:
    """The share of relays whose tor version runs every value of ``want`` as given (not clamped to its
    bounds, and read at all: ``kistexp.params.effective_value``, dirspec-params.md §4), from the
    consensus's version lines; (share, relays counted), None when no version is known."""
    from kistexp import params

    total = honoured = 0
    for text, n in versions:
        try:
            version = params.TorVersion.parse(text.removeprefix("Tor ").split(" ")[0])
        except ValueError:
            continue
        total += n
        ok = True
        for key, value in want.items():
            if params.get(key) is None:
                continue  # not a parameter kistexp knows the bounds of: no opinion
            try:
                ok &= params.effective_value(key, value, version).value == value
            except ValueError:  # this version does not read the parameter
                ok = False
        honoured += n if ok else 0
    return (honoured / total, total) if total else None


class ConsensusExposureProbe:
    """Exposure on the real network, where no node can be asked: the consensus in force at the look
    (from a consensus archive, or the run's own fetches: ``consensus_at``) either carries the stage's
    values, and then the propagation model's share of relays and clients holds them, or it does not,
    and none do. When the archive gives the relays' versions, only relays whose version runs the
    values as given count as exposed (an older tor clamps a value outside its bounds). Clients count
    only for the client implementations that read the values (``kistexp.population.classes.client_reach``
    with ``client_shares``, default the bundled ones: Arti clients ignore KISTSchedRunInterval)."""

    def __init__(self, consensus_at, cadence: Cadence, client_shares=None) -> None:
        self.consensus_at, self.share = consensus_at, PropagationShare(cadence)
        self.client_shares = client_shares

    def measure(self, stage: int, want: Mapping[str, int], stage_va: dt.datetime | None,
                at: dt.datetime) -> list[ExposureRow]:
        found = self.consensus_at(at)
        out = []
        for pop in ("relays", "clients"):
            if found is None:
                out.append(ExposureRow(at, stage, pop, 0.0, None, 0, 0, 0, 0, True,
                                    f"{pop}: no consensus seen at {at:%Y-%m-%d %H:%M} UTC"))
                continue
            va, params = found[0], found[1]
            versions = found[2] if len(found) > 2 else ()
            carries = all(params.get(k) == x for k, x in want.items())
            expected = self.share(pop, (at - (stage_va or va)).total_seconds())
            reach = None
            if pop == "clients" and want:
                from kistexp.population.classes import client_reach

                reach = client_reach(want, self.client_shares)
                expected *= reach.share
            observed = expected if carries else 0.0
            detail = (f"{pop}: the consensus of {va:%Y-%m-%d %H:%M} UTC "
                      f"{'carries' if carries else 'does not carry'} the stage's values; "
                      f"propagation gives {observed:.0%}")
            if reach is not None and reach.missed:
                detail += (f"; only the {reach.share:.0%} of clients whose implementation reads them count ("
                           + ", ".join(f"{k} {v:.0%}" for k, v in reach.missed) + " ignore them)")
            by_version = version_share(versions, want) if pop == "relays" and versions else None
            if by_version is not None:
                share, counted = by_version
                observed *= share
                detail += f"; {share:.0%} of {counted} relays run a tor that takes the values as given"
            out.append(ExposureRow(at, stage, pop, round(expected, 4), round(observed, 4), 0, 0, 0, 0,
                                observed + TOLERANCE < expected, detail))
        return out


class ArchiveView:
    """The consensuses of CollecTor-style archives (``kistexp.metrics.instruments.ConsensusArchivePoller``),
    polled at each look: ``consensus_at(at)`` is the newest verified one valid at or before ``at``, as
    (valid-after, params). Each new one is kept in the experiment's consensus history (``store``). A poll
    that fails leaves the newest consensus verified before it (none at all: the exposure is short)."""

    def __init__(self, pollers, clock, store=None) -> None:
        self.pollers, self.clock, self.store = list(pollers), clock, store
        self._seen: dict[dt.datetime, tuple[dict, tuple]] = {}

    def close(self) -> None:
        for p in self.pollers:
            p.close()
        if self.store is not None:
            self.store.conn.close()

    def consensus_at(self, at: dt.datetime) -> tuple[dt.datetime, dict, tuple] | None:
        """(valid-after, params, relays' versions with counts) of the newest consensus at or before ``at``."""
        now = self.clock.now()
        for p in self.pollers:
            reading = p.poll(now)
            for c in reading.consensuses:
                self._seen[c.valid_after] = (dict(c.params), tuple(c.versions))
                if self.store is not None and c.record is not None:
                    self.store.save_consensus(c.record)
        older = [va for va in self._seen if va <= at]
        if not older:
            return None
        params, versions = self._seen[max(older)]
        return max(older), dict(params), versions
