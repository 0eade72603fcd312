"""Live runs and the read-only views of an experiment's journal (rollout.md §3.4, §3.7, §3.8).

``open_run`` takes the lock, checks the experiment id and the plan (raw and canonical hashes;
a changed plan is refused, saying what changed, until acknowledged) and rebuilds the spec the run
started with. ``status``/``history``/``rollback_preview`` only read; control commands queue a row.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import attrs

from kistexp.clock import Clock
from kistexp.expdir import DB_NAME, ExperimentDir
from kistexp.jsonout import to_json
from kistexp.plan.loader import load_plan
from kistexp.plan.model import Plan
from kistexp.rollout.journal import Journal, JournalReader, RunLock
from kistexp.rollout.journal.fit import plan_canon, status_fits, stored_spec
from kistexp.rollout.machine import initial_status, step
from kistexp.rollout.rollback import plan_rollback
from kistexp.rollout.sources import MeasuredMetrics
from kistexp.rollout.spec import Cadence, RolloutError, RolloutSpec, json_value, spec_from_plan
from kistexp.rollout.state import COMMANDS, REMOVE_PARAM, REVERT_DEFAULT, ROLLBACK_KINDS, STEP_BACK, Command, Status


class NoRolloutError(RolloutError):
    """The experiment directory's journal has no rollout laid on the clock yet (predictions only)."""


def plan_hashes(plan_path: Path) -> tuple[str, str, dict]:
    """(sha256 of the bytes, sha256 of the canonical parse, the canonical parse)."""
    raw = Path(plan_path).read_bytes()
    canon = attrs.asdict(load_plan(plan_path), value_serializer=json_value)
    canon.pop("path", None)
    text = json.dumps(canon, sort_keys=True)
    # the JSON form (lists, not tuples) is what the journal keeps and diffs against
    return hashlib.sha256(raw).hexdigest(), hashlib.sha256(text.encode()).hexdigest(), json.loads(text)


def plan_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """What changed between two canonical plans, key by key."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        where = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += plan_diff(a, b, where + ".")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                if isinstance(x, dict) and isinstance(y, dict):
                    out += plan_diff(x, y, f"{where}[{i}].")
                elif x != y:
                    out.append(f"{where}[{i}]: {x!r} -> {y!r}")
        elif a != b:
            out.append(f"{where}: {a!r} -> {b!r}")
    return out


@attrs.frozen
class RunSetup:
    exp: ExperimentDir
    journal: Journal
    lock: RunLock | None
    spec: RolloutSpec
    plan: Plan
    mode: str


def _cadence_json(c: Cadence) -> str:
    return json.dumps(attrs.asdict(c))


def open_run(plan_path: Path, exp_path: Path, mode: str, cadence: Cadence, clock: Clock, *,
             accept_plan_change: bool = False, lock: bool = True, metrics: str = "measured") -> RunSetup:
    """Create or resume the experiment at ``exp_path`` for a live run of ``plan_path``."""
    exp_path = Path(exp_path)
    fresh = not (exp_path / DB_NAME).is_file()
    exp = ExperimentDir.create(exp_path, plan_path) if fresh else ExperimentDir.open(exp_path)
    journal = Journal(exp.db_path, durable=True)
    run_lock = None
    if lock:
        run_lock = RunLock(exp.path)
        try:
            run_lock.acquire(journal.owner_text())
        except BaseException:
            journal.close()
            raise
    try:
        if lock:
            journal.check_owner(clock.now())
        spec = _check_plan(plan_path, exp_path, mode, cadence, clock, journal, accept_plan_change, metrics)
    except BaseException:
        journal.close()  # a refusal leaves nothing held: no lock, no open database
        if run_lock is not None:
            run_lock.release()
        raise
    if Path(plan_path).resolve() != exp.plan_path.resolve():
        exp.save_plan(plan_path)  # the checked (or acknowledged) plan is the plan of record
    return RunSetup(exp, journal, run_lock, spec, load_plan(plan_path), mode)


def _check_plan(plan_path: Path, exp_path: Path, mode: str, cadence: Cadence, clock: Clock, journal: Journal,
                accept_plan_change: bool, metrics: str = "measured") -> RolloutSpec:
    raw, canon_sha, canon = plan_hashes(plan_path)
    plan = load_plan(plan_path)
    experiment_id = journal.meta("experiment_id")
    if experiment_id is None:
        start = clock.now() if mode != "instructions" else None
        if start is not None and metrics == "measured":
            # a measured baseline is measured: it starts now, and stage 1 after it (predictions can
            # be drawn for a baseline in the past; measurements cannot)
            first = spec_from_plan(plan, cadence, start=start)
            start += first.start - first.baseline_start
        spec = spec_from_plan(plan, cadence, start=start)
        journal.set_meta(experiment_id=f"{plan.name}:{clock.now():%Y%m%dT%H%M%S}", plan_path=str(plan_path),
                         plan_sha256=raw, plan_canon_sha256=canon_sha, plan_canon=json.dumps(canon, sort_keys=True),
                         mode=mode, cadence=_cadence_json(cadence), start=spec.start.isoformat(), metrics=metrics)
    else:
        stored = stored_spec(plan, _meta(journal, "cadence", "start"), journal.path)
        if journal.meta("mode") == "dry-run":
            raise RolloutError(f"{exp_path}: holds a dry run's journal; use another directory for a live run")
        old_name = plan_canon(_meta(journal, "plan_canon"), journal.path).get("name")
        if old_name != plan.name:
            raise RolloutError(f"{exp_path}: the journal is experiment {old_name!r}, not {plan.name!r}")
        if journal.meta("mode") != mode:
            raise RolloutError(f"{exp_path}: the run started with --authorities {journal.meta('mode')}, "
                               f"not {mode}")
        if (journal.meta("metrics") or "predicted") != metrics:
            # a run's verdicts rest on one kind of samples: measured and predicted ones never mix
            raise RolloutError(f"{exp_path}: the run started with --metrics {journal.meta('metrics') or 'predicted'}, "
                               f"not {metrics}")
        if journal.meta("plan_canon_sha256") != canon_sha:
            diff = plan_diff(plan_canon(_meta(journal, "plan_canon"), journal.path), canon)
            if not accept_plan_change:
                raise RolloutError(f"{plan_path}: changed since the run started ({'; '.join(diff[:5])}); "
                                   "rerun with --accept-plan-change to continue with it")
            journal.add_plan_ack(journal.meta("plan_canon_sha256"), canon_sha, "\n".join(diff), getpass.getuser(),
                                 clock.now())
            journal.set_meta(plan_canon_sha256=canon_sha, plan_canon=json.dumps(canon, sort_keys=True),
                             plan_sha256=raw)
        spec = stored
    return spec


def _meta(journal: Journal, *keys: str) -> dict[str, str | None]:
    return {k: journal.meta(k) for k in keys}


def plan_watch(plan_path: Path, journal: Journal):
    """Before each actuation: the plan's canonical hash against the journal's (§3.8)."""
    def check() -> str:
        try:
            _, canon_sha, canon = plan_hashes(plan_path)
        except Exception as exc:  # an unreadable plan mid-run is a change too
            return f"{plan_path} cannot be read: {exc}"
        if canon_sha == journal.meta("plan_canon_sha256"):
            return ""
        return "; ".join(plan_diff(plan_canon(_meta(journal, "plan_canon"), journal.path), canon)[:5]) or "plan changed"
    return check


# --- read-only views -----------------------------------------------------------------------------

def load_spec(exp_path: Path) -> tuple[RolloutSpec, Status, dict]:
    """The spec the run was laid on (its plan copy, cadence and start), its status and its meta. A
    damaged meta or status row is refused naming the row (``JournalDamageError``)."""
    with JournalReader.of_experiment(exp_path) as reader:
        meta = reader.meta().as_dict()
        if "cadence" not in meta:
            raise NoRolloutError(f"{exp_path}: no rollout has run here")
        plan_path = Path(exp_path) / "plan.toml"
        spec = stored_spec(load_plan(plan_path), meta, reader.path)
        row = reader.last_status()
        return spec, initial_status(spec) if row is None else status_fits(row, spec, reader.path, plan_path), meta


def status_view(exp_path: Path) -> dict:
    spec, st, meta = load_spec(exp_path)
    stage = "baseline" if st.stage == 0 else f"{st.stage} ({spec.stage(st.stage).name})"
    return {"experiment": meta.get("experiment_id"), "mode": meta.get("mode"),
            # journals from before measured runs drew every sample from predictions
            "metrics": meta.get("metrics") or "predicted", "state": st.state,
            "stage": stage, "reasons": sorted(st.reasons), "values": dict(st.values),
            "awaiting_consensus": st.target_va, "stage_valid_after": st.stage_va, "decision_at": st.decision_at,
            "extensions": st.extensions, "rollback_kind": st.rollback_kind or None,
            "criteria": {n: attrs.asdict(c) for n, c in st.counters}, "summary": st.describe()}


def history_view(exp_path: Path) -> dict:
    with JournalReader.of_experiment(exp_path) as reader, reader.snapshot():
        decisions = [{"at": d.at, "decision": d.decision, "stage": d.stage, "valid_after": d.valid_after,
                      "message": d.message} for d in reader.decisions()]
        commands = [{"kind": c.kind, "args": dict(c.args), "user": c.user, "at": c.queued, "state": c.state,
                     "result": c.result} for c in reader.commands()]
    return {"decisions": decisions, "commands": commands}


def rollback_preview(exp_path: Path, now: dt.datetime) -> list[dict]:
    """Each rollback kind, now, without acting: targets, consensus, minimal set, ETAs (§5)."""
    spec, st, _ = load_spec(exp_path)
    return [to_json(plan_rollback(spec, k, st.values, st.stage, now))
            for k in (STEP_BACK, REVERT_DEFAULT, REMOVE_PARAM, "hold")]


def queue_command(exp_path: Path, kind: str, args: dict, now: dt.datetime, user: str = "") -> tuple[int, str]:
    """Check the command against the status (a refusal is an error), then queue it for the engine."""
    if kind not in COMMANDS:
        raise RolloutError(f"unknown command {kind!r}")
    if kind == "abort" and args.get("kind") and args["kind"] not in ROLLBACK_KINDS + ("baseline",):
        raise RolloutError(f"abort --kind {args['kind']!r}: one of step-back, revert-default, remove-param, hold, "
                           "baseline")
    spec, st, _ = load_spec(exp_path)
    trial = step(spec, st, Command(now, kind, tuple(sorted((k, str(v)) for k, v in args.items() if v)), user))
    if trial.refused:
        raise RolloutError(f"{exp_path}: {trial.message}")
    journal = Journal(Path(exp_path) / DB_NAME)
    try:
        cid = journal.queue_command(kind, args, user or getpass.getuser(), now)
    finally:
        journal.close()
    return cid, trial.message


# --- live runs -------------------------------------------------------------------------------------

class _PublishedHistory:
    """The consensus each valid-after carried, as the in-process fake authorities published it
    (what the predicted-metric source needs to know which value nodes held). A restarted run's
    authorities remember only what they published since; earlier rounds come from the journal's
    ``consensus_seen`` rows, which the run wrote as it saw them."""

    def __init__(self, net, journal: Journal) -> None:
        self.net, self.journal = net, journal

    def fetch_consensus(self, valid_after: dt.datetime):
        t = valid_after.timestamp()
        best = None
        for a in self.net.authorities.values():
            for pub in list(a.history):
                if pub.valid_after <= t and (best is None or pub.valid_after > best.valid_after):
                    best = pub
        row = self.journal.consensus_at_or_before(valid_after)
        if row is not None and (best is None or row[0].timestamp() > best.valid_after):
            return row[1], []
        return (None if best is None else dict(best.params)), []


# The embedded authorities share the run's process: 9 authorities' 72 vote uploads and 72 signature
# fetches take turns for the interpreter with the engine's judging and metric writes. At 300 s of
# 3600 scaled (0.33 s for a 4 s interval) a busy second core or a long judge step left most rounds
# without the majority of votes; a second each (tor's own floor is 2 s, MIN_VOTE_SECONDS) keeps every
# round publishing then. tor's Interval/4 rule still applies (1 s at 4 s, 0.5 s at 2 s).
EMBEDDED_MIN_DELAY_S = 1.0


def embedded_delay_s(interval_s: int) -> float:
    """The vote and distribution delay of the embedded fake authorities at ``interval_s`` real
    seconds per hour: the live 300 s scaled (``AcceleratedSchedule.scaled``'s default), but at least
    EMBEDDED_MIN_DELAY_S."""
    from kistexp.dirauth.schedule import AcceleratedSchedule

    return max(EMBEDDED_MIN_DELAY_S, AcceleratedSchedule.scaled(interval_s).vote_delay_s)


def live_run(plan_path: Path, exp_path: Path, mode: str, *, interval_s: int = 10, accept_plan_change: bool = False,
             predictions_from: Path | None = None, argv: list[str] | None = None, timeout_s: float | None = None,
             hook=None, key_bits: tuple[int, int] = (3072, 2048), localnet: Path | None = None,
             clock: Clock | None = None, metrics: str = "measured", sources: Sequence[str] = (),
             measure_period_s: float | None = None, certs: Path | None = None) -> Status:
    """``kistexp run``: drive the plan in real time against embedded fake authorities (accelerated:
    one plan hour per voting interval), a local tor network (``local``: ``localnet`` or one made in
    EXP/localnet; kistexp.rollout.actuator_local) or, with ``instructions``, against the real network
    by writing each operator's instructions and watching public votes and consensuses.

    Metrics are measured (``metrics="measured"``): in a local network that the run makes, by its own
    measurement clients, relays' MetricsPorts and /proc; otherwise by the instruments of ``sources``
    (``kistexp.metrics.instruments.parse_source``). ``metrics="predicted"`` draws them from the
    population's predictions instead, as a dry run does; that choice is journaled and shown."""
    from kistexp.clock import RealClock
    from kistexp.dirauth.schedule import AcceleratedSchedule
    from kistexp.directory import DirectoryClient
    from kistexp.metrics.store import MetricStore
    from kistexp.rollout.actuators import FakeAuthoritiesActuator, InstructionsActuator
    from kistexp.rollout.anonymity import load_predicted_anonymity
    from kistexp.rollout.assembly import METRICS_MODES, assemble, measured_source, require_measured
    from kistexp.rollout.drivers import LiveDriver
    from kistexp.rollout.dryrun import PredictedMetrics, initial_configs, load_curves
    from kistexp.rollout.exposure import ArchiveView, ConsensusExposureProbe
    from kistexp.rollout.spec import CONSENSUS_ROUNDS_INSTRUCTIONS, LIVE_CADENCE

    if metrics not in METRICS_MODES:
        raise RolloutError(f"--metrics {metrics!r}: one of {', '.join(METRICS_MODES)}")
    if predictions_from is not None and metrics != "predicted":
        raise RolloutError("--predictions is read only with --metrics predicted (a live run judges measurements "
                           "unless asked otherwise)")
    parsed, archives = _instruments(sources, certs) if metrics == "measured" else ([], [])
    if metrics == "measured" and mode != "local":
        # nothing to measure but what --source names: refused before anything starts
        require_measured([c.metric for c in load_plan(plan_path).criteria], parsed, str(plan_path))
    clock = clock or RealClock()
    local = None
    if mode == "fake":
        delay_s = embedded_delay_s(interval_s)
        cadence = Cadence.of(AcceleratedSchedule.scaled(interval_s, delay_s, delay_s))
    elif mode == "instructions":
        cadence = LIVE_CADENCE
    elif mode == "local":
        from kistexp.rollout.actuator_local import LocalTorRun

        # the network first: the run's clock starts once its consensus is out
        local = LocalTorRun.prepare(load_plan(plan_path), Path(exp_path), localnet, interval_s,
                                    measured=metrics == "measured")
        cadence = local.cadence
    else:
        raise RolloutError(f"--authorities {mode!r}: one of fake, local, instructions")
    try:
        setup = open_run(plan_path, exp_path, mode, cadence, clock, accept_plan_change=accept_plan_change,
                         metrics=metrics)
    except BaseException:
        if local is not None:
            local.close(refused=True)
        raise
    spec, journal = setup.spec, setup.journal
    net = None
    source = None
    view = None
    run_id = journal.begin_run(argv or [], clock.now())
    reason = "stopped"
    try:
        exposure = None
        if mode == "fake":
            from fake_authorities import FakeAuthorityNetwork

            state = setup.exp.path / "fake-authorities"
            fresh = not (state / "consensus-params.json").is_file()
            net = FakeAuthorityNetwork(count=len(spec.authorities), interval_s=interval_s, port=0,
                                       nicknames=list(spec.authorities), state_dir=state, key_bits=key_bits,
                                       vote_delay_s=delay_s, dist_delay_s=delay_s,
                                       initial_params=initial_configs(spec) if fresh else None).start()
            client = DirectoryClient(net.directory_authorities(), retries=1, timeout_s=max(1.0, interval_s / 4))
            actuator = FakeAuthoritiesActuator(net.operator_url, net.token, client, clock)
            history = _PublishedHistory(net, journal)
        elif local is not None:
            actuator = local.actuator(clock, journal)
            history = actuator.history
            if metrics == "measured":
                parsed = parsed + local.start_measuring(setup.exp.path, clock, period_s=measure_period_s)
                exposure = local.exposure_probe()
        else:
            client = DirectoryClient()
            actuator = InstructionsActuator(setup.exp.path / "outbox", spec.plan_name, spec.cadence, client, clock)
            spec = attrs.evolve(spec, consensus_rounds=CONSENSUS_ROUNDS_INSTRUCTIONS)
            history = actuator
        # attacks are measured on no network: the plan's anonymity criteria are judged from the predictions
        # (the experiment's, or --predictions'), at each stage's entry, whatever judges the metrics
        store = ExperimentDir.open(predictions_from) if predictions_from else setup.exp
        anonymity = load_predicted_anonymity(store.db, spec, str(plan_path), str(predictions_from or exp_path))
        if metrics == "predicted":
            curves, levels = load_curves(MetricStore(store.db), spec, str(plan_path))
            source = PredictedMetrics(spec, curves, levels, history)
        else:
            source = measured_source(setup.exp.db_path, parsed, clock, spec, f"{plan_path}",
                                     params_at=local.params_at if local is not None else None)
            if exposure is None:
                # which consensus nodes hold: a CollecTor-style archive when one is given, else the
                # run's own fetches from the authorities
                view = ArchiveView(archives, clock, MetricStore(sqlite3.connect(
                    setup.exp.db_path, timeout=5.0, check_same_thread=False))) if archives else None
                exposure = ConsensusExposureProbe(
                    view.consensus_at if view else (lambda at: journal.consensus_at_or_before(at)), spec.cadence)
        engine = assemble(spec, journal, actuator, source, clock, experiment_id=journal.meta("experiment_id"),
                          plan_check=plan_watch(Path(plan_path), journal), hook=hook, exposure=exposure,
                          anonymity=anonymity)
        LiveDriver(engine, clock, poll_s=max(0.2, min(2.0, cadence.interval_s / 10)),
                   heartbeat=journal.heartbeat).run(timeout_s)
        reason = engine.status.state
        return engine.status
    finally:
        journal.end_run(run_id, clock.now(), reason)
        if isinstance(source, MeasuredMetrics):
            source.close()
        if view is not None:
            view.close()
        if net is not None:
            net.stop()
        if local is not None:
            local.close()
        journal.close()
        if setup.lock is not None:
            setup.lock.release()


def _instruments(sources: Sequence[str], certs: Path | None = None) -> tuple[list, list]:
    """The instruments of ``--source`` options (each a one-line error when malformed), and apart from
    them the consensus archives (``consensus-archive=URL``), checked against ``certs``."""
    if not sources:
        return [], []
    from kistexp.dirauth.documents import load_key_certificates
    from kistexp.metrics.instruments import ConsensusArchivePoller, parse_source

    certificates = load_key_certificates(certs) if certs is not None else ()
    parsed = [parse_source(text, certificates=certificates) for text in sources]
    archives = [p for p in parsed if isinstance(p, ConsensusArchivePoller)]
    return [p for p in parsed if not isinstance(p, ConsensusArchivePoller)], archives
