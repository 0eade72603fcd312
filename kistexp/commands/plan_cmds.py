"""`kistexp lint` and `kistexp show`: review an experiment plan before it runs."""

from __future__ import annotations

import datetime as dt

import typer

from kistexp.errors import KistexpError
from kistexp.output import add_row, emit_json, make_table, plain, print_table, say
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
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:  # 9999-12-31T23:59:59-05:00 is in year 10000 in UTC
        raise KistexpError(f"--now {now!r} is outside years 1 to 9999 in UTC") from None


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
            say(finding, style="red" if finding.severity == "error" else "yellow")
        summary = f"{len(report.files)} plan(s): {len(report.errors)} error(s), {len(report.warnings)} warning(s)"
        say(summary, style="red" if report.errors else "green")
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
    say(plain(plan.name, "bold"), f" ({plan.kind}) owner {plan.owner} <{plan.contact}>")
    say(f"parameters: {', '.join(plan.parameters)}; tor {plan.tor_versions}; "
        f"baseline {timeline.baseline_start:%Y-%m-%d %H:%M} .. {plan.start:%Y-%m-%d %H:%M} UTC")
    table = make_table("Timeline (UTC)", [
        (col, {"overflow": "fold"}) for col in ("stage", "values", "start", "end", "gate", "votes by",
                                                "first consensus", "relays 50%", "relays 100%", "clients 50%",
                                                "clients 100%")])
    for row in timeline.rows:
        add_row(
            table, row.stage, row.values_text, f"{row.start:%Y-%m-%d %H:%M}", f"{row.end:%Y-%m-%d %H:%M}", row.gate,
            f"{row.vote_deadline:%H:%M}", f"{row.first_valid_after:%m-%d %H:%M}", f"{row.relays_50:%H:%M}",
            f"{row.relays_100:%H:%M}", f"{row.clients_50:%H:%M}", f"{row.clients_100:%m-%d %H:%M}",
        )
    print_table(table)
    say("authorities:")
    for row in timeline.rows:
        say(f"  {row.stage}: {row.authority_action}")
    if timeline.revert:
        say(f"rollback: {timeline.revert}")


def register(app: typer.Typer) -> None:
    app.command("lint")(lint)
    app.command("show")(show)
