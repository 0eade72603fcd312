"""Terminal views of a rollout for people: rich tables with sparklines and bars, built with
kistexp.output (all text printed literally). The commands' --json output is left as it is."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.output import add_row, make_table, plain
from kistexp.plan.model import UNSET

SPARKS = "▁▂▃▄▅▆▇█"
OUTCOME_STYLE = {"pass": "green", "fail": "bold red", "inconclusive": "yellow", "error": "magenta"}
ISO = "%Y-%m-%d %H:%M"


def sparkline(values: Sequence[float | None], lo: float | None = None, hi: float | None = None) -> str:
    """One character per value, ▁ (lowest) to █ (highest); a missing value is a space."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return " " * len(values)
    lo = min(finite) if lo is None else lo
    hi = max(finite) if hi is None else hi
    span = hi - lo
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
            continue
        k = 0 if span <= 0 else int((min(max(v, lo), hi) - lo) / span * (len(SPARKS) - 1) + 0.5)
        out.append(SPARKS[k])
    return "".join(out)


def bar(fraction: float, width: int = 12) -> str:
    """A horizontal bar of ``fraction`` in [0, 1] (clipped), eighths of a cell resolved."""
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    rest = int((cells - full) * 8)
    return ("█" * full + ("▏▎▍▌▋▊▉"[rest - 1] if rest else "")).ljust(width)


def _t(value: dt.datetime | None) -> str:
    return "" if value is None else value.strftime(ISO)


def _values_text(values: Mapping[str, object]) -> str:
    """The stage's values as the consensus params line carries them, then the ones left unset:
    "KISTSchedRunInterval=2 (cc_alg unset)"."""
    held = ConsensusParams.from_pairs((k, int(str(v))) for k, v in values.items() if v != UNSET)
    unset = [k for k, v in values.items() if v == UNSET]
    text = str(held) if len(held) else "none set"
    return text + (f" ({', '.join(unset)} unset)" if unset else "")


def status_table(view: Mapping, looks: Mapping[str, Sequence[Mapping]], thresholds: Mapping[str, float],
                 width: int = 24, origins: Mapping[str, float] | None = None, bar_width: int = 10,
                 roles: Mapping[str, str] | None = None) -> Table:
    """Per criterion: the latest outcome, the counters of the verdict aggregation, a sparkline of the
    last ``width`` effect estimates scaled from "no effect" (``origins``: 1 for the judge's ratios, 0
    for differences) to the criterion's limit, which is said under it, and the latest effect. Both
    are written as a plan states a change (``effect_text``: a ratio of 1.174 is "+17.4 %", a fall
    "-8.0 %"). Headings take two lines, so the table fits 80 columns with ``width`` 10.
    ``bar_width`` is kept for callers: no bar is drawn (its share of the limit read -397 % for a fall).
    A signal (``roles``) is marked under its name, since its failure pauses where a guardrail's rolls
    back."""
    origin = view.get("metrics")
    judged = f" — judged on {origin} metrics" if origin else ""
    right = {"justify": "right", "no_wrap": True}
    names = list(dict.fromkeys([*thresholds, *view["criteria"]]))
    # a criterion's name wraps at spaces, never inside a word (two names must not shrink to one "down…")
    longest_word = max((len(w) for n in names for w in str(n).split()), default=9)
    table = make_table(title=f"{view['summary']} — values {_values_text(view['values'])}{judged}",
                       columns=(("criterion", {"min_width": min(longest_word, 20), "overflow": "fold"}),
                                ("latest", {"no_wrap": True}),
                                (Text("effect,\nlast looks"), {"no_wrap": True}),
                                (Text("latest\neffect"), right), ("failed", right),
                                (Text("incon-\nclusive"), right), (Text("errors\nin a row"), right)),
                       title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    # every criterion of the plan (counters restart after a transition), latest outcome from the journal
    for name in names:
        counters = view["criteria"].get(name, {})
        recent = list(looks.get(name, ()))[-width:]
        effects = [v.get("effect") for v in recent]
        limit = thresholds.get(name)
        origin = (origins or {}).get(name, 0.0)
        latest = next((e for e in reversed(effects) if e is not None), None)
        outcome = counters.get("latest") or (recent[-1]["outcome"] if recent else "-")
        known = [e for e in effects if e is not None and math.isfinite(e)]
        # scaled from no effect (or the lowest) to the limit (or the highest): a full block is at the limit
        spark = sparkline(effects, lo=min([origin, *known]), hi=max([limit or origin, *known]))
        label = plain(name)
        if (roles or {}).get(name) == "signal":
            # the newline is the table's own (plain() would show a newline inside a name as "\n")
            label = plain(name).append("\n").append_text(plain("signal: pauses", "dim"))
        # the sparkline's full block is the limit: said under it, as a plan states a change
        looks_cell = plain(spark)
        if limit is not None:
            looks_cell.append("\n").append_text(plain(f"█ = {effect_text(limit, origin, 'g')}", "dim"))
        add_row(table, label, plain(outcome, OUTCOME_STYLE.get(outcome)), looks_cell, effect_text(latest, origin),
                counters.get("failed", 0), counters.get("inconclusive", 0), counters.get("consecutive_error", 0))
    return table


def effect_text(effect: float | None, origin: float, style: str = ".1f") -> str:
    """An effect on the judge's scale as the change a plan states: a ratio (``origin`` 1) as a relative
    change with its sign, 1.174 -> "+17.4 %", 0.92 -> "-8.0 %"; a difference or a level as it is."""
    if effect is None or not math.isfinite(effect):
        return "-"
    if origin == 1.0:
        return f"{(effect - 1.0) * 100:+{style}} %"
    return f"{effect:+.3g}"


def times_table(view: Mapping) -> Table:
    table = make_table(columns=[(c, {"no_wrap": True}) for c in ("awaiting consensus", "stage in consensus since",
                                                                  "next decision")], box=None)
    add_row(table, *(f"{_t(view.get(k))} UTC" if view.get(k) else "-"
                     for k in ("awaiting_consensus", "stage_valid_after", "decision_at")))
    return table


def history_table(view: Mapping) -> Table:
    """Decisions, operator commands and authority outages (``view["outages"]``), in time order, one row each."""
    table = make_table(title="decisions and commands", columns=(("time (UTC)", {"no_wrap": True}), "what", "stage",
                                                                  "detail"), title_justify="left")
    rows = [(d["at"], d["decision"], str(d["stage"]), d["message"], None) for d in view["decisions"]]
    rows += [(c["at"], f"command {c['kind']}", "", f"by {c['user'] or '?'}: {c['state']} {c['result']}".strip(),
              "cyan") for c in view["commands"]]
    # stretches without a majority-signed consensus and authorities without a vote, from their first round
    rows += [(o["at"], o["what"], "", o["detail"], "bold red" if o["what"] == "no-consensus" else "red")
             for o in view.get("outages", ())]
    for at, what, stage, detail, style in sorted(rows, key=lambda r: r[0]):
        style = style or ("bold red" if what.startswith("rollback") else "yellow" if what.startswith("pause")
                          else None)
        add_row(table, _t(at), plain(what, style), stage, detail)
    return table
