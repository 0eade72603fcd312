"""What a report shows, read from an experiment directory; nothing here computes a result.

The run's spec and status come from ``kistexp.rollout.runs.load_spec`` (the plan copy and cadence the
run was laid on); the journal's read-only reader (``kistexp.rollout.journal.JournalReader``) gives
decisions, transitions, intents, votes, consensuses, verdicts, operator commands and the judged samples;
the report keeps its verdicts and commands as the reader's rows and the rest in the shapes its pages take
(the dicts of ``Journal``'s readers). Predictions come from ``MetricStore.load_predictions`` and are
summarised by ``kistexp.population.predict.summarize_predictions``, as ``kistexp simulate`` prints them;
attack measures from ``MetricStore.load_attack_values`` as paired differences stage minus baseline
(``kistexp.anonymity.stage_differences``). How the predictions were made (full or scaled-down NIC rates) is
the last row of ``MetricStore.load_prediction_runs``, which both reports and the announcement print beside
the predictions (``PredictionsMade``).
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np

from kistexp.anonymity import AttackFigure, stage_differences
from kistexp.dirauth.propagation import NodeClass
from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.metrics import catalogue
from kistexp.metrics.series import Prediction, PredictionRun
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import Plan
from kistexp.population.predict import FAST_BYTE_BUDGET, StageFigure, summarize_predictions
from kistexp.report.wording import attack_number, effect_words, interval_words, limit_words
from kistexp.rollout.dryrun import AuthorityFault, InjectionError, MetricGap, MetricShift, parse_injection
from kistexp.rollout.engine import metric_source_of
from kistexp.rollout.journal import CommandRow, JournalDamageError, JournalReader, VerdictRow
from kistexp.rollout.journal.codec import names_value
from kistexp.rollout.journal.fit import meta_value, rows_fit_plan
from kistexp.rollout.journal.reader import phase_stage
from kistexp.rollout.rollback import RollbackPlan, eta, plan_rollback
from kistexp.rollout.runs import load_spec
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import COMPLETED, REVERT_DEFAULT, ROLLBACK_KINDS, Status
from kistexp.rollout.watch.health import HealthSummary, health_of

# Relay costs operators ask about first (issue 9): CPU, memory, bandwidth.
RELAY_COSTS = ("relay_cpu_utilization", "relay_rss_bytes", "relay_bandwidth_bytes_per_s")


class ReportError(KistexpError):
    """A report cannot be made from what the experiment directory or plan holds."""


UNRECORDED = "how these predictions were made is not recorded"


def _scale(x: float) -> str:
    return f"{x:.2g}"


@attrs.frozen
class PredictionsMade:
    """How the predictions a report or announcement quotes were made: the last ``kistexp simulate`` run
    recorded in the experiment database (``prediction_runs``), or None where none is (an older experiment,
    predictions stored before the table, a dry run on another directory's predictions). ``label`` is what
    the pages print beside the predictions; a fast-mode one is a warning."""

    run: PredictionRun | None = None

    @property
    def fast(self) -> bool:
        return self.run is not None and self.run.rates == "fast"

    @property
    def networks(self) -> str:
        """ "3 networks of 120 relays" (or "of 118-122 relays" where the samples differ); "" if unknown."""
        relays = self.run.relays if self.run is not None else ()
        if not relays:
            return ""
        low, high = min(relays), max(relays)
        size = f"{low:,}" if low == high else f"{low:,}-{high:,}"
        return f"{len(relays)} network{'s' if len(relays) != 1 else ''} of {size} relays"

    @property
    def nic_scale(self) -> str:
        """The factor the NICs were multiplied by: "x0.33-0.34", or "x0.33" where every network had the same."""
        if self.run is None:
            return ""
        low, high = _scale(self.run.nic_scale_min), _scale(self.run.nic_scale_max)
        return f"x{low}" if low == high else f"x{low}-{high}"

    @property
    def budget(self) -> str:
        """The bytes per second a fast-mode network's offered traffic is scaled to fit."""
        return f"{FAST_BYTE_BUDGET / 1e6:g} MB/s"

    @property
    def label(self) -> str:
        if self.run is None:
            return UNRECORDED
        if self.fast:
            return (f"fast mode: NICs scaled down {self.nic_scale} so traffic fits {self.budget} per network; "
                    "stage effects of a run-interval change are shrunk (docs/validation.md)")
        return "predicted at full NIC rates" + (f" on {self.networks}" if self.networks else "")

    def as_json(self) -> dict:
        """``predictions_made`` in ``--json`` documents: the run's rates ("full" or "fast"), relays per
        sampled network and NIC scale, when it was made, and the label; null values when not recorded."""
        run = self.run
        return {"rates": None if run is None else run.rates,
                "relays": [] if run is None else list(run.relays),
                "nic_scale_min": None if run is None else run.nic_scale_min,
                "nic_scale_max": None if run is None else run.nic_scale_max,
                "made": None if run is None else run.made,
                "label": self.label}


def predictions_made(exp: ExperimentDir, store: MetricStore) -> PredictionsMade:
    """The last recorded prediction run of experiment ``exp`` (the one that made the predictions stored now).
    None recorded, or a database from before the table that stays unmigrated (read-only): unrecorded. A row
    that cannot be read is one line, never taken for none."""
    try:
        runs = store.load_prediction_runs()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return PredictionsMade()
        raise ReportError(f"{exp.db_path}: cannot read the prediction runs: {exc}") from None
    except (ValueError, TypeError, AttributeError) as exc:  # rates neither full nor fast, relays not numbers
        raise ReportError(f"{exp.db_path}: corrupt prediction runs: {exc}") from None
    return PredictionsMade(runs[-1] if runs else None)


@attrs.frozen
class Rollback:
    """A rollback the run decided (or the rehearsed abort), with its engine-computed plan."""

    at: dt.datetime
    cause: str
    plan: RollbackPlan
    rehearsal: bool


@attrs.frozen
class Mark:
    """Something injected, scripted, down or missing, as the time-axis plots mark it: a span from
    ``start`` to ``end``, or an instant when ``end`` is None. ``metrics`` names the metrics it touches
    (empty: every metric)."""

    kind: str  # injection | command | outage | gap
    label: str
    start: dt.datetime
    end: dt.datetime | None = None
    metrics: tuple[str, ...] = ()


@attrs.frozen
class Failure:
    """A criterion that failed in a stage, at its first failing look, with the effect in plain words:
    relative comparisons as the relative change (ratio 1.706 -> "+70.6 %"), absolute ones as the
    difference in the metric's display unit (``catalogue.display``), above/below as the stage's value."""

    criterion: str
    metric: str
    stage: str
    at: dt.datetime
    effect: str
    interval: str
    limit: str
    verdict_id: int
    role: str = "guardrail"  # a signal's failure paused for an operator; a guardrail's rolled back


@attrs.frozen
class Action:
    """A rollback the run decided, who had to act and who did, and when the network was back."""

    kind: str
    decided: dt.datetime
    from_stage: str
    must_act: tuple[str, ...]
    acted: tuple[str, ...]  # authorities whose intent for the rollback's transition was carried out
    values: str  # the values the consensus carries after it, e.g. "KISTSchedRunInterval=10"
    valid_after: dt.datetime | None  # the first consensus seen carrying them (None: none seen)
    relays_99: dt.datetime | None
    clients_99: dt.datetime | None


@attrs.frozen
class Summary:
    """What a reviewer reads first: built from the journal, nothing computed anew but the wording."""

    outcome: str
    failures: tuple[Failure, ...]
    actions: tuple[Action, ...]
    metrics: str  # measured | recorded | predicted, with where they came from
    injections: tuple[str, ...]
    commands: tuple[str, ...]
    outages: tuple[str, ...]
    gaps: tuple[str, ...]
    marks: tuple[Mark, ...] = ()


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
    summary: Summary | None = None
    # what the simulated attacks gain per stage and measure (empty: kistexp simulate stored none)
    attacks: tuple[AttackFigure, ...] = ()
    # how the stored predictions were made (full or fast rates; unrecorded in older experiments)
    predictions_made: PredictionsMade = PredictionsMade()

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
    except JournalDamageError:
        if reader is not None:
            reader.close()
        raise  # a damaged journal is named as such, never taken for none
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


def _transitions(reader: JournalReader, spec: RolloutSpec, plan_path: Path) -> tuple[dict, ...]:
    rows = reader.transitions()
    rows_fit_plan(spec, reader.path, plan_path, transitions=rows)
    return tuple({"seq": t.seq, "at": t.at, "from": t.from_state, "to": t.to_state, "stage": t.stage, "kind": t.kind,
                  "targets": dict(t.targets), "valid_after": t.valid_after, "cause": t.cause} for t in rows)


def _decisions(reader: JournalReader, spec: RolloutSpec, plan_path: Path) -> tuple[dict, ...]:
    rows = reader.decisions()
    rows_fit_plan(spec, reader.path, plan_path, decisions=rows)
    return tuple({"at": d.at, "decision": d.decision, "stage": d.stage, "valid_after": d.valid_after,
                  "message": d.message} for d in rows)


def _intents(reader: JournalReader) -> tuple[dict, ...]:
    return tuple({"id": i.id, "idem_key": i.idem_key, "seq": i.seq, "authority": i.authority,
                  "desired": dict(i.desired), "valid_after": i.valid_after, "state": i.state, "attempts": i.attempts,
                  "evidence": i.evidence} for i in reader.intents())


def _stage_of_phase(phase: str) -> int | None:
    """Batches are tagged ``baseline``, ``stage:<i>:<valid-after>`` or ``excluded`` (schema.py); the
    reader has checked each phase it returns."""
    return phase_stage(phase)


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
        if not d["decision"].startswith("rollback:"):
            continue
        kind = d["decision"].split(":", 1)[1]
        t = next((x for x in transitions if x["valid_after"] == d["valid_after"] and x["kind"] == "rollback"), None)
        if kind == "hold" and t is None:
            continue  # changed nothing on the network (a switchback's hold on the treatment votes the control's)
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


# --- the summary --------------------------------------------------------------------------------

METRIC_ORIGINS = {
    "measured": "measured (collectors on the live network)",
    "recorded": "recorded (samples replayed from an earlier run)",
    "predicted": "predicted (drawn from kistexp simulate's predictions, not measured)",
}
OUTCOME_WORDS = {
    "PENDING": "not started", "BASELINE": "measuring the baseline", "TRANSITIONING": "changing stage",
    "WASHOUT": "waiting for a stage to take effect", "MEASURING": "measuring a stage", "PAUSED": "paused",
    "ROLLING_BACK": "rolling back", "ABORTED": "aborted", "COMPLETED": "completed",
}


def _failures(spec: RolloutSpec, verdicts: tuple[VerdictRow, ...], names: tuple[str, ...]) -> tuple[Failure, ...]:
    """The first failing look of each (criterion, stage) that counted (shadow criteria only report); an
    anonymity criterion's as the difference stage - baseline of its attack measure against its margin."""
    by_name = {c.name: c for c in spec.criteria}
    anonymity = {a.name: a for a in getattr(spec, "anonymity", ())}
    out, seen = [], set()
    for v in verdicts:
        c = by_name.get(v.criterion)
        a = anonymity.get(v.criterion) if c is None else None
        if v.outcome != "fail" or v.shadow or (c is None and a is None) or (v.criterion, v.stage) in seen:
            continue
        seen.add((v.criterion, v.stage))
        stage = names[v.stage] if 0 <= v.stage < len(names) else f"stage {v.stage}"
        if a is not None:
            # judged on the predictions: the difference over the simulated networks against the margin
            interval = f"[{attack_number(v.ci_low)}, {attack_number(v.ci_high)}] on {v.n_stage} simulated networks"
            out.append(Failure(v.criterion, a.measure, stage, v.window_end, attack_number(v.effect), interval,
                               attack_number(a.margin), v.id, a.role))
            continue
        unit, factor = catalogue.display(c.metric)  # the unit every table and plot of the report shows
        interval = interval_words(c.comparison, v.ci_low, v.ci_high, unit, factor)
        limit = limit_words(c.comparison, c.threshold, unit, factor)
        effect = effect_words(c.comparison, v.effect, unit, factor)
        out.append(Failure(v.criterion, c.metric, stage, v.window_end, effect, interval, limit, v.id, c.role))
    return tuple(out)


def _actions(spec: RolloutSpec, rollbacks: tuple[Rollback, ...], transitions: tuple[dict, ...],
             intents: tuple[dict, ...], consensuses: tuple[dict, ...], names: tuple[str, ...]) -> tuple[Action, ...]:
    out = []
    for r in rollbacks:
        if r.rehearsal:
            continue
        t = next((x for x in transitions if x["kind"] == "rollback" and x["valid_after"] == r.plan.valid_after), None)
        acted = () if t is None else tuple(dict.fromkeys(
            i["authority"] for i in intents if i["seq"] == t["seq"] and i["state"] in ("done", "verified")))
        want = {p.param: p.consensus_after for p in r.plan.params}
        back = next((c["valid_after"] for c in consensuses if c["valid_after"] >= r.plan.valid_after
                     and c["params"] is not None and all(c["params"].get(k) == v for k, v in want.items())), None)
        values = ", ".join(f"{k}={'absent' if v is None else v}" for k, v in want.items())
        stage = names[r.plan.from_stage] if 0 <= r.plan.from_stage < len(names) else f"stage {r.plan.from_stage}"
        out.append(Action(r.plan.kind, r.at, stage, r.plan.must_act, acted, values, back,
                          None if back is None else eta(spec, back, 0.99, NodeClass.CACHE),
                          None if back is None else eta(spec, back, 0.99, NodeClass.CLIENT)))
    return tuple(out)


def _outcome(status: Status, failures: tuple[Failure, ...], actions: tuple[Action, ...],
             names: tuple[str, ...]) -> str:
    where = names[status.stage] if 0 <= status.stage < len(names) else f"stage {status.stage}"
    state = OUTCOME_WORDS.get(status.state, status.state.lower())
    reasons = f" ({', '.join(sorted(status.reasons))})" if status.reasons else ""
    now = f"{state}{reasons} at {where}" if status.state != COMPLETED else "completed every stage"
    if actions:
        kinds = ", ".join(f"{a.kind} from {a.from_stage}" for a in actions)
        return f"rolled back ({kinds}); now {now}"
    if failures and all(f.role == "signal" for f in failures):
        return f"signals failed (a signal pauses for an operator, never rolls back); now {now}"
    if failures:
        return f"criteria failed without a rollback; now {now}"
    return now


def _span_of_stage(spec: RolloutSpec, transitions: tuple[dict, ...], stage: int, end: dt.datetime
                   ) -> list[tuple[dt.datetime, dt.datetime]]:
    """When stage ``stage``'s values were in the consensus, from the transitions as they happened."""
    spans, begin, current = [], spec.baseline_start, 0
    for t in transitions:
        if current == stage:
            spans.append((begin, t["valid_after"]))
        begin, current = t["valid_after"], (t["stage"] if t["kind"] != "rollback" else -1)
    if current == stage:
        spans.append((begin, end))
    return spans


def _injections(spec: RolloutSpec, texts: list[str], transitions: tuple[dict, ...], end: dt.datetime,
                names: tuple[str, ...]) -> tuple[list[str], list[Mark]]:
    lines, marks = [], []
    for text in texts:
        try:
            inj = parse_injection(text, spec)
        except (InjectionError, ValueError):
            lines.append(f"{text} (as given to --inject)")
            continue
        if isinstance(inj, MetricShift):
            amount = (f"{100 * inj.relative:+g} %" if inj.relative is not None
                      else f"{inj.absolute:+g} {metric_unit(inj.metric)}".rstrip())
            stage = names[inj.stage] if inj.stage < len(names) else f"stage {inj.stage}"
            spans = _span_of_stage(spec, transitions, inj.stage, end)
            lines.append(f"{inj.metric} {amount} injected into every sample of {stage} (--inject {text}): "
                         + ("a fault put in by the dry run, not an effect of the change" if spans
                            else "the stage never ran"))
            marks += [Mark("injection", f"injected {inj.metric} {amount}", a, b, (inj.metric,)) for a, b in spans]
        elif isinstance(inj, AuthorityFault):
            what = "down (serves no vote)" if inj.kind == "down" else "stale (votes what it voted before)"
            lines.append(f"authority {inj.authority} {what} from {inj.at:%Y-%m-%d %H:%M} UTC (--inject {text})")
            marks.append(Mark("injection", f"{inj.authority} {inj.kind}", inj.at))
        elif isinstance(inj, MetricGap):
            lines.append(f"no {inj.source} samples from {inj.start:%Y-%m-%d %H:%M} to {inj.end:%Y-%m-%d %H:%M} UTC "
                         f"(--inject {text})")
            touched = tuple(sorted({c.metric for c in spec.criteria if metric_source_of(c.metric) == inj.source}))
            marks.append(Mark("injection", f"{inj.source} gap injected", inj.start, inj.end, touched))
    return lines, marks


def _commands(texts: list[str], commands: tuple[CommandRow, ...]) -> tuple[list[str], list[Mark]]:
    """Scripted commands (a dry run's ``--command``) with what became of each; in a live run, the
    operators' commands."""
    lines, marks = [], []
    rows = {c.user.removeprefix("dry-run --command "): c for c in commands if c.user.startswith("dry-run --command")}
    for text in texts:
        row = rows.get(text)
        if row is None:
            lines.append(f"{text} (--command; never issued: the rehearsal ended before it)")
            continue
        result = f": {row.result}" if row.result else ""
        lines.append(f"{row.kind} at {row.queued:%Y-%m-%d %H:%M} UTC (--command {text}), {row.state}{result}")
        marks.append(Mark("command", row.kind, row.queued))
    if not texts:  # a live run: what operators typed (gate approvals included)
        for c in commands:
            args = " ".join(f"{k}={v}" for k, v in c.args)
            lines.append(f"{c.kind}{' ' + args if args else ''} by {c.user or 'unknown'} at "
                         f"{c.queued:%Y-%m-%d %H:%M} UTC, {c.state}")
            marks.append(Mark("command", c.kind, c.queued))
    return lines, marks


def _gaps(reader: JournalReader, step: dt.timedelta) -> tuple[list[str], list[Mark]]:
    """Stretches of collection windows that delivered nothing (missing batches) and failed polls
    (``rollout_source_health`` rows with ok=0), per source."""
    windows: dict[str, set[dt.datetime]] = {}
    metrics: dict[str, set[str]] = {}
    for b in reader.metric_batches():
        if b.missing:
            windows.setdefault(b.source, set()).add(b.window)
            metrics.setdefault(b.source, set()).add(b.metric)
    failed: dict[str, int] = {}
    for h in reader.source_health():
        if not h.ok:
            windows.setdefault(h.source, set()).add(h.window)
            failed[h.source] = failed.get(h.source, 0) + 1
    lines, marks = [], []
    for source in sorted(windows):
        spans: list[list[dt.datetime]] = []
        for w in sorted(windows[source]):
            if spans and w - spans[-1][1] <= step:
                spans[-1][1] = w + step
            else:
                spans.append([w, w + step])
        touched = tuple(sorted(metrics.get(source, ())))
        for a, b in spans:
            lines.append(f"{source}: no samples from {a:%Y-%m-%d %H:%M} to {b:%Y-%m-%d %H:%M} UTC"
                         + (f" ({', '.join(touched)})" if touched else ""))
            marks.append(Mark("gap", f"{source} gap", a, b, touched))
        if failed.get(source):
            lines.append(f"{source}: {failed[source]} failed polls")
    return lines, marks


def build_summary(spec: RolloutSpec, meta, status: Status, verdicts: tuple[VerdictRow, ...],
                  rollbacks: tuple[Rollback, ...], transitions: tuple[dict, ...], intents: tuple[dict, ...],
                  consensuses: tuple[dict, ...], commands: tuple[CommandRow, ...], health: HealthSummary,
                  reader: JournalReader, names: tuple[str, ...], metrics: str) -> Summary:
    failures = _failures(spec, verdicts, names)
    actions = _actions(spec, rollbacks, transitions, intents, consensuses, names)
    ends = [spec.baseline_start + spec.hour] + [c["valid_after"] + spec.hour for c in consensuses]
    ends += [v.window_end for v in verdicts]
    end = max(ends)
    inj_lines, marks = _injections(spec, _json_list(meta, "injections", reader.path), transitions, end, names)
    cmd_lines, cmd_marks = _commands(_json_list(meta, "commands", reader.path), commands)
    gap_lines, gap_marks = _gaps(reader, spec.hour)
    interval = dt.timedelta(seconds=spec.cadence.interval_s)
    outages = [o.describe("%Y-%m-%d %H:%M") + " (UTC)" for o in health.outages]
    outages += [o.describe("%Y-%m-%d %H:%M") + " (UTC)" for o in health.authority_outages]
    marks += cmd_marks + gap_marks
    marks += [Mark("outage", "no majority consensus", o.start, o.end + interval) for o in health.outages]
    marks += [Mark("outage", f"{o.authority} down", o.start, o.end + interval) for o in health.authority_outages]
    return Summary(_outcome(status, failures, actions, names), failures, actions,
                   METRIC_ORIGINS.get(metrics, metrics), tuple(inj_lines), tuple(cmd_lines), tuple(outages),
                   tuple(gap_lines), tuple(marks))


def _json_list(meta, key: str, db: Path) -> list[str]:
    """A dry run's ``--inject`` or ``--command`` options as its meta keeps them (none where it has no
    such key); damaged, refused: the report would otherwise leave a rehearsal's faults out unsaid."""
    return list(meta_value(meta, key, db, names_value, required=False) or ())


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
    # a switchback's appended cycles (rollout.md §1.6) are named as the planned ones: treatment-8, control-8
    names = ("baseline",) + tuple(spec.stage(i).name for i in range(1, spec.last_stage + 1))
    store = MetricStore(exp.db)
    figures = summarize_predictions(store.load_predictions(), list(names))
    with reader.snapshot():  # the journal as of one commit, beside a run still writing it
        plan_path = exp.path / "plan.toml"
        decisions, transitions = _decisions(reader, spec, plan_path), _transitions(reader, spec, plan_path)
        metrics = meta.get("metrics") or "predicted"
        consensuses, intents, commands = _consensuses(reader), _intents(reader), tuple(reader.commands())
        verdicts, health = tuple(reader.looks()), health_of(reader, spec)
        rollbacks = _rollbacks(spec, decisions, transitions, status)
        summary = build_summary(spec, reader.meta(), status, verdicts, rollbacks, transitions, intents, consensuses,
                                commands, health, reader, names, metrics)
        return ExperimentData(
            path=exp.path, mode=meta.get("mode", "live"), spec=spec, metrics=metrics,
            excluded=_excluded(reader, names), status=status,
            votes=_votes(reader), consensuses=consensuses, transitions=transitions, decisions=decisions,
            intents=intents, commands=commands, verdicts=verdicts,
            batches=_batches(reader), measured=_measured(store, spec, names, transitions),
            figures=tuple(figures),
            rollbacks=rollbacks, rehearsals=_rehearsals(spec, decisions, status),
            stage_names=names, health=health, summary=summary,
            attacks=attack_figures(exp, store, _arms(spec, names)), predictions_made=predictions_made(exp, store))


@attrs.frozen
class PlanData:
    plan: Plan
    stages: tuple[str, ...]  # prediction stage names in plan order
    figures: tuple[StageFigure, ...]
    predictions: tuple[Prediction, ...]
    source: Path
    attacks: tuple[AttackFigure, ...] = ()
    predictions_made: PredictionsMade = PredictionsMade()


def _arms(spec: RolloutSpec, names: tuple[str, ...]) -> tuple[str, ...]:
    """The stage names ``kistexp simulate`` stores under: a switchback's periods (treatment-3, control-3)
    are its arms (treatment, control)."""
    if spec.kind != "switchback":
        return names
    return tuple(dict.fromkeys(re.sub(r"-\d+$", "", n) for n in names))


def attack_figures(exp: ExperimentDir, store: MetricStore, stages: tuple[str, ...]) -> tuple[AttackFigure, ...]:
    """The stored attack measures as differences stage minus baseline, in ``stages``' order and then any
    other stage stored. None in a database from before the table (it is made when the database is
    opened, but a read-only one stays as it was) or when ``kistexp simulate`` stored none."""
    try:
        values = store.load_attack_values()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return ()
        raise ReportError(f"{exp.db_path}: cannot read the attack measures: {exc}") from None
    except ValueError as exc:  # a row the catalogue does not know, or a value that is not finite
        raise ReportError(f"{exp.db_path}: corrupt attack measures: {exc}") from None
    if not values:
        return ()
    order = list(dict.fromkeys([*stages, *(v.stage for v in values)]))
    return tuple(stage_differences(values, order))


def plan_stage_names(plan: Plan) -> tuple[str, ...]:
    return plan.stage_runs().stages


def load_plan_predictions(plan: Plan, exp_path: str | Path) -> PlanData:
    """The predictions ``kistexp simulate PLAN --dir EXP`` saved, for the report and announcement
    made before a run. No predictions: a one-line error saying how to make them."""
    how = f"make them with: kistexp simulate {plan.path} --dir {exp_path}"
    if not (Path(exp_path) / "experiment.db").is_file():
        raise ReportError(f"{exp_path}: no predictions for plan {plan.name!r} (no experiment database); {how}")
    exp = ExperimentDir.open(exp_path)
    stages = plan_stage_names(plan)
    try:
        store = MetricStore(exp.db)
        rows = store.load_predictions()
        attacks = attack_figures(exp, store, stages)
        made = predictions_made(exp, store)
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"{exp.db_path}: corrupt experiment database: {exc}") from None
    finally:
        exp.close()
    have = {r.stage for r in rows}
    missing = [s for s in stages if s not in have]
    if not rows or missing:
        what = "no predictions" if not rows else f"no predictions for stage(s) {', '.join(missing)}"
        raise ReportError(f"{exp_path}: {what} of plan {plan.name!r}; {how}")
    return PlanData(plan, stages, tuple(summarize_predictions(rows, list(stages))), tuple(rows), Path(exp_path),
                    attacks, made)


def metric_unit(metric: str) -> str:
    m = catalogue.get(metric)
    return m.unit if m else ""


def verdict_looks(exp_path: str | Path) -> dict[str, list[dict]]:
    """Each criterion's verdicts in time order (effect and interval per look), read-only so it works
    beside a running engine; {} when the directory holds no journal."""
    try:
        reader = JournalReader.of_experiment(exp_path)
    except JournalDamageError:
        raise
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
