"""`kistexp dry-run`, `run`, `status`, `history`, `pause|resume|promote|abort|retry|undo` and
`rollback --dry-run`: rehearse, drive and steer a staged rollout (docs/rollouts.md)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
from pathlib import Path

import typer
from rich.table import Table

from kistexp.errors import KistexpError
from kistexp.jsonout import to_json
from kistexp.output import console, emit_json, plain, say

_ISO = "%Y-%m-%d %H:%M"


def _t(value) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime(_ISO)
    return "" if value is None else str(value)


def _health(exp: Path):
    """The journal's authority health (``kistexp.rollout.watch.HealthSummary``), or None when the
    directory holds no rollout journal to read it from."""
    from kistexp.rollout.journal import JournalReader
    from kistexp.rollout.runs import NoRolloutError
    from kistexp.rollout.watch import health_summary

    try:
        JournalReader.of_experiment(exp).close()
    except KistexpError:
        return None  # no journal at all: told by the command's own reading
    # only a journal without a rollout has no health to tell; a damaged row or a plan copy gone is
    # refused in its one line, never shown as a status without the authorities' health
    try:
        return health_summary(exp)
    except NoRolloutError:
        return None


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
        if predictions is not None:
            raise KistexpError("--predictions with --replay: a replay judges the recordings, not predictions")
        _replay(plan, replay, exp, align, not stop_at_gates, as_json, inject, command)
        return
    if exp is None and predictions is None:
        raise KistexpError(f"{plan_path}: a dry run draws from the population's predictions: make them with "
                           f"`kistexp simulate {plan_path} --dir EXP`, then pass --dir EXP")
    import tempfile

    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from kistexp.output import progress_bar

    # without --dir the journal lives in a scratch directory kept until its health is read
    with tempfile.TemporaryDirectory(prefix="kistexp-dry-run-") as scratch:
        with progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                          TimeElapsedColumn(), as_json=as_json) as bar:
            task = bar.add_task("rehearsing", total=1.0)
            r = dry_run(plan, Path(exp) if exp else Path(scratch) / "exp", injections=inject, seed=seed,
                        predictions_from=Path(predictions) if predictions else None, approve_gates=not stop_at_gates,
                        progress=lambda f, what: bar.update(task, completed=f, description=what), commands=command)
        health = _health(Path(r.journal).parent)
    if as_json:
        emit_json({**to_json(r), **({"authority_health": to_json(health)} if health else {})})
        return
    from kistexp.dirauth.paramsline import ConsensusParams
    from kistexp.output import add_row, make_table, print_table

    # plain cells: decision messages and outage lines carry the plan's names, never markup
    table = make_table(f"dry run of {r.plan}", (("time (UTC)", {"no_wrap": True}), "what", "stage", "detail"),
                       show_lines=False)
    rows = [(c["valid_after"], "consensus", "", ConsensusParams(c["params"]).format()
             if c["params"] is not None else "none published (no majority-signed consensus)")
            for c in r.consensus_changes]
    rows += [(o.start, "no-consensus", "", o.describe()) for o in (health.outages if health else ())]
    rows += [(d["at"], d["decision"], str(d["stage"]), d["message"]) for d in r.decisions]
    for at, what, stage, detail in sorted(rows, key=lambda x: x[0]):
        add_row(table, _t(at), what, stage, detail)
    print_table(table)
    for rb in r.rollbacks:
        say(f"rollback {rb['kind']} from stage {rb['from_stage']} at {rb['at']}: "
            f"{', '.join(rb['authorities_must_act'])} must act before {rb['act_before']}; "
            f"consensus {rb['valid_after']}; 99 % of relays back at {rb['relays_99pct']}, "
            f"clients at {rb['clients_99pct']}")
    counts = "; ".join(f"{c}: " + ", ".join(f"{n} {o}" for o, n in sorted(v.items()))
                       for c, v in r.verdict_counts.items())
    say(f"verdicts: {counts}")
    for o in health.outages if health else ():
        say(o.describe(health.fmt), style="bold red")
    say(plain(r.status, "bold"), f" ({r.wall_s:.1f} s; journal {r.journal})")


def _replay(plan, files: list[str], exp: str | None, align: str | None, approve: bool, as_json: bool,
            inject: list[str], command: list[str]) -> None:
    from kistexp.rollout.replay import replay

    at = None
    if align is not None:
        try:
            at = dt.datetime.fromisoformat(align.replace("Z", "+00:00"))
        except ValueError:
            raise KistexpError(f"--align {align!r}: not an ISO 8601 time") from None
        at = at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)
    r = replay(plan, files, Path(exp) if exp else None, align=at, approve_gates=approve, injections=inject,
               commands=command)
    if as_json:
        emit_json(to_json(r))
        return
    # file, stage and criterion names are printed as text (plain), never as markup or escape sequences
    console.print(plain(f"replay of {', '.join(files)} through {r.plan}: recorded {_t(r.recorded_from)} .. "
                        f"{_t(r.recorded_until)} UTC; {r.alignment}"), soft_wrap=True)
    for w in r.windows:
        console.print(plain(f"  {w['name']}: {_t(w['start'])} .. {_t(w['end'])}"))
    fb = r.first_rollback
    if fb is None:
        console.print(plain(f"no rollback would have fired ({r.dry_run['status']})"))
        return
    v = fb["verdict"] or {}
    line = plain(f"rollback {fb['kind']}", "bold").append_text(plain(
        f" would have fired at {_t(fb['at'])} UTC, hour "
        f"{fb['hour_in_stage']:.0f} of stage {fb['stage']} ({fb['stage_name']}): criterion "
        f"{fb['criterion']!r} {v.get('detail', '')}; {', '.join(fb['authorities_must_act'])} must act; "
        f"relays back after {fb['relays_back_after_s'] / 3600:.1f} h"))
    console.print(line, soft_wrap=True)


def run_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file."),
    exp: str = typer.Option(..., "--dir", help="Experiment directory (created, or resumed from its journal)."),
    authorities: str = typer.Option("fake", "--authorities", help="fake | local | instructions."),
    interval: int = typer.Option(10, "--interval", help="Fake authorities, or a new local tor network (>= 10): "
                                 "seconds per voting round (= plan hour)."),
    localnet: str = typer.Option(None, "--localnet", help="--authorities local: drive this local tor network "
                                 "(kistexp localnet up DIR) instead of making one in EXP/localnet."),
    accept_plan_change: bool = typer.Option(False, "--accept-plan-change", help="Continue with an edited plan."),
    predictions: str = typer.Option(None, "--predictions", help="--metrics predicted: read predictions from this "
                                    "experiment directory."),
    metrics: str = typer.Option("measured", "--metrics", help="measured (the network's own measurements) or "
                                "predicted (drawn from the population's predictions, as a dry run)."),
    source: list[str] = typer.Option([], "--source", help="A measuring instrument, KIND:NAME=URL_OR_PATH "
                                     "(onionperf, metricsport, proc, prometheus), or consensus-archive=URL "
                                     "(repeatable)."),
    certs: str = typer.Option(None, "--certs", help="The authorities' key certificates that consensus-archive "
                              "sources are checked against."),
    as_json: bool = typer.Option(False, "--json", help="Nothing while running; the final status as JSON."),
    json_lines: bool = typer.Option(False, "--json-lines", help="Each event as one JSON object per line, then "
                                    "the final status as one."),
    remind_every: float = typer.Option(300.0, "--remind-every", help="While paused, a reminder line every S "
                                       "seconds (0: none)."),
    notify_command: str = typer.Option(None, "--notify-command", help="Run this command (no shell; words as "
                                       "shlex splits them) with the event as JSON on stdin and in KISTEXP_EVENT "
                                       "on each pause, criterion failure, rollback, outage and the run's end."),
    notify_url: str = typer.Option(None, "--notify-url", help="POST each such event as JSON to this URL."),
    metrics_port: int = typer.Option(None, "--metrics-port", help="Serve Prometheus metrics of the rollout on "
                                     "this port (0: any free one) while it runs."),
    metrics_address: str = typer.Option("127.0.0.1", "--metrics-address", help="Address the metrics server "
                                        "listens on."),
) -> None:
    """Drive the plan in real time; rerun on the same directory to resume after any stop.

    Prints what happens as it happens (stages, looks, intents, pauses and what resolves them,
    rollbacks, authority outages); Ctrl-C or SIGTERM stops it cleanly, and a rerun resumes."""
    from kistexp.rollout.notify import Notifier
    from kistexp.rollout.runs import live_run, status_view

    if as_json and json_lines:
        raise KistexpError("--json and --json-lines: pick one")
    if not 0 <= remind_every <= 7 * 86400:  # NaN too: it silenced every reminder
        raise KistexpError(f"--remind-every {remind_every:g}: seconds, 0 (no reminders) to 604800 (a week)")
    if not 2 <= interval <= 3600:  # 10^14 overflowed the stage durations in a traceback
        raise KistexpError(f"--interval {interval}: real seconds per plan hour, 2 to 3600 (3600 runs in real time)")
    notifier = Notifier(notify_command, notify_url, warn=_warn)  # a malformed option is refused before anything
    exporter = None
    if metrics_port is not None:
        from kistexp.rollout.exporter import Exporter

        exporter = Exporter(Path(exp), metrics_port, metrics_address)  # a port in use: one line, nothing started
    stopper = _Stopper()
    feed_thread = None
    ended, outcome = "", None
    try:
        stopper.install()
        if exporter is not None and not (as_json or json_lines):
            say(f"metrics of this rollout at {exporter.url}")
        notifier.start()
        feed_thread = _start_feed(Path(exp), exp, as_json, json_lines, notifier, remind_every, interval, authorities)
        outcome = live_run(Path(plan_path), Path(exp), authorities, interval_s=interval,
                           accept_plan_change=accept_plan_change,
                           predictions_from=Path(predictions) if predictions else None, argv=sys.argv,
                           localnet=Path(localnet) if localnet else None, metrics=metrics, sources=tuple(source),
                           certs=Path(certs) if certs else None)
    except KeyboardInterrupt:
        ended = "SIGTERM" if stopper.signum == signal.SIGTERM else "Ctrl-C"
    except BaseException as exc:
        ended = f"error: {exc}" if isinstance(exc, KistexpError) else f"error: {type(exc).__name__}"
        raise
    finally:
        stopper.finishing = True  # a second signal now would cut the clean-up short: it is ignored
        if feed_thread is not None:
            feed_thread.stop()
            if feed_thread.error is not None:
                _warn(f"the event feed stopped: {feed_thread.error}")
        end = {"kind": "end", "at": dt.datetime.now(dt.timezone.utc), "severity": "info" if not ended else "warning",
               "experiment_dir": exp, "stopped_by": ended or None,
               "text": f"run ended: {outcome.describe()}" if outcome is not None else
               f"run stopped ({ended}); the journal keeps its place"}
        notifier.submit(end)
        notifier.close(5.0 if ended else 20.0)
        if exporter is not None:
            exporter.close()
        stopper.restore()
    if ended:
        say(f"kistexp: stopped by {ended}; the journal keeps the run's place: rerun "
            f"`kistexp run {plan_path} --dir {exp}` to resume", err=True)
        raise typer.Exit(143 if ended == "SIGTERM" else 130)
    view = status_view(Path(exp))
    if json_lines:
        _json_line({"kind": "end", "status": view})
    elif as_json:
        emit_json(view)
    else:
        console.print(plain(view["summary"]))


def _warn(message: str) -> None:
    say(f"kistexp: warning: {message}", err=True)


def _json_line(obj: dict) -> None:
    import json

    from kistexp.output import _default

    sys.stdout.write(json.dumps(obj, default=_default, sort_keys=True) + "\n")
    sys.stdout.flush()


class _Stopper:
    """SIGTERM takes the path of Ctrl-C: both raise KeyboardInterrupt in the main thread, so
    ``live_run``'s ``finally`` closes the run's row and stops any network kistexp started. A second
    signal while that clean-up runs is ignored (with a line saying so) rather than cut it short."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.finishing = False
        self._old: dict[int, object] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (an embedding caller): its own handling stays
                return

    def _handle(self, signum, _frame) -> None:
        if self.finishing or self.signum is not None:
            say("kistexp: already stopping (the run's place is kept; kill -9 stops at once)", err=True)
            return
        self.signum = signum
        raise KeyboardInterrupt

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


_STYLES = {"critical": "bold red", "warning": "yellow"}


def _start_feed(exp_path: Path, shown: str, as_json: bool, json_lines: bool, notifier, remind_every: float,
                interval: int, mode: str):
    """The feed thread of a run: lines on stdout (or JSON lines), and the events that need a person
    to the notifier. A resumed run shows only what is new."""
    from kistexp.rollout.watch import Feed, FeedThread

    feed = Feed(exp_path, shown)
    if (exp_path / "experiment.db").is_file():
        feed.prime()

    def emit(ev) -> None:
        if ev.notify:
            notifier.submit({**to_json(ev), "experiment_dir": shown})
        if json_lines:
            _json_line(to_json(ev))
        elif not as_json:
            say(ev.line(feed.ctx.fmt if feed.ctx is not None else _ISO), style=_STYLES.get(ev.severity))
            sys.stdout.flush()  # a pipe (a log, a test) sees each line as it happens

    poll = 2.0 if mode == "instructions" else min(1.0, max(0.2, interval / 10))
    return FeedThread(feed, emit, poll_s=poll, reminder_s=remind_every).start()


def status_cmd(
    exp: str = typer.Argument(..., metavar="DIR", help="Experiment directory."),
    as_json: bool = typer.Option(False, "--json", help="Status as JSON (with --watch: one JSON object per line, "
                                 "each time it changes)."),
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until the rollout ends or Ctrl-C."),
    every: float = typer.Option(2.0, "--interval", help="--watch: seconds between refreshes (at least 0.5)."),
) -> None:
    """Where the rollout is, with the authorities' health (read-only; works while a run is active)."""
    if watch:
        _watch_status(exp, every, as_json)
        return
    view, health = _status_with_health(exp)
    if as_json:
        emit_json(view)
        return

    for part in _status_parts(exp, view, health):
        _print_part(part)


def _status_with_health(exp: str) -> tuple[dict, object]:
    from kistexp.rollout.runs import status_view

    view = status_view(Path(exp))
    health = _health(Path(exp))
    if health is not None:
        view["authority_health"] = to_json(health)
    return view, health


def _status_parts(exp: str, view: dict, health) -> list:
    """The status as printed: the criteria table, the times, the authorities' last round and any
    stretch without a majority-signed consensus."""
    from kistexp.judge.model import effect_limit, effect_origin
    from kistexp.report.data import verdict_looks
    from kistexp.report.terminal import status_table, times_table
    from kistexp.rollout.runs import load_spec

    spec, _, _ = load_spec(Path(exp))
    # anonymity criteria too: their verdicts (on the predictions, at each stage's entry) are rows like any
    judged = (*spec.criteria, *spec.anonymity)
    limits = {c.name: effect_limit(c.comparison, c.threshold) for c in judged}
    origins = {c.name: effect_origin(c.comparison) for c in judged}
    # a narrow terminal gets shorter sparklines and bars, so the table keeps its columns whole
    narrow = {"width": 10, "bar_width": 5} if console.width < 100 else {}
    roles = {c.name: c.role for c in judged}
    parts: list = [status_table(view, verdict_looks(exp), limits, origins=origins, roles=roles, **narrow),
                   times_table(view)]
    if health is not None:
        parts.append(health.last_round_text())
        current = health.current_outage
        for o in health.outages:
            prefix = "NOW: " if o is current else "earlier: "
            parts.append(plain(prefix + o.describe(health.fmt), "bold red" if o is current else "yellow"))
    return parts


def _watch_status(exp: str, every: float, as_json: bool) -> None:
    """``status --watch``: a live view at a terminal (rich Live), plain blocks when piped, JSON lines
    with --json; each refresh at most every ``every`` seconds; ends at a terminal state or Ctrl-C."""
    import json
    import time

    from rich.console import Group
    from rich.live import Live

    from kistexp.output import _default
    from kistexp.rollout.state import TERMINAL

    if not every >= 0.5 or every > 3600:
        raise KistexpError(f"--interval {every:g}: between 0.5 and 3600 seconds")
    view, health = _status_with_health(exp)  # not an experiment: one line, before any screen is drawn
    last = None

    def render():
        stamp = f"{exp} at {dt.datetime.now(dt.timezone.utc):%H:%M:%S} UTC (every {every:g} s; Ctrl-C to stop)"
        return Group(*(_renderable(p) for p in _status_parts(exp, view, health)), _renderable(stamp))

    try:
        if as_json:
            while True:
                text = json.dumps(view, default=_default, sort_keys=True)
                if text != last:
                    sys.stdout.write(text + "\n")
                    sys.stdout.flush()
                    last = text
                if view["state"] in TERMINAL:
                    return
                time.sleep(every)
                view, health = _refresh(exp, view, health)
        elif console.is_terminal:
            with Live(render(), console=console, auto_refresh=False, transient=False) as live:
                while view["state"] not in TERMINAL:
                    time.sleep(every)
                    view, health = _refresh(exp, view, health)
                    live.update(render(), refresh=True)
        else:
            while True:
                key = json.dumps(view, default=_default, sort_keys=True)
                if key != last:  # a log gets a block when something changed, not one per refresh
                    say(f"--- {exp} at {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
                    for part in _status_parts(exp, view, health):
                        _print_part(part)
                    sys.stdout.flush()
                    last = key
                if view["state"] in TERMINAL:
                    return
                time.sleep(every)
                view, health = _refresh(exp, view, health)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a watch ends: the last view stays on the screen


def _print_part(part) -> None:
    """A table as a table; a line as one line (never hard-wrapped: pagers and logs fold it)."""
    console.print(_renderable(part), soft_wrap=not isinstance(part, Table))


def _renderable(part):
    return plain(part) if isinstance(part, str) else part


def _refresh(exp: str, view: dict, health) -> tuple[dict, object]:
    """A new reading; the previous one when the journal cannot be read this time (busy a moment). A row
    the run wrote since that is damaged ends the watch with its one line, as the first reading would."""
    import sqlite3

    from kistexp.rollout.journal import JournalDamageError

    try:
        return _status_with_health(exp)
    except JournalDamageError:
        raise
    except (KistexpError, sqlite3.OperationalError):
        return view, health


def history_cmd(
    exp: str = typer.Argument(..., metavar="DIR", help="Experiment directory."),
    as_json: bool = typer.Option(False, "--json", help="History as JSON."),
) -> None:
    """Every decision and operator command, in order, with the authorities' outages (read-only)."""
    from kistexp.rollout.runs import history_view

    view = history_view(Path(exp))
    health = _health(Path(exp))
    if health is not None:
        view["consensus_outages"] = to_json(health.outages)
        view["authority_outages"] = to_json(health.authority_outages)
    if as_json:
        emit_json(view)
        return
    from kistexp.output import print_table
    from kistexp.report.terminal import history_table

    outages = []
    if health is not None:
        outages = [{"at": o.start, "what": "no-consensus", "detail": o.describe(health.fmt)} for o in health.outages]
        outages += [{"at": o.start, "what": "authority-down", "detail": o.describe(health.fmt)}
                    for o in health.authority_outages]
    print_table(history_table({**view, "outages": outages}))


def _command(kind: str, exp: str, args: dict, as_json: bool) -> None:
    from kistexp.rollout.runs import queue_command

    cid, message = queue_command(Path(exp), kind, args, dt.datetime.now(dt.timezone.utc),
                                 os.environ.get("USER", ""))
    out = {"command": kind, "id": cid, "state": "queued", "expected": message,
           "note": "applied by the running engine at its next step (or when `kistexp run` resumes)"}
    emit_json(out) if as_json else console.print(plain(f"{kind} queued (#{cid}): {message}"))


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
              kind: str = typer.Option("", "--kind", help="step-back, revert-default, remove-param, baseline, or "
                                       "hold (pause, votes unchanged)."),
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
        from kistexp.rollout.rollback import with_health
        from kistexp.rollout.runs import load_spec

        now = dt.datetime.now(dt.timezone.utc)
        plans = rollback_preview(Path(exp), now)
        health = _health(Path(exp))
        if health is not None:
            spec, st, _ = load_spec(Path(exp))
            plans = [with_health(p, spec, st.values, st.stage, now, health.down_since(), health.fmt) for p in plans]
        if as_json:
            emit_json(plans)
            return
        for p in plans:
            acting = p.get("authorities_must_act_marked", p["authorities_must_act"])
            alt = p.get("without_down")
            instead = ""
            if alt is not None:
                instead = (f"; with the down ones unchanged: {', '.join(alt['authorities_must_act']) or '-'}"
                           if alt["possible"] else "; not possible without the down ones")
            say(f"{p['kind']:<15} -> {p['consensus']}  act: {', '.join(acting) or '-'} before {p['act_before']}"
                f"{instead}; relays 99 % {p['relays_99pct']}, clients 99 % {p['clients_99pct']}")
        if health is not None and health.last is not None:
            say(health.last_round_text())
