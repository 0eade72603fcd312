"""Population from the shared consensus: the oracles of population.md §1.8, §2.3, §4.3 with numbers."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import PopulationError
from kistexp.population import bwweights, kernels, latency
from kistexp.population.classes import RelayClass, assign_classes, load_class_shares, load_profiles, tick_shares
from kistexp.population.geoip import load_geoip, parse_geoip
from kistexp.population.paths import pick_paths, position_probabilities
from kistexp.population.policy import parse_policy_summary
from kistexp.population.relays import load_population
from kistexp.population.sampling import client_budget, eligible, sample, tornet_class_shares


@pytest.fixture(scope="module")
def pop(consensus_path):
    return load_population(consensus_path)


def _class_share(pop, p, cls):
    return float(p[pop.classes == cls].sum())


# --- §1.1 / §1.4: relays, classes, weights -----------------------------------------------------------

def test_relays_flags_and_classes(pop):
    assert len(pop) == 6088
    flags = Counter(f for r in pop.relays for f in r.flags)
    assert (flags["Fast"], flags["Stable"], flags["Guard"], flags["Exit"], flags["V2Dir"], flags["BadExit"]) == \
        (5716, 4752, 3020, 1438, 5675, 11)
    assert Counter(pop.classes.tolist()) == {"D": 994, "G": 2026, "E": 434, "M": 2634}
    totals = pop.class_totals()
    assert sum(totals.values()) == 94_115_156
    shares = {c: 100 * v / 94_115_156 for c, v in totals.items()}
    assert shares == pytest.approx({"D": 21.89, "G": 36.60, "E": 7.76, "M": 33.75}, abs=0.01)
    unmeasured = sorted(r.bandwidth for r in pop.relays if r.unmeasured)
    assert unmeasured == [0, 0] + [20] * 7
    v047 = sum(r.version.startswith("0.4.7.") for r in pop.relays) / len(pop)
    assert v047 == pytest.approx(0.8421, abs=0.0001)
    assert all(r.capacity >= 102_400 for r in pop.relays)


def test_footer_weights_and_recomputation_agree(pop):
    assert (pop.weights.get("Wgg"), pop.weights.get("Wmg"), pop.weights.get("Wgd"), pop.weights.get("Wee")) == \
        (9611, 389, 0, 10000)
    again = bwweights.compute_weights(pop.class_totals())
    assert again.case == "Case 3a (E scarce)"
    for key in ("Wgg", "Wgd", "Wmg", "Wmm", "Wme", "Wmd", "Wee", "Wed", "Weg", "Wem", "Wgm"):
        assert again.get(key) == pop.weights.get(key), key


@pytest.mark.parametrize("totals, case", [
    ({"G": 40, "M": 20, "E": 35, "D": 5}, "Case 1"),
    ({"G": 30, "M": 60, "E": 5, "D": 5}, "Case 2a (E scarce)"),
    ({"G": 30, "M": 30, "E": 25, "D": 15}, "Case 2b"),
    ({"G": 10, "M": 30, "E": 50, "D": 10}, "Case 3a (G scarce)"),
    ({"G": 20, "M": 20, "E": 40, "D": 20}, "Case 3bg (G scarce)"),
    ({"G": 45, "M": 15, "E": 20, "D": 20}, "Case 3be (E scarce)"),
])
def test_weight_cases_balance_the_positions(totals, case):
    w = bwweights.compute_weights({k: v * 10**6 for k, v in totals.items()})
    assert w.case.startswith(case)
    g = w.get
    assert g("Wgg") + g("Wmg") == pytest.approx(10000, abs=3)
    assert g("Wee") + g("Wme") == pytest.approx(10000, abs=3)
    assert g("Wgd") + g("Wmd") + g("Wed") == pytest.approx(10000, abs=3)
    assert all(0 <= v <= 10000 for _, v in w.values)


def test_weights_need_the_footer(tmp_path, consensus_path):
    text = consensus_path.read_text()
    no_weights = "".join(line for line in text.splitlines(True) if not line.startswith("bandwidth-weights"))
    path = tmp_path / "consensus"
    path.write_text(no_weights)
    with pytest.raises(PopulationError, match=r"consensus: no bandwidth-weights line"):
        load_population(path)


def test_bad_files_are_one_line_errors(tmp_path, consensus_path):
    trunc = tmp_path / "truncated"
    trunc.write_bytes(consensus_path.read_bytes()[:300_000])
    with pytest.raises(PopulationError, match="truncated"):
        load_population(trunc)
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(PopulationError, match="notes.txt"):
        load_population(other)


def test_microdesc_flavour_same_relays(pop, microdesc_consensus_path):
    md = load_population(microdesc_consensus_path)
    assert len(md) == len(pop) and md.weights.get("Wmg") == 389
    assert Counter(md.classes.tolist()) == Counter(pop.classes.tolist())
    # no p lines: Exit-flag relays are taken to accept 80 and 443, the rest to reject all
    exit_p = position_probabilities(md, "exit", 443)
    assert (exit_p > 0).sum() == sum("Exit" in r.flags and "BadExit" not in r.flags and "Fast" in r.flags
                                     for r in md.relays)


def test_policy_summary_rules():
    accept = parse_policy_summary("accept 80,443,8000-8100")
    assert accept.allows(443) and accept.allows(8050) and not accept.allows(22)
    reject = parse_policy_summary("reject 25,119,135-139")
    assert reject.allows(443) and not reject.allows(137)
    assert parse_policy_summary("reject 1-65535").rejects_all
    with pytest.raises(PopulationError, match="port range"):
        parse_policy_summary("accept 0-80")


# --- §1.8 oracle table: candidates, class shares, max relay, 1/Σp² -----------------------------------

ORACLE = [
    # position, port, candidates(w>0), D, E, G, M (%), max relay %, 1/Σp²
    ("exit", 443, 1409, 73.65, 26.10, 0.06, 0.20, 0.64, 728),
    ("exit", 80, 1409, 73.70, 26.12, 0.03, 0.15, 0.64, 728),
    ("exit", 22, 296, 85.98, 14.02, 0.0, 0.0, 3.20, 135),
    ("exit", 6667, 605, 82.23, 17.07, 0.40, 0.30, 1.44, 300),
    ("middle", 443, 4311, 0.0, 0.0, 4.05, 95.95, 0.57, 655),
    ("middle", 22, 3254, 0.0, 0.0, 10.42, 89.58, 0.93, 318),
    ("guard", 443, 2026, 0.0, 0.0, 100.0, 0.0, 0.38, 1021),
]


@pytest.mark.parametrize("position, port, n, d, e, g, m, top, eff", ORACLE)
def test_selection_probabilities_match_the_oracle(pop, position, port, n, d, e, g, m, top, eff):
    p = position_probabilities(pop, position, port)
    assert (p > 0).sum() == n
    got = [100 * _class_share(pop, p, c) for c in "DEGM"]
    assert got == pytest.approx([d, e, g, m], abs=0.01)
    assert 100 * p.max() == pytest.approx(top, abs=0.01)
    assert 1 / (p**2).sum() == pytest.approx(eff, abs=1)


def test_bytes_per_class_over_three_hops(pop):
    """Equal bytes per hop: D 24.55 %, E 8.70 %, G 34.70 %, M 32.05 % of relayed bytes (§1.8)."""
    total = sum(position_probabilities(pop, pos, 443) for pos in ("guard", "middle", "exit")) / 3
    assert [100 * _class_share(pop, total, c) for c in "DEGM"] == pytest.approx([24.55, 8.70, 34.70, 32.05],
                                                                              abs=0.01)


def test_four_non_exit_flag_relays_can_exit_443(pop):
    p = position_probabilities(pop, "exit", 443)
    no_flag = [i for i in np.flatnonzero(p > 0) if "Exit" not in pop.relays[i].flags]
    assert len(no_flag) == 4
    assert 100 * p[no_flag].sum() == pytest.approx(0.25, abs=0.01)


# --- drawn paths against the formulas ------------------------------------------------------------------

@pytest.fixture(scope="module")
def drawn(pop):
    return pick_paths(pop, 200_000, port=443, seed=11)


def test_drawn_class_shares_reproduce_73_65_and_4_05(drawn):
    n = len(drawn)
    for position, cls, expected in (("exit", "D", 0.7365), ("middle", "G", 0.0405), ("guard", "G", 1.0)):
        got = drawn.class_shares(position)[cls]
        sigma = np.sqrt(expected * (1 - expected) / n)
        assert abs(got - expected) <= 4 * sigma + 1e-12, (position, got)


def test_drawn_exit_frequencies_per_relay(pop, drawn):
    """The exit is drawn first, with no exclusions: per-relay counts follow P(r) (chi-square, 5 sigma)."""
    p = position_probabilities(pop, "exit", 443)
    counts = drawn.counts("exit")
    expected = p * len(drawn)
    big = expected >= 20
    chi2 = float((((counts[big] - expected[big]) ** 2) / expected[big]).sum())
    dof = int(big.sum()) - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof)
    assert counts[p == 0].sum() == 0


def test_no_two_hops_share_a_subnet(pop, drawn):
    s16 = pop.subnet16
    for a, b in (("guard", "middle"), ("guard", "exit"), ("middle", "exit")):
        x, y = getattr(drawn, a), getattr(drawn, b)
        assert not np.any(x == y)
        assert not np.any(s16[x] == s16[y])
    six = pop.subnet6
    x, y = drawn.middle, drawn.exit
    assert not np.any((six[x] == six[y]) & (six[x] >= 0))


def test_clients_keep_their_guards(pop):
    paths = pick_paths(pop, 20_000, seed=3, circuits_per_client=50)
    per_client = {}
    for c, g in zip(paths.client.tolist(), paths.guard.tolist(), strict=True):
        per_client.setdefault(c, set()).add(g)
    # the shared consensus sets guard-n-primary-guards-to-use=2: at most 2 guards, plus a third primary
    # only when one of the first two shares the exit's /16
    assert max(len(v) for v in per_client.values()) <= 3
    assert np.mean([len(v) for v in per_client.values()]) < 2.2
    assert len(set(paths.guard.tolist())) < 400 * 3


def test_long_lived_port_needs_stable_exits_and_middles(pop):
    paths = pick_paths(pop, 5_000, port=22, seed=5)
    stable = pop.has_flag("Stable")
    assert stable[paths.exit].all() and stable[paths.middle].all()


# --- §2.3 sampling -------------------------------------------------------------------------------------

def test_full_network_tornettools_classes(pop):
    assert len(eligible(pop)) == 6075
    shares = tornet_class_shares(pop)
    assert shares == pytest.approx({"g": 0.364, "e": 0.078, "ge": 0.219, "m": 0.339}, abs=0.0005)


@pytest.mark.parametrize("scale, n, max_err", [(0.01, 61, 0.004), (0.05, 304, 0.003), (0.1, 608, 0.002),
                                               (0.3, 1823, 0.0065)])
def test_median_sampling_reproduces_tornettools(pop, scale, n, max_err):
    full = tornet_class_shares(pop)
    s = sample(pop, scale, method="median")
    assert len(s) == n
    got = tornet_class_shares(s, guard_rule=False)
    assert max(abs(got[k] - full[k]) for k in full) <= max_err
    assert s.weights.case == "Case 3a (E scarce)" and 225 <= s.weights.get("Wmg") <= 393
    if scale == 0.01:
        assert Counter(k for _, k in eligible(s, guard_rule=False)) == {"g": 19, "e": 5, "ge": 10, "m": 27}


def test_seeded_samples_differ_but_keep_the_distribution(pop):
    full = tornet_class_shares(pop)
    nets = [sample(pop, 0.1, seed) for seed in (1, 2, 3)]
    assert len({frozenset(r.fingerprint for r in s.relays) for s in nets}) == 3
    assert sample(pop, 0.1, 1).relays == nets[0].relays  # same seed, same network
    for s in nets:
        assert len(s) == 608
        got = tornet_class_shares(s, guard_rule=False)
        assert max(abs(got[k] - full[k]) for k in full) <= 0.006
        # weight quantiles stay close to the full network's (per-position weight distribution kept)
        for cls in "DGEM":
            a = np.sort(pop.bandwidth[pop.classes == cls])
            b = np.sort(s.bandwidth[s.classes == cls])
            for q in (0.25, 0.5, 0.75):
                assert np.quantile(b, q) == pytest.approx(np.quantile(a, q), rel=0.35, abs=100)


@pytest.mark.parametrize("scale", [0, -0.5, 1.01, 2])
def test_bad_scale(pop, scale):
    with pytest.raises(PopulationError, match=r"scale .* must be in \(0, 1\]"):
        sample(pop, scale, 1)


def test_clients_scale_with_the_network():
    b = client_budget(0.1)
    assert b.users == 75_234
    assert b.circuits_per_user_per_10min == pytest.approx(1.98, abs=0.005)
    assert client_budget(0.2, load_scale=1.5).circuits_per_10min == pytest.approx(3 * b.circuits_per_10min)


# --- §4 GeoIP and latency ------------------------------------------------------------------------------

def test_geoip_ranges_are_inclusive():
    g = parse_geoip("# comment\n16777216,16777471,AU\n16777472,16778239,CN\n16779264,16781311,CN\n", "test")
    assert g.lookup("1.0.0.0") == "AU" and g.lookup("1.0.0.255") == "AU"  # last address of the range
    assert g.lookup("1.0.1.0") == "CN"
    assert g.lookup("1.0.4.0") == "??"  # a gap between ranges
    assert g.lookup("0.255.255.255") == "??"
    with pytest.raises(PopulationError, match=r"test: line 2: expected LOW,HIGH,CC"):
        parse_geoip("1,2,US\nfoo\n", "test")
    with pytest.raises(PopulationError, match="overlaps"):
        parse_geoip("1,20,US\n10,30,DE\n", "test")


def test_relays_by_country(pop):
    g = load_geoip()
    countries = Counter(g.lookup_many([r.address for r in pop.relays]))
    assert (countries["DE"], countries["US"], countries["NL"], countries["FR"], countries["??"]) == \
        (1619, 1132, 352, 307, 5)
    assert len(countries) == 82


def test_missing_geoip_is_named(tmp_path):
    with pytest.raises(PopulationError, match=r"geoip: cannot read GeoIP file: no such file"):
        load_geoip(tmp_path / "geoip")


def test_latency_model():
    london, new_york = (51.5074, -0.1278), (40.7128, -74.0060)
    d = latency.great_circle_km(london, new_york)
    assert d == pytest.approx(5570, abs=10)
    model = latency.LatencyModel()
    assert 2 * model.one_way_ms(d, 0.0) == pytest.approx(72.4, abs=0.5)  # 1.3 stretch beyond 2,000 km
    # same country: 300 km at stretch 2.1 - 0.8 * 300/2000 = 1.98
    assert 2 * model.one_way_ms(0.0, 0.0) == pytest.approx(2 * 1.98 * 300 / 200)
    # unknown countries and pseudo-codes fall back to the default country
    assert latency.centroid("EU") == latency.centroid(latency.DEFAULT_COUNTRY)
    assert latency.rtt_ms("DE", "US") > latency.rtt_ms("DE", "NL") > 0
    rtt = latency.rtt_matrix_ms(["DE", "US", "DE"], [False, False, True])
    assert rtt[0, 1] == pytest.approx(latency.rtt_ms("DE", "US"))
    assert rtt[0, 2] - rtt[0, 0] == pytest.approx(2 * (latency.CLIENT_ACCESS_MS - latency.RELAY_ACCESS_MS))


# --- §3 relay classes ----------------------------------------------------------------------------------

def test_bundled_profiles_carry_the_bench_figures():
    p = load_profiles()
    assert [p[n].ntor_server_us for n in ("xeon-d2123it-skylake", "xeon-d2123it-skylake-avx512",
                                          "xeon-d2123it-freebsd-ktls")] == [316.1, 310.3, 227.8]
    assert p["xeon-d2123it-freebsd-ktls"].ntor_server_fast_us == 176.3
    assert p["xeon-d2123it-skylake"].kist_socket_info_us == 1.08


def test_tick_quantises_the_run_interval():
    """kist-ewma.md §5.2: J = 4 ms: 10 -> 12 ms, 2, 3 and 5 -> 4 ms (measured 12.08 and 3.98 ms)."""
    run = kernels.effective_interval_ms
    assert run(2, 250) == run(3, 250) == run(5, 250) == 4.0 and run(6, 250) == 8.0 and run(10, 250) == 12.0
    assert run(2, 1000) == 1.0 and run(3, 1000) == 2.0
    assert run(4, 300) == pytest.approx(10 / 3) and run(5, 300) == pytest.approx(20 / 3)
    assert run(11, 100) == 10.0 and run(12, 100) == 20.0
    assert run(1, 250) == 0.0  # no timer: back-to-back runs
    shares = tick_shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert kernels.alike_share(2, 3, shares) == pytest.approx(1 - shares[1000])


def test_class_run_interval_uses_version_clamp_and_torrc():
    old = RelayClass("linux", 250, "0.4.7.10", "xeon-d2123it-skylake")
    new = RelayClass("linux", 1000, "0.4.8.9", "xeon-d2123it-skylake")
    assert old.run_interval_ms(None) == 12.0  # compiled default 10 ms, three 4 ms ticks
    assert old.run_interval_ms(2) == 4.0
    assert new.run_interval_ms(None) == 1.0 and new.run_interval_ms(1) == 1.0  # clamped to 2: 2 - 1 ms
    assert RelayClass("linux", 1000, "0.4.8.9", "x", torrc_interval=7).run_interval_ms(2) == 6.0
    assert RelayClass("bsd", 100, "0.4.8.9", "x").scheduler == "KISTLite"


def test_class_assignment_follows_the_shares():
    classes = assign_classes(["0.4.8.9"] * 20_000, seed=4)
    os_share = Counter(c.os for c in classes)
    assert os_share["linux"] / 20_000 == pytest.approx(0.93, abs=0.01)
    linux_hz = Counter(c.hz for c in classes if c.os == "linux")
    assert linux_hz[250] / sum(linux_hz.values()) == pytest.approx(0.80, abs=0.015)
    assert all(c.hardware == "xeon-d2123it-freebsd-ktls" for c in classes if c.os == "bsd")
    assert assign_classes(["0.4.8.9"] * 50, seed=4) == assign_classes(["0.4.8.9"] * 50, seed=4)
    assert assign_classes(["0.4.8.9"] * 50, seed=4) != assign_classes(["0.4.8.9"] * 50, seed=5)


BAD_CLASSES = [
    ("[os]\nlinux = 0.9\nbsd = 0.05\n", r"os: shares sum to 0.95, not 1"),
    ("[os]\nlinux = 1.0\n[hz.linux]\n250 = 1.0\n[hardware.linux]\nxeon-d2123it-skylake = 1.0\n[gpu]\nx = 1\n",
     r"gpu: unknown key"),
    ("[os]\nlinux = 1.0\n[hz.linux]\n250 = 1.0\n[hardware.linux]\nxeon-d2123it-skylake = 1.0\n"
     "[torrc]\noverride_shares = 0.1\n", r"torrc.override_shares: unknown key"),
    ("[os]\nlinux = 1.2\nbsd = -0.2\n", r"os.bsd: must not be negative"),
    ("[os]\nlinux = 1.0\n[hz.linux]\n250 = 1.0\n[hardware.linux]\nfast-box = 1.0\n",
     r"hardware.linux.fast-box: no such"),
    ("[os]\nlinux = 1.0\n", r"hz.linux: missing"),
    ("[os\n", r"not valid TOML"),
]


@pytest.mark.parametrize("text, message", BAD_CLASSES)
def test_bad_class_toml(tmp_path, text, message):
    path = tmp_path / "classes.toml"
    path.write_text(text)
    with pytest.raises(PopulationError, match=message) as info:
        load_class_shares(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_profile_toml(tmp_path):
    from kistexp.population.classes import DEFAULT_PROFILES

    good = DEFAULT_PROFILES.read_text()
    for old, new, message in (("ntor_server_us = 316.1", "ntor_server_us = -1.0", "ntor_server_us: must not be"),
                              ("cores = 4", "cores = 4\nturbo = 1", r"turbo: unknown key"),
                              ("ed25519_verify_us = 87.3\n", "", r"ed25519_verify_us: missing")):
        path = tmp_path / f"p{len(message)}.toml"
        path.write_text(good.replace(old, new, 1))
        with pytest.raises(PopulationError, match=message):
            load_profiles(path)


# --- CLI -----------------------------------------------------------------------------------------------

def test_cli_paths_json(consensus_path):
    result = CliRunner().invoke(app, ["population", "paths", str(consensus_path), "--circuits", "20000",
                                      "--seed", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["circuits"] == 20000
    assert data["class_shares"]["exit"]["D"] == pytest.approx(0.7365, abs=0.015)
    assert sum(r["exit"] for r in data["relays"]) == pytest.approx(1.0)
    assert {"fingerprint", "nickname", "class", "guard", "middle", "exit"} <= set(data["relays"][0])


def test_cli_summary_table_and_json(consensus_path):
    runner = CliRunner()
    result = runner.invoke(app, ["population", "summary", str(consensus_path), "--scale", "0.05", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["relays"] == 304
    assert {c["key"] for c in data["position_classes"]} == {"D", "G", "E", "M"}
    assert data["countries"][0]["key"] == "DE"
    table = runner.invoke(app, ["population", "summary", str(consensus_path)])
    assert table.exit_code == 0 and "6088 relays" in table.output and "KISTLite" in table.output


@pytest.mark.slow
def test_cli_errors_exit_1_with_one_line(tmp_path, consensus_path):
    import subprocess
    import sys

    bad = tmp_path / "classes.toml"
    bad.write_text("[os]\nlinux = 0.5\n")
    for args, message in ((["summary", str(consensus_path), "--scale", "0"], "scale 0.0 must be in (0, 1]"),
                          (["summary", str(consensus_path), "--classes", str(bad)], "shares sum to 0.5"),
                          (["paths", str(tmp_path / "nothing")], "cannot read")):
        proc = subprocess.run([sys.executable, "-m", "kistexp", "population", *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1
        assert proc.stderr.startswith("kistexp: error: ") and message in proc.stderr
        assert proc.stderr.count("\n") == 1
