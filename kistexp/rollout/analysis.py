"""The analysis of a rollout, kept apart from the engine as Argo Rollouts keeps its AnalysisRuns apart
from the rollout (rollout.md §0): metric batches per phase, the judge's input built from them, and the
sequential looks at every criterion of a stage (docs/rollouts.md "How criteria are judged").

The engine decides *when* to collect and look and what to do with the verdicts; this module holds
*what* was collected and *how* it is judged. Everything here is rebuilt from the journal on resume:
the batches (``rollout_metric_batches``) and each criterion's sequential state (``rollout_sequential``).
"""

from __future__ import annotations

import datetime as dt
import sqlite3

import attrs
import numpy as np

from kistexp.judge import Period
from kistexp.judge.multiple import fail_alphas, step_down
from kistexp.rollout import judging
from kistexp.rollout.journal import Journal
from kistexp.rollout.judging import Batch
from kistexp.rollout.sources import Collection
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import ERROR, FAIL, MachineVerdict

# The phase of the anonymity verdicts a stage's entry rests on (docs/rollouts.md "Anonymity criteria")
PREDICTED_PHASE = "predicted"
# The FAIL error a stage's criteria share (spec judge.md §5.5, §7); PASS takes 0.05 each.
FAMILY_ALPHA = 0.05


class Analysis:
    def __init__(self, spec: RolloutSpec, journal: Journal) -> None:
        self.spec, self.journal = spec, journal
        self._samples: dict[tuple[str, str], list[Batch]] = {}
        for b in journal.batches():
            self._samples.setdefault((b.phase, b.metric), []).append(Batch(b.window, b.values, b.relays))
        self._last_missing: dict[str, bool] = {}
        # each criterion's sequential test in each stage entry, as of its latest journaled look
        self._sequential = journal.sequential_states()
        self._inputs: dict[tuple[str, str], tuple[int, object]] = {}

    # --- batches ---------------------------------------------------------------------------

    def mid_switch(self, col: Collection, phase: str, stage_values: dict[str, int], params_at=None) -> Collection:
        """Leave out samples whose node held a consensus that did not carry the phase's values
        (rollout.md §1.4: samples of nodes mid-switch are never judged as the stage's). The params of
        a valid-after come from the run's own consensus checks, else from ``params_at`` (the source's
        view of what its nodes held). A sample whose consensus is unknown is kept: the window itself
        is already inside the phase."""
        if col.values is None or phase == "excluded" or not np.isfinite(col.held).any():
            return col
        carried = self.journal.consensus_params_by_va()
        keep = np.ones(col.values.size, dtype=bool)
        for va in np.unique(col.held[np.isfinite(col.held)]):
            params = carried.get(int(round(va * 1e6)))
            if params is None and params_at is not None:
                params = params_at(float(va))
            if params is None:
                continue
            ok = all(params.get(k) == v for k, v in stage_values.items())
            if not ok:
                keep &= col.held != va
        return col.keep(keep) if not keep.all() else col

    def write(self, c: sqlite3.Connection, source: str, t0: dt.datetime, phase: str,
              cols: list[tuple[Collection, int]], now: dt.datetime) -> None:
        """Inside the engine's transaction: each metric's batch and each instance's health."""
        seen: set[tuple[str, str]] = set()
        for col, excluded in cols:
            values, relays = col.relay_runs()
            self.journal.add_batch(c, source, col.metric, t0, phase, None if col.values is None else values,
                                   None if relays is None else list(relays), origin=col.origin, excluded=excluded)
            for h in col.health:
                if (h.source, h.instance) not in seen:
                    seen.add((h.source, h.instance))
                    self.journal.add_source_health(c, t0, h, now)

    def remember(self, t0: dt.datetime, phase: str, cols: list[tuple[Collection, int]]) -> None:
        """After the commit: the batches join the judge's input."""
        for col, _ in cols:
            self._last_missing[col.metric] = col.values is None
            if col.values is not None:
                values, relays = col.relay_runs()
                self._samples.setdefault((phase, col.metric), []).append(
                    Batch(t0, np.asarray(values, dtype="<f8"), relays))

    def hours(self, phase: str, metric: str) -> int:
        return len(self._samples.get((phase, metric), []))

    # --- looks -----------------------------------------------------------------------------

    def judge_input(self, phase: str, metric: str):
        """The judge's input for one side, rebuilt only when a batch was added."""
        batches = self._samples.get((phase, metric), [])
        cached = self._inputs.get((phase, metric))
        if cached is None or cached[0] > len(batches):
            cached = (len(batches), judging.judge_input(self.spec, metric, batches))
            self._inputs[(phase, metric)] = cached
        elif cached[0] < len(batches):
            cached = (len(batches), judging.extend(self.spec, metric, cached[1], batches, batches[cached[0]:]))
            self._inputs[(phase, metric)] = cached
        return cached[1]

    def baseline_short(self) -> tuple[str, ...]:
        """Criteria whose baseline holds fewer than their ``min_samples``."""
        return tuple(c.name for c in self.spec.criteria
                     if judging.size(self.judge_input("baseline", c.metric)) < c.min_samples)

    def _family(self) -> tuple[list[bool], list[float]]:
        """Which criteria share the stage's FAIL error (all but dry-run ones) and each one's share
        under the plan's correction (docs/judge.md "Several criteria")."""
        shared = [not c.shadow for c in self.spec.criteria]
        return shared, fail_alphas([c.base for c in self.spec.criteria], FAMILY_ALPHA, self.spec.correction, shared)

    def look(self, phase: str, at: dt.datetime) -> list[tuple[MachineVerdict, object]]:
        """One sequential look of the judge at every criterion of the stage in ``phase``, the criteria
        judged as a family under the plan's correction (Holm by default: a criterion that FAILs passes
        its share of the error to the others, judged again at the larger level; kistexp.judge.multiple)."""
        stage_index = int(phase.split(":")[1])
        shared, shares = self._family()
        now_s = judging.plan_seconds(self.spec, at)
        out: list[tuple[MachineVerdict, object] | None] = []
        judges = []
        for c, share in zip(self.spec.criteria, shares, strict=True):
            if self._last_missing.get(c.metric):
                out.append((MachineVerdict(c.name, ERROR, detail=f"no {c.metric} samples for the last hour"), None))
                judges.append(None)
                continue
            base, stage = self.judge_input("baseline", c.metric), self.judge_input(phase, c.metric)
            if judging.short_stage(self.spec, stage_index):
                base, stage = judging.untimed(base), judging.untimed(stage)
            state = self._sequential.get((c.name, phase))
            if state is None:
                state = judging.planned_state(self.spec, stage_index, judging.size(stage), self.hours(phase, c.metric),
                                              alpha_fail=share)
            elif state.alpha_fail != share:
                state = attrs.evolve(state, alpha_fail=share)  # journaled before the correction: its share now
            out.append(None)
            judges.append(lambda a, label, c=c, base=base, stage=stage, state=state: judging.judge_criterion(
                c, base, stage, state, now_s, alpha_fail=a, correction=label))
        found = step_down(judges, shares, self.spec.correction, lambda r: r[0].outcome == FAIL, shared=shared)
        return [r if r is not None else f for r, f in zip(out, found, strict=True)]  # type: ignore[misc]

    def switchback_look(self, stage: int, at: dt.datetime) -> list[tuple[MachineVerdict, object]]:
        """The look at a switchback cycle's end (rollout.md §1.6): every criterion period against period
        over all periods so far (judge.md §6), each criterion's sequential analysis kept under
        ``SWITCHBACK_PHASE``. The look at the last cycle the run may take is its final one."""
        final = stage >= self.spec.last_stage
        shared, shares = self._family()
        judges = []
        for c, share in zip(self.spec.criteria, shares, strict=True):
            state = self._sequential.get((c.name, judging.SWITCHBACK_PHASE))
            judges.append(lambda a, label, c=c, state=state, share=share: judging.judge_switchback_criterion(
                self.spec, c, self.periods(c.metric), state, alpha_fail=a, final=final, correction=label, share=share))
        return step_down(judges, shares, self.spec.correction, lambda r: r[0].outcome == FAIL,
                         shared=shared)  # type: ignore[return-value]

    def periods(self, metric: str) -> list[Period]:
        """Each stage entry's samples of ``metric`` as a switchback period (a period re-entered after an
        undo is a period of its own; the judge pairs them in time order)."""
        out = []
        for (phase, m), batches in self._samples.items():
            if m != metric or not phase.startswith("stage:") or not batches:
                continue
            _, index, va = phase.split(":")
            start = dt.datetime.strptime(va, "%Y%m%dT%H%M%S").replace(tzinfo=dt.timezone.utc)
            out.append(judging.switchback_period(self.spec, int(index), metric, start, batches))
        return out

    def journal_looks(self, c: sqlite3.Connection, looks: list[tuple[MachineVerdict, object]], phase: str,
                      at: dt.datetime, stage: int) -> None:
        for v, nxt in looks:
            self.journal.add_verdict(c, v, at, stage, self.spec.criterion(v.criterion).shadow, phase)
            if nxt is not None:
                self.journal.save_sequential(c, v.criterion, phase, nxt, at)

    def journal_entry(self, c: sqlite3.Connection, verdicts: tuple[MachineVerdict, ...], stage: int,
                      at: dt.datetime) -> None:
        """The anonymity verdicts a stage's entry rested on (judged on its predictions), under that stage and
        the phase ``predicted:<stage>``: no sequential state, the predictions do not change."""
        for v in verdicts:
            self.journal.add_verdict(c, v, at, stage, False, f"{PREDICTED_PHASE}:{stage}")

    def remember_looks(self, looks: list[tuple[MachineVerdict, object]], phase: str) -> None:
        # only once the look is committed: a look lost in a crash is redone from the same state
        for v, nxt in looks:
            if nxt is not None:
                self._sequential[(v.criterion, phase)] = nxt

