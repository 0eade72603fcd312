"""Load and validate experiment plans (TOML, read with tomli) into frozen Plan objects.

Every problem becomes a PlanError whose one-line message names the file, the line where
it can be found, the key path and what is wrong. Nothing else escapes the loader.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import re
from typing import Any

import tomli

from kistexp.asciinum import ascii_port
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES, NICKNAME_RE, V3IDENT_RE, DirectoryAuthority
from kistexp.durations import format_duration
from kistexp.errors import PlanError
from kistexp.params import INT32_MAX, INT32_MIN, parse_version_range
from kistexp.plan import model
from kistexp.plan.tomlschema import Source, Table, type_name
from kistexp.safeio import read_bounded_text

MAX_PLAN_BYTES = 1024 * 1024
MAX_STAGES = 200
MAX_CRITERIA = 100
#: Room kept around a plan's dates for what is derived from them (baseline, rounds, propagation, samples).
DATE_MARGIN = dt.timedelta(days=366)
DEFAULT_TOR_VERSIONS = ">=0.4.8.2"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_HEX40_RE = re.compile(r"^[0-9A-Fa-f]{40}\Z")


def read_plan_text(path: str | os.PathLike[str]) -> str:
    """A plan file's text: a regular UTF-8 file of at most MAX_PLAN_BYTES (kistexp/safeio.py)."""
    return read_bounded_text(path, MAX_PLAN_BYTES, "plan", PlanError)


def load_plan(path: str | os.PathLike[str]) -> model.Plan:
    """Read, parse and validate a plan file; raises PlanError with a one-line message."""
    return parse_plan(read_plan_text(path), os.fsdecode(path))


def parse_plan(text: str, path: str = "<plan>") -> model.Plan:
    """Parse plan text; ``path`` is used in messages."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: plan is larger than the {MAX_PLAN_BYTES}-byte limit")
    try:
        data = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        message = str(exc).splitlines()[0] if str(exc) else "invalid TOML"
        line = getattr(exc, "lineno", None)
        raise PlanError(f"{path}: TOML syntax error: {message}", file=path, line=line,
                        problem=f"TOML syntax error: {message}") from None
    except (RecursionError, ValueError) as exc:
        long_number = _LONG_NUMBER_RE.search(text)
        if long_number is not None:  # int() refuses more than sys.get_int_max_str_digits() (4,300) digits
            line = text.count("\n", 0, long_number.start()) + 1
            problem = "a number has more than 4,300 digits (no parameter, threshold or count needs that many)"
            raise PlanError(f"{path}:{line}: {problem}", file=path, line=line, problem=problem) from None
        message = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise PlanError(f"{path}: TOML syntax error: {message}") from None
    return _build(Source(path, text), data)


_LONG_NUMBER_RE = re.compile(r"[0-9][0-9_]{4300,}")


_TOP_KEYS = ("experiment", "baseline", "stages", "switchback", "authorities", "criteria", "simulation")
_EXPERIMENT_KEYS = ("name", "kind", "owner", "contact", "description", "start", "tor_versions", "parameters",
                    "tickets", "on_inconclusive", "max_extension", "correction")


def _build(src: Source, data: dict[str, Any]) -> model.Plan:
    root = Table(src, data, "")
    root.check_keys(_TOP_KEYS)
    exp = root.table("experiment")
    assert exp is not None
    exp.check_keys(_EXPERIMENT_KEYS)
    name = exp.string("name")
    if not _NAME_RE.match(name):
        raise src.error(exp.key("name"), "use 1-100 letters, digits, '.', '_' or '-', starting alphanumeric")
    kind = exp.choice("kind", model.PLAN_KINDS, default="staged")
    owner = exp.string("owner")
    contact = exp.string("contact")
    description = exp.string("description", required=False)
    start = _start_time(exp)
    versions_text = exp.string("tor_versions", required=False, default=DEFAULT_TOR_VERSIONS)
    try:
        versions = parse_version_range(versions_text)
    except ValueError as exc:
        raise src.error(exp.key("tor_versions"), str(exc)) from None
    exp.strings("tickets", required=False)
    parameters = exp.strings("parameters", limit=50)
    if not parameters:
        raise src.error(exp.key("parameters"), "name at least one parameter under test")
    for i, param in enumerate(parameters):
        if param in parameters[:i]:
            raise src.error(f"{exp.key('parameters')}[{i}]", f"{param} is listed twice")
        if not param or " " in param or "=" in param:
            raise src.error(f"{exp.key('parameters')}[{i}]", f"{param!r} is not a parameter name")

    switchback = None
    if kind == "staged":
        if root.has("switchback"):
            raise src.error("switchback", "only plans of kind \"switchback\" take a [switchback] table")
        stages = _stages(root, parameters)
    else:
        if root.has("stages"):
            raise src.error("stages", "a switchback plan has no [[stages]]; its [switchback] table makes them")
        switchback = _switchback(root, parameters)
        stages = _expand_switchback(switchback)

    baseline = _baseline(root, parameters)
    authorities = _authorities(root)
    # the plan's defaults for the criteria that do not say what ends their stage inconclusive
    on_inconclusive = exp.choice("on_inconclusive", model.ON_INCONCLUSIVE_ACTIONS,
                                 default=model.DEFAULT_ON_INCONCLUSIVE)
    max_extension = exp.duration("max_extension") if exp.has("max_extension") else None
    criteria, anonymity = _criteria(root, on_inconclusive, max_extension)
    # how the stage's criteria share the FAIL error (docs/judge.md "Several criteria")
    correction = exp.choice("correction", model.CORRECTIONS, default=model.DEFAULT_CORRECTION)
    simulation = _simulation(root)
    plan = model.Plan(
        path=src.path, name=name, kind=kind, owner=owner, contact=contact, description=description,
        start=start, tor_versions=versions, tor_versions_text=versions_text, parameters=parameters,
        stages=stages, baseline=baseline, authorities=authorities, criteria=criteria, simulation=simulation,
        switchback=switchback, correction=correction, anonymity=anonymity,
    )
    _check_date_range(exp, plan)
    return plan


def _check_date_range(exp: Table, plan: model.Plan) -> None:
    """Every date derived from a plan (its baseline before the start; consensus rounds, propagation and
    sample windows after its end) must be one Python can compute: years 1 to 9999 (OverflowError past them)."""
    try:
        plan.start - plan.baseline.duration - DATE_MARGIN
        plan.end + DATE_MARGIN
    except OverflowError:
        raise exp.src.error(
            exp.key("start"),
            f"{_iso(plan.start)} is too near the ends of the calendar kistexp computes with (years 1 to 9999): "
            f"the baseline ({format_duration(plan.baseline.duration)}) before it and the stages after it, with "
            f"{DATE_MARGIN.days} days to spare, must fit") from None


def _iso(when: dt.datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _start_time(exp: Table) -> dt.datetime:
    value = exp.raw("start", True, None)
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise exp.src.error(exp.key("start"), f"{value!r} is not an RFC 3339 date-time") from None
    if not isinstance(value, dt.datetime):
        raise exp.src.error(exp.key("start"), f"expected an RFC 3339 date-time, got {type_name(value)}")
    if value.tzinfo is None:
        raise exp.src.error(exp.key("start"), "give the time in UTC with an offset, e.g. 2027-06-07T12:00:00Z")
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:  # 9999-12-31T23:00:00-02:00 is in year 10000 in UTC
        raise exp.src.error(exp.key("start"), f"{value.isoformat()} is outside years 1 to 9999 in UTC") from None


def _values(src: Source, data: Any, path: str, parameters: tuple[str, ...],
            require_all: bool = True) -> tuple[tuple[str, model.ParamValue], ...]:
    table = Table(src, data, path)
    values: list[tuple[str, model.ParamValue]] = []
    for key, value in table.data.items():
        if key not in parameters:
            raise src.error(table.key(key), f"{key} is not in experiment.parameters ({', '.join(parameters)})")
        if isinstance(value, str) and value == model.UNSET:
            values.append((key, model.UNSET))
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise src.error(table.key(key), f"expected an integer or \"unset\", got {type_name(value)}")
        if not INT32_MIN <= value <= INT32_MAX:
            raise src.error(table.key(key), f"{value} is outside the int32 range tor accepts")
        values.append((key, value))
    if require_all:
        missing = [p for p in parameters if p not in table.data]
        if missing:
            raise src.error(path, f"no value for {', '.join(missing)}")
    return tuple(values)


def _stages(root: Table, parameters: tuple[str, ...]) -> tuple[model.Stage, ...]:
    items = root.array("stages", limit=MAX_STAGES)
    if not items:
        raise root.src.error("stages", "the plan has no stages")
    stages: list[model.Stage] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        t = Table(root.src, item, f"stages[{i}]")
        t.check_keys(("name", "values", "duration", "gate", "note"))
        name = t.string("name")
        if not name.strip():
            raise root.src.error(t.key("name"), "stage name is empty")
        if name in seen:
            raise root.src.error(t.key("name"), f"duplicate stage name {name!r} (also stages[{seen[name]}])")
        seen[name] = i
        values = _values(root.src, t.raw("values", True, None), t.key("values"), parameters)
        stages.append(model.Stage(name=name, values=values, duration=t.duration("duration"),
                                  gate=t.choice("gate", model.GATES, default="auto"),
                                  note=t.string("note", required=False)))
    return tuple(stages)


def _switchback(root: Table, parameters: tuple[str, ...]) -> model.Switchback:
    t = root.table("switchback")
    assert t is not None
    t.check_keys(("treatment", "control", "period", "washout", "burnout", "cycles", "gate"))
    sb = model.Switchback(
        treatment=_values(root.src, t.raw("treatment", True, None), t.key("treatment"), parameters),
        control=_values(root.src, t.raw("control", True, None), t.key("control"), parameters),
        period=t.duration("period"),
        washout=t.duration("washout"),
        cycles=t.integer("cycles", 1, MAX_STAGES // 2),
        gate=t.choice("gate", model.GATES, default="auto"),
        burnout=t.duration("burnout") if t.has("burnout") else dt.timedelta(0),
    )
    if sb.washout >= sb.period:
        raise root.src.error(t.key("washout"), "washout must be shorter than the period")
    if sb.washout + sb.burnout >= sb.period:
        raise root.src.error(t.key("burnout"), "washout and burnout together must be shorter than the period")
    if sb.treatment == sb.control:
        raise root.src.error(t.key("control"), "control values equal the treatment values")
    return sb


def _expand_switchback(sb: model.Switchback) -> tuple[model.Stage, ...]:
    stages = []
    for cycle in range(1, sb.cycles + 1):
        for arm, values in (("treatment", sb.treatment), ("control", sb.control)):
            stages.append(model.Stage(name=f"{arm}-{cycle}", values=values, duration=sb.period, gate=sb.gate,
                                      note=f"first {sb.washout} is washout"))
    return tuple(stages)


def _baseline(root: Table, parameters: tuple[str, ...]) -> model.Baseline:
    t = root.table("baseline")
    assert t is not None
    t.check_keys(("duration", "values"))
    values: tuple[tuple[str, model.ParamValue], ...] = ()
    if t.has("values"):
        values = _values(root.src, t.data["values"], t.key("values"), parameters, require_all=False)
    return model.Baseline(duration=t.duration("duration"), values=values)


def _authorities(root: Table) -> model.AuthoritySet:
    t = root.table("authorities")
    assert t is not None
    t.check_keys(("participating", "others", "custom"))
    known: tuple[DirectoryAuthority, ...] = DEFAULT_AUTHORITIES
    if t.has("custom"):
        known = tuple(_custom_authority(root.src, item, f"authorities.custom[{i}]")
                      for i, item in enumerate(t.array("custom", limit=64)))
        if not known:
            raise root.src.error(t.key("custom"), "lists no authority")
        nicks = [a.nickname.lower() for a in known]
        for i, nick in enumerate(nicks):
            if nick in nicks[:i]:
                raise root.src.error(f"authorities.custom[{i}].nickname", f"duplicate authority {nick!r}")
    by_nick = {a.nickname.lower(): a.nickname for a in known}
    participating = []
    for i, nick in enumerate(t.strings("participating", limit=64)):
        canonical = by_nick.get(nick.lower())
        if canonical is None:
            close = difflib.get_close_matches(nick.lower(), list(by_nick), n=1)
            hint = f" (did you mean {by_nick[close[0]]!r}?)" if close else ""
            raise root.src.error(f"authorities.participating[{i}]", f"unknown authority {nick!r}{hint}")
        if canonical in participating:
            raise root.src.error(f"authorities.participating[{i}]", f"{canonical} is listed twice")
        participating.append(canonical)
    others = t.choice("others", ("listing", "silent"), default="listing")
    return model.AuthoritySet(authorities=known, participating=tuple(participating), others=others)


def _custom_authority(src: Source, data: Any, path: str) -> DirectoryAuthority:
    t = Table(src, data, path)
    t.check_keys(("nickname", "v3ident", "dirport", "orport", "fingerprint"))
    nickname = t.string("nickname")
    if not NICKNAME_RE.fullmatch(nickname):
        raise src.error(t.key("nickname"), f"{nickname!r} is not a tor nickname (1-19 letters or digits)")
    v3ident = t.string("v3ident")
    if not V3IDENT_RE.fullmatch(v3ident):
        raise src.error(t.key("v3ident"), "expected 40 hex digits (the authority's v3 identity)")
    dirport = t.string("dirport")
    host, sep, port = dirport.rpartition(":")
    if not sep or not host or ascii_port(port) is None:
        raise src.error(t.key("dirport"), f"{dirport!r} is not HOST:PORT")
    fingerprint = t.string("fingerprint", required=False)
    if fingerprint and not _HEX40_RE.match(fingerprint):
        raise src.error(t.key("fingerprint"), "expected 40 hex digits")
    return DirectoryAuthority(nickname, v3ident.upper(), host.strip("[]"), int(port),
                              t.integer("orport", 1, 65535, required=False, default=443), fingerprint.upper())


class MarginError(PlanError):
    """An anonymity criterion's margin (its ``threshold``) that is not a non-negative number: lint reports it
    under its own rule (KX702) rather than as a plan that does not load (KX001)."""

    code = "KX702"


_ANONYMITY_KEYS = ("name", "measure", "comparison", "threshold", "on_fail", "role", "on_inconclusive")


def _criteria(root: Table, on_inconclusive: str = model.DEFAULT_ON_INCONCLUSIVE,
              max_extension: dt.timedelta | None = None
              ) -> tuple[tuple[model.Criterion, ...], tuple[model.AnonymityCriterion, ...]]:
    """The [[criteria]]: those on a metric, and the anonymity criteria (those naming an attack ``measure``)."""
    out = []
    anonymity = []
    for i, item in enumerate(root.array("criteria", required=False, limit=MAX_CRITERIA)):
        t = Table(root.src, item, f"criteria[{i}]")
        if t.has("measure"):
            anonymity.append(_anonymity_criterion(t, i, on_inconclusive))
            continue
        t.check_keys(("name", "metric", "statistic", "comparison", "threshold", "min_samples", "on_fail",
                      "critical", "role", "on_inconclusive", "max_extension"))
        critical = t.raw("critical", False, False)
        if not isinstance(critical, bool):
            raise root.src.error(t.key("critical"), f"expected true or false, got {type_name(critical)}")
        threshold = t.number("threshold")
        comparison = t.choice("comparison", model.COMPARISONS)
        if comparison != "above" and comparison != "below" and threshold < 0:
            raise root.src.error(t.key("threshold"), f"a {comparison} threshold must not be negative")
        role = t.choice("role", model.ROLES, default="guardrail")
        out.append(model.Criterion(
            metric=t.string("metric"), statistic=t.choice("statistic", model.STATISTICS),
            comparison=comparison, threshold=threshold,
            min_samples=t.integer("min_samples", 1, 10_000_000),
            # a signal's failure pauses whatever on_fail says, so it need not say one
            on_fail=t.choice("on_fail", model.ON_FAIL_ACTIONS, default="hold" if role == "signal" else None),
            name=t.string("name", required=False), critical=critical, role=role,
            on_inconclusive=t.choice("on_inconclusive", model.ON_INCONCLUSIVE_ACTIONS, default=on_inconclusive),
            max_extension=t.duration("max_extension") if t.has("max_extension") else max_extension,
        ))
    return tuple(out), tuple(anonymity)


def _anonymity_criterion(t: Table, index: int, on_inconclusive: str) -> model.AnonymityCriterion:
    """One [[criteria]] entry with a ``measure``: the paired change of an attack measure on the predictions."""
    src = t.src
    if t.has("metric"):
        raise src.error(t.key("metric"), "a criterion names a metric or an attack measure, not both: keep "
                                         "`measure` for an anonymity criterion, `metric` for a measured one")
    for key in t.data:
        if key not in _ANONYMITY_KEYS and key in ("statistic", "min_samples", "critical", "max_extension"):
            raise src.error(t.key(str(key)), f"an anonymity criterion (measure = ...) takes no {key}: it is judged "
                                             "once per stage on the predicted paired difference over the simulated "
                                             f"networks (keys: {', '.join(_ANONYMITY_KEYS)})")
    t.check_keys(_ANONYMITY_KEYS)
    role = t.choice("role", model.ROLES, default="guardrail")
    return model.AnonymityCriterion(
        measure=t.string("measure"),
        comparison=t.choice("comparison", model.ANONYMITY_COMPARISONS),
        threshold=_margin(t),
        on_fail=t.choice("on_fail", model.ON_FAIL_ACTIONS, default="hold" if role == "signal" else None),
        name=t.string("name", required=False), role=role,
        on_inconclusive=t.choice("on_inconclusive", model.ON_INCONCLUSIVE_ACTIONS, default=on_inconclusive),
        index=index)


def _margin(t: Table) -> float:
    """An anonymity criterion's ``threshold``: the margin of its non-inferiority test, a number >= 0 in the
    measure's unit (0.02 for two points of a rate)."""
    value = t.raw("threshold", True, None)
    key = t.key("threshold")
    hint = "the margin is a number >= 0 in the measure's unit, e.g. threshold = 0.02 for 2 points of a TPR"

    def refuse(problem: str) -> MarginError:
        err = t.src.error(key, f"{problem}: {hint}")
        return MarginError(str(err), file=err.file, line=err.line, key=err.key, problem=err.problem)

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse(f"expected a number, got {type_name(value)}"
                     + (f" ({value[:20]!r})" if isinstance(value, str) else ""))
    try:
        margin = float(value)
    except OverflowError:
        raise refuse(f"{str(value)[:12]}... is too large for a number") from None
    if margin != margin or margin in (float("inf"), float("-inf")):
        raise refuse("expected a finite number")
    if margin < 0:
        raise refuse(f"{margin:g} is negative (the comparison says which way is leakier)")
    return margin


def _simulation(root: Table) -> model.SimulationSettings:
    t = root.table("simulation", required=False)
    if t is None:
        return model.SimulationSettings()
    t.check_keys(("population_scale", "seeds", "duration"))
    scale = t.number("population_scale", required=False, default=0.01)
    if not 0 < scale <= 1:
        raise root.src.error(t.key("population_scale"), f"{scale:g} is not in (0, 1]")
    seeds_raw = t.array("seeds", required=False, limit=1000) or [1]
    seeds = []
    for i, seed in enumerate(seeds_raw):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise root.src.error(f"{t.key('seeds')}[{i}]", "expected a non-negative integer seed")
        seeds.append(seed)
    duration = t.duration("duration", required=False, default="60s")
    return model.SimulationSettings(population_scale=scale, seeds=tuple(seeds), duration=duration, declared=True)


