"""Dry runs: the whole plan on the virtual clock (rollout.md §5).

Embedded fake authorities vote on virtual time (``kistexp.rollout.rehearsal``), the engine acts
on them through the same actuator, intents and document checks as a live ``--authorities fake``
run, and metric samples are drawn per collection hour from the population's predicted distributions
(the ``predictions`` table, written by ``kistexp simulate``) at the catalogue's sample rates:
each sample comes from the distribution of the value its relay or client holds then, so while a
consensus propagates the samples mix old and new values (§2.3 adoption curves). Draws are seeded
per (seed, metric, window), so event order cannot change them and reruns are byte-identical.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import numpy as np

from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.durations import parse_duration
from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.jsonout import to_json
from kistexp.metrics import catalogue
from kistexp.metrics.store import MetricStore
from kistexp.plan.model import Plan
from kistexp.rollout.anonymity import load_predicted_anonymity
from kistexp.rollout.assembly import assemble
from kistexp.rollout.engine import Engine, metric_source_of
from kistexp.rollout.journal import (
    LOCK_NAME,
    REHEARSAL_MODE,
    Journal,
    JournalInUseError,
    LockedError,
    RunLock,
    desired_params,
)
from kistexp.rollout.rehearsal import EmbeddedAuthorities, rehearsal_clock, rehearse
from kistexp.rollout.rollback import plan_rollback
from kistexp.rollout.sources import PREDICTED
from kistexp.rollout.spec import RolloutSpec, Values, spec_from_plan
from kistexp.rollout.state import COMMANDS, PAUSED, ROLLBACK_KINDS

# the catalogue's sample model, the one the linter checks plans with
RELAY_INSTANCES = catalogue.RELAY_INSTANCES
ONIONPERF_INSTANCES = catalogue.ONIONPERF_INSTANCES


class InjectionError(KistexpError):
    """A malformed ``--inject`` option."""


# --- injections (§5) ---------------------------------------------------------------------------

@attrs.frozen
class MetricShift:
    stage: int  # 0 = baseline
    metric: str
    relative: float | None
    absolute: float | None

    def apply(self, values: np.ndarray) -> np.ndarray:
        # every catalogue metric is a time, a size, a share or a count: a shift never takes one below 0
        shifted = values * (1 + self.relative) if self.relative is not None else values + self.absolute
        return np.maximum(shifted, 0.0)


@attrs.frozen
class AuthorityFault:
    authority: str
    kind: str  # down | stale
    at: dt.datetime


@attrs.frozen
class MetricGap:
    source: str
    start: dt.datetime
    end: dt.datetime


Injection = MetricShift | AuthorityFault | MetricGap
_WHEN = re.compile(r"^(?:day([0-9]{1,9})|stage([0-9]{1,9}))(?:\+([0-9]{1,9})h)?(?:([0-9]{1,9})m)?$")
# A moment of a rehearsal lies within ten years of the plan's baseline start: day 10^9 overflowed
# the calendar, 10^20 hours a C int, and ISO times at years 1 and 9999 left no room for a gap's end.
_WHEN_SPAN = dt.timedelta(days=3653)


def _when(text: str, spec: RolloutSpec, option: str, flag: str = "--inject") -> dt.datetime:
    m = _WHEN.match(text)
    try:
        if m:
            day, stage, hours, minutes = m.groups()
            if day is not None:
                if int(day) < 1:
                    raise InjectionError(f"{flag} {option!r}: days count from day1")
                base = (spec.baseline_start
                        + (int(day) - 1) * dt.timedelta(days=1) * (spec.hour / dt.timedelta(hours=1)))
            else:
                n = int(stage)
                if not 1 <= n <= spec.n_stages:
                    raise InjectionError(f"{flag} {option!r}: the plan has stages 1..{spec.n_stages}")
                base = spec.start + sum((s.duration for s in spec.stages[: n - 1]), dt.timedelta())
            t = base + (int(hours or 0) * spec.hour) + int(minutes or 0) * spec.hour / 60
        else:
            try:
                t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise InjectionError(f"{flag} {option!r}: when {text!r} is not dayD[+Hh], stageN[+Hh] or "
                                     "ISO UTC") from None
            t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
        far = abs(t - spec.baseline_start) > _WHEN_SPAN
    except OverflowError:
        far = True
    if far:
        raise InjectionError(f"{flag} {option!r}: {text!r} is more than ten years from the plan's baseline start")
    return t


def _span(text: str, spec: RolloutSpec, option: str) -> tuple[dt.datetime, dt.datetime]:
    if ".." in text:
        a, b = text.split("..", 1)
        return _when(a, spec, option), _when(b, spec, option)
    if "+for=" in text:
        a, dur = text.split("+for=", 1)
        start = _when(a, spec, option)
        try:
            length = parse_duration(dur)
        except ValueError as exc:
            raise InjectionError(f"--inject {option!r}: {exc}") from None
        return start, start + length * (spec.hour / dt.timedelta(hours=1))
    start = _when(text, spec, option)
    return start, start + spec.hour


def parse_injection(option: str, spec: RolloutSpec) -> Injection:
    target, sep, effect = option.partition(":")
    kind, eq, name = target.partition("=")
    if not sep or not eq or not name:
        raise InjectionError(f"--inject {option!r}: expected stage=N:METRIC=+X%, authority=NAME:down@dayD, "
                             "authority=NAME:stale@dayD or metrics=SOURCE:gap@dayD+Hh")
    if kind == "stage":
        stage = 0 if name == "baseline" else int(name) if name.isascii() and name.isdecimal() and len(name) < 4 else -1
        if not 0 <= stage <= spec.n_stages:
            raise InjectionError(f"--inject {option!r}: stage must be baseline or 1..{spec.n_stages}")
        m = re.match(r"^([a-z0-9_]+)=([+-][0-9]{1,15}(?:\.[0-9]{1,15})?)(%|abs)$", effect)
        if not m:
            raise InjectionError(f"--inject {option!r}: effect must be METRIC=+X% or METRIC=+Xabs (at most 15 "
                                 "digits)")
        metric, amount, unit = m.groups()
        if catalogue.get(metric) is None:
            raise InjectionError(f"--inject {option!r}: unknown metric {metric!r} "
                                 f"(one of {', '.join(catalogue.names())})")
        value = float(amount)
        if unit == "%" and not -100 < value <= 10_000:
            # -200 % made every sample negative, a 400-digit + an infinite one
            raise InjectionError(f"--inject {option!r}: a relative shift is above -100 % and at most +10000 %")
        return MetricShift(stage, metric, value / 100 if unit == "%" else None, value if unit == "abs" else None)
    if kind == "authority":
        if name not in spec.authorities:
            raise InjectionError(f"--inject {option!r}: no authority {name!r} (one of {', '.join(spec.authorities)})")
        what, _, when = effect.partition("@")
        if what not in ("down", "stale"):
            raise InjectionError(f"--inject {option!r}: authority effects are down and stale")
        return AuthorityFault(name, what, _when(when, spec, option) if when else spec.baseline_start)
    if kind == "metrics":
        sources = sorted({metric_source_of(c.metric) for c in spec.criteria})
        if name not in sources:
            raise InjectionError(f"--inject {option!r}: no metric source {name!r} in this plan "
                                 f"(one of {', '.join(sources)})")
        what, _, when = effect.partition("@")
        if what != "gap" or not when:
            raise InjectionError(f"--inject {option!r}: metrics effect is gap@WHEN")
        start, end = _span(when, spec, option)
        return MetricGap(name, start, end)
    raise InjectionError(f"--inject {option!r}: target must be stage=, authority= or metrics=")


# --- scripted operator commands (§5: ``--command 'day9+2h:pause'``) ---------------------------

@attrs.frozen
class ScriptedCommand:
    """An operator command a rehearsal issues at ``at``, as ``kistexp pause|resume|... DIR`` would."""
    at: dt.datetime
    kind: str
    args: tuple[tuple[str, str | bool], ...]
    text: str

    def as_args(self) -> dict:
        return dict(self.args)


_COMMAND_FLAGS = {"pause": ("freeze",), "promote": ("full", "force"), "undo": ("fast",)}


def parse_command(option: str, spec: RolloutSpec) -> ScriptedCommand:
    """``WHEN:COMMAND[=ARG,...]``: WHEN as for ``--inject``; COMMAND one of pause, resume, promote,
    abort, retry, undo; ARG a flag of that command (pause=freeze, promote=full,force, undo=fast)
    or its value (abort=KIND, undo=STAGE|baseline)."""
    when, sep, command = option.rpartition(":")  # ISO times hold colons; a command never does
    if not sep or not when:
        raise InjectionError(f"--command {option!r}: expected WHEN:COMMAND, e.g. day9+2h:pause")
    kind, _, arg_text = command.partition("=")
    if kind not in COMMANDS:
        raise InjectionError(f"--command {option!r}: command must be one of {', '.join(COMMANDS)}")
    args: dict[str, str | bool] = {}
    for arg in filter(None, arg_text.split(",")):
        if arg in _COMMAND_FLAGS.get(kind, ()):
            args[arg] = True
        elif kind == "abort" and "kind" not in args and arg in (*ROLLBACK_KINDS, "baseline"):
            args["kind"] = arg
        elif kind == "undo" and "to_stage" not in args and (arg == "baseline" or arg.isdecimal() and arg.isascii()
                                                            and len(arg) < 4):
            args["to_stage"] = arg
        else:
            allowed = {"abort": "a rollback kind (" + ", ".join((*ROLLBACK_KINDS, "baseline")) + ")",
                       "undo": "a stage number, baseline or fast"}.get(kind)
            flags = _COMMAND_FLAGS.get(kind)
            what = allowed or (", ".join(flags) if flags else "no arguments")
            raise InjectionError(f"--command {option!r}: {kind} takes {what}, not {arg!r}")
    return ScriptedCommand(_when(when, spec, option, "--command"), kind, tuple(sorted(args.items())), option)


# --- predicted metrics --------------------------------------------------------------------------

class NoPredictions(KistexpError):
    pass


class ConsensusSource(Protocol):
    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[dict[str, int] | None, list[str]]: ...


class PredictedMetrics:
    """A ``MetricSource`` drawing samples from predicted quantile curves; ``consensuses`` says
    which parameters the consensus nodes held at each valid-after carried."""

    origin = PREDICTED

    def __init__(self, spec: RolloutSpec, curves: dict[tuple[str, str], np.ndarray], levels: np.ndarray,
                 consensuses: ConsensusSource, *, seed: int = 1, injections: Sequence[Injection] = ()) -> None:
        self.spec, self.curves, self.levels, self.actuator, self.seed = spec, curves, levels, consensuses, seed
        self.shifts = [i for i in injections if isinstance(i, MetricShift)]
        self.gaps = [i for i in injections if isinstance(i, MetricGap)]
        model = PropagationModel(schedule=spec.cadence.schedule())
        grid = np.linspace(0, 4 * model.interval_s, 2001)
        factor = spec.cadence.interval_s / model.interval_s
        self._adoption = {pop: (grid * factor, np.asarray(model.adoption(cls, grid)))
                          for pop, cls in (("relays", NodeClass.CACHE), ("clients", NodeClass.CLIENT))}
        self._consensus: dict[dt.datetime, tuple] = {}
        # the consensus each stage's values give by tor's rule (0 = baseline), asked at every collection
        self._expected = [spec.expected_consensus(spec.values_of(i)) for i in range(spec.n_stages + 1)]

    def _params_at(self, va: dt.datetime) -> tuple:
        if va not in self._consensus:
            params, _ = self.actuator.fetch_consensus(va)
            self._consensus[va] = tuple(sorted((params or {}).items())) if params is not None else None
        return self._consensus[va]

    def stage_of(self, params: tuple | None) -> int:
        """The plan stage whose expected consensus these params are (0 = baseline; unknown -> baseline)."""
        if params is None:
            return 0
        seen = dict(params)
        for i, want in enumerate(self._expected):
            if all(seen.get(k) == v for k, v in want.items()):
                return i
        return 0

    def _key(self, stage: int) -> str:
        if stage == 0:
            return "baseline"
        name = self.spec.stage(stage).name
        # `kistexp simulate` predicts a switchback's two arms, not each period (treatment-3 is "treatment")
        return name.rsplit("-", 1)[0] if self.spec.kind == "switchback" else name

    def _draw(self, stage: int, metric: str, u: np.ndarray, pick: np.ndarray) -> np.ndarray:
        curves = self.curves.get((self._key(stage), metric))
        if curves is None:
            curves = self.curves[("baseline", metric)]
        rows = curves[pick % curves.shape[0]]
        j = np.clip(np.searchsorted(self.levels, u), 1, self.levels.size - 1)
        lo, hi = self.levels[j - 1], self.levels[j]
        w = (u - lo) / np.where(hi > lo, hi - lo, 1.0)
        idx = np.arange(u.size)
        out = rows[idx, j - 1] * (1 - w) + rows[idx, j] * w
        for s in self.shifts:
            if s.stage == stage and s.metric == metric:
                out = s.apply(out)
        return out

    def collect(self, source: str, metric: str, t0: dt.datetime, t1: dt.datetime) -> np.ndarray | None:
        for g in self.gaps:
            if g.source == source and g.start < t1 and t0 < g.end:
                return None
        m = catalogue.get(metric)
        n = catalogue.samples_in(m, (t1 - t0) / self.spec.hour)  # one window = a plan hour
        # seeded by the window's place in the plan, so a rebased or rerun plan draws the same samples
        offset = (t0 - self.spec.baseline_start) / self.spec.hour
        digest = hashlib.sha256(f"{self.seed}:{metric}:{offset:.6f}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        offsets = (np.arange(n) + 0.5) / n * (t1 - t0).total_seconds()
        u = rng.random(n)
        pick = rng.integers(0, 1 << 30, n)
        coin = rng.random(n)
        # the consensus each sample's node holds: the newest, or the one before it while it propagates
        interval = dt.timedelta(seconds=self.spec.cadence.interval_s)
        va_now = self.spec.cadence.va_at_or_after(t0 + interval) - interval
        new, old = self.stage_of(self._params_at(va_now)), self.stage_of(self._params_at(va_now - interval))
        older = self.stage_of(self._params_at(va_now - 2 * interval))
        grid, curve = self._adoption[m.population]
        since = (t0 - va_now).total_seconds() + offsets
        on_new = coin < np.interp(since, grid, curve)
        # clients take up to two intervals: those not on the previous consensus yet hold the one before
        on_old = coin < np.interp(since + interval.total_seconds(), grid, curve)
        stages = np.where(on_new, new, np.where(on_old, old, older))
        out = np.empty(n)
        for s in np.unique(stages):
            mask = stages == s
            out[mask] = self._draw(int(s), metric, u[mask], pick[mask])
        return out


def load_curves(store: MetricStore, spec: RolloutSpec, plan_path: str) -> tuple[dict, np.ndarray]:
    curves: dict[tuple[str, str], list] = {}
    levels: list[float] | None = None
    for metric in sorted({c.metric for c in spec.criteria}):
        rows = store.load_predictions(metric=metric)
        by: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        for p in rows:
            if p.stage.startswith("transition:"):
                continue
            by.setdefault((p.stage, p.relay_class, p.network), []).append((p.quantile, p.value))
        for (stage, _cls, _net), pts in sorted(by.items()):
            pts.sort()
            lv = [q for q, _ in pts]
            if levels is None:
                levels = lv
            if lv != levels:
                raise NoPredictions(f"predictions for {metric} ({stage}) use other quantile levels than the rest")
            curves.setdefault((stage, metric), []).append([v for _, v in pts])
        if ("baseline", metric) not in curves:
            raise NoPredictions(f"no predictions of {metric} for the baseline in the experiment directory; "
                                f"make them with: kistexp simulate {plan_path} --dir EXP")
    return {k: np.asarray(v) for k, v in curves.items()}, np.asarray(levels)


# --- the dry run ------------------------------------------------------------------------------------

@attrs.frozen
class DryRunResult:
    plan: str
    final_state: str
    status: str
    decisions: tuple[dict, ...]
    transitions: tuple[dict, ...]
    consensus_changes: tuple[dict, ...]
    rollbacks: tuple[dict, ...]
    verdict_counts: dict
    injections: tuple[str, ...]
    journal: str
    wall_s: float


def initial_configs(spec: RolloutSpec) -> dict[str, dict[str, int]]:
    base = desired_params(spec.baseline_values)
    others = spec.others_vote()
    return {a: (base if a in spec.participating else others) for a in spec.authorities}


def dry_run(plan: Plan, exp: Path | None = None, *, injections: Sequence[str] = (), seed: int = 1,
            predictions_from: Path | None = None, approve_gates: bool = True,
            progress: Callable[[float, str], None] | None = None, commands: Sequence[str] = ()) -> DryRunResult:
    """Rehearse ``plan``; manual gates are approved (a journaled ``promote``) unless ``approve_gates``
    is False, in which case the rehearsal stops at the first gate. ``progress(fraction, what)`` is told
    how far through the plan's time the rehearsal is, after each engine step."""
    import time

    started = time.monotonic()
    spec = spec_from_plan(plan)
    parsed = [parse_injection(i, spec) for i in injections]
    scripted = sorted((parse_command(c, spec) for c in commands), key=lambda c: c.at)
    tmp = None
    if exp is None:
        tmp = tempfile.TemporaryDirectory(prefix="kistexp-dry-run-")
        exp = Path(tmp.name) / "exp"
    try:
        meta = rehearsal_meta(spec, PREDICTED, injections=tuple(injections), commands=tuple(c.text for c in scripted))
        with ExperimentDir.open_or_create(exp) as expdir, claim_for_rehearsal(expdir, meta) as journal:
            # the claim first: another run's plan.toml is never rewritten
            if Path(plan.path).is_file() and Path(plan.path).resolve() != expdir.plan_path.resolve():
                expdir.save_plan(plan.path)  # status, history and rollback --dry-run read the plan from here
            if predictions_from:
                with ExperimentDir.open(predictions_from) as source:
                    curves, levels = load_curves(MetricStore(source.db), spec, plan.path)
                    anonymity = load_predicted_anonymity(source.db, spec, plan.path, str(predictions_from))
            else:
                curves, levels = load_curves(MetricStore(expdir.db), spec, plan.path)
                anonymity = load_predicted_anonymity(expdir.db, spec, plan.path, str(exp))
            journal.reset_for_rehearsal(**meta)
            clock = rehearsal_clock(spec)
            planned = spec.start + sum((s.duration for s in spec.stages), dt.timedelta()) - spec.baseline_start
            end = spec.start + 3 * sum((s.duration for s in spec.stages), dt.timedelta())
            faults = tuple((f.authority, f.kind, f.at) for f in parsed if isinstance(f, AuthorityFault))
            with EmbeddedAuthorities(spec, clock, initial_configs(spec), end, faults) as net:
                metrics = PredictedMetrics(spec, curves, levels, net.history, seed=seed, injections=parsed)
                engine = assemble(spec, journal, net.actuator, metrics, clock,
                                  experiment_id=f"dry-run:{plan.name}", anonymity=anonymity)

                def waits_for_people(eng: Engine) -> bool:
                    # a pause only an operator can lift ends the rehearsal (it shows where the run would
                    # wait), unless a scripted command is still to come: it may be the one that lifts it
                    if any(c.at > clock.now() for c in scripted):
                        return False
                    return eng.status.state == PAUSED and (bool(eng.status.reasons - {"gate"})
                                                             or not approve_gates)

                rehearse(engine, journal, clock, until=end, who="dry-run (gate approved)",
                         approve_gates=approve_gates, progress=progress, span=planned, stop=waits_for_people,
                         commands=[(c.at, c.kind, c.as_args(), f"dry-run --command {c.text}") for c in scripted])
            return summarize(spec, journal, engine, tuple(injections), str(expdir.db_path),
                             time.monotonic() - started)
    finally:
        if tmp is not None:
            tmp.cleanup()


def rehearsal_meta(spec: RolloutSpec, metrics: str = PREDICTED, *, injections: tuple[str, ...] = (),
                   commands: tuple[str, ...] = ()) -> dict[str, str]:
    """The journal meta of a rehearsal (a dry run; a replay with ``metrics`` RECORDED). The ``--inject``
    and ``--command`` options are kept as given (JSON lists), so the report can say which faults and
    commands were scripted."""
    return {"mode": REHEARSAL_MODE, "experiment_id": f"dry-run:{spec.plan_name}", "metrics": metrics,
            "cadence": json.dumps(attrs.asdict(spec.cadence)), "start": spec.start.isoformat(),
            "plan_canon_sha256": spec.digest(), "injections": json.dumps(list(injections)),
            "commands": json.dumps(list(commands))}


def _start_fresh(journal: Journal, spec: RolloutSpec, metrics: str = PREDICTED, *,
                 injections: tuple[str, ...] = (), commands: tuple[str, ...] = ()) -> None:
    """A rehearsal rewrites its journal each time (its rows are a rehearsal, not a record): emptied and its
    meta set (``rehearsal_meta``); a journal that is not the rehearsal's own is refused, never emptied."""
    journal.reset_for_rehearsal(**rehearsal_meta(spec, metrics, injections=injections, commands=commands))


@contextlib.contextmanager
def claim_for_rehearsal(expdir: ExperimentDir, meta: dict[str, str]) -> Iterator[Journal]:
    """The journal of ``expdir`` for a rehearsal with ``meta``, once it is known to be the rehearsal's to
    rewrite: the directory's run lock is taken for the rehearsal's length (a live run going on there, or
    another rehearsal, is refused, and none can start meanwhile), and a journal of a live run, of another
    plan or of the other kind of rehearsal is refused (``Journal.refuse_foreign``), before anything in the
    directory is written. A rehearsal's own earlier journal, or a directory of predictions only, is taken."""
    lock = RunLock(expdir.path)
    try:
        lock.acquire()
    except LockedError:
        raise JournalInUseError(f"{expdir.path}: a run holds its {LOCK_NAME} now; a rehearsal never writes "
                                "beside it: pass another --dir") from None
    try:
        journal = Journal(expdir.db_path, durable=False)
        try:
            journal.refuse_foreign(**meta)
            yield journal
        finally:
            journal.close()
    finally:
        lock.release()


def summarize(spec: RolloutSpec, journal: Journal, engine: Engine, injections: tuple[str, ...], where: str,
              wall_s: float) -> DryRunResult:
    decisions = tuple(d for d in journal.decisions() if d["decision"] not in ("hold",))
    transitions = tuple(journal.transitions())
    changes, last = [], object()
    for c in journal.consensuses():
        if c["params"] != last:
            changes.append(c)
            last = c["params"]
    rollbacks = []
    for d in journal.decisions():
        if not d["decision"].startswith("rollback:"):
            continue
        kind = d["decision"].split(":", 1)[1]
        t = next((x for x in transitions if x["valid_after"] == d["valid_after"] and x["kind"] == "rollback"), None)
        if t is None:
            continue  # a hold that changed nothing on the network (a switchback's hold on the treatment does)
        prev = [x for x in transitions if x["seq"] < t["seq"]]
        current: Values = tuple(prev[-1]["targets"].items()) if prev else spec.baseline_values
        stage = prev[-1]["stage"] if prev else 0
        rp = plan_rollback(spec, kind, current, stage, d["at"])
        rollbacks.append({"at": d["at"], "cause": d["message"], **to_json(rp),
                          "relays_back_after_s": (rp.relays_99 - d["at"]).total_seconds(),
                          "clients_back_after_s": (rp.clients_99 - d["at"]).total_seconds()})
    counts: dict[str, dict[str, int]] = {}
    for v in journal.verdicts():
        counts.setdefault(v["criterion"], {}).setdefault(v["outcome"], 0)
        counts[v["criterion"]][v["outcome"]] += 1
    return DryRunResult(plan=spec.plan_name, final_state=engine.status.state, status=engine.status.describe(),
                        decisions=decisions, transitions=transitions, consensus_changes=tuple(changes),
                        rollbacks=tuple(rollbacks), verdict_counts=counts, injections=injections, journal=where,
                        wall_s=round(wall_s, 2))
