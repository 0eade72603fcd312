"""Circuit paths as tor picks them for general-purpose exit circuits (population.md §1.2-§1.7).

Order (path-spec §2.2): the **exit first**, by the traffic's port against the relay's policy summary (the Exit
flag is not required), then the **guard** from the client's primary guards, then the **middle**. Weights are
``W(position, class) * B`` with the consensus footer's bandwidth-weights (``kistexp.population.bwweights``).
Exclusions (``nodes_in_same_family``): no two relays of one path in the same IPv4 /16 or IPv6 /32
(EnforceDistinctSubnets); declared families are in descriptors, not in a consensus, so only the subnet
rule is applied (§1.1).

Eligibility:
* exit: Running, Valid, not BadExit, summary not reject-all, accepts the port, Fast; Stable for
  long-lived ports (torrc ``LongLivedPorts``);
* guard pool: Guard, Stable, Fast, Valid, V2Dir (and Running);
* middle: Running, Valid, Fast (Stable for long-lived ports).
Guards (§1.7, simplified as the spec allows): each client draws 3 primary guards by guard weight
without replacement (successive draws) and keeps them; a circuit uses uniformly one of the first
``guard-n-primary-guards-to-use`` (consensus param, default 1) primaries that is not the exit or in
its subnet; if none is usable, tor would extend its sample: we draw a fresh pool guard by weight
outside the exit's subnets.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import numpy as np

from kistexp.errors import PopulationError
from kistexp.population.relays import Population

# torrc LongLivedPorts default (config.c)
LONG_LIVED_PORTS = frozenset({21, 22, 706, 1863, 5050, 5190, 5222, 5223, 6523, 6667, 6697, 8300})
N_PRIMARY_GUARDS = 3
POSITIONS = ("guard", "middle", "exit")


def _flags(pop: Population, *names: str) -> np.ndarray:
    ok = np.ones(len(pop), dtype=bool)
    for name in names:
        ok &= pop.has_flag(name)
    return ok


def position_weights(pop: Population, position: str, port: int = 443) -> np.ndarray:
    """Each relay's selection weight for ``position`` (0 for ineligible relays), before exclusions."""
    if position not in POSITIONS:
        raise PopulationError(f"position {position!r} must be one of {', '.join(POSITIONS)}")
    long_lived = port in LONG_LIVED_PORTS
    if position == "exit":
        ok = _flags(pop, "Running", "Valid", "Fast") & ~pop.has_flag("BadExit")
        ok &= np.array([not r.policy.rejects_all and r.policy.allows(port) for r in pop.relays])
    elif position == "guard":
        ok = _flags(pop, "Running", "Valid", "Guard", "Stable", "Fast", "V2Dir")
    else:
        ok = _flags(pop, "Running", "Valid", "Fast")
    if long_lived and position != "guard":
        ok &= pop.has_flag("Stable")
    factor = np.array([pop.weights.factor(position, c) for c in pop.classes])
    w = np.where(ok, factor * pop.bandwidth, 0.0)
    if ok.any() and w.sum() == 0:
        w = ok.astype(np.float64)  # all eligible weights zero: tor picks uniformly
    return w


def position_probabilities(pop: Population, position: str, port: int = 443) -> np.ndarray:
    """The formula of §1.4: P(r) = W·B / Σ W·B over the candidates."""
    w = position_weights(pop, position, port)
    if w.sum() == 0:
        raise PopulationError(f"{pop.source}: no relay can be a {position} for port {port}")
    return w / w.sum()


def _draw(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(cdf) - 1)


@attrs.frozen(eq=False)
class Paths:
    """Drawn circuits: relay indices into the population, one row per circuit."""

    population: Population
    guard: np.ndarray
    middle: np.ndarray
    exit: np.ndarray
    client: np.ndarray  # the client index of each circuit
    port: int

    def __len__(self) -> int:
        return len(self.exit)

    def counts(self, position: str) -> np.ndarray:
        return np.bincount(getattr(self, position), minlength=len(self.population))

    def class_shares(self, position: str) -> dict[str, float]:
        cls = self.population.classes[getattr(self, position)]
        return {c: float(np.mean(cls == c)) for c in ("D", "E", "G", "M")}


def sample_primary_guards(pop: Population, n_clients: int, rng: np.random.Generator,
                          n_primary: int = N_PRIMARY_GUARDS) -> np.ndarray:
    """(n_clients, n_primary) guard indices drawn by weight without replacement, in sample order
    (prop 310: the first sampled guards are the primaries). Successive weighted draws, a repeat redrawn."""
    w = position_weights(pop, "guard")
    pool = np.flatnonzero(w > 0)
    if len(pool) == 0:
        raise PopulationError(f"{pop.source}: no relay qualifies as a guard")
    k = min(n_primary, len(pool))
    cdf = np.cumsum(w)
    out = np.empty((n_clients, k), dtype=np.int64)
    for j in range(k):
        col = _draw(rng, cdf, n_clients)
        for _ in range(10_000):
            dup = np.zeros(n_clients, dtype=bool)
            for i in range(j):
                dup |= col == out[:, i]
            if not dup.any():
                break
            col[dup] = _draw(rng, cdf, int(dup.sum()))
        out[:, j] = col
    return out


def _conflicts(pop: Population, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Same relay, same IPv4 /16 or same IPv6 /32 (nodes_in_same_family with EnforceDistinctSubnets)."""
    s16, s6 = pop.subnet16, pop.subnet6
    return (a == b) | (s16[a] == s16[b]) | ((s6[a] == s6[b]) & (s6[a] >= 0))


def _redraw(rng: np.random.Generator, cdf: np.ndarray, pop: Population, chosen: np.ndarray,
            avoid: Iterable[np.ndarray], what: str) -> np.ndarray:
    avoid = list(avoid)
    for _ in range(1000):
        bad = np.zeros(len(chosen), dtype=bool)
        for other in avoid:
            bad |= _conflicts(pop, chosen, other)
        if not bad.any():
            return chosen
        chosen[bad] = _draw(rng, cdf, int(bad.sum()))
    raise PopulationError(f"{pop.source}: no {what} outside the other hops' subnets")


def pick_paths(pop: Population, n_circuits: int, *, port: int = 443, seed: int | None = None,
               circuits_per_client: int = 1, primary_guards: np.ndarray | None = None) -> Paths:
    """Draw ``n_circuits`` exit circuits for traffic to ``port``.

    Circuits belong to ``ceil(n / circuits_per_client)`` clients, each keeping its primary guards
    (``primary_guards`` gives them explicitly, one row per client)."""
    if n_circuits < 1:
        raise PopulationError(f"--circuits {n_circuits} must be at least 1")
    if circuits_per_client < 1:
        raise PopulationError(f"circuits per client {circuits_per_client} must be at least 1")
    if not 1 <= port <= 65535:
        raise PopulationError(f"port {port} outside 1-65535")
    rng = np.random.default_rng(seed)
    exit_cdf = np.cumsum(position_probabilities(pop, "exit", port))
    middle_cdf = np.cumsum(position_probabilities(pop, "middle", port))
    guard_cdf = np.cumsum(position_probabilities(pop, "guard", port))
    client = np.arange(n_circuits) // circuits_per_client
    n_clients = int(client[-1]) + 1
    if primary_guards is None:
        primary_guards = sample_primary_guards(pop, n_clients, rng)
    elif len(primary_guards) < n_clients:
        raise PopulationError(f"{len(primary_guards)} primary-guard rows for {n_clients} clients")
    exits = _draw(rng, exit_cdf, n_circuits)
    use = max(1, min(dict(pop.params).get("guard-n-primary-guards-to-use", 1), primary_guards.shape[1]))
    prim = primary_guards[client]  # (n, k)
    usable = np.stack([~_conflicts(pop, prim[:, j], exits) for j in range(prim.shape[1])], axis=1)
    # among the first `use` usable primaries, pick one uniformly
    rank = np.cumsum(usable, axis=1)
    n_usable = np.minimum(rank[:, -1], use)
    want = (rng.random(n_circuits) * np.maximum(n_usable, 1)).astype(np.int64) + 1
    col = np.argmax(usable & (rank == want[:, None]), axis=1)
    guards = prim[np.arange(n_circuits), col]
    none = n_usable == 0
    if none.any():
        guards[none] = _draw(rng, guard_cdf, int(none.sum()))
        fixed = _redraw(rng, guard_cdf, pop, guards[none], [exits[none]], "guard")
        guards[none] = fixed
    middles = _redraw(rng, middle_cdf, pop, _draw(rng, middle_cdf, n_circuits), [exits, guards], "middle")
    return Paths(pop, guards, middles, exits, client, port)
