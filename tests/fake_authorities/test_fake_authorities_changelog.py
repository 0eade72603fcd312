"""The fake authorities' change log (rollout.md §3.10, §4): one entry per state change with its
Idempotency-Key, repeated keys and unchanged PUTs are no-ops, and the log is written ahead of
consensus-params.json so a kill between the two loses nothing."""

import json

from fake_authorities import FakeAuthorityNetwork


def _net(state):
    return FakeAuthorityNetwork(count=3, interval_s=60, port=0, listen=False, state_dir=state,
                                key_bits=(1024, 1024)).start()


def test_changes_are_logged_once_with_their_key_and_survive_a_restart(tmp_path):
    state = tmp_path / "fa"
    net = _net(state)
    try:
        name = net.names[0]
        net.set_params(name, "KISTSchedRunInterval=2", "key-1")
        net.set_params(name, "KISTSchedRunInterval=5", "key-1")  # a repeated key: no-op
        net.set_params(name, "KISTSchedRunInterval=2", "key-2")  # no change: no-op
        assert [(c["authority"], c["old"], c["new"], c["idempotency_key"]) for c in net.changes] == [
            (name, [], ["KISTSchedRunInterval=2"], "key-1")]
        assert net.authority(name).consensus_params == ("KISTSchedRunInterval=2",)
    finally:
        net.stop()
    # killed after the log line, before consensus-params.json: the restart replays the log
    log = state / "changes.jsonl"
    with open(log, "a") as fh:
        fh.write(json.dumps({"at": 0, "authority": name, "old": ["KISTSchedRunInterval=2"],
                             "new": ["KISTSchedRunInterval=8"], "idempotency_key": "key-3"}) + "\n")
        fh.write('{"at": 1, "authority": "cut short by the ki')  # never acknowledged
    net = _net(state)
    try:
        assert net.authority(name).consensus_params == ("KISTSchedRunInterval=8",)
        assert [c["idempotency_key"] for c in net.changes] == ["key-1", "key-3"]
        net.set_params(name, "KISTSchedRunInterval=8", "key-3")
        assert len(net.changes) == 2
        saved = json.loads((state / "consensus-params.json").read_text())
        assert saved[name] == ["KISTSchedRunInterval=8"]
        net.set_params(name, "KISTSchedRunInterval=3", "key-4")  # appended after the cut line was dropped
    finally:
        net.stop()
    assert [json.loads(line)["idempotency_key"] for line in log.read_text().splitlines()] == ["key-1", "key-3", "key-4"]
