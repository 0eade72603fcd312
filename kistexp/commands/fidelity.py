"""`kistexp fidelity`: real tor on loopback and the simulator, side by side."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from kistexp.fidelity import SCENARIOS, STOLEN_RETRIES, Case, Report, parse_cases, run_fidelity
from kistexp.output import add_row, emit_json, make_table, print_table, progress_bar, say, visible


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(case: Case) -> str:
    text = f"{case.interval_ms} ms"
    if case.client_interval_ms != case.interval_ms:
        text += f" (client {case.client_interval_ms})"
    return text


def _print_report(report: Report) -> None:
    table = make_table(f"fidelity: real tor vs simulator (MB/s; {report.means_over()}; "
                       f"{report.size_mb:g} MB per case)",
                       ("scenario", "scheduler", "interval", "real MB/s", "sim MB/s", "sim/real",
                        "run period ms real / sim", "cells/run median real (mean) / sim", "load", "stolen %",
                        "core wait %", "note"))
    for row in report.rows:
        real = row.real
        rp = real.run_period if real else None
        spread = ""
        if real and len(real.throughputs_mbytes_per_s) > 1:
            spread = f" ({min(real.throughputs_mbytes_per_s):.1f}-{max(real.throughputs_mbytes_per_s):.1f})"
        add_row(
            table, row.case.scenario, row.case.scheduler, _interval(row.case),
            (_fmt(real.mean_mbytes_per_s) + spread) if real else "-",
            _fmt(row.sim.mean_mbytes_per_s) if row.sim else "-",
            _fmt(row.ratio),
            f"{_fmt(rp.period_ms_median if rp else None, 1)} / {_fmt(row.sim.run_period_ms if row.sim else None, 1)}",
            f"{_fmt(rp.cells_per_run_median if rp else None, 0)} ({_fmt(rp.cells_per_run_mean if rp else None, 0)})"
            f" / {_fmt(row.sim.cells_per_run_median if row.sim else None, 0)}",
            _fmt(real.load_1min if real else None, 1),
            _fmt(100 * real.stolen_mean if real and real.stolen_mean is not None else None, 1),
            _fmt(100 * real.core_wait_mean if real and real.core_wait_mean is not None else None, 1),
            "; ".join(n for n in (row.real_note, row.sim_note) if n),
        )
    print_table(table)
    for line in report.summary_lines():
        say(line)
    for note in (report.real_skipped, report.sim_skipped):
        if note:
            say(note)


def fidelity(
    scenarios: str | None = typer.Option(None, "--scenarios",
                                         help=f"Comma list of {', '.join(SCENARIOS)} (default: all)."),
    schedulers: str | None = typer.Option(None, "--schedulers", help="kist, kistlite, vanilla (default: each "
                                          "scenario's own: all three for circuit and ceiling, else KIST, KISTLite)."),
    intervals: str | None = typer.Option(None, "--intervals", help="KISTSchedRunInterval values in ms (default: "
                                         "each scenario's own, 2,10; client-10ms: 2)."),
    repetitions: int | None = typer.Option(None, "--repetitions", help="Real runs per case (default: 3)."),
    seeds: int | None = typer.Option(None, "--seeds", help="Simulator seeds per case, each starting the downloads "
                                     "at its own phase of the kernel tick (default: 20)."),
    size_mb: float = typer.Option(20.0, "--size-mb", help="MB moved per repetition (split over 8 circuits "
                                                            "for the ceiling)."),
    real: bool = typer.Option(True, "--real/--no-real", help="Run the real-tor side."),
    sim: bool = typer.Option(True, "--sim/--no-sim", help="Run the simulator side."),
    directory: Path | None = typer.Option(None, "--dir", help="Keep the local network here (default: temp)."),
    real_from: Path | None = typer.Option(None, "--real-from", help="Take real tor's figures from an earlier "
                                          "--json report instead of running tor."),
    base_port: int | None = typer.Option(None, "--base-port", help="Port layout base (default: first free)."),
    rounds: bool = typer.Option(True, "--rounds/--case-by-case", help="Real tor: measure the cases in rounds "
                                "(repetition 1 of every case, then 2, ...), or each case's repetitions back to back."),
    max_stolen: float | None = typer.Option(None, "--max-stolen", help="Real tor: measure a repetition again (at "
                                            f"most {STOLEN_RETRIES} times) while the machine's host took more than "
                                            "this % of its CPU time during it (default: never)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run scenarios on a real local tor network and in the simulator; print both and their ratio."""
    cases = parse_cases(scenarios, schedulers, intervals)
    if json_out:
        report = run_fidelity(cases, repetitions, size_mb, real, sim, directory, base_port, real_from=real_from,
                              interleaved=rounds, seeds=seeds, max_stolen_pct=max_stolen)
        emit_json(report.as_json())
        return
    with progress_bar(SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn()) as bar:
        task = bar.add_task("fidelity", total=None)
        report = run_fidelity(cases, repetitions, size_mb, real, sim, directory, base_port,
                              progress=lambda msg: bar.update(task, description=visible(msg)), real_from=real_from,
                              interleaved=rounds, seeds=seeds, max_stolen_pct=max_stolen)
    _print_report(report)


def register(app: typer.Typer) -> None:
    app.command("fidelity")(fidelity)
