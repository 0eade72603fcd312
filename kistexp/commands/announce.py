"""`kistexp announce PLAN`: the tor-relays announcement, the per-authority instructions and the
status-page entry of a plan, from the plan and its predictions (docs/reports.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kistexp.output import emit_json, say


def announce(
    plan_path: Path = typer.Argument(..., help="Experiment plan (TOML)."),
    exp_dir: Path = typer.Option(None, "--dir", help="Experiment directory holding the plan's predictions "
                                 "(default: experiments/<plan name>, as kistexp simulate)."),
    fmt: str = typer.Option("text", "--format", help="text or markdown."),
    output: Path = typer.Option(None, "-o", "--output", help="Write to this file instead of stdout."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (both formats included)."),
) -> None:
    """Render what the network team sends before an experiment: what changes and why, the schedule in UTC,
    what operators should watch (CPU, RAM, bandwidth with the predicted change per relay class) and how to
    report it (kistexp-operator-report/1 CSV); each participating authority's ConsensusParams line and
    deadline; and the status-page entry."""
    from kistexp.plan.loader import load_plan
    from kistexp.report.announce import FORMATS, announcement_json, render
    from kistexp.report.data import ReportError, load_plan_predictions
    from kistexp.safeio import write_atomic

    if fmt not in FORMATS:
        raise ReportError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    plan = load_plan(plan_path)
    data = load_plan_predictions(plan, exp_dir if exp_dir is not None else Path("experiments") / plan.name)
    if as_json:
        doc = announcement_json(plan, data)
        if output is not None:
            write_atomic(output, doc[fmt].encode("utf-8"), "the announcement", ReportError)
            doc["written"] = str(output)
        emit_json(doc)
        return
    text = render(plan, data, fmt)
    if output is not None:
        write_atomic(output, text.encode("utf-8"), "the announcement", ReportError)
        say(f"announcement written: {output}")
        return
    sys.stdout.write(text)


def register(app: typer.Typer) -> None:
    app.command("announce")(announce)
