"""When each relay and client of a simulated network switches to a new consensus value.

Per node, the time it accepts the first consensus carrying the value, drawn with
``kistexp.dirauth.propagation.PropagationModel.sample_adoption_times`` (dirspec-params.md §3): relays that
are directory caches (the V2Dir flag) fetch early, from an authority (``NodeClass.CACHE``); other relays
and clients fetch from a cache (``NodeClass.CLIENT``).

A real transition lasts about two hours; a simulated run lasts seconds. The drawn times keep their order
and proportions but are compressed linearly onto the run's transition window
(``compress(times, t0, t1)``): every mix of old and new values the network passes through is simulated,
in the order the network passes through it, each for a time proportional to how long it lasts in reality.
"""

from __future__ import annotations

import attrs
import numpy as np

from kistexp.dirauth.propagation import NodeClass, PropagationModel


@attrs.frozen
class AdoptionTimes:
    """Seconds after the consensus's valid-after at which each node switches (real time)."""

    relays: np.ndarray
    clients: np.ndarray

    @property
    def span_s(self) -> float:
        both = np.concatenate([self.relays, self.clients])
        return float(both.max()) if len(both) else 0.0


def adoption_times(relay_is_cache: np.ndarray, n_clients: int, seed: int,
                   model: PropagationModel | None = None) -> AdoptionTimes:
    model = model or PropagationModel()
    rng = np.random.default_rng(seed)
    relays = np.empty(len(relay_is_cache))
    caches = np.flatnonzero(relay_is_cache)
    others = np.flatnonzero(~np.asarray(relay_is_cache, dtype=bool))
    relays[caches] = model.sample_adoption_times(NodeClass.CACHE, len(caches), rng)
    relays[others] = model.sample_adoption_times(NodeClass.CLIENT, len(others), rng)
    clients = model.sample_adoption_times(NodeClass.CLIENT, n_clients, rng)
    return AdoptionTimes(relays, clients)


def compress(times: np.ndarray, span_s: float, t0: float, t1: float) -> np.ndarray:
    """Map real switch times in [0, span_s] linearly onto the simulated window [t0, t1)."""
    if span_s <= 0:
        return np.full(len(times), t0)
    return t0 + np.clip(times / span_s, 0.0, 1.0) * (t1 - t0) * (1 - 1e-9)
