"""`kistexp fidelity`: real tor on loopback and the simulator, side by side."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import typer
from rich import box
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from kistexp import jsonout
from kistexp.errors import FidelityHistoryError, KistexpError
from kistexp.fidelity import SCENARIOS, STOLEN_RETRIES, Case, Report, parse_cases, run_fidelity
from kistexp.fidelity import history as fidelity_history
from kistexp.fidelity.history import History, HistoryRow, RunSummary
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


def _when(summary: RunSummary) -> str:
    return f"{summary.measured_utc:%Y-%m-%d %H:%M}"


def _range(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _standing_line(current: RunSummary) -> str:
    facts = [current.machine, f"tor {current.tor_version}" if current.tor_version else "",
             f"{current.repetitions} repetitions" if current.repetitions else "",
             f"{current.seeds} seeds" if current.seeds else ""]
    return (f"current standing: the run of {_when(current)} UTC{''.join(', ' + f for f in facts if f)}: "
            f"{current.within} of {current.compared} compared rows within 25 % of real tor")


def _row_interval(row: HistoryRow) -> str:
    text = f"{row.interval_ms} ms"
    return text if row.client_interval == row.interval_ms else f"{text} (client {row.client_interval})"


def _print_history(history: History, current: RunSummary | None, plot: Path | None) -> None:
    runs = history.summaries()
    say(f"fidelity history: {history.source}: {len(runs)} run(s)")
    # no vertical rules, and the short columns' headings on two lines: the seven columns fit 80 without
    # cutting a machine's name or a date from its time
    table = make_table(None, (("run (UTC)", {"no_wrap": True}), ("machine", {"min_width": 11}),
                              ("tor", {"no_wrap": True}), ("reps seeds", {"width": 5}),
                              ("cases", {"justify": "right", "width": 5}), ("within 25 %", {"width": 8}),
                              ("sim/real", {"no_wrap": True})),
                       box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for r in runs:
        counts = f"{'-' if r.repetitions is None else r.repetitions}/{'-' if r.seeds is None else r.seeds}"
        add_row(table, _when(r), r.machine.removesuffix(" machine") or "-", r.tor_version or "-", counts, r.cases,
                f"{r.within} of {r.compared}" if r.compared else "-", _range(r.ratio_min, r.ratio_max))
    print_table(table)
    if current is not None:
        say(_standing_line(current))
        rows = history.run(current.run_id)
        table = make_table(None, (("scenario", {"no_wrap": True}), ("scheduler", {"no_wrap": True}),
                                  ("interval", {"no_wrap": True}), ("real", {"justify": "right"}),
                                  ("range", {"no_wrap": True}), ("sim", {"justify": "right"}),
                                  ("sim/real", {"justify": "right", "no_wrap": True})),
                           box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for row in rows:
            real = "-" if row.real_mbytes_per_s is None else f"{row.real_mbytes_per_s:.2f}"
            spread = ""
            if row.real_min_mbytes_per_s is not None and row.real_max_mbytes_per_s is not None:
                spread = f"{row.real_min_mbytes_per_s:.1f}-{row.real_max_mbytes_per_s:.1f}"
            mark = "" if row.within_target else ("*" if row.within_target is None else "x")
            add_row(table, row.scenario, row.scheduler, _row_interval(row), real, spread,
                    "-" if row.sim_mbytes_per_s is None else f"{row.sim_mbytes_per_s:.2f}",
                    "-" if row.sim_over_real is None else f"{row.sim_over_real:.2f}{mark}")
        print_table(table)
        say("real, sim: mean throughput, MB/s (10^6 B/s); range: of real tor's repetitions; x: outside 25 % of "
            "real tor; *: not compared (CPU-bound on that machine, or a side missing)")
    if plot is not None:
        say(f"plot: {plot}")


def _history_json(history: History, current: RunSummary | None, plot: Path | None) -> dict:
    return {
        "source": history.source,
        "runs": jsonout.to_json(history.summaries()),
        "current": None if current is None else {
            **jsonout.to_json(current), "rows": jsonout.to_json(history.run(current.run_id))},
        "plot": None if plot is None else str(plot),
    }


def _show_history(history_file: Path | None, plot: Path | None, json_out: bool) -> None:
    history = fidelity_history.load(history_file)
    current = history.current()
    if plot is not None:
        fidelity_history.plot(history, plot)
    if json_out:
        emit_json(_history_json(history, current, plot))
    else:
        _print_history(history, current, plot)


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
    history: bool = typer.Option(False, "--history", help="Run nothing: print every measured run (the history "
                                 "shipped with kistexp unless --history-file) and the current standing."),
    history_file: Path | None = typer.Option(None, "--history-file", help="With --history: read this history CSV "
                                             "(one written by --record) instead of the bundled one."),
    plot: Path | None = typer.Option(None, "--plot", help="With --history: draw each run's sim/real ratios to this "
                                     ".png or .svg."),
    record: Path | None = typer.Option(None, "--record", help="Append this run's rows to this history CSV (created "
                                       "if absent), to read back with --history --history-file."),
    machine_name: str | None = typer.Option(None, "--machine", help="With --record: this machine's name in the "
                                            "history (default: its host name)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run scenarios on a real local tor network and in the simulator; print both and their ratio.
    With --history, print the runs measured so far instead."""
    if history:
        given = [name for name, value, default in (
            ("--scenarios", scenarios, None), ("--schedulers", schedulers, None), ("--intervals", intervals, None),
            ("--repetitions", repetitions, None), ("--seeds", seeds, None), ("--size-mb", size_mb, 20.0),
            ("--no-real", real, True), ("--no-sim", sim, True), ("--dir", directory, None),
            ("--real-from", real_from, None), ("--base-port", base_port, None), ("--case-by-case", rounds, True),
            ("--max-stolen", max_stolen, None), ("--record", record, None), ("--machine", machine_name, None))
            if value != default]
        if given:
            raise FidelityHistoryError(f"--history reads the history and runs nothing: {given[0]} does not go with "
                                       "it (it takes --history-file, --plot and --json)")
        _show_history(history_file, plot, json_out)
        return
    if history_file is not None or plot is not None:
        raise FidelityHistoryError(f"{'--history-file' if history_file is not None else '--plot'} goes with "
                                   "--history (to see a recorded run: kistexp fidelity --history --history-file FILE)")
    if machine_name is not None and record is None:
        raise FidelityHistoryError("--machine names this machine in a history: it goes with --record")
    cases = parse_cases(scenarios, schedulers, intervals)
    if record is not None:
        if not real and real_from is None:
            raise FidelityHistoryError(f"{record}: --record keeps real tor's figures beside the simulator's; "
                                       "with --no-real there are none (drop it, or give --real-from)")
        fidelity_history.check_recordable(record)  # before the run's minutes are spent
    started = dt.datetime.now(dt.timezone.utc)
    if json_out:
        report = run_fidelity(cases, repetitions, size_mb, real, sim, directory, base_port, real_from=real_from,
                              interleaved=rounds, seeds=seeds, max_stolen_pct=max_stolen)
    else:
        with progress_bar(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                          TimeElapsedColumn()) as bar:
            task = bar.add_task("fidelity", total=None)
            report = run_fidelity(cases, repetitions, size_mb, real, sim, directory, base_port,
                                  progress=lambda msg: bar.update(task, description=visible(msg)),
                                  real_from=real_from, interleaved=rounds, seeds=seeds, max_stolen_pct=max_stolen)
    recorded: dict | None = None
    failed: KistexpError | None = None
    if record is not None:
        try:
            rows = fidelity_history.report_rows(report, started, machine=machine_name, real_from=real_from,
                                                rounds=rounds, max_stolen=max_stolen)
            fidelity_history.record(record, rows)
            recorded = {"file": str(record), "run_id": rows[0].run_id, "rows": len(rows)}
        except KistexpError as exc:
            failed = exc  # the report is printed all the same: the run's minutes are not lost
    if json_out:
        out = jsonout.to_json(report)
        if record is not None:
            out["recorded"] = recorded
        emit_json(out)
    else:
        _print_report(report)
        if recorded is not None:
            say(f"recorded run {recorded['run_id']} ({recorded['rows']} rows) in {record}")
    if failed is not None:
        raise failed


def register(app: typer.Typer) -> None:
    app.command("fidelity")(fidelity)
