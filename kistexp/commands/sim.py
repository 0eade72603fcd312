"""`kistexp sim ...`: run the relay-scheduling simulator's experiments (docs/simulator.md)."""

from __future__ import annotations

from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kistexp import jsonout
from kistexp.output import add_row, emit_json, make_table, print_table, progress_bar

sim_app = typer.Typer(
    help="Relay-scheduling simulator: KIST, KISTLite and Vanilla with EWMA circuit priority.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


@sim_app.command("experiment")
def experiment(
    name: str = typer.Argument(
        ..., help="ceiling, ceiling-path, circuit, kist-first-run, ewma or kernel-queue (docs/simulator.md)."
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="kist, kistlite or vanilla (default: the experiment's own set)."
    ),
    interval_ms: int | None = typer.Option(
        None, "--interval-ms", help="KISTSchedRunInterval of the relays, ms (tor accepts 1-100)."
    ),
    client_interval_ms: int | None = typer.Option(
        None, "--client-interval-ms", help="KISTSchedRunIntervalClient of the client, ms."
    ),
    seed: int = typer.Option(1, "--seed", help="Random seed; the same seed gives the same figures."),
    circuits: int | None = typer.Option(None, "--circuits", help="Number of circuits, where it applies."),
    streams: int | None = typer.Option(None, "--streams", help="Streams on the one circuit (circuit only)."),
    cc_alg: int | None = typer.Option(
        None, "--cc-alg", help="tor's cc_alg: 2 = Vegas (default), 0 = fixed SENDME windows (circuit, ceiling-path)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (keys carry their units)."),
) -> None:
    """Run one of the simulator's experiments and print its figures."""
    from kistexp.sim import experiments  # the numba engine is imported only when a run is asked for

    kwargs: dict[str, Any] = dict(
        scheduler=scheduler,
        interval_ms=interval_ms,
        client_interval_ms=client_interval_ms,
        seed=seed,
        circuits=circuits,
        streams=streams,
        cc_alg=cc_alg,
    )
    if as_json:
        result = experiments.run_experiment(name, **kwargs)
        emit_json(jsonout.to_json(result))
        return
    # Validate first so a bad argument never flashes an empty progress bar.
    experiments.check_experiment_args(name, **kwargs)
    with progress_bar(
        TextColumn(f"sim {name}".replace("{", "{{").replace("}", "}}"), style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ) as bar:
        task = bar.add_task(name, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = experiments.run_experiment(name, progress=progress, **kwargs)
    _print_result(name, jsonout.to_json(result))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# CPU shares are fractions of one core in --json; a table prints them in % of one core, the unit every CPU
# figure is printed in (kistexp.metrics.catalogue.display)
_CPU_PREFIX = "cpu_core_fraction"


def _heading(key: str) -> str:
    if key.startswith(_CPU_PREFIX):
        from kistexp.metrics.catalogue import CPU_UNIT

        return f"{key.replace(_CPU_PREFIX, 'cpu', 1)} ({CPU_UNIT})"
    return key


def _cell(key: str, value: Any) -> str:
    if key.startswith(_CPU_PREFIX) and isinstance(value, (int, float)):
        from kistexp.metrics.catalogue import display

        return _fmt(float(value) * display("relay_cpu_utilization")[1])
    return _fmt(value)


def _record_name(record: dict[str, Any]) -> str:
    """Column heading of one point of a curve: its scheduler and/or interval."""
    parts = [str(record[k]) for k in ("scheduler",) if k in record]
    parts += [f"{record[k]} ms" for k in ("interval_ms",) if k in record]
    return " ".join(parts) or "value"


def _print_result(name: str, figures: dict[str, Any]) -> None:
    """Scalars as a two-column table, then each list of records (a curve) as a table with one
    column per point and one row per figure, which stays readable in 80 columns."""
    scalars = make_table(f"sim experiment {name}", ["figure", ("value", {"justify": "right"})], show_header=True)
    curves: list[tuple[str, list[dict[str, Any]]]] = []
    for key, value in figures.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            curves.append((key, value))
        else:
            add_row(scalars, _heading(key), _cell(key, value))
    if scalars.row_count:
        print_table(scalars)
    for key, records in curves:
        table = make_table(f"sim experiment {name}: {key}",
                           ["figure", *((_record_name(r), {"justify": "right"}) for r in records)], show_header=True)
        for figure in records[0]:
            add_row(table, _heading(figure), *(_cell(figure, record.get(figure)) for record in records))
        print_table(table)
