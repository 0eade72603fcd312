"""Nodes of a local network and their torrc files (real-tor.md, "torrc templates").

Every node's torrc %includes the shared ``authorities.inc`` (the DirAuthority lines); an
authority's also %includes its own ``params.inc`` so ConsensusParams can be rewritten and
picked up with SIGHUP (real-tor.md, problem 6).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from kistexp.dirauth.paramsline import format_params
from kistexp.localnet.spec import LOOPBACK, PORT_STRIDE, SERVICE_ADDRESS, NetworkSpec, ParamItems

_PREFIX = {"authority": "auth", "relay": "relay", "exit": "exit", "client": "client"}


@attrs.frozen
class Node:
    """One tor process of the network. Ports follow real-tor.md's layout; a client has no
    ORPort/DirPort, servers no SocksPort."""

    index: int
    role: str
    nickname: str
    data_dir: str
    or_port: int
    dir_port: int
    control_port: int
    metrics_port: int
    socks_port: int

    @property
    def is_server(self) -> bool:
        return self.role != "client"

    @property
    def torrc(self) -> Path:
        return Path(self.data_dir) / "torrc"

    @property
    def dir_url(self) -> str:
        return f"http://{LOOPBACK}:{self.dir_port}"

    def listen_ports(self) -> tuple[tuple[str, int], ...]:
        """(what, port) of every listener this node opens on 127.0.0.1."""
        ports = [("ControlPort", self.control_port), ("MetricsPort", self.metrics_port)]
        if self.is_server:
            ports = [("ORPort", self.or_port), ("DirPort", self.dir_port), *ports]
        else:
            ports.append(("SocksPort", self.socks_port))
        return tuple(ports)


def layout(spec: NetworkSpec, root: Path) -> tuple[Node, ...]:
    """The nodes of ``spec`` in port order: authorities, relays, exits, clients."""
    nodes = []
    base = spec.base_port
    for index, role in enumerate(spec.roles()):
        nick = f"{_PREFIX[role]}{index:03d}"
        nodes.append(
            Node(
                index=index,
                role=role,
                nickname=nick,
                data_dir=str(root / nick),
                or_port=base + index,
                dir_port=base + PORT_STRIDE + index,
                control_port=base + 2 * PORT_STRIDE + index,
                metrics_port=base + 3 * PORT_STRIDE + index,
                socks_port=base + 4 * PORT_STRIDE + index,
            )
        )
    return tuple(nodes)


def authority_line(node: Node, v3ident: str, fingerprint: str) -> str:
    return (
        f"DirAuthority {node.nickname} orport={node.or_port} no-v2 v3ident={v3ident} "
        f"{LOOPBACK}:{node.dir_port} {fingerprint}"
    )


def params_include(params: ParamItems) -> str:
    """Content of an authority's params.inc: one ConsensusParams line, or none at all (the
    authority then votes an empty params line, real-tor.md)."""
    if not params:
        return "# no ConsensusParams: this authority votes an empty params line\n"
    return f"ConsensusParams {format_params(params)}\n"


def log_values(node: Node, sched_debug: bool) -> tuple[str, ...]:
    """The node's ``Log`` option values; ``sched_debug`` adds the scheduler's debug messages
    (only the [sched] domain: a full debug log slows a busy relay down)."""
    d = node.data_dir
    values = [f"notice file {d}/notice.log", f"info file {d}/info.log"]
    if sched_debug:
        values.append(f"[sched]debug file {d}/sched.log")
    return tuple(values)


def sched_log(node: Node) -> Path:
    return Path(node.data_dir) / "sched.log"


def render_torrc(node: Node, spec: NetworkSpec, root: Path) -> str:
    d = node.data_dir
    lines = [
        "# written by kistexp localnet; edit params.inc (authorities) and send SIGHUP",
        "TestingTorNetwork 1",
        f"DataDirectory {d}",
        f"PidFile {d}/pid",
        "RunAsDaemon 1",
        f"Nickname {node.nickname}",
        *(f"Log {value}" for value in log_values(node, spec.sched_debug)),
    ]
    lines += [
        "SafeLogging 0",
        "LogTimeGranularity 1",
        "ProtocolWarnings 1",
        "ShutdownWaitLength 0",
        "AssumeReachable 1",
        "PathsNeededToBuildCircuits 0.25",
        "TestingDirAuthVoteExit *",
        "TestingDirAuthVoteGuard *",
        "TestingDirAuthVoteHSDir *",
        "TestingMinExitFlagThreshold 0",
        "V3AuthNIntervalsValid 2",
        f"ControlPort {LOOPBACK}:{node.control_port}",
        "CookieAuthentication 1",
        f"MetricsPort {LOOPBACK}:{node.metrics_port}",
        f"MetricsPortPolicy accept {LOOPBACK}",
        f"ServerDNSResolvConfFile {d}/resolv.conf",
        "ServerDNSDetectHijacking 0",
        "ClientUseIPv6 0",
        f"%include {root}/authorities.inc",
    ]
    if node.is_server:
        lines += [
            f"Address {LOOPBACK}",
            f"ORPort {LOOPBACK}:{node.or_port}",
            f"DirPort {LOOPBACK}:{node.dir_port}",
            "SocksPort 0",
            f"ContactInfo {node.nickname}@test.invalid",
        ]
    if node.role == "authority":
        interval = spec.voting_interval_s
        delay = spec.vote_delay_s
        lines += [
            "AuthoritativeDirectory 1",
            "V3AuthoritativeDirectory 1",
            "TestingV3AuthInitialVotingInterval 5",
            f"V3AuthVotingInterval {interval}",
            "TestingV3AuthInitialVoteDelay 2",
            f"V3AuthVoteDelay {delay}",
            "TestingV3AuthInitialDistDelay 2",
            f"V3AuthDistDelay {delay}",
            # Stable for every relay from the start: the Stable threshold is a median of
            # uptimes, so without this some relays lack it, and clients never sample a
            # relay without Stable as a guard (a pinned EntryNodes path then fails).
            "AuthDirVoteStableGuaranteeMinUptime 0",
            "AuthDirVoteStableGuaranteeMTBF 0",
            "ExitRelay 0",
            "ExitPolicy reject *:*",
            f"%include {d}/params.inc",
        ]
    elif node.role == "relay":
        lines += ["ExitRelay 0", "ExitPolicy reject *:*"]
    elif node.role == "exit":
        lines += [
            "ExitRelay 1",
            "ExitPolicyRejectPrivate 0",
            "ExitPolicyRejectLocalInterfaces 0",
            "ExitPolicy accept 127.0.0.0/8:*",
            # Policy summaries ignore private addresses, so without this clients never pick
            # the exit for the service (real-tor.md problem 1, tor#11264). Only loopback
            # targets are ever requested.
            f"ExitPolicy accept *:{spec.service_port}",
            "ExitPolicy reject *:*",
        ]
    else:
        lines += [
            f"SocksPort {LOOPBACK}:{node.socks_port}",
            # One circuit per stream; conflux would pair legs over the pinned path (problem 4).
            "ConfluxEnabled 0",
            # A fixed circuit build timeout: after 100 loopback builds of a few ms, tor's
            # learned timeout (circuit_build_times_set_timeout(), circuitstats.c) falls to
            # about 100 ms; a build on a machine busy with the measured transfers then times
            # out, and once more than MAX_CIRCUIT_FAILURES (5) fail in a NewCircuitPeriod tor
            # launches none for the rest of it (circuit_launch_by_extend_info(), circuituse.c),
            # so a new stream waits a minute or more for its circuit.
            "LearnCircuitBuildTimeout 0",
            "CircuitBuildTimeout 60",
        ]
    extra = spec.options_for(node.role)
    if extra:
        lines.append("# options for this role")
        lines += list(extra)
    return "\n".join(lines) + "\n"


__all__ = [
    "Node", "SERVICE_ADDRESS", "authority_line", "layout", "log_values", "params_include", "render_torrc", "sched_log",
]
