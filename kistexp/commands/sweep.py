"""`kistexp sweep SWEEP.toml`: a parameter sweep on local worker processes or a Dask cluster
(docs/sweeps.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from kistexp.output import add_row, console, emit_json, make_table, plain, print_table, progress_bar, say


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _range(low: float | None, high: float | None) -> str:
    """``+5.5 .. +9.2 %``: one unit for both ends, so the cell stays narrow."""
    if low is None or high is None:
        return f"{_pct(low)} .. {_pct(high)}"
    return f"{100 * low:+.1f} .. {100 * high:+.1f} %"


def sweep(
    sweep_file: Path = typer.Argument(..., metavar="SWEEP.toml", help="Sweep file (docs/sweeps.md)."),
    workers: int = typer.Option(None, "--workers", help="Local worker processes (default: CPU count)."),
    dask: str = typer.Option(None, "--dask", metavar="ADDRESS",
                             help="Submit to an existing Dask scheduler, e.g. tcp://10.0.0.5:8786."),
    dask_timeout: float = typer.Option(10.0, "--dask-timeout", help="Seconds to wait for the Dask scheduler."),
    out: Path = typer.Option(None, "--out", help="Output directory (default: sweeps/<name>)."),
    cache: Path = typer.Option(None, "--cache", help="Cell cache (default: $KISTEXP_SWEEP_CACHE or "
                               "~/.cache/kistexp/sweep)."),
    yes: bool = typer.Option(False, "--yes", help=f"Run a grid of more than {10_000:,} cells (at most "
                             f"{100_000:,})."),
    no_plots: bool = typer.Option(False, "--no-plots", help="Skip the plots."),
    check: bool = typer.Option(False, "--check", help="Check the sweep file and print its grid; run nothing."),
    fast: bool = typer.Option(False, "--fast", help="Scale the NICs down so that each network offers at most 75 "
                              "MB/s (as `kistexp simulate --fast`): faster, with a run-interval change's effects "
                              "shrunk; fast cells are cached apart from full-rate ones."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Run every cell of SWEEP.toml (values x loads x loss rates x class mixes x seeds x sampled networks),
    each a population run; finished cells are cached by a hash of their inputs, so a re-run resumes.
    Writes a tidy table (Parquet, CSV), plots with bands across networks and the recommendation table."""
    import os

    from kistexp.errors import SweepError
    from kistexp.population.dispatch import check_options
    from kistexp.sweep import CONFIRM_CELLS, load_sweep, run_sweep
    from kistexp.sweep.cache import CellCache, default_cache_dir
    from kistexp.sweep.execute import DaskBackend, LocalBackend

    spec = load_sweep(sweep_file)
    if fast:
        import attrs

        spec = attrs.evolve(spec, fast=True)
    if check:
        _print_grid(spec, as_json)
        return
    if spec.n_cells > CONFIRM_CELLS and not yes:
        raise SweepError(f"{sweep_file}: the grid has {spec.n_cells:,} cells (more than {CONFIRM_CELLS:,}); "
                         "pass --yes to run it")
    check_options(workers, dask, dask_timeout, SweepError)  # the checks `kistexp simulate` makes too
    store = CellCache(cache if cache is not None else default_cache_dir())
    out_dir = out if out is not None else Path("sweeps") / spec.name
    # `--dask ""` is an address too (refused by DaskBackend), not a request for local workers
    backend = (DaskBackend(dask, timeout_s=dask_timeout) if dask is not None
               else LocalBackend(workers if workers is not None else os.cpu_count() or 1))
    told = 0
    try:
        with progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("ETA"), TimeRemainingColumn(), as_json=as_json, transient=False) as bar:
            task = bar.add_task(f"{spec.name}: sampling networks", total=spec.n_cells)

            def start(total: int, cached: int) -> None:
                nonlocal told
                # the bar counts the cells to run: cached ones would make rich's rate, hence the ETA, wrong
                bar.update(task, total=total - cached,
                           description=f"{spec.name}: {cached} of {total} cached, {backend.description}")
                told = _tell(store, told)  # cache entries not trusted: their cells are among those to run

            def done(outcome) -> None:
                if outcome.status != "cached":
                    bar.advance(task)
                if outcome.status == "failed":
                    say(f"cell {outcome.task.index} ({outcome.task.key[:12]}) failed after "
                        f"{outcome.attempts} attempt(s): {outcome.error}", err=True)

            report = run_sweep(spec, out_dir, backend, store, on_start=start, on_outcome=done,
                               plots=not no_plots)
    except KeyboardInterrupt:
        raise SweepError(f"{sweep_file}: interrupted; finished cells are stored in {store.root}, run the same "
                         "command again to resume") from None
    finally:
        backend.close()
    _tell(store, told)  # results that could not be cached
    if as_json:
        import attrs

        doc = attrs.asdict(report, filter=lambda a, _v: a.name != "outcomes")
        doc["failures"] = [{"index": o.task.index, "cell": o.task.key[:16], "attempts": o.attempts,
                            "error": o.error} for o in report.outcomes if o.status == "failed"]
        doc["rates"] = "fast" if spec.fast else "full"
        doc["cache"] = str(store.root)
        doc["cache_rejected"] = store.rejected
        emit_json(doc)
    else:
        _print(spec, report)
    if report.failed:
        raise SweepError(f"{report.failed} of {report.cells} cells failed (see {report.out}/cells.csv); the "
                         "others are done, and running the same command again retries only the failed ones")


def _tell(store, since: int) -> int:
    """Print the cache's notices from number ``since`` on (a few lines, then how many more) on stderr;
    returns how many there are now."""
    from kistexp.sweep.cache import MAX_NOTICES

    lines = store.notices[since:min(since + 5, MAX_NOTICES)]
    for line in lines:
        say(line, err=True)
    more = store.notice_count - since - len(lines)
    if more > 0:
        say(f"... and {more:,} more notices about cache entries in {store.root}", err=True)
    return store.notice_count


def _print_grid(spec, as_json: bool) -> None:
    axes = {"value_sets": len(spec.value_sets), "loads": len(spec.loads), "loss_rates": len(spec.loss_rates),
            "class_mixes": len(spec.class_mixes), "seeds": len(spec.seeds), "samples": len(spec.samples)}
    if as_json:
        emit_json({"name": spec.name, "cells": spec.n_cells, "axes": axes, "parameters": list(spec.parameters),
                   "value_sets": [dict(v) for v in spec.value_sets], "loads": list(spec.loads),
                   "loss_rates": list(spec.loss_rates), "class_mixes": [m for m, _ in spec.class_mixes],
                   "seeds": list(spec.seeds), "scale": spec.scale, "samples": list(spec.samples),
                   "duration_s": spec.duration_s, "rates": "fast" if spec.fast else "full"})
        return
    # the sweep's name, class mixes and relay classes are the sweep file's text: printed as text
    say(plain(spec.name, "bold"), f": {spec.n_cells:,} cells = "
        + " x ".join(f"{n} {k.replace('_', ' ')}" for k, n in axes.items())
        + f", scale {spec.scale:g}, {spec.duration_s:g} simulated s each")


def _print(spec, report) -> None:
    from kistexp.sweep.results import PlotAxis, rule_text, value_text

    say(plain(report.name, "bold"), f": {report.cells} cells ({report.ran} run, {report.cached} cached, "
        f"{report.failed} failed) on {report.backend} in {report.wall_s:.0f} s; results in {report.out}; "
        + ("fast mode: NICs scaled down to 75 MB/s per network, a run-interval change's effects shrunk"
           if spec.fast else "full NIC rates"))
    for i, rule in enumerate(spec.recommend):
        unit = PlotAxis(rule.parameter, ()).unit  # from the parameter catalogue; "" for a bare number
        head = f"{rule.parameter}\n({unit})" if unit else rule.parameter
        # the context wraps at its spaces; names and numbers are never cut (a range keeps its % whole)
        context_width = max([7, *(len(w) for r in report.rises if r.rule == i for w in plain(r.context).plain.split())])
        t = make_table(rule_text(rule), [
            ("context", {"justify": "left", "min_width": context_width}),
            (Text(head), {"justify": "right", "no_wrap": True, "min_width": len(rule.parameter)}),
            *((Text(h), {"justify": "right", "no_wrap": True})
              for h in ("rise\n(median)", "rise\n(95 % range)", "networks", "within"))],
            box=None, title_justify="left", pad_edge=False)
        for r in report.rises:
            if r.rule == i:
                add_row(t, r.context, str(r.value), _pct(r.rise_median), _range(r.rise_low, r.rise_high),
                        str(r.networks), "yes" if r.within else "no")
        print_table(t)
        for rec in report.recommendations:
            if rec.rule == i:
                verdict = (f"{rule.parameter} = {value_text(rule.parameter, rec.value)} "
                           f"(rise at most {_pct(rec.rise_high)})"
                           if rec.value is not None else f"none: {rec.note}")
                console.print(plain(f"  recommended for {rec.context}: ").append_text(plain(verdict, "bold")))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
