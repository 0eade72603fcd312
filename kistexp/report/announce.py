"""The announcement of a plan: the tor-relays mail, the per-authority instructions and the
status-page entry (status.torproject.org "Network experiments": what changed, when it starts
and stops, what to look for and how to report it), from the plan, its timeline and the
predictions of ``kistexp simulate``. Plain text and Markdown from Jinja2 templates."""

from __future__ import annotations

import datetime as dt

import jinja2

from kistexp import params as tor_params
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.durations import format_duration
from kistexp.jsonout import to_json
from kistexp.metrics import catalogue
from kistexp.metrics.collectors import operator_report
from kistexp.plan.model import UNSET, Plan
from kistexp.plan.timeline import authorities_needed, build_timeline
from kistexp.population.costs import BASELINE_RSS_BYTES
from kistexp.report.attacks import leakier_lines
from kistexp.report.data import RELAY_COSTS, PlanData
from kistexp.report.html import class_order
from kistexp.textsafe import csv_row, markdown, one_line, visible

FORMATS = ("text", "markdown")
# What an operator reports, in the order of the kistexp-operator-report/1 columns they fill in.
REPORT_COLUMNS = ("relay_fingerprint", "window_start_utc", "window_end_utc", "phase", "param_name",
                  "param_value", "cpu_pct_core_mean", "rss_mib_mean", "read_mbit_s_mean", "write_mbit_s_mean",
                  "cpu_source", "bw_source", "notes")
# Operators look for their own class ("exit linux HZ=250 >100 Mbit/s"): the coarse ones and the finest.
ANNOUNCE_CLASSES = 16
EXAMPLE_FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"
ISO = "%Y-%m-%d %H:%M UTC"
# what a reader needs to read a metric's figures right, printed under its table
NOTES = {
    "relay_cpu_utilization": "100 % of one core is one core kept busy. The simulated relays carry less traffic than "
                             "real ones (their network is a sample with slower links), so compare the change, not "
                             "the level.",
    "relay_rss_bytes": f"{BASELINE_RSS_BYTES / 1e6:.0f} MB of every figure is tor's process baseline in the model, "
                       "the same for every relay, so the classes look alike; the run interval changes only the "
                       "cells queued inside tor, which is what the change shows.",
    "relay_bandwidth_bytes_per_s": "Bytes read plus written per second.",
}
# at full NIC rates the links are the relays' own: the CPU note says what still differs from the live network
FULL_RATE_NOTES = {
    "relay_cpu_utilization": "100 % of one core is one core kept busy. The simulated relays run at their own NIC "
                             "rates but carry the traffic of a sampled network, not the live one's, so compare the "
                             "change, not the level.",
}


def _safe_output(value: object) -> object:
    # every expression's text: no control character reaches the mail or the page, whatever a template
    # forgets (line breaks stay: the CSV example and wrapped notes have them)
    return visible(value, keep="\n") if isinstance(value, str) else value


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("kistexp.report", "templates"), autoescape=False,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, finalize=_safe_output)
    # text from the plan and the predictions (stage names, relay classes, owner, contact, description):
    # `line` keeps it on its line in the text announcement, `md` shows it literally in Markdown (no live
    # HTML, no extra table column)
    env.filters["line"] = one_line
    env.filters["md"] = markdown
    env.filters["utc"] = lambda t: t.astimezone(dt.timezone.utc).strftime(ISO)
    env.filters["pct"] = lambda x: "n/a" if x is None else f"{100 * x:+.1f} %"
    env.filters["num"] = lambda x: f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return env


def _params_line(values) -> str:
    """The torrc line an authority sets: its values as tor writes them in its vote."""
    return f"ConsensusParams {ConsensusParams.from_pairs((k, v) for k, v in values if v != UNSET)}"


def _instruction(values) -> str:
    sets = [f"{k}={v}" for k, v in values if v != UNSET]
    drops = [k for k, v in values if v == UNSET]
    parts = []
    if sets:
        parts.append(f"set {' '.join(sets)} in your ConsensusParams line (keep your other keys)")
    if drops:
        parts.append(f"remove {', '.join(drops)} from your ConsensusParams line")
    return " and ".join(parts)


def _watch(metric: str, by: dict, stages: list[str], classes: list[str], full_rates: bool = False) -> dict:
    """One metric's rows: per relay class the baseline A (median over networks) and per stage the change X
    (median over networks of each network's own change, ``summarize_predictions``) with the value it
    implies, A x (1 + X), so that every printed pair adds up. The stage's own median over networks can
    come from another network than the baseline's (networks differ by their sampled relays far more than
    by the values) and is not printed beside the change."""
    unit, scale = catalogue.display(metric)
    rows = []
    for cls in classes:
        base = by.get(("baseline", metric, cls))
        if base is None:
            continue
        cells = []
        for s in stages:
            f = by.get((s, metric, cls))
            if f is None:
                continue
            value = base.median * (1 + f.change) if f.change is not None else f.median
            cells.append({"stage": s, "median": value * scale, "change": f.change})
        if cells:
            rows.append({"relay_class": cls, "baseline": base.median * scale, "stages": cells})
    note = FULL_RATE_NOTES.get(metric, NOTES[metric]) if full_rates else NOTES[metric]
    return {"metric": metric, "unit": unit, "rows": rows, "note": note}


def context(plan: Plan, data: PlanData) -> dict:
    timeline = build_timeline(plan)
    stages = list(timeline.rows)
    names = [s for s in data.stages if s != "baseline"]
    by = {(f.stage, f.metric, f.relay_class): f for f in data.figures}
    made = data.predictions_made
    full_rates = made.run is not None and not made.fast
    watch = [_watch(metric, by, names, class_order(data.figures, metric, ANNOUNCE_CLASSES), full_rates)
             for metric in RELAY_COSTS]
    n = len(plan.authorities.authorities)
    authorities = []
    for auth in plan.authorities.participating:
        steps = [{"stage": r.stage, "line": _params_line(r.values), "what": _instruction(r.values),
                  "before": r.vote_deadline, "valid_after": r.first_valid_after} for r in stages]
        authorities.append({"nickname": auth, "steps": steps})
    others = [a.nickname for a in plan.authorities.authorities if a.nickname not in plan.authorities.participating]
    start, end = stages[0].start if stages else plan.start, max(r.end for r in stages) if stages else plan.start
    changes = [r for r in stages if r.stage != "baseline"]
    # an operator pastes the example into a spreadsheet: its cells go through the CSV rule as any export's
    example = ",".join(REPORT_COLUMNS) + "\n" + ",".join(csv_row([
        EXAMPLE_FINGERPRINT, f"{plan.start:%Y-%m-%dT%H:00:00Z}",
        f"{plan.start + dt.timedelta(hours=1):%Y-%m-%dT%H:00:00Z}", "treatment", plan.parameters[0],
        str(next((v for _k, v in changes[0].values if v != UNSET), "")) if changes else "", "12.5", "850",
        "40.1", "41.3", "proc", "vnstat", ""])) + "\n"
    return {
        "plan": plan, "timeline": timeline, "stages": stages, "changes": changes, "watch": watch,
        "authorities": authorities, "others": others, "others_mode": plan.authorities.others,
        "need": authorities_needed(n, plan.authorities.others), "n_authorities": n,
        "start": start, "end": end, "report_format": operator_report.FORMAT, "report_columns": REPORT_COLUMNS,
        "report_example": example, "networks": max((f.networks for f in data.figures), default=0),
        "description": " ".join(plan.description.split()),
        "params": [{"name": n, "meaning": e.meaning if e else "", "read_by": e.read_by if e else "",
                    "torrc_override": e.torrc_override if e else ""}
                   for n, e in ((n, tor_params.get(n)) for n in plan.parameters)],
        "lead": format_duration(stages[0].first_valid_after - stages[0].vote_deadline) if stages else "",
        # stages where a simulated attack does significantly better than at the baseline (docs/anonymity.md)
        "leakier": "; ".join(leakier_lines(data.attacks)),
        # fast-mode predictions (NICs scaled down) get a caution beside what operators should watch
        "predictions_made": made,
    }


def render(plan: Plan, data: PlanData, fmt: str = "text") -> str:
    template = {"text": "announce.txt.j2", "markdown": "announce.md.j2"}[fmt]
    return _env().get_template(template).render(**context(plan, data))


def announcement_json(plan: Plan, data: PlanData) -> dict:
    """``kistexp announce --json``: the schedule, what to watch, each authority's steps and the report
    format, how the predictions it quotes were made (``predictions_made``), with the announcement in both
    formats."""
    ctx = context(plan, data)
    return to_json({
        "plan": plan.name, "start": ctx["start"], "end": ctx["end"], "schedule": ctx["timeline"].rows,
        "watch": ctx["watch"], "authorities": ctx["authorities"],
        "report_format": ctx["report_format"], "report_columns": ctx["report_columns"],
        "report_example": ctx["report_example"], "predictions_made": data.predictions_made.as_json(),
        "text": render(plan, data, "text"), "markdown": render(plan, data, "markdown"),
    })
