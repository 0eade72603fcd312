"""`kistexp judge`: PASS / FAIL / INCONCLUSIVE for rollback criteria (docs/judge.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import typer
from typer.core import TyperGroup

from kistexp.errors import KistexpError
from kistexp.jsonout import to_json
from kistexp.output import add_row, emit_json, make_table, plain, print_table, progress_bar, say

_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow"}


class _PlanDefaultGroup(TyperGroup):
    """`kistexp judge PLAN --dir EXP` without a subcommand name runs `judge plan`."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args.insert(0, "plan")
        return super().resolve_command(ctx, args)


judge_app = typer.Typer(
    cls=_PlanDefaultGroup,
    help="Judge rollback criteria: `judge PLAN --dir EXP` for a plan's stored metrics, "
         "`judge compare` for two sample files.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(judge_app, name="judge")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _interval(v) -> str:
    return "-" if v.ci_low is None else f"[{_fmt(v.ci_low)}, {_fmt(v.ci_high)}]"


def _measured(statistic: str, metric: str) -> str:
    """``median TTLB 1 MiB``: the statistic and what it is of."""
    from kistexp.judge.inputs import ONIONPERF_LABELS
    from kistexp.metrics import catalogue

    m = catalogue.get(metric) if metric else None
    name = ONIONPERF_LABELS.get(metric, metric)
    unit = f" ({m.unit})" if m is not None and m.unit != "ratio" else ""
    return f"{statistic} {name}{unit}" if name else f"{statistic} of the samples"


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None or not math.isfinite(ratio) else (ratio - 1.0) * 100.0


def _pct(ratio: float | None) -> str:
    p = _percent(ratio)
    return "-" if p is None else f"{p:+.1f} %"


def effect_label(what: str, v) -> str:
    """What the effect column is, in words: the ratio (and its relative change in plain %), the
    difference or the stage's own statistic."""
    if v.comparison.startswith("relative"):
        text = f"{what}, stage / baseline, ratio {_fmt(v.effect)} = {_pct(v.effect)} change"
        if v.ci_low is not None:
            text += f" [{_pct(v.ci_low)}, {_pct(v.ci_high)}]"
        return text
    if v.comparison.startswith("absolute"):
        return f"{what}, stage - baseline, difference {_fmt(v.effect)} in the samples' units"
    return f"{what}, stage window: {_fmt(v.effect)} (compared with the level {v.threshold:g})"


def _outcome(v):
    text = v.outcome.upper() + (f" ({v.reason})" if v.reason and v.reason != "undecided" else "")
    return plain(text, _STYLE[v.outcome])


@judge_app.command("compare")
def compare(
    baseline: str = typer.Option(None, "--baseline",
                                 help="Baseline samples: FILE, FILE:COLUMN or FILE@METRIC (not for above/below)."),
    stage: str = typer.Option(..., "--stage", help="Stage samples: FILE, FILE:COLUMN or FILE@METRIC."),
    statistic: str = typer.Option(..., "--statistic",
                                  help="mean, median, p10, p25, p75, p90, p95, p99 or shift (Hodges-Lehmann)."),
    comparison: str = typer.Option(..., "--comparison",
                                   help="relative-increase, relative-decrease, absolute-increase, "
                                        "absolute-decrease, above or below."),
    threshold: float = typer.Option(..., "--threshold", help="Fraction for relative (0.10 = 10 %), else units."),
    min_samples: int = typer.Option(200, "--min-samples", help="Fewer per side: INCONCLUSIVE."),
    sequential: bool = typer.Option(False, "--sequential",
                                    help="Judge as one look of an always-valid sequential analysis."),
    method: str = typer.Option("obf", "--method", help="Sequential method: obf (alpha spending) or mixture."),
    planned: int = typer.Option(0, "--planned-samples",
                                help="Stage samples expected at the planned end (default: the baseline's size)."),
    state_file: Path = typer.Option(None, "--state",
                                    help="Sequential state file: read if present, written after the look."),
    final: bool = typer.Option(False, "--final", help="This is the planned last look: spend all that is left."),
    alpha: float = typer.Option(0.05, "--alpha", help="Error per direction (FAIL and PASS)."),
    estimator: str = typer.Option("default", "--estimator",
                                  help="default (order statistics) or bootstrap (bootstrap SEs)."),
    server: str = typer.Option(None, "--server",
                               help="OnionPerf sources: only transfers to onion or to public servers."),
    vantage_point: str = typer.Option(None, "--source", metavar="NAME",
                                      help="OnionPerf sources: only samples from this vantage point "
                                           "(OnionPerf instance, e.g. op-hk6a)."),
    as_json: bool = typer.Option(False, "--json", help="The verdict as JSON."),
) -> None:
    """Compare a stage window with a baseline window for one criterion."""
    from kistexp.judge import CriterionSpec, SequentialState, judge
    from kistexp.judge.inputs import mixing_warnings, read_source

    if baseline is None and comparison not in ("above", "below"):
        raise KistexpError(f"--baseline is needed for {comparison} (only above/below compare with a level)")
    from kistexp.judge.model import MAX_PLANNED, check_alpha

    check_alpha(alpha, "--alpha")  # before the samples are read: 0, NaN or 0.6 are refused in one line
    if not 0 <= planned <= MAX_PLANNED:
        raise KistexpError(f"--planned-samples {planned}: from 0 (the baseline's size) to {MAX_PLANNED:g}")
    if min_samples < 0:
        raise KistexpError(f"--min-samples {min_samples}: 0 or more")
    base_src = None if comparison in ("above", "below") else read_source(baseline, server=server,
                                                                         vantage_point=vantage_point)
    stage_src = read_source(stage, server=server, vantage_point=vantage_point)
    base = None if base_src is None else base_src.window
    stage_w = stage_src.window
    input_warnings = mixing_warnings(base_src, stage_src)
    for w in input_warnings:
        say(f"kistexp: warning: {w}", err=True)
    crit = CriterionSpec(statistic, comparison, threshold, min_samples, stage_src.metric)
    state = None
    if state_file is not None:
        from kistexp.safeio import check_output_path

        check_output_path(state_file, "the sequential state")  # refused before judging, not after
    if state_file is not None and state_file.is_file():
        state = _load_state(state_file)
    elif sequential or state_file is not None:
        n_plan = planned or (base.n if base is not None else stage_w.n)
        state = SequentialState.plan(planned_stage=n_plan, method=method, alpha_fail=alpha, alpha_pass=alpha)
    v = judge(crit, base, stage_w, sequential_state=state, alpha_fail=alpha, alpha_pass=alpha, final=final,
              estimator=estimator)
    if state_file is not None and v.state is not None:
        from kistexp.safeio import write_atomic

        write_atomic(state_file, (json.dumps(to_json(v.state), indent=2) + "\n").encode(), "the sequential state")
    what = _measured(statistic, stage_src.metric)
    if as_json:
        emit_json({**to_json(v), "effect_label": effect_label(what, v),
                   "effect_percent": _percent(v.effect) if v.comparison.startswith("relative") else None,
                   "input_warnings": input_warnings})
        return
    table = make_table(f"{what}: {comparison} {threshold:g}",
                       ("verdict", "effect", "interval", "bound", "n baseline", "n stage", "excluded"))
    add_row(table, _outcome(v), _fmt(v.effect), _interval(v), _fmt(v.bound), str(v.n_baseline), str(v.n_stage),
            str(v.excluded))
    print_table(table)
    say("effect: ", effect_label(what, v))
    say(f"rule: {v.rule}")
    say(f"detail: {v.detail}")
    for w in v.warnings:
        say(plain("warning:", "yellow"), f" {w}")


def _load_state(path: Path):
    from kistexp.judge import SequentialState
    from kistexp.safeio import read_bounded_text

    try:
        # a million looks of a mixture state are about 20 MB of JSON
        data = json.loads(read_bounded_text(path, 32 * 1024 * 1024, "sequential state"))
        return SequentialState(data["method"], float(data["planned_stage"]), float(data["alpha_fail"]),
                               float(data["alpha_pass"]), float(data["target_stage"]),
                               tuple(float(t) for t in data["fractions"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KistexpError(f"{path}: not a sequential state file ({exc})") from None


@judge_app.command("plan")
def judge_plan_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file whose criteria to judge."),
    exp_dir: Path = typer.Option(..., "--dir", help="Experiment directory with the stored metrics."),
    now: str = typer.Option(None, "--now", help="Judge as of this UTC time (default: now)."),
    sequential: bool = typer.Option(False, "--sequential",
                                    help="Replay the hourly looks of an always-valid sequential analysis."),
    as_json: bool = typer.Option(False, "--json", help="Verdicts as JSON."),
) -> None:
    """Judge every criterion of PLAN: baseline window vs each stage window, by value in effect."""
    from kistexp.commands.plan_cmds import _parse_now
    from kistexp.expdir import ExperimentDir
    from kistexp.judge.plan import judge_plan
    from kistexp.metrics.store import MetricStore
    from kistexp.plan import load_plan

    plan = load_plan(plan_path)
    exp = ExperimentDir.open(exp_dir)
    store = MetricStore(exp.db)
    with progress_bar(as_json=as_json) as bar:
        task = bar.add_task("judging", total=None)
        results = judge_plan(plan, store, now=_parse_now(now), sequential=sequential,
                             progress=lambda i, n: bar.update(task, completed=i, total=n))
    exp.close()
    if as_json:
        emit_json({"plan": plan.name, "verdicts": [
            {"stage": r.stage, "criterion": r.criterion, "metric": r.metric,
             "window_start": r.window_start, "window_end": r.window_end, **to_json(r.verdict)}
            for r in results]})
        return
    # stage and criterion names are the plan's: plain cells, never markup
    table = make_table(f"{plan.name}: criteria judged", ("stage", "criterion", "verdict", "effect", "interval",
                                                         "bound", "n baseline", "n stage", "excluded"))
    for r in results:
        v = r.verdict
        add_row(table, r.stage, r.criterion, _outcome(v), _fmt(v.effect), _interval(v), _fmt(v.bound),
                str(v.n_baseline), str(v.n_stage), str(v.excluded))
    print_table(table)
    if not results:
        say("no stage has begun yet")
