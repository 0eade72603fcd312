"""Local tor network without tor: spec checks, torrc content (real-tor.md templates and
pitfalls), state file, process safety and CLI errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kistexp.errors import LocalNetError
from kistexp.localnet import LocalNetwork, NetworkSpec, parse_params_arg, procs, scheduler_options
from kistexp.localnet.network import free_base_port
from kistexp.localnet.spec import spec_to_json, spec_with_options
from kistexp.localnet.torrc import layout, params_include, render_torrc


def _spec(**kw) -> NetworkSpec:
    base = dict(authorities=3, relays=2, exits=1, clients=1, base_port=15000)
    base.update(kw)
    return NetworkSpec(**base)


def test_port_layout_follows_real_tor_md(tmp_path: Path) -> None:
    nodes = layout(_spec(), tmp_path)
    assert [n.nickname for n in nodes] == ["auth000", "auth001", "auth002", "relay003", "relay004", "exit005",
                                           "client006"]
    exit_ = nodes[5]
    assert (exit_.or_port, exit_.dir_port, exit_.control_port, exit_.metrics_port, exit_.socks_port) == (
        15005, 15105, 15205, 15305, 15405)
    assert _spec().service_port == 15500
    # clients listen on SocksPort/ControlPort/MetricsPort only; servers have no SocksPort
    assert [w for w, _ in nodes[6].listen_ports()] == ["ControlPort", "MetricsPort", "SocksPort"]
    assert [w for w, _ in nodes[0].listen_ports()] == ["ORPort", "DirPort", "ControlPort", "MetricsPort"]


def test_torrcs_carry_the_known_fixes(tmp_path: Path) -> None:
    spec = spec_with_options(_spec(sched_debug=True), {"all": scheduler_options("kistlite", 10),
                                                       "client": ["KISTSchedRunInterval 2 msec"]})
    nodes = layout(spec, tmp_path)
    auth, relay, exit_, client = (render_torrc(nodes[i], spec, tmp_path) for i in (0, 3, 5, 6))
    for text in (auth, relay, exit_, client):
        assert "TestingTorNetwork 1\n" in text
        assert "ShutdownWaitLength 0\n" in text
        assert f"%include {tmp_path}/authorities.inc\n" in text
        assert "Schedulers KISTLite\n" in text and "KISTSchedRunInterval 10 msec\n" in text
        assert "[sched]debug file" in text
    assert f"%include {tmp_path}/auth000/params.inc\n" in auth
    assert "V3AuthVotingInterval 10\n" in auth and "V3AuthVoteDelay 2\n" in auth
    assert "ExitPolicy reject *:*" in relay and "ExitRelay 0" in relay
    # problem 1: an accept on the service port, since private-address accepts are not summarised
    assert "ExitPolicy accept *:15500\n" in exit_
    assert exit_.index("ExitPolicy accept *:15500") < exit_.index("ExitPolicy reject *:*")
    # problem 4: one circuit per stream on clients
    assert "ConfluxEnabled 0\n" in client and "SocksPort 127.0.0.1:15406\n" in client
    assert "KISTSchedRunInterval 2 msec" in client and "KISTSchedRunInterval 2 msec" not in relay
    assert "ConfluxEnabled" not in relay and "ORPort" not in client
    # a fixed build timeout: a learned one of ~100 ms stalls new circuits on a busy machine
    assert "LearnCircuitBuildTimeout 0\n" in client and "CircuitBuildTimeout 60\n" in client


def test_voting_interval_sets_delays() -> None:
    assert _spec().vote_delay_s == 2
    assert _spec(voting_interval_s=60).vote_delay_s == 12  # 12 + 12 < 30
    with pytest.raises(LocalNetError, match="below tor's minimum of 10 s"):
        _spec(voting_interval_s=5)


def test_params_include_and_parsing() -> None:
    items = parse_params_arg("ptwo=4 KISTSchedRunInterval=2,pone=-1")
    assert items == (("KISTSchedRunInterval", 2), ("pone", -1), ("ptwo", 4))
    assert params_include(items) == "ConsensusParams KISTSchedRunInterval=2 pone=-1 ptwo=4\n"
    assert not any(ln.startswith("ConsensusParams") for ln in params_include(()).splitlines())
    with pytest.raises(LocalNetError, match="outside the int32 range"):
        parse_params_arg("x=2147483648")
    with pytest.raises(LocalNetError, match="given twice"):
        parse_params_arg("x=1 x=2")
    with pytest.raises(LocalNetError, match="not key=value"):
        parse_params_arg("x")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"authorities": 0}, "at least 1 authority"),
        ({"relays": -1}, "--relays must be >= 0"),
        ({"relays": 96}, "do not fit the port layout"),
        ({"base_port": 80}, "base port 80"),
        ({"consensus_params": ((), (), (), ())}, "given for 4 authorities"),
        ({"role_options": (("bridge", "Foo 1"),)}, "target 'bridge'"),
        ({"role_options": (("all", "Foo 1\nBar 2"),)}, "not one 'Key value' line"),
    ],
)
def test_bad_specs_are_one_line_errors(kw: dict, message: str) -> None:
    with pytest.raises(LocalNetError, match=message) as info:
        _spec(**kw)
    assert "\n" not in str(info.value)


def test_scheduler_options_bounds() -> None:
    assert scheduler_options("vanilla") == ("Schedulers Vanilla",)
    assert scheduler_options("KIST", 1) == ("Schedulers KIST", "KISTSchedRunInterval 1 msec")
    with pytest.raises(LocalNetError, match="not one of KIST, KISTLite, Vanilla"):
        scheduler_options("fifo")
    with pytest.raises(LocalNetError, match="outside tor's torrc range 1..100"):
        scheduler_options("KIST", 101)


def test_state_round_trip_and_damaged_state(tmp_path: Path) -> None:
    spec = _spec(consensus_params=((("KISTSchedRunInterval", 2),),))
    net = LocalNetwork(tmp_path, spec, {"pids": {"auth000": 999999}, "params": {}, "keys": {}})
    net._save()
    again = LocalNetwork.load(tmp_path)
    assert again.spec == spec and again.pid(again.node("auth000")) == 999999
    assert again.node(1).nickname == "auth001" and again.node("exit005").role == "exit"
    assert json.loads((tmp_path / "network.json").read_text())["spec"] == json.loads(json.dumps(spec_to_json(spec)))
    with pytest.raises(LocalNetError, match="no node named 'nobody'"):
        again.node("nobody")
    with pytest.raises(LocalNetError, match="index 3 is out of range"):
        again.node(3)
    # a recorded pid that is not our tor is never signalled and is reported as such
    assert not again.is_running(again.node("auth000"))
    (tmp_path / "network.json").write_text("{not json")
    with pytest.raises(LocalNetError, match="cannot read the network state"):
        LocalNetwork.load(tmp_path)
    with pytest.raises(LocalNetError, match="no local network there"):
        LocalNetwork.load(tmp_path / "elsewhere")


def test_only_our_processes_are_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        torrc = tmp_path / "torrc"
        assert not procs.is_our_tor(stranger.pid, torrc)
        assert not procs.signal_ours(stranger.pid, torrc, signal.SIGTERM)
        outcome = procs.terminate([(stranger.pid, torrc), (1, torrc)], timeout_s=0.5)
        assert outcome == {stranger.pid: "not ours", 1: "not ours"}
        assert stranger.poll() is None  # still alive
    finally:
        stranger.kill()
        stranger.wait()
    assert procs.cmdline(stranger.pid) is None
    assert procs.terminate([(stranger.pid, tmp_path / "torrc")]) == {stranger.pid: "not running"}


def test_a_tor_that_exits_as_it_is_stopped_is_not_running(tmp_path: Path, monkeypatch) -> None:
    # our tor's command line is read, then it exits before the signal: it is reported as gone, not as
    # somebody else's process (its command line is read once)
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it: kill() finds none
    torrc = tmp_path / "torrc"
    readings = iter([["/usr/bin/tor", "-f", str(torrc)]])
    monkeypatch.setattr(procs, "cmdline", lambda pid: next(readings, None))
    assert procs.terminate([(gone, torrc)], timeout_s=0.5) == {gone: "not running"}


def test_a_process_in_the_middle_of_exec_is_alive_and_not_ours(tmp_path: Path, monkeypatch) -> None:
    # Popen returns once the child's close-on-exec pipe closes, which the kernel does before it
    # sets up the new argv: a loaded machine can show the fresh child with an empty command line.
    # A process that is exiting (PF_EXITING in its stat flags) shows none either: that one is gone.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    real_path = procs.Path
    stat = real_path(f"/proc/{stranger.pid}/stat").read_text()
    head, rest = stat.rsplit(")", 1)
    fields = rest.split()
    fields[6] = str(int(fields[6]) | procs.PF_EXITING)
    (tmp_path / "empty_cmdline").write_bytes(b"")
    (tmp_path / "exiting_stat").write_text(f"{head}) {' '.join(fields)}\n")
    exiting = False

    def no_argv(name: str):
        if name == f"/proc/{stranger.pid}/cmdline":
            return tmp_path / "empty_cmdline"
        if exiting and name == f"/proc/{stranger.pid}/stat":
            return tmp_path / "exiting_stat"
        return real_path(name)

    try:
        monkeypatch.setattr(procs, "Path", no_argv)
        assert procs.cmdline(stranger.pid) == []
        assert procs.terminate([(stranger.pid, tmp_path / "torrc")], timeout_s=0.5) == {stranger.pid: "not ours"}
        assert stranger.poll() is None
        exiting = True
        assert procs.cmdline(stranger.pid) is None
        assert procs.terminate([(stranger.pid, tmp_path / "torrc")], timeout_s=0.5) == {stranger.pid: "not running"}
    finally:
        stranger.kill()
        stranger.wait()


def test_port_checks_and_free_base_port() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert procs.port_in_use("127.0.0.1", port)
    base = free_base_port(7, start=21000)
    assert base >= 21000 and not procs.port_in_use("127.0.0.1", base)


def test_poll_is_bounded() -> None:
    t0 = time.monotonic()
    with pytest.raises(LocalNetError, match="timed out after 0.3 s waiting for nothing"):
        procs.poll("nothing", lambda: False, timeout_s=0.3, interval_s=0.05)
    assert time.monotonic() - t0 < 2
    assert procs.poll("x", lambda: 42, timeout_s=1) == 42


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "kistexp", "localnet", "status", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"kistexp: error: {tmp_path / 'network.json'} not found: no local network there "
        "(run 'kistexp localnet up')"
    ]


def test_cli_param_argument_errors(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kistexp.cli import app

    result = CliRunner().invoke(app, ["localnet", "up", str(tmp_path / "n"), "--param", "7=KIST=2"])
    assert isinstance(result.exception, LocalNetError)
    assert "no authority '7' among 3" in str(result.exception)
    result = CliRunner().invoke(app, ["localnet", "up", str(tmp_path / "n"), "--interval", "5s"])
    assert isinstance(result.exception, LocalNetError)
    assert not (tmp_path / "n" / "network.json").exists()


def test_waiting_on_a_stopped_network_fails_at_once(tmp_path: Path) -> None:
    net = LocalNetwork(tmp_path, _spec(), {"pids": {}, "params": {}, "keys": {}})
    t0 = time.monotonic()
    with pytest.raises(LocalNetError, match="is not running"):
        net.wait_for_consensus(timeout_s=30)
    assert time.monotonic() - t0 < 1


def test_the_port_search_starts_where_the_environment_says(monkeypatch) -> None:
    from kistexp.errors import LocalNetError
    from kistexp.localnet.network import search_start

    monkeypatch.setenv("KISTEXP_LOCALNET_BASE_PORT", "23000")
    assert search_start() == 23000 and free_base_port(3) >= 23000
    for bad in ("80", "1_0", "x", "70000"):
        monkeypatch.setenv("KISTEXP_LOCALNET_BASE_PORT", bad)
        with pytest.raises(LocalNetError, match="KISTEXP_LOCALNET_BASE_PORT"):
            search_start()
    monkeypatch.delenv("KISTEXP_LOCALNET_BASE_PORT")
    assert search_start() == 15000


def test_core_wait_is_read_from_the_kernel_account() -> None:
    """Two busy processes sharing one core each wait for it about half the time they are busy;
    a process that is gone has no account."""
    core = min(os.sched_getaffinity(0))  # a core this process may use (a cpuset need not hold core 0)
    busy = (f"import os, sys, time\nos.sched_setaffinity(0, {{{core}}})\nend = time.monotonic() + 0.8\n"
            "while time.monotonic() < end: pass\nsys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.read()")
    kids = [subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        for kid in kids:
            assert kid.stdout.readline() == "done\n"
        waits = [procs.core_wait_seconds(kid.pid) for kid in kids]
    finally:
        for kid in kids:
            kid.communicate("")
    if None in waits:
        pytest.skip("this kernel keeps no schedstat account")
    # 0.8 s of spinning each on one core: together about 0.8 s of waiting, split between them
    assert 0.4 <= sum(waits) <= 2.0, waits
    assert procs.core_wait_seconds(kids[0].pid) is None
