"""The journal against the plan it was laid on: the spec rebuilt from ``rollout_meta`` (cadence, start)
and the rows whose stages the plan must have. What does not fit is damage, refused in one line naming
the table and the row (``JournalDamageError``): a stage the plan lacks would otherwise fail wherever it
is looked up, far from the row that holds it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kistexp.plan.loader import DATE_MARGIN
from kistexp.plan.model import Plan
from kistexp.rollout.journal.codec import BadValue, JournalDamageError, cadence_value, iso_time, json_value
from kistexp.rollout.journal.rows import DecisionRow, JournalMeta, StatusRow, TransitionRow
from kistexp.rollout.spec import RolloutSpec, spec_from_plan
from kistexp.rollout.state import ROLLBACK_KINDS, Status


def meta_value(meta: Mapping[str, str | None] | JournalMeta, key: str, db: Path | str, decode, *,
               required: bool = True):
    """``rollout_meta``'s ``key`` through ``decode``; missing (where ``required``) or damaged, refused.
    Not required and missing: None."""
    text = meta.get(key)
    if text is None:
        if not required:
            return None
        raise JournalDamageError(db, "rollout_meta", key, f"missing: the run's {key} is not recorded")
    try:
        return decode(text, key)
    except BadValue as exc:
        raise JournalDamageError(db, "rollout_meta", key, str(exc)) from None


def plan_canon(meta: Mapping[str, str | None], db: Path | str) -> dict:
    """The canonical plan the journal keeps (``{}`` where it has none)."""
    return meta_value(meta, "plan_canon", db, lambda v, c: json_value(v, c, dict), required=False) or {}


def stored_spec(plan: Plan, meta: Mapping[str, str | None], db: Path | str) -> RolloutSpec:
    """``plan`` laid on the cadence and start the journal's ``rollout_meta`` keeps. Either one damaged,
    or a start so near the calendar's ends that the plan's dates cannot be computed from it, is refused
    naming its row."""
    cadence, start = meta_value(meta, "cadence", db, cadence_value), meta_value(meta, "start", db, iso_time)
    try:
        spec = spec_from_plan(plan, cadence, start=start)
        # the whole run, with a plan's margin either side (kistexp.plan.loader), stays in the calendar
        _ = (spec.baseline_start - DATE_MARGIN, spec.start + sum((s.duration for s in spec.stages), DATE_MARGIN))
    except OverflowError:
        raise JournalDamageError(db, "rollout_meta", "start", f"start {start.isoformat()} is too near the ends of "
                                 f"the calendar for plan {plan.name!r}: its baseline and stages, with "
                                 f"{DATE_MARGIN.days} days to spare, must fall in years 1 to 9999") from None
    return spec


def _outside(spec: RolloutSpec, plan_path: Path | str, what: str, stage: int) -> str:
    return f"{what} {stage} is not a stage of {plan_path} (0 = baseline to {spec.last_stage})"


def status_fits(row: StatusRow, spec: RolloutSpec, db: Path | str, plan_path: Path | str) -> Status:
    """The status of ``row``, whose stages must be the plan's (a plan of record cut short by hand, or a
    garbled row)."""
    st = row.status
    for name, stage in (("stage", st.stage), ("from_stage", st.from_stage), ("aborted_stage", st.aborted_stage)):
        if stage is not None and stage > spec.last_stage:  # a switchback's appended cycles included
            raise JournalDamageError(db, "rollout_status", row.id, _outside(spec, plan_path, f"status.{name}", stage))
    return st


def rows_fit_plan(spec: RolloutSpec, db: Path | str, plan_path: Path | str,
                  transitions: Sequence[TransitionRow] = (), decisions: Sequence[DecisionRow] = ()) -> None:
    """Refuse a transition or decision whose stage is not one of the plan's, or a rollback decision of
    no rollback kind: the rollback planner would look them up and fail."""
    for t in transitions:
        if t.stage > spec.last_stage:
            raise JournalDamageError(db, "rollout_transitions", t.seq, _outside(spec, plan_path, "stage", t.stage))
    for d in decisions:
        if d.stage > spec.last_stage:
            raise JournalDamageError(db, "rollout_decisions", d.id, _outside(spec, plan_path, "stage", d.stage))
        if d.decision.startswith("rollback:") and d.decision.partition(":")[2] not in ROLLBACK_KINDS:
            raise JournalDamageError(db, "rollout_decisions", d.id, f"decision {d.decision[:40]!r} names no "
                                     f"rollback kind ({', '.join(ROLLBACK_KINDS)})")
