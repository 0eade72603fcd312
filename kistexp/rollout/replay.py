"""Replays: recorded series judged by the plan's criteria on their own timestamps (rollout.md §5).

The recordings (OnionPerf/tgen analysis JSON, operator-report CSV, consensus archives, and
MetricsPort or process-exporter URLs, scraped now) go through the collectors of
``kistexp.metrics.importer`` into a scratch metric store. The plan is then laid on the record:
its baseline starts at ``align`` (default: the hour of the first recorded sample of a metric
the criteria use) and each stage follows for its planned duration, one plan hour per real hour.
The engine runs on the virtual clock against embedded fake authorities, as in a dry run, but each
hourly collection returns the recorded samples stamped inside that hour; an hour without
samples is a gap, which holds. The replay ends an hour after the last recorded sample (or at
the plan's end), and reports the first rollback the criteria would have fired: the criterion,
the stage and its window, the failing verdict, the rollback's kind, the authorities that must
act and when relays would be back.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.metrics.importer import import_all
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import Plan
from kistexp.rollout.anonymity import load_predicted_anonymity
from kistexp.rollout.assembly import assemble
from kistexp.rollout.dryrun import (
    AuthorityFault,
    ConsensusSource,
    Injection,
    InjectionError,
    MetricGap,
    MetricShift,
    ScriptedCommand,
    claim_for_rehearsal,
    initial_configs,
    parse_command,
    parse_injection,
    rehearsal_meta,
    summarize,
)
from kistexp.rollout.rehearsal import EmbeddedAuthorities, rehearsal_clock, rehearse
from kistexp.rollout.sources import RECORDED
from kistexp.rollout.spec import RolloutSpec, spec_from_plan
from kistexp.store.schema import open_db


class ReplayError(KistexpError):
    """Recordings that cannot be replayed through a plan."""


class RecordedMetrics:
    """A ``MetricSource`` serving the recorded samples stamped within each collection window.

    ``--inject`` works on the record as on predictions: a ``metrics=SOURCE:gap@W`` hour returns nothing,
    and a ``stage=N:METRIC=+X%`` shift changes the samples of every window whose consensus (the newest one
    valid at the window's start, from ``consensuses``) carries stage N's values (0 = the baseline's)."""

    origin = RECORDED

    def __init__(self, store: MetricStore, spec: RolloutSpec | None = None, consensuses: ConsensusSource | None = None,
                 injections: Sequence[Injection] = ()) -> None:
        self.store, self.spec, self.consensuses = store, spec, consensuses
        self.shifts = [i for i in injections if isinstance(i, MetricShift)]
        self.gaps = [i for i in injections if isinstance(i, MetricGap)]
        if self.shifts and (spec is None or consensuses is None):
            raise ValueError("metric shifts need the plan and the consensus history")
        self._expected = ([spec.expected_consensus(spec.values_of(i)) for i in range(spec.n_stages + 1)]
                          if spec is not None else [])

    def _stage_at(self, t: dt.datetime) -> int:
        """The plan stage whose values the consensus valid at ``t`` carries (0: the baseline's, or none)."""
        interval = dt.timedelta(seconds=self.spec.cadence.interval_s)
        params, _ = self.consensuses.fetch_consensus(self.spec.cadence.va_at_or_after(t + interval) - interval)
        seen = params or {}
        for i, want in enumerate(self._expected):
            if params is not None and all(seen.get(k) == v for k, v in want.items()):
                return i
        return 0

    def collect(self, source: str, metric: str, t0: dt.datetime, t1: dt.datetime) -> np.ndarray | None:
        if any(g.source == source and g.start < t1 and t0 < g.end for g in self.gaps):
            return None
        values = self.store.values(metric, t0, t1)
        if not values:
            return None
        out = np.asarray(values, dtype=float)
        shifts = [s for s in self.shifts if s.metric == metric]
        if shifts:
            stage = self._stage_at(t0)
            for s in shifts:
                if s.stage == stage:
                    out = s.apply(out)
        return out


@attrs.frozen
class ReplayResult:
    plan: str
    recordings: tuple[dict, ...]  # per file: kind, samples per metric, problems
    recorded_from: dt.datetime
    recorded_until: dt.datetime
    alignment: str
    windows: tuple[dict, ...]  # baseline and each stage: name, start, end (UTC)
    first_rollback: dict | None  # criterion, stage, window, verdict, kind, authorities, times
    dry_run: dict  # the engine's decisions, transitions, verdict counts (as a dry run reports them)


def _hour(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def stage_windows(spec: RolloutSpec) -> list[dict]:
    out = [{"stage": 0, "name": "baseline", "start": spec.baseline_start, "end": spec.start}]
    t = spec.start
    for s in spec.stages:
        out.append({"stage": s.index, "name": s.name, "start": t, "end": t + s.duration})
        t += s.duration
    return out


def _recorded_span(store: MetricStore, metrics: set[str], files: Sequence[str]) -> tuple[dt.datetime, dt.datetime]:
    spans = [(m.first, m.last) for m in store.summary() if m.metric in metrics and m.first is not None]
    if not spans:
        raise ReplayError(f"{', '.join(files)}: no samples of the plan's metrics ({', '.join(sorted(metrics))})")
    return min(a for a, _ in spans), max(b for _, b in spans)


def replay(plan: Plan, files: Sequence[str], exp: Path | None = None, *, align: dt.datetime | None = None,
           approve_gates: bool = True, progress: Callable[[float, str], None] | None = None,
           injections: Sequence[str] = (), commands: Sequence[str] = ()) -> ReplayResult:
    """Judge ``files`` through ``plan``'s criteria; ``align`` is the baseline's start (UTC). ``injections``
    and ``commands`` are the dry run's ``--inject`` and ``--command`` options, laid on the aligned plan."""
    started = time.monotonic()
    metrics = {c.metric for c in plan.criteria}
    with tempfile.TemporaryDirectory(prefix="kistexp-replay-") as tmp:
        store = MetricStore(open_db(Path(tmp) / "recorded.db"))
        results, errors = import_all(store, list(files))
        if errors:
            raise ReplayError(errors[0])
        first, last = _recorded_span(store, metrics, files)
        if align is None:
            baseline_start, how = _hour(first), "baseline starts at the hour of the first recorded sample"
        else:
            # the plan laid from --align must meet the recording: compared before any date is added to
            # it, since years 1 and 9999 overflowed the calendar, and a plan that misses the record
            # judges nothing
            length = plan.baseline.duration + sum((s.duration for s in plan.stages), dt.timedelta())
            if align < first - length:
                raise ReplayError(f"--align {align.isoformat()}: the plan laid from it ({length.days} days) ends "
                                  f"before the recording starts ({first:%Y-%m-%d %H:%M} UTC)")
            if align > last + length:
                raise ReplayError(f"{', '.join(files)}: the recording ends ({last:%Y-%m-%d %H:%M} UTC) before the "
                                  f"aligned baseline starts ({align.isoformat()})")
            baseline_start, how = align, "baseline starts at --align"
        spec = spec_from_plan(plan, start=baseline_start + plan.baseline.duration)
        plan_end = spec.start + sum((s.duration for s in spec.stages), dt.timedelta())
        until = min(plan_end, _hour(last) + 2 * spec.hour)
        if until <= spec.baseline_start:
            raise ReplayError(f"{', '.join(files)}: the recording ends ({last:%Y-%m-%d %H:%M} UTC) before "
                              f"the aligned baseline starts ({spec.baseline_start:%Y-%m-%d %H:%M} UTC)")
        # days and stages count on the plan as laid on the record
        parsed = [parse_injection(i, spec) for i in injections]
        scripted = sorted((parse_command(c, spec) for c in commands), key=lambda c: c.at)
        _refuse_after_end(tuple(zip(injections, parsed, strict=True)), scripted, until)
        if exp is None:
            scratch = tempfile.TemporaryDirectory(prefix="kistexp-replay-exp-")
            exp = Path(scratch.name) / "exp"
        else:
            scratch = None
        try:
            meta = rehearsal_meta(spec, RECORDED, injections=tuple(injections),
                                  commands=tuple(c.text for c in scripted))
            with ExperimentDir.open_or_create(exp) as expdir, claim_for_rehearsal(expdir, meta) as journal:
                # recordings hold no attack: anonymity criteria are judged from the experiment's predictions
                anonymity = load_predicted_anonymity(expdir.db, spec, plan.path, str(exp))
                journal.reset_for_rehearsal(**meta)
                clock = rehearsal_clock(spec)
                faults = tuple((f.authority, f.kind, f.at) for f in parsed if isinstance(f, AuthorityFault))
                with EmbeddedAuthorities(spec, clock, initial_configs(spec), until, faults) as net:
                    source = RecordedMetrics(store, spec, net.history, parsed)
                    engine = assemble(spec, journal, net.actuator, source, clock, experiment_id=f"replay:{plan.name}",
                                      anonymity=anonymity)
                    rehearse(engine, journal, clock, until=until, who="replay (gate approved)",
                             approve_gates=approve_gates, progress=progress,
                             commands=[(c.at, c.kind, c.as_args(), f"replay --command {c.text}") for c in scripted])
                summary = summarize(spec, journal, engine, tuple(injections), str(expdir.db_path),
                                    time.monotonic() - started)
                windows = stage_windows(spec)
                first_rb = _first_rollback(summary.rollbacks, journal.verdicts(), windows)
        finally:
            if scratch is not None:
                scratch.cleanup()
        store.conn.close()
    recs = tuple({"kind": r.kind, "location": r.location, "samples": dict(r.samples),
                  "problems": list(r.problems)} for r in results)
    return ReplayResult(plan.name, recs, first, last, how, tuple(windows), first_rb, attrs.asdict(summary))


def _refuse_after_end(injections: Sequence[tuple[str, Injection]], commands: Sequence[ScriptedCommand],
                      until: dt.datetime) -> None:
    """A replay ends with its recording: a command or a fault set after that would silently never happen."""
    end = f"the replay ends at {until:%Y-%m-%d %H:%M} UTC (the recording's end, or the plan's)"
    for c in commands:
        if c.at > until:
            raise InjectionError(f"--command {c.text!r}: at {c.at:%Y-%m-%d %H:%M} UTC, after {end}")
    for text, i in injections:
        at = i.at if isinstance(i, AuthorityFault) else i.start if isinstance(i, MetricGap) else None
        if at is not None and at >= until:
            raise InjectionError(f"--inject {text!r}: at {at:%Y-%m-%d %H:%M} UTC, after {end}")


def _first_rollback(rollbacks: Sequence[dict], verdicts: list[dict], windows: list[dict]) -> dict | None:
    if not rollbacks:
        return None
    rb = rollbacks[0]
    failed = [v for v in verdicts if v["outcome"].upper() == "FAIL" and not v["shadow"] and v["window_end"] <= rb["at"]]
    verdict = failed[-1] if failed else None
    stage = rb["from_stage"]
    window = next((w for w in windows if w["stage"] == stage), None)
    return {"at": rb["at"], "criterion": verdict["criterion"] if verdict else None, "stage": stage,
            "stage_name": window["name"] if window else None,
            "stage_window": [window["start"], window["end"]] if window else None,
            "hour_in_stage": ((rb["at"] - window["start"]) / dt.timedelta(hours=1)) if window else None,
            "verdict": verdict, "kind": rb["kind"], "authorities_must_act": rb["authorities_must_act"],
            "relays_back_after_s": rb["relays_back_after_s"], "cause": rb["cause"]}


__all__ = ["RecordedMetrics", "ReplayError", "ReplayResult", "replay", "stage_windows"]
