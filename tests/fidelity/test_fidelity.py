"""Fidelity harness plumbing without tor: case parsing, the simulator adapter, the report
and the CLI (issue 4 point 7)."""

from __future__ import annotations

import json

import attrs
import pytest
from typer.testing import CliRunner

import kistexp.fidelity as fidelity
import kistexp.fidelity.realtor as realtor
import kistexp.fidelity.report as fidelity_report
import kistexp.fidelity.run as fidelity_run
from kistexp import jsonout
from kistexp.cli import app
from kistexp.errors import LocalNetError, SimConfigError
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


def test_default_cases_cover_issue_8s_scenarios() -> None:
    """KIST and KISTLite with 1, 2, 4 and 8 circuits, 4 streams, client at 10 ms with relays at
    2 ms, cc_alg=0; Vanilla only where it ran before (circuit, ceiling)."""
    cases = parse_cases()
    labels = {c.label for c in cases}
    for sched in ("kist", "kistlite"):
        for scen in ("circuit", "circuits-2", "circuits-4", "ceiling", "streams-4", "cc-off"):
            assert {f"{scen}/{sched}/2ms", f"{scen}/{sched}/10ms"} <= labels
        assert f"client-10ms/{sched}/2ms" in labels and f"client-10ms/{sched}/10ms" not in labels
    assert {c.scenario for c in cases if c.scheduler == "vanilla"} == {"circuit", "ceiling"}
    assert len(cases) == 30
    (c10,) = [c for c in cases if c.label == "client-10ms/kist/2ms"]
    assert c10.interval_ms == 2 and c10.client_interval_ms == 10
    assert Case("cc-off", "kist", 10).spec.cc_alg == 0
    assert Case("ceiling", "kist", 10).spec.circuits == 8
    assert Case("streams-4", "kist", 10).spec.streams == 4
    # the cc_alg=0 cases come last, so the real side changes the consensus once
    assert [c.scenario for c in cases][-4:] == ["cc-off"] * 4


@pytest.fixture
def recorded_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The real registry builds every network; only the engine run is replaced by a stand-in
    that records what was built and returns figures derived from it."""
    from kistexp.sim import scenarios

    calls: list[tuple] = []

    def fake_run(name: str, scenario: scenarios.PathScenario, run=None):
        built = scenarios.get(name).build(scenario)  # the real builder, with the real arguments
        calls.append((name, scenario, built))
        figures = scenarios.PathFigures(
            throughput_mbytes_per_s=30.0 / scenario.interval_ms + scenario.seed / 100, elapsed_s=1.0,
            finished=True, run_period_ms=12.0, cells_per_run_median=64.0)
        return figures, None

    monkeypatch.setattr(scenarios, "run_scenario", fake_run)
    return calls


def test_simulator_adapter_builds_the_registry_scenario(recorded_runs: list[tuple]) -> None:
    side = simulate(Case("circuit", "kist", 10), seed=2, size_bytes=5_000_000)
    assert side.throughputs_mbytes_per_s == (3.02,) and side.run_period_ms == 12.0
    name, s, built = recorded_runs[-1]
    assert name == "circuit" and (s.scheduler, s.interval_ms, s.client_interval, s.seed) == ("kist", 10, 10, 2)
    assert built.payload_bytes == 5_000_000 and built.run_config.flow_control.kind == "vegas"
    simulate(Case("ceiling", "kistlite", 10), seed=1, size_bytes=8_000_000)
    name, s, built = recorded_runs[-1]
    assert name == "ceiling-path" and s.circuits == 8 and len(built.network.circuits) == 8
    simulate(Case("client-10ms", "kist", 2), seed=1, size_bytes=1_000_000)
    name, s, built = recorded_runs[-1]
    assert built.network.nodes[0].kist_interval_ms == 10 and built.network.nodes[2].kist_interval_ms == 2
    simulate(Case("cc-off", "kistlite", 2), seed=1, size_bytes=1_000_000)
    assert recorded_runs[-1][2].run_config.flow_control.kind == "sendme"
    simulate(Case("streams-4", "kist", 2), seed=1, size_bytes=1_000_000)
    assert recorded_runs[-1][2].network.n_transfers == 4


def test_real_side_skipped_cleanly_without_tor(recorded_runs: list[tuple], monkeypatch) -> None:
    monkeypatch.setattr(fidelity_run, "have_tor", lambda: False)
    report = run_fidelity(parse_cases("circuit", "kist", "2,10"), repetitions=3, size_mb=1, seeds=3)
    assert "tor and tor-gencert are not installed" in report.real_skipped
    assert [r.real for r in report.rows] == [None, None]
    assert [r.sim.throughputs_mbytes_per_s for r in report.rows] == [(15.01, 15.02, 15.03), (3.01, 3.02, 3.03)]
    assert [c[1].seed for c in recorded_runs] == [1, 2, 3, 1, 2, 3]
    assert all(r.ratio is None for r in report.rows)


def test_real_figures_reload_from_a_json_report(recorded_runs: list[tuple], tmp_path) -> None:
    stats = RunStats(100, 8, 90, 12.0, 12.1, 64, 63.5, 5760)
    real = RealSide((3.0, 3.2), 0.2, stats, 0.4, 0.03, load_1min=0.5)
    report = fidelity.Report((Row(Case("circuit", "kist", 10), real, None),), 2, 20.0)
    path = tmp_path / "real.json"
    path.write_text(json.dumps(jsonout.to_json(report)))
    loaded = fidelity.load_real_sides(path)
    assert loaded == {Case("circuit", "kist", 10): real}
    again = run_fidelity(parse_cases("circuit", "kist", "10"), size_mb=1, real_from=path, seeds=2)
    (row,) = again.rows
    assert row.real == real and row.ratio == pytest.approx(3.015 / 3.1)
    # the real run's repetitions are its own, not the simulator's seeds
    three = run_fidelity(parse_cases("circuit", "kist", "10"), size_mb=1, real_from=path, seeds=3)
    assert three.real_runs() == (2,) and jsonout.to_json(three)["real_repetitions"] == [2]
    assert jsonout.to_json(three)["seeds"] == 3
    assert three.means_over() == "real tor: mean of 2 runs; simulator: mean of 3 seeds"
    # without --seeds the simulator runs DEFAULT_SEEDS seeds, whatever the real run's repetitions
    n = len(recorded_runs)
    default = run_fidelity(parse_cases("circuit", "kist", "10"), size_mb=1, real_from=path)
    assert default.means_over() == f"real tor: mean of 2 runs; simulator: mean of {fidelity.DEFAULT_SEEDS} seeds"
    assert [c[1].seed for c in recorded_runs[n:]] == list(range(1, fidelity.DEFAULT_SEEDS + 1))
    human = CliRunner().invoke(app, ["fidelity", "--scenarios", "circuit", "--schedulers", "kist",
                                     "--intervals", "10", "--real-from", str(path), "--seeds", "3"])
    assert human.exit_code == 0, human.output
    title = " ".join(human.output.split())  # the title may wrap at the terminal's width
    assert "mean of 2 runs" in title and "mean of 3 seeds" in title
    bad = CliRunner().invoke(app, ["fidelity", "--real-from", str(path), "--seeds", "0"])
    assert isinstance(bad.exception, SimConfigError)  # main() prints it as one line, exit code 1
    assert "--seeds must be an integer in [1, 1000], got 0" in str(bad.exception)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SimConfigError, match="no real tor rows"):
        fidelity.load_real_sides(tmp_path / "bad.json")


def test_ratio_and_cpu_bound_note() -> None:
    stats = RunStats(100, 8, 90, 12.0, 12.1, 64, 63.5, 5760)
    real = RealSide((2.0, 3.0), cpu_busiest_fraction=0.2, run_period=stats)
    row = Row(Case("ceiling", "kistlite", 10), real, SimSide((2.25, 2.75)))
    assert row.ratio == pytest.approx(1.0)
    out = jsonout.to_json(row)
    assert out["real_mean_mbytes_per_s"] == 2.5 and out["real_run_period_ms_median"] == 12.0
    assert out["real_cells_per_run_median"] == 64 and out["sim_over_real"] == pytest.approx(1.0)
    assert not real.cpu_bound and RealSide((30.0,), 0.97, None).cpu_bound


def test_machine_stalls_are_reported_beside_real_tor(tmp_path) -> None:
    """The CPU time the hypervisor took during each repetition and the timer probe reach the
    report, its JSON (reloaded by --real-from) and a warning when the machine stalls."""
    from kistexp.localnet import machine

    stats = RunStats(100, 8, 90, 4.0, 4.1, 64, 63.5, 5760)
    kist = RealSide((5.0, 7.0), 0.2, stats, 0.4, 0.03, load_1min=0.5, stolen_fractions=(0.08, 0.04))
    lite = RealSide((6.0, 6.2), 0.2, stats, 0.4, 0.03, load_1min=0.5, stolen_fractions=(0.01, 0.01))
    timers = machine.lateness_of([0.1] * 93 + [3.0] * 7, 1.0, stolen=0.05)
    report = fidelity.Report((Row(Case("circuit", "kist", 2), kist, SimSide((9.0,))),
                              Row(Case("circuit", "kistlite", 2), lite, SimSide((6.4,)))), 2, 20.0, timers=timers)
    lines = report.summary_lines()
    assert "the hypervisor took 3.5 % of this machine's CPU time (case means 1.0-6.0 %)" in "\n".join(lines)
    assert any(line.startswith("machine: 100 sleeps of 1 ms") and "7.0 % more than 1 ms late" in line
               for line in lines)
    assert any(line.startswith("warning: this machine's cores are held off") for line in lines)
    out = jsonout.to_json(report)
    assert out["real_stolen_fraction_mean"] == pytest.approx(0.035) and out["machine"]["late_fraction"] == 0.07
    assert out["rows"][0]["real_stolen_fraction_mean"] == pytest.approx(0.06)
    path = tmp_path / "real.json"
    path.write_text(json.dumps(out))
    assert fidelity.load_real_sides(path)[Case("circuit", "kist", 2)] == kist
    assert fidelity.load_machine(path) == timers
    # a quiet machine: the figures, no warning; a report of before the field: none of it
    calm = fidelity.Report((Row(Case("circuit", "kistlite", 2), attrs_evolve(lite, (0.001, 0.002)), None),), 2, 20.0,
                           timers=machine.lateness_of([0.1] * 100, 1.0, stolen=0.001))
    assert not any(line.startswith("warning") for line in calm.summary_lines())
    old = out["rows"][0]["real"]
    del old["stolen_fractions"]
    assert RealSide.from_json(old, "old").stolen_fractions == ()
    assert fidelity.Report((Row(Case("circuit", "kist", 2), RealSide((5.0,), 0.2, None), None),), 1, 20.0
                           ).machine_lines() == []


def test_how_long_the_tors_waited_for_a_core_reaches_the_report(monkeypatch, tmp_path) -> None:
    """Each repetition's largest share of its wall time that one tor spent waiting for a core: read
    from the kernel's account before and after the transfer, kept per repetition, averaged in the
    report's JSON and reloaded by --real-from; a report of before the field reloads without it."""
    rt = fidelity.RealTor(root=tmp_path / "net")
    # two relays' cumulative waits (s) at the two readings; the transfer takes 2 s of wall time
    readings = iter([{"guard": 1.0, "middle": 5.0}, {"guard": 1.5, "middle": 5.1}])
    ticks = [100.0, 102.0]

    def clock() -> float:  # the transfer's start and end, then time standing still
        return ticks.pop(0) if len(ticks) > 1 else ticks[0]

    monkeypatch.setattr(rt, "_core_wait_sample", lambda: next(readings))
    monkeypatch.setattr(rt, "_cpu_sample", lambda: {"exit": 0.0})
    monkeypatch.setattr(rt, "_transfer", lambda case, size, tag: 7.5)
    monkeypatch.setattr(realtor.time, "monotonic", clock)
    rep = rt._repetition(Case("circuit", "vanilla", 2), 1_000_000, "r0")
    assert rep.core_wait == pytest.approx(0.25)  # the guard: 0.5 s of 2 s
    side = realtor._real_side([rep, attrs.evolve(rep, core_wait=0.15)], None)
    assert side.core_wait_fractions == pytest.approx((0.25, 0.15))
    out = jsonout.to_json(Row(Case("circuit", "vanilla", 2), side, SimSide((9.0,))))
    assert out["real_core_wait_fraction_mean"] == pytest.approx(0.20)
    assert RealSide.from_json(out["real"], "x") == side
    del out["real"]["core_wait_fractions"]
    assert RealSide.from_json(out["real"], "old").core_wait_fractions == ()
    # before the network runs there is nothing to read
    assert fidelity.RealTor(root=tmp_path / "none")._core_wait_sample() == {}


def test_a_repetition_the_host_held_off_is_measured_again(monkeypatch, tmp_path) -> None:
    """--max-stolen: a repetition during which the host took more than the bound is measured
    again, at most STOLEN_RETRIES times; the report counts the dropped tries."""
    from kistexp.fidelity.realtor import _Repetition

    shares: list[float] = []
    tags: list[str] = []

    def repetition(case: Case, size: int, tag: str) -> _Repetition:
        tags.append(tag)
        stolen = shares.pop(0)
        return _Repetition(3.0 - stolen, 0.2, 0.5, 0.03, 0.4, stolen)

    rt = fidelity.RealTor(root=tmp_path / "net", max_stolen=0.05)
    rt.net = object()
    monkeypatch.setattr(rt, "_repetition", repetition)
    monkeypatch.setattr(rt, "configure", lambda case: None)
    monkeypatch.setattr(rt, "run_period", lambda case, size: None)
    case = Case("circuit", "kist", 2)
    shares[:] = [0.20, 0.10, 0.03]
    kept = rt._calm_repetition(case, 1000, "r0")
    assert (kept.stolen, kept.remeasured, tags) == (0.03, 2, ["r0", "r0-again1", "r0-again2"])
    shares[:] = [0.30] * (fidelity.STOLEN_RETRIES + 1)
    held = rt._calm_repetition(case, 1000, "r1")  # the host never let go: the last try is kept
    assert held.remeasured == fidelity.STOLEN_RETRIES and not shares
    shares[:] = [0.02, 0.30, 0.04]
    side = rt.measure(case, repetitions=2, size_bytes=1000, period_probe=False)
    assert side.stolen_fractions == (0.02, 0.04) and side.remeasured == 1
    assert side.throughputs_mbytes_per_s == pytest.approx((2.98, 2.96))
    report = fidelity.Report((Row(case, side, None),), 2, 20.0)
    assert "1 repetition(s) measured again because the host took more than --max-stolen during them" in (
        report.summary_lines())
    assert RealSide.from_json(jsonout.to_json(side), "here") == side
    rt.max_stolen = None  # without the bound nothing is measured twice
    shares[:] = [0.5]
    assert rt._calm_repetition(case, 1000, "r2").remeasured == 0
    with pytest.raises(SimConfigError, match=r"--max-stolen must be a percentage within \[0, 100\), got 100"):
        run_fidelity(parse_cases("circuit", "kist", "2"), real=False, sim=False, max_stolen_pct=100)


def attrs_evolve(side: RealSide, stolen: tuple[float, ...]) -> RealSide:
    import attrs

    return attrs.evolve(side, stolen_fractions=stolen)


def test_bad_run_settings() -> None:
    with pytest.raises(SimConfigError, match="--repetitions must be >= 1"):
        run_fidelity(parse_cases("circuit", "kist", "2"), repetitions=0, real=False, sim=False)
    with pytest.raises(SimConfigError, match="--size-mb"):
        run_fidelity(parse_cases("circuit", "kist", "2"), size_mb=0, real=False, sim=False)


def test_cli_json_without_real_side(recorded_runs: list[tuple]) -> None:
    result = CliRunner().invoke(app, ["fidelity", "--scenarios", "ceiling", "--schedulers", "kistlite",
                                      "--intervals", "10", "--seeds", "2", "--no-real", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["real_skipped"] == "real tor not requested"
    (row,) = data["rows"]
    assert row["scenario"] == "ceiling" and row["sim_mean_mbytes_per_s"] == pytest.approx(3.015)
    assert row["circuits"] == 8 and row["streams"] == 1 and row["cc_alg"] == 2
    assert row["real_mean_mbytes_per_s"] is None and row["sim_run_period_ms"] == 12.0
    human = CliRunner().invoke(app, ["fidelity", "--scenarios", "circuit", "--schedulers", "kist",
                                     "--no-real", "--seeds", "1"])
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
        row("client-10ms", "kist", 2, (5.0, 5.2), 9.0),       # real slower than circuit/kist/2, sim faster
    )
    report = Report(rows, 3, 20.0)
    assert [r.within_target for r in rows] == [False, True, False, True, False]
    assert report.within_target_count() == (2, 5)
    # pairs across scenarios count too: the client at 10 ms must not beat all at 2 ms
    assert report.ordering_disagreements() == [
        "circuit/kist/2ms > circuit/kist/5ms on real tor, not in the simulator",
        "circuit/kist/2ms > client-10ms/kist/2ms on real tor, not in the simulator",
        "circuit/kistlite/2ms > client-10ms/kist/2ms on real tor, not in the simulator"]
    # clear pairs: 10<2, 10<5, 10<lite2, 10<c10, 5<2, c10<2, c10<5, c10<lite2
    assert len(report.clear_pairs()) == 8
    lines = report.summary_lines()
    assert lines[0] == "simulator within 25 % of real tor: 2 of 5 compared cases"
    assert lines[1] == "ordering: 5 of 8 pairs that real tor orders clearly are ordered the same way by the simulator"
    assert jsonout.to_json(report)["rows"][1]["sim_within_25pct"] is True
    assert jsonout.to_json(report)["clearly_ordered_pairs"] == 8
    assert Row(Case("circuit", "kist", 2), None, SimSide((1.0,))).within_target is None
    # apart, but within real tor's run-to-run noise: not an order the simulator must follow
    close = Report((row("ceiling", "kistlite", 2, (7.41, 7.53, 7.63), 7.8),
                    row("circuits-2", "kistlite", 2, (7.15, 7.24, 7.30), 7.9)), 3, 20.0)
    assert close.clear_pairs() == [] and close.ordering_disagreements() == []


def test_sim_figure_beyond_this_machine_is_cpu_bound_not_compared(monkeypatch) -> None:
    """Real Vanilla on the 2-core machine: ~30 MB/s for ~33 ms of CPU per MB over all processes.
    A simulated 240 MB/s would need ~8 cores here, so the row is reported, not compared."""
    monkeypatch.setattr(fidelity_report.os, "cpu_count", lambda: 2)
    real = RealSide((27.0, 30.0, 33.0), 0.26, None, 0.95, cpu_seconds_per_mbyte=0.033)
    vanilla = Row(Case("circuit", "vanilla", 10), real, SimSide((239.0,)))
    assert vanilla.sim_needs_cores == pytest.approx(7.9, abs=0.1)
    assert not real.cpu_bound and vanilla.cpu_bound and vanilla.within_target is None
    kist = Row(Case("circuit", "kist", 10), RealSide((3.0,), 0.06, None, 0.2, 0.06), SimSide((2.9,)))
    assert not kist.cpu_bound and kist.within_target is True
    out = jsonout.to_json(vanilla)
    assert out["cpu_bound"] is True and out["sim_needs_cores"] == pytest.approx(7.887)


def test_real_cases_are_measured_in_rounds_and_a_failing_case_is_dropped(monkeypatch, tmp_path) -> None:
    """measure_interleaved: repetition 1 of every case, then 2; the cc_alg=0 case in rounds of
    its own after the others (one vote for it, not one per round); a case whose transfer fails
    leaves the later rounds with its error as its note; probes after the rounds."""
    from kistexp.errors import KistexpError

    rt = fidelity.RealTor(root=tmp_path / "net")
    rt.net = object()  # never used by the stand-ins below
    done: list[tuple[str, str]] = []
    probed: list[str] = []
    votes: list[int] = []
    speeds = {"circuit": 9.0, "streams-4": 7.0, "circuits-2": 20.0, "cc-off": 3.0}

    def configure(case: Case) -> None:
        if case.spec.cc_alg != rt._cc_alg:
            votes.append(case.spec.cc_alg)
            rt._cc_alg = case.spec.cc_alg

    def transfer(case: Case, size: int, tag: str) -> float:
        done.append((case.scenario, tag))
        if case.scenario == "circuits-2" and tag == "r1":
            raise KistexpError("download through circuit 'x' ended after 5 of 10 bytes")
        return speeds[case.scenario] + int(tag[1:]) / 10

    monkeypatch.setattr(rt, "configure", configure)
    monkeypatch.setattr(rt, "_transfer", transfer)
    monkeypatch.setattr(rt, "_cpu_sample", lambda: {"exit": time_now()})
    monkeypatch.setattr(rt, "_core_wait_sample", dict)  # a kernel without the account
    from kistexp.localnet import machine

    ticks = iter(machine.CpuTicks(1000 * i, 10 * i * i) for i in range(1, 100))
    monkeypatch.setattr(machine, "cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(rt, "run_period", lambda case, size: probed.append(case.scenario) or
                        RunStats(10, 5, 9, 4.0, 4.1, 64, 60.0, 1000))
    cases = [Case("cc-off", "kist", 2), Case("circuit", "kist", 2), Case("circuits-2", "kist", 2),
             Case("streams-4", "kist", 2)]
    sides, notes = rt.measure_interleaved(cases, repetitions=3, size_bytes=1_000_000)
    assert done == [("circuit", "r0"), ("circuits-2", "r0"), ("streams-4", "r0"),
                    ("circuit", "r1"), ("circuits-2", "r1"), ("streams-4", "r1"),
                    ("circuit", "r2"), ("streams-4", "r2"),
                    ("cc-off", "r0"), ("cc-off", "r1"), ("cc-off", "r2")]
    assert votes == [0]  # one cc_alg change for all of the cc-off case's rounds
    assert probed == ["circuit", "streams-4", "cc-off"]
    assert set(sides) == {cases[0], cases[1], cases[3]}
    assert sides[cases[1]].throughputs_mbytes_per_s == (9.0, 9.1, 9.2)
    # each repetition's stolen share from the machine's ticks read just before and after it (the
    # i-th reading: 1000*i ticks, 10*i*i stolen): circuit's repetitions took readings 1-2, 7-8
    # and 12-13 (the failed circuits-2 transfer took one reading, 9)
    assert sides[cases[1]].stolen_fractions == pytest.approx((0.03, 0.15, 0.25))
    assert sides[cases[3]].run_period.period_ms_median == 4.0 and sides[cases[3]].load_1min is not None
    assert notes == {cases[2]: "download through circuit 'x' ended after 5 of 10 bytes"}

    # --case-by-case: each case's repetitions back to back, the failing case with its note
    done.clear()
    sides, notes = rt.measure_case_by_case(cases[1:], repetitions=2, size_bytes=1_000_000)
    assert done == [("circuit", "r0"), ("circuit", "r1"), ("circuits-2", "r0"), ("circuits-2", "r1"),
                    ("streams-4", "r0"), ("streams-4", "r1")]
    assert set(sides) == {cases[1], cases[3]} and list(notes) == [cases[2]]


def time_now() -> float:
    import time

    return time.process_time() + time.monotonic()  # grows between the samples of a repetition


class _VotingNet:
    """The part of LocalNetwork that RealTor.set_cc_alg uses, recording what it is asked."""

    def __init__(self, held: dict) -> None:
        import types

        self.held = held
        self.authorities = [types.SimpleNamespace(nickname=f"auth{i}") for i in range(3)]
        path = ("client", "guard", "middle", "exit")
        self.nodes = [*self.authorities, *(types.SimpleNamespace(nickname=n) for n in path)]
        self.voted: dict[str, dict] = {}
        self.calls: list[str] = []

    def params(self, auth):
        return [("KISTSchedRunInterval", 10)]

    def set_consensus_params(self, name, params):
        self.voted[name] = params

    def restart_client(self, name, timeout_s):
        self.calls.append(f"restart {name}")
        self.held[name] = self.held["auth0"]  # a new client bootstraps from the authorities

    def fingerprint(self, name):
        return name.upper()

    def pin_path(self, client, guard, middle, exit_):
        self.calls.append(f"pin {client} {guard} {middle} {exit_}")

    def control(self, name):
        net = self

        class _Ctl:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def close_circuits(self):
                net.calls.append(f"close circuits of {name}")

        return _Ctl()


def _voting_realtor(monkeypatch, tmp_path, held: dict) -> tuple[fidelity.RealTor, _VotingNet]:
    import types

    net = _VotingNet(held)
    monkeypatch.setattr(realtor, "_consensus_cc_alg", lambda _net, name: net.held[name])
    real = fidelity.RealTor(root=tmp_path)
    real.net = net
    for role in ("client", "guard", "middle", "exit"):
        setattr(real, role, types.SimpleNamespace(nickname=role))
    return real, net


def test_a_cc_alg_vote_that_never_arrives_names_what_each_node_holds(monkeypatch, tmp_path) -> None:
    """The wait for a voted cc_alg ends with a one-line LocalNetError saying which consensus
    each authority and node holds, instead of hanging or a bare timeout."""
    held = {"auth0": 0, "auth1": 0, "auth2": 0, "client": 0, "guard": 0, "middle": 0, "exit": None}
    real, net = _voting_realtor(monkeypatch, tmp_path, held)
    monkeypatch.setattr(realtor, "PARAMS_TIMEOUT_S", 0.0)
    with pytest.raises(LocalNetError) as err:
        real.set_cc_alg(0)
    msg = str(err.value)
    assert "waiting for cc_alg=0 in the consensus of client, guard, middle, exit" in msg
    assert "client 0" in msg and "exit None" in msg and "auth0 0" in msg and "\n" not in msg
    assert net.voted["auth1"] == {"KISTSchedRunInterval": 10, "cc_alg": 0}
    assert real._cc_alg == 2  # not recorded as in force


def test_a_cc_alg_vote_restarts_a_client_still_on_the_old_value(monkeypatch, tmp_path) -> None:
    """tor 0.4.9 refuses a client that asks for congestion control and the v1 cell format at
    a relay whose consensus has cc_alg=0, its directory fetches included: once the
    authorities publish the new value, the client restarts without its cached consensus, its
    pinned path is set again, and circuits from before the vote are closed."""
    held = {"auth0": 0, "auth1": 0, "auth2": 0, "client": 2, "guard": 0, "middle": 0, "exit": 0}
    real, net = _voting_realtor(monkeypatch, tmp_path, held)
    real.set_cc_alg(0)
    assert net.calls == ["restart client", "pin client guard middle exit", "close circuits of client"]
    assert real._cc_alg == 0
    # a client that already holds the value keeps running; only its old circuits go
    net.calls.clear()
    net.held.update(auth0=2, auth1=2, auth2=2, client=2, guard=2, middle=2, exit=2)
    real.set_cc_alg(2)
    assert net.calls == ["close circuits of client"]
    # the authorities must hold it first: a client restarted earlier would bootstrap the old value
    net.calls.clear()
    net.held.update(auth0=2, auth1=2, auth2=2)
    monkeypatch.setattr(realtor, "PARAMS_TIMEOUT_S", 0.0)
    with pytest.raises(LocalNetError, match="consensus of auth0, auth1, auth2"):
        real.set_cc_alg(0)
    assert net.calls == []
