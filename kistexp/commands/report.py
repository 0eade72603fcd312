"""`kistexp report EXP|PLAN -o FILE`: the HTML report of an experiment directory (dry run or live),
or of a plan before any run from the predictions of `kistexp simulate` (docs/reports.md)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

from kistexp.output import emit_json, progress_bar, say


def report(
    target: Path = typer.Argument(..., help="Experiment directory (report of its run) or plan TOML (report "
                                  "before any run, from its predictions)."),
    output: Path = typer.Option(None, "-o", "--output", help="HTML file to write (default: EXP/report.html; "
                                "for a plan: EXP/plan-report.html)."),
    exp_dir: Path = typer.Option(None, "--dir", help="For a plan: the experiment directory holding its "
                                 "predictions (default: experiments/<plan name>, as kistexp simulate)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Write one self-contained HTML file (figures inline, no network, no JavaScript): for an experiment,
    the parameter's timeline in votes and consensus with adoption, each criterion's CDF against the baseline
    per stage, the judge's effects over time, relay costs per class predicted and measured, the journal's
    decisions and actions, and the rollback rehearsal; for a plan, its predictions and timeline. Both show
    what simulated traffic-analysis attacks gain at each stage against the baseline, when kistexp simulate
    stored them."""
    from kistexp.report.data import ReportError, load_experiment, load_plan_predictions
    from kistexp.report.html import render_experiment, render_plan
    from kistexp.safeio import write_atomic

    with progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), as_json=as_json) as bar:
        task = bar.add_task("reading", total=1.0)

        def progress(fraction: float, what: str) -> None:
            bar.update(task, completed=fraction, description=what)

        if target.is_dir():
            kind = "experiment"
            data = load_experiment(target)
            out = output if output is not None else target / "report.html"
            html = render_experiment(data, progress)
        else:
            from kistexp.plan.loader import load_plan

            kind = "plan"
            plan = load_plan(target)
            where = exp_dir if exp_dir is not None else Path("experiments") / plan.name
            pdata = load_plan_predictions(plan, where)
            out = output if output is not None else where / "plan-report.html"
            html = render_plan(plan, pdata, progress)
        write_atomic(out, html.encode("utf-8"), "the report", ReportError)
    figures = html.count('src="data:image/')
    if as_json:
        emit_json({"report": str(out), "kind": kind, "bytes": len(html.encode("utf-8")), "figures": figures})
    else:
        say(f"report written: {out} ({figures} figures)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
