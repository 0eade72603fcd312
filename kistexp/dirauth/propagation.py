"""When relays, clients and bridges accept a newly published consensus (dirspec-params.md §3).

A consensus with valid-after ``V`` is published by the authorities at ``V``. Every tor that
accepts a consensus draws its next fetch uniformly in a window placed relative to that
consensus's fresh-until (networkstatus.c ``update_consensus_networkstatus_fetch_time_impl``),
plus the jitter of the periodic fetch check. Early fetchers (directory caches) fetch from
an authority; clients, bridge relays and non-cache relays from a cache; bridge users from
their bridge. All times below are seconds after ``V``; every consensus of the schedule is
assumed to be produced and every interval to be regular (no midnight merge).

Two views of the same model (§3.1 recipe): ``adoption`` gives the steady-state share of a
class holding a consensus with valid-after >= V at V + t (computed numerically, no
sampling), and ``sample_adoption_times`` draws per-node adoption times with a seeded
numpy Generator by simulating each node's fetches.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping

import attrs
import numpy as np

from kistexp.dirauth.schedule import VotingSchedule
from kistexp.errors import KistexpError

CONSENSUS_MIN_SECONDS_BEFORE_CACHING = 120
AUTHORITY_FETCH_WINDOW_S = 60
CHECK_PERIOD_S = 60.0  # the fetch check runs every 60 s ...
CHECK_PERIOD_TESTING_S = 1.0  # ... every second in test networks


class PropagationError(KistexpError):
    """Bad input to the propagation model."""


class NodeClass(enum.Enum):
    """How a tor schedules its consensus fetches (§3 table)."""

    CACHE = "cache"  # directory cache / relay fetching "early", from an authority
    AUTHORITY = "authority"  # v3 authority (or FetchDirInfoExtraEarly)
    CLIENT = "client"  # client, onion service, bridge relay, non-cache relay: from a cache
    BRIDGE_USER = "bridge_user"  # client with UseBridges: from its bridge


@attrs.frozen
class FetchWindow:
    """Next-fetch window, in seconds after the fresh-until of the consensus held."""

    start_s: int
    length_s: int

    @property
    def end_s(self) -> int:
        return self.start_s + self.length_s


def consensus_slop_s(interval_s: int) -> int:
    """``min(120 s, I/16)``, at least 1 s (§3)."""
    slop = CONSENSUS_MIN_SECONDS_BEFORE_CACHING
    if slop > interval_s // 16:
        slop = max(1, interval_s // 16)
    return slop


def fetch_window(node_class: NodeClass, interval_s: int, lifetime_s: int) -> FetchWindow:
    """tor's fetch window for a consensus with FU - VA = ``interval_s``, VU - VA = ``lifetime_s`` (§3)."""
    if interval_s <= 0 or lifetime_s <= interval_s:
        raise PropagationError(
            f"consensus lifetime {lifetime_s} s must exceed its fresh interval {interval_s} s > 0"
        )
    slop = consensus_slop_s(interval_s)
    vu = lifetime_s - interval_s  # valid-until relative to fresh-until
    if node_class in (NodeClass.CACHE, NodeClass.AUTHORITY):
        start = slop
        if node_class is NodeClass.AUTHORITY:
            length = AUTHORITY_FETCH_WINDOW_S
            if slop + length > interval_s:
                length = interval_s // 2
        else:
            length = interval_s // 2
    else:
        start = (interval_s * 3) // 4
        length = ((vu - start) * 7) // 8
        if node_class is NodeClass.BRIDGE_USER:
            start = start + length + slop
            length = (vu - start) - slop
    length = max(1, length)  # crazy-fast networks
    if start + length >= vu:
        start = vu - length - 1
    return FetchWindow(start, length)


def _sum_uniform_cdf(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """CDF of U(0, a) + U(0, b)."""
    x = np.asarray(x, dtype=float)
    if a <= 0 and b <= 0:
        return (x >= 0).astype(float)
    if a <= 0 or b <= 0:
        w = max(a, b)
        return np.clip(x / w, 0.0, 1.0)

    def r2(y: np.ndarray) -> np.ndarray:
        return np.maximum(y, 0.0) ** 2

    return np.clip((r2(x) - r2(x - a) - r2(x - b) + r2(x - a - b)) / (2 * a * b), 0.0, 1.0)


@attrs.frozen
class PropagationModel:
    """Fetch timing of a schedule; ``check_period_s`` defaults to 60 s (1 s in test networks)."""

    schedule: VotingSchedule = attrs.field(factory=VotingSchedule)
    check_period_s: float | None = None
    transfer_s: float = 0.0  # download + parse time added to every fetch

    def __attrs_post_init__(self) -> None:
        if self.check_period_s is not None and self.check_period_s < 0:
            raise PropagationError(f"check_period_s must be >= 0, got {self.check_period_s}")
        if self.transfer_s < 0:
            raise PropagationError(f"transfer_s must be >= 0, got {self.transfer_s}")

    @property
    def interval_s(self) -> int:
        return self.schedule.interval_s

    @property
    def jitter_s(self) -> float:
        if self.check_period_s is not None:
            return float(self.check_period_s)
        return CHECK_PERIOD_TESTING_S if self.schedule.testing_network else CHECK_PERIOD_S

    def window(self, node_class: NodeClass) -> FetchWindow:
        return fetch_window(node_class, self.schedule.interval_s, self.schedule.lifetime_s)

    def fetch_delay_bounds_s(self, node_class: NodeClass) -> tuple[float, float]:
        """Range of (next fetch - VA of the consensus held)."""
        w = self.window(node_class)
        lo = self.interval_s + w.start_s + self.transfer_s
        return lo, lo + w.length_s + self.jitter_s

    # -- analytic (numerical) steady-state curves ------------------------------------------

    def _delay_cdf(self, node_class: NodeClass, d: np.ndarray) -> np.ndarray:
        w = self.window(node_class)
        lo = self.interval_s + w.start_s + self.transfer_s
        return _sum_uniform_cdf(np.asarray(d, dtype=float) - lo, float(w.length_s), self.jitter_s)

    def _source_curve(self, node_class: NodeClass, x: np.ndarray) -> np.ndarray:
        """P(the node's source holds a consensus with VA >= V at V + x)."""
        if node_class is NodeClass.CACHE:
            return (np.asarray(x) >= 0).astype(float)  # authorities have it from V
        if node_class is NodeClass.CLIENT:
            return self.adoption(NodeClass.CACHE, x)
        return self.adoption(NodeClass.CLIENT, x)  # bridges fetch like clients

    def _curve(self, node_class: NodeClass) -> tuple[np.ndarray, np.ndarray]:
        return _steady_state_curve(self, node_class)

    def _compute_curve(self, node_class: NodeClass) -> tuple[np.ndarray, np.ndarray]:
        interval = float(self.interval_s)
        steps_per_interval = 1440
        h = interval / steps_per_interval
        _, dmax = self.fetch_delay_bounds_s(node_class)
        k_max = int(np.ceil(dmax / interval)) + 1
        n = k_max * steps_per_interval
        edges = np.arange(n + 1) * h
        # g: density of (fetch time mod I) -- the fetch phase is i.i.d. because every fetch
        # is drawn relative to a valid-after, a multiple of I (§3.1 steady state)
        bin_mass = np.diff(self._delay_cdf(node_class, edges))
        phase = bin_mass.reshape(k_max, steps_per_interval).sum(axis=0)
        mids = edges[:-1] + h / 2
        q = self._source_curve(node_class, mids) - self._source_curve(node_class, mids - interval)
        acquired = np.concatenate([[0.0], np.cumsum(np.tile(phase, k_max) * q)])  # G(x)
        survive = 1.0 - self._delay_cdf(node_class, edges)
        mass = acquired * survive  # M(x): share holding the consensus of VA = t - x
        t = edges
        num = np.zeros_like(t)
        den = np.zeros_like(t)
        for k in range(-k_max, k_max + 1):
            x = t - k * interval
            m = np.interp(x, edges, mass, left=0.0, right=0.0)
            den += m
            if k >= 0:
                num += m
        if den.min() <= 0 or den.max() / den.min() > 1.01:
            # The total is not constant: some fetches find nothing newer than the node holds
            # (bridge users in 10 s test networks), which the renewal argument above does
            # not cover. Use the per-node simulation, with a fixed seed so curves stay fixed.
            samples = np.sort(self.sample_adoption_times(node_class, 100_000, np.random.default_rng(0)))
            return t, np.searchsorted(samples, t, side="right") / samples.size
        curve = np.maximum.accumulate(np.clip(num / den, 0.0, 1.0))
        return t, curve

    def adoption(self, node_class: NodeClass, t_s: float | np.ndarray) -> np.ndarray | float:
        """Share of ``node_class`` holding a consensus with VA >= V at V + ``t_s`` (§3.1)."""
        t = np.asarray(t_s, dtype=float)
        if node_class is NodeClass.AUTHORITY:
            out = (t >= 0).astype(float)  # authorities apply it at their own publication
        else:
            grid, curve = self._curve(node_class)
            out = np.interp(t, grid, curve, left=0.0, right=1.0)
            out = np.where(t < 0, 0.0, out)
        return float(out) if out.ndim == 0 else out

    def adoption_mix(self, weights: Mapping[NodeClass, float], t_s: float | np.ndarray) -> np.ndarray | float:
        """Adoption of a population made of classes in the given proportions."""
        total = float(sum(weights.values()))
        if total <= 0 or any(w < 0 for w in weights.values()):
            raise PropagationError(f"class weights must be >= 0 with a positive sum, got {dict(weights)}")
        parts = [w / total * np.asarray(self.adoption(c, t_s)) for c, w in weights.items()]
        out = np.sum(parts, axis=0)
        return float(out) if np.ndim(out) == 0 else out

    def time_until(
        self, fraction: float, population: NodeClass | Mapping[NodeClass, float] = NodeClass.CACHE
    ) -> float:
        """Seconds after V until ``fraction`` of the population holds the new consensus."""
        if not 0.0 <= fraction <= 1.0:
            raise PropagationError(f"fraction must be within [0, 1], got {fraction}")
        weights = {population: 1.0} if isinstance(population, NodeClass) else dict(population)
        if weights.keys() == {NodeClass.AUTHORITY}:
            return 0.0
        horizon = max(
            self.fetch_delay_bounds_s(c)[1] for c in weights if c is not NodeClass.AUTHORITY
        ) + 3 * self.interval_s
        t = np.linspace(0.0, horizon, 20001)
        a = np.asarray(self.adoption_mix(weights, t))
        idx = int(np.searchsorted(a, fraction - 1e-6, side="left"))  # grid rounding near 1
        return float(t[min(idx, len(t) - 1)])

    # -- per-node sampling ---------------------------------------------------------------

    def draw_next_fetch_s(self, node_class: NodeClass, rng: np.random.Generator, n: int = 1) -> np.ndarray:
        """For ``n`` nodes that have just accepted a consensus: seconds from its fresh-until until
        each node's next fetch (§3; networkstatus.c ``update_consensus_networkstatus_fetch_time_impl``).

        That is window start + U(0, window length) + U(0, check period) + ``transfer_s``; the two
        uniforms are drawn from ``rng`` in that order, so a seeded Generator repeats the times.
        Scale the result for an accelerated network.
        """
        w = self.window(node_class)
        return w.start_s + rng.uniform(0.0, w.length_s, n) + rng.uniform(0.0, self.jitter_s, n) + self.transfer_s

    def _draw_delay(self, node_class: NodeClass, rng: np.random.Generator, n: int) -> np.ndarray:
        """Next fetch, in seconds after the valid-after of the consensus held."""
        return self.interval_s + self.draw_next_fetch_s(node_class, rng, n)

    def sample_adoption_times(
        self, node_class: NodeClass, n: int, rng: np.random.Generator, burn_in_intervals: int = 8
    ) -> np.ndarray:
        """Seconds after V at which each of ``n`` nodes accepts a consensus with VA >= V (§3.1 recipe).

        Each node keeps the valid-after it holds; on accepting consensus C it fetches again at
        FU(C) + window start + U(0, window) + U(0, check period). An early node then gets the
        newest consensus from an authority; others get the newest one their source has
        (a random cache, or their bridge), drawn from the source class's adoption curve.
        A fetch that brings nothing newer is retried one check period later.
        """
        if n < 0:
            raise PropagationError(f"node count must be >= 0, got {n}")
        if node_class is NodeClass.AUTHORITY:
            return np.zeros(n)
        interval = float(self.interval_s)
        held = np.full(n, -float(burn_in_intervals) * interval)
        nxt = held + self._draw_delay(node_class, rng, n)
        adopted = np.full(n, np.nan)
        retry = max(self.jitter_s, 1.0)
        active = np.arange(n)
        while active.size:
            s = nxt[active]
            newest = np.floor(s / interval) * interval  # VA of the newest consensus published by s
            if node_class is NodeClass.CACHE:
                got = newest
            else:
                u = rng.uniform(0.0, 1.0, active.size)
                got = np.full(active.size, -np.inf)
                undecided = np.ones(active.size, dtype=bool)
                for k in range(0, burn_in_intervals + 4):
                    has = undecided & (u < self._source_curve(node_class, s - newest + k * interval))
                    got[has] = newest[has] - k * interval
                    undecided &= ~has
                    if not undecided.any():
                        break
            newer = got > held[active]
            idx_new = active[newer]
            held[idx_new] = got[newer]
            nxt[idx_new] = got[newer] + self._draw_delay(node_class, rng, idx_new.size)
            nxt[active[~newer]] = s[~newer] + retry
            reached = held[idx_new] >= 0
            adopted[idx_new[reached]] = s[newer][reached]
            active = active[np.isnan(adopted[active])]
        return adopted


@functools.lru_cache(maxsize=64)
def _steady_state_curve(model: PropagationModel, node_class: NodeClass) -> tuple[np.ndarray, np.ndarray]:
    # models are frozen and hashable; a curve costs a few ms, the timeline asks often
    return model._compute_curve(node_class)
