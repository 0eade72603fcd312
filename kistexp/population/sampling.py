"""Scaled-down networks as tornettools builds them (shadow/tornettools ``generate_tor.py``; population.md §2.3).

From one consensus every relay's running/guard/exit frequency is 0 or 1 (§2.7), so tornettools' steps are:
1. keep Running, Valid, non-BadExit relays with a non-zero weight (``stage.py``; step 1 then draws all of
   them);
2. position by flags: guard = Guard, Fast and Stable and ``round(B / min B) >= 2000``
   (``TOR_GUARD_MIN_CONSBW``), exit = Exit with a policy summary that is not reject-all; classes
   g, e, ge, m;
3. to keep ``n = round(N * scale)`` relays: per class sort by weight, split into
   ``max(1, round(n * count_k / N))`` bins (``numpy.array_split``) and keep one relay per bin;
4. recompute the bandwidth weights for the smaller network (§1.4).

tornettools keeps each bin's **median** relay (``method="median"``, deterministic). Several independently
sampled networks need randomness that frequencies 0/1 do not give, so ``method="random"`` keeps a member
drawn uniformly from the middle half of each bin (seeded): every bin still contributes one relay of its
weight range, so per-class counts and the weight distribution are kept while networks differ. (A uniform
draw over the whole bin is worse at small scales: the top bin of a heavy-tailed class spans orders of
magnitude, and at scale 0.01 one draw moved a class's weight share by 9 points.)

Clients scale with the network (§2.4): PrivCount's 791,935 active users and 1,491,880 active exit circuits
per 10 minutes at 100 %; 5 % onion-service users (left out, as tornettools' default does); 1.98 circuits
per exit user per 10 minutes times ``load_scale``.
"""

from __future__ import annotations

import attrs
import numpy as np

from kistexp.errors import PopulationError
from kistexp.population.relays import Population, Relay

GUARD_MIN_CONSBW = 2000  # tornettools TOR_GUARD_MIN_CONSBW
TORNET_CLASSES = ("g", "e", "ge", "m")
ACTIVE_USERS_PER_10MIN = 791_935
ACTIVE_EXIT_CIRCUITS_PER_10MIN = 1_491_880
ONION_SERVICE_USER_SHARE = 0.05


def tornet_class(relay: Relay, min_bandwidth: int | None = None) -> str:
    """g, e, ge or m; ``min_bandwidth`` applies tornettools' minimum guard weight (None: flags only, for a
    sampled network whose demoted guards have already lost the flag)."""
    guard = {"Guard", "Fast", "Stable"} <= relay.flags and (
        min_bandwidth is None or round(relay.bandwidth / min_bandwidth) >= GUARD_MIN_CONSBW)
    exit_ = "Exit" in relay.flags and not relay.policy.rejects_all
    return "ge" if guard and exit_ else "e" if exit_ else "g" if guard else "m"


def _as_class(relay: Relay, cls: str) -> Relay:
    """The relay with the flags of its tornettools position (a small guard loses its Guard flag)."""
    flags = set(relay.flags)
    if cls in ("e", "m"):
        flags.discard("Guard")
    return attrs.evolve(relay, flags=frozenset(flags))


def eligible(population: Population, guard_rule: bool = True) -> list[tuple[Relay, str]]:
    """Relays tornettools would stage, with their class g/e/ge/m."""
    kept = [r for r in population.relays
            if {"Running", "Valid"} <= r.flags and "BadExit" not in r.flags and r.bandwidth > 0]
    if not kept:
        raise PopulationError(f"{population.source}: no Running, Valid relay with a non-zero weight")
    min_bw = min(r.bandwidth for r in kept) if guard_rule else None
    return [(r, tornet_class(r, min_bw)) for r in kept]


def sample(population: Population, scale: float, seed: int | None = None, method: str = "random") -> Population:
    """A network of ``round(N * scale)`` relays keeping each class's share and weight distribution."""
    if not isinstance(scale, (int, float)) or not 0 < scale <= 1:
        raise PopulationError(f"scale {scale!r} must be in (0, 1]")
    if method not in ("random", "median"):
        raise PopulationError(f"sampling method {method!r} must be 'random' or 'median'")
    staged = eligible(population)
    n_total = len(staged)
    n = round(n_total * scale)
    rng = np.random.default_rng(seed)
    chosen: list[Relay] = []
    for cls in TORNET_CLASSES:
        members = sorted((r for r, c in staged if c == cls), key=lambda r: r.bandwidth)
        if not members:
            continue
        k = max(1, round(n * len(members) / n_total))
        for part in np.array_split(np.arange(len(members)), k):
            if len(part) == 0:
                continue
            if method == "median":
                i = part[len(part) // 2]
            else:
                lo, hi = len(part) // 4, len(part) - len(part) // 4  # the bin's middle half
                i = part[lo + int(rng.integers(max(1, hi - lo)))]
            chosen.append(_as_class(members[int(i)], cls))
    chosen.sort(key=lambda r: r.fingerprint)
    label = f"{population.source} scale {scale:g} " + ("median" if method == "median" else f"seed {seed}")
    return population.with_relays(chosen, label)


def samples(population: Population, scale: float, seeds: list[int] | tuple[int, ...]) -> list[Population]:
    """Independently seeded networks, one per seed."""
    return [sample(population, scale, seed) for seed in seeds]


def tornet_class_shares(pop: Population, guard_rule: bool = True) -> dict[str, float]:
    """Weight share of each tornettools class g/e/ge/m (``guard_rule=False`` for a sampled network)."""
    staged = eligible(pop, guard_rule)
    total = sum(r.bandwidth for r, _ in staged)
    return {c: sum(r.bandwidth for r, k in staged if k == c) / total for c in TORNET_CLASSES}


@attrs.frozen
class ClientBudget:
    """Users and circuits of a network at ``scale`` (tornettools generate_tgen.py, population.md §2.4)."""

    scale: float
    load_scale: float
    users: int  # exit users (onion-service users left out)
    circuits_per_10min: float

    @property
    def circuits_per_user_per_10min(self) -> float:
        return self.circuits_per_10min / self.users if self.users else 0.0


def client_budget(scale: float, load_scale: float = 1.0) -> ClientBudget:
    if not 0 < scale <= 1:
        raise PopulationError(f"scale {scale!r} must be in (0, 1]")
    if load_scale <= 0:
        raise PopulationError(f"load_scale {load_scale!r} must be positive")
    exit_users = ACTIVE_USERS_PER_10MIN * (1 - ONION_SERVICE_USER_SHARE) * scale
    per_user = ACTIVE_EXIT_CIRCUITS_PER_10MIN / (ACTIVE_USERS_PER_10MIN * (1 - ONION_SERVICE_USER_SHARE))
    return ClientBudget(scale, load_scale, max(1, round(exit_users)), exit_users * per_user * load_scale)
