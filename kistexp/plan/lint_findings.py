"""What plan lint reports: findings, the report of a run, the detectable change of each criterion, and
the collector that folds findings repeated over stages and criteria into one line each
(kistexp/plan/lint.py runs the rules)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from kistexp import jsonout
from kistexp.plan.locate import index_lines, line_of
from kistexp.plan.model import Plan


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
    detectable: tuple[Detectable, ...] = ()  # every judged criterion in every stage

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
        self.detectable: list[Detectable] = []

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


def _change_json(change: float | None) -> float | None:
    return None if change is None or not math.isfinite(change) else round(change, 4)


@jsonout.shape(rename={"change": "detectable_change", "p_pass": "power_pass", "p_fail": "power_fail"},
               fields={"change": _change_json, "p_pass": lambda p: round(p, 4), "p_fail": lambda p: round(p, 4),
                       "n_stage": int, "n_baseline": int, "alpha_fail": lambda a: round(a, 6)})
@attrs.frozen
class Detectable:
    """What one criterion can tell in one stage at its planned end (spec judge.md §4.4).

    ``change`` is the smallest true change the judge FAILs with 80 % power (the minimum
    detectable effect), on the threshold's scale: relative comparisons as a relative change
    (0.14 is a 14 % rise), absolute ones in the metric's units; None when it cannot be
    forecast (no samples, a level comparison)."""

    file: str
    stage: str
    criterion: str
    metric: str
    comparison: str
    threshold: float
    change: float | None
    p_pass: float  # P(PASS | no change)
    p_fail: float  # P(FAIL | twice the threshold)
    n_stage: float
    n_baseline: float
    alpha_fail: float
