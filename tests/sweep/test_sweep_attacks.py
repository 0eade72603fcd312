"""Attack measures in sweeps (issue 37): each cell's measures beside unchanged figures, the cache's check
of them, the tidy table's rows, the bands of attacks.csv and the plots' panels."""

from __future__ import annotations

import attrs
import pytest

from kistexp.population import attacks
from kistexp.population import predict as P
from kistexp.population.classes import load_class_shares
from kistexp.population.relays import load_population
from kistexp.population.sampling import sample
from kistexp.sweep import results
from kistexp.sweep.cache import check_result
from kistexp.sweep.cells import CellResult
from kistexp.sweep.spec import parse_sweep

SWEEP = """
name = "attacks"
duration = "12s"

[values]
KISTSchedRunInterval = [2, 10]

[population]
scale = 0.005
samples = [1, 2, 3]
"""


def test_a_values_run_measures_attacks_and_keeps_its_figures(consensus_path, monkeypatch):
    pop = sample(load_population(consensus_path), 0.005, 1)
    kw = dict(load=0.4, loss_rate=0.0, shares=load_class_shares(), seed=3, duration_s=12.0, scale=0.005)
    run = P.simulate_values(pop, {"KISTSchedRunInterval": 2}, **kw)
    measured = dict(run.attacks)
    # [2, 12) s traced: two 4-s flow segments, latency leakage, exit gaps; no probes, no baseline
    assert {"attack_flow_auc", "attack_flow_tpr_at_fpr_0.01", "attack_mi_region_rtt_bits",
            "attack_rtt_cv"} <= set(measured)
    assert not any("fingerprint" in k or "ks_distance" in k for k in measured)
    assert 0.5 < measured["attack_flow_auc"] <= 1.0 and run.attack_cpu_s > 0
    monkeypatch.setattr(attacks, "trace_window", lambda start_s, end_s: (0.0, 0.0))
    plain = P.simulate_values(pop, {"KISTSchedRunInterval": 2}, **kw)
    assert plain.attacks == () and plain.figures == run.figures  # the trace moves no figure


def _doc(**over) -> dict:
    doc = {"key": "k", "figures": [["client_ttfb_s", "", 0.3, 0.9]], "relays": 30, "clients": 40,
           "bandwidth_scale": 0.2, "achieved_utilisation": 0.3, "wall_s": 2.0, "host": "h:1",
           "attacks": [["attack_flow_auc", 0.93], ["attack_rtt_cv", 0.31]]}
    doc.update(over)
    return doc


def test_the_cache_checks_attack_measures():
    ok = check_result(_doc(), "k")
    assert isinstance(ok, CellResult) and ok.attacks == (("attack_flow_auc", 0.93), ("attack_rtt_cv", 0.31))
    no_attacks = _doc()
    del no_attacks["attacks"]
    assert check_result(no_attacks, "k").attacks == ()
    assert check_result(_doc(attacks=[["client_ttfb_s", 1.0]]), "k") == \
        "attacks[0] names no catalogued attack measure"
    assert check_result(_doc(attacks=[["attack_rtt_cv", float("nan")]]), "k") == "attacks[0] value is nan"
    assert check_result(_doc(attacks=[["attack_rtt_cv", 1.0], ["attack_rtt_cv", 2.0]]), "k") == \
        "attacks name a measure twice"
    assert check_result(_doc(attacks=[["attack_rtt_cv"]]), "k") == "attacks[0] is not [measure, value]"


@attrs.frozen
class _Task:
    key: str
    network: int
    sample_seed: int
    seed: int
    load: float
    loss_rate: float
    class_mix: str
    values: tuple


@attrs.frozen
class _Outcome:
    task: _Task
    result: CellResult


def test_tidy_rows_bands_and_plots_include_the_measures(tmp_path):
    s = parse_sweep(SWEEP)
    # flow AUC per (value, network): 2 ms leaks more on every network
    auc = {2: (0.95, 0.96, 0.97), 10: (0.90, 0.91, 0.92)}
    outcomes = []
    for v, per_net in auc.items():
        for n, a in enumerate(per_net):
            result = check_result(_doc(key=f"k{v}{n}", attacks=[["attack_flow_auc", a]]), f"k{v}{n}")
            outcomes.append(_Outcome(_Task(f"k{v}{n}", n, n + 1, 1, 0.4, 0.0, "bundled",
                                           (("KISTSchedRunInterval", v),)), result))
    rows = results.tidy_rows(s, outcomes)
    measured = [r for r in rows if r["metric"] == "attack_flow_auc"]
    assert len(measured) == 6 and {r["statistic"] for r in measured} == {"value"}
    assert {r["relay_class"] for r in measured} == {""}
    bands = results.attack_bands(s, rows)
    assert [(b.values, b.networks) for b in bands] == [((("KISTSchedRunInterval", 2),), 3),
                                                        ((("KISTSchedRunInterval", 10),), 3)]
    assert bands[0].median == pytest.approx(0.96) and bands[1].median == pytest.approx(0.91)
    assert bands[0].low == pytest.approx(0.9505) and bands[0].high == pytest.approx(0.9695)
    row = bands[0].row()
    assert list(row) == results.attack_columns(s)
    assert row["leakier_when"] == "higher" and row["unit"] == "ratio"
    # one panel per measured attack measure, titled with the direction that is leakier
    [(axis, fig)] = results.figures(s, rows)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert axis.name == "KISTSchedRunInterval"
    assert "flow correlation AUC (higher: leakier)" in titles
