"""The HTML report: one self-contained page from Jinja2 templates (kistexp/report/templates/)
with every figure inlined as an SVG ``data:`` URI, readable without JavaScript or network."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path

import attrs
import jinja2
import markupsafe
import numpy as np

from kistexp.durations import format_duration
from kistexp.judge.estimators import side_statistic
from kistexp.metrics import catalogue
from kistexp.plan.model import UNSET, Plan
from kistexp.plan.timeline import build_timeline
from kistexp.report import attacks, plots
from kistexp.report.data import RELAY_COSTS, ExperimentData, PlanData
from kistexp.report.wording import VerdictText, collapse, plain_message, verdict_text
from kistexp.rollout.spec import LIVE_CADENCE
from kistexp.textsafe import visible

Progress = Callable[[float, str], None]
ISO = "%Y-%m-%d %H:%M UTC"
ISO_MIN = "%Y-%m-%d %H:%M"
MAX_CLASSES = 8


def _visible(value: object) -> object:
    # autoescape makes names from plans and journals text, not HTML; their control and bidi characters
    # are made visible as well, so the page shows what a terminal shows (a macro's output, Markup, is
    # rendered template text whose own expressions went through here already)
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return visible(value, keep="\n")
    return value


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("kistexp.report", "templates"),
                             autoescape=jinja2.select_autoescape(("html", "j2")), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, finalize=_visible)
    env.filters["utc"] = lambda t: "" if t is None else t.astimezone(dt.timezone.utc).strftime(ISO)
    # a change that rounds to zero is "+0.0 %", never "-0.0 %"
    env.filters["pct"] = lambda x: "" if x is None else f"{round(100 * x, 1) + 0.0:+.1f} %"
    env.filters["duration"] = format_duration
    env.filters["num"] = lambda x: "" if x is None else (f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}")
    return env


def _noop(_f: float, _what: str) -> None:
    pass


def limit_in_units(comparison: str, threshold: float, base: float) -> float:
    """The stage statistic at which a criterion fails, in the metric's units, for drawing
    (the inverse of the judge's effect for each comparison)."""
    return {"relative-increase": base * (1 + threshold), "relative-decrease": base * (1 - threshold),
            "absolute-increase": base + threshold, "absolute-decrease": base - threshold}.get(comparison, threshold)


def _stat(values: np.ndarray, statistic: str) -> float | None:
    return float(side_statistic(values, statistic, False)[0]) if values.size else None


def class_order(figures, metric: str, limit: int = MAX_CLASSES) -> list[str]:
    """The relay classes shown for ``metric``, coarse to fine, at most ``limit``."""
    seen = list(dict.fromkeys(f.relay_class for f in figures if f.metric == metric and f.relay_class))
    # "all", then positions ("exit", "guard+exit"), then scheduler and tick ("KIST HZ=250"), then the finest
    ranked = sorted(seen, key=lambda c: (c != "all", c.count(" "), seen.index(c)))
    return ranked[:limit]


def _cost_figures(figures, stages: list[str], measured) -> list[plots.Figure]:
    out = []
    for metric in RELAY_COSTS:
        classes = class_order(figures, metric)
        meas_classes = sorted({c for (m, c, _s) in measured if m == metric})
        classes += [c for c in meas_classes if c not in classes][: max(0, MAX_CLASSES - len(classes))]
        if not classes:
            continue
        predicted = {(f.stage, f.relay_class): (f.median, f.low, f.high) for f in figures if f.metric == metric}
        got = {(s, c): (float(np.median(v)), int(v.size)) for (m, c, s), v in measured.items()
               if m == metric and v.size}
        unit, scale = catalogue.display(metric)
        out.append(plots.relay_costs(metric, stages, classes, predicted, got, scale, unit))
    return out


def _cell(f) -> dict | None:
    """A predicted figure as a table cell shows it, in the metric's display unit."""
    if f is None:
        return None
    _unit, scale = catalogue.display(f.metric)
    return {"median": f.median * scale, "low": f.low * scale, "high": f.high * scale, "change": f.change}


def _cost_tables(figures, stages: list[str]) -> list[dict]:
    """One table per relay cost (relay classes down, stages across), its unit in the heading: a single
    table of every metric and class ran far past the page with five stages and eight classes."""
    tables = []
    for metric in RELAY_COSTS:
        unit, _scale = catalogue.display(metric)
        rows = []
        for cls in class_order(figures, metric):
            by = {f.stage: f for f in figures if f.metric == metric and f.relay_class == cls}
            rows.append({"label": cls, "cells": [_cell(by.get(s)) for s in stages]})
        if rows:
            networks = max((f.networks for f in figures if f.metric == metric), default=0)
            tables.append({"metric": metric, "unit": unit, "stages": stages, "rows": rows, "networks": networks})
    return tables


def _judged(spec, verdicts) -> list[tuple[str, VerdictText]]:
    """(detail, its plain words) of every verdict with an estimate, for engine messages quoting one."""
    by_name = {c.name: c for c in spec.criteria}
    out: dict[str, VerdictText] = {}
    for v in verdicts:
        c = by_name.get(v.criterion)
        if c is not None and v.effect is not None and v.detail and v.detail not in out:
            out[v.detail] = verdict_text(c, v)
    return list(out.items())


def _message(text: str, judged) -> dict:
    """An engine message as the page shows it: the effect in plain words, the judge's detail apart."""
    visible, statistics = plain_message(text or "", judged)
    return {"text": visible, "statistics": statistics}


def _intent_rows(intents) -> list[dict]:
    """Intents of one transition that asked the same, ended the same and carry the same evidence, as
    one row naming every authority: six identical rows per stage said the same thing six times."""
    rows: dict[tuple, dict] = {}
    for i in intents:
        key = (i["seq"], tuple(i["desired"].items()), i["valid_after"], i["state"], i["attempts"], i["evidence"])
        rows.setdefault(key, {**i, "authorities": []})["authorities"].append(i["authority"])
    return list(rows.values())


def experiment_context(data: ExperimentData, progress: Progress = _noop) -> dict:
    spec = data.spec
    param = spec.parameters[0] if spec.parameters else ""
    end = max([d["at"] for d in data.decisions] + [c["valid_after"] for c in data.consensuses]
              + [spec.baseline_start + spec.hour]) + 6 * spec.hour
    votes: dict[str, list] = {a: [] for a in spec.authorities}  # the legend names them in the plan's order
    for v in data.votes:
        value = None if not v["params"] else v["params"].get(param)
        votes.setdefault(v["authority"], []).append((v["valid_after"], value))
    votes = {a: points for a, points in votes.items() if points}
    consensus = [(c["valid_after"], None if not c["params"] else c["params"].get(param)) for c in data.consensuses]
    # stage spans as they happened: from the consensus that brought each transition in
    spans, begin, name = [], spec.baseline_start, "baseline"
    for t in data.transitions:
        spans.append((name, begin, t["valid_after"]))
        begin = t["valid_after"]
        name = data.stage_name(t["stage"]) if t["kind"] != "rollback" else f"rollback ({data.stage_name(t['stage'])})"
    spans.append((name, begin, end))
    progress(0.1, "timeline")
    marks = data.summary.marks if data.summary is not None else ()
    figures = {"timeline": plots.timeline(param, votes, consensus, end, spec.cadence, spans, marks) if param else None}
    # per stage and criterion: CDF against the baseline with the limit and the last verdict there
    last: dict[tuple[str, int], object] = {}
    for v in data.verdicts:
        last[(v.criterion, v.stage)] = v
    by_name = {c.name: c for c in spec.criteria}
    texts = {key: verdict_text(by_name[key[0]], v) for key, v in last.items() if key[0] in by_name}
    stages_run = sorted({s for (_m, s) in data.batches if s > 0})
    cdf_stages = []
    total = max(1, len(stages_run) * len(spec.criteria))
    for i, stage in enumerate(stages_run):
        sname = data.stage_name(stage)
        # a remark shared by several criteria (the same shortfall of samples) is written out once per stage
        notes = collapse([(c.name, texts[(c.name, stage)].note if (c.name, stage) in texts else "")
                          for c in spec.criteria])
        panels = []
        for j, c in enumerate(spec.criteria):
            progress(0.15 + 0.5 * (i * len(spec.criteria) + j) / total, f"CDF {c.name}, {sname}")
            base = data.batches.get((c.metric, 0), np.zeros(0))
            here = data.batches.get((c.metric, stage), np.zeros(0))
            text = texts.get((c.name, stage))
            if not here.size:
                panels.append(plots.Panel(f"{c.name}: {sname}", why=(
                    f"{c.name} ({c.metric}) in {sname}: no samples of this stage yet "
                    f"(baseline {base.size} samples); "
                    + ("no verdict in the journal" if text is None else f"verdict {text.line}"))))
                continue
            b_stat, s_stat = _stat(base, c.statistic), _stat(here, c.statistic)
            limit = None if b_stat is None else limit_in_units(c.comparison, c.threshold, b_stat)
            outcome = text.outcome if text is not None else "not judged"
            words = text.line if text is not None else "not judged: no verdict in the journal"
            fig = plots.criterion_cdf(c, sname, base, here, b_stat, s_stat, limit, outcome, words)
            if text is not None:
                effect = text.effect or "no estimate"
                caption = f"{text.outcome}: {effect}" + (f" (limit {text.limit})" if text.effect else "")
                caption += f"; {notes[j]}" if notes[j] else ""
            else:
                caption = "not judged: no verdict in the journal"
            panels.append(plots.Panel(f"{c.name}: {sname}", attrs.evolve(fig, caption=caption)))
        cdf_stages.append({"stage": sname, "panels": panels})
    effects = []
    names = dict(enumerate(data.stage_names))
    for c in spec.criteria:
        looks = [v for v in data.verdicts if v.criterion == c.name]
        if not looks:
            continue
        progress(0.7, f"effects {c.name}")
        if all(v.effect is None for v in looks):
            effects.append(plots.Panel(f"{c.name}: effect over time", why=_no_estimate(c, looks)))
        else:
            effects.append(plots.Panel(f"{c.name}: effect over time",
                                       plots.effects_over_time(c, looks, plots.effect_scale(c), names, marks)))
    progress(0.8, "relay costs")
    stage_list = list(data.stage_names)

    def arm(name: str) -> str:
        # a switchback's periods (treatment-3, control-3) pool into the arms the predictions name
        return re.sub(r"-\d+$", "", name) if spec.kind == "switchback" else name

    cost_stages = list(dict.fromkeys(arm(s) for s in stage_list))
    pooled: dict[tuple[str, str, str], list[np.ndarray]] = {}
    for (metric, cls, stage), values in data.measured.items():
        pooled.setdefault((metric, cls, arm(stage)), []).append(values)
    # a dry run's judged relay batches have no class: show them as "all"
    for (metric, stage), values in data.batches.items():
        if metric in RELAY_COSTS and not any(k[0] == metric for k in data.measured):
            pooled.setdefault((metric, "all", arm(data.stage_name(stage))), []).append(values)
    measured = {k: np.concatenate(v) for k, v in pooled.items()}
    costs = _cost_figures(data.figures, cost_stages, measured)
    progress(0.85, "what an attacker gains")
    anonymity = tuple(getattr(spec, "anonymity", ()))
    # each anonymity criterion's latest verdict per stage, under the name the predictions use
    outcomes = {(v.criterion, arm(data.stage_name(v.stage))): v.outcome for v in data.verdicts
                if any(a.name == v.criterion for a in anonymity)}
    attack_section = attacks.section(data.attacks, anonymity,
                                     f"kistexp simulate {data.path / 'plan.toml'} --dir {data.path}", outcomes)
    progress(0.9, "rollbacks")
    judged = _judged(spec, data.verdicts)
    rollbacks = [{"r": r, "cause": _message(r.cause, judged),
                  "figure": plots.rollback_recovery(r.plan.kind, r.plan.valid_after, r.at, spec.cadence)}
                 for r in data.rollbacks]
    decisions = [{**d, "stage_name": data.stage_name(d["stage"]), "why": _message(d["message"], judged)}
                 for d in data.decisions]
    transitions = [{**t, "why": _message(t["cause"], judged)} for t in data.transitions]
    criteria_rows = []
    cells = [(c, s) for c in spec.criteria for s in range(len(data.stage_names))]
    notes = dict(zip(cells, collapse([(f"{c.name} in {data.stage_name(s)}", texts[(c.name, s)].note
                                       if (c.name, s) in texts else "") for c, s in cells]), strict=True))
    for c in spec.criteria:
        row = {"name": c.name, "role": c.role, "rule": c.base.describe(), "cells": []}
        for s in range(len(data.stage_names)):
            text = texts.get((c.name, s))
            row["cells"].append(None if text is None else {"v": text, "note": notes[(c, s)]})
        criteria_rows.append(row)
    rehearsal_notes = collapse([(p.kind, p.note) for p in data.rehearsals])
    return {
        "title": f"{spec.plan_name}: {'dry run' if data.mode == 'dry-run' else 'experiment'} report",
        "data": data, "summary": data.summary, "spec": spec, "param": param, "figures": figures,
        "cdf_stages": cdf_stages, "effects": effects,
        "costs": costs, "cost_tables": _cost_tables(data.figures, cost_stages),
        "attacks": attack_section,
        "stages": stage_list,
        "rollbacks": rollbacks, "decisions": decisions, "transitions": transitions,
        "intents": _intent_rows(data.intents), "criteria_rows": criteria_rows,
        "rehearsals": list(zip(data.rehearsals, rehearsal_notes, strict=True)),
        "status": data.status.describe(),
        # one line per stretch without a majority-signed consensus, and per authority outage
        "outages": [o.describe(ISO_MIN) for o in data.health.outages],
        "authority_outages": [o.describe(ISO_MIN) for o in data.health.authority_outages],
        "last_event": max((d["at"] for d in data.decisions), default=None),
        # how the predictions were made, beside each place they are used: the judged samples of a run on
        # predicted metrics and the relay costs' bars (None: this experiment uses no predictions)
        "predictions_made": (data.predictions_made if data.figures or data.metrics == "predicted" else None),
    }


def _no_estimate(criterion, looks) -> str:
    """Why a criterion's effects plot would be empty, in one line."""
    latest = looks[-1].detail
    if all(v.reason == "insufficient_samples" for v in looks):
        return (f"{criterion.name} ({criterion.metric}): no estimate yet — 0 of {len(looks)} looks had enough "
                f"samples (min_samples {criterion.min_samples}; latest look: {latest})")
    return (f"{criterion.name} ({criterion.metric}): no estimate yet — none of {len(looks)} looks had one "
            f"(latest look: {latest})")


def plan_context(plan: Plan, data: PlanData, progress: Progress = _noop) -> dict:
    stages = list(data.stages)
    transitions = [f"transition:{s}" for s in stages if s != "baseline"]
    timeline = build_timeline(plan)
    metrics = list(dict.fromkeys(f.metric for f in data.figures))
    stage_rows, transition_rows, prediction_figures = [], [], []
    for i, metric in enumerate(metrics):
        progress(0.1 + 0.6 * i / max(1, len(metrics)), f"predictions {metric}")
        unit, scale = catalogue.display(metric)
        classes = [f.relay_class for f in data.figures if f.metric == metric]
        cls = "all" if "all" in classes else "" if "" in classes else classes[0]
        by = {f.stage: f for f in data.figures if f.metric == metric and f.relay_class == cls}
        if not by:
            continue
        label = f"{metric} ({unit})" + (f", relays: {cls}" if cls else "")
        stage_rows.append({"label": label, "cells": [_cell(by.get(s)) for s in stages]})
        transition_rows.append({"label": label, "cells": [_cell(by.get(s)) for s in transitions]})
        prediction_figures.append(plots.predictions(
            metric, stages, {s: (f.median, f.low, f.high) for s, f in by.items()}, scale, unit))
    progress(0.75, "relay costs")
    costs = _cost_figures(data.figures, stages, {})
    progress(0.8, "what an attacker gains")
    attack_section = attacks.section(data.attacks, getattr(plan, "anonymity", ()),
                                     f"kistexp simulate {plan.path} --dir {data.source}")
    progress(0.85, "timeline")
    param = plan.parameters[0]
    base_value = dict(plan.baseline.values).get(param)
    consensus = [(timeline.baseline_start, None if base_value == UNSET else base_value)]
    consensus += [(r.first_valid_after, None if dict(r.values).get(param) == UNSET else dict(r.values).get(param))
                  for r in timeline.rows]
    spans = [("baseline", timeline.baseline_start, plan.start)] + [(r.stage, r.start, r.end) for r in timeline.rows]
    end = max(r.end for r in timeline.rows)
    planned_votes = {a: [(t, v) for t, v in consensus] for a in plan.authorities.participating}
    timeline_fig = plots.timeline(param, planned_votes, consensus, end, LIVE_CADENCE, spans)
    networks = max((f.networks for f in data.figures), default=0)
    return {
        "title": f"{plan.name}: plan report (predictions before any run)", "plan": plan, "stages": stages,
        "timeline": timeline, "timeline_figure": timeline_fig,
        "predictions_table": {"stages": stages, "rows": stage_rows},
        # predictions made without transition windows have none to show
        "transition_table": ({"stages": transitions, "rows": transition_rows}
                             if any(c for r in transition_rows for c in r["cells"]) else None),
        "prediction_figures": prediction_figures, "costs": costs, "cost_tables": _cost_tables(data.figures, stages),
        "source": data.source, "networks": networks, "attacks": attack_section,
        "predictions_made": data.predictions_made,
    }


def render_experiment(data: ExperimentData, progress: Progress = _noop) -> str:
    html = environment().get_template("experiment.html.j2").render(**experiment_context(data, progress))
    progress(1.0, "done")
    return html


def render_plan(plan: Plan, data: PlanData, progress: Progress = _noop) -> str:
    html = environment().get_template("plan.html.j2").render(**plan_context(plan, data, progress))
    progress(1.0, "done")
    return html


def default_output(exp_path: Path) -> Path:
    return Path(exp_path) / "report.html"
