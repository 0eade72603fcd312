"""Tor-aware checks of experiment plans. Each finding has a stable rule code.

| code  | severity | rule |
|-------|----------|------|
| KX001 | error    | the plan does not load (TOML syntax, schema, types) |
| KX101 | error    | unknown consensus parameter (with a did-you-mean) |
| KX102 | error    | value outside tor's bounds for the stated tor versions (tor clamps it) |
| KX103 | warning  | parameter not read by part of the stated tor versions |
| KX104 | warning  | a stage repeats the previous stage's values (no change reaches relays) |
| KX105 | error    | values an authority could not vote with (AuthDirMaxServersPerAddr, which tor appends itself) |
| KX106 | warning  | compared KISTSchedRunInterval values run alike on most relays' kernel ticks |
| KX201 | error    | stage shorter than consensus propagation plus the criteria's minimum sample time, or a |
|       |          | baseline with fewer than min_samples |
|       | warning  | a stage below 80 % power to PASS at no change or FAIL at twice the limit (names its |
|       |          | detectable change and the duration that would reach 80 %); an error below 50 %, or when |
|       |          | the baseline is too short for any extension to decide (names the baseline that would) |
| KX202 | warning  | switchback washout shorter than propagation to the criteria's population |
| KX203 | error    | switchback periods that lock each arm to the same hours of the day |
| KX301 | error    | criterion on a metric no collector provides |
| KX302 | error    | plan without any rollback criterion |
| KX303 | error    | plan with a [simulation] table: criterion on a metric the population cannot predict |
| KX304 | warning  | a signal names a rollback (on_fail, on_inconclusive) it never takes; every criterion a signal |
| KX401 | error    | overlapping experiments on the same parameter across the files given |
| KX501 | error    | start time in the past |
| KX601 | error    | fewer participating authorities than needed to move the value |
| KX701 | error    | anonymity criterion on an unknown attack measure (kistexp/plan/lint_anonymity.py) |
| KX702 | error    | anonymity margin that is not a number, or negative |
| KX703 | error    | a false-positive rate the plan's [simulation] cannot resolve |
| KX704 | error    | anonymity criterion in a plan without a [simulation] table |
| KX705 | error    | anonymity comparison on the side that is not leakier |

A finding repeated over stages and criteria is one line: "stages '2ms', '5ms': criterion
'bulk' needs ...". Sample counts are the catalogue's sample model
(``kistexp.metrics.catalogue.samples_in``), the one the engine's dry run draws; the power
forecast also takes the engine's washout, sequential method and each criterion's FAIL alpha
(docs/judge.md, "Power and the lint forecast").
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Sequence

from kistexp import params as tor_params
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.voting import AUTH_DIR_MAX_SERVERS_PER_ADDR, VoteRejected, own_vote_params
from kistexp.durations import format_duration
from kistexp.errors import DocumentError, PlanError
from kistexp.metrics import catalogue as metrics
from kistexp.plan.lint_anonymity import RULES as ANONYMITY_RULES
from kistexp.plan.lint_anonymity import check_anonymity
from kistexp.plan.lint_findings import Detectable, Finding, LintReport, _Collector, _named  # noqa: F401
from kistexp.plan.lint_power import (  # noqa: F401  (re-exported: plan_cmds, bench/judge_error_rates.py)
    _MAX_FORECAST,
    ALPHA,
    _check_stage_lengths,
    _check_switchback_power,
    _design,
    _label,
    change_text,
    limit_text,
)
from kistexp.plan.loader import parse_plan, read_plan_text
from kistexp.plan.model import UNSET, AnonymityCriterion, ParamValue, Plan
from kistexp.plan.timeline import authorities_needed, propagation_delay
from kistexp.population import kernels
from kistexp.population.classes import tick_shares

RULES = {
    "KX001": "the plan does not load",
    "KX101": "unknown consensus parameter",
    "KX102": "value outside tor's bounds",
    "KX103": "parameter not read by some stated tor versions",
    "KX104": "stage repeats the previous values",
    "KX105": "values tor cannot vote with",
    "KX106": "compared values run alike on most kernels",
    "KX107": "congestion control voted off strands clients still using it",
    "KX201": "stage too short for propagation and samples",
    "KX202": "switchback washout shorter than propagation",
    "KX203": "switchback arms aliased with the time of day",
    "KX301": "criterion on a metric no collector provides",
    "KX302": "no rollback criterion",
    "KX303": "criterion on a metric the population cannot predict",
    "KX304": "a signal's rollback is not taken",
    "KX401": "overlapping experiments on one parameter",
    "KX501": "start time in the past",
    "KX601": "too few authorities to move the value",
    **ANONYMITY_RULES,
}


def lint_paths(paths: Sequence[str], now: dt.datetime | None = None) -> LintReport:
    """Load and check every plan; findings of all files, cross-file rules included."""
    now = now or dt.datetime.now(dt.timezone.utc)
    findings: list[Finding] = []
    detectable: list[Detectable] = []
    loaded: list[tuple[Plan, _Collector]] = []
    for path in paths:
        try:
            text = read_plan_text(path)  # read once: what is checked is what was parsed
            plan = parse_plan(text, str(path))
        except PlanError as exc:
            # an anonymity margin that is not a number has a rule of its own (KX702)
            code = getattr(exc, "code", "KX001")
            findings.append(Finding(code, "error", exc.file or str(path), exc.line, exc.key, exc.problem))
            continue
        collector = _Collector(plan, text)
        check_plan(plan, collector, now)
        loaded.append((plan, collector))
    _check_overlaps(loaded)
    for _, collector in loaded:
        findings.extend(collector.findings)
        detectable.extend(collector.detectable)
    return LintReport(tuple(findings), tuple(str(p) for p in paths), tuple(detectable))


def detectable_changes(plan: Plan) -> tuple[Detectable, ...]:
    """Each judged criterion's detectable change in each stage (``kistexp show``), as KX201 forecasts it."""
    out = _Collector(plan, "")
    _check_stage_lengths(plan, out)
    return tuple(out.detectable)


def check_plan(plan: Plan, out: _Collector, now: dt.datetime) -> None:
    _check_parameters(plan, out)
    _check_kernel_ticks(plan, out)
    _check_criteria(plan, out)
    _check_stage_lengths(plan, out)
    _check_switchback_aliasing(plan, out)
    _check_start(plan, out, now)
    _check_authorities(plan, out)
    _check_votable(plan, out)
    _check_cc_off(plan, out)
    check_anonymity(plan, out)


def _value_sets(plan: Plan):
    """(key path, values) for the baseline and every stage as written in the file."""
    for path, values, _ in _labelled_value_sets(plan):
        yield path, values


def _labelled_value_sets(plan: Plan):
    """(key path, values, stage label or "") for the baseline and every stage as written in the file."""
    if plan.baseline.values:
        yield "baseline.values", plan.baseline.values, ""
    if plan.switchback is not None:
        yield "switchback.treatment", plan.switchback.treatment, ""
        yield "switchback.control", plan.switchback.control, ""
    else:
        for i, stage in enumerate(plan.stages):
            yield f"stages[{i}].values", stage.values, repr(stage.name)


def _check_parameters(plan: Plan, out: _Collector) -> None:
    known = set()
    for i, name in enumerate(plan.parameters):
        entry = tor_params.get(name)
        if entry is None:
            close = tor_params.suggest(name)
            hint = f"; did you mean {close}?" if close else ""
            out.add("KX101", f"experiment.parameters[{i}]", f"{name} is not a consensus parameter tor reads{hint}")
            continue
        known.add(name)
        covered = entry.bounds_in(plan.tor_versions)
        if not covered:
            out.add("KX103", f"experiment.parameters[{i}]",
                    f"{name} is not read by tor {plan.tor_versions}; it exists for "
                    + ", ".join(str(b.versions) for b in entry.bounds), "error")
        elif not all(_covers(entry, plan)):
            versions = ", ".join(str(b.versions) for b in entry.bounds)
            out.add("KX103", f"experiment.parameters[{i}]",
                    f"{name} is read only by tor {versions}, not by all of {plan.tor_versions}", "warning")
    for path, values, label in _labelled_value_sets(plan):
        for name, value in values:
            if name not in known or value == UNSET:
                continue
            for bounds in tor_params.get(name).bounds_in(plan.tor_versions):  # type: ignore[union-attr]
                if not bounds.minimum <= value <= bounds.maximum:
                    side = "below tor's minimum" if value < bounds.minimum else "above tor's maximum"
                    limit = bounds.minimum if value < bounds.minimum else bounds.maximum
                    out.add("KX102", f"{path}.{name}",
                            f"{name}={value} is {side} of {limit} for tor {bounds.versions}: "
                            f"tors clamp it to {bounds.clamp(value)}", stage=label)
    if plan.switchback is None:
        for i in range(1, len(plan.stages)):
            if plan.stages[i].values == plan.stages[i - 1].values:
                out.add("KX104", f"stages[{i}].values",
                        f"stage {plan.stages[i].name!r} repeats the values of {plan.stages[i - 1].name!r}",
                        "warning")


def _check_votable(plan: Plan, out: _Collector) -> None:
    """Each value set becomes the participating authorities' ConsensusParams: tor must be able to vote it
    (dirauth.voting.own_vote_params). An authority that cannot logs "Generated a networkstatus vote we couldn't
    parse" and stops voting, so carrying such a plan out would silence every participating authority."""
    for path, values in _value_sets(plan):
        items = [(name, value) for name, value in values if value != UNSET]
        for name, value in items:
            if name == AUTH_DIR_MAX_SERVERS_PER_ADDR:
                out.add("KX105", f"{path}.{name}",
                        f"{name}={value} cannot be a ConsensusParams value: tor appends {name}=<its torrc option> "
                        "to the vote of every authority with ConsensusParams (dirvote.c), so the vote would list "
                        f"it twice and the authority would stop voting; set the torrc option {name} on the "
                        "authorities instead")
        try:
            # the line an authority votes from its torrc's ConsensusParams, as tor writes it
            own_vote_params(ConsensusParams.from_pairs(
                (name, value) for name, value in items if name != AUTH_DIR_MAX_SERVERS_PER_ADDR).format())
        except (VoteRejected, DocumentError) as exc:
            out.add("KX105", path, str(exc))


#: tor versions whose clients ask for the v1 relay cell format (CGO) together with congestion
#: control, which a relay without congestion control refuses (seen with 0.4.9.11).
CGO_VERSIONS = tor_params.VersionRange(tor_params.TorVersion(0, 4, 9, 1))


def _check_cc_off(plan: Plan, out: _Collector) -> None:
    """cc_alg=0 entering the consensus: a 0.4.9 client whose consensus still has congestion
    control on asks for it and for the v1 cell format in every ntor-v3 handshake, and a relay
    that already holds cc_alg=0 refuses the pair (onion_crypto.c,
    negotiate_v3_ntor_server_circ_params: "The V1 cell format is incompatible with pre-CC
    circuits"), directory fetches included; docs/localnet.md, Pitfalls, shows it on a local
    network. Relays fetch the consensus before clients, so for hours most clients could not
    build a circuit through the relays that have it."""
    if not plan.tor_versions.overlaps(CGO_VERSIONS):
        return
    for path, values, label in _labelled_value_sets(plan):
        if dict(values).get("cc_alg") == 0:
            out.add("KX107", f"{path}.cc_alg",
                    f"cc_alg=0 in the consensus cuts tor {CGO_VERSIONS} clients still holding a consensus with "
                    "congestion control on off every relay that already has this one: such relays refuse their "
                    "circuit handshakes, directory fetches included, until the client's own consensus changes",
                    "warning", stage=label)


# KX106 warns when at least this share of relays runs two compared values at the same interval
ALIKE_WARN_SHARE = 0.5
_TICK_PARAMS = ("KISTSchedRunInterval",)


def _compared_pairs(plan: Plan, name: str) -> list[tuple[str, int, int, str]]:
    """(key, a, b, stage label) for each pair of values the plan compares for ``name``."""
    def value(values) -> ParamValue | None:
        return dict(values).get(name)

    pairs = []
    if plan.switchback is not None:
        pairs.append(("switchback.treatment", value(plan.switchback.treatment), value(plan.switchback.control), ""))
    else:
        previous = value(plan.baseline.values)
        for i, stage in enumerate(plan.stages):
            current = stage.value_of(name)
            pairs.append((f"stages[{i}].values", previous, current, repr(stage.name)))
            previous = current
    return [(k, a, b, label) for k, a, b, label in pairs if isinstance(a, int) and isinstance(b, int) and a != b]


def _check_kernel_ticks(plan: Plan, out: _Collector) -> None:
    """KX106: tor's timer fires on the kernel tick, so nearby intervals can run identically
    (kistexp.population.kernels; population.md §3.2)."""
    names = [n for n in plan.parameters if n in _TICK_PARAMS]
    if not names:
        return
    shares = tick_shares()
    for name in names:
        bounds = tor_params.get(name).bounds_in(plan.tor_versions)  # type: ignore[union-attr]
        for key, a, b, label in _compared_pairs(plan, name):
            if bounds:
                a, b = bounds[-1].clamp(a), bounds[-1].clamp(b)
            lo, hi = min(a, b), max(a, b)
            alike = kernels.alike_share(lo, hi, shares)
            if alike < ALIKE_WARN_SHARE:
                continue
            run = kernels.effective_interval_ms
            same = [hz for hz in shares if run(lo, hz) == run(hi, hz)]
            differ = [hz for hz in shares if hz not in same]
            hints = []
            for hz in sorted(same, key=lambda h: -shares[h]):
                other = kernels.first_distinct(lo, hz)
                if other is not None:
                    hints.append(f"{lo} vs {other} ms on HZ={hz} ({run(lo, hz):.3g} vs "
                                 f"{run(other, hz):.3g} ms)")
            every = max((kernels.first_distinct(lo, hz) or 0) for hz in shares)
            tellers = ", ".join(f"HZ={hz}" for hz in differ) or "no kernel"
            out.add("KX106", f"{key}.{name}",
                    f"{name} {lo} and {hi} ms run at the same interval on {alike:.0%} of relays "
                    f"(kernels with HZ={', '.join(str(h) for h in same)} run both on the same tick multiple); only "
                    f"{tellers} ({1 - alike:.0%}) can tell them apart. Pairs that differ: "
                    + "; ".join(hints[:3]) + f"; {lo} vs {every} ms differs on every kernel", "warning",
                    stage=label)


def _covers(entry: tor_params.ConsensusParam, plan: Plan) -> list[bool]:
    """Whether the ends of the plan's version range are read by tor."""
    return [entry.bounds_for(plan.tor_versions.low) is not None,
            entry.bounds_for(plan.tor_versions.high) is not None]


def _check_criteria(plan: Plan, out: _Collector) -> None:
    if not plan.criteria and not plan.anonymity:
        out.add("KX302", "criteria" if plan.path else "",
                "the plan has no rollback criterion: add at least one [[criteria]]")
    for key, criterion in zip(plan.criterion_keys(), plan.criteria, strict=True):
        if metrics.get(criterion.metric) is None:
            close = difflib.get_close_matches(criterion.metric, metrics.names(), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(metrics.names())}"
            out.add("KX301", f"{key}.metric", f"no collector provides {criterion.metric!r}{hint}")
        elif plan.simulation.declared and criterion.metric not in metrics.simulated():
            out.add("KX303", f"{key}.metric",
                    f"the plan has a [simulation] table, but the population cannot predict {criterion.metric!r}, "
                    "so kistexp simulate writes no predictions for it and a dry run cannot rehearse the "
                    f"criterion; it predicts {', '.join(metrics.simulated())}")
    _check_signals(plan, out)


def _check_signals(plan: Plan, out: _Collector) -> None:
    """KX304: a signal's failure pauses for an operator and never rolls back by itself (docs/rollouts.md,
    "What ends a stage"), so a rollback it names is not taken: say so rather than let a reader expect it."""
    keyed = [*zip(plan.criterion_keys(), plan.criteria, strict=True),
             *((f"criteria[{a.index}]", a) for a in plan.anonymity)]
    for place, c in keyed:
        if c.role != "signal":
            continue
        ignored = [f"on_fail {c.on_fail!r}"] if c.on_fail != "hold" else []
        if c.on_inconclusive not in ("extend", "advance", "hold"):
            ignored.append(f"on_inconclusive {c.on_inconclusive!r}")
        if ignored:
            key = f"{place}.on_fail" if c.on_fail != "hold" else f"{place}.on_inconclusive"
            label = repr(c.label) if isinstance(c, AnonymityCriterion) else _label(c)
            out.add("KX304", key, f"criterion {label} is a signal: its failure pauses for an operator and never "
                    f"rolls back, so its {' and '.join(ignored)} is not taken (make it a guardrail to roll back)",
                    "warning")
    if keyed and all(c.role == "signal" for _, c in keyed):
        out.add("KX304", "criteria", "every criterion is a signal: no failure rolls the plan back by itself; make "
                "the criteria that must roll back guardrails (role = \"guardrail\", the default)", "warning")


def _check_switchback_aliasing(plan: Plan, out: _Collector) -> None:
    """KX203: with a treatment-control cycle that divides a day (12 h periods, 6 h, ...)
    each arm sees the same hours every day, and transfer times drift 10 % within a day
    (spec judge.md §5.4 and §6: in simulation the 90 % interval then covers the truth
    about 0 % of the time). Periods of whole days, or cycles that rotate through the
    day, are fine."""
    sb = plan.switchback
    if sb is None:
        return
    cycle = 2 * int(sb.period.total_seconds())
    day = 86400
    if cycle <= day and day % cycle == 0:
        out.add("KX203", "switchback.period",
                f"period {format_duration(sb.period)} alternates treatment and control every "
                f"{format_duration(sb.period)}: each arm sees the same {format_duration(sb.period)} of every day, "
                "so the daily cycle of transfer times is counted as an effect; use whole days (24h) or a period "
                "that rotates through the day")


def _check_start(plan: Plan, out: _Collector, now: dt.datetime) -> None:
    if plan.start < now:
        out.add("KX501", "experiment.start",
                f"start {plan.start:%Y-%m-%d %H:%M} UTC is in the past (now {now:%Y-%m-%d %H:%M} UTC)")


def _check_authorities(plan: Plan, out: _Collector) -> None:
    n = len(plan.authorities.authorities)
    need = authorities_needed(n, plan.authorities.others)
    have = len(plan.authorities.participating)
    if have < need:
        if plan.authorities.others == "listing":
            why = (f"with the other authorities listing the parameter, moving the low median needs "
                   f"floor({n}/2)+1 = {need}")
        else:
            why = f"a parameter enters the consensus only when min(3, floor({n}/2)+1) = {need} authorities list it"
        out.add("KX601", "authorities.participating",
                f"{have} of {n} authorities participate; {why}")


def _check_overlaps(loaded: list[tuple[Plan, _Collector]]) -> None:
    for i, (a, out_a) in enumerate(loaded):
        for b, _ in loaded[i + 1:]:
            shared = sorted(set(a.parameters) & set(b.parameters))
            if not shared:
                continue
            a_end = a.end + propagation_delay(a.end, "clients")
            b_end = b.end + propagation_delay(b.end, "clients")
            if a.start < b_end and b.start < a_end:
                out_a.add("KX401", "experiment.start",
                          f"{a.name} and {b.name} ({b.path}) both change {', '.join(shared)} between "
                          f"{max(a.start, b.start):%Y-%m-%d} and {min(a_end, b_end):%Y-%m-%d}")
