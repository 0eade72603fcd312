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


@attrs.frozen(eq=False)
class SwitchSchedule:
    """Simulated switch times of nodes, in time order; ``apply_until`` hands each node its new values
    through the simulation's ``apply`` as the run reaches its time (``Simulation.advance_to``/``apply``)."""

    times: np.ndarray  # simulated seconds, sorted
    nodes: np.ndarray  # node ids, same order
    params: tuple[tuple[str, int], ...]
    _next: list = attrs.field(factory=lambda: [0], alias="_next")

    @classmethod
    def build(cls, times_by_node: dict[int, float], params: tuple[tuple[str, int], ...]) -> SwitchSchedule:
        order = sorted(times_by_node.items(), key=lambda kv: (kv[1], kv[0]))
        return cls(np.array([t for _, t in order]), np.array([n for n, _ in order], dtype=np.int64), params)

    @property
    def applied(self) -> int:
        return self._next[0]

    def apply_until(self, sim, t_s: float, apply=None) -> None:
        """Advance ``sim`` to ``t_s``, switching every node whose time is <= t_s on the way, through ``apply(sim,
        nodes, values)`` (default ``sim.apply``; ``SimNetwork.apply`` hands Arti clients only what Arti reads)."""
        i = self._next[0]
        values = dict(self.params)
        while i < len(self.times) and self.times[i] <= t_s:
            when = float(self.times[i])
            j = i
            while j < len(self.times) and self.times[j] == when:
                j += 1
            sim.advance_to(max(when, sim.now_s))
            nodes = [int(n) for n in self.nodes[i:j]]
            if apply is None:
                sim.apply(nodes, values)
            else:
                apply(sim, nodes, values)
            i = j
        self._next[0] = i
        sim.advance_to(max(t_s, sim.now_s))
