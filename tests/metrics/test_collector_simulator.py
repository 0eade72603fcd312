"""Stage predictions saved in the experiment directory, read back as distributions."""

from __future__ import annotations

import numpy as np
import pytest

from kistexp.expdir import ExperimentDir
from kistexp.metrics.collectors import simulator as sim
from kistexp.metrics.series import Prediction
from kistexp.metrics.store import MetricStore


@pytest.fixture
def store(tmp_path):
    exp = ExperimentDir.create(tmp_path / "exp")
    yield MetricStore(exp.db)
    exp.close()


def test_round_trip_and_pooled_quantiles(store):
    rng = np.random.default_rng(7)
    # two networks: log-normal download times, the second 20 % slower
    for net, scale in ((0, 1.0), (1, 1.2)):
        base = rng.lognormal(np.log(2.0), 0.5, 20_000) * scale
        store.save_predictions(sim.predictions_from_values("baseline", "client_ttlb_1mib_s", "", net, base))
        store.save_predictions(sim.predictions_from_values("canary", "client_ttlb_1mib_s", "", net, base * 1.1))
    dists = sim.load(store)
    assert set(dists) == {("baseline", "client_ttlb_1mib_s", ""), ("canary", "client_ttlb_1mib_s", "")}
    base = dists[("baseline", "client_ttlb_1mib_s", "")]
    assert base.levels == sim.LEVELS and set(base.networks) == {0, 1}
    assert base.quantile(0.5, 0) == pytest.approx(2.0, rel=0.03)
    assert base.quantile(0.5, 1) == pytest.approx(2.4, rel=0.03)
    lo, hi = base.spread(0.5)
    assert lo < base.quantile(0.5) < hi
    canary = dists[("canary", "client_ttlb_1mib_s", "")]
    assert canary.quantile(0.5) / base.quantile(0.5) == pytest.approx(1.1, rel=0.01)
    draws = base.sample(20_000, np.random.default_rng(1))
    assert np.median(draws) == pytest.approx(base.quantile(0.5), rel=0.03)
    only = sim.load(store, stage="canary")
    assert list(only) == [("canary", "client_ttlb_1mib_s", "")]


def test_bad_predictions_are_refused():
    rows = [Prediction("baseline", "relay_cpu_utilization", "guard", 0, q, v) for q, v in ((0.0, 1.0), (1.0, 0.5))]
    with pytest.raises(sim.PredictionError, match="baseline/relay_cpu_utilization/guard network 0: values decrease"):
        sim.distributions(rows)
    rows = [Prediction("baseline", "relay_cpu_utilization", "guard", 0, 0.0, 1.0),
            Prediction("baseline", "relay_cpu_utilization", "guard", 0, 1.0, 2.0),
            Prediction("baseline", "relay_cpu_utilization", "guard", 1, 0.5, 2.0),
            Prediction("baseline", "relay_cpu_utilization", "guard", 1, 1.0, 2.0)]
    with pytest.raises(sim.PredictionError, match="network 1: quantile levels differ"):
        sim.distributions(rows)
