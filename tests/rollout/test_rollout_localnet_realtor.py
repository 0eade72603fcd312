"""`kistexp run --authorities local`: a two-stage plan driven through a 3-authority local tor network
(rollout.md §4 "Local real tor"; real-tor.md).

The run makes its own network in EXP/localnet (Debian's tor, 10 s voting rounds, one plan hour per
round), acts by rewriting each authority's params.inc and reloading it through stem's Controller,
verifies by the authorities' next votes and the consensus fetched from their DirPorts, and stops
the network when it ends; killed with SIGKILL, a rerun resumes on the still running network.
Only the processes the tests started are stopped.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import have_real_tor
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.localnet import LocalNetwork, NetworkSpec
from kistexp.localnet.network import free_base_port
from kistexp.rollout.actuator_local import CHANGE_LOG
from kistexp.rollout.journal import Journal
from kistexp.rollout.runs import live_run
from kistexp.rollout.spec import RolloutError
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

pytestmark = [
    pytest.mark.realtor,
    pytest.mark.slow,
    pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor and tor-gencert"),
    pytest.mark.timeout(300),
]

KIST = "KISTSchedRunInterval"
PLAN_AUTHORITIES = ("alpha", "beta", "gamma")  # the plan's names; the network's are auth000..auth002
STAGES = (("two", 2), ("five", 5))


def plan_text() -> str:
    # v3idents and DirPorts are the plan's; the local network has its own, mapped by position
    custom = "".join(f'[[authorities.custom]]\nnickname = "{n}"\nv3ident = "{i:040X}"\n'
                     f'dirport = "127.0.0.1:{9 + i}"\n\n' for i, n in enumerate(PLAN_AUTHORITIES, start=1))
    head, _, _ = VALID_PLAN.partition("[[stages]]")
    stages = "".join(f'[[stages]]\nname = "{name}"\nduration = "3h"\nvalues = {{ {KIST} = {v} }}\n\n'
                     for name, v in STAGES)
    participating = ", ".join(f'"{n}"' for n in PLAN_AUTHORITIES)
    return (head.replace('name = "test-plan"', 'name = "localnet-two-stages"').replace('"7d"', '"2h"')
            + stages + f"[authorities]\nparticipating = [{participating}]\n\n" + custom
            + RELAY_CPU_CRITERION.replace("min_samples = 100", "min_samples = 50"))


def _done_intents(exp) -> int:
    try:
        conn = sqlite3.connect(f"file:{exp / 'experiment.db'}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT COUNT(*) FROM rollout_intents WHERE state = 'done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:  # not made yet
        return 0


def _two_stages_across_a_kill(tmp_path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text())
    preds = tmp_path / "preds"
    write_predictions(preds, {"baseline": {}, "two": {}, "five": {}}).close()
    exp = tmp_path / "exp"

    argv = ["run", str(plan), "--dir", str(exp), "--authorities", "local", "--metrics", "predicted",
            "--predictions", str(preds), "--json"]

    # killed with SIGKILL once stage 1 is in the consensus, the run leaves its tors running ...
    first = subprocess.Popen([sys.executable, "-m", "kistexp", *argv], env=dict(os.environ, PYTHONPATH=os.getcwd()),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _done_intents(exp) < len(PLAN_AUTHORITIES):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read().decode()[-2000:]
            time.sleep(0.5)
    finally:
        first.kill()
        first.wait()
    net = LocalNetwork.load(exp / "localnet")
    assert all(net.is_running(a) for a in net.authorities)

    # ... and the rerun on the same directory attaches to them, finishes the plan and stops them
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["state"] == "COMPLETED"

    j = Journal(exp / "experiment.db", durable=False)
    try:
        intents = j.intents()
        consensuses = {c["valid_after"]: c["params"] for c in j.consensuses()}
        votes = {(v["authority"], v["valid_after"]): v["params"] for v in j.votes()}
    finally:
        j.close()
    # one intent per authority and stage done, acted on the network and verified in that authority's vote;
    # an act that came too late for its round is journaled as a slip (superseded, then done a round later)
    done = [i for i in intents if i["state"] == "done"]
    planned = [(a, {KIST: v}) for _, v in STAGES for a in PLAN_AUTHORITIES]
    assert [(i["authority"], i["desired"]) for i in done] == planned
    for i in intents:
        assert i["state"] in ("done", "superseded"), i
    for i in done:
        evidence = json.loads(i["evidence"])
        # the vote that shows it, and beside it what the actuator did (params.inc, reload, GETCONF) or,
        # for a stage-2 act that landed before the kill, that the rerun found it in place and sent
        # nothing (docs/rollouts.md: a run killed after its change landed does not send it again;
        # the change log below shows it was made exactly once)
        assert evidence["vote"] == {KIST: i["desired"][KIST]}, i
        assert evidence["valid_after"] == i["valid_after"].isoformat(), i
        if evidence["response"] == "already set":
            assert i["desired"][KIST] == STAGES[1][1], i
        else:
            assert "SIGNAL RELOAD" in evidence["response"], i
            assert f"{KIST}={i['desired'][KIST]}" in evidence["response"], i
        # the consensus of the intent's valid-after, fetched and signature-checked, carries the stage's value
        assert consensuses[i["valid_after"]] == {KIST: i["desired"][KIST]}
        assert votes[(i["authority"], i["valid_after"])] == {KIST: i["desired"][KIST]}
    # each stage's intents target one consensus, later than the one before
    targets = [sorted({i["valid_after"] for i in done if i["desired"][KIST] == v}) for _, v in STAGES]
    assert all(len(t) == 1 for t in targets) and targets[0][0] < targets[1][0]

    # the network: each params.inc rewritten once per stage (no action lost or repeated), stopped at the end
    net = LocalNetwork.load(exp / "localnet")
    log = [json.loads(line) for line in (net.root / CHANGE_LOG).read_text().splitlines()]
    assert [(e["authority"], e["node"], e["new"]) for e in log] == [
        (a, f"auth00{k}", {KIST: v}) for _, v in STAGES for k, a in enumerate(PLAN_AUTHORITIES)]
    assert [dict(net.params(a)) for a in net.authorities] == [{KIST: 5}] * 3
    assert net.status()["running"] == 0


def test_two_stages_reach_the_local_votes_and_consensus_across_a_kill(tmp_path) -> None:
    try:
        _two_stages_across_a_kill(tmp_path)
    finally:  # whatever failed: the tors the run started are stopped (a no-op after a run that ended)
        if (tmp_path / "exp" / "localnet" / "network.json").exists():
            LocalNetwork.load(tmp_path / "exp" / "localnet").stop()


def test_attaching_to_a_network_of_another_size_is_refused_and_leaves_it_running(tmp_path) -> None:
    spec = NetworkSpec(authorities=1, relays=0, exits=0, clients=0, base_port=free_base_port(1),
                       consensus_params=(((KIST, 10),),))
    net = LocalNetwork.create(tmp_path / "net", spec)
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_text())
    try:
        net.start()
        with pytest.raises(RolloutError, match=r"the plan configures 3 authorities, the local network 1 \(auth000\)"):
            live_run(plan, tmp_path / "exp", "local", localnet=net.root)
        assert net.is_running(net.node("auth000"))  # the user's network: not the run's to stop
        with pytest.raises(RolloutError, match="--localnet .*nothing: no local tor network there"):
            live_run(plan, tmp_path / "exp", "local", localnet=tmp_path / "nothing")
    finally:
        net.stop()


def test_actuator_sets_the_whole_line_verifies_it_in_the_vote_and_touches_nothing_of_a_stopped_tor(tmp_path) -> None:
    from kistexp.clock import RealClock
    from kistexp.rollout.actuator_local import LocalTorActuator, local_cadence
    from kistexp.rollout.actuators import ActuationError, Intent

    spec = NetworkSpec(authorities=1, relays=0, exits=0, clients=0, base_port=free_base_port(1),
                       consensus_params=(((KIST, 10), ("ptwo", 4)),))
    net = LocalNetwork.create(tmp_path / "net", spec)
    clock = RealClock()
    cadence = local_cadence(spec.voting_interval_s, spec.vote_delay_s)
    try:
        net.start()
        first = net.wait_for_consensus(timeout_s=45)
        with net.directory_client(retries=1) as client:
            act = LocalTorActuator(net, client, clock, {"alpha": "auth000"}, cadence)
            assert act.current("alpha") == {KIST: 10, "ptwo": 4}  # GETCONF ConsensusParams
            response = act.apply(Intent("alpha", {KIST: 3, "ptwo": 4}, "test:1:alpha"))
            assert "GETCONF ConsensusParams=KISTSchedRunInterval=3 ptwo=4" in response
            assert act.current("alpha") == {KIST: 3, "ptwo": 4}
            # the first round whose vote is built after the reload lists it, and so does its consensus
            va = cadence.next_feasible_va(clock.now())
            clock.sleep_until(va - dt.timedelta(seconds=cadence.lead_s - 1))
            assert act.fetch_vote("alpha", va) == {KIST: 3, "ptwo": 4}
            clock.sleep_until(va)
            params, signers = act.fetch_consensus(va)
            assert (params, signers) == ({KIST: 3, "ptwo": 4}, ["alpha"])
            assert act.held_at(va) == ({KIST: 3, "ptwo": 4}, [])
            assert act.held_at(first.valid_after - dt.timedelta(seconds=1)) == (None, [])

            net.stop_node("auth000")
            params_inc = (Path(net.node("auth000").data_dir) / "params.inc").read_text()
            assert act.current("alpha") is None
            with pytest.raises(ActuationError, match=r"alpha \(auth000\): tor is not running"):
                act.apply(Intent("alpha", {KIST: 2}, "test:2:alpha"))
            assert (Path(net.node("auth000").data_dir) / "params.inc").read_text() == params_inc
        log = [json.loads(line) for line in (net.root / CHANGE_LOG).read_text().splitlines()]
        assert [(e["old"], e["new"], e["idem_key"]) for e in log] == [
            ({KIST: 10, "ptwo": 4}, {KIST: 3, "ptwo": 4}, "test:1:alpha")]
    finally:
        net.stop()
