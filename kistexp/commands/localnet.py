"""`kistexp localnet up|wait|status|params|down DIR`: a private tor network on loopback."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import typer

from kistexp.asciinum import ascii_uint
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import LocalNetError
from kistexp.localnet import LocalNetwork, NetworkSpec, parse_params_arg
from kistexp.localnet.spec import DEFAULT_BASE_PORT
from kistexp.output import add_row, emit_json, make_table, print_table, say

localnet_app = typer.Typer(
    help="Run a private tor network (Debian's tor) on 127.0.0.1: authorities, relays, exits, clients.",
    no_args_is_help=True,
)

DirArg = typer.Argument(..., help="Network directory (keys, torrcs, logs, network.json).")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")
MAX_WAIT_S = 3600.0  # no wait in localnet needs more than an hour; NaN, inf and negatives are refused


def _seconds(value: float, option: str = "--timeout") -> float:
    """A wait in seconds: finite and within (0, MAX_WAIT_S] (NaN would wait for ever, a negative not at all)."""
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise LocalNetError(f"{option} {value!r}: expected seconds in (0, {MAX_WAIT_S:g}]")
    return value


def _interval_seconds(text: str) -> int:
    raw = text.strip().lower()
    factor = 60 if raw.endswith("m") and not raw.endswith("ms") else 1
    raw = raw.removesuffix("s").removesuffix("m") if factor == 60 else raw.removesuffix("s")
    seconds = ascii_uint(raw)
    if seconds is None:
        raise LocalNetError(f"--interval {text[:40]!r}: expected seconds such as 10s or 20")
    return seconds * factor


def _param_args(values: list[str], n_authorities: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """``AUTH=k=v`` (AUTH an authority index or nickname like auth001), repeatable."""
    per_auth: dict[int, list[str]] = {}
    for value in values:
        auth, sep, rest = value.partition("=")
        if not sep:
            raise LocalNetError(f"--param {value!r}: expected AUTH=key=value, e.g. 0=KISTSchedRunInterval=2")
        digits = auth[4:] if auth.startswith("auth") else auth
        index = ascii_uint(digits)
        index = -1 if index is None else index
        if not 0 <= index < n_authorities:
            raise LocalNetError(
                f"--param {value!r}: no authority {auth!r} among {n_authorities} (0..{n_authorities - 1})"
            )
        per_auth.setdefault(index, []).append(rest)
    params = []
    for i in range(max(per_auth, default=-1) + 1):
        params.append(parse_params_arg(" ".join(per_auth.get(i, [])), where=f"--param for authority {i}"))
    return tuple(params)


def _print_status(status: dict) -> None:
    table = make_table(f"local tor network {status['root']}", (
        "node", "role", "pid", "running", "ORPort", "DirPort", "ControlPort", "SocksPort", "ConsensusParams"))
    for n in status["nodes"]:
        add_row(
            table, n["nickname"], n["role"], str(n["pid"] or "-"), "yes" if n["running"] else "no",
            str(n["or_port"] or "-"), str(n["dir_port"] or "-"), str(n["control_port"]),
            str(n["socks_port"] or "-"), n.get("consensus_params", ""),
        )
    print_table(table)
    cons = status["consensus"]
    if cons:
        va = cons["valid_after"]
        va = va.strftime("%Y-%m-%d %H:%M:%S") if isinstance(va, dt.datetime) else va
        say(f"consensus valid-after {va} from {cons['served_by']}: {cons['relays']} relays, "
            f"{cons['signatures']} signatures")
        say(f"params {cons['params'] or '(empty)'}")
    else:
        say("no consensus served yet" if status["running"] else "network is not running")
    say(f"bulk-service address for fidelity runs: {status['service']}")


@localnet_app.command("up")
def up(
    directory: Path = DirArg,
    authorities: int = typer.Option(3, "--authorities", help="Directory authorities (3-5 typical)."),
    relays: int = typer.Option(2, "--relays", help="Non-exit relays."),
    exits: int = typer.Option(1, "--exits", help="Exit relays."),
    clients: int = typer.Option(1, "--clients", help="Clients (SocksPort BASE+400+n)."),
    base_port: int = typer.Option(DEFAULT_BASE_PORT, "--base-port", help="ORPort of node 0; see docs/localnet.md."),
    interval: str = typer.Option("10s", "--interval", help="V3AuthVotingInterval (>= 10s)."),
    param: list[str] = typer.Option([], "--param", help="AUTH=key=value ConsensusParams item; repeatable."),
    sched_debug: bool = typer.Option(False, "--sched-debug", help="Log the scheduler at debug level (sched.log)."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for relays before starting clients."),
    json_out: bool = JsonOpt,
) -> None:
    """Create (if needed) and start the network; clients start once the consensus lists every relay."""
    timeout = _seconds(timeout)
    if (directory / "network.json").exists():
        net = LocalNetwork.load(directory)
    else:
        spec = NetworkSpec(
            authorities=authorities, relays=relays, exits=exits, clients=clients, base_port=base_port,
            voting_interval_s=_interval_seconds(interval), consensus_params=_param_args(param, authorities),
            sched_debug=sched_debug,
        )
        if not json_out:
            say(f"creating keys and torrcs for {spec.node_count} nodes in {directory}", err=True)
        net = LocalNetwork.create(directory, spec)
    if not json_out:
        say("starting tor processes", err=True)
    net.start(consensus_timeout_s=timeout)
    status = net.status()
    if json_out:
        emit_json(status)
    else:
        _print_status(status)


@localnet_app.command("wait")
def wait(
    directory: Path = DirArg,
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait at most."),
    newer_than: str = typer.Option("", "--newer-than", help="Wait for a valid-after later than this (UTC)."),
    json_out: bool = JsonOpt,
) -> None:
    """Poll the authorities' DirPorts until a consensus is served."""
    net = LocalNetwork.load(directory)
    after = None
    if newer_than:
        try:
            after = dt.datetime.fromisoformat(newer_than.replace("Z", "+00:00").replace(" ", "T"))
        except ValueError:
            raise LocalNetError(f"--newer-than {newer_than!r}: expected 'YYYY-MM-DD HH:MM:SS'") from None
        after = after if after.tzinfo else after.replace(tzinfo=dt.timezone.utc)
    doc = net.wait_for_consensus(_seconds(timeout), newer_than_valid_after=after)
    if json_out:
        emit_json(doc.summary())
    else:
        say(f"consensus valid-after {doc.valid_after:%Y-%m-%d %H:%M:%S} from {doc.served_by}: "
            f"{doc.relays} relays, {doc.signatures} signatures")
        say("params " + (ConsensusParams(doc.params).format() or "(empty)"))


@localnet_app.command("status")
def status(directory: Path = DirArg, json_out: bool = JsonOpt) -> None:
    """Processes, ports, configured ConsensusParams and the current consensus."""
    result = LocalNetwork.load(directory).status()
    if json_out:
        emit_json(result)
    else:
        _print_status(result)


@localnet_app.command("params")
def params(
    directory: Path = DirArg,
    authority: str = typer.Argument(..., help="Authority nickname (auth001) or index (0-based)."),
    items: str = typer.Argument(..., help="ConsensusParams as 'k=v k2=v2' ('' for none)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the authority's first vote after the reload."),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Seconds to wait for that vote (default: two voting intervals + 10 s)."),
    json_out: bool = JsonOpt,
) -> None:
    """Rewrite an authority's ConsensusParams (params.inc), send it SIGHUP and confirm its next vote.

    A line tor could not vote with (AuthDirMaxServersPerAddr, which tor appends itself; a duplicate key; a
    value outside int32) is refused before anything is written."""
    net = LocalNetwork.load(directory)
    node = net.node(authority)
    limit = None
    if wait:
        limit = net.confirm_timeout() if timeout is None else _seconds(timeout)
        if not json_out and net.is_running(node):
            say(f"{node.nickname}: waiting up to {limit:g} s for its first vote after the reload", err=True)
    vote = net.set_consensus_params(authority, items, confirm_timeout_s=limit)
    result = {"authority": node.nickname, "consensus_params": ConsensusParams(net.params(node)).format(),
              "reloaded": net.is_running(node),
              "vote_confirmed": None if vote is None else {"valid_after": vote.valid_after,
                                                           "params": ConsensusParams(vote.params).format()}}
    if json_out:
        emit_json(result)
        return
    if vote is not None:
        say(f"{node.nickname}: ConsensusParams {result['consensus_params'] or '(none)'}; SIGHUP sent; its vote "
            f"for {vote.valid_after:%Y-%m-%d %H:%M:%S} lists them. It reaches the consensus one or two voting "
            "periods later.")
    else:
        say(f"{node.nickname}: ConsensusParams {result['consensus_params'] or '(none)'}"
            + ("; SIGHUP sent. It reaches the consensus one or two voting periods later." if result["reloaded"]
               else "; not running, used when it starts."))


@localnet_app.command("down")
def down(
    directory: Path = DirArg,
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds before SIGKILL."),
    json_out: bool = JsonOpt,
) -> None:
    """Stop the network's tor processes (SIGTERM, then SIGKILL after --timeout); files are kept."""
    result = LocalNetwork.load(directory).stop(timeout_s=_seconds(timeout))
    if json_out:
        emit_json({"stopped": result})
    else:
        for nick, outcome in result.items():
            say(f"{nick}: {outcome}")


def register(app: typer.Typer) -> None:
    app.add_typer(localnet_app, name="localnet")
