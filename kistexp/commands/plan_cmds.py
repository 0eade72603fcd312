"""`kistexp lint` and `kistexp show`: review an experiment plan before it runs."""

from __future__ import annotations

import datetime as dt

import typer
from rich.text import Text

from kistexp.errors import KistexpError
from kistexp.jsonout import to_json
from kistexp.metrics import catalogue
from kistexp.output import add_row, emit_json, make_table, plain, print_table, say
from kistexp.plan import load_plan
from kistexp.plan.lint import Detectable, change_text, detectable_changes, limit_text, lint_paths
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
            "findings": to_json(report.findings),
            # per stage and criterion: the smallest change FAILed with 80 % power at the stage's end
            "detectable": to_json(report.detectable),
        })
    else:
        for finding in report.findings:
            say(finding, style="red" if finding.severity == "error" else "yellow")
        summary = f"{len(report.files)} plan(s): {len(report.errors)} error(s), {len(report.warnings)} warning(s)"
        say(summary, style="red" if report.errors else "green")
    raise typer.Exit(report.exit_code)


def _whole(text: str):
    """A table cell that is never wrapped: a date and its time stay on one line."""
    cell = plain(text)
    cell.no_wrap = True
    return cell


def show(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable timeline."),
) -> None:
    """Print the plan's timeline: stages, consensus rounds, propagation and what each stage can detect."""
    plan = load_plan(plan_path)
    timeline = build_timeline(plan)
    detectable = detectable_changes(plan)
    if as_json:
        emit_json({**to_json(timeline), "detectable": to_json(detectable)})
        return
    say(plain(plan.name, "bold"), f" ({plan.kind}) owner {plan.owner} <{plan.contact}>")
    say(f"parameters: {', '.join(plan.parameters)}; tor {plan.tor_versions}; "
        f"baseline {timeline.baseline_start:%Y-%m-%d %H:%M} .. {plan.start:%Y-%m-%d %H:%M} UTC")
    times = [t for r in timeline.rows for t in (r.start, r.end, r.first_valid_after, r.clients_100)]
    years = sorted({t.year for t in times})
    # one year: dates without it (the title has it), so the tables fit 80 columns
    day = "%m-%d %H:%M" if len(years) == 1 else "%Y-%m-%d %H:%M"
    when = f"UTC, {years[0]}" if len(years) == 1 else "UTC"
    dated = {"min_width": len(f"{times[0]:{day}}")}
    stages = make_table(f"Stages ({when})", [("stage", {"overflow": "fold"}), ("values", {"overflow": "fold"}),
                                             ("start", dated), ("end", dated), "gate"], title_justify="left")
    for row in timeline.rows:
        add_row(stages, row.stage, row.values_text, _whole(f"{row.start:{day}}"), _whole(f"{row.end:{day}}"),
                row.gate)
    print_table(stages)
    # two-line headings: the columns are as narrow as their times
    heads = ["votes\nby", "first\nconsensus", "relays\n50%", "relays\n100%", "clients\n50%", "clients\n100%"]
    spread = make_table(f"Consensus and propagation ({when}; times on the stage's first day unless dated)",
                        [("stage", {"overflow": "fold"}), *((Text(h), {"no_wrap": True}) for h in heads)],
                        title_justify="left")
    for row in timeline.rows:
        add_row(spread, row.stage, *(_whole(t) for t in (
            f"{row.vote_deadline:%H:%M}", f"{row.first_valid_after:{day}}", f"{row.relays_50:%H:%M}",
            f"{row.relays_100:%H:%M}", f"{row.clients_50:%H:%M}", f"{row.clients_100:{day}}")))
    print_table(spread)
    _print_detectable(plan, detectable)
    say("authorities:")
    for row in timeline.rows:
        say(f"  {row.stage}: {row.authority_action}")
    if timeline.revert:
        say(f"rollback: {timeline.revert}")


def _print_detectable(plan, detectable: tuple[Detectable, ...]) -> None:
    """One row per criterion and distinct detectable change, naming its stages ("all" when every stage
    has it): a plan of many stages of one length stays a few lines."""
    if not detectable:
        return
    stages = list(dict.fromkeys(d.stage for d in detectable))
    table = make_table("Smallest change each stage detects (80 % power to FAIL at its end)",
                       [("criterion", {"overflow": "fold"}), ("limit", {"no_wrap": True}),
                        ("detectable", {"no_wrap": True}), (Text("power to FAIL\nat 2x limit"), {"no_wrap": True}),
                        ("stages", {"overflow": "fold"})], title_justify="left")
    criteria = {c.name or c.metric: c for c in plan.criteria}
    rows: dict[tuple[str, str, str], list[str]] = {}
    for d in detectable:
        crit, metric = criteria[d.criterion], catalogue.get(d.metric)
        rows.setdefault((d.criterion, change_text(crit, metric, d.change), f"{d.p_fail * 100:.0f} %"),
                        []).append(d.stage)
    for (name, change, p_fail), names in rows.items():
        where = "all" if names == stages and len(stages) > 1 else ", ".join(names)
        add_row(table, name, limit_text(criteria[name], catalogue.get(criteria[name].metric)), change, p_fail, where)
    print_table(table)


def register(app: typer.Typer) -> None:
    app.command("lint")(lint)
    app.command("show")(show)
