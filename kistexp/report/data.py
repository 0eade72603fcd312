"""What a report shows, read from an experiment directory; nothing here computes a result.

The run's spec and status come from ``kistexp.rollout.runs.load_spec`` (the plan copy and cadence the
run was laid on); the journal's read-only reader (``kistexp.rollout.journal.JournalReader``) gives
decisions, transitions, intents, votes, consensuses, verdicts, operator commands and the judged samples;
the report keeps its verdicts and commands as the reader's rows and the rest in the shapes its pages take
(the dicts of ``Journal``'s readers). Predictions come from ``MetricStore.load_predictions`` and are
summarised by ``kistexp.population.predict.summarize_predictions``, as ``kistexp simulate`` prints them.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np

from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.metrics import catalogue
from kistexp.metrics.series import Prediction
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import Plan
from kistexp.population.predict import StageFigure, plan_transitions, summarize_predictions
from kistexp.rollout.journal import CommandRow, JournalReader, VerdictRow
from kistexp.rollout.rollback import RollbackPlan, plan_rollback
from kistexp.rollout.runs import load_spec
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import REVERT_DEFAULT, ROLLBACK_KINDS, Status
from kistexp.rollout.watch.health import HealthSummary, health_of

# Relay costs operators ask about first (issue 9): CPU, memory, bandwidth.
RELAY_COSTS = ("relay_cpu_utilization", "relay_rss_bytes", "relay_bandwidth_bytes_per_s")


class ReportError(KistexpError):
    """A report cannot be made from what the experiment directory or plan holds."""


@attrs.frozen
class Rollback:
    """A rollback the run decided (or the rehearsed abort), with its engine-computed plan."""

    at: dt.datetime
    cause: str
    plan: RollbackPlan
    rehearsal: bool


@attrs.frozen
class ExperimentData:
    path: Path
    mode: str  # dry-run | live
    spec: RolloutSpec
    # where the judged samples came from: measured (live), recorded (replay) or predicted (a dry run,
    # or a live run asked to with --metrics predicted); journals from before measured runs: predicted
    metrics: str
    # samples left out of each (metric, phase name) because their nodes held another consensus (mid-switch)
    excluded: tuple[tuple[str, str, int], ...]
    status: Status
    votes: tuple[dict, ...]  # authority, valid_after, params
    consensuses: tuple[dict, ...]  # valid_after, params, signers
    transitions: tuple[dict, ...]
    decisions: tuple[dict, ...]
    intents: tuple[dict, ...]
    commands: tuple[CommandRow, ...]
    verdicts: tuple[VerdictRow, ...]  # in the order of the looks
    batches: Mapping[tuple[str, int], np.ndarray]  # (metric, stage index; 0 = baseline) -> judged samples
    measured: Mapping[tuple[str, str, str], np.ndarray]  # (metric, relay_class, stage) -> store samples
    figures: tuple[StageFigure, ...]  # predictions summarised
    rollbacks: tuple[Rollback, ...]
    rehearsals: tuple[RollbackPlan, ...]  # each kind from where the record ends
    stage_names: tuple[str, ...]  # index -> name, 0 = "baseline"
    # each round's votes and consensus signers, the stretches without a majority-signed consensus and
    # each authority's outages
    health: HealthSummary = HealthSummary()

    def stage_name(self, index: int) -> str:
        return self.stage_names[index] if 0 <= index < len(self.stage_names) else f"stage {index}"


# --- reading -----------------------------------------------------------------------------------

def _open_journal(exp: ExperimentDir) -> JournalReader:
    """The journal's reader, or a one-line error saying how to make a journal when there is none."""
    reader = None
    try:
        reader = JournalReader(exp.db_path)
        if reader.meta().cadence is not None:
            return reader
    except (KistexpError, sqlite3.Error):
        pass
    if reader is not None:
        reader.close()
    raise ReportError(f"{exp.db_path}: no rollout journal in this experiment (make one with "
                      f"kistexp dry-run PLAN --dir {exp.path} or kistexp run PLAN --dir {exp.path})")


# The journal's rows as the report's pages take them: the dicts of ``Journal``'s readers.

def _votes(reader: JournalReader) -> tuple[dict, ...]:
    rows = sorted(reader.votes_seen(), key=lambda v: (v.valid_after, v.authority))
    return tuple({"authority": v.authority, "valid_after": v.valid_after,
                  "params": None if v.params is None else dict(v.params)} for v in rows)


def _consensuses(reader: JournalReader) -> tuple[dict, ...]:
    rows = sorted(reader.consensus_seen(), key=lambda c: (c.valid_after, c.flavour))
    return tuple({"valid_after": c.valid_after, "params": None if c.params is None else dict(c.params),
                  "signers": list(c.signers)} for c in rows)


def _transitions(reader: JournalReader) -> tuple[dict, ...]:
    return tuple({"seq": t.seq, "at": t.at, "from": t.from_state, "to": t.to_state, "stage": t.stage, "kind": t.kind,
                  "targets": dict(t.targets), "valid_after": t.valid_after, "cause": t.cause}
                 for t in reader.transitions())


def _decisions(reader: JournalReader) -> tuple[dict, ...]:
    return tuple({"at": d.at, "decision": d.decision, "stage": d.stage, "valid_after": d.valid_after,
                  "message": d.message} for d in reader.decisions())


def _intents(reader: JournalReader) -> tuple[dict, ...]:
    return tuple({"id": i.id, "idem_key": i.idem_key, "seq": i.seq, "authority": i.authority,
                  "desired": dict(i.desired), "valid_after": i.valid_after, "state": i.state, "attempts": i.attempts,
                  "evidence": i.evidence} for i in reader.intents())


def _stage_of_phase(phase: str) -> int | None:
    """Batches are tagged ``baseline``, ``stage:<i>:<valid-after>`` or ``excluded`` (schema.py)."""
    if phase == "baseline":
        return 0
    if phase.startswith("stage:"):
        return int(phase.split(":")[1])
    return None


def _excluded(reader: JournalReader, names: tuple[str, ...]) -> tuple[tuple[str, str, int], ...]:
    """(metric, phase name, samples left out) wherever the mid-switch rule left samples out."""
    out: dict[tuple[str, str], int] = {}
    for b in reader.metric_batches():
        stage = _stage_of_phase(b.phase)
        if b.excluded and stage is not None:
            key = (b.metric, names[stage] if stage < len(names) else b.phase)
            out[key] = out.get(key, 0) + b.excluded
    return tuple((m, p, n) for (m, p), n in sorted(out.items()))


def _batches(reader: JournalReader) -> dict[tuple[str, int], np.ndarray]:
    out: dict[tuple[str, int], list[np.ndarray]] = {}
    for metric, phase in reader.metric_phases():
        stage = _stage_of_phase(phase)
        if stage is not None:
            out.setdefault((metric, stage), []).append(reader.batch_values(metric, phase))
    return {k: np.concatenate(v) for k, v in out.items()}


def _measured(store: MetricStore, spec: RolloutSpec, names: tuple[str, ...], transitions: tuple[dict, ...]
              ) -> dict[tuple[str, str, str], np.ndarray]:
    """Stored relay-cost samples (collectors, operator reports) per relay class and the stage whose
    value was in effect when each was taken (``param_value``): the latest stage begun by then that runs
    that value (so 10 ms in the last stage is not counted as the 10 ms baseline, and a relay still on
    the old value while a consensus propagates counts for the stage it runs). Samples of unknown value
    are left out."""
    if len(spec.parameters) != 1:  # param_value names one parameter's value
        return {}
    param = spec.parameters[0]
    # (start, stage name, value) of each stage as it happened, from the journal's transitions
    planned = [dict(spec.values_of(i)).get(param) for i in range(len(names))]

    def name_of(t: dict) -> str:
        if t["kind"] == "rollback":  # back on an earlier stage's value: counted with that stage
            value = t["targets"].get(param)
            return names[planned.index(value)] if value in planned else "rollback"
        return names[t["stage"]] if 0 <= t["stage"] < len(names) else f"stage {t['stage']}"

    spans = [(spec.baseline_start, names[0], planned[0])]
    spans += [(t["valid_after"], name_of(t), t["targets"].get(param)) for t in transitions]
    out: dict[tuple[str, str, str], list[float]] = {}
    for metric in RELAY_COSTS:
        for s in store.select(metric):
            if s.param_value is None:
                continue
            stage = next((name for start, name, value in reversed(spans)
                          if value == s.param_value and start <= s.time), None)
            if stage is None:
                stage = next((name for _start, name, value in spans if value == s.param_value), None)
            if stage is None:
                continue
            cls = s.labels.get("relay_class") or s.labels.get("position") or "all"
            out.setdefault((metric, cls, stage), []).append(s.value)
    return {k: np.asarray(v) for k, v in out.items()}


def _rollbacks(spec: RolloutSpec, decisions: tuple[dict, ...], transitions: tuple[dict, ...], status: Status
               ) -> tuple[Rollback, ...]:
    """Each rollback the journal decided, planned by the engine's own ``plan_rollback``; and the
    rehearsal: what reverting to the baseline would take at the end of the record."""
    out = []
    for d in decisions:
        if not d["decision"].startswith("rollback:") or d["decision"] == "rollback:hold":
            continue
        kind = d["decision"].split(":", 1)[1]
        t = next((x for x in transitions if x["valid_after"] == d["valid_after"] and x["kind"] == "rollback"), None)
        prev = [x for x in transitions if t is None or x["seq"] < t["seq"]]
        current = tuple(prev[-1]["targets"].items()) if prev else spec.baseline_values
        stage = prev[-1]["stage"] if prev else 0
        out.append(Rollback(d["at"], d["message"], plan_rollback(spec, kind, current, stage, d["at"]), False))
    at = decisions[-1]["at"] if decisions else spec.baseline_start
    out.append(Rollback(at, "rehearsal: revert to the baseline's values at the last journaled decision",
                        plan_rollback(spec, REVERT_DEFAULT, status.values, status.stage, at), True))
    return tuple(out)


def _rehearsals(spec: RolloutSpec, decisions: tuple[dict, ...], status: Status) -> tuple[RollbackPlan, ...]:
    """Every rollback kind from where the record ends, as ``kistexp rollback --dry-run`` answers it."""
    at = decisions[-1]["at"] if decisions else spec.baseline_start
    return tuple(plan_rollback(spec, kind, status.values, status.stage, at) for kind in ROLLBACK_KINDS)


def load_experiment(path: str | Path) -> ExperimentData:
    """Everything the report of experiment directory ``path`` shows. One-line errors for a missing
    directory, a corrupt database and a directory whose database holds no rollout journal."""
    exp = ExperimentDir.open(path)  # StoreError: missing, not a directory, corrupt, newer schema
    try:
        reader = _open_journal(exp)
        try:
            return _read(exp, reader)
        except (sqlite3.DatabaseError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReportError(f"{exp.db_path}: corrupt rollout journal: {exc}") from None
        finally:
            reader.close()
    finally:
        exp.close()


def _read(exp: ExperimentDir, reader: JournalReader) -> ExperimentData:
    spec, status, meta = load_spec(exp.path)  # the spec the run was laid on: its plan copy and cadence
    names = ("baseline",) + tuple(s.name for s in spec.stages)
    store = MetricStore(exp.db)
    figures = summarize_predictions(store.load_predictions(), list(names))
    with reader.snapshot():  # the journal as of one commit, beside a run still writing it
        decisions, transitions = _decisions(reader), _transitions(reader)
        return ExperimentData(
            path=exp.path, mode=meta.get("mode", "live"), spec=spec, metrics=meta.get("metrics") or "predicted",
            excluded=_excluded(reader, names), status=status,
            votes=_votes(reader), consensuses=_consensuses(reader), transitions=transitions, decisions=decisions,
            intents=_intents(reader), commands=tuple(reader.commands()), verdicts=tuple(reader.looks()),
            batches=_batches(reader), measured=_measured(store, spec, names, transitions),
            figures=tuple(figures),
            rollbacks=_rollbacks(spec, decisions, transitions, status), rehearsals=_rehearsals(spec, decisions, status),
            stage_names=names, health=health_of(reader, spec))


@attrs.frozen
class PlanData:
    plan: Plan
    stages: tuple[str, ...]  # prediction stage names in plan order
    figures: tuple[StageFigure, ...]
    predictions: tuple[Prediction, ...]
    source: Path


def plan_stage_names(plan: Plan) -> tuple[str, ...]:
    return tuple(t.to_stage for t in plan_transitions(plan))


def load_plan_predictions(plan: Plan, exp_path: str | Path) -> PlanData:
    """The predictions ``kistexp simulate PLAN --dir EXP`` saved, for the report and announcement
    made before a run. No predictions: a one-line error saying how to make them."""
    how = f"make them with: kistexp simulate {plan.path} --dir {exp_path}"
    if not (Path(exp_path) / "experiment.db").is_file():
        raise ReportError(f"{exp_path}: no predictions for plan {plan.name!r} (no experiment database); {how}")
    exp = ExperimentDir.open(exp_path)
    try:
        rows = MetricStore(exp.db).load_predictions()
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"{exp.db_path}: corrupt experiment database: {exc}") from None
    finally:
        exp.close()
    stages = plan_stage_names(plan)
    have = {r.stage for r in rows}
    missing = [s for s in stages if s not in have]
    if not rows or missing:
        what = "no predictions" if not rows else f"no predictions for stage(s) {', '.join(missing)}"
        raise ReportError(f"{exp_path}: {what} of plan {plan.name!r}; {how}")
    return PlanData(plan, stages, tuple(summarize_predictions(rows, list(stages))), tuple(rows), Path(exp_path))


def metric_unit(metric: str) -> str:
    m = catalogue.get(metric)
    return m.unit if m else ""


def verdict_looks(exp_path: str | Path) -> dict[str, list[dict]]:
    """Each criterion's verdicts in time order (effect and interval per look), read-only so it works
    beside a running engine; {} when the directory holds no journal."""
    try:
        reader = JournalReader.of_experiment(exp_path)
    except KistexpError:
        return {}
    try:
        rows = reader.looks()
    except sqlite3.Error:
        return {}
    finally:
        reader.close()
    out: dict[str, list[dict]] = {}
    for v in rows:
        out.setdefault(v.criterion, []).append({"window_end": v.window_end, "stage": v.stage, "outcome": v.outcome,
                                                "effect": v.effect, "ci_low": v.ci_low, "ci_high": v.ci_high})
    return out
