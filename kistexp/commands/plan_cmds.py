"""`kistexp lint` and `kistexp show`: review an experiment plan before it runs."""

from __future__ import annotations

import datetime as dt

import typer
from rich.table import Table

from kistexp.errors import KistexpError
from kistexp.output import console, emit_json
from kistexp.plan import load_plan
from kistexp.plan.lint import lint_paths
from kistexp.plan.timeline import build_timeline

_ISO = "%Y-%m-%dT%H:%M:%SZ"


def _parse_now(now: str | None) -> dt.datetime | None:
    if now is None:
        return None
    try:
        value = dt.datetime.fromisoformat(now.replace("Z", "+00:00"))
    except ValueError:
        raise KistexpError(f"--now {now!r} is not an RFC 3339 date-time") from None
    if value.tzinfo is None:
        raise KistexpError(f"--now {now!r} needs a UTC offset, e.g. 2027-01-01T00:00:00Z")
    return value.astimezone(dt.timezone.utc)


def lint(
    plans: list[str] = typer.Argument(..., help="Plan files; cross-file rules check them together."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable findings."),
    now: str = typer.Option(None, "--now", help="Judge start times against this UTC time instead of now."),
) -> None:
    """Check plans for schema errors and Tor-aware problems (exit 1 on errors)."""
    report = lint_paths(plans, now=_parse_now(now))
    if as_json:
        emit_json({
            "files": list(report.files),
            "errors": len(report.errors),
            "warnings": len(report.warnings),
            "findings": [
                {"code": f.code, "severity": f.severity, "file": f.file, "line": f.line, "key": f.key,
                 "message": f.message}
                for f in report.findings
            ],
        })
    else:
        for finding in report.findings:
            style = "red" if finding.severity == "error" else "yellow"
            console.print(f"[{style}]{finding}[/{style}]", highlight=False, soft_wrap=True)
        summary = f"{len(report.files)} plan(s): {len(report.errors)} error(s), {len(report.warnings)} warning(s)"
        console.print(("[red]" if report.errors else "[green]") + summary, highlight=False)
    raise typer.Exit(report.exit_code)


def show(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable timeline."),
) -> None:
    """Print the plan's timeline: stages, consensus rounds and propagation."""
    plan = load_plan(plan_path)
    timeline = build_timeline(plan)
    if as_json:
        emit_json(timeline.to_dict())
        return
    console.print(f"[bold]{plan.name}[/bold] ({plan.kind}) owner {plan.owner} <{plan.contact}>", highlight=False)
    console.print(f"parameters: {', '.join(plan.parameters)}; tor {plan.tor_versions}; "
                  f"baseline {timeline.baseline_start:%Y-%m-%d %H:%M} .. {plan.start:%Y-%m-%d %H:%M} UTC",
                  highlight=False)
    table = Table(title="Timeline (UTC)")
    for col in ("stage", "values", "start", "end", "gate", "votes by", "first consensus", "relays 50%",
                "relays 100%", "clients 50%", "clients 100%"):
        table.add_column(col, overflow="fold")
    for row in timeline.rows:
        table.add_row(
            row.stage, row.values_text, f"{row.start:%Y-%m-%d %H:%M}", f"{row.end:%Y-%m-%d %H:%M}", row.gate,
            f"{row.vote_deadline:%H:%M}", f"{row.first_valid_after:%m-%d %H:%M}", f"{row.relays_50:%H:%M}",
            f"{row.relays_100:%H:%M}", f"{row.clients_50:%H:%M}", f"{row.clients_100:%m-%d %H:%M}",
        )
    console.print(table)
    console.print("authorities:", highlight=False)
    for row in timeline.rows:
        console.print(f"  {row.stage}: {row.authority_action}", highlight=False)
    if timeline.revert:
        console.print(f"rollback: {timeline.revert}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("lint")(lint)
    app.command("show")(show)
