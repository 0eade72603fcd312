"""What a (sampled) population consists of: by flags, position class, relay class, country and weight; its
client implementations and, for a stage's values, the share of clients those values reach."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import attrs
import numpy as np

from kistexp.population import arti
from kistexp.population.classes import ClassShares, ClientReach, assign_classes, client_reach, load_class_shares
from kistexp.population.geoip import GeoIP, load_geoip
from kistexp.population.paths import Paths
from kistexp.population.relays import Population
from kistexp.population.sampling import client_budget, tornet_class_shares


@attrs.frozen
class Share:
    key: str
    relays: int
    relay_share: float
    weight_share: float


@attrs.frozen
class StageReach:
    """What a stage's values do to the clients: the classes they reach and Arti's KIST under them."""

    values: tuple[tuple[str, int], ...]
    reach: ClientReach
    arti: arti.ArtiKist  # Arti's KIST under the values (defaults for absent ones, clamped to Arti's bounds)


def stage_reach(values: Mapping[str, int], shares: ClassShares | None = None) -> StageReach:
    """The clients a stage setting ``values`` reaches (``classes.client_reach``) and Arti's KIST under them."""
    return StageReach(tuple(values.items()), client_reach(values, shares), arti.arti_kist(values))


@attrs.frozen
class PopulationSummary:
    source: str
    relays: int
    total_weight_kBps: int
    capacity_gbit: float
    weight_quantiles_kBps: tuple[tuple[str, float], ...]
    bandwidth_weights: tuple[tuple[str, int], ...]
    weights_case: str
    flags: tuple[tuple[str, int], ...]
    position_classes: tuple[Share, ...]  # D/G/E/M (tor's)
    tornet_classes: tuple[tuple[str, float], ...]  # g/e/ge/m weight shares (tornettools')
    relay_classes: tuple[Share, ...]  # OS/HZ/hardware
    schedulers: tuple[Share, ...]
    countries: tuple[Share, ...]
    users: int
    circuits_per_10min: float
    client_classes: tuple[tuple[str, float], ...] = ()  # client implementation shares (tor, arti)


def _shares(keys: list[str], weights: np.ndarray) -> tuple[Share, ...]:
    total_w = float(weights.sum()) or 1.0
    counts = Counter(keys)
    out = []
    for key, n in counts.most_common():
        w = float(weights[[k == key for k in keys]].sum())
        out.append(Share(key, n, n / len(keys), w / total_w))
    return tuple(out)


def summarize(pop: Population, *, geoip: GeoIP | None = None, shares: ClassShares | None = None,
              class_seed: int = 0, scale: float = 1.0) -> PopulationSummary:
    geoip = geoip or load_geoip()
    shares = shares or load_class_shares()
    bw = pop.bandwidth
    classes = assign_classes([r.version for r in pop.relays], shares, class_seed)
    countries = geoip.lookup_many([r.address for r in pop.relays])
    flag_counts = Counter(f for r in pop.relays for f in r.flags)
    q = np.quantile(bw, [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
    budget = client_budget(scale)
    return PopulationSummary(
        source=pop.source,
        relays=len(pop),
        total_weight_kBps=int(bw.sum()),
        capacity_gbit=sum(r.capacity for r in pop.relays) * 8 / 1e9,
        weight_quantiles_kBps=tuple(zip(("min", "p25", "median", "p75", "p90", "p99", "max"),
                                        (float(x) for x in q), strict=True)),
        bandwidth_weights=pop.weights.values,
        weights_case=pop.weights.case,
        flags=tuple(sorted(flag_counts.items(), key=lambda kv: -kv[1])),
        position_classes=_shares(list(pop.classes), bw),
        tornet_classes=tuple(tornet_class_shares(pop, guard_rule=scale == 1.0).items()),
        relay_classes=_shares([c.label for c in classes], bw),
        schedulers=_shares([c.scheduler for c in classes], bw),
        countries=_shares(countries, bw),
        users=budget.users,
        circuits_per_10min=budget.circuits_per_10min,
        client_classes=shares.clients,
    )


@attrs.frozen
class RelayPicks:
    fingerprint: str
    nickname: str
    position_class: str
    guard: float
    middle: float
    exit: float


def pick_frequencies(paths: Paths) -> tuple[RelayPicks, ...]:
    """Per relay, the share of circuits that used it as guard, middle and exit (relays never picked left out)."""
    n = len(paths)
    g, m, e = (paths.counts(p) / n for p in ("guard", "middle", "exit"))
    order = np.argsort(-(g + m + e), kind="stable")
    pop = paths.population
    return tuple(RelayPicks(pop.relays[i].fingerprint, pop.relays[i].nickname, str(pop.classes[i]),
                            float(g[i]), float(m[i]), float(e[i]))
                 for i in order if g[i] + m[i] + e[i] > 0)
