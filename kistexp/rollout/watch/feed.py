"""The event feed's rows and its pure function: ``feed(ctx, state, rows)`` turns the journal rows one
poll read into ``FeedEvent`` lines in plain words, and gives the state the next call continues from.
It touches no clock, no file and no database (kistexp.rollout.watch.tail reads the journal)."""

from __future__ import annotations

import datetime as dt
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

import attrs

from kistexp import jsonout
from kistexp.rollout.journal import (
    CommandRow,
    DecisionRow,
    ExposureRow,
    IntentRow,
    Pairs,
    RunRow,
    StatusRow,
    TransitionRow,
    VerdictRow,
)
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import (
    ABORTED,
    BASELINE,
    COMPLETED,
    MEASURING,
    PAUSED,
    PENDING,
    ROLLING_BACK,
    TRANSITIONING,
    WASHOUT,
    Command,
    Status,
)

INFO, WARNING, CRITICAL = "info", "warning", "critical"
DEFAULT_REMINDER_S = 300.0


# --- rows ----------------------------------------------------------------------------------------

# The journal's own rows (kistexp.rollout.journal.rows) serve as they are for statuses, decisions,
# transitions, verdicts, intents, commands, runs and exposure; the feed's rows below are derived from
# the journal's.

@attrs.frozen
class VoteRow:
    authority: str
    valid_after: dt.datetime
    served: bool


@attrs.frozen
class ConsensusRow:
    valid_after: dt.datetime
    params: Pairs | None  # None: none published, or (``published``) not known
    signers: tuple[str, ...]
    published: bool | None = None  # None: as ``params`` says; the engine's health rows know it without params

    @property
    def was_published(self) -> bool:
        return self.params is not None if self.published is None else self.published


@attrs.frozen
class HealthRow:
    """``rollout_authority_health`` (newer schemas): the engine's own word on one authority's round."""

    valid_after: dt.datetime
    authority: str
    state: str  # ok | down | stale | not-signing (or whatever a newer engine writes)


@attrs.frozen
class GapRow:
    """A collection window a source delivered nothing for: a ``missing`` (or empty) metric batch, or
    a failing ``rollout_source_health`` poll (newer schemas)."""

    source: str
    window: dt.datetime
    metric: str = ""
    instance: str = ""
    problem: str = ""


@attrs.frozen
class JournalRows:
    """What one poll read: rows new since the previous poll, and the small mutable tables whole."""

    statuses: tuple[StatusRow, ...] = ()
    decisions: tuple[DecisionRow, ...] = ()
    transitions: tuple[TransitionRow, ...] = ()
    verdicts: tuple[VerdictRow, ...] = ()
    intents: tuple[IntentRow, ...] = ()  # every intent
    commands: tuple[CommandRow, ...] = ()  # every command
    runs: tuple[RunRow, ...] = ()  # every run
    votes: tuple[VoteRow, ...] = ()
    consensuses: tuple[ConsensusRow, ...] = ()
    health: tuple[HealthRow, ...] = ()
    gaps: tuple[GapRow, ...] = ()
    batches: tuple[dt.datetime, ...] = ()  # windows of the metric batches with samples added
    exposure: tuple[ExposureRow, ...] = ()
    rewritten: bool = False  # the journal was started afresh (a new dry run in the same directory)


# --- events --------------------------------------------------------------------------------------

@jsonout.shape(inline=("data",))  # a JSON line of `run --json-lines`, a notification: the data as keys of its own
@attrs.frozen
class FeedEvent:
    """One line of the feed. ``at`` is the journal's time of what happened (run time: the plan's
    clock of a dry run, the wall clock of a live run); ``notify`` marks what notifications carry
    (pauses, criterion failures, rollbacks, consensus outages, the end)."""

    at: dt.datetime | None
    kind: str
    text: str
    severity: str = INFO
    notify: bool = False
    data: Pairs = ()

    def line(self, fmt: str = "%Y-%m-%d %H:%M") -> str:
        return f"{self.at:{fmt}} {self.text}" if self.at is not None else self.text


@attrs.frozen
class FeedContext:
    """What the feed knows besides the rows: the spec (stage names, criteria limits, authorities)
    and the directory as the user named it, for the commands it suggests."""

    exp: str
    spec: RolloutSpec | None = None
    experiment: str = ""

    @property
    def fmt(self) -> str:
        # an accelerated run's plan hour is seconds long: minutes alone would not tell its events apart
        if self.spec is not None and self.spec.cadence.interval_s < 3600:
            return "%H:%M:%S"
        return "%Y-%m-%d %H:%M"

    @property
    def n_authorities(self) -> int:
        return len(self.spec.authorities) if self.spec is not None else 0

    def where(self, stage: int) -> str:
        if stage == 0:
            return "baseline"
        if self.spec is not None and 1 <= stage <= self.spec.last_stage:
            return f"stage {stage} ({self.spec.stage(stage).name})"
        return f"stage {stage}"

    def t(self, at: dt.datetime | None) -> str:
        return "?" if at is None else f"{at:{self.fmt}}"


@attrs.frozen
class FeedState:
    """Where the feed is: the last status and what it said about the tables that change in place."""

    status: Status | None = None
    status_at: dt.datetime | None = None
    paused_at: dt.datetime | None = None
    collected_since_pause: int = 0
    intents: tuple[tuple[int, str, str], ...] = ()  # (id, state, error)
    commands: tuple[tuple[int, str], ...] = ()
    runs: tuple[tuple[int, bool], ...] = ()  # (id, ended)
    last_targets: Pairs | None = None
    last_consensus: Pairs | None = None
    consensus_seen: bool = False
    consensus_va: dt.datetime | None = None  # the newest round whose consensus was told
    params_va: dt.datetime | None = None  # the newest round whose parameters were read
    last_good: dt.datetime | None = None
    outage_start: dt.datetime | None = None
    outage_last: dt.datetime | None = None
    outage_rounds: int = 0
    authorities: tuple[tuple[str, str, dt.datetime], ...] = ()  # (name, condition, since) of those not ok


# --- plain words ---------------------------------------------------------------------------------

def values_text(values: Iterable[tuple[str, object]] | Mapping | None) -> str:
    items = values.items() if isinstance(values, Mapping) else (values or ())
    return " ".join(f"{k}={v}" for k, v in items) or "(no plan parameter)"


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def _limit_pct(x: float) -> str:
    return f"{x:+.4g} %"


def effect_text(comparison: str, threshold: float, effect: float | None, low: float | None, high: float | None,
                unit: str = "", factor: float = 1.0) -> str:
    """A verdict's effect in plain words: relative comparisons as a change in %, absolute ones as a
    difference in the metric's display unit, ``above``/``below`` as the stage's value; with the interval
    and the limit. The journal keeps the judge's scale (the ratio stage/baseline for relative
    comparisons, catalogue units otherwise), so a ratio of 1.706 is "+70.6 %"; ``unit`` and ``factor``
    are the metric's ``catalogue.display`` (relay CPU 0.012 is "1.2 % of one core")."""
    # a difference of a metric shown in % is one of percentage points: "+1 %" would read as relative
    diff = " percentage points" if unit == "%" else f" {unit}" if unit else ""
    u = f" {unit}" if unit else ""
    if comparison.startswith("relative"):
        def show(x: float) -> str:
            return _pct(100 * (x - 1))
        limit = _limit_pct(100 * (threshold if comparison == "relative-increase" else -threshold))
    elif comparison.startswith("absolute"):
        def show(x: float) -> str:
            return f"{x * factor:+.3g}{diff}"
        limit = f"{(threshold if comparison == 'absolute-increase' else -threshold) * factor:+.3g}{diff}"
    else:
        def show(x: float) -> str:
            return f"{x * factor:.3g}{u}"
        limit = f"{comparison} {threshold * factor:.3g}{u}"
    if effect is None:
        return f"(no estimate) vs limit {limit}"
    interval = f" [{show(low)}, {show(high)}]" if low is not None and high is not None else ""
    return f"{show(effect)}{interval} vs limit {limit}"


# the commands that may lift each pause reason, in the order they are suggested; each is checked
# against the state machine before it is offered (only what `kistexp CMD DIR` would accept is named)
_RESOLVERS: dict[str, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = {
    "manual": (("resume", ()),),
    "freeze": (("resume", ()),),
    "gate": (("promote", ()),),
    "inconclusive": (("promote", ()),),
    "stepped-back": (("promote", ()), ("undo", ())),
    "criterion-hold": (("promote", ()), ("promote", (("force", "True"),))),
    "not-in-consensus": (("undo", (("to_stage", "{stage}"),)),),
    "drift": (("undo", ()),),
    "error": (("undo", (("to_stage", "{stage}"),)),),
    "plan-changed": (("undo", ()),),
}
_HINTS = {"not-in-consensus": "once the authorities vote again", "drift": "after checking the authority",
          "error": "once the collector delivers again", "plan-changed": "after restoring or accepting the plan"}


def _command_text(exp: str, kind: str, args: tuple[tuple[str, str], ...]) -> str:
    flags = []
    for k, v in args:
        if k == "to_stage":
            flags.append(f"--to-stage {v}")
        elif k == "force":
            flags.append("--force")
    return " ".join(["kistexp", kind, shlex.quote(exp), *flags])


def resolving_commands(ctx: FeedContext, status: Status) -> tuple[str, ...]:
    """The commands that would lift ``status``'s pause, as the state machine judges them now
    (a command it would refuse is not suggested), ending with abort."""
    from kistexp.rollout.machine import step

    out: list[str] = []
    hint = ""
    for reason in sorted(status.reasons, key=lambda r: list(_RESOLVERS).index(r) if r in _RESOLVERS else 99):
        hint = hint or _HINTS.get(reason, "")
        for kind, raw_args in _RESOLVERS.get(reason, ()):
            args = tuple((k, v.format(stage=status.stage)) for k, v in raw_args)
            text = _command_text(ctx.exp, kind, args)
            if text in out:
                continue
            if ctx.spec is not None:
                trial = step(ctx.spec, status, Command(ctx.spec.start, kind, args, "feed"))
                if trial.refused:
                    continue
            if kind == "promote" and any(c.startswith(f"kistexp promote {shlex.quote(ctx.exp)}") for c in out):
                continue  # promote --force only where a plain promote is refused
            out.append(text)
    out.append(_command_text(ctx.exp, "abort", ()))
    if hint and len(out) > 1:
        out[0] = f"{out[0]} ({hint})"
    return tuple(out)


def _resolve_text(ctx: FeedContext, status: Status) -> str:
    return " | ".join(resolving_commands(ctx, status))


def _must_act(ctx: FeedContext, kind: str, current: Pairs | None, stage: int, at: dt.datetime
              ) -> tuple[tuple[str, ...], dt.datetime | None]:
    """The fewest authorities that must act for this rollback and the deadline, as the engine's
    own rollback planner computes them (``kistexp rollback --dry-run``)."""
    if ctx.spec is None:
        return (), None
    from kistexp.rollout.rollback import plan_rollback

    values = tuple(current) if current is not None else ctx.spec.baseline_values
    try:
        plan = plan_rollback(ctx.spec, kind, values, stage, at)
    except (ValueError, KeyError):
        return (), None
    return plan.must_act, plan.deadline


# --- the pure function ---------------------------------------------------------------------------

# at one instant: the looks before the rollback or hold they caused, a decision before its intents
_RANK = {"run": 0, "command": 1, "look": 2, "state": 3, "stage": 3, "pause": 3, "transition": 4, "rollback": 4,
         "decision": 5, "intent": 6, "authority": 7, "consensus": 8, "outage": 8, "gap": 9, "exposure": 9}


def feed(ctx: FeedContext, state: FeedState, rows: JournalRows) -> tuple[tuple[FeedEvent, ...], FeedState]:
    """The feed lines for ``rows`` read after ``state``, and the state after them (no I/O)."""
    events: list[FeedEvent] = []
    if rows.rewritten:
        state = FeedState()
        events.append(FeedEvent(None, "run", "the journal was started afresh (a new dry run here); following it"))
    state = _runs(ctx, state, rows.runs, events)
    state = _commands(ctx, state, rows.commands, events)
    state = _transitions(ctx, state, rows, events)
    state = _statuses(ctx, state, rows, events)
    _verdicts(ctx, rows.verdicts, events)
    state = _intents(ctx, state, rows.intents, events)
    state = _authorities(ctx, state, rows.votes, rows.health, events)
    state = _consensuses(ctx, state, rows.consensuses, events)
    _gaps(ctx, rows.gaps, events)
    _exposure(ctx, rows.exposure, events)
    if state.paused_at is not None and rows.batches:
        since = sum(1 for w in rows.batches if w >= state.paused_at)
        state = attrs.evolve(state, collected_since_pause=state.collected_since_pause + since)
    # one line each: texts from the journal (an actuator's error, a cause) may hold line breaks
    events = [e if " ".join(e.text.split()) == e.text else attrs.evolve(e, text=" ".join(e.text.split()))
              for e in events]
    # in time order, then by what reads best first at one instant (a decision before its looks' lines)
    order = sorted(range(len(events)), key=lambda i: (
        events[i].at or dt.datetime.min.replace(tzinfo=dt.timezone.utc), _RANK.get(events[i].kind, 10), i))
    return tuple(events[i] for i in order), state


def _runs(ctx: FeedContext, state: FeedState, runs: Sequence[RunRow], events: list[FeedEvent]) -> FeedState:
    known = dict(state.runs)
    for r in runs:
        if r.id not in known:
            events.append(FeedEvent(r.start, "run", f"run #{r.id} started (pid {r.pid} on {r.host})",
                                    data=(("run", r.id),)))
        if r.end is not None and not known.get(r.id, False):
            events.append(FeedEvent(r.end, "run", f"run #{r.id} ended: {r.reason or 'stopped'}",
                                    data=(("run", r.id), ("reason", r.reason))))
        known[r.id] = r.end is not None
    return attrs.evolve(state, runs=tuple(sorted(known.items())))


def _commands(ctx: FeedContext, state: FeedState, commands: Sequence[CommandRow], events: list[FeedEvent]
              ) -> FeedState:
    known = dict(state.commands)
    for c in commands:
        args = " ".join(f"{k}={v}" for k, v in c.args if v not in (None, False, ""))
        what = f"command {c.kind}{' ' + args if args else ''} (#{c.id}) by {c.user or '?'}"
        if c.id not in known and c.state == "queued":
            events.append(FeedEvent(c.queued, "command", f"{what}: queued", data=(("command", c.kind),)))
        elif known.get(c.id) != c.state and c.state != "queued":
            events.append(FeedEvent(c.queued, "command", f"{what}: {c.state}{': ' + c.result if c.result else ''}",
                                    WARNING if c.state == "refused" else INFO, data=(("command", c.kind),)))
        known[c.id] = c.state
    return attrs.evolve(state, commands=tuple(sorted(known.items())))


def _transitions(ctx: FeedContext, state: FeedState, rows: JournalRows, events: list[FeedEvent]) -> FeedState:
    # a rollback's kind is in the decision written with it (same instant, same target consensus)
    kinds = {(d.at, d.valid_after): d.decision for d in rows.decisions if d.valid_after is not None}
    current = state.last_targets
    for t in rows.transitions:
        values = values_text(t.targets)
        data: Pairs = (("stage", t.stage), ("valid_after", t.valid_after), ("targets", dict(t.targets)))
        if t.kind == "rollback":
            decision = kinds.get((t.at, t.valid_after), "rollback:")
            kind = decision.split(":", 1)[1] if decision.startswith("rollback:") else ""
            acting, deadline = _must_act(ctx, kind, current, t.stage, t.at) if kind else ((), None)
            who = f"; must act: {', '.join(acting)}" if acting else ""
            when = f" before {ctx.t(deadline)}" if acting and deadline is not None else ""
            # the failing look has its own line just before; the cause's judge detail stays in the data
            failed = re.match(r"criterion '(.*)' failed", t.cause)
            why = f" after {failed.group(1)!r} failed" if failed else f" ({t.cause})" if t.cause else ""
            events.append(FeedEvent(
                t.at, "rollback", f"ROLLBACK {kind or '?'} from {ctx.where(t.stage)}{why}: participants vote "
                f"{values} for the consensus of {ctx.t(t.valid_after)}{who}{when}", CRITICAL, True,
                data + (("rollback_kind", kind), ("authorities_must_act", list(acting)), ("cause", t.cause))))
        elif t.kind == "reassert":
            events.append(FeedEvent(t.at, "transition", f"re-asserting {values} for the consensus of "
                                    f"{ctx.t(t.valid_after)} ({t.cause})", WARNING, data=data))
        else:
            what = {"stage": "next", "retry": "retried", "undo": "undo to"}.get(t.kind, t.kind)
            events.append(FeedEvent(t.at, "transition", f"{ctx.where(t.stage)} {what}: participants vote {values} "
                                    f"for the consensus of {ctx.t(t.valid_after)} ({t.cause})", data=data))
        current = t.targets
    return attrs.evolve(state, last_targets=current)


def _statuses(ctx: FeedContext, state: FeedState, rows: JournalRows, events: list[FeedEvent]) -> FeedState:
    by_key: dict[str, list[DecisionRow]] = {}
    for d in rows.decisions:
        by_key.setdefault(d.event_key, []).append(d)
    said: set[str] = set()
    for s in rows.statuses:
        prev = state.status or Status()
        new = s.status
        messages = [d.message for d in by_key.get(s.event_key, ()) if d.message]
        why = f" ({'; '.join(messages)})" if messages else ""
        ev = _status_event(ctx, prev, new, s.at, why)
        if ev is not None:
            events.append(ev)
            said.add(s.event_key)
        paused_at = state.paused_at
        if new.state == PAUSED and (prev.state != PAUSED or paused_at is None):
            paused_at = s.at
        elif new.state != PAUSED:
            paused_at = None
        collected = state.collected_since_pause if paused_at == state.paused_at else 0  # a new pause counts anew
        state = attrs.evolve(state, status=new, status_at=s.at, paused_at=paused_at, collected_since_pause=collected)
    for d in rows.decisions:
        # a decision whose status change was told above, or that made a transition (its own line), is said
        if d.event_key in said or d.valid_after is not None:
            continue
        if d.decision == "hold":
            text = f"{ctx.where(d.stage)} extended one hour: {d.message.removeprefix('hold: ')}"
            events.append(FeedEvent(d.at, "decision", text, data=(("decision", d.decision),)))
        elif d.decision in ("clock-jump", "frozen"):
            events.append(FeedEvent(d.at, "decision", f"{d.decision}: {d.message}", WARNING,
                                    data=(("decision", d.decision),)))
        elif d.decision and not any(s.event_key == d.event_key for s in rows.statuses):
            events.append(FeedEvent(d.at, "decision", f"{d.decision}: {d.message}".rstrip(": "),
                                    data=(("decision", d.decision),)))
    return state


def _status_event(ctx: FeedContext, prev: Status, new: Status, at: dt.datetime, why: str) -> FeedEvent | None:
    data: Pairs = (("state", new.state), ("stage", new.stage), ("reasons", sorted(new.reasons)),
                   ("values", dict(new.values)))
    if new.state == PAUSED:
        added = new.reasons - prev.reasons if prev.state == PAUSED else new.reasons
        if prev.state == PAUSED and not added:
            if new.reasons != prev.reasons:
                return FeedEvent(at, "pause", f"still PAUSED ({', '.join(sorted(new.reasons))}) at "
                                 f"{ctx.where(new.stage)}{why}; resolve with: {_resolve_text(ctx, new)}", WARNING,
                                 data=data)
            return None
        return FeedEvent(at, "pause", f"PAUSED ({', '.join(sorted(new.reasons))}) at {ctx.where(new.stage)}{why}; "
                         f"resolve with: {_resolve_text(ctx, new)}",
                         CRITICAL if new.reasons & {"drift", "not-in-consensus", "error", "criterion-hold"}
                         else WARNING, True, data + (("resolve_with", list(resolving_commands(ctx, new))),))
    if new.state == prev.state and new.reasons == prev.reasons and new.stage == prev.stage:
        return None  # counters, extensions, deadlines: the decision's own line tells them
    if new.state in (TRANSITIONING, ROLLING_BACK):
        return None  # the transition's own line tells it
    if new.state == COMPLETED:
        return FeedEvent(at, "state", f"COMPLETED at {ctx.where(new.stage)}{why}", INFO, True, data)
    if new.state == ABORTED:
        return FeedEvent(at, "state", f"ABORTED from {ctx.where(new.aborted_stage or new.stage)}{why}", CRITICAL, True,
                         data)
    resumed = "resumed: " if prev.state == PAUSED else ""
    if new.state == BASELINE:
        if prev.state == PENDING:
            text = f"baseline started: {values_text(new.values)}; decision due {ctx.t(new.decision_at)}"
        else:
            text = f"{resumed}back at the baseline: {values_text(new.values)}"
            if new.stage_va is not None:
                text += f" in the consensus of {ctx.t(new.stage_va)}"
        return FeedEvent(at, "stage", text, data=data)
    if new.state == WASHOUT:
        until = ""
        if ctx.spec is not None and new.stage_va is not None:
            until = f"; washout until {ctx.t(new.stage_va + ctx.spec.washout)}"
        return FeedEvent(at, "stage", f"{resumed}{ctx.where(new.stage)} entered: the consensus of "
                         f"{ctx.t(new.stage_va)} carries {values_text(new.values)}{until}", data=data)
    if new.state == MEASURING:
        return FeedEvent(at, "stage", f"{resumed}{ctx.where(new.stage)} measuring ({values_text(new.values)}); "
                         f"decision due {ctx.t(new.decision_at)}", data=data)
    return FeedEvent(at, "state", f"{resumed}{new.describe()}{why}", data=data)


def _verdicts(ctx: FeedContext, verdicts: Sequence[VerdictRow], events: list[FeedEvent]) -> None:
    from kistexp.metrics import catalogue

    for v in verdicts:
        crit = None
        if ctx.spec is not None:
            crit = next((c for c in ctx.spec.criteria if c.name == v.criterion), None)
        outcome = v.outcome.upper()
        if v.outcome in ("pass", "fail", "inconclusive") and crit is not None:
            unit, factor = catalogue.display(crit.metric)
            words = effect_text(crit.comparison, crit.threshold, v.effect, v.ci_low, v.ci_high, unit, factor)
            if v.outcome == "inconclusive":
                words += f" ({v.reason or v.detail or 'inconclusive'})"
        else:
            words = v.detail or v.reason or ""
        shadow = " (shadow: never acted on)" if v.shadow else ""
        text = f"look {ctx.where(v.stage)}: {v.criterion}: {outcome} {words}".rstrip() + shadow
        failed = v.outcome == "fail" and not v.shadow
        severity = CRITICAL if failed else WARNING if v.outcome in ("error", "fail") else INFO
        events.append(FeedEvent(v.window_end, "look", text, severity, failed, data=(
            ("criterion", v.criterion), ("outcome", v.outcome), ("effect", v.effect), ("ci_low", v.ci_low),
            ("ci_high", v.ci_high), ("stage", v.stage), ("n_baseline", v.n_baseline), ("n_stage", v.n_stage))))


_INTENT_WORDS = {"acted": "acted: {who} set to {values} for the consensus of {va}",
                 "verified": "verified: the votes of {who} carry {values} for the consensus of {va}",
                 "done": "done: the consensus of {va} carries {values} ({who})",
                 "superseded": "superseded: {values} for the consensus of {va} ({who}); a later round takes over",
                 "failed": "failed: {values} for the consensus of {va} ({who})"}


def _intents(ctx: FeedContext, state: FeedState, intents: Sequence[IntentRow], events: list[FeedEvent]
             ) -> FeedState:
    known = {i: (s, e) for i, s, e in state.intents}
    groups: dict[tuple[str, dt.datetime, Pairs], list[IntentRow]] = {}
    for it in intents:
        before = known.get(it.id)
        if before is None and it.state == "intended" and not it.error:
            pass  # written with its transition, whose line names the values and the consensus
        elif before is None or before[0] != it.state:
            groups.setdefault((it.state, it.valid_after, it.desired), []).append(it)
        if it.state == "intended" and it.error and (before is None or before[1] != it.error):
            events.append(FeedEvent(it.changed or it.valid_after, "intent",
                                    f"could not act on {it.authority} yet (attempt {it.attempts}): {it.error}",
                                    WARNING, data=(("authority", it.authority), ("state", it.state))))
        known[it.id] = (it.state, it.error)
    for (st, va, desired), items in groups.items():
        if st == "intended":
            continue
        names = ", ".join(dict.fromkeys(i.authority for i in items))
        at = max((i.changed for i in items if i.changed is not None), default=va)
        words = _INTENT_WORDS.get(st, st + ": {values} for the consensus of {va} ({who})")
        events.append(FeedEvent(at, "intent", "intent " + words.format(who=names, values=values_text(desired),
                                                                        va=ctx.t(va)),
                                WARNING if st == "failed" else INFO,
                                data=(("state", st), ("authorities", [i.authority for i in items]),
                                      ("valid_after", va), ("desired", dict(desired)))))
    return attrs.evolve(state, intents=tuple(sorted((i, s, e) for i, (s, e) in known.items())))


def _authorities(ctx: FeedContext, state: FeedState, votes: Sequence[VoteRow], health: Sequence[HealthRow],
                 events: list[FeedEvent]) -> FeedState:
    """Outages per authority, told when an authority's condition changes (not every round)."""
    cond = {name: (c, since) for name, c, since in state.authorities}
    rank = {a: i for i, a in enumerate(ctx.spec.authorities)} if ctx.spec is not None else {}
    observations = sorted([(v.valid_after, v.authority, "ok" if v.served else "down") for v in votes]
                          + [(h.valid_after, h.authority, h.state or "ok") for h in health],
                          key=lambda o: (o[0], rank.get(o[1], len(rank)), o[1]))
    changes: dict[tuple[dt.datetime, str], list[str]] = {}
    for va, name, c in observations:
        was = cond.get(name, ("ok", va))[0]
        if c == was:
            continue
        if c == "ok":
            since = cond.pop(name)[1]
            changes.setdefault((va, f"back:{was}:{ctx.t(since)}"), []).append(name)
        else:
            cond[name] = (c, va)
            changes.setdefault((va, c), []).append(name)
    for (va, c), names in sorted(changes.items()):
        if c.startswith("back:"):
            _, was, since = c.split(":", 2)
            events.append(FeedEvent(va, "authority", f"voting again in the round of {ctx.t(va)}: {', '.join(names)} "
                                    f"({was} since {since})", data=(("condition", "ok"), ("authorities", names))))
            continue
        what = {"down": "no vote served", "stale": "an old vote served (not counted)",
                "not-signing": "vote counted but no signature"}.get(c, c)
        down = sorted(n for n, (cc, _) in cond.items() if cc != "ok")
        of = f" ({len(down)} of {ctx.n_authorities} not voting)" if ctx.n_authorities and c == "down" else ""
        events.append(FeedEvent(va, "authority", f"authority outage in the round of {ctx.t(va)}: {what} by "
                                f"{', '.join(names)}{of}", CRITICAL if c == "down" else WARNING,
                                data=(("condition", c), ("authorities", list(names)))))
    return attrs.evolve(state, authorities=tuple(sorted((n, c, s) for n, (c, s) in cond.items())))


def _consensuses(ctx: FeedContext, state: FeedState, rows: Sequence[ConsensusRow], events: list[FeedEvent]
                 ) -> FeedState:
    """Each round once for its outage lines (a round is read again after a restart, and from both the
    consensus rows and the engine's health rows); each change of the parameters once, from the first
    row of the round that has them."""
    n = ctx.n_authorities
    interval = ctx.spec.hour if ctx.spec is not None else None
    for c in sorted(rows, key=lambda r: r.valid_after):
        signed = len(c.signers)
        majority = c.was_published and (not c.signers or not n or signed * 2 > n)
        of = f"signed by {signed} of {n}" if c.signers and n else "signers not recorded" if not c.signers else \
            f"signed by {signed}"
        fresh = state.consensus_va is None or c.valid_after > state.consensus_va
        if fresh:
            state = attrs.evolve(state, consensus_va=c.valid_after)
            state = _round_outage(ctx, state, c, majority, of, interval, events)
        if not majority:
            continue
        state = attrs.evolve(state, last_good=max(c.valid_after, state.last_good or c.valid_after))
        if c.params is None or (state.params_va is not None and c.valid_after <= state.params_va):
            continue  # signed by a majority, its parameters not read here (or told already)
        state = attrs.evolve(state, params_va=c.valid_after)
        if not state.consensus_seen or c.params != state.last_consensus:
            before = dict(state.last_consensus or ())
            now = dict(c.params)
            if state.consensus_seen and state.last_consensus is not None:
                words = ", ".join(f"{k} {before.get(k, 'absent')} -> {now.get(k, 'absent')}"
                                  for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k))
            else:
                words = values_text(c.params)
            missing = ""
            if c.signers and ctx.spec is not None:
                absent = [a for a in ctx.spec.authorities if a not in c.signers]
                missing = f"; not signed by {', '.join(absent)}" if absent else ""
            events.append(FeedEvent(c.valid_after, "consensus", f"consensus of {ctx.t(c.valid_after)}: {words} "
                                    f"({of}{missing})", data=(("valid_after", c.valid_after), ("params", now),
                                                              ("signers", list(c.signers)))))
        state = attrs.evolve(state, last_consensus=c.params, consensus_seen=True)
    return state


def _round_outage(ctx: FeedContext, state: FeedState, c: ConsensusRow, majority: bool, of: str,
                  interval: dt.timedelta | None, events: list[FeedEvent]) -> FeedState:
    """A round without a majority-signed consensus starts or extends the stretch; one with it ends it."""
    if majority:
        if state.outage_start is not None:
            rounds = state.outage_rounds
            events.append(FeedEvent(c.valid_after, "outage", f"majority-signed consensus again for "
                                    f"{ctx.t(c.valid_after)} ({of}) after {rounds} round{'s' if rounds != 1 else ''} "
                                    f"without one ({ctx.t(state.outage_start)} .. {ctx.t(state.outage_last)})",
                                    data=(("valid_after", c.valid_after), ("rounds", rounds),
                                          ("since", state.outage_start))))
            state = attrs.evolve(state, outage_start=None, outage_last=None, outage_rounds=0)
        return state
    gap = state.outage_last is not None and interval is not None and c.valid_after - state.outage_last > interval
    if state.outage_start is None or gap:
        state = attrs.evolve(state, outage_start=c.valid_after, outage_rounds=0)
    rounds = state.outage_rounds + 1
    state = attrs.evolve(state, outage_last=c.valid_after, outage_rounds=rounds)
    what = "none published" if not c.was_published else f"published but only {of}"
    last = f"; last majority-signed consensus {ctx.t(state.last_good)}" if state.last_good else ""
    first = rounds == 1
    if not first and rounds % 3:
        return state  # a long outage is told at its start, every third round, and at its end
    text = (f"no majority-signed consensus for the round of {ctx.t(c.valid_after)} ({what}){last}" if first
            else f"still no majority-signed consensus: round of {ctx.t(c.valid_after)}, {rounds} rounds "
                 f"since {ctx.t(state.outage_start)} ({what})")
    events.append(FeedEvent(c.valid_after, "outage", text, CRITICAL, first, data=(
        ("valid_after", c.valid_after), ("rounds", rounds), ("since", state.outage_start),
        ("signers", list(c.signers)))))
    return state


def _gaps(ctx: FeedContext, gaps: Sequence[GapRow], events: list[FeedEvent]) -> None:
    groups: dict[tuple[str, dt.datetime, str, str], list[str]] = {}
    for g in gaps:
        groups.setdefault((g.source, g.window, g.instance, g.problem), []).append(g.metric)
    hour = ctx.spec.hour if ctx.spec is not None else dt.timedelta(hours=1)
    for (source, window, instance, problem), metrics in sorted(groups.items()):
        who = f"{source} {instance}" if instance else source
        what = ", ".join(m for m in dict.fromkeys(metrics) if m)
        tail = f" ({what})" if what else ""
        tail += f": {problem}" if problem else ""
        events.append(FeedEvent(window + hour, "gap", f"metric gap: no {who} samples for {ctx.t(window)} .. "
                                f"{ctx.t(window + hour)}{tail}", WARNING,
                                data=(("source", source), ("window", window), ("metrics", list(dict.fromkeys(metrics))),
                                      ("instance", instance), ("problem", problem))))


def _exposure(ctx: FeedContext, rows: Sequence[ExposureRow], events: list[FeedEvent]) -> None:
    for e in rows:
        if not e.short:
            continue
        population = e.population or "?"
        seen = "unknown" if e.observed_share is None else f"{100 * e.observed_share:.0f} %"
        want = "?" if e.expected_share is None else f"{100 * e.expected_share:.0f} %"
        detail = f" ({e.detail})" if e.detail else ""
        events.append(FeedEvent(e.at, "exposure", f"exposure short at {ctx.where(e.stage)}: {seen} of "
                                f"{population} run its values, {want} expected{detail}", WARNING,
                                data=(("population", population), ("observed", e.observed_share),
                                      ("expected", e.expected_share))))


def reminder(ctx: FeedContext, state: FeedState) -> FeedEvent | None:
    """While paused: since when, why, that metrics are still collected, and what resolves it."""
    st = state.status
    if st is None or st.state != PAUSED or state.paused_at is None:
        return None
    n = state.collected_since_pause
    collecting = (f"still collecting ({n} metric batch{'es' if n != 1 else ''} since)" if n
                  else "no metric batch collected since")
    return FeedEvent(None, "reminder", f"paused since {ctx.t(state.paused_at)} ({', '.join(sorted(st.reasons))}) at "
                     f"{ctx.where(st.stage)}; {collecting}; resolve with: {_resolve_text(ctx, st)}", WARNING,
                     data=(("paused_at", state.paused_at), ("reasons", sorted(st.reasons))))
