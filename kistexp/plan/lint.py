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
| KX201 | error    | stage shorter than consensus propagation plus the criteria's minimum sample time |
|       | warning  | ... or too short to reach 80 % power for a criterion's threshold (names the duration that would) |
| KX202 | warning  | switchback washout shorter than propagation to the criteria's population |
| KX203 | error    | switchback periods that lock each arm to the same hours of the day |
| KX301 | error    | criterion on a metric no collector provides |
| KX302 | error    | plan without any rollback criterion |
| KX303 | error    | plan with a [simulation] table: criterion on a metric the population cannot predict |
| KX401 | error    | overlapping experiments on the same parameter across the files given |
| KX501 | error    | start time in the past |
| KX601 | error    | fewer participating authorities than needed to move the value |

A finding repeated over stages and criteria is one line: "stages '2ms', '5ms': criterion
'bulk' needs ...". Sample counts are the catalogue's sample model
(``kistexp.metrics.catalogue.samples_in``), the one the engine's dry run draws.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
from collections.abc import Sequence

import attrs

from kistexp import params as catalogue
from kistexp.dirauth.voting import AUTH_DIR_MAX_SERVERS_PER_ADDR, VoteRejected, own_vote_params
from kistexp.durations import format_duration
from kistexp.errors import PlanError
from kistexp.metrics import catalogue as metrics
from kistexp.plan.loader import parse_plan, read_plan_text
from kistexp.plan.locate import index_lines, line_of
from kistexp.plan.model import UNSET, ParamValue, Plan
from kistexp.plan.timeline import authorities_needed, propagation_delay
from kistexp.population import kernels
from kistexp.stats import power

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
    "KX401": "overlapping experiments on one parameter",
    "KX501": "start time in the past",
    "KX601": "too few authorities to move the value",
}


@attrs.frozen
class Finding:
    code: str
    severity: str  # "error" or "warning"
    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = f" {self.key}:" if self.key else ""
        return f"{where}: {self.severity} {self.code}{key} {self.message}"


@attrs.frozen
class LintReport:
    findings: tuple[Finding, ...]
    files: tuple[str, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warning")

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0


def _named(one: str, many: str, names: Sequence[str]) -> str:
    return f"{one if len(names) == 1 else many} {', '.join(names)}"


@attrs.define
class _Group:
    """Findings of one rule with the same text, over stages and criteria."""

    code: str
    severity: str
    message: str
    verbs: tuple[str, str]  # (singular, plural) after the criteria
    pairs: dict = attrs.field(factory=dict)  # stage label -> {criterion label: key}

    def findings(self, out: _Collector) -> list[Finding]:
        by_criteria: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for stage, criteria in self.pairs.items():
            by_criteria.setdefault(tuple(criteria), []).append((stage, next(iter(criteria.values()))))
        found = []
        for criteria, stages in by_criteria.items():
            parts = [_named("stage", "stages", [s for s, _ in stages if s])] if stages[0][0] else []
            named = [c for c in criteria if c]
            if named:
                verb = self.verbs[0] if len(named) == 1 else self.verbs[1]
                parts.append(f"{_named('criterion', 'criteria', named)} {verb} {self.message}")
            else:
                parts.append(self.message)
            found.append(out.finding(self.code, stages[0][1], ": ".join(parts), self.severity))
        return found


class _Collector:
    def __init__(self, plan: Plan, source: str) -> None:
        self.plan = plan
        self._index = index_lines(source)
        self._items: list[Finding | _Group] = []
        self._groups: dict[tuple, _Group] = {}

    def finding(self, code: str, key: str, message: str, severity: str) -> Finding:
        return Finding(code, severity, self.plan.path, line_of(self._index, key), key, message)

    def add(self, code: str, key: str, message: str, severity: str = "error", *, stage: str = "",
            criterion: str = "", verbs: tuple[str, str] = ("", "")) -> None:
        """One finding; with a ``stage`` or ``criterion`` label, findings of the same rule and text are
        printed as one line naming every stage and criterion (the line of the first one's key)."""
        if not stage and not criterion:
            self._items.append(self.finding(code, key, message, severity))
            return
        group = self._groups.get((code, severity, message, verbs))
        if group is None:
            group = self._groups[(code, severity, message, verbs)] = _Group(code, severity, message, verbs)
            self._items.append(group)
        group.pairs.setdefault(stage, {}).setdefault(criterion, key)

    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for item in self._items:
            out.extend(item.findings(self) if isinstance(item, _Group) else [item])
        return out


def lint_paths(paths: Sequence[str], now: dt.datetime | None = None) -> LintReport:
    """Load and check every plan; findings of all files, cross-file rules included."""
    now = now or dt.datetime.now(dt.timezone.utc)
    findings: list[Finding] = []
    loaded: list[tuple[Plan, _Collector]] = []
    for path in paths:
        try:
            text = read_plan_text(path)  # read once: what is checked is what was parsed
            plan = parse_plan(text, str(path))
        except PlanError as exc:
            findings.append(Finding("KX001", "error", exc.file or str(path), exc.line, exc.key, exc.problem))
            continue
        collector = _Collector(plan, text)
        check_plan(plan, collector, now)
        loaded.append((plan, collector))
    _check_overlaps(loaded)
    for _, collector in loaded:
        findings.extend(collector.findings)
    return LintReport(tuple(findings), tuple(str(p) for p in paths))


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
        entry = catalogue.get(name)
        if entry is None:
            close = catalogue.suggest(name)
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
            for bounds in catalogue.get(name).bounds_in(plan.tor_versions):  # type: ignore[union-attr]
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
        line = " ".join(f"{name}={value}" for name, value in items if name != AUTH_DIR_MAX_SERVERS_PER_ADDR)
        try:
            own_vote_params(line)
        except VoteRejected as exc:
            out.add("KX105", path, str(exc))


#: tor versions whose clients ask for the v1 relay cell format (CGO) together with congestion
#: control, which a relay without congestion control refuses (seen with 0.4.9.11).
CGO_VERSIONS = catalogue.VersionRange(catalogue.TorVersion(0, 4, 9, 1))


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
    shares = kernels.tick_shares()
    for name in names:
        bounds = catalogue.get(name).bounds_in(plan.tor_versions)  # type: ignore[union-attr]
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


def _covers(entry: catalogue.ConsensusParam, plan: Plan) -> list[bool]:
    """Whether the ends of the plan's version range are read by tor."""
    return [entry.bounds_for(plan.tor_versions.low) is not None,
            entry.bounds_for(plan.tor_versions.high) is not None]


def _check_criteria(plan: Plan, out: _Collector) -> None:
    if not plan.criteria:
        out.add("KX302", "criteria" if plan.path else "",
                "the plan has no rollback criterion: add at least one [[criteria]]")
    for i, criterion in enumerate(plan.criteria):
        if metrics.get(criterion.metric) is None:
            close = difflib.get_close_matches(criterion.metric, metrics.names(), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(metrics.names())}"
            out.add("KX301", f"criteria[{i}].metric", f"no collector provides {criterion.metric!r}{hint}")
        elif plan.simulation.declared and criterion.metric not in metrics.simulated():
            out.add("KX303", f"criteria[{i}].metric",
                    f"the plan has a [simulation] table, but the population cannot predict {criterion.metric!r}, "
                    "so kistexp simulate writes no predictions for it and a dry run cannot rehearse the "
                    f"criterion; it predicts {', '.join(metrics.simulated())}")


def _label(criterion) -> str:
    return repr(criterion.name or criterion.metric)


def _hours(delta: dt.timedelta) -> int:
    """Whole plan hours (the engine's collection windows) covering ``delta``."""
    return math.ceil(delta.total_seconds() / 3600 - 1e-9)


def _rate_text(metric) -> str:
    return (f"{metrics.samples_in(metric)} a collection: {metric.samples_per_hour:g}/h from each of "
            f"{metrics.instances_text(metric)}")


def _check_stage_lengths(plan: Plan, out: _Collector) -> None:
    """KX201: the engine counts a stage's samples in hourly collections once the criteria's population runs
    the value (switchback: after the washout); it needs ``min_samples`` of each criterion's metric."""
    judged = [(c, metrics.get(c.metric)) for c in plan.criteria]
    judged = [(c, m) for c, m in judged if m is not None]
    if not judged:
        return
    for i, (stage, start, _end) in enumerate(plan.stage_windows()):
        short = False
        longest = None
        for criterion, metric in judged:
            delay = propagation_delay(start, metric.population)
            settle = delay
            if plan.switchback is not None:
                settle = max(delay, plan.switchback.washout)
            collections = metrics.collections_needed(metric, criterion.min_samples)
            need = dt.timedelta(hours=_hours(settle) + collections)
            if longest is None or delay > longest:
                longest = delay
            if stage.duration >= need:
                continue
            short = True
            key = f"stages[{i}].duration" if plan.switchback is None else "switchback.period"
            what = "the value" if plan.switchback is None else "a switched value and the washout ends"
            out.add("KX201", key,
                    f"{format_duration(need)}: {format_duration(dt.timedelta(hours=_hours(settle)))} until all "
                    f"{metric.population} run {what}, then {collections} hourly collections for "
                    f"{criterion.min_samples} samples of {criterion.metric} ({_rate_text(metric)})",
                    stage=f"{stage.name!r} ({format_duration(stage.duration)})", criterion=_label(criterion),
                    verbs=("needs", "need"))
        if not short and plan.switchback is None:
            _check_power(plan, out, i, stage, longest, judged)
        if short and plan.switchback is not None:
            break  # every period has the same length: one finding is enough
    if plan.switchback is not None:
        _check_switchback_power(plan, out, judged)
        populations = {m.population for _, m in judged}
        for population in sorted(populations):
            delay = propagation_delay(plan.start, population)
            if plan.switchback.washout < delay:
                out.add("KX202", "switchback.washout",
                        f"washout {format_duration(plan.switchback.washout)} is shorter than the "
                        f"{format_duration(delay)} until all {population} run a switched value", "warning")


# The judge leaves out this much of a stage while clients pick up the new value
# (spec judge.md §5.3); OnionPerf samples cannot say which value was in effect.
_WASHOUT = dt.timedelta(hours=3)
_MAX_FORECAST = dt.timedelta(days=120)


def _power_at(criterion, metric, var, stage_hours: float, baseline_hours: float, looks: int,
              c_end: float | None = None) -> tuple[float, float, float]:
    # relay metrics: the power model's relays, paired; others: what the engine collects (the catalogue's model)
    scale = var.relays if var.kind == "relay" else metrics.instances(metric)
    n_s = metric.samples_per_hour * scale * max(stage_hours, 0.0)
    n_b = metric.samples_per_hour * scale * baseline_hours
    if c_end is None:
        c_end = power.final_boundary(looks, n_s, n_b)
    p_pass, p_fail = power.decision_power(criterion.statistic, criterion.comparison, criterion.threshold, var,
                                          n_s, n_b, c_end)
    return p_pass, p_fail, c_end


def _judgeable(criterion) -> bool:
    return criterion.statistic not in ("min", "max")


def _power_text(criterion, p_pass: float, p_fail: float) -> str:
    twice = f"{2 * criterion.threshold * 100:g} %" if criterion.comparison.startswith("relative") \
        else f"{2 * criterion.threshold:g}"
    return (f"{criterion.statistic}({criterion.metric}) {criterion.comparison} "
            f"{criterion.threshold * 100 if criterion.comparison.startswith('relative') else criterion.threshold:g}"
            f"{' %' if criterion.comparison.startswith('relative') else ''} reaches "
            f"{p_pass:.0%} power to PASS at no change and {p_fail:.0%} to FAIL at {twice}")


def _hours_needed(criterion, metric, var, hours: float, baseline_h: float, c_end: float) -> int | None:
    """Whole usable stage hours that reach 80 % power, or None within _MAX_FORECAST.

    Bisection with the final boundary held fixed; more looks raise the boundary a
    little, so repeat with the boundary of the length found until that length holds.
    """
    top = _MAX_FORECAST.total_seconds() / 3600

    def ok(h: float, c: float) -> bool:
        return min(_power_at(criterion, metric, var, h, baseline_h, 1, c)[:2]) >= power.TARGET_POWER

    found = None
    for _ in range(6):
        if not ok(top, c_end):
            return None
        lo, hi = hours, top
        while hi - lo > 0.5:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if ok(mid, c_end) else (mid, hi)
        found = math.ceil(hi)
        c_end = _power_at(criterion, metric, var, found, baseline_h, max(1, found))[2]
        if ok(found, c_end):
            return found
    return found


def _check_power(plan: Plan, out: _Collector, i: int, stage, delay: dt.timedelta, judged) -> None:
    """KX201 warning: the stage cannot reach 80 % power (spec judge.md §4.4)."""
    settle = max(delay, _WASHOUT)
    baseline_h = plan.baseline.duration.total_seconds() / 3600
    for criterion, metric in judged:
        if not _judgeable(criterion):
            continue
        var = power.METRIC_VARIABILITY.get(criterion.metric, power.DEFAULT_VARIABILITY)
        hours = (stage.duration - settle).total_seconds() / 3600
        looks = max(1, int(hours))
        p_pass, p_fail, c_end = _power_at(criterion, metric, var, hours, baseline_h, looks)
        if min(p_pass, p_fail) >= power.TARGET_POWER:
            continue
        need_h = _hours_needed(criterion, metric, var, hours, baseline_h, c_end)
        if need_h is None:
            why = (f"no stage up to {format_duration(_MAX_FORECAST)} would reach 80 %"
                   + (f" with {var.relays} relays at a relay-to-relay spread of {var.spread:g}: measure more relays"
                      if var.kind == "relay" else ": lengthen the baseline or widen the threshold"))
        else:
            why = f"{format_duration(dt.timedelta(hours=need_h) + settle)} would reach 80 %"
        rate = (f"{metric.samples_per_hour:g} samples/h per relay" if var.kind == "relay"
                else f"{metric.samples_per_hour:g} samples/h from each of {metrics.instances_text(metric)}")
        out.add("KX201", f"stages[{i}].duration", f"{rate}: {_power_text(criterion, p_pass, p_fail)}; {why}",
                "warning", stage=f"{stage.name!r} ({format_duration(stage.duration)})")


def _check_switchback_power(plan: Plan, out: _Collector, judged) -> None:
    """Switchback: treatment periods against control periods plus the baseline."""
    sb = plan.switchback
    assert sb is not None
    usable_h = (sb.period - sb.washout).total_seconds() / 3600
    baseline_h = plan.baseline.duration.total_seconds() / 3600
    for criterion, metric in judged:
        if not _judgeable(criterion):
            continue
        var = power.METRIC_VARIABILITY.get(criterion.metric, power.DEFAULT_VARIABILITY)

        def at(cycles: int, c_end: float | None = None, criterion=criterion, metric=metric, var=var):
            return _power_at(criterion, metric, var, cycles * usable_h, baseline_h + cycles * usable_h,
                             cycles, c_end)

        p_pass, p_fail, c_end = at(sb.cycles)
        if min(p_pass, p_fail) >= power.TARGET_POWER:
            continue
        need = next((k for k in range(sb.cycles + 1, 10 * sb.cycles + 1)
                     if min(at(k, c_end)[:2]) >= power.TARGET_POWER), None)
        why = (f"{need} cycles ({format_duration(2 * need * sb.period)}) would reach 80 %" if need
               else f"even {10 * sb.cycles} cycles would not reach 80 %")
        out.add("KX201", "switchback.cycles",
                f"{sb.cycles} cycles of {format_duration(sb.period)}: {_power_text(criterion, p_pass, p_fail)}; {why}",
                "warning")


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
