"""The section "What an attacker gains" of the plan report and the experiment report, and the
announcement's line about it: the stored attack measures of ``kistexp simulate`` as paired differences
stage minus baseline over the simulated networks (``kistexp.anonymity.stage_differences``, read by
``kistexp.report.data``), per attack a plot and a table, in plain words. Nothing is measured on the
live network: these are figures of the simulated one (docs/anonymity.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kistexp.anonymity import AttackFigure
from kistexp.metrics import catalogue
from kistexp.metrics.catalogue import AttackMeasure
from kistexp.report import plots
from kistexp.report.wording import attack_difference_words, attack_number

# the attacks in the order the section shows them, and what each is, for people
ATTACKS = ("flow correlation", "throughput fingerprinting", "latency leakage", "batching")
ABOUT = {
    "flow correlation": "An observer who sees a circuit's traffic where it enters Tor (at the guard, or on the "
                        "client's network) and where it leaves (at the exit, or at the destination) links the two "
                        "ends by how their cell counts rise and fall together over time (RAPTOR's windowed rank "
                        "correlation). Its figures: the share of circuits it links while wrongly linking only a "
                        "given share of unrelated pairs (TPR at FPR), and how often a true pair scores above a false "
                        "one (AUC).",
    "throughput fingerprinting": "An attacker sends its own probe traffic through candidate relays and watches "
                                 "whether a victim flow's throughput rises and falls with a probe's: the relay "
                                 "they share is likely the victim's guard (Mittal et al.). Its figures: how well "
                                 "that picks out the guard, and how many bits of uncertainty about the guard it "
                                 "leaves or removes.",
    "latency leakage": "A destination or exit that times a circuit's round trips or its time to first byte "
                       "learns something about where the client is (Hopper et al.). Its figures: the bits of the "
                       "client's region those times reveal, and how steady a circuit's round-trip time is "
                       "(steadier times locate a client better).",
    "batching": "The scheduler sends cells in bursts, once per run period; an observer at an exit sees the gaps "
                "between a circuit's cells, and a gap pattern that differs from the baseline's tells the stage "
                "apart. Its figures: the share of gaps at the run period and the distance between the stage's "
                "and the baseline's gap distributions.",
}
LEAKIER = ("Leakier means the attack does better than at the baseline: a higher value for most figures, a lower "
           "one where the table says so. A stage is marked leakier when the whole 95 % interval of its difference "
           "lies on that side of zero, less leaky when it lies wholly on the other; otherwise the change is within "
           "what the sampled networks let one tell apart.")
UNIT_WORDS = {"ratio": "0–1", "bits": "bits"}


def describe(measure: str) -> AttackMeasure:
    """The catalogue's entry of ``measure``; a flow-correlation TPR at an uncatalogued false-positive
    rate (which the store accepts) is described as the catalogued ones are."""
    m = catalogue.attack_measure(measure)
    if m is not None:
        return m
    prefix = "attack_flow_tpr_at_fpr_"
    if measure.startswith(prefix):
        fpr = measure.removeprefix(prefix)
        return AttackMeasure(measure, "ratio", "flow correlation", +1, f"flow correlation TPR at FPR {fpr}",
                             f"share of circuits whose guard and exit flows a windowed rank correlator links, at a "
                             f"false-positive rate of {fpr}")
    return AttackMeasure(measure, "", "other", +1, measure, "")


def criterion_measure(criterion) -> str | None:
    """The attack measure an anonymity criterion names (its ``measure``; a rollout criterion keeps the
    plan's criterion as ``base``), None for a criterion on a metric."""
    for c in (criterion, getattr(criterion, "base", None)):
        name = getattr(c, "measure", None) if c is not None else None
        if isinstance(name, str) and name:
            return name
    return None


def margin_of(criterion, measure: AttackMeasure, baseline_mean: float) -> float | None:
    """Where an anonymity criterion's non-inferiority margin lies on the difference axis: its own
    ``margin`` where it has one, else its threshold on the side its comparison names (the leakier side
    when it names none), times the baseline's mean for a relative comparison. None when the criterion
    gives no finite number."""
    margin = getattr(criterion, "margin", None)
    if isinstance(margin, (int, float)) and not isinstance(margin, bool) and math.isfinite(margin):
        return float(margin)
    threshold = getattr(criterion, "threshold", None)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        return None
    comparison = str(getattr(criterion, "comparison", "") or "")
    sign = -1 if comparison.endswith("decrease") else 1 if comparison.endswith("increase") else measure.leakier
    size = abs(threshold) * (abs(baseline_mean) if comparison.startswith("relative") else 1.0)
    return sign * size if math.isfinite(size) else None


def flag(figure: AttackFigure) -> str:
    """"leakier", "less leaky" (the interval wholly on the other side of zero) or ""."""
    if figure.leakier:
        return "leakier"
    return "less leaky" if figure.difference.significant else ""


def _name(criterion, measure: str) -> str:
    return getattr(criterion, "name", "") or measure


def networks_of(figures: Sequence[AttackFigure]) -> tuple[int, int]:
    """The fewest and most networks behind any difference."""
    units = [f.difference.units for f in figures]
    return (min(units), max(units)) if units else (0, 0)


def _count(lo: int, hi: int) -> str:
    return str(hi) if lo == hi else f"{lo}–{hi}"


def _criteria_on(criteria: Sequence) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in criteria:
        name = criterion_measure(c)
        if name is not None:
            out.setdefault(name, []).append(c)
    return out


def section(figures: Sequence[AttackFigure], criteria: Sequence, how: str,
            outcomes: Mapping[tuple[str, str], str] | None = None) -> dict:
    """What the templates' ``attack_section`` shows: per attack its plain words, a plot and a table;
    ``how`` is the command shown when the experiment holds no attack measures. ``criteria``: those that
    name an attack ``measure`` get their margin drawn; ``outcomes``: (criterion name, stage) -> the
    latest journaled verdict of that anonymity criterion, shown in the stage's cell."""
    outcomes = outcomes or {}
    if not figures:
        return {"groups": [], "how": how, "networks": "0", "about_leakier": LEAKIER, "figures": 0}
    stages = list(dict.fromkeys(f.stage for f in figures))
    by_criterion = _criteria_on(criteria)
    measures = list(dict.fromkeys(f.measure for f in figures))
    attacks = list(ATTACKS) + sorted({describe(m).attack for m in measures} - set(ATTACKS))
    groups = []
    for attack in attacks:
        names = [m for m in measures if describe(m).attack == attack]
        if not names:
            continue
        rows, panels = [], []
        for name in names:
            m = describe(name)
            own = {f.stage: f for f in figures if f.measure == name}
            base = max(own.values(), key=lambda f: f.difference.units).difference.baseline_mean
            margins = [(c, margin_of(c, m, base)) for c in by_criterion.get(name, ())]
            margins = [(c, x) for c, x in margins if x is not None]
            margin_label = "; ".join(f"{_name(c, name)}: margin {attack_number(x)}" for c, x in margins)
            cells = []
            for s in stages:
                f = own.get(s)
                if f is None:
                    cells.append(None)
                    continue
                d = f.difference
                verdicts = [f"{_name(c, name)}: {outcomes[(_name(c, name), s)]}" for c, _x in margins
                            if (_name(c, name), s) in outcomes]
                cells.append({"text": attack_difference_words(d.mean_difference, d.low, d.high, d.units),
                              "flag": flag(f), "units": d.units, "verdicts": verdicts,
                              "title": f"baseline mean {d.baseline_mean:.4g}, {s} mean {d.stage_mean:.4g} over "
                                       f"{d.units} networks"})
            lo, hi = networks_of(list(own.values()))
            rows.append({"name": name, "label": m.label, "meaning": m.meaning, "unit": UNIT_WORDS.get(m.unit, m.unit),
                         "direction": "higher" if m.leakier > 0 else "lower", "baseline": f"{base:.3g}",
                         "cells": cells, "networks": _count(lo, hi), "margin": margin_label})
            points = tuple(plots.DifferencePoint(f.stage, f.difference.mean_difference, f.difference.low,
                                                 f.difference.high, f.difference.units, flag(f))
                           for f in own.values())
            panels.append(plots.DifferencePanel(m.label, "bits" if m.unit == "bits" else "", m.leakier, points,
                                                margins[0][1] if margins else None, margin_label))
        lo, hi = networks_of([f for f in figures if f.measure in names])
        groups.append({"attack": attack, "about": ABOUT.get(attack, ""), "stages": stages, "rows": rows,
                       "figure": plots.attack_differences(attack, panels, stages, hi)})
    lo, hi = networks_of(figures)
    return {"groups": groups, "how": how, "networks": _count(lo, hi), "about_leakier": LEAKIER,
            "figures": len(groups), "leakier": leakier_lines(figures)}


def leakier_lines(figures: Sequence[AttackFigure]) -> list[str]:
    """Each stage's significantly leakier measures in one line: "2ms: flow correlation TPR at FPR 0.01
    +0.050 [+0.025, +0.075], guard entropy left -0.090 [-0.115, -0.065] over 3 simulated networks"."""
    out: dict[str, list[AttackFigure]] = {}
    for f in figures:
        if f.leakier:
            out.setdefault(f.stage, []).append(f)
    lines = []
    for stage, items in out.items():
        words = [f"{describe(f.measure).label} " + attack_difference_words(
            f.difference.mean_difference, f.difference.low, f.difference.high, f.difference.units) for f in items]
        lo, hi = networks_of(items)
        lines.append(f"{stage}: {', '.join(words)} over {_count(lo, hi)} simulated networks")
    return lines
