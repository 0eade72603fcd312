"""Fidelity harness plumbing without tor: case parsing, the simulator adapter, the report
and the CLI (issue 4 point 7)."""

from __future__ import annotations

import json
import sys
import types

import pytest
from typer.testing import CliRunner

import kistexp.fidelity as fidelity
from kistexp.cli import app
from kistexp.errors import SimConfigError
from kistexp.fidelity import Case, RealSide, Row, SimSide, parse_cases, run_fidelity, simulate
from kistexp.localnet.schedlog import RunStats


def test_parse_cases() -> None:
    cases = parse_cases("circuit,ceiling", "kist,vanilla", "2,10ms")
    assert len(cases) == 8
    assert cases[0] == Case("circuit", "kist", 2) and cases[-1] == Case("ceiling", "vanilla", 10)
    assert cases[0].label == "circuit/kist/2ms"
    with pytest.raises(SimConfigError, match="unknown scenario 'ewma'"):
        parse_cases("ewma", "kist", "2")
    with pytest.raises(SimConfigError, match="unknown scheduler 'fifo'"):
        parse_cases("circuit", "fifo", "2")
    with pytest.raises(SimConfigError, match="'0' is not a KISTSchedRunInterval"):
        parse_cases("circuit", "kist", "0")
    with pytest.raises(SimConfigError, match="--intervals: empty list"):
        parse_cases("circuit", "kist", " , ")


@pytest.fixture
def fake_experiments(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Stand-in for kistexp.sim.experiments with the declared signature; records its calls."""
    calls: list[dict] = []
    mod = types.ModuleType("kistexp.sim.experiments")

    def circuit(scheduler: str, interval_ms: int, client_interval_ms: int, seed: int, transfer_bytes: int) -> dict:
        calls.append(dict(scenario="circuit", scheduler=scheduler, interval_ms=interval_ms,
                          client_interval_ms=client_interval_ms, seed=seed, transfer_bytes=transfer_bytes))
        return {"throughput_mbytes_per_s": 30.0 / interval_ms + seed / 100}

    def ceiling_path(scheduler: str, interval_ms: int, circuits: int, seed: int,
                     transfer_bytes: int) -> types.SimpleNamespace:
        calls.append(dict(scenario="ceiling", circuits=circuits, seed=seed, transfer_bytes=transfer_bytes))
        return types.SimpleNamespace(throughput_mbytes_per_s=32896 / (interval_ms + 2) / 1000, run_period_ms=12.0)

    def ceiling(**kwargs: object) -> None:
        raise AssertionError("the single-relay ceiling is not the real scenario's counterpart")

    mod.circuit, mod.ceiling_path, mod.ceiling = circuit, ceiling_path, ceiling
    monkeypatch.setitem(sys.modules, "kistexp.sim.experiments", mod)
    import kistexp.sim

    monkeypatch.setattr(kistexp.sim, "experiments", mod, raising=False)
    return calls


def test_simulator_adapter_passes_declared_arguments(fake_experiments: list[dict]) -> None:
    side = simulate(Case("circuit", "kist", 10), seed=2, size_bytes=5_000_000)
    assert side.throughputs_mbytes_per_s == (3.02,)
    assert fake_experiments[-1] == dict(scenario="circuit", scheduler="kist", interval_ms=10,
                                        client_interval_ms=10, seed=2, transfer_bytes=5_000_000)
    side = simulate(Case("ceiling", "kistlite", 10), seed=1, size_bytes=8_000_000)
    assert fake_experiments[-1] == dict(scenario="ceiling", circuits=8, seed=1, transfer_bytes=8_000_000)
    assert side.run_period_ms == 12.0 and side.mean_mbytes_per_s == pytest.approx(2.741, abs=1e-3)


def test_real_side_skipped_cleanly_without_tor(fake_experiments: list[dict], monkeypatch) -> None:
    monkeypatch.setattr(fidelity, "have_tor", lambda: False)
    report = run_fidelity(parse_cases("circuit", "kist", "2,10"), repetitions=3, size_mb=1)
    assert "tor and tor-gencert are not installed" in report.real_skipped
    assert [r.real for r in report.rows] == [None, None]
    assert [r.sim.throughputs_mbytes_per_s for r in report.rows] == [(15.01, 15.02, 15.03), (3.01, 3.02, 3.03)]
    assert [c["seed"] for c in fake_experiments] == [1, 2, 3, 1, 2, 3]
    assert all(r.ratio is None for r in report.rows)


def test_ratio_and_cpu_bound_note() -> None:
    stats = RunStats(100, 8, 90, 12.0, 12.1, 64, 63.5, 5760)
    real = RealSide((2.0, 3.0), cpu_busiest_fraction=0.2, run_period=stats)
    row = Row(Case("ceiling", "kistlite", 10), real, SimSide((2.25, 2.75)))
    assert row.ratio == pytest.approx(1.0)
    out = row.as_json()
    assert out["real_mean_mbytes_per_s"] == 2.5 and out["real_run_period_ms_median"] == 12.0
    assert out["real_cells_per_run_median"] == 64 and out["sim_over_real"] == pytest.approx(1.0)
    assert not real.cpu_bound and RealSide((30.0,), 0.97, None).cpu_bound


def test_bad_run_settings() -> None:
    with pytest.raises(SimConfigError, match="--repetitions must be >= 1"):
        run_fidelity(parse_cases("circuit", "kist", "2"), repetitions=0, real=False, sim=False)
    with pytest.raises(SimConfigError, match="--size-mb"):
        run_fidelity(parse_cases("circuit", "kist", "2"), size_mb=0, real=False, sim=False)


def test_cli_json_without_real_side(fake_experiments: list[dict]) -> None:
    result = CliRunner().invoke(app, ["fidelity", "--scenarios", "ceiling", "--schedulers", "kistlite",
                                      "--intervals", "10", "--repetitions", "2", "--no-real", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["real_skipped"] == "real tor not requested"
    (row,) = data["rows"]
    assert row["scenario"] == "ceiling" and row["sim_mean_mbytes_per_s"] == pytest.approx(2.741, abs=1e-3)
    assert row["real_mean_mbytes_per_s"] is None and row["sim_run_period_ms"] == 12.0
    human = CliRunner().invoke(app, ["fidelity", "--scenarios", "circuit", "--no-real", "--repetitions", "1"])
    assert human.exit_code == 0 and "real tor not requested" in human.output


def test_simulator_side_runs_kistexp_sim() -> None:
    pytest.importorskip("kistexp.sim.experiments")
    side = simulate(Case("ceiling", "kistlite", 10), seed=1, size_bytes=8_000_000)
    # kist-ewma.md §12: 64 cells of 514 B per 12 ms period (4 ms kernel tick) = 2.74 MB/s on the
    # channel the 8 circuits share; payload is 498 of 514 B and the start-up is included
    assert side.cells_per_run_median == 64
    assert side.run_period_ms == pytest.approx(12.0, abs=0.5)
    assert 0.8 * 2.74 < side.mean_mbytes_per_s < 2.74
    side = simulate(Case("circuit", "kist", 10), seed=1, size_bytes=2_000_000)
    assert side.run_period_ms == pytest.approx(12.0, abs=0.5) and side.cells_per_run_median > 0


def test_target_and_ordering_checks() -> None:
    from kistexp.fidelity import Report

    def row(scenario: str, sched: str, iv: int, real: tuple[float, ...], sim: float) -> Row:
        return Row(Case(scenario, sched, iv), RealSide(real, 0.2, None), SimSide((sim,)))

    rows = (
        row("circuit", "kist", 10, (3.0, 3.2, 3.4), 2.3),     # 0.72: outside 25 %
        row("circuit", "kist", 2, (8.0, 9.0, 10.0), 8.5),     # 0.94
        row("circuit", "kist", 5, (6.5, 7.0, 7.5), 10.6),     # real 5 < real 2, sim the other way
        row("circuit", "kistlite", 2, (7.2, 7.6, 8.0), 7.9),  # overlaps kist 2 and 5 ms: no order asked
        row("ceiling", "kist", 10, (1.0, 1.1, 1.2), 1.0),     # other scenario: never compared
    )
    report = Report(rows, 3, 20.0)
    assert [r.within_target for r in rows] == [False, True, False, True, True]
    assert report.ordering_disagreements() == [
        "circuit/kist/2ms > circuit/kist/5ms on real tor, not in the simulator"]
    assert report.as_json()["rows"][1]["sim_within_25pct"] is True
    assert Row(Case("circuit", "kist", 2), None, SimSide((1.0,))).within_target is None


def test_sim_figure_beyond_this_machine_is_cpu_bound_not_compared(monkeypatch) -> None:
    """Real Vanilla on the 2-core machine: ~30 MB/s for ~33 ms of CPU per MB over all processes.
    A simulated 240 MB/s would need ~8 cores here, so the row is reported, not compared."""
    monkeypatch.setattr(fidelity.os, "cpu_count", lambda: 2)
    real = RealSide((27.0, 30.0, 33.0), 0.26, None, 0.95, cpu_seconds_per_mbyte=0.033)
    vanilla = Row(Case("circuit", "vanilla", 10), real, SimSide((239.0,)))
    assert vanilla.sim_needs_cores == pytest.approx(7.9, abs=0.1)
    assert not real.cpu_bound and vanilla.cpu_bound and vanilla.within_target is None
    kist = Row(Case("circuit", "kist", 10), RealSide((3.0,), 0.06, None, 0.2, 0.06), SimSide((2.9,)))
    assert not kist.cpu_bound and kist.within_target is True
    assert vanilla.as_json()["cpu_bound"] is True and vanilla.as_json()["sim_needs_cores"] == pytest.approx(7.887)
