"""The keys of every command's --json output, pinned (issue 36): scripts read them, so a change of how the
JSON is made (hand-written serialisers -> kistexp/jsonout.py) must not move, rename or drop one.

Each command runs through typer's CliRunner (or, for the run's event feed, the function ``kistexp run
--json-lines`` prints with) on small inputs. A document's shape is the set of its key paths: ``a.b`` for a
key in an object, ``a[].c`` for a key of a list's first element. Also pinned: the judge's record the journal
keeps per verdict, the held-consensus watch's lines, the measuring client's OnionPerf guard records and the
fake authorities' fault list (JSON written to files and served, not printed).

``sim experiment NAME --json`` runs through the CLI with its result given (a run would first compile the
simulator, minutes on a fresh machine); ``fidelity`` reads real tor's side back (``--real-from``) and runs
neither tor nor the simulator. Not run here (each takes minutes, real tor or a long-lived server; none of
them prints JSON that the serialisers of this issue make): a ``simulate`` run (its JSON is pinned with the
result given, and ``--stored`` on stored predictions), ``sweep`` (a run; ``--check`` is here), ``run``,
``localnet up``/``wait``, ``authorities serve``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from tests.plan_helpers import short_plan
from tests.rollout_helpers import (
    FIVE_DOWN,
    KIST_EFFECTS,
    KIST_PLAN,
    RELAY_CPU_CRITERION,
    STEP_BACK,
    write_predictions,
)

PLAN = KIST_PLAN
KIST = "KISTSchedRunInterval"


def paths(doc, prefix: str = "") -> set[str]:
    """Every key path of ``doc`` (lists: their first element)."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            out |= paths(value, path)
    elif isinstance(doc, list) and doc:
        out |= paths(doc[0], f"{prefix}[]")
    return out


def _cli(*argv: str):
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 0, (argv, result.output[-2000:], result.exception)
    return result


def _json(*argv: str):
    return json.loads(_cli(*argv).stdout)


def _feed_lines(journal: Path, tmp: Path) -> list[dict]:
    """What `kistexp run --json-lines` prints for the events of the finished rollout in ``journal``: the feed
    starts on a directory that does not exist yet, the journal appears there whole, the feed stops (and
    reads it)."""
    from kistexp.commands.rollout import _start_feed
    from kistexp.rollout.notify import Notifier

    fed, staged = tmp / f"fed-{journal.name}", tmp / f"staged-{journal.name}"
    out = io.StringIO()
    saved, sys.stdout = sys.stdout, out
    try:
        thread = _start_feed(fed, str(fed), False, True, Notifier(None, None, warn=lambda m: None), 0.0, 3600,
                             "fake")
        shutil.copytree(journal, staged)
        os.rename(staged, fed)
        thread.stop()
        assert thread.error is None, thread.error
    finally:
        sys.stdout = saved
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _held_consensus_lines(tmp: Path) -> list[dict]:
    import datetime as dt

    from kistexp.errors import LocalNetError
    from kistexp.localnet.heldconsensus import HeldConsensus, HeldConsensusWatch

    class Net:
        def node(self, name):
            return SimpleNamespace(nickname=name)

        def control(self, name):
            raise LocalNetError(f"{name} is not running; its ControlPort is closed")

    watch = HeldConsensusWatch(Net(), ["relay003"], tmp, period_s=0.2, call_timeout_s=0.5)
    try:
        watch.poll_once()
        at = dt.datetime(2027, 3, 1, 12, 0, 5, tzinfo=dt.timezone.utc)
        watch._record(HeldConsensus("relay003", at, True, at.replace(second=0), {KIST: 3}, 7))
    finally:
        watch.stop(2.0)
    return [json.loads(line) for line in (tmp / "relay003.held-consensus.jsonl").read_text().splitlines()]


def _fake_authorities(tmp: Path, docs: dict) -> None:
    import httpx

    from fake_authorities.network import FakeAuthorityNetwork, generate_keys

    net = FakeAuthorityNetwork(count=3, interval_s=3, port=0, keys=generate_keys(3, (1024, 1024)), token="t",
                               vote_delay_s=0.75, dist_delay_s=0.75, initial_params=f"{KIST}=3")
    net.start()
    try:
        net.wait_for_consensus(timeout_s=20)
        specs = [x for a in net.directory_authorities()
                 for x in ("--authority", f"{a.nickname}={a.address}:{a.dirport}/{a.v3ident}")]
        docs["authorities status"] = _json("authorities", "status", "--param", KIST, "--plan", PLAN, "--timeout",
                                           "2", *specs, "--json")
        docs["consensus fetch"] = _json("consensus", "fetch", "--flavour", "microdesc", "-o", tmp / "fetched",
                                        "--certs-out", tmp / "fetched.certs", "--timeout", "5", *specs, "--json")
        name = net.names[0]
        api = f"{net.operator_url}/kistexp/operator/authorities/{name}/faults"
        headers = {"Authorization": "Bearer t"}
        for fault in ({"kind": "slow", "delay_s": 0.5}, {"kind": "refuse-sign"}, {"kind": "down", "mode": "hang"}):
            reply = httpx.post(api, json=fault, headers=headers, timeout=5)
            assert reply.status_code == 200, reply.text
        docs["operator faults"] = httpx.get(api, headers=headers, timeout=5).json()
        net.clear_fault(name)
    finally:
        net.stop()


#: real tor's side of a fidelity report as ``--real-from`` reads it (a report of ``fidelity --json``)
REAL_REPORT = {
    "rows": [{"scenario": "circuit", "scheduler": "kist", "interval_ms": 10, "real": {
        "throughputs_mbytes_per_s": [3.0, 3.2], "cpu_busiest_fraction": 0.2,
        "run_period": {"runs": 100, "busy_channel": 8, "busy_runs": 90, "period_ms_median": 12.0,
                       "period_ms_mean": 12.1, "cells_per_run_median": 64, "cells_per_run_mean": 63.5,
                       "cells_total": 5760},
        "cpu_total_cores": 0.4, "cpu_seconds_per_mbyte": 0.03, "load_1min": 0.5, "stolen_fractions": [0.08, 0.04],
        "remeasured": 1, "core_wait_fractions": [0.25, 0.15]}}],
    "machine": {"sleep_ms": 1.0, "sleeps": 100, "median_ms": 0.1, "p99_ms": 3.0, "max_ms": 3.0, "late_fraction": 0.07,
                "stolen_fraction": None},
}


def _sim_experiments(docs: dict) -> None:
    """`sim experiment NAME --json` for each kind of result, the result given instead of run."""
    from unittest import mock

    from kistexp.sim import experiments as E

    nan = float("nan")
    circuit = E.CircuitResult("kistlite", 2, 10, "sendme", 400_000, True, 12.5, nan, 1.0, 60, 0.3, None, 64.0, 4, 0)
    results = {
        "ceiling": E.CeilingResult("kistlite", 2, 4, 4.0, 65536, 2.0, 8.22, 4.0, 64, 64.0, 250.0, nan),
        "ceiling-path": E.PathCeilingResult("kistlite", 10, 10, 2, "sendme", 400_000, True, 2.7, 300, 12.0, 64.0, 0),
        "circuit": circuit,
        "circuit sweep": E.CircuitSweepResult((circuit, circuit)),
        "kist-first-run": E.FirstRunResult(1448, 10, 53, (32, 32, 30)),
        "ewma": E.EwmaResult("kist", 4, 4, 2, 10.0, (E.EwmaPoint(10, 1.0, 20.0, 1.5, 30.0, 0.5, 10.0, 2.5),)),
        "kernel-queue": E.KernelQueueResult(4, 16, 5.0, (
            E.QueuePlacement("kist", 10, 1.0, 0.1, 1.2, nan, 0.1, 10_000, 20_000, 5000.0, 6000.0, 3.0),)),
    }
    for name, result in results.items():
        with mock.patch.object(E, "run_experiment", lambda *_a, result=result, **_k: result):
            docs[f"sim experiment {name}"] = _json("sim", "experiment", name.split()[0], "--json")


def _onionperf_guards() -> list[dict]:
    """The entry guards of the measuring client's OnionPerf analysis (``tor.guards``)."""
    from kistexp.localnet.torevents import TorEvents

    events = TorEvents(lambda *record: None, clock=lambda: 1700000000.0)
    events.seed_guards(f"${'A' * 40}~relay003 up\n${'B' * 40}~relay004 never-connected\n", at=1700000000.1234567)
    return events.guards_json()


def _simulate(docs: dict, tmp: Path, preds: Path) -> None:
    """`simulate --stored --json` on stored predictions and attack measures, and `simulate --json` with its
    result given (a run takes minutes), saved into a new experiment."""
    from unittest import mock

    from kistexp.anonymity import stage_differences
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.series import AttackValue
    from kistexp.metrics.store import MetricStore
    from kistexp.population import predict

    with ExperimentDir.open(preds) as exp:
        store = MetricStore(exp.db)
        stages = list(dict.fromkeys(p.stage for p in store.load_predictions()))
        values = [AttackValue(stage, measure, net, 0.5 + 0.01 * net + 0.02 * k)
                  for k, stage in enumerate(stages) for net in range(2)
                  for measure in ("attack_flow_auc", "attack_rtt_cv")]
        store.save_attack_values(values)
        rows = tuple(store.load_predictions())
    docs["simulate --stored"] = _json("simulate", PLAN, "--dir", preds, "--stored", "--json")
    result = predict.PlanPrediction(
        plan="kist", stages=tuple(stages), networks=2, relays_per_network=(30, 30), clients_per_network=(40, 40),
        bandwidth_scale=(0.2, 0.2), expected_utilisation=(0.4, 0.4), achieved_utilisation=(0.3, 0.3),
        duration_s=60.0, windows_s=(("warm-up", 0.0, 10.0), ("stage", 43.3, 60.0)), predictions=rows,
        figures=tuple(predict.summarize_predictions(rows, stages)), wall_s=1.0, attack_values=tuple(values),
        attack_figures=tuple(stage_differences(values, stages)), probes=0, cpu_s=12.0, attack_cpu_s=0.6)
    with mock.patch.object(predict, "simulate_plan", lambda *_a, **_k: result):
        docs["simulate"] = _json("simulate", PLAN, "--dir", tmp / "simulated", "--workers", "1", "--json")


def collect(tmp: Path, shared: Path) -> dict[str, object]:
    """Every document this module pins, by name."""
    from kistexp.localnet import LocalNetwork, NetworkSpec
    from tests.judge.test_judge_cli import _stored_experiment, quantile_sample
    from tests.rollout.test_rollout_replay import PLAN as REPLAY_PLAN
    from tests.rollout.test_rollout_replay import operator_csv

    microdesc = shared / "microdesc-consensus-2022-11-19"
    consensus = shared / "consensus-2022-11-19-10-00-00"
    hk5 = shared / "onionperf" / "2021-01-01.op-hk5.onionperf.analysis.json.xz"
    hk6a = shared / "onionperf" / "2021-06-01.op-hk6a.onionperf.analysis.json.xz"
    docs: dict[str, object] = {}

    # plans, parameters, consensuses, the authorities' vote
    docs["lint"] = _json("lint", PLAN, "--now", "2026-01-01T00:00:00Z", "--json")
    docs["show"] = _json("show", PLAN, "--json")
    docs["params KIST"] = _json("params", KIST, "--json")
    docs["params"] = _json("params", "--json")
    docs["consensus inspect"] = _json("consensus", "inspect", microdesc, "--json")
    docs["consensus inspect --certs"] = _json("consensus", "inspect", consensus, "--certs", shared / "cached-certs",
                                              "--json")
    docs["authorities whatif"] = _json(
        "authorities", "whatif", "--n-authorities", "5", "--vote", f"a={KIST}=2", "--vote", f"b={KIST}=2",
        "--vote", f"c={KIST}=3 {KIST}=4", "--unreachable", "a", "--target", f"{KIST}=3", "--json")
    _fake_authorities(tmp, docs)

    # a local network's saved state (no tor runs)
    saved = tmp / "net"
    saved.mkdir()
    LocalNetwork(saved, NetworkSpec(authorities=1, relays=0, exits=0, clients=0, base_port=15000),
                 {"pids": {}, "params": {}, "keys": {}})._save()
    (saved / "auth000").mkdir()
    docs["localnet status"] = _json("localnet", "status", saved, "--json")
    docs["localnet params"] = _json("localnet", "params", saved, "auth000", f"{KIST}=3", "--json")
    docs["localnet down"] = _json("localnet", "down", saved, "--json")
    docs["fidelity"] = _json("fidelity", "--no-real", "--no-sim", "--json")
    (tmp / "real.json").write_text(json.dumps(REAL_REPORT))
    docs["fidelity --real-from"] = _json("fidelity", "--scenarios", "circuit", "--schedulers", "kist", "--intervals",
                                         "10", "--real-from", tmp / "real.json", "--no-sim", "--json")
    docs["fidelity --history"] = _json("fidelity", "--history", "--json")
    _sim_experiments(docs)

    # metrics and the judge
    mexp = tmp / "metrics"
    docs["metrics import"] = _json("metrics", "import", hk5, "--dir", mexp, "--param-value", "2", "--json")
    docs["metrics list"] = _json("metrics", "list", "--dir", mexp, "--json")
    docs["metrics show"] = _json("metrics", "show", "client_ttlb_5mib_s", "--dir", mexp, "--json")
    docs["metrics show --samples"] = _json("metrics", "show", "client_ttlb_5mib_s", "--dir", mexp, "--samples",
                                           "--json")
    docs["metrics params"] = _json("metrics", "params", "--dir", mexp, "--json")
    (tmp / "b.txt").write_text("\n".join(f"{v:.9g}" for v in quantile_sample(2000)) + "\n")
    (tmp / "s.txt").write_text("\n".join(f"{v:.9g}" for v in quantile_sample(2000) * 1.25) + "\n")
    docs["judge compare"] = _json("judge", "compare", "--baseline", tmp / "b.txt", "--stage", tmp / "s.txt",
                                  "--statistic", "median", "--comparison", "relative-increase", "--threshold",
                                  "0.10", "--state", tmp / "state.json", "--json")
    docs["judge compare state file"] = json.loads((tmp / "state.json").read_text())
    jdir = tmp / "judged"
    jdir.mkdir()
    plan, exp = _stored_experiment(jdir, 1.3)
    docs["judge plan"] = _json("judge", plan, "--dir", exp, "--now", "2030-01-30T00:00:00Z", "--json")

    # the population
    docs["population paths"] = _json("population", "paths", microdesc, "--circuits", "200", "--seed", "1", "--json")
    docs["population summary"] = _json("population", "summary", microdesc, "--scale", "0.01", "--json")
    docs["sweep --check"] = _json("sweep", "plans/sweeps/kist-interval-small.toml", "--check", "--json")

    # rollouts: dry runs (a rollback, five authorities down, one that completes), their journals, a replay
    preds = tmp / "preds"
    write_predictions(preds, KIST_EFFECTS).close()
    rolled, down, done = tmp / "rolled", tmp / "down", tmp / "done"
    docs["dry-run"] = _json("dry-run", PLAN, "--predictions", preds, "--dir", rolled, "--inject", STEP_BACK, "--json")
    down_args = [x for a in FIVE_DOWN for x in ("--inject", f"authority={a}:down@day4")]
    docs["dry-run five down"] = _json("dry-run", PLAN, "--predictions", preds, "--dir", down, *down_args, "--json")
    short, short_preds = tmp / "short.toml", tmp / "short-preds"
    short.write_text(short_plan("watched", {"two": 2}, RELAY_CPU_CRITERION))
    write_predictions(short_preds, {"baseline": {}, "two": {}}).close()
    _cli("dry-run", short, "--predictions", short_preds, "--dir", done)
    for line in _feed_lines(done, tmp) + _feed_lines(rolled, tmp) + _feed_lines(down, tmp):
        docs.setdefault(f"run --json-lines {line['kind']}", line)
    for exp_dir, tag in ((rolled, ""), (down, " five down")):
        docs[f"status{tag}"] = _json("status", exp_dir, "--json")
        docs[f"history{tag}"] = _json("history", exp_dir, "--json")
        docs[f"rollback --dry-run{tag}"] = _json("rollback", exp_dir, "--dry-run", "--json")
    docs["status --watch"] = json.loads(_cli("status", done, "--watch", "--json").stdout.strip().splitlines()[-1])
    db = sqlite3.connect(f"file:{rolled / 'experiment.db'}?mode=ro", uri=True)
    try:
        record = db.execute("SELECT record FROM rollout_verdicts WHERE record != '{}' ORDER BY id LIMIT 1").fetchone()
    finally:
        db.close()
    docs["journal verdict record"] = json.loads(record[0])
    docs["report"] = _json("report", rolled, "-o", tmp / "r.html", "--json")
    docs["announce"] = _json("announce", PLAN, "--dir", preds, "--json")
    _simulate(docs, tmp, preds)
    docs["promote"] = _json("promote", rolled, "--json")
    docs["pause"] = _json("pause", down, "--json")
    rplan = tmp / "replay.toml"
    rplan.write_text(REPLAY_PLAN)
    docs["dry-run --replay"] = _json("dry-run", rplan, "--replay", hk6a, "--replay",
                                     operator_csv(tmp / "ops.csv", shift_from_hour=16), "--dir", tmp / "replayed",
                                     "--json")

    docs["held-consensus lines"] = _held_consensus_lines(tmp / "held")
    docs["onionperf guards"] = _onionperf_guards()
    return docs


@pytest.fixture(scope="module")
def documents(tmp_path_factory, shared_data):
    return collect(tmp_path_factory.mktemp("shapes"), shared_data)


SHAPES: dict[str, tuple[str, ...]] = {
    'announce': (
        'authorities', 'authorities[].nickname', 'authorities[].steps', 'authorities[].steps[].before',
        'authorities[].steps[].line', 'authorities[].steps[].stage', 'authorities[].steps[].valid_after',
        'authorities[].steps[].what', 'end', 'markdown', 'plan', 'predictions_made', 'predictions_made.label',
        'predictions_made.made', 'predictions_made.nic_scale_max', 'predictions_made.nic_scale_min',
        'predictions_made.rates', 'predictions_made.relays', 'report_columns', 'report_example', 'report_format',
        'schedule', 'schedule[].authority_action', 'schedule[].clients_100pct', 'schedule[].clients_50pct',
        'schedule[].end', 'schedule[].first_valid_after', 'schedule[].gate', 'schedule[].relays_100pct',
        'schedule[].relays_50pct', 'schedule[].stage', 'schedule[].start', 'schedule[].values',
        'schedule[].values.KISTSchedRunInterval', 'schedule[].vote_deadline', 'start', 'text', 'watch',
        'watch[].metric', 'watch[].note', 'watch[].rows', 'watch[].rows[].baseline', 'watch[].rows[].relay_class',
        'watch[].rows[].stages', 'watch[].rows[].stages[].change', 'watch[].rows[].stages[].median',
        'watch[].rows[].stages[].stage', 'watch[].unit',
    ),
    'authorities status': (
        'authorities', 'authorities[].error', 'authorities[].nickname', 'authorities[].params',
        'authorities[].params.AuthDirMaxServersPerAddr', 'authorities[].params.KISTSchedRunInterval',
        'authorities[].pinned', 'authorities[].reachable', 'authorities[].url', 'authorities[].v3ident',
        'authorities[].vote_valid_after', 'consensus', 'consensus.error', 'consensus.flavour',
        'consensus.fresh_until', 'consensus.signatures', 'consensus.valid_after', 'consensus.verified',
        'n_authorities', 'params', 'params[].consensus_value', 'params[].included', 'params[].name',
        'params[].predicted_value', 'params[].tally', 'params[].votes', 'params[].votes.dizum',
        'params[].votes.moria1', 'params[].votes.tor26', 'verified',
    ),
    'authorities whatif': (
        'can_compute', 'consensus_method', 'consensus_params', 'dropped_votes', 'dropped_votes[].authority',
        'dropped_votes[].reason', 'formation', 'inclusion_threshold', 'n_authorities', 'silent_authorities', 'tally',
        'tally[].included', 'tally[].key', 'tally[].listed', 'tally[].listed.a', 'tally[].listed.b',
        'tally[].low_median', 'tally[].n_listing', 'tally[].words', 'target', 'target.changes',
        'target.changes[].after', 'target.changes[].authority', 'target.changes[].before', 'target.current',
        'target.key', 'target.new_values', 'target.possible', 'target.result', 'target.value', 'target.words',
        'votes_held', 'votes_needed',
    ),
    'consensus fetch': (
        'authority', 'certs_path', 'flavour', 'path', 'relays', 'signatures', 'size_bytes', 'url', 'valid_after',
        'valid_until',
    ),
    'consensus inspect': (
        'authority_count', 'consensus_method', 'flavor', 'fresh_until', 'other_certificates', 'params',
        'params.CircuitPriorityHalflifeMsec', 'params.DoSCircuitCreationBurst', 'params.DoSCircuitCreationEnabled',
        'params.DoSCircuitCreationMinConnections', 'params.DoSCircuitCreationRate', 'params.DoSConnectionEnabled',
        'params.DoSConnectionMaxConcurrentCount', 'params.DoSRefuseSingleHopClientRendezvous',
        'params.ExtendByEd25519ID', 'params.KISTSchedRunInterval', 'params.NumNTorsPerTAP',
        'params.UseOptimisticData', 'params.bwauthpid', 'params.bwscanner_cc', 'params.cbttestfreq', 'params.cc_alg',
        'params.cc_cwnd_inc', 'params.cc_cwnd_inc_rate', 'params.cc_sscap_exit', 'params.cc_sscap_onion',
        'params.cc_vegas_alpha_exit', 'params.cc_vegas_beta_onion', 'params.cc_vegas_delta_exit',
        'params.cc_vegas_delta_onion', 'params.cc_vegas_gamma_onion', 'params.circ_max_cell_queue_size',
        'params.guard-n-primary-dir-guards-to-use', 'params.guard-n-primary-guards-to-use',
        'params.hs_service_max_rdv_failures', 'params.hsdir_spread_store',
        'params.overload_onionskin_ntor_period_secs', 'params.overload_onionskin_ntor_scale_percent',
        'params.sendme_emit_min_version', 'relay_count', 'signature_count', 'signatures', 'source',
        'trusted_authorities', 'trusted_authorities[].nickname', 'trusted_authorities[].v3ident', 'valid_after',
        'valid_until', 'verified', 'vote_status',
    ),
    'consensus inspect --certs': (
        'authority_count', 'consensus_method', 'flavor', 'fresh_until', 'other_certificates', 'params',
        'params.CircuitPriorityHalflifeMsec', 'params.DoSCircuitCreationBurst', 'params.DoSCircuitCreationEnabled',
        'params.DoSCircuitCreationMinConnections', 'params.DoSCircuitCreationRate', 'params.DoSConnectionEnabled',
        'params.DoSConnectionMaxConcurrentCount', 'params.DoSRefuseSingleHopClientRendezvous',
        'params.ExtendByEd25519ID', 'params.KISTSchedRunInterval', 'params.NumNTorsPerTAP',
        'params.UseOptimisticData', 'params.bwauthpid', 'params.bwscanner_cc', 'params.cbttestfreq', 'params.cc_alg',
        'params.cc_cwnd_inc', 'params.cc_cwnd_inc_rate', 'params.cc_sscap_exit', 'params.cc_sscap_onion',
        'params.cc_vegas_alpha_exit', 'params.cc_vegas_beta_onion', 'params.cc_vegas_delta_exit',
        'params.cc_vegas_delta_onion', 'params.cc_vegas_gamma_onion', 'params.circ_max_cell_queue_size',
        'params.guard-n-primary-dir-guards-to-use', 'params.guard-n-primary-guards-to-use',
        'params.hs_service_max_rdv_failures', 'params.hsdir_spread_store',
        'params.overload_onionskin_ntor_period_secs', 'params.overload_onionskin_ntor_scale_percent',
        'params.sendme_emit_min_version', 'relay_count', 'signature_count', 'signatures', 'signatures.n_authorities',
        'signatures.needed', 'signatures.ok', 'signatures.per_signature', 'signatures.per_signature[].algorithm',
        'signatures.per_signature[].identity', 'signatures.per_signature[].signing_key_digest',
        'signatures.per_signature[].status', 'signatures.total', 'signatures.valid', 'source', 'trusted_authorities',
        'trusted_authorities[].nickname', 'trusted_authorities[].v3ident', 'valid_after', 'valid_until', 'verified',
        'vote_status',
    ),
    'dry-run': (
        'authority_health', 'authority_health.authority_outages', 'authority_health.consensus_outages',
        'authority_health.down_since', 'authority_health.last_round', 'authority_health.last_round.consensus',
        'authority_health.last_round.down', 'authority_health.last_round.params',
        'authority_health.last_round.params.KISTSchedRunInterval', 'authority_health.last_round.signed',
        'authority_health.last_round.stale', 'authority_health.last_round.valid_after',
        'authority_health.last_round.voted', 'consensus_changes', 'consensus_changes[].params',
        'consensus_changes[].params.KISTSchedRunInterval', 'consensus_changes[].signers',
        'consensus_changes[].valid_after', 'decisions', 'decisions[].at', 'decisions[].decision',
        'decisions[].message', 'decisions[].stage', 'decisions[].valid_after', 'final_state', 'injections', 'journal',
        'plan', 'rollbacks', 'rollbacks[].act_before', 'rollbacks[].at', 'rollbacks[].authorities_must_act',
        'rollbacks[].cause', 'rollbacks[].clients_50pct', 'rollbacks[].clients_99pct',
        'rollbacks[].clients_back_after_s', 'rollbacks[].compiled_defaults',
        'rollbacks[].compiled_defaults.KISTSchedRunInterval',
        'rollbacks[].compiled_defaults.KISTSchedRunInterval[].value',
        'rollbacks[].compiled_defaults.KISTSchedRunInterval[].versions', 'rollbacks[].consensus',
        'rollbacks[].consensus.KISTSchedRunInterval', 'rollbacks[].from_stage', 'rollbacks[].kind',
        'rollbacks[].note', 'rollbacks[].possible', 'rollbacks[].relays_50pct', 'rollbacks[].relays_99pct',
        'rollbacks[].relays_back_after_s', 'rollbacks[].targets', 'rollbacks[].targets.KISTSchedRunInterval',
        'rollbacks[].valid_after', 'status', 'transitions', 'transitions[].at', 'transitions[].cause',
        'transitions[].from', 'transitions[].kind', 'transitions[].seq', 'transitions[].stage',
        'transitions[].targets', 'transitions[].targets.KISTSchedRunInterval', 'transitions[].to',
        'transitions[].valid_after', 'verdict_counts', 'verdict_counts.1 MiB downloads',
        'verdict_counts.1 MiB downloads.inconclusive', 'verdict_counts.5 MiB downloads',
        'verdict_counts.5 MiB downloads.inconclusive', 'verdict_counts.50 KiB downloads',
        'verdict_counts.50 KiB downloads.inconclusive', 'verdict_counts.quiet circuits',
        'verdict_counts.quiet circuits.inconclusive', 'verdict_counts.relay CPU', 'verdict_counts.relay CPU.fail',
        'wall_s',
    ),
    'dry-run --replay': (
        'alignment', 'dry_run', 'dry_run.consensus_changes', 'dry_run.consensus_changes[].params',
        'dry_run.consensus_changes[].params.KISTSchedRunInterval', 'dry_run.consensus_changes[].signers',
        'dry_run.consensus_changes[].valid_after', 'dry_run.decisions', 'dry_run.decisions[].at',
        'dry_run.decisions[].decision', 'dry_run.decisions[].message', 'dry_run.decisions[].stage',
        'dry_run.decisions[].valid_after', 'dry_run.final_state', 'dry_run.injections', 'dry_run.journal',
        'dry_run.plan', 'dry_run.rollbacks', 'dry_run.rollbacks[].act_before', 'dry_run.rollbacks[].at',
        'dry_run.rollbacks[].authorities_must_act', 'dry_run.rollbacks[].cause', 'dry_run.rollbacks[].clients_50pct',
        'dry_run.rollbacks[].clients_99pct', 'dry_run.rollbacks[].clients_back_after_s',
        'dry_run.rollbacks[].compiled_defaults', 'dry_run.rollbacks[].compiled_defaults.KISTSchedRunInterval',
        'dry_run.rollbacks[].compiled_defaults.KISTSchedRunInterval[].value',
        'dry_run.rollbacks[].compiled_defaults.KISTSchedRunInterval[].versions', 'dry_run.rollbacks[].consensus',
        'dry_run.rollbacks[].consensus.KISTSchedRunInterval', 'dry_run.rollbacks[].from_stage',
        'dry_run.rollbacks[].kind', 'dry_run.rollbacks[].note', 'dry_run.rollbacks[].possible',
        'dry_run.rollbacks[].relays_50pct', 'dry_run.rollbacks[].relays_99pct',
        'dry_run.rollbacks[].relays_back_after_s', 'dry_run.rollbacks[].targets',
        'dry_run.rollbacks[].targets.KISTSchedRunInterval', 'dry_run.rollbacks[].valid_after', 'dry_run.status',
        'dry_run.transitions', 'dry_run.transitions[].at', 'dry_run.transitions[].cause',
        'dry_run.transitions[].from', 'dry_run.transitions[].kind', 'dry_run.transitions[].seq',
        'dry_run.transitions[].stage', 'dry_run.transitions[].targets',
        'dry_run.transitions[].targets.KISTSchedRunInterval', 'dry_run.transitions[].to',
        'dry_run.transitions[].valid_after', 'dry_run.verdict_counts', 'dry_run.verdict_counts.circuit build',
        'dry_run.verdict_counts.circuit build.pass', 'dry_run.verdict_counts.relay CPU',
        'dry_run.verdict_counts.relay CPU.fail', 'dry_run.verdict_counts.relay CPU.inconclusive',
        'dry_run.verdict_counts.relay CPU.pass', 'dry_run.wall_s', 'first_rollback', 'first_rollback.at',
        'first_rollback.authorities_must_act', 'first_rollback.cause', 'first_rollback.criterion',
        'first_rollback.hour_in_stage', 'first_rollback.kind', 'first_rollback.relays_back_after_s',
        'first_rollback.stage', 'first_rollback.stage_name', 'first_rollback.stage_window', 'first_rollback.verdict',
        'first_rollback.verdict.ci_high', 'first_rollback.verdict.ci_low', 'first_rollback.verdict.criterion',
        'first_rollback.verdict.detail', 'first_rollback.verdict.effect', 'first_rollback.verdict.n_baseline',
        'first_rollback.verdict.n_stage', 'first_rollback.verdict.outcome', 'first_rollback.verdict.reason',
        'first_rollback.verdict.record', 'first_rollback.verdict.record.alpha_fail',
        'first_rollback.verdict.record.bound', 'first_rollback.verdict.record.c_fail',
        'first_rollback.verdict.record.c_pass', 'first_rollback.verdict.record.ci_high',
        'first_rollback.verdict.record.ci_low', 'first_rollback.verdict.record.comparison',
        'first_rollback.verdict.record.correction', 'first_rollback.verdict.record.criterion',
        'first_rollback.verdict.record.design_effect', 'first_rollback.verdict.record.detail',
        'first_rollback.verdict.record.effect', 'first_rollback.verdict.record.excluded',
        'first_rollback.verdict.record.halfwidth_floor', 'first_rollback.verdict.record.information',
        'first_rollback.verdict.record.limited_by', 'first_rollback.verdict.record.look',
        'first_rollback.verdict.record.method', 'first_rollback.verdict.record.n_baseline',
        'first_rollback.verdict.record.n_stage', 'first_rollback.verdict.record.outcome',
        'first_rollback.verdict.record.reason', 'first_rollback.verdict.record.rule',
        'first_rollback.verdict.record.se_baseline', 'first_rollback.verdict.record.se_stage',
        'first_rollback.verdict.record.sequential', 'first_rollback.verdict.record.state',
        'first_rollback.verdict.record.state.alpha_fail', 'first_rollback.verdict.record.state.alpha_pass',
        'first_rollback.verdict.record.state.fractions', 'first_rollback.verdict.record.state.method',
        'first_rollback.verdict.record.state.planned_stage', 'first_rollback.verdict.record.state.target_stage',
        'first_rollback.verdict.record.statistic', 'first_rollback.verdict.record.threshold',
        'first_rollback.verdict.record.warnings', 'first_rollback.verdict.rule', 'first_rollback.verdict.shadow',
        'first_rollback.verdict.stage', 'first_rollback.verdict.window_end', 'plan', 'recorded_from',
        'recorded_until', 'recordings', 'recordings[].kind', 'recordings[].location', 'recordings[].problems',
        'recordings[].samples', 'recordings[].samples.circuit_build_time_s',
        'recordings[].samples.client_throughput_mbytes_per_s', 'recordings[].samples.client_transfer_failure_ratio',
        'recordings[].samples.client_ttfb_s', 'recordings[].samples.client_ttlb_1mib_s',
        'recordings[].samples.client_ttlb_50kib_s', 'recordings[].samples.client_ttlb_5mib_s', 'windows',
        'windows[].end', 'windows[].name', 'windows[].stage', 'windows[].start',
    ),
    'dry-run five down': (
        'authority_health', 'authority_health.authority_outages', 'authority_health.authority_outages[].authority',
        'authority_health.authority_outages[].end', 'authority_health.authority_outages[].ongoing',
        'authority_health.authority_outages[].rounds', 'authority_health.authority_outages[].start',
        'authority_health.consensus_outages', 'authority_health.consensus_outages[].down',
        'authority_health.consensus_outages[].end', 'authority_health.consensus_outages[].last_good',
        'authority_health.consensus_outages[].ongoing', 'authority_health.consensus_outages[].recovered',
        'authority_health.consensus_outages[].rounds', 'authority_health.consensus_outages[].start',
        'authority_health.down_since', 'authority_health.down_since.dannenberg', 'authority_health.down_since.dizum',
        'authority_health.down_since.gabelmoo', 'authority_health.down_since.moria1',
        'authority_health.down_since.tor26', 'authority_health.last_round', 'authority_health.last_round.consensus',
        'authority_health.last_round.down', 'authority_health.last_round.params',
        'authority_health.last_round.signed', 'authority_health.last_round.stale',
        'authority_health.last_round.valid_after', 'authority_health.last_round.voted', 'consensus_changes',
        'consensus_changes[].params', 'consensus_changes[].params.KISTSchedRunInterval',
        'consensus_changes[].signers', 'consensus_changes[].valid_after', 'decisions', 'decisions[].at',
        'decisions[].decision', 'decisions[].message', 'decisions[].stage', 'decisions[].valid_after', 'final_state',
        'injections', 'journal', 'plan', 'rollbacks', 'status', 'transitions', 'transitions[].at',
        'transitions[].cause', 'transitions[].from', 'transitions[].kind', 'transitions[].seq', 'transitions[].stage',
        'transitions[].targets', 'transitions[].targets.KISTSchedRunInterval', 'transitions[].to',
        'transitions[].valid_after', 'verdict_counts', 'wall_s',
    ),
    'fidelity': (
        'clearly_ordered_pairs', 'compared_count', 'machine', 'ordering_disagreements', 'real_repetitions',
        'real_skipped', 'real_stolen_fraction_mean', 'repetitions', 'rows', 'rows[].cc_alg', 'rows[].circuits',
        'rows[].client_interval_ms', 'rows[].cpu_bound', 'rows[].interval_ms', 'rows[].real',
        'rows[].real_cells_per_run_mean', 'rows[].real_cells_per_run_median', 'rows[].real_core_wait_fraction_mean',
        'rows[].real_cpu_bound', 'rows[].real_cpu_busiest_fraction', 'rows[].real_cpu_seconds_per_mbyte',
        'rows[].real_cpu_total_cores', 'rows[].real_load_1min', 'rows[].real_mean_mbytes_per_s', 'rows[].real_note',
        'rows[].real_run_period_ms_mean', 'rows[].real_run_period_ms_median', 'rows[].real_stdev_mbytes_per_s',
        'rows[].real_stolen_fraction_mean', 'rows[].real_throughput_mbytes_per_s', 'rows[].scenario',
        'rows[].scheduler', 'rows[].sim_cells_per_run_median', 'rows[].sim_mean_mbytes_per_s',
        'rows[].sim_needs_cores', 'rows[].sim_note', 'rows[].sim_over_real', 'rows[].sim_run_period_ms',
        'rows[].sim_throughput_mbytes_per_s', 'rows[].sim_within_25pct', 'rows[].streams', 'seeds', 'sim_skipped',
        'sim_within_25pct_count', 'size_mb',
    ),
    'fidelity --history': (
        'current', 'current.cases', 'current.compared', 'current.complete', 'current.cores', 'current.cpu_model',
        'current.machine', 'current.measured_utc', 'current.outside', 'current.ratio_max', 'current.ratio_min',
        'current.repetitions', 'current.rows', 'current.rows[].client_interval_ms', 'current.rows[].compared',
        'current.rows[].core_wait_pct', 'current.rows[].cores', 'current.rows[].cpu_model',
        'current.rows[].interval_ms', 'current.rows[].load_1min', 'current.rows[].machine',
        'current.rows[].measured_utc', 'current.rows[].mode', 'current.rows[].note',
        'current.rows[].real_cells_per_run', 'current.rows[].real_max_mbytes_per_s', 'current.rows[].real_mbytes_per_s',
        'current.rows[].real_min_mbytes_per_s', 'current.rows[].real_run_period_ms', 'current.rows[].repetitions',
        'current.rows[].run_id', 'current.rows[].run_note', 'current.rows[].scenario', 'current.rows[].scheduler',
        'current.rows[].seeds', 'current.rows[].sim_cells_per_run', 'current.rows[].sim_mbytes_per_s',
        'current.rows[].sim_model', 'current.rows[].sim_over_real', 'current.rows[].sim_run_period_ms',
        'current.rows[].size_mb', 'current.rows[].stolen_pct', 'current.rows[].tor_version',
        'current.rows[].within_25pct', 'current.run_id', 'current.seeds', 'current.sim_model', 'current.tor_version',
        'current.within', 'plot', 'runs', 'runs[].cases', 'runs[].compared', 'runs[].complete', 'runs[].cores',
        'runs[].cpu_model', 'runs[].machine', 'runs[].measured_utc', 'runs[].outside', 'runs[].ratio_max',
        'runs[].ratio_min', 'runs[].repetitions', 'runs[].run_id', 'runs[].seeds', 'runs[].sim_model',
        'runs[].tor_version', 'runs[].within', 'source',
    ),
    'fidelity --real-from': (
        'clearly_ordered_pairs', 'compared_count', 'machine', 'machine.late_fraction', 'machine.max_ms',
        'machine.median_ms', 'machine.p99_ms', 'machine.sleep_ms', 'machine.sleeps', 'machine.stolen_fraction',
        'ordering_disagreements', 'real_repetitions', 'real_skipped', 'real_stolen_fraction_mean', 'repetitions',
        'rows', 'rows[].cc_alg', 'rows[].circuits', 'rows[].client_interval_ms', 'rows[].cpu_bound',
        'rows[].interval_ms', 'rows[].real', 'rows[].real.core_wait_fractions', 'rows[].real.cpu_busiest_fraction',
        'rows[].real.cpu_seconds_per_mbyte', 'rows[].real.cpu_total_cores', 'rows[].real.load_1min',
        'rows[].real.remeasured', 'rows[].real.run_period', 'rows[].real.run_period.busy_channel',
        'rows[].real.run_period.busy_runs', 'rows[].real.run_period.cells_per_run_mean',
        'rows[].real.run_period.cells_per_run_median', 'rows[].real.run_period.cells_total',
        'rows[].real.run_period.period_ms_mean', 'rows[].real.run_period.period_ms_median',
        'rows[].real.run_period.runs', 'rows[].real.stolen_fractions', 'rows[].real.throughputs_mbytes_per_s',
        'rows[].real_cells_per_run_mean', 'rows[].real_cells_per_run_median', 'rows[].real_core_wait_fraction_mean',
        'rows[].real_cpu_bound', 'rows[].real_cpu_busiest_fraction', 'rows[].real_cpu_seconds_per_mbyte',
        'rows[].real_cpu_total_cores', 'rows[].real_load_1min', 'rows[].real_mean_mbytes_per_s', 'rows[].real_note',
        'rows[].real_run_period_ms_mean', 'rows[].real_run_period_ms_median', 'rows[].real_stdev_mbytes_per_s',
        'rows[].real_stolen_fraction_mean', 'rows[].real_throughput_mbytes_per_s', 'rows[].scenario',
        'rows[].scheduler', 'rows[].sim_cells_per_run_median', 'rows[].sim_mean_mbytes_per_s', 'rows[].sim_needs_cores',
        'rows[].sim_note', 'rows[].sim_over_real', 'rows[].sim_run_period_ms', 'rows[].sim_throughput_mbytes_per_s',
        'rows[].sim_within_25pct', 'rows[].streams', 'seeds', 'sim_skipped', 'sim_within_25pct_count', 'size_mb',
    ),
    'held-consensus lines': (
        '[].node', '[].params', '[].pinned_KISTSchedRunInterval', '[].problem', '[].reachable', '[].time',
        '[].valid_after',
    ),
    'history': (
        'authority_outages', 'commands', 'consensus_outages', 'decisions', 'decisions[].at', 'decisions[].decision',
        'decisions[].message', 'decisions[].stage', 'decisions[].valid_after',
    ),
    'history five down': (
        'authority_outages', 'authority_outages[].authority', 'authority_outages[].end',
        'authority_outages[].ongoing', 'authority_outages[].rounds', 'authority_outages[].start', 'commands',
        'consensus_outages', 'consensus_outages[].down', 'consensus_outages[].end', 'consensus_outages[].last_good',
        'consensus_outages[].ongoing', 'consensus_outages[].recovered', 'consensus_outages[].rounds',
        'consensus_outages[].start', 'decisions', 'decisions[].at', 'decisions[].decision', 'decisions[].message',
        'decisions[].stage', 'decisions[].valid_after',
    ),
    'journal verdict record': (
        'alpha_fail', 'bound', 'c_fail', 'c_pass', 'ci_high', 'ci_low', 'comparison', 'correction', 'criterion',
        'design_effect', 'detail', 'effect', 'excluded', 'halfwidth_floor', 'information', 'limited_by', 'look',
        'method', 'n_baseline', 'n_stage', 'outcome', 'reason', 'rule', 'se_baseline', 'se_stage', 'sequential',
        'state', 'state.alpha_fail', 'state.alpha_pass', 'state.fractions', 'state.method', 'state.planned_stage',
        'state.target_stage', 'statistic', 'threshold', 'warnings',
    ),
    'judge compare': (
        'alpha_fail', 'bound', 'c_fail', 'c_pass', 'ci_high', 'ci_low', 'comparison', 'correction', 'criterion',
        'design_effect', 'detail', 'effect', 'effect_label', 'effect_percent', 'excluded', 'halfwidth_floor',
        'information', 'input_warnings', 'limited_by', 'look', 'method', 'n_baseline', 'n_stage', 'outcome', 'reason',
        'rule', 'se_baseline', 'se_stage', 'sequential', 'state', 'state.alpha_fail', 'state.alpha_pass',
        'state.fractions', 'state.method', 'state.planned_stage', 'state.target_stage', 'statistic', 'threshold',
        'warnings',
    ),
    'judge compare state file': (
        'alpha_fail', 'alpha_pass', 'fractions', 'method', 'planned_stage', 'target_stage',
    ),
    'judge plan': (
        'plan', 'verdicts', 'verdicts[].alpha_fail', 'verdicts[].bound', 'verdicts[].c_fail', 'verdicts[].c_pass',
        'verdicts[].ci_high', 'verdicts[].ci_low', 'verdicts[].comparison', 'verdicts[].correction',
        'verdicts[].criterion', 'verdicts[].design_effect', 'verdicts[].detail', 'verdicts[].effect',
        'verdicts[].excluded', 'verdicts[].halfwidth_floor', 'verdicts[].information', 'verdicts[].limited_by',
        'verdicts[].look', 'verdicts[].method', 'verdicts[].metric', 'verdicts[].n_baseline', 'verdicts[].n_stage',
        'verdicts[].outcome', 'verdicts[].reason', 'verdicts[].rule', 'verdicts[].se_baseline', 'verdicts[].se_stage',
        'verdicts[].sequential', 'verdicts[].stage', 'verdicts[].state', 'verdicts[].statistic',
        'verdicts[].threshold', 'verdicts[].warnings', 'verdicts[].window_end', 'verdicts[].window_start',
    ),
    'lint': (
        'detectable', 'detectable[].alpha_fail', 'detectable[].comparison', 'detectable[].criterion',
        'detectable[].detectable_change', 'detectable[].file', 'detectable[].metric', 'detectable[].n_baseline',
        'detectable[].n_stage', 'detectable[].power_fail', 'detectable[].power_pass', 'detectable[].stage',
        'detectable[].threshold', 'errors', 'files', 'findings', 'findings[].code', 'findings[].file',
        'findings[].key', 'findings[].line', 'findings[].message', 'findings[].severity', 'warnings',
    ),
    'localnet down': (
        'stopped', 'stopped.auth000',
    ),
    'localnet params': (
        'authority', 'consensus_params', 'reloaded', 'vote_confirmed',
    ),
    'localnet status': (
        'consensus', 'nodes', 'nodes[].consensus_params', 'nodes[].control_port', 'nodes[].dir_port',
        'nodes[].nickname', 'nodes[].or_port', 'nodes[].pid', 'nodes[].role', 'nodes[].running', 'nodes[].socks_port',
        'root', 'running', 'service',
    ),
    'metrics import': (
        'directory', 'failed', 'imported', 'imported[].consensuses', 'imported[].kind', 'imported[].problems',
        'imported[].samples', 'imported[].samples.circuit_build_time_s',
        'imported[].samples.client_throughput_mbytes_per_s', 'imported[].samples.client_transfer_failure_ratio',
        'imported[].samples.client_ttfb_s', 'imported[].samples.client_ttlb_1mib_s',
        'imported[].samples.client_ttlb_50kib_s', 'imported[].samples.client_ttlb_5mib_s', 'imported[].skipped_files',
        'imported[].source', 'imported[].votes',
    ),
    'metrics list': (
        'consensuses', 'metrics', 'metrics[].first', 'metrics[].last', 'metrics[].metric', 'metrics[].n_samples',
        'metrics[].n_series', 'metrics[].param_values', 'metrics[].unit', 'prediction_rows', 'sources',
        'sources[].id', 'sources[].imported', 'sources[].kind', 'sources[].location', 'sources[].n_rejected',
        'sources[].n_samples', 'sources[].problems', 'sources[].sha256', 'votes',
    ),
    'metrics params': (
        'consensuses', 'flavour', 'history', 'votes',
    ),
    'metrics show': (
        'metric', 'series', 'series[].first', 'series[].labels', 'series[].labels.server', 'series[].labels.size',
        'series[].labels.source', 'series[].last', 'series[].max', 'series[].mean', 'series[].median', 'series[].min',
        'series[].n', 'series[].p10', 'series[].p90', 'series[].param_values', 'unit',
    ),
    'metrics show --samples': (
        'metric', 'samples', 'samples[].labels', 'samples[].labels.server', 'samples[].labels.size',
        'samples[].labels.source', 'samples[].param_value', 'samples[].time', 'samples[].value', 'series',
        'series[].first', 'series[].labels', 'series[].labels.server', 'series[].labels.size',
        'series[].labels.source', 'series[].last', 'series[].max', 'series[].mean', 'series[].median', 'series[].min',
        'series[].n', 'series[].p10', 'series[].p90', 'series[].param_values', 'unit',
    ),
    'onionperf guards': (
        '[].fingerprint', '[].nickname', '[].up_ts',
    ),
    'operator faults': (
        '[].delay_s', '[].kind',
    ),
    'params': (
        '[].bounds', '[].bounds[].default', '[].bounds[].max', '[].bounds[].min', '[].bounds[].note',
        '[].bounds[].tor_versions', '[].category', '[].meaning', '[].name', '[].read_by', '[].source',
        '[].torrc_override', '[].unit',
    ),
    'params KIST': (
        'bounds', 'bounds[].default', 'bounds[].max', 'bounds[].min', 'bounds[].note', 'bounds[].tor_versions',
        'category', 'meaning', 'name', 'read_by', 'source', 'torrc_override', 'unit',
    ),
    'pause': (
        'command', 'expected', 'id', 'note', 'state',
    ),
    'population paths': (
        'circuits', 'circuits_per_client', 'class_shares', 'class_shares.exit', 'class_shares.exit.D',
        'class_shares.exit.E', 'class_shares.exit.G', 'class_shares.exit.M', 'class_shares.guard',
        'class_shares.guard.D', 'class_shares.guard.E', 'class_shares.guard.G', 'class_shares.guard.M',
        'class_shares.middle', 'class_shares.middle.D', 'class_shares.middle.E', 'class_shares.middle.G',
        'class_shares.middle.M', 'port', 'relays', 'relays[].class', 'relays[].exit', 'relays[].fingerprint',
        'relays[].guard', 'relays[].middle', 'relays[].nickname', 'seed', 'source',
    ),
    'population summary': (
        'bandwidth_weights', 'capacity_gbit', 'circuits_per_10min', 'client_classes', 'countries', 'countries[].key',
        'countries[].relay_share', 'countries[].relays', 'countries[].weight_share', 'flags', 'position_classes',
        'position_classes[].key', 'position_classes[].relay_share', 'position_classes[].relays',
        'position_classes[].weight_share', 'relay_classes', 'relay_classes[].key', 'relay_classes[].relay_share',
        'relay_classes[].relays', 'relay_classes[].weight_share', 'relays', 'schedulers', 'schedulers[].key',
        'schedulers[].relay_share', 'schedulers[].relays', 'schedulers[].weight_share', 'source', 'tornet_classes',
        'total_weight_kBps', 'users', 'weight_quantiles_kBps', 'weights_case',
    ),
    'promote': (
        'command', 'expected', 'id', 'note', 'state',
    ),
    'report': (
        'bytes', 'figures', 'kind', 'report',
    ),
    'rollback --dry-run': (
        '[].act_before', '[].authorities_down', '[].authorities_must_act', '[].authorities_must_act_marked',
        '[].clients_50pct', '[].clients_99pct', '[].compiled_defaults', '[].compiled_defaults.KISTSchedRunInterval',
        '[].compiled_defaults.KISTSchedRunInterval[].value', '[].compiled_defaults.KISTSchedRunInterval[].versions',
        '[].consensus', '[].consensus.KISTSchedRunInterval', '[].from_stage', '[].kind', '[].note', '[].possible',
        '[].relays_50pct', '[].relays_99pct', '[].targets', '[].targets.KISTSchedRunInterval', '[].valid_after',
    ),
    'rollback --dry-run five down': (
        '[].act_before', '[].authorities_down', '[].authorities_down.dannenberg', '[].authorities_down.dizum',
        '[].authorities_must_act', '[].authorities_must_act_marked', '[].clients_50pct', '[].clients_99pct',
        '[].compiled_defaults', '[].compiled_defaults.KISTSchedRunInterval',
        '[].compiled_defaults.KISTSchedRunInterval[].value', '[].compiled_defaults.KISTSchedRunInterval[].versions',
        '[].consensus', '[].consensus.KISTSchedRunInterval', '[].from_stage', '[].kind', '[].note', '[].possible',
        '[].relays_50pct', '[].relays_99pct', '[].targets', '[].targets.KISTSchedRunInterval', '[].valid_after',
        '[].without_down', '[].without_down.authorities_must_act', '[].without_down.possible',
    ),
    'run --json-lines authority': (
        'at', 'authorities', 'condition', 'kind', 'notify', 'severity', 'text',
    ),
    'run --json-lines consensus': (
        'at', 'kind', 'notify', 'params', 'params.KISTSchedRunInterval', 'severity', 'signers', 'text', 'valid_after',
    ),
    'run --json-lines intent': (
        'at', 'authorities', 'desired', 'desired.KISTSchedRunInterval', 'kind', 'notify', 'severity', 'state', 'text',
        'valid_after',
    ),
    'run --json-lines look': (
        'at', 'ci_high', 'ci_low', 'criterion', 'effect', 'kind', 'n_baseline', 'n_stage', 'notify', 'outcome',
        'severity', 'stage', 'text',
    ),
    'run --json-lines outage': (
        'at', 'kind', 'notify', 'rounds', 'severity', 'signers', 'since', 'text', 'valid_after',
    ),
    'run --json-lines pause': (
        'at', 'kind', 'notify', 'reasons', 'resolve_with', 'severity', 'stage', 'state', 'text', 'values',
        'values.KISTSchedRunInterval',
    ),
    'run --json-lines rollback': (
        'at', 'authorities_must_act', 'cause', 'kind', 'notify', 'rollback_kind', 'severity', 'stage', 'targets',
        'targets.KISTSchedRunInterval', 'text', 'valid_after',
    ),
    'run --json-lines stage': (
        'at', 'kind', 'notify', 'reasons', 'severity', 'stage', 'state', 'text', 'values',
        'values.KISTSchedRunInterval',
    ),
    'run --json-lines state': (
        'at', 'kind', 'notify', 'reasons', 'severity', 'stage', 'state', 'text', 'values',
        'values.KISTSchedRunInterval',
    ),
    'run --json-lines transition': (
        'at', 'kind', 'notify', 'severity', 'stage', 'targets', 'targets.KISTSchedRunInterval', 'text', 'valid_after',
    ),
    'show': (
        'baseline_start', 'detectable', 'detectable[].alpha_fail', 'detectable[].comparison',
        'detectable[].criterion', 'detectable[].detectable_change', 'detectable[].file', 'detectable[].metric',
        'detectable[].n_baseline', 'detectable[].n_stage', 'detectable[].power_fail', 'detectable[].power_pass',
        'detectable[].stage', 'detectable[].threshold', 'plan', 'revert', 'stages', 'stages[].authority_action',
        'stages[].clients_100pct', 'stages[].clients_50pct', 'stages[].end', 'stages[].first_valid_after',
        'stages[].gate', 'stages[].relays_100pct', 'stages[].relays_50pct', 'stages[].stage', 'stages[].start',
        'stages[].values', 'stages[].values.KISTSchedRunInterval', 'stages[].vote_deadline',
    ),
    'sim experiment ceiling': (
        'budget_throughput_mbytes_per_s', 'cells_per_run_median', 'cells_per_run_mode', 'circuits', 'duration_s',
        'interval_ms', 'kernel_tick_ms', 'mss_bytes', 'run_period_ms', 'runs_per_s', 'scheduler',
        'throughput_mbytes_per_s',
    ),
    'sim experiment ceiling-path': (
        'cc_alg', 'cells_per_run_median', 'circuits', 'client_interval_ms', 'finished', 'flow_control', 'interval_ms',
        'max_inflight_cells', 'run_period_ms', 'scheduler', 'throughput_mbytes_per_s', 'transfer_bytes',
    ),
    'sim experiment circuit': (
        'cc_alg', 'cells_per_run_median', 'client_interval_ms', 'cpu_core_fraction_max', 'finished', 'flow_control',
        'interval_ms', 'max_inflight_cells', 'run_period_ms', 'scheduler', 'streams', 'throughput_mbytes_per_s',
        'transfer_bytes', 'ttfb_ms', 'ttlb_s',
    ),
    'sim experiment circuit sweep': (
        'points', 'points[].cc_alg', 'points[].cells_per_run_median', 'points[].client_interval_ms',
        'points[].cpu_core_fraction_max', 'points[].finished', 'points[].flow_control', 'points[].interval_ms',
        'points[].max_inflight_cells', 'points[].run_period_ms', 'points[].scheduler', 'points[].streams',
        'points[].throughput_mbytes_per_s', 'points[].transfer_bytes', 'points[].ttfb_ms', 'points[].ttlb_s',
    ),
    'sim experiment ewma': (
        'bulk_circuits', 'client_interval_ms', 'duration_s', 'interactive_circuits', 'points',
        'points[].bulk_delay_ms_mean', 'points[].bulk_delay_ms_p50', 'points[].bulk_kernel_delay_ms_mean',
        'points[].bulk_over_interactive_delay_ratio', 'points[].interactive_delay_ms_mean',
        'points[].interactive_delay_ms_p50', 'points[].interactive_kernel_delay_ms_mean', 'points[].interval_ms',
        'points[].throughput_mbytes_per_s', 'scheduler',
    ),
    'sim experiment kernel-queue': (
        'channels', 'circuits', 'duration_s', 'points', 'points[].app_delay_ms_mean', 'points[].app_delay_ms_p50',
        'points[].interval_ms', 'points[].kernel_delay_ms_mean', 'points[].kernel_delay_ms_p50',
        'points[].kernel_delay_share', 'points[].mean_app_bytes', 'points[].mean_kernel_bytes',
        'points[].peak_app_bytes', 'points[].peak_kernel_bytes', 'points[].scheduler',
        'points[].throughput_mbytes_per_s',
    ),
    'sim experiment kist-first-run': (
        'first_run_cells', 'initial_cwnd_segments', 'mss_bytes', 'next_runs_cells',
    ),
    'status': (
        'authority_health', 'authority_health.authority_outages', 'authority_health.consensus_outages',
        'authority_health.down_since', 'authority_health.last_round', 'authority_health.last_round.consensus',
        'authority_health.last_round.down', 'authority_health.last_round.params',
        'authority_health.last_round.params.KISTSchedRunInterval', 'authority_health.last_round.signed',
        'authority_health.last_round.stale', 'authority_health.last_round.valid_after',
        'authority_health.last_round.voted', 'awaiting_consensus', 'criteria', 'decision_at', 'experiment',
        'extensions', 'metrics', 'mode', 'reasons', 'rollback_kind', 'stage', 'stage_valid_after', 'state', 'summary',
        'values', 'values.KISTSchedRunInterval',
    ),
    'status --watch': (
        'authority_health', 'authority_health.authority_outages', 'authority_health.consensus_outages',
        'authority_health.down_since', 'authority_health.last_round', 'authority_health.last_round.consensus',
        'authority_health.last_round.down', 'authority_health.last_round.params',
        'authority_health.last_round.signed', 'authority_health.last_round.stale',
        'authority_health.last_round.valid_after', 'authority_health.last_round.voted', 'awaiting_consensus',
        'criteria', 'criteria.relay CPU', 'criteria.relay CPU.consecutive_error',
        'criteria.relay CPU.consecutive_success', 'criteria.relay CPU.failed', 'criteria.relay CPU.inconclusive',
        'criteria.relay CPU.latest', 'decision_at', 'experiment', 'extensions', 'metrics', 'mode', 'reasons',
        'rollback_kind', 'stage', 'stage_valid_after', 'state', 'summary', 'values', 'values.KISTSchedRunInterval',
    ),
    'status five down': (
        'authority_health', 'authority_health.authority_outages', 'authority_health.authority_outages[].authority',
        'authority_health.authority_outages[].end', 'authority_health.authority_outages[].ongoing',
        'authority_health.authority_outages[].rounds', 'authority_health.authority_outages[].start',
        'authority_health.consensus_outages', 'authority_health.consensus_outages[].down',
        'authority_health.consensus_outages[].end', 'authority_health.consensus_outages[].last_good',
        'authority_health.consensus_outages[].ongoing', 'authority_health.consensus_outages[].recovered',
        'authority_health.consensus_outages[].rounds', 'authority_health.consensus_outages[].start',
        'authority_health.down_since', 'authority_health.down_since.dannenberg', 'authority_health.down_since.dizum',
        'authority_health.down_since.gabelmoo', 'authority_health.down_since.moria1',
        'authority_health.down_since.tor26', 'authority_health.last_round', 'authority_health.last_round.consensus',
        'authority_health.last_round.down', 'authority_health.last_round.params',
        'authority_health.last_round.signed', 'authority_health.last_round.stale',
        'authority_health.last_round.valid_after', 'authority_health.last_round.voted', 'awaiting_consensus',
        'criteria', 'decision_at', 'experiment', 'extensions', 'metrics', 'mode', 'reasons', 'rollback_kind', 'stage',
        'stage_valid_after', 'state', 'summary', 'values', 'values.KISTSchedRunInterval',
    ),
    'simulate': (
        'achieved_utilisation', 'attack_cpu_s', 'attack_figures', 'attack_figures[].baseline_mean',
        'attack_figures[].high_97_5', 'attack_figures[].label',
        'attack_figures[].leakier', 'attack_figures[].leakier_when', 'attack_figures[].low_2_5',
        'attack_figures[].mean_difference', 'attack_figures[].measure', 'attack_figures[].networks',
        'attack_figures[].stage', 'attack_figures[].stage_mean', 'attack_figures[].unit',
        'bandwidth_scale', 'clients_per_network', 'cpu_s', 'dir', 'duration_s', 'expected_utilisation',
        'figures', 'figures[].change_vs_baseline', 'figures[].high_97_5', 'figures[].low_2_5', 'figures[].median',
        'figures[].metric', 'figures[].networks', 'figures[].relay_class', 'figures[].stage',
        'networks', 'plan', 'probes', 'rates', 'relays_per_network', 'stages', 'wall_s', 'windows_s',
    ),
    'simulate --stored': (
        'attack_figures', 'attack_figures[].baseline_mean', 'attack_figures[].high_97_5', 'attack_figures[].label',
        'attack_figures[].leakier', 'attack_figures[].leakier_when', 'attack_figures[].low_2_5',
        'attack_figures[].mean_difference', 'attack_figures[].measure', 'attack_figures[].networks',
        'attack_figures[].stage', 'attack_figures[].stage_mean', 'attack_figures[].unit',
        'dir', 'figures', 'figures[].change_vs_baseline', 'figures[].high_97_5', 'figures[].low_2_5',
        'figures[].median', 'figures[].metric', 'figures[].networks', 'figures[].relay_class', 'figures[].stage',
        'plan', 'stages',
    ),
    'sweep --check': (
        'axes', 'axes.class_mixes', 'axes.loads', 'axes.loss_rates', 'axes.samples', 'axes.seeds', 'axes.value_sets',
        'cells', 'class_mixes', 'duration_s', 'loads', 'loss_rates', 'name', 'parameters', 'rates', 'samples',
        'scale', 'seeds', 'value_sets', 'value_sets[].KISTSchedRunInterval',
    ),
}


def test_every_document_keeps_its_keys(documents):
    assert sorted(documents) == sorted(SHAPES)
    for name, doc in documents.items():
        assert sorted(paths(doc)) == sorted(SHAPES[name]), name


def test_values_written_by_hand_stay_as_they_were(documents):
    """The few values whose form the serialisers chose: tor's time format and epoch seconds in the watch's
    lines, the fault fields each kind has, ISO times with a Z, the judge's non-finite floats as null; OnionPerf's
    guard times to the microsecond and only those a guard has, the fidelity history's own time form, real tor's
    side written as --real-from reads it, and a simulator figure with no sample (NaN) as null."""
    unreachable, held = documents["held-consensus lines"]
    assert unreachable["valid_after"] is None and unreachable["reachable"] is False
    assert held == {"time": 1803902405.0, "node": "relay003", "reachable": True,
                    "valid_after": "2027-03-01 12:00:00", "params": {KIST: 3}, f"pinned_{KIST}": 7, "problem": ""}
    assert documents["operator faults"] == [{"kind": "slow", "delay_s": 0.5}, {"kind": "refuse-sign"},
                                            {"kind": "down", "mode": "hang"}]
    show = documents["show"]
    assert show["baseline_start"] == "2027-02-22T12:00:00Z"
    assert show["stages"][0]["values"] == {KIST: 2} and show["stages"][0]["relays_50pct"].endswith("Z")
    step_back = documents["rollback --dry-run"][0]
    assert step_back["targets"] == {KIST: 10} and step_back["act_before"].endswith(":00Z")
    compared = documents["judge compare"]
    assert compared["halfwidth_floor"] is None  # NaN in the verdict, null in its JSON
    assert compared["warnings"] and compared["state"]["fractions"] == [1.0]
    assert documents["judge compare state file"]["fractions"] == [1.0]
    assert documents["onionperf guards"] == [
        {"fingerprint": "A" * 40, "nickname": "relay003", "up_ts": 1700000000.123457},
        {"fingerprint": "B" * 40, "nickname": "relay004"}]
    history = documents["fidelity --history"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d)?Z", run["measured_utc"]) for run in history["runs"])
    assert all(isinstance(row["client_interval_ms"], int) for row in history["current"]["rows"])  # never left empty
    real = documents["fidelity --real-from"]
    assert real["rows"][0]["real"] == REAL_REPORT["rows"][0]["real"] and real["machine"] == REAL_REPORT["machine"]
    assert real["rows"][0]["real_run_period_ms_median"] == 12.0 and real["real_stolen_fraction_mean"] == 0.06
    circuit = documents["sim experiment circuit"]
    assert circuit["ttlb_s"] is None and circuit["run_period_ms"] is None
    assert documents["sim experiment circuit sweep"]["points"] == [circuit, circuit]
    assert documents["sim experiment ceiling"]["budget_throughput_mbytes_per_s"] is None
    assert documents["sim experiment ewma"]["points"][0]["bulk_over_interactive_delay_ratio"] == 20.0
    assert documents["sim experiment kernel-queue"]["points"][0]["kernel_delay_ms_mean"] is None
    assert documents["sim experiment kist-first-run"]["next_runs_cells"] == [32, 32, 30]
