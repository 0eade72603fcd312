"""Sampled networks in the simulator: traffic at a target load, mixed adoption in one run, relay costs,
stage predictions and `kistexp simulate`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import PopulationError
from kistexp.plan.loader import load_plan
from kistexp.population import costs
from kistexp.population.adoption import SwitchSchedule, adoption_times, compress
from kistexp.population.classes import load_profiles
from kistexp.population.predict import achieved_utilisation, simulate_plan
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import PERF_SIZES, TrafficModel, build_network
from kistexp.sim import RunConfig, Simulation


@pytest.fixture(scope="module")
def small(consensus_path):
    return sample(load_population(consensus_path), 0.005, 1)  # 30 relays


def test_network_mirrors_the_population(small):
    sn = build_network(small, duration_s=20, seed=1, interval_ms=10,
                       traffic=TrafficModel(bandwidth_scale=0.2, loss_rate=0.01))
    net = sn.network
    assert len(sn.relay_nodes) == len(small) == 30
    for node, r, cls in zip(sn.relay_nodes, small.relays, sn.relay_classes, strict=True):
        cfg = net.nodes[node]
        assert cfg.scheduler == ("kist" if cls.os == "linux" else "kistlite")
        assert cfg.kernel_tick_ms == pytest.approx(1000 / cls.hz)
        assert cfg.nic_rate_bytes_per_s == pytest.approx(0.2 * r.capacity)
    assert all(link.loss_rate == 0.01 for _, _, link in net.channels)
    # client -> guard links carry residential access latency, relay -> relay links data-centre latency
    clients = set(sn.client_nodes) | set(sn.perf_nodes)
    client_rtt = [link.rtt_ms for a, b, link in net.channels if a in clients or b in clients]
    relay_rtt = [link.rtt_ms for a, b, link in net.channels if a not in clients and b not in clients]
    assert min(client_rtt) >= 2 * (10 + 0.75) and min(relay_rtt) >= 2 * 1.5
    perf_sizes = {int(x) for x in net.transfer_arrays()[2]}
    assert set(PERF_SIZES) <= perf_sizes


@pytest.mark.slow
def test_load_knob_reaches_the_target(small):
    """Offered load is set from the paths; at 0.2 the relays' measured utilisation matches it."""
    traffic = TrafficModel(load=0.2, bandwidth_scale=0.2, warmup_s=5)
    sn = build_network(small, duration_s=20, seed=1, interval_ms=10, traffic=traffic)
    assert sn.mean_utilisation == pytest.approx(0.2)
    sim = Simulation(sn.network, RunConfig(duration_s=20, seed=1))
    sim.advance_to(20)
    assert achieved_utilisation(sn, sim.window(5, 20)) == pytest.approx(0.2, rel=0.15)
    doubled = build_network(small, duration_s=20, seed=1, interval_ms=10, traffic=TrafficModel(
        load=0.4, bandwidth_scale=0.2))
    assert doubled.offered_bytes_per_s == pytest.approx(2 * sn.offered_bytes_per_s, rel=0.05)


@pytest.mark.parametrize("field, value", [("load", 0.0), ("load", 1.2), ("loss_rate", 0.6),
                                          ("bandwidth_scale", 0.0), ("web_share", 0.5)])
def test_bad_traffic(field, value):
    import attrs

    with pytest.raises(PopulationError):
        attrs.evolve(TrafficModel(), **{field: value}).validate()


def test_adoption_caches_first_and_one_run_mixes_values(small):
    caches = np.array(["V2Dir" in r.flags for r in small.relays])
    adopt = adoption_times(caches, 50, seed=3)
    # directory caches fetch from the authorities, early; the others from caches, later
    assert np.median(adopt.relays[caches]) < np.median(adopt.relays[~caches])
    assert 3600 < adopt.span_s < 3 * 3600
    sim_t = compress(adopt.relays, adopt.span_s, 8.0, 14.0)
    assert sim_t.min() >= 8.0 and sim_t.max() < 14.0
    assert np.array_equal(np.argsort(sim_t, kind="stable"), np.argsort(adopt.relays, kind="stable"))

    sn = build_network(small, duration_s=16, seed=2, interval_ms=10, traffic=TrafficModel(
        bandwidth_scale=0.2, warmup_s=4))
    sim = Simulation(sn.network, RunConfig(duration_s=16, seed=2))
    sim.apply(list(range(len(sn.network.nodes))), {"KISTSchedRunInterval": 10})
    sim.advance_to(8)
    when = dict(zip(sn.relay_nodes, sim_t.tolist(), strict=True))
    schedule = SwitchSchedule.build(when, (("KISTSchedRunInterval", 2),))
    mid = float(np.median(sim_t))
    schedule.apply_until(sim, mid)
    intervals = np.array([sim.node_interval_ms(n) for n in sn.relay_nodes])
    switched = sim_t <= mid
    assert 0 < switched.sum() < len(switched)  # a mixed network mid-transition
    assert set(intervals[switched]) == {2} and set(intervals[~switched]) == {10}
    schedule.apply_until(sim, 14.0)
    assert {sim.node_interval_ms(n) for n in sn.relay_nodes} == {2}
    assert schedule.applied == len(sn.relay_nodes)


def test_cost_model_from_the_profile():
    p = load_profiles()["xeon-d2123it-skylake"]
    m = costs.cost_model(p)
    assert m.per_syscall_ns == pytest.approx(540.0)  # 1.08 us per pending socket = two syscalls
    # TLS per cell: 514 B x 0.27 ns + 320 ns / 31 cells
    assert m.tls_cell_ns == pytest.approx(514 * 0.27 + 320 / 31)
    assert m.cell_crypto_ns(layers=1, digests=0) == pytest.approx(159.0)
    assert costs.circuit_build_cpu(p, 600) == pytest.approx(316.1e-6)  # one ntor per circuit per 600 s
    ktls = costs.cost_model(load_profiles()["xeon-d2123it-freebsd-ktls"])
    assert costs.circuit_build_cpu(load_profiles()["xeon-d2123it-freebsd-ktls"], 600) < 316.1e-6
    assert ktls.per_syscall_ns == m.per_syscall_ns
    assert costs.rss_bytes(100, 10, 52_800) == pytest.approx(58e6 + 330_000 + 80_000 + 52_800)


def _tiny_plan(tmp_path, text: str):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return load_plan(path)


def _switchback_text() -> str:
    """The shared valid plan as a 3 ms / 2 ms switchback with a tiny [simulation] table."""
    head, _, rest = VALID_PLAN.partition("[[stages]]")
    _, _, tail = rest.partition("[authorities]")
    head = head.replace('kind = "staged"', 'kind = "switchback"').replace("= 10 }", "= 3 }")
    sb = ("[switchback]\ntreatment = { KISTSchedRunInterval = 2 }\ncontrol = { KISTSchedRunInterval = 3 }\n"
          'period = "24h"\nwashout = "2h"\ncycles = 2\n\n')
    sim = '\n[simulation]\npopulation_scale = 0.005\nseeds = [1, 2]\nduration = "16s"\n'
    return head + sb + "[authorities]" + tail + sim


SWITCHBACK = _switchback_text()


def test_switchback_runs_treatment_and_control(tmp_path):
    plan = _tiny_plan(tmp_path, SWITCHBACK)
    assert [(t.from_stage, t.to_stage) for t in plan.stage_runs().transitions] == \
        [("baseline", "baseline"), ("baseline", "treatment"), ("treatment", "control")]


@pytest.mark.slow
def test_simulate_plan_predictions(tmp_path):
    plan = _tiny_plan(tmp_path, SWITCHBACK)
    seen: list[tuple[float, str]] = []
    result = simulate_plan(plan.stage_runs(), traffic=TrafficModel(bandwidth_scale=0.2, warmup_s=4),
                           progress=lambda f, what: seen.append((f, what)))
    # progress only moves forward (it once fell back to a run's start at its end), from 0 to 1
    fractions = [f for f, _ in seen]
    assert fractions[0] == 0.0 and fractions[-1] == pytest.approx(1.0)
    assert all(a <= b + 1e-12 for a, b in zip(fractions, fractions[1:], strict=False))
    assert seen[0][1] == "sampling 2 networks"
    assert "network 2: treatment -> control" in {w for _, w in seen}
    assert result.stages == ("baseline", "treatment", "control")
    assert result.networks == 2 and result.relays_per_network == (30, 30)
    assert result.windows_s[0] == ("warm-up", 0.0, 4.0) and result.windows_s[-1][2] == 16.0
    stages = {p.stage for p in result.predictions}
    assert stages == {"baseline", "treatment", "control", "transition:baseline", "transition:treatment",
                      "transition:control"}
    # one distribution per stage, metric, class and network: 101 quantiles, non-decreasing
    key = ("treatment", "relay_cpu_utilization", "all", 0)
    qs = [p for p in result.predictions if (p.stage, p.metric, p.relay_class, p.network) == key]
    assert [p.quantile for p in qs] == [round(i / 100, 2) for i in range(101)]
    assert all(a.value <= b.value for a, b in zip(qs, qs[1:], strict=False))
    classes = {p.relay_class for p in result.predictions if p.metric == "relay_cpu_utilization"}
    assert {"all", "guard", "middle"} <= classes and any(" HZ=250" in c for c in classes)
    # the control arm runs the baseline's value on the same networks: near the baseline
    fig = {(f.stage, f.metric, f.relay_class): f for f in result.figures}
    control = fig[("control", "relay_bandwidth_bytes_per_s", "all")]
    assert control.networks == 2 and abs(control.change) < 0.1
    assert control.low <= control.median <= control.high


@pytest.mark.slow
def test_cli_simulate_saves_and_reuses(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(SWITCHBACK.replace("seeds = [1, 2]", "seeds = [4]"))
    exp = tmp_path / "exp"
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", str(plan), "--dir", str(exp), "--json", "--load", "0.3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stderr may say the simulator is being compiled
    assert data["dir"] == str(exp) and data["stages"] == ["baseline", "treatment", "control"]
    assert (exp / "experiment.db").is_file() and (exp / "plan.toml").is_file()
    again = runner.invoke(app, ["simulate", str(plan), "--dir", str(exp), "--stored", "--json"])
    assert again.exit_code == 0, again.output
    stored = json.loads(again.output)
    assert {(f["stage"], f["metric"], f["relay_class"]) for f in stored["figures"]} == \
        {(f["stage"], f["metric"], f["relay_class"]) for f in data["figures"]}
    table = runner.invoke(app, ["simulate", str(plan), "--dir", str(exp), "--stored"])
    assert table.exit_code == 0 and "relay_cpu_utilization" in table.output and "treatment" in table.output


def test_cli_simulate_bad_input(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(SWITCHBACK.replace('duration = "16s"', 'duration = "5s"'))
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", str(plan), "--dir", str(tmp_path / "e")])
    assert result.exit_code != 0 and "too short" in str(result.exception)
    result = runner.invoke(app, ["simulate", str(plan), "--load", "1.5", "--dir", str(tmp_path / "e")])
    assert "load 1.5 must be in (0, 1)" in str(result.exception)
    result = runner.invoke(app, ["simulate", str(plan), "--stored", "--dir", str(tmp_path / "none")])
    assert "no such experiment directory" in str(result.exception)


def test_a_higher_load_moves_more_bytes_through_the_same_nics(small):
    """A sweep's loads on one network: NICs scaled for the byte budget at load 1, the same at every load, so
    relay bandwidth and CPU rise with the load (scaled to the budget at each load, every load moved the same
    bytes over slower NICs and CPU fell as the load rose)."""
    from kistexp.population.classes import load_class_shares
    from kistexp.population.predict import simulate_values

    runs = {load: simulate_values(small, {"KISTSchedRunInterval": 10}, load=load, loss_rate=0.0,
                                  shares=load_class_shares(), seed=1, duration_s=8, scale=0.005, byte_budget=4e6)
            for load in (0.3, 0.6)}
    assert runs[0.3].bandwidth_scale == runs[0.6].bandwidth_scale < 1
    fig = {load: {(m, c): med for m, c, med, _p95 in r.figures} for load, r in runs.items()}
    for metric in ("relay_bandwidth_bytes_per_s", "relay_cpu_utilization"):
        assert fig[0.6][(metric, "all")] > 1.3 * fig[0.3][(metric, "all")], metric
