"""The simulator's stage predictions, saved in the experiment directory's predictions
table, read back as per-stage distributions.

A prediction is the distribution of one metric's samples for one stage ("baseline", a
stage name or "transition:<stage>") and relay class ("" for client metrics) on each of
several independently sampled networks, as quantiles (CONTRACTS.md). The spread between
networks is the prediction's own uncertainty: the dry run compares observed samples with
the pooled distribution and with that spread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np

from kistexp.errors import KistexpError
from kistexp.metrics.series import Prediction
from kistexp.metrics.store import MetricStore

KIND = "simulator"

#: The quantile levels predictions are saved at: 0, 0.01, ..., 0.99, 1.
LEVELS: tuple[float, ...] = tuple(round(i / 100, 2) for i in range(101))


class PredictionError(KistexpError):
    """Stored predictions that do not form a distribution."""


@attrs.frozen
class PredictedDistribution:
    stage: str
    metric: str
    relay_class: str
    levels: tuple[float, ...]
    # network index -> values at ``levels`` (non-decreasing)
    networks: Mapping[int, tuple[float, ...]] = attrs.field(hash=False)

    def quantile(self, q: float, network: int | None = None) -> float:
        """The q-quantile on one network, or of the pooled distribution (each network
        weighted equally) if ``network`` is None."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r} is outside [0, 1]")
        if network is not None:
            return float(np.interp(q, self.levels, self.networks[network]))
        # pooled: invert the mean of the networks' CDFs on the union of their values
        grid = np.unique(np.concatenate([np.asarray(v) for v in self.networks.values()]))
        cdf = np.mean([np.interp(grid, v, self.levels, left=0.0, right=1.0) for v in self.networks.values()],
                      axis=0)
        return float(np.interp(q, cdf, grid))

    def spread(self, q: float) -> tuple[float, float]:
        """Lowest and highest q-quantile over the networks."""
        vals = [self.quantile(q, n) for n in self.networks]
        return min(vals), max(vals)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n draws from the pooled distribution (a random network, then inverse CDF)."""
        keys = sorted(self.networks)
        nets = rng.choice(len(keys), size=n)
        u = rng.random(n)
        table = np.asarray([self.networks[k] for k in keys])
        return np.array([np.interp(ui, self.levels, table[ni]) for ni, ui in zip(nets, u, strict=True)])


def distributions(records: Iterable[Prediction]) -> dict[tuple[str, str, str], PredictedDistribution]:
    """Group predictions into one distribution per (stage, metric, relay_class)."""
    grouped: dict[tuple[str, str, str], dict[int, list[tuple[float, float]]]] = {}
    for p in records:
        grouped.setdefault((p.stage, p.metric, p.relay_class), {}).setdefault(p.network, []).append(
            (p.quantile, p.value))
    out = {}
    for key, nets in grouped.items():
        levels = None
        table = {}
        for net, pairs in sorted(nets.items()):
            pairs.sort()
            qs = tuple(q for q, _ in pairs)
            vs = tuple(v for _, v in pairs)
            where = f"prediction {key[0]}/{key[1]}/{key[2] or '-'} network {net}"
            if levels is None:
                levels = qs
            elif qs != levels:
                raise PredictionError(f"{where}: quantile levels differ from network {min(nets)}'s")
            if len(qs) < 2:
                raise PredictionError(f"{where}: needs at least two quantile levels")
            if any(b < a for a, b in zip(vs, vs[1:], strict=False)):
                raise PredictionError(f"{where}: values decrease with the quantile level")
            table[net] = vs
        out[key] = PredictedDistribution(key[0], key[1], key[2], levels, table)
    return out


def load(store: MetricStore, stage: str | None = None, metric: str | None = None,
         ) -> dict[tuple[str, str, str], PredictedDistribution]:
    """The stored predictions as distributions."""
    return distributions(store.load_predictions(stage=stage, metric=metric))


def predictions_from_values(stage: str, metric: str, relay_class: str, network: int, values: Sequence[float],
                            levels: Sequence[float] = LEVELS) -> list[Prediction]:
    """The rows to save for one simulated network's samples of a metric."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise PredictionError(f"prediction {stage}/{metric}/{relay_class or '-'} network {network}: no values")
    qs = np.quantile(arr, levels)
    return [Prediction(stage, metric, relay_class, network, q, float(v)) for q, v in zip(levels, qs, strict=True)]
