"""Arti clients in the population (issue 37, point 4): their own share, their own KIST parameters with
Arti's bounds and clamping, no reaction to KISTSchedRunInterval in the simulator, and exposure that
counts only the clients a stage's values reach."""

from __future__ import annotations

import datetime as dt
import json

import attrs
import numpy as np
import pytest
from typer.testing import CliRunner

from kistexp import params
from kistexp.cli import app
from kistexp.errors import PopulationError
from kistexp.population import arti
from kistexp.population.classes import (
    ALL_TOR_CLIENTS,
    DEFAULT_CLASSES,
    assign_client_classes,
    client_class_reads,
    client_reach,
    load_class_shares,
)
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.population.simnet import TrafficModel, build_network, client_node_config

KIST = "KISTSchedRunInterval"
KIST_CLIENT = "KISTSchedRunIntervalClient"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def small(consensus_path):
    return sample(load_population(consensus_path), 0.005, 1)  # 30 relays


def _with_clients(**clients: float):
    return attrs.evolve(load_class_shares(), clients=tuple(clients.items()))


# --- Arti's rule: its parameters, defaults, bounds and clamping ----------------------------------------


def test_the_catalogue_holds_artis_bounds():
    enabled, lowat = params.get("kist-enabled"), params.get("kist-tcp-notsent-lowat")
    assert (enabled.current.default, enabled.current.minimum, enabled.current.maximum) == (0, 0, 1)
    assert (lowat.current.default, lowat.current.minimum, lowat.current.maximum) == (1, 1, 2**31 - 1)
    assert enabled.read_by == lowat.read_by == params.ARTI_ONLY
    assert "crates/tor-netdir/src/params.rs" in enabled.source


def test_absent_parameters_take_artis_defaults():
    kist = arti.arti_kist({})
    assert kist == arti.ArtiKist(enabled=False, tcp_notsent_lowat=1, clamped=())
    # KIST off: TCP_NOTSENT_LOWAT = u32::MAX on Linux, nothing set elsewhere; no run interval at all
    assert kist.socket_notsent_lowat() == 4_294_967_295
    assert kist.socket_notsent_lowat(linux=False) is None
    assert kist.run_interval_ms is None


@pytest.mark.parametrize("name, given, runs, clamped", [
    ("kist-enabled", 1, 1, False),
    ("kist-enabled", 0, 0, False),
    ("kist-enabled", 2, 1, True),
    ("kist-enabled", 7, 1, True),
    ("kist-enabled", -1, 0, True),
    ("kist-enabled", -(2**31), 0, True),
    ("kist-tcp-notsent-lowat", 16384, 16384, False),
    ("kist-tcp-notsent-lowat", 1, 1, False),
    ("kist-tcp-notsent-lowat", 0, 1, True),
    ("kist-tcp-notsent-lowat", -5, 1, True),
    ("kist-tcp-notsent-lowat", 2**31 - 1, 2**31 - 1, False),
])
def test_out_of_range_values_are_clamped_to_artis_bounds(name, given, runs, clamped):
    got = arti.arti_value(name, given)
    assert (got.value, got.clamped, got.consensus_value) == (runs, clamped, given)


def test_kist_on_sets_the_low_water_mark_and_clamps_it():
    kist = arti.arti_kist({"kist-enabled": 1, "kist-tcp-notsent-lowat": 16384})
    assert kist.enabled and kist.socket_notsent_lowat() == 16384 and kist.clamped == ()
    kist = arti.arti_kist({"kist-enabled": 3, "kist-tcp-notsent-lowat": 0})
    assert kist.enabled and kist.socket_notsent_lowat() == 1
    assert kist.clamped == ("kist-enabled", "kist-tcp-notsent-lowat")
    # the low-water mark is held while KIST is off, but the socket gets u32::MAX
    off = arti.arti_kist({"kist-enabled": 0, "kist-tcp-notsent-lowat": 8192})
    assert off.tcp_notsent_lowat == 8192 and off.socket_notsent_lowat() == 2**32 - 1


def test_arti_ignores_the_kist_run_intervals():
    assert arti.arti_kist({KIST: 2, KIST_CLIENT: 50}) == arti.arti_kist({})
    assert not arti.acts_on(KIST) and not arti.acts_on(KIST_CLIENT)
    assert not arti.acts_on("CircuitPriorityHalflifeMsec")  # parsed by Arti, used nowhere
    assert arti.acts_on("cc_alg") and arti.acts_on("kist-enabled")
    assert arti.ignores([KIST, "cc_alg", "kist-enabled", KIST_CLIENT]) == (KIST, KIST_CLIENT)


def test_bad_values_and_names_are_refused():
    with pytest.raises(PopulationError, match="32-bit"):
        arti.arti_value("kist-enabled", 2**31)
    with pytest.raises(PopulationError, match="integers"):
        arti.arti_value("kist-tcp-notsent-lowat", 1.5)
    with pytest.raises(PopulationError, match="not one of Arti's KIST parameters"):
        arti.arti_value(KIST, 2)


def test_kist_on_in_arti_is_refused_by_the_simulation_not_run_as_off():
    assert arti.check_simulable({KIST: 2, "kist-enabled": 0}).enabled is False
    with pytest.raises(PopulationError, match="TCP_NOTSENT_LOWAT=4096 .* lacks a per-socket TCP_NOTSENT_LOWAT"):
        arti.check_simulable({"kist-enabled": 1, "kist-tcp-notsent-lowat": 4096})


# --- the client class and its share ----------------------------------------------------------------------


def test_bundled_client_shares_and_a_file_without_clients(tmp_path):
    assert load_class_shares().clients == (("tor", 0.97), ("arti", 0.03))
    assert load_class_shares().client_share("arti") == pytest.approx(0.03)
    relays_only = tmp_path / "relays.toml"
    relays_only.write_text(DEFAULT_CLASSES.read_text().split("\n[clients]\n")[0])
    assert load_class_shares(relays_only).clients == ALL_TOR_CLIENTS


@pytest.mark.parametrize("table, message", [
    ("[clients]\ntor = 0.9\narti = 0.05\n", r"clients: shares sum to 0.95, not 1"),
    ("[clients]\ntor = 0.9\nrust = 0.1\n", r"clients.rust: unknown client implementation"),
    ("[clients]\ntor = 1.1\narti = -0.1\n", r"clients.arti: must not be negative"),
])
def test_bad_client_shares(tmp_path, table, message):
    path = tmp_path / "classes.toml"
    path.write_text(DEFAULT_CLASSES.read_text().split("\n[clients]\n")[0] + "\n" + table)
    with pytest.raises(PopulationError, match=message) as info:
        load_class_shares(path)
    assert str(path) in str(info.value)


def test_client_classes_are_drawn_by_their_share():
    drawn = assign_client_classes(40_000, seed=3)
    # binomial: 0.03 +- 0.00085 (sd) at n = 40,000
    assert drawn.count("arti") / 40_000 == pytest.approx(0.03, abs=0.0035)
    assert assign_client_classes(500, seed=3) == assign_client_classes(500, seed=3)
    assert assign_client_classes(500, seed=3) != assign_client_classes(500, seed=4)
    assert assign_client_classes(100, _with_clients(tor=1.0), seed=3) == ["tor"] * 100
    half = assign_client_classes(40_000, _with_clients(tor=0.5, arti=0.5), seed=1)
    assert half.count("arti") / 40_000 == pytest.approx(0.5, abs=0.01)


def test_a_built_network_honours_the_client_share(small):
    shares = _with_clients(tor=0.7, arti=0.3)
    sn = build_network(small, duration_s=10, seed=2, interval_ms=10, shares=shares,
                       traffic=TrafficModel(bandwidth_scale=0.2))
    users, perf = sn.client_nodes, sn.perf_nodes
    assert len(sn.client_classes) == len(users) + len(perf)
    arti_users = [n for n in users if sn.client_class(n) == "arti"]
    # 100 user processes (tornettools' floor) at 30 %: 30 expected, sd 4.6
    assert len(users) == 100 and abs(len(arti_users) - 0.3 * len(users)) <= 3 * np.sqrt(0.3 * 0.7 * len(users))
    assert len(arti_users) == assign_client_classes(len(users), shares, 2).count("arti")
    assert all(sn.client_class(n) == "tor" for n in perf)  # the measurement clients run C tor
    for n in users:
        cfg = sn.network.nodes[n]
        if sn.client_class(n) == "arti":
            assert (cfg.scheduler, cfg.schedulers) == ("vanilla", ("vanilla",))
            assert "CircuitPriorityHalflife" in cfg.torrc_overrides
        else:
            assert (cfg.scheduler, cfg.kist_interval_ms, cfg.torrc_overrides) == ("kist", 2, ())
    # a forced scheduler (scheduler comparisons) puts every client on it, Arti's too
    forced = build_network(small, duration_s=10, seed=2, interval_ms=10, shares=shares, scheduler="kistlite",
                           traffic=TrafficModel(bandwidth_scale=0.2))
    assert {forced.network.nodes[n].scheduler for n in forced.client_nodes} == {"kistlite"}


def test_adding_arti_clients_leaves_every_other_draw_of_a_seed_as_it_was(small):
    def build(shares):
        return build_network(small, duration_s=10, seed=5, interval_ms=10, shares=shares,
                             traffic=TrafficModel(bandwidth_scale=0.2))

    without, default = build(_with_clients(tor=1.0)), build(load_class_shares())
    assert default.client_classes.count("arti") == 3 and without.client_classes.count("arti") == 0
    assert without.network.node_names == default.network.node_names
    assert without.client_countries == default.client_countries
    assert [link for link in without.network.channels] == [link for link in default.network.channels]
    for a, b in zip(without.network.transfer_arrays(), default.network.transfer_arrays(), strict=True):
        assert np.array_equal(a, b)
    assert without.relay_classes == default.relay_classes
    assert without.offered_bytes_per_s == default.offered_bytes_per_s


# --- in the simulator: KISTSchedRunInterval moves a tor client, not an Arti client ------------------------


def _two_clients(interval_ms: int) -> dict[str, tuple]:
    """A tor client and an Arti client, each uploading 4 x 1 MB over its own three relays; the consensus
    with ``interval_ms`` for both KIST run intervals handed to the two clients only (the relays keep 10 ms,
    so any change is the client's own)."""
    from kistexp.sim import LinkConfig, Network, NodeConfig, RunConfig, Simulation, Transfer

    net = Network(LinkConfig(rtt_ms=20.0))
    clients, transfers = {}, {}
    for cls in ("tor", "arti"):
        client = net.add_node(client_node_config(cls), name=f"client-{cls}")
        relays = [net.add_node(NodeConfig(kist_interval_ms=10, nic_rate_bytes_per_s=5e6), name=f"{cls}-{pos}")
                  for pos in ("guard", "middle", "exit")]
        circuit = net.add_circuit([client, *relays], label=cls)
        transfers[cls] = [net.add_transfer(Transfer(circuit=circuit, request_bytes=1_000_000, response_bytes=498,
                                                    start_s=0.2 + 0.6 * k)) for k in range(4)]
        clients[cls] = client
    sim = Simulation(net, RunConfig(duration_s=3.0, seed=1))
    sim.apply(list(clients.values()), {KIST: interval_ms, KIST_CLIENT: interval_ms})
    sim.advance_to(3.0)
    w, res = sim.window(0.0, 3.0), sim.result()
    return {cls: (sim.node_scheduler(n),
                  tuple(int(w.node_counters[k][n]) for k in ("scheduler_runs", "kernel_writes", "cells_sent")),
                  tuple(float(res.transfer_ttlb_s[t]) for t in transfers[cls]))
            for cls, n in clients.items()}


@pytest.mark.slow
def test_an_arti_client_does_not_react_to_kist_run_intervals_while_a_tor_client_does():
    fast, slow = _two_clients(2), _two_clients(50)
    # tor: KIST every 2 ms -> every 50 ms: 103 -> 45 scheduler runs, uploads 0.47-0.51 s -> 0.61-0.72 s
    (sched2, counts2, ttlb2), (sched50, counts50, ttlb50) = fast["tor"], slow["tor"]
    assert sched2 == sched50 == "kist"
    assert counts2[0] > 2 * counts50[0]
    assert counts2[2] == counts50[2] == 8036  # the same cells, sent in fewer runs
    assert np.mean(ttlb50) > 1.2 * np.mean(ttlb2)
    # Arti: no scheduler run to configure; every counter and every upload time is the same
    assert fast["arti"][0] == slow["arti"][0] == "vanilla"
    assert fast["arti"] == slow["arti"]
    assert fast["arti"][1][2] == 8036 and max(fast["arti"][2]) < 0.6


def test_a_network_hands_arti_clients_only_what_arti_reads(small):
    from kistexp.population.adoption import SwitchSchedule
    from kistexp.sim import RunConfig, Simulation

    sn = build_network(small, duration_s=10, seed=2, interval_ms=10, shares=_with_clients(tor=0.7, arti=0.3),
                       traffic=TrafficModel(bandwidth_scale=0.2))
    arti_node = next(n for n in sn.client_nodes if sn.client_class(n) == "arti")
    tor_node = next(n for n in sn.client_nodes if sn.client_class(n) == "tor")
    relay = sn.relay_nodes[0]
    sim = Simulation(sn.network, RunConfig(duration_s=10, seed=2))
    applied = sn.apply(sim, [relay, arti_node, tor_node], {KIST: 50, KIST_CLIENT: 40, "cc_sendme_inc": 33})
    assert [a.node for a in applied] == [relay, arti_node, tor_node]
    assert sim.node_interval_ms(relay) == 50 and sim.node_interval_ms(tor_node) == 40
    # the Arti client keeps running Vanilla at its built interval; it still takes congestion control
    assert (sim.node_scheduler(arti_node), sim.node_interval_ms(arti_node)) == ("vanilla", 2)
    assert applied[1].values["cc_sendme_inc"] == 33 == applied[2].values["cc_sendme_inc"]
    with pytest.raises(PopulationError, match="TCP_NOTSENT_LOWAT"):
        sn.apply(sim, [arti_node], {"kist-enabled": 1})
    assert sn.apply(sim, [tor_node], {"kist-enabled": 1})[0].node == tor_node  # tor ignores it
    # a switch schedule hands values through the network's apply when given it
    schedule = SwitchSchedule.build({arti_node: 1.0, tor_node: 1.0}, ((KIST_CLIENT, 60),))
    schedule.apply_until(sim, 1.5, apply=sn.apply)
    assert schedule.applied == 2
    assert (sim.node_interval_ms(tor_node), sim.node_interval_ms(arti_node)) == (60, 2)


# --- exposure: the clients a stage's values reach ---------------------------------------------------------


def test_who_reads_what():
    assert client_class_reads("tor", KIST) and not client_class_reads("arti", KIST)
    assert client_class_reads("arti", "kist-enabled") and not client_class_reads("tor", "kist-enabled")
    assert client_class_reads("tor", "cc_alg") and client_class_reads("arti", "cc_alg")
    with pytest.raises(PopulationError, match="unknown client implementation"):
        client_class_reads("rust", KIST)


def test_exposure_leaves_arti_clients_out_of_a_kist_run_interval_stage():
    kist = client_reach([KIST])
    assert kist.reached == (("tor", 0.97),) and kist.missed == (("arti", 0.03),)
    assert kist.share == pytest.approx(0.97)
    lowat = client_reach(["kist-enabled", "kist-tcp-notsent-lowat"])
    assert lowat.reached == (("arti", 0.03),) and lowat.share == pytest.approx(0.03)
    assert client_reach([KIST, "kist-enabled"]).share == pytest.approx(1.0)
    assert client_reach(["cc_alg"]).share == pytest.approx(1.0)
    assert client_reach([KIST], _with_clients(tor=0.8, arti=0.2)).share == pytest.approx(0.8)


def test_a_networks_reached_clients(small):
    sn = build_network(small, duration_s=10, seed=2, interval_ms=10, shares=_with_clients(tor=0.7, arti=0.3),
                       traffic=TrafficModel(bandwidth_scale=0.2))
    everyone = sn.client_nodes + sn.perf_nodes
    arti_nodes = {n for n in everyone if sn.client_class(n) == "arti"}
    assert len(arti_nodes) > 20
    assert set(sn.reached_clients([KIST])) == set(everyone) - arti_nodes
    assert set(sn.reached_clients(["kist-enabled"])) == arti_nodes
    assert sn.reached_clients(["cc_alg"]) == everyone
    with pytest.raises(PopulationError, match="not a client"):
        sn.client_class(sn.relay_nodes[0])


def test_consensus_exposure_counts_only_the_clients_the_values_reach():
    from kistexp.rollout.exposure import ConsensusExposureProbe
    from kistexp.rollout.spec import Cadence

    va = dt.datetime(2030, 1, 7, 12, tzinfo=UTC)
    at = va + dt.timedelta(hours=4)
    consensus = (va, {KIST: 2, "kist-enabled": 1}, ())
    probe = ConsensusExposureProbe(lambda t: consensus, Cadence(3600, 300, 300),
                                   client_shares=_with_clients(tor=0.8, arti=0.2))
    relays, clients = probe.measure(1, {KIST: 2}, va, at)
    # four hours on, propagation has (nearly) every node holding the consensus; of the clients only the
    # 80 % running C tor read KISTSchedRunInterval
    assert relays.observed_share > 0.99
    assert clients.expected_share == pytest.approx(0.8 * relays.expected_share, abs=0.01)
    assert clients.observed_share == pytest.approx(clients.expected_share)
    assert not clients.short and "arti 20% ignore them" in clients.detail
    _, arti_only = probe.measure(1, {"kist-enabled": 1}, va, at)
    assert arti_only.observed_share == pytest.approx(0.2 * relays.expected_share, abs=0.01)
    # the bundled shares by default: Arti clients are 3 %
    _, bundled = ConsensusExposureProbe(lambda t: consensus, Cadence(3600, 300, 300)).measure(1, {KIST: 2}, va, at)
    assert bundled.observed_share == pytest.approx(0.97 * relays.expected_share, abs=0.01)


# --- the command -------------------------------------------------------------------------------------------


def test_summary_shows_client_classes_and_a_stages_reach(consensus_path):
    runner = CliRunner()
    out = runner.invoke(app, ["population", "summary", str(consensus_path), "--scale", "0.01",
                              "--values", "KISTSchedRunInterval=2"])
    assert out.exit_code == 0, out.output
    assert "tor 97.00 %  arti 3.00 %" in out.output
    assert "KISTSchedRunInterval=2 reaches 97.00 % of clients (tor); misses arti 3.00 %" in out.output
    js = runner.invoke(app, ["population", "summary", str(consensus_path), "--scale", "0.01", "--json",
                             "--values", "kist-enabled=5", "--values", "kist-tcp-notsent-lowat=0"])
    assert js.exit_code == 0, js.output
    data = json.loads(js.output)
    assert data["client_classes"] == [["tor", 0.97], ["arti", 0.03]]
    assert data["stage"]["reach"]["share"] == pytest.approx(0.03)
    assert data["stage"]["arti"] == {"enabled": True, "tcp_notsent_lowat": 1,
                                     "clamped": ["kist-enabled", "kist-tcp-notsent-lowat"]}
    plain = runner.invoke(app, ["population", "summary", str(consensus_path), "--scale", "0.01", "--json"])
    assert "stage" not in json.loads(plain.output)
    for bad, message in (("KIST=2", "unknown consensus parameter 'KIST'"), ("kist-enabled", "expected NAME=VALUE"),
                         ("kist-enabled=on", "not an integer")):
        wrong = runner.invoke(app, ["population", "summary", str(consensus_path), "--values", bad])
        assert wrong.exit_code == 1 and message in str(wrong.exception)
