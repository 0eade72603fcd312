"""Lint rules of anonymity criteria (docs/plan-format.md "Anonymity criteria"; docs/anonymity.md).

An anonymity criterion names an attack measure of ``kistexp.metrics.catalogue.ATTACK_MEASURES`` and a
margin; it is judged from the predictions ``kistexp simulate`` stores, so the plan must be one that is
simulated, and a flow-correlation TPR at a false-positive rate is only defined when the simulated
networks give at least ``1 / rate`` flows (``kistexp.anonymity.flowcorr.min_flows``).

| code  | severity | rule |
|-------|----------|------|
| KX701 | error    | an anonymity criterion on a measure the catalogue does not know (with the closest, or all) |
| KX702 | error    | its margin (``threshold``) is not a number, or negative (raised by the loader, located) |
| KX703 | error    | a false-positive rate the plan's [simulation] cannot resolve (too few flows per network) |
| KX704 | error    | an anonymity criterion in a plan without a [simulation] table: nothing predicts it |
| KX705 | error    | the comparison guards the wrong way: the measure's leakier side is the other one |
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from kistexp.anonymity.flowcorr import min_flows
from kistexp.metrics import catalogue
from kistexp.plan.lint_findings import _Collector
from kistexp.plan.model import Plan
from kistexp.population.attacks import plan_flow_capacity
from kistexp.population.stageruns import StageRuns

RULES = {
    "KX701": "anonymity criterion on an unknown attack measure",
    "KX702": "anonymity margin not a non-negative number",
    "KX703": "false-positive rate the simulated flows cannot resolve",
    "KX704": "anonymity criterion without a [simulation] table",
    "KX705": "anonymity comparison on the side that is not leakier",
}

#: (flows, false pairs) a plan's runs give at most; lint asks ``plan_flow_capacity`` (tests may pass another)
Capacity = Callable[[StageRuns], tuple[int, int]]


def check_anonymity(plan: Plan, out: _Collector, capacity: Capacity = plan_flow_capacity) -> None:
    if not plan.anonymity:
        return
    if not plan.simulation.declared:
        first = plan.anonymity[0]
        names = ", ".join(repr(a.label) for a in plan.anonymity)
        several = len(plan.anonymity) > 1
        out.add("KX704", f"criteria[{first.index}].measure",
                f"anonymity {'criteria' if several else 'criterion'} {names} {'are' if several else 'is'} "
                "judged from kistexp simulate's attack measures, but the plan has no [simulation] table, so "
                "nothing predicts them: add [simulation] (population_scale, seeds, duration) and run "
                "kistexp simulate before the dry run")
    known = catalogue.attack_measure_names()
    flows: tuple[int, int] | None = None
    for a in plan.anonymity:
        key = f"criteria[{a.index}]"
        m = catalogue.attack_measure(a.measure)
        if m is None:
            close = difflib.get_close_matches(a.measure, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
            out.add("KX701", f"{key}.measure", f"no attack measure {a.measure!r}; {hint}")
            continue
        want = "absolute-increase" if m.leakier > 0 else "absolute-decrease"
        if a.comparison != want:
            way = "higher" if m.leakier > 0 else "lower"
            out.add("KX705", f"{key}.comparison",
                    f"{a.measure} ({m.label}): a {way} value is leakier, so {a.comparison} would limit the change "
                    f"that makes the attack weaker; use comparison = \"{want}\" (the stage may not make it "
                    f"{way} by more than the margin)")
        if m.fpr is not None and plan.simulation.declared:
            if flows is None:
                flows = capacity(plan.stage_runs())
            need = min_flows(m.fpr)
            have = min(flows)
            if have < need:
                out.add("KX703", f"{key}.measure", _resolution_text(plan, m.fpr, need, flows, known))


def _resolution_text(plan: Plan, fpr: float, need: int, flows: tuple[int, int], known: tuple[str, ...]) -> str:
    sim = plan.simulation
    coarser = [m for m in (catalogue.attack_measure(n) for n in known)
               if m is not None and m.fpr is not None and min_flows(m.fpr) <= min(flows)]
    # the finest catalogued rate the flows resolve
    finest = min(coarser, key=lambda m: m.fpr or 1.0) if coarser else None
    use = f"use FPR {finest.fpr:g} ({finest.name})" if finest is not None else "no catalogued rate fits"
    scale = min(1.0, sim.population_scale * need / max(min(flows), 1))
    return (f"a false-positive rate of {fpr:g} needs {need:,} flows and false pairs per simulated network; the "
            f"plan's [simulation] (population_scale {sim.population_scale:g}, duration "
            f"{sim.duration.total_seconds():g}s) gives at most {flows[0]:,} flows and {flows[1]:,} false pairs: "
            f"{use}, or raise population_scale (about {scale:.2g}) or duration")
