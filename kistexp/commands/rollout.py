"""`kistexp dry-run`, `run`, `status`, `history`, `pause|resume|promote|abort|retry|undo` and
`rollback --dry-run`: rehearse, drive and steer a staged rollout (docs/rollouts.md)."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import typer
from rich.table import Table

from kistexp.errors import KistexpError
from kistexp.output import console, emit_json

_ISO = "%Y-%m-%d %H:%M"


def _t(value) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime(_ISO)
    return "" if value is None else str(value)


def dry_run_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file."),
    exp: str = typer.Option(None, "--dir", help="Experiment directory (its predictions; the journal is written here)."),
    inject: list[str] = typer.Option([], "--inject", help="stage=N:METRIC=+X%, authority=NAME:down@dayD, "
                                     "authority=NAME:stale@dayD, metrics=SOURCE:gap@dayD+Hh (repeatable)."),
    command: list[str] = typer.Option([], "--command", help="An operator command at a time of the plan: "
                                      "WHEN:COMMAND[=ARG,...], e.g. day9+2h:pause, stage2+3h:abort=step-back, "
                                      "day20:undo=1 (repeatable)."),
    seed: int = typer.Option(1, "--seed", help="Seed of the synthetic samples."),
    predictions: str = typer.Option(None, "--predictions", help="Read predictions from this experiment directory."),
    stop_at_gates: bool = typer.Option(False, "--stop-at-gates", help="Do not approve manual gates."),
    replay: list[str] = typer.Option([], "--replay", help="Recorded series (OnionPerf JSON, operator CSV, "
                                     "MetricsPort URL) to judge on their own timestamps (repeatable)."),
    align: str = typer.Option(None, "--align", help="Replay: the baseline's start, ISO UTC "
                              "(default: the hour of the first recorded sample)."),
    as_json: bool = typer.Option(False, "--json", help="Decisions, rollbacks and timings as JSON."),
) -> None:
    """Rehearse the whole plan on the virtual clock against embedded fake authorities and predicted metrics."""
    from kistexp.plan import load_plan
    from kistexp.rollout.dryrun import dry_run

    plan = load_plan(plan_path)
    if replay:
        _replay(plan, replay, exp, align, not stop_at_gates, as_json)
        return
    if exp is None and predictions is None:
        raise KistexpError(f"{plan_path}: a dry run draws from the population's predictions: make them with "
                           f"`kistexp simulate {plan_path} --dir EXP`, then pass --dir EXP")
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from kistexp.output import progress_bar

    with progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), as_json=as_json) as bar:
        task = bar.add_task("rehearsing", total=1.0)
        r = dry_run(plan, Path(exp) if exp else None, injections=inject, seed=seed,
                    predictions_from=Path(predictions) if predictions else None, approve_gates=not stop_at_gates,
                    progress=lambda f, what: bar.update(task, completed=f, description=what), commands=command)
    if as_json:
        emit_json(r.to_json())
        return
    table = Table(title=f"dry run of {r.plan}", show_lines=False)
    for col in ("time (UTC)", "what", "stage", "detail"):
        table.add_column(col)
    rows = [(c["valid_after"], "consensus", "", " ".join(f"{k}={v}" for k, v in (c["params"] or {}).items()))
            for c in r.consensus_changes]
    rows += [(d["at"], d["decision"], str(d["stage"]), d["message"]) for d in r.decisions]
    for at, what, stage, detail in sorted(rows, key=lambda x: x[0]):
        table.add_row(_t(at), what, stage, detail)
    console.print(table)
    for rb in r.rollbacks:
        console.print(f"rollback {rb['kind']} from stage {rb['from_stage']} at {rb['at']}: "
                      f"{', '.join(rb['authorities_must_act'])} must act before {rb['act_before']}; "
                      f"consensus {rb['valid_after']}; 99 % of relays back at {rb['relays_99pct']}, "
                      f"clients at {rb['clients_99pct']}", highlight=False, soft_wrap=True)
    counts = "; ".join(f"{c}: " + ", ".join(f"{n} {o}" for o, n in sorted(v.items()))
                       for c, v in r.verdict_counts.items())
    console.print(f"verdicts: {counts}", highlight=False, soft_wrap=True)
    console.print(f"[bold]{r.status}[/bold] ({r.wall_s:.1f} s; journal {r.journal})", highlight=False)


def _replay(plan, files: list[str], exp: str | None, align: str | None, approve: bool, as_json: bool) -> None:
    from kistexp.rollout.replay import replay

    at = None
    if align is not None:
        try:
            at = dt.datetime.fromisoformat(align.replace("Z", "+00:00"))
        except ValueError:
            raise KistexpError(f"--align {align!r}: not an ISO 8601 time") from None
        at = at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)
    r = replay(plan, files, Path(exp) if exp else None, align=at, approve_gates=approve)
    if as_json:
        emit_json(r.to_json())
        return
    console.print(f"replay of {', '.join(files)} through {r.plan}: recorded {_t(r.recorded_from)} .. "
                  f"{_t(r.recorded_until)} UTC; {r.alignment}", highlight=False, soft_wrap=True)
    for w in r.windows:
        console.print(f"  {w['name']}: {_t(w['start'])} .. {_t(w['end'])}", highlight=False)
    fb = r.first_rollback
    if fb is None:
        console.print(f"no rollback would have fired ({r.dry_run['status']})", highlight=False)
        return
    v = fb["verdict"] or {}
    console.print(f"[bold]rollback {fb['kind']}[/bold] would have fired at {_t(fb['at'])} UTC, hour "
                  f"{fb['hour_in_stage']:.0f} of stage {fb['stage']} ({fb['stage_name']}): criterion "
                  f"{fb['criterion']!r} {v.get('detail', '')}; {', '.join(fb['authorities_must_act'])} must act; "
                  f"relays back after {fb['relays_back_after_s'] / 3600:.1f} h", highlight=False, soft_wrap=True)


def run_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file."),
    exp: str = typer.Option(..., "--dir", help="Experiment directory (created, or resumed from its journal)."),
    authorities: str = typer.Option("fake", "--authorities", help="fake | local | instructions."),
    interval: int = typer.Option(10, "--interval", help="Fake authorities, or a new local tor network (>= 10): "
                                 "seconds per voting round (= plan hour)."),
    localnet: str = typer.Option(None, "--localnet", help="--authorities local: drive this local tor network "
                                 "(kistexp localnet up DIR) instead of making one in EXP/localnet."),
    accept_plan_change: bool = typer.Option(False, "--accept-plan-change", help="Continue with an edited plan."),
    predictions: str = typer.Option(None, "--predictions", help="Read predictions from this experiment directory."),
    as_json: bool = typer.Option(False, "--json", help="Final status as JSON."),
) -> None:
    """Drive the plan in real time; rerun on the same directory to resume after any stop."""
    from kistexp.rollout.runs import live_run, status_view

    live_run(Path(plan_path), Path(exp), authorities, interval_s=interval, accept_plan_change=accept_plan_change,
             predictions_from=Path(predictions) if predictions else None, argv=sys.argv,
             localnet=Path(localnet) if localnet else None)
    view = status_view(Path(exp))
    emit_json(view) if as_json else console.print(view["summary"], highlight=False)


def status_cmd(
    exp: str = typer.Argument(..., metavar="DIR", help="Experiment directory."),
    as_json: bool = typer.Option(False, "--json", help="Status as JSON."),
) -> None:
    """Where the rollout is (read-only; works while a run is active)."""
    from kistexp.rollout.runs import status_view

    view = status_view(Path(exp))
    if as_json:
        emit_json(view)
        return
    from kistexp.output import print_table
    from kistexp.report.data import verdict_looks
    from kistexp.report.html import effect_limit, effect_origin
    from kistexp.report.terminal import status_table, times_table
    from kistexp.rollout.runs import load_spec

    spec, _, _ = load_spec(Path(exp))
    limits = {c.name: effect_limit(c.comparison, c.threshold) for c in spec.criteria}
    origins = {c.name: effect_origin(c.comparison) for c in spec.criteria}
    print_table(status_table(view, verdict_looks(exp), limits, origins=origins))
    print_table(times_table(view))


def history_cmd(
    exp: str = typer.Argument(..., metavar="DIR", help="Experiment directory."),
    as_json: bool = typer.Option(False, "--json", help="History as JSON."),
) -> None:
    """Every decision and operator command, in order (read-only)."""
    from kistexp.rollout.runs import history_view

    view = history_view(Path(exp))
    if as_json:
        emit_json(view)
        return
    from kistexp.output import print_table
    from kistexp.report.terminal import history_table

    print_table(history_table(view))


def _command(kind: str, exp: str, args: dict, as_json: bool) -> None:
    from kistexp.rollout.runs import queue_command

    cid, message = queue_command(Path(exp), kind, args, dt.datetime.now(dt.timezone.utc),
                                 os.environ.get("USER", ""))
    out = {"command": kind, "id": cid, "state": "queued", "expected": message,
           "note": "applied by the running engine at its next step (or when `kistexp run` resumes)"}
    emit_json(out) if as_json else console.print(f"{kind} queued (#{cid}): {message}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("dry-run")(dry_run_cmd)
    app.command("run")(run_cmd)
    app.command("status")(status_cmd)
    app.command("history")(history_cmd)

    @app.command("pause")
    def pause(exp: str = typer.Argument(..., metavar="DIR"),
              freeze: bool = typer.Option(False, "--freeze", help="Also suspend automatic rollbacks."),
              as_json: bool = typer.Option(False, "--json")) -> None:
        """Stop forward motion (automatic rollbacks still fire unless --freeze)."""
        _command("pause", exp, {"freeze": freeze}, as_json)

    @app.command("resume")
    def resume(exp: str = typer.Argument(..., metavar="DIR"), as_json: bool = typer.Option(False, "--json")) -> None:
        """Clear an operator's pause."""
        _command("resume", exp, {}, as_json)

    @app.command("promote")
    def promote(exp: str = typer.Argument(..., metavar="DIR"),
                full: bool = typer.Option(False, "--full", help="Jump to the last stage's values."),
                force: bool = typer.Option(False, "--force", help="Promote despite a latest FAIL."),
                as_json: bool = typer.Option(False, "--json")) -> None:
        """End the current stage now (overrides gates and inconclusive verdicts)."""
        _command("promote", exp, {"full": full, "force": force}, as_json)

    @app.command("abort")
    def abort(exp: str = typer.Argument(..., metavar="DIR"),
              kind: str = typer.Option("", "--kind", help="step-back, revert-default, remove-param or baseline."),
              as_json: bool = typer.Option(False, "--json")) -> None:
        """Roll back (to the baseline by default), then stop."""
        _command("abort", exp, {"kind": kind}, as_json)

    @app.command("retry")
    def retry(exp: str = typer.Argument(..., metavar="DIR"), as_json: bool = typer.Option(False, "--json")) -> None:
        """Restart the aborted stage with fresh counters."""
        _command("retry", exp, {}, as_json)

    @app.command("undo")
    def undo(exp: str = typer.Argument(..., metavar="DIR"),
             to_stage: str = typer.Option("", "--to-stage", help="A stage number or 'baseline' (default: previous)."),
             fast: bool = typer.Option(False, "--fast", help="Skip that stage's measuring."),
             as_json: bool = typer.Option(False, "--json")) -> None:
        """Go back to an earlier stage and continue from there."""
        _command("undo", exp, {"to_stage": to_stage, "fast": fast}, as_json)

    @app.command("rollback")
    def rollback(exp: str = typer.Argument(..., metavar="DIR"),
                 dry: bool = typer.Option(False, "--dry-run", help="Only say what each kind would do, now."),
                 as_json: bool = typer.Option(False, "--json")) -> None:
        """What each rollback kind would do now: targets, consensus, authorities, ETAs (read-only)."""
        from kistexp.rollout.runs import rollback_preview

        if not dry:
            raise KistexpError("rollback acts through the running engine: use `kistexp abort DIR --kind K`, "
                               "or --dry-run to preview")
        plans = rollback_preview(Path(exp), dt.datetime.now(dt.timezone.utc))
        if as_json:
            emit_json(plans)
            return
        for p in plans:
            console.print(f"{p['kind']:<15} -> {p['consensus']}  act: {', '.join(p['authorities_must_act']) or '-'}"
                          f" before {p['act_before']}; relays 99 % {p['relays_99pct']}, clients 99 % "
                          f"{p['clients_99pct']}", highlight=False, soft_wrap=True)
