"""What a local tor network consists of: counts, ports, voting interval, per-authority
ConsensusParams and per-role torrc options (real-tor.md, "torrc templates").

A spec is a frozen value; `LocalNetwork.create` turns it into data directories and torrcs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from kistexp.dirauth.paramsline import INT32_MAX, INT32_MIN, ConsensusParams
from kistexp.dirauth.voting import VoteRejected, own_vote_params
from kistexp.errors import LocalNetError

ROLES = ("authority", "relay", "exit", "client")
# "all" applies an option to every node; the other keys are the roles above.
OPTION_TARGETS = ("all", *ROLES)
SCHEDULERS = ("KIST", "KISTLite", "Vanilla")

# Port layout of real-tor.md: node n gets ORPort BASE+n, DirPort BASE+100+n, ControlPort
# BASE+200+n, MetricsPort BASE+300+n, SocksPort BASE+400+n; the bulk service uses BASE+500.
PORT_STRIDE = 100
MAX_NODES = PORT_STRIDE
SERVICE_OFFSET = 5 * PORT_STRIDE
SERVICE_ADDRESS = "127.0.0.2"
LOOPBACK = "127.0.0.1"
DEFAULT_BASE_PORT = 15000
#: Where the search for a free port layout starts (``free_base_port``), when set: several
#: networks started at once on one machine (say two ``kistexp fidelity`` runs, or test
#: processes) each pick a free range, but between picking and binding they could pick the same.
BASE_PORT_ENV = "KISTEXP_LOCALNET_BASE_PORT"
# tor refuses a V3AuthVotingInterval below 10 s even with TestingTorNetwork.
MIN_VOTING_INTERVAL_S = 10
MAX_VOTING_INTERVAL_S = 24 * 3600  # tor refuses a longer V3AuthVotingInterval

_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_VALUE_RE = re.compile(r"[+-]?[0-9]{1,12}")  # ASCII digits: int() would also take "١٢" and "1_0"
#: TestingTorNetwork's AuthDirMaxServersPerAddr: what tor appends to the votes of this network's authorities.
TESTING_AUTH_DIR_MAX_SERVERS_PER_ADDR = 0
_OPTION_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(\s.*)?\Z")

ParamItems = tuple[tuple[str, int], ...]


def parse_params_arg(text: str, where: str = "params") -> ParamItems:
    """Parse a user's ``k=v k2=v2`` list (any order) into items sorted by key.

    Unlike a vote's params line, the order is free (tor sorts ConsensusParams itself), but
    each key must appear once and each value must be an int32. The line is then checked as tor
    would vote it (``own_vote_params``): a line tor cannot vote with is refused with the reason
    before anything is written (AuthDirMaxServersPerAddr, which tor appends itself, above all).
    """
    items: dict[str, int] = {}
    for token in text.replace(",", " ").split():
        key, sep, raw = token.partition("=")
        if not sep or not _KEY_RE.fullmatch(key):
            raise LocalNetError(f"{where}: {token[:80]!r} is not key=value")
        if not _VALUE_RE.fullmatch(raw):
            raise LocalNetError(f"{where}: {key} has a non-integer value {raw[:40]!r}")
        value = int(raw)
        if not INT32_MIN <= value <= INT32_MAX:
            raise LocalNetError(f"{where}: {key}={raw} is outside the int32 range")
        if key in items:
            raise LocalNetError(f"{where}: {key} is given twice")
        items[key] = value
    ordered = tuple(sorted(items.items()))
    try:
        own_vote_params(ConsensusParams(ordered).format(), TESTING_AUTH_DIR_MAX_SERVERS_PER_ADDR)
    except VoteRejected as exc:
        raise LocalNetError(f"{where}: {exc}") from None
    return ordered


def scheduler_options(scheduler: str, interval_ms: int | None = None) -> tuple[str, ...]:
    """torrc lines selecting one scheduler (and KIST's run interval) on a node.

    A torrc ``KISTSchedRunInterval`` overrides the consensus on relays and clients alike
    (kist-ewma.md §5.1); tor accepts 1..100 there.
    """
    canonical = {s.lower(): s for s in SCHEDULERS}.get(scheduler.lower())
    if canonical is None:
        raise LocalNetError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
    lines = [f"Schedulers {canonical}"]
    if interval_ms is not None:
        if not 1 <= interval_ms <= 100:
            raise LocalNetError(f"KISTSchedRunInterval {interval_ms} ms is outside tor's torrc range 1..100")
        lines.append(f"KISTSchedRunInterval {interval_ms} msec")
    return tuple(lines)


@attrs.frozen
class NetworkSpec:
    """A private tor network on 127.0.0.1 (real-tor.md).

    ``consensus_params[i]`` is authority i's ConsensusParams (missing or empty: none, so it
    votes an empty params line). ``role_options`` are extra torrc lines as
    ``(target, line)`` pairs, target one of OPTION_TARGETS. ``sched_debug`` adds a
    ``[sched]debug`` log (sched.log) on every node, for scheduler-run measurements.
    """

    authorities: int = 3
    relays: int = 2
    exits: int = 1
    clients: int = 1
    base_port: int = DEFAULT_BASE_PORT
    voting_interval_s: int = 10
    consensus_params: tuple[ParamItems, ...] = ()
    role_options: tuple[tuple[str, str], ...] = ()
    sched_debug: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("authorities", "relays", "exits", "clients"):
            if getattr(self, name) < 0:
                raise LocalNetError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.authorities < 1:
            raise LocalNetError("a local network needs at least 1 authority")
        if self.node_count > MAX_NODES:
            raise LocalNetError(f"{self.node_count} nodes do not fit the port layout (at most {MAX_NODES})")
        if not 1024 <= self.base_port <= 65535 - SERVICE_OFFSET:
            raise LocalNetError(
                f"base port {self.base_port} must be within 1024..{65535 - SERVICE_OFFSET} "
                f"(the layout uses base..base+{SERVICE_OFFSET})"
            )
        if self.voting_interval_s < MIN_VOTING_INTERVAL_S:
            raise LocalNetError(
                f"voting interval {self.voting_interval_s} s is below tor's minimum of {MIN_VOTING_INTERVAL_S} s"
            )
        if self.voting_interval_s > MAX_VOTING_INTERVAL_S:
            raise LocalNetError(
                f"voting interval {self.voting_interval_s} s is above tor's maximum of {MAX_VOTING_INTERVAL_S} s (24 h)"
            )
        if len(self.consensus_params) > self.authorities:
            raise LocalNetError(
                f"ConsensusParams given for {len(self.consensus_params)} authorities, "
                f"but the network has {self.authorities}"
            )
        for target, line in self.role_options:
            if target not in OPTION_TARGETS:
                raise LocalNetError(f"torrc option target {target!r} is not one of {', '.join(OPTION_TARGETS)}")
            if "\n" in line or not _OPTION_RE.match(line.strip()):
                raise LocalNetError(f"torrc option {line!r} for {target} is not one 'Key value' line")

    @property
    def node_count(self) -> int:
        return self.authorities + self.relays + self.exits + self.clients

    @property
    def service_port(self) -> int:
        return self.base_port + SERVICE_OFFSET

    @property
    def vote_delay_s(self) -> int:
        # VoteDelay + DistDelay must stay below half the interval (real-tor.md): 2+2 at 10 s.
        return max(2, self.voting_interval_s // 5)

    def params_for(self, authority_index: int) -> ParamItems:
        if authority_index < len(self.consensus_params):
            return self.consensus_params[authority_index]
        return ()

    def options_for(self, role: str) -> tuple[str, ...]:
        return tuple(line for target, line in self.role_options if target in ("all", role))

    def roles(self) -> Iterable[str]:
        """The role of each node, in port order: authorities, relays, exits, clients."""
        for role, count in zip(ROLES, (self.authorities, self.relays, self.exits, self.clients), strict=True):
            yield from (role,) * count


def spec_with_options(spec: NetworkSpec, options: Mapping[str, Iterable[str]]) -> NetworkSpec:
    """A copy of ``spec`` with more torrc lines per target (``{"all": [...], "client": [...]}``)."""
    extra = tuple((target, line) for target, lines in options.items() for line in lines)
    return attrs.evolve(spec, role_options=spec.role_options + extra)


def spec_to_json(spec: NetworkSpec) -> dict:
    return attrs.asdict(spec)


def spec_from_json(data: Mapping, where: str) -> NetworkSpec:
    try:
        return NetworkSpec(
            authorities=int(data["authorities"]),
            relays=int(data["relays"]),
            exits=int(data["exits"]),
            clients=int(data["clients"]),
            base_port=int(data["base_port"]),
            voting_interval_s=int(data["voting_interval_s"]),
            consensus_params=tuple(tuple((str(k), int(v)) for k, v in p) for p in data["consensus_params"]),
            role_options=tuple((str(t), str(line)) for t, line in data["role_options"]),
            sched_debug=bool(data.get("sched_debug", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LocalNetError(f"{where}: the network spec is damaged ({exc!r})") from None
