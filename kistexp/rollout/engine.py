"""The rollout engine: triggers -> observations -> the pure state machine -> journaled intents -> actuation.

Both drivers call ``next_wakeup()`` and ``step(now)``; the engine computes every fire time from
the trigger objects of ``triggers()`` (derived from the status), processes what is due in
(time, class, stage, name) order and journals each processed event under a unique key, so a
restart never processes one twice and redoes, in order, whatever was due while it was down
(rollout.md §2.5, §3.4).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Protocol

from kistexp.clock import Clock
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.metrics import catalogue
from kistexp.rollout import sources
from kistexp.rollout import triggers as tg
from kistexp.rollout.actuators import ActuationError, Actuator, Intent
from kistexp.rollout.analysis import Analysis
from kistexp.rollout.exposure import ExposureProbe
from kistexp.rollout.journal import Journal, desired_params
from kistexp.rollout.judging import SWITCHBACK_PHASE
from kistexp.rollout.machine import initial_status, mismatched, step
from kistexp.rollout.sources import PREDICTED, Collection, MetricSource
from kistexp.rollout.spec import RolloutSpec
from kistexp.rollout.state import (
    BASELINE,
    ERROR,
    INCONCLUSIVE,
    MEASURING,
    PAUSED,
    PENDING,
    ROLLING_BACK,
    TRANSITIONING,
    WASHOUT,
    Command,
    ConsensusCheck,
    DecisionDue,
    Drift,
    Evaluate,
    MachineVerdict,
    Outcome,
    PlanChanged,
    Start,
    Status,
    WashoutEnd,
)


def metric_source_of(metric: str) -> str:
    """The collector a metric is gathered from: the first one the catalogue names."""
    m = catalogue.get(metric)
    return m.collectors[0] if m else "unknown"


Hook = Callable[[str], None]


class AnonymityVerdicts(Protocol):
    """Where a stage's anonymity criteria are judged from: the predictions (``kistexp.rollout.anonymity``)."""

    def verdicts(self, spec: RolloutSpec, stage: int) -> tuple[MachineVerdict, ...]: ...


class Engine:
    """One engine, four ports (rollout.md §2.5): the driver calls ``step``; ``actuator`` acts on the
    authorities; ``metrics`` answers each collection (predicted, recorded or measured); ``journal``
    keeps everything. ``exposure`` (optional) says who runs the stage's values at each look; a stage
    whose exposure falls short holds instead of being judged as if applied."""

    def __init__(self, spec: RolloutSpec, journal: Journal, actuator: Actuator, metrics: MetricSource,
                 clock: Clock, *, experiment_id: str = "",
                 plan_check: Callable[[], str] | None = None, hook: Hook | None = None,
                 exposure: ExposureProbe | None = None, anonymity: AnonymityVerdicts | None = None) -> None:
        self.spec, self.journal, self.actuator, self.metrics, self.clock = spec, journal, actuator, metrics, clock
        self.anonymity = anonymity
        self.experiment_id = experiment_id or spec.plan_name
        self.plan_check = plan_check
        self.hook = hook or (lambda _name: None)
        self.exposure = exposure
        self.status: Status = journal.status() or initial_status(spec)
        self.sources = sorted({self.source_of(c.metric) for c in spec.criteria})
        self._fired: dict[str, dt.datetime] = journal.last_fires()
        self.analysis = Analysis(spec, journal)

    def source_of(self, metric: str) -> str:
        """The collector kind a metric is collected from: the metric source's choice when it has
        one (a measured run's instruments), else the catalogue's first."""
        pick = getattr(self.metrics, "source_of", None)
        return pick(metric) if pick is not None else metric_source_of(metric)

    # --- triggers ------------------------------------------------------------------------

    def triggers(self) -> list[tg.NamedTrigger]:
        st, spec = self.status, self.spec
        out: list[tg.NamedTrigger] = []
        if st.terminal:
            return out
        if st.state == PENDING:
            out.append(tg.NamedTrigger("start", tg.START, 0, tg.date_trigger(spec.baseline_start)))
            return out
        first_collect = spec.baseline_start + spec.hour
        for source in self.sources:
            out.append(tg.NamedTrigger(f"collect:{source}", tg.COLLECT, 0,
                                       tg.interval_trigger(spec.hour, first_collect), first_collect))
        out.append(tg.NamedTrigger("evaluate", tg.EVALUATE, 0, tg.interval_trigger(spec.hour, first_collect),
                                   first_collect))
        if st.state == BASELINE and st.stage_va is None and spec.baseline_values:
            va = spec.cadence.va_at_or_after(spec.baseline_start)
            out.append(tg.NamedTrigger(f"consensus_check:{va:%Y%m%dT%H%M%S}", tg.CONSENSUS_CHECK, 0,
                                       tg.TorScheduleTrigger(spec.cadence, "publish", va)))
        if st.target_va is not None and (st.state in (TRANSITIONING, ROLLING_BACK)
                                         or st.resume_to in (TRANSITIONING, ROLLING_BACK)):
            va, tag = st.target_va, f"{st.target_va:%Y%m%dT%H%M%S}"
            out.append(tg.NamedTrigger(f"consensus_check:{tag}", tg.CONSENSUS_CHECK, st.stage,
                                       tg.TorScheduleTrigger(spec.cadence, "publish", va)))
            out.append(tg.NamedTrigger(f"vote_check:{tag}", tg.VOTE_CHECK, st.stage,
                                       tg.TorScheduleTrigger(spec.cadence, "votes", va)))
            if self.journal.intents(("intended",)):
                out.append(tg.NamedTrigger(f"act:{st.seq}:{tag}", tg.ACT, st.stage,
                                           tg.TorScheduleTrigger(spec.cadence, "window", va)))
        if st.state == WASHOUT and st.stage_va is not None:
            out.append(tg.NamedTrigger(f"washout_end:{st.stage}:{st.stage_va:%Y%m%dT%H%M%S}", tg.WASHOUT_END,
                                       st.stage, tg.date_trigger(st.stage_va + spec.washout)))
        if st.state in (BASELINE, MEASURING) and st.decision_at is not None:
            out.append(tg.NamedTrigger(f"decision_due:{st.stage}:{st.decision_at:%Y%m%dT%H%M%S}",
                                       tg.DECISION_DUE, st.stage, tg.date_trigger(st.decision_at)))
        return out

    def _due(self, now: dt.datetime) -> list[tuple[dt.datetime, int, int, str, tg.NamedTrigger]]:
        due = []
        for t in self.triggers():
            at = t.next_fire(self._fired.get(t.name), now)
            if at is not None:
                due.append((at, t.klass, t.stage, t.name, t))
        return sorted(due, key=lambda d: d[:4])

    def next_wakeup(self, now: dt.datetime | None = None) -> dt.datetime | None:
        due = self._due(now or self.clock.now())
        return due[0][0] if due else None

    # --- stepping ------------------------------------------------------------------------

    def step(self, now: dt.datetime | None = None) -> int:
        """Process every event due at or before ``now``; returns how many were processed."""
        now = now or self.clock.now()
        n = self._commands(now)
        while not self.status.terminal:
            due = self._due(now)
            if not due or due[0][0] > now:
                break
            at, _, _, name, trig = due[0]
            key = tg.event_key(name, at)
            if self.journal.processed(key):
                self._fired[name] = at
                continue
            self._process(trig, at, key, now)
            self._fired[name] = at
            n += 1
            n += self._commands(now)
        return n

    def clock_jump(self, now: dt.datetime, jump_s: float) -> None:
        """Journal a wall-clock jump the live driver saw (rollout.md §2.6). Nothing else changes:
        events are keyed by their due times, so none fires twice and none is skipped."""
        key = f"clock-jump@{now.isoformat()}"
        with self.journal.write() as c:
            self.journal.record(c, event_key=key, trigger="clock-jump", due=now, now=now, before=self.status,
                                after=self.status, decision="clock-jump",
                                message=f"wall clock jumped {'forward' if jump_s > 0 else 'backward'} "
                                        f"{abs(jump_s):.1f} s against the monotonic clock")

    def _commands(self, now: dt.datetime) -> int:
        n = 0
        for cmd in self.journal.queued_commands():
            args = tuple(sorted((k, str(v)) for k, v in cmd["args"].items() if v not in (None, False, "")))
            ev = Command(now, cmd["kind"], args, cmd["user"])
            out = step(self.spec, self.status, ev)
            key = f"command:{cmd['id']}"
            self._commit(key, "command", now, now, out, extra=lambda c, cmd=cmd, out=out: self.journal.command_result(
                c, cmd["id"], "refused" if out.refused else "applied", out.message))
            n += 1
        return n

    def _commit(self, key: str, trigger: str, due: dt.datetime, now: dt.datetime, out: Outcome,
                extra: Callable | None = None) -> None:
        before = self.status
        if out.transition is not None:
            self.hook("before_intent")
        with self.journal.write() as c:
            if extra is not None:
                extra(c)
            self.journal.record(c, event_key=key, trigger=trigger, due=due, now=now, before=before,
                                after=out.status, transition=out.transition, participants=self.spec.participating,
                                experiment_id=self.experiment_id, decision=out.decision, message=out.message)
        self.status = out.status
        if out.transition is not None:
            self.hook("after_intent")
            self._act(now)

    def _machine(self, key: str, trigger: str, due: dt.datetime, now: dt.datetime, event,
                 extra: Callable | None = None) -> None:
        self._commit(key, trigger, due, now, step(self.spec, self.status, event), extra)

    def _process(self, trig: tg.NamedTrigger, at: dt.datetime, key: str, now: dt.datetime) -> None:
        kind = trig.name.split(":", 1)[0]
        if kind == "start":
            self._machine(key, trig.name, at, now, Start(at))
        elif kind == "collect":
            self._collect(trig.name.split(":", 1)[1], at, key, trig.name, now)
        elif kind == "evaluate":
            self._evaluate(at, key, trig.name, now)
        elif kind == "washout_end":
            self._machine(key, trig.name, at, now, WashoutEnd(at, trig.stage))
        elif kind == "decision_due":
            self._decide(at, key, trig.name, now)
        elif kind == "act":
            self._act(now)
            with self.journal.write() as c:
                self.journal.record(c, event_key=key, trigger=trig.name, due=at, now=now, before=self.status,
                                    after=self.status)
        elif kind == "vote_check":
            self._vote_check(at, key, trig.name, now)
        elif kind == "consensus_check":
            self._consensus_check(at, key, trig.name, now)
        else:
            raise ValueError(f"unknown trigger {trig.name}")

    # --- actuation (§3.1, §3.3) -------------------------------------------------------------

    def _act(self, now: dt.datetime) -> None:
        if self.plan_check is not None:
            diff = self.plan_check()
            if diff:
                # nothing is sent while the plan differs; the pause is journaled once, not at every actuation
                # attempt (a transition and its act trigger at one instant used to record the same event
                # twice and stop the run on the journal's unique event key)
                key = f"plan-changed:{self.status.seq}@{now.isoformat()}"
                if "plan-changed" not in self.status.reasons and not self.journal.processed(key):
                    self._machine(key, "plan-changed", now, now, PlanChanged(now, diff))
                return
        if "drift" in self.status.reasons:
            return  # someone else changed an authority: nothing is sent until an operator decides
        for intent in self.journal.intents(("intended",)):
            if now < self.spec.cadence.window_opens(intent["valid_after"]):
                continue  # too early: it would land a round before T (§2.1); the act trigger returns
            desired = intent["desired"]
            try:
                # re-read the authority first (§3.3): a resumed run finds a change it made before
                # it was killed already in place and sends nothing
                current = self.actuator.current(intent["authority"])
                if current is not None and _plan_part(current, self.spec) == desired:
                    response = "already set"
                elif (current is not None and self.status.state != ROLLING_BACK
                      and _plan_part(current, self.spec) not in self._asked_before(intent)):
                    # a rollback is sent whatever the authority has: it is the way back to safety
                    seen = _plan_part(current, self.spec)
                    detail = (f"{intent['authority']} has {_params_text(seen)}, neither the target "
                              f"{_params_text(desired)} nor a value the rollout set before; not changing it "
                              "(abort or undo to continue)")
                    self._machine(f"drift:{intent['idem_key']}@{now.isoformat()}", "drift", now, now,
                                  Drift(now, detail))
                    return
                else:
                    full = {k: v for k, v in (current or {}).items() if k not in self.spec.parameters}
                    full.update(desired)  # the whole set: keep the operator's other keys
                    response = self.actuator.apply(Intent(intent["authority"], full, intent["idem_key"],
                                                          intent["valid_after"], intent["seq"]))
            except ActuationError as exc:
                self.journal.mark_intent(intent["id"], "intended", now, error=str(exc), attempt=True)
                continue
            self.hook("after_act")
            self.journal.mark_intent(intent["id"], "acted", now, evidence=json.dumps({"response": response}),
                                     attempt=True)

    def _asked_before(self, intent: dict) -> list[dict]:
        """Every set the rollout asked of this authority before ``intent`` (an intent superseded
        after a kill may have reached it unrecorded), and the baseline it started from."""
        return [desired_params(self.spec.baseline_values), *self.journal.asked_before(intent["authority"],
                                                                                       intent["id"])]

    def _vote_check(self, at: dt.datetime, key: str, name: str, now: dt.datetime) -> None:
        va = self.status.target_va
        for a in self.spec.authorities:
            self.journal.vote_seen(a, va, self.actuator.fetch_vote(a, va))
        votes = {v["authority"]: v["params"] for v in self.journal.votes() if v["valid_after"] == va}
        for intent in self.journal.intents(("acted",)):
            if intent["valid_after"] != va:
                continue
            seen = votes.get(intent["authority"])
            if seen is not None and _plan_part(seen, self.spec) == intent["desired"]:
                # the vote joins the actuator's answer: the evidence keeps both
                acted = json.loads(intent["evidence"]) if intent["evidence"] else {}
                self.journal.mark_intent(intent["id"], "verified", now, evidence=json.dumps(
                    {**acted, "vote": seen, "valid_after": va.isoformat()}))
                self.hook("after_verify")
        with self.journal.write() as c:
            self.journal.record(c, event_key=key, trigger=name, due=at, now=now, before=self.status,
                                after=self.status)

    def _consensus_check(self, at: dt.datetime, key: str, name: str, now: dt.datetime) -> None:
        va = at - dt.timedelta(seconds=self.spec.cadence.check_delay_s)
        params, signers = self.actuator.fetch_consensus(va)
        self.journal.consensus_seen(va, params, signers)
        items = None if params is None else tuple(sorted(params.items()))
        laggards: tuple[str, ...] = ()
        if self.status.target_va == va:
            want = desired_params(self.status.values)
            laggards = tuple(a for a in self.spec.participating
                             if _plan_part(self.actuator.fetch_vote(a, va) or {}, self.spec) != want)
            if not mismatched(self.spec, self.status.values, items):
                self.hook("before_done")
                with self.journal.write() as c:
                    self.journal.mark_round_done(c, va, now)
        # the check's own instant is when it ran: a late one (after a restart) re-asserts for a round still
        # feasible; made after the next round began, it cannot tell a missing consensus from a replaced one
        late = now >= va + dt.timedelta(seconds=self.spec.cadence.interval_s)
        self._machine(key, name, at, now, ConsensusCheck(max(at, now), va, items, laggards, late=late))

    # --- metrics and verdicts ---------------------------------------------------------------

    def _phase(self, t0: dt.datetime) -> str:
        st, spec = self.status, self.spec
        state = st.resume_to if st.state == PAUSED else st.state
        if state == BASELINE and st.stage == 0:
            return "baseline"
        if state == MEASURING and st.stage >= 1 and st.stage_va is not None and t0 >= st.stage_va + spec.washout:
            return f"stage:{st.stage}:{st.stage_va:%Y%m%dT%H%M%S}"
        return "excluded"  # windows overlapping a transition, washout or rollback (§1.4)

    def _collect(self, source: str, at: dt.datetime, key: str, name: str, now: dt.datetime) -> None:
        t0 = at - self.spec.hour
        phase = self._phase(t0)
        metrics = sorted({c.metric for c in self.spec.criteria if self.source_of(c.metric) == source})
        want = desired_params(self._phase_values(phase))
        cols = []
        for m in metrics:
            col = as_collection(self.metrics.collect(source, m, t0, at), m, t0, at,
                                getattr(self.metrics, "origin", PREDICTED))
            kept = self.analysis.mid_switch(col, phase, want, getattr(self.metrics, "params_at", None))
            excluded = 0 if col.values is None or kept.values is None else int(col.values.size - kept.values.size)
            cols.append((kept, excluded))
        self.hook("mid_batch")
        with self.journal.write() as c:
            self.analysis.write(c, source, t0, phase, cols, now)
            self.journal.record(c, event_key=key, trigger=name, due=at, now=now, before=self.status,
                                after=self.status)
        self.analysis.remember(t0, phase, cols)

    def _phase_values(self, phase: str):
        if phase.startswith("stage:"):
            return self.spec.values_of(int(phase.split(":")[1]))
        return self.spec.baseline_values

    def _look(self, phase: str, at: dt.datetime) -> list[tuple[MachineVerdict, object]]:
        # a stage the network has not taken up is not judged as if applied: every criterion holds, and
        # the judge is not asked at all (its sequential tests stay where they were)
        shortfall = self._exposure_check(phase, at) if self.exposure is not None else ""
        if shortfall:
            return [(MachineVerdict(c.name, INCONCLUSIVE, detail=f"exposure short: {shortfall}"), None)
                    for c in self.spec.criteria]
        return self.analysis.look(phase, at)

    def _exposure_check(self, phase: str, at: dt.datetime) -> str:
        stage = int(phase.split(":")[1])
        va = self.status.stage_va
        try:
            rows = self.exposure.measure(stage, desired_params(self._phase_values(phase)), va, at)
        except Exception as exc:  # a probe that fails is a shortfall: unknown exposure is not exposure
            return f"exposure probe failed: {exc}"
        with self.journal.write() as c:
            for r in rows:
                self.journal.add_exposure(c, r)
        return "; ".join(r.detail for r in rows if r.short)

    def _journal_looks(self, c, looks: list[tuple[MachineVerdict, object]], phase: str, at: dt.datetime) -> None:
        self.analysis.journal_looks(c, looks, phase, at, self.status.stage)

    def _remember(self, looks: list[tuple[MachineVerdict, object]], phase: str) -> None:
        self.analysis.remember_looks(looks, phase)

    def _authority_health(self, at: dt.datetime) -> None:
        """Which authorities voted and signed the newest consensus served at the look (rollout.md §4;
        issue 32 point 7): its ``dir-source`` entries are the votes it counted, its signatures who
        signed. When the newest served is older than the round before the look, that round published
        nothing: every authority is recorded ``no-consensus`` for it. An authority whose vote the
        consensus did not count is ``down`` for that round; one that voted but did not sign,
        ``not-signing``."""
        fetch = getattr(self.actuator, "fetch_round", None)
        if fetch is None:
            return
        interval = dt.timedelta(seconds=self.spec.cadence.interval_s)
        expected = self.spec.cadence.va_at_or_after(at) - interval
        try:
            seen = fetch(None)
        except Exception:  # an unreadable round is a round without a consensus seen
            seen = None
        if seen is not None:
            rows = []
            for a in self.spec.authorities:
                voted, signed = a in seen.voters, a in seen.signers
                rows.append((a, voted, signed, "ok" if voted and signed else "not-signing" if voted else "down"))
            self.journal.authority_health_seen(seen.valid_after, rows)
        if seen is None or seen.valid_after < expected:
            self.journal.authority_health_seen(expected, [(a, False, False, "no-consensus")
                                                          for a in self.spec.authorities])

    def _evaluate(self, at: dt.datetime, key: str, name: str, now: dt.datetime) -> None:
        self._authority_health(at)
        phase = self._phase(at - self.spec.hour)
        looks = self._look(phase, at) if phase.startswith("stage:") else []
        self._machine(key, name, at, now, Evaluate(at, tuple(v for v, _ in looks)),
                      extra=lambda c: self._journal_looks(c, looks, phase, at))
        self._remember(looks, phase)

    def _decide(self, at: dt.datetime, key: str, name: str, now: dt.datetime) -> None:
        short: tuple[str, ...] = ()
        if self.status.state == BASELINE:
            short = self.analysis.baseline_short()
        elif self.status.state == MEASURING:
            # the decision rests on the judge's look at the decision time: the hourly evaluate
            # due at the same instant made it (it sorts first); when it did not, look now
            phase = self._phase(at - self.spec.hour)
            judged = self.journal.judged_at(at)
            # rollout.md §1.6: a switchback cycle's end is judged period against period over every period so far
            cycle_end = self.spec.cycle_end(self.status.stage)
            if cycle_end or (phase.startswith("stage:") and any(c.name not in judged for c in self.spec.criteria)):
                looks = (self.analysis.switchback_look(self.status.stage, at) if cycle_end
                         else [lk for lk in self._look(phase, at) if lk[0].criterion not in judged])
                look_phase = SWITCHBACK_PHASE if cycle_end else phase
                look_key = f"{key}:look"
                if not self.journal.processed(look_key):
                    self._machine(look_key, f"{name}:look", at, now, Evaluate(at, tuple(v for v, _ in looks)),
                                  extra=lambda c: self._journal_looks(c, looks, look_phase, at))
                    self._remember(looks, look_phase)
                if self.status.state != MEASURING:
                    with self.journal.write() as c:  # the look rolled back or paused: nothing to decide
                        self.journal.record(c, event_key=key, trigger=name, due=at, now=now, before=self.status,
                                            after=self.status)
                    return
        looked = self.journal.verdicts_at(at) if self.status.state == MEASURING else ()
        ahead = self._ahead()
        out = step(self.spec, self.status, DecisionDue(at, self.status.stage, short, looked, ahead))
        # the anonymity verdicts the entry of the next stage rested on are journaled like any look
        nxt = out.judged_ahead
        self._commit(key, name, at, now, out, extra=(lambda c: self.analysis.journal_entry(c, ahead, nxt, at))
                     if nxt else None)

    def _ahead(self) -> tuple[MachineVerdict, ...]:
        """The anonymity criteria of the stage a decision now would enter, judged on its predictions."""
        nxt = self.status.stage + 1
        if not self.spec.anonymity or nxt > self.spec.last_stage:
            return ()
        if self.anonymity is None:
            return tuple(MachineVerdict(c.name, ERROR, detail="no attack predictions were loaded for the run")
                         for c in self.spec.anonymity)
        return self.anonymity.verdicts(self.spec, nxt)


def as_collection(collected, metric: str, t0: dt.datetime, t1: dt.datetime, origin: str) -> Collection:
    """A source's answer as a Collection (a plain array or relay -> array from a simple source)."""
    if isinstance(collected, Collection):
        return collected
    if isinstance(collected, Mapping):
        return sources.by_relay(metric, origin, collected, t0, t1)
    return sources.plain(metric, origin, collected, t0, t1)


def _params_text(params: dict) -> str:
    return ConsensusParams(params).format() or "(none of the plan's keys)"


def _plan_part(params: dict, spec: RolloutSpec) -> dict:
    return {k: v for k, v in params.items() if k in spec.parameters}


def _us(t: dt.datetime) -> int:
    from kistexp.metrics.series import to_us

    return to_us(t)
