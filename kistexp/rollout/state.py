"""Live status of a rollout, the events that move it and the effects it asks for (rollout.md §1).

``Status`` is a value: the engine folds the journal's transitions into it, never keeps it
anywhere else (status is a function of the journal, §0).
"""

from __future__ import annotations

import datetime as dt

import attrs

PENDING = "PENDING"
BASELINE = "BASELINE"
TRANSITIONING = "TRANSITIONING"
WASHOUT = "WASHOUT"
MEASURING = "MEASURING"
PAUSED = "PAUSED"
ROLLING_BACK = "ROLLING_BACK"
ABORTED = "ABORTED"
COMPLETED = "COMPLETED"
STATES = (PENDING, BASELINE, TRANSITIONING, WASHOUT, MEASURING, PAUSED, ROLLING_BACK, ABORTED, COMPLETED)
TERMINAL = (ABORTED, COMPLETED)

PAUSE_REASONS = ("manual", "freeze", "gate", "inconclusive", "error", "criterion-hold", "signal", "stepped-back",
                 "not-in-consensus", "drift", "plan-changed")
OPERATOR_REASONS = frozenset({"manual", "freeze"})  # the only ones `resume` clears

PASS, FAIL, INCONCLUSIVE, ERROR = "pass", "fail", "inconclusive", "error"
OUTCOMES = (PASS, FAIL, INCONCLUSIVE, ERROR)

HOLD, STEP_BACK, REVERT_DEFAULT, REMOVE_PARAM, ABORT_TO_BASELINE = (
    "hold", "step-back", "revert-default", "remove-param", "baseline")
ROLLBACK_KINDS = (HOLD, STEP_BACK, REVERT_DEFAULT, REMOVE_PARAM)
SEVERITY = {HOLD: 0, STEP_BACK: 1, REVERT_DEFAULT: 2, REMOVE_PARAM: 2}

COMMANDS = ("pause", "resume", "promote", "abort", "retry", "undo")

Values = tuple[tuple[str, "int | str"], ...]


@attrs.frozen
class Counters:
    """Per-criterion counts as Argo keeps them (§1.3)."""

    failed: int = 0
    inconclusive: int = 0
    consecutive_error: int = 0
    consecutive_success: int = 0
    latest: str = ""  # latest outcome in the current stage ("" = none yet)


@attrs.frozen
class Status:
    state: str = PENDING
    stage: int = 0  # 0 = baseline; the stage whose values are in force (or being brought in)
    values: Values = ()  # the set the participants are asked to vote
    target_va: dt.datetime | None = None  # consensus awaited while TRANSITIONING / ROLLING_BACK
    rounds_waited: int = 0  # consensuses for the target that were published without the values
    rounds_missing: int = 0  # rounds whose consensus was not published at all (network down)
    stage_va: dt.datetime | None = None  # valid-after of the consensus that brought the stage in
    decision_at: dt.datetime | None = None
    extensions: int = 0
    reasons: frozenset[str] = frozenset()
    rollback_kind: str = ""
    from_stage: int = 0  # stage a rollback leaves
    counters: tuple[tuple[str, Counters], ...] = ()
    aborted_stage: int | None = None
    fast: bool = False  # undo --fast: skip the measuring of the stage being entered
    promoted: bool = False  # the next decision was forced by `promote`
    resume_to: str = ""  # the state PAUSED returns to once its reasons are cleared
    seq: int = 0  # transitions so far

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def counter(self, name: str) -> Counters:
        return dict(self.counters).get(name, Counters())

    def with_counter(self, name: str, c: Counters) -> Status:
        d = dict(self.counters)
        d[name] = c
        return attrs.evolve(self, counters=tuple(sorted(d.items())))

    def describe(self) -> str:
        where = "baseline" if self.stage == 0 else f"stage {self.stage}"
        extra = f" ({', '.join(sorted(self.reasons))})" if self.reasons else ""
        kind = f" {self.rollback_kind}" if self.state == ROLLING_BACK else ""
        return f"{self.state}{kind}{extra} at {where}"


# --- events (§1.2) -------------------------------------------------------------------------


@attrs.frozen
class Start:
    at: dt.datetime


@attrs.frozen
class ConsensusCheck:
    at: dt.datetime
    valid_after: dt.datetime
    params: tuple[tuple[str, int], ...] | None  # None: no consensus for that valid-after
    laggards: tuple[str, ...] = ()  # participating authorities whose vote did not carry the set
    # checked only after the next round began (the run was down): directory servers serve the newest
    # consensus only, so whether one was published for ``valid_after`` is unknown, not "missing"
    late: bool = False


@attrs.frozen
class WashoutEnd:
    at: dt.datetime
    stage: int


@attrs.frozen
class MachineVerdict:
    """One criterion's look as the state machine folds it: the judge's verdict in brief (its whole
    ``kistexp.judge.Verdict`` as JSON in ``record``), or ERROR when the judge could not be asked."""

    criterion: str
    outcome: str
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_baseline: int = 0
    n_stage: int = 0
    detail: str = ""
    reason: str = ""  # why an INCONCLUSIVE is one (kistexp.judge REASONS), "" otherwise
    rule: str = ""  # the judge's decision rule at this look
    record: str = ""  # JSON of the judge's whole Verdict (kistexp.jsonout.to_json)
    bound: float | None = None  # the limit on the effect's scale (1.1 for a 10 % relative-increase)
    # "baseline" when no longer stage could decide this INCONCLUSIVE (kistexp.judge Verdict.limited_by)
    limited_by: str = ""


@attrs.frozen
class Evaluate:
    at: dt.datetime
    verdicts: tuple[MachineVerdict, ...]


@attrs.frozen
class DecisionDue:
    at: dt.datetime
    stage: int
    short: tuple[str, ...] = ()  # baseline: criteria still below min_samples
    # the judge's look at the decision time, which the end of a stage rests on (estimate against the
    # limit, whether extending can help); the counters keep only each criterion's outcome
    verdicts: tuple[MachineVerdict, ...] = ()
    # the anonymity criteria judged on the predictions of the stage this decision would enter (the next one),
    # before its values are voted in (docs/rollouts.md "Anonymity criteria")
    ahead: tuple[MachineVerdict, ...] = ()


@attrs.frozen
class Command:
    at: dt.datetime
    kind: str
    args: tuple[tuple[str, str], ...] = ()
    user: str = ""

    def arg(self, name: str, default: str = "") -> str:
        return dict(self.args).get(name, default)


@attrs.frozen
class PlanChanged:
    at: dt.datetime
    diff: str


@attrs.frozen
class Drift:
    """Before acting, an authority's configuration was neither the target nor what the rollout
    last asked of it: someone else changed it (rollout.md §3.3)."""

    at: dt.datetime
    detail: str


Event = Start | ConsensusCheck | WashoutEnd | Evaluate | DecisionDue | Command | PlanChanged | Drift


# --- effects ----------------------------------------------------------------------------------


@attrs.frozen
class Transition:
    """Make the participants vote ``values`` so consensus ``target_va`` carries them."""

    seq: int
    values: Values
    target_va: dt.datetime
    cause: str
    kind: str = "stage"  # stage | rollback | retry | undo | reassert


@attrs.frozen
class Outcome:
    """What one step did: the new status, the transition to carry out (if any), a message,
    and whether the event was refused (commands only)."""

    status: Status
    transition: Transition | None = None
    message: str = ""
    refused: bool = False
    decision: str = ""  # advance | hold | rollback:<kind> | pause:<reason> | complete | abort | ...
    judged_ahead: int = 0  # the stage whose entry the anonymity verdicts (DecisionDue.ahead) decided; 0: none
