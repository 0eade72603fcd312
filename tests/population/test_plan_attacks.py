"""Attack measures in stage predictions (issue 37): the traced span and flow capacity, a plan cell's
measures beside unchanged performance predictions, the KS distance to the network's baseline, probes, and
saving them with the predictions."""

from __future__ import annotations

import attrs
import pytest
from plan_helpers import VALID_PLAN

from kistexp.errors import PopulationError
from kistexp.expdir import ExperimentDir
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import load_plan
from kistexp.population import attacks
from kistexp.population import predict as P
from kistexp.population.classes import load_class_shares
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import TrafficModel

SIM = '\n[simulation]\npopulation_scale = 0.005\nseeds = [1]\nduration = "16s"\n'


@pytest.fixture(scope="module")
def plan_cells(consensus_path, tmp_path_factory):
    """The cells of the shared plan (10 ms -> 2 ms -> 8 ms, one 30-relay network, 16 s, warm-up 4 s)."""
    path = tmp_path_factory.mktemp("plan") / "plan.toml"
    path.write_text(VALID_PLAN + SIM)
    runs = load_plan(path).stage_runs()
    pop = sample(load_population(consensus_path), 0.005, 1)
    traffic = TrafficModel(bandwidth_scale=0.2, warmup_s=4)
    return [P.PlanCell(i, 0, 1, t, 16.0, 0.005, traffic, P.FAST_BYTE_BUDGET, pop, load_class_shares())
            for i, t in enumerate(runs.transitions)]


def test_the_traced_span_is_the_stage_windows_whole_seconds():
    # predict's layout: warm-up 10 s of 60 s -> stage window [43.33, 60): traced [44, 60)
    assert attacks.stage_trace_window(60, 10) == (44.0, 60.0)
    assert attacks.stage_window_s(60, 10) == 16.0
    assert attacks.flow_segments(16.0) == 4
    assert attacks.flow_capacity(100, 16.0) == (400, 100 * 99 * 4)
    assert attacks.trace_window(3.0, 5.5) == (3.0, 5.0)
    assert attacks.stage_window_s(6.5, 5.9) == 0.0  # [6.3, 6.5): no whole second


def test_a_plan_cell_measures_attacks_and_predicts_the_same_as_untraced(plan_cells, monkeypatch):
    cell = plan_cells[1]  # baseline -> the first stage
    traced = P.run_plan_cell(cell)
    m = traced.attacks
    assert m is not None and m.cpu_s > 0
    values = dict(m.values)
    # no probes: no fingerprinting; no KS distance in a cell (it needs the baseline run)
    assert not any("fingerprint" in k or "guard_" in k for k in values)
    assert "attack_gap_ks_distance" not in values
    assert 0.5 < values["attack_flow_auc"] <= 1.0
    assert 0.0 <= values["attack_flow_tpr_at_fpr_0.01"] <= 1.0
    assert values["attack_mi_region_rtt_bits"] >= 0 and values["attack_rtt_cv"] > 0
    # the flows measured are within what lint counts (plan_flow_capacity): [12, 16) s is one 4-s segment
    sn = P._plan_network(cell.population, seed=1, duration_s=16.0, traffic=cell.traffic, shares=cell.shares,
                         scale=0.005, byte_budget=cell.byte_budget)
    flows, false_pairs = attacks.flow_capacity(len(attacks.flow_circuits(sn)), attacks.stage_window_s(16, 4))
    assert 100 <= m.flows <= flows and m.false_pairs <= false_pairs
    assert "attack_flow_tpr_at_fpr_0.001" not in values  # needs 1,000 flows: left out, not an error
    assert sum(m.exit_gaps) > 1000
    # the trace is result-neutral: the same cell untraced predicts every quantile the same
    monkeypatch.setattr(attacks, "stage_trace_window", lambda duration_s, warmup_s: (0.0, 0.0))
    plain = P.run_plan_cell(cell)
    assert plain.attacks is None
    assert plain.predictions == traced.predictions
    assert plain.achieved_utilisation == traced.achieved_utilisation


def test_probes_add_fingerprinting_and_load_the_relays(plan_cells):
    cell = attrs.evolve(plan_cells[0], probes=8)
    probed = P.run_plan_cell(cell)
    values = dict(probed.attacks.values)
    assert 0.0 <= values["attack_fingerprint_auc"] <= 1.0
    assert values["attack_guard_entropy_after_bits"] + values["attack_guard_entropy_drop_bits"] == \
        pytest.approx(3.0)  # log2 of the 8 candidates
    # the probes are traffic: the relays' bandwidth is not that of the network without them
    plain = P.run_plan_cell(plan_cells[0])
    key = ("baseline", "relay_bandwidth_bytes_per_s", "all", 0, 0.5)

    def at(result):
        return next(p.value for p in result.predictions if (p.stage, p.metric, p.relay_class, p.network,
                                                           p.quantile) == key)
    assert at(probed) > at(plain)


def test_the_probe_plan_is_the_same_for_every_run_of_a_network(plan_cells):
    cell = plan_cells[0]
    sn = P._plan_network(cell.population, seed=1, duration_s=16.0, traffic=cell.traffic, shares=cell.shares,
                         scale=0.005, byte_budget=cell.byte_budget)
    a = attacks.plan_probes(sn, 8, 12.0, 16.0, seed=1)
    assert a == attacks.plan_probes(sn, 8, 12.0, 16.0, seed=1)
    assert len(a.targets) == 8 and len(a.relays) == 8
    guards = {sn.network.circuits[c][0][1] for c in a.targets}
    assert guards <= set(a.relays) and list(a.relays[:len(guards)]) == sorted(guards, key=a.relays.index)


def _result(net: int, gaps: list[int], auc: float) -> P.PlanCellResult:
    run = attacks.RunAttacks((("attack_flow_auc", auc),), tuple(gaps), 200, 39800, 0.1)
    return P.PlanCellResult(net, 30, 40, 0.2, 0.3, 0.3, (), 1.0, 1.0, "h:1", run)


def test_attack_values_pair_each_stage_with_its_networks_baseline():
    # two networks x (baseline, two): gaps as counts per bin
    results = [_result(0, [10, 0, 10], 0.90), _result(1, [0, 20, 0], 0.92),
               _result(2, [10, 10, 0], 0.80), _result(3, [0, 10, 10], 0.84)]
    values = P.attack_values(results, 2, ["baseline", "two"])
    by = {(v.stage, v.measure, v.network): v.value for v in values}
    assert by[("baseline", "attack_gap_ks_distance", 0)] == 0.0
    assert by[("two", "attack_gap_ks_distance", 0)] == pytest.approx(0.5)  # CDFs 0.5,0.5,1 vs 0,1,1
    assert by[("baseline", "attack_gap_ks_distance", 1)] == 0.0
    assert by[("two", "attack_gap_ks_distance", 1)] == pytest.approx(0.5)  # 0.5,1,1 vs 0,0.5,1
    from kistexp.anonymity import stage_differences

    fig = {f.measure: f for f in stage_differences(values, ["baseline", "two"])}
    auc = fig["attack_flow_auc"].difference
    assert auc.units == 2 and auc.mean_difference == pytest.approx(0.03)  # +0.02 and +0.04
    assert fig["attack_gap_ks_distance"].difference.mean_difference == pytest.approx(0.5)
    assert fig["attack_gap_ks_distance"].leakier  # every network moved by 0.5: a zero-width interval above 0
    # a run without gaps gives no KS distance (nothing to compare), the other measures still
    values = P.attack_values([_result(0, [0, 0, 0], 0.9), _result(1, [0, 20, 0], 0.92)], 2, ["baseline", "two"])
    assert {(v.stage, v.measure) for v in values} == {("baseline", "attack_flow_auc"), ("two", "attack_flow_auc")}


def test_save_plan_predictions_stores_attack_values_with_them(tmp_path):
    from kistexp.metrics.series import AttackValue, Prediction

    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN + SIM)
    preds = [Prediction("baseline", "client_ttfb_s", "", 0, 0.5, 0.3)]
    values = [AttackValue("baseline", "attack_flow_auc", 0, 0.9), AttackValue("two", "attack_flow_auc", 0, 0.93)]
    P.save_plan_predictions(tmp_path / "exp", plan, preds, values)
    with ExperimentDir.open(tmp_path / "exp") as exp:
        store = MetricStore(exp.db)
        assert store.load_attack_values() == values and len(store.load_predictions()) == 1
    # an existing experiment takes new values in place of the old ones
    P.save_plan_predictions(tmp_path / "exp", plan, preds, [AttackValue("two", "attack_flow_auc", 0, 0.95)])
    with ExperimentDir.open(tmp_path / "exp") as exp:
        assert [v.value for v in MetricStore(exp.db).load_attack_values()] == [0.9, 0.95]
    assert not list((tmp_path / "exp").glob(".simulate-*"))


def test_probes_out_of_range_are_refused_before_anything_runs(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN + SIM)
    with pytest.raises(PopulationError, match=r"probes: -1 is not a whole number of fingerprinting probes in 0\.\.256"):
        P.simulate_plan(load_plan(plan).stage_runs(), probes=-1)
