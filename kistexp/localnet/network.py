"""A private tor network on 127.0.0.1 from Debian's tor (real-tor.md).

`LocalNetwork.create` writes keys, torrcs and DIR/network.json; `start` launches the tors
and records their pids; every later call (possibly from another process: the CLI) loads
the state from network.json. Only processes whose pid *and* command line match a
recorded node are ever signalled, and every wait polls with a bound.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from kistexp.asciinum import ascii_uint
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.voting import AUTH_DIR_MAX_SERVERS_PER_ADDR
from kistexp.directory import DirectoryClient, Endpoint
from kistexp.errors import DirectoryError, KistexpError, LocalNetError
from kistexp.localnet import procs
from kistexp.localnet.control import ControlPort
from kistexp.localnet.spec import (
    BASE_PORT_ENV,
    DEFAULT_BASE_PORT,
    LOOPBACK,
    PORT_STRIDE,
    SERVICE_ADDRESS,
    SERVICE_OFFSET,
    NetworkSpec,
    ParamItems,
    parse_params_arg,
    spec_from_json,
    spec_to_json,
)
from kistexp.localnet.torrc import (
    Node,
    authority_line,
    layout,
    log_values,
    params_include,
    render_torrc,
    sched_log,
)
from kistexp.safeio import read_bounded, read_bounded_text

STATE_FILE = "network.json"
CONSENSUS_PATH = "/tor/status-vote/current/consensus"
VOTE_PATH = "/tor/status-vote/current/authority"
NEXT_VOTE_PATH = "/tor/status-vote/next/authority"
HTTP_TIMEOUT_S = 3.0
KEYGEN_TIMEOUT_S = 60.0
#: What a client caches of the consensus in its data directory (both flavours, and one
#: still waiting for certificates).
CLIENT_CONSENSUS_CACHE = ("cached-microdesc-consensus", "cached-consensus",
                          "unverified-microdesc-consensus", "unverified-consensus")
#: Flags every relay and exit needs before clients start (guard sampling wants all of them).
USABLE_FLAGS = frozenset({"Fast", "Guard", "Running", "Stable", "Valid"})
LAUNCH_TIMEOUT_S = 30.0
#: network.json for the largest network spec allows is well under this; anything bigger is not ours.
MAX_STATE_BYTES = 4 * 1024 * 1024
#: Files tor and tor-gencert write for us (pid, fingerprint, authority_certificate) are a few KiB.
MAX_TOR_FILE_BYTES = 64 * 1024


def require_tor() -> tuple[str, str]:
    """Paths of tor and tor-gencert, or a LocalNetError naming the missing one."""
    tor = shutil.which("tor") or (os.path.exists("/usr/sbin/tor") and "/usr/sbin/tor") or None
    gencert = shutil.which("tor-gencert")
    if not tor:
        raise LocalNetError("tor is not installed (Debian: apt-get install -y tor)")
    if not gencert:
        raise LocalNetError("tor-gencert is not installed (Debian: apt-get install -y tor)")
    return str(tor), gencert


def search_start() -> int:
    """``$KISTEXP_LOCALNET_BASE_PORT`` if set (a whole number 1024-60000), else 15000."""
    text = os.environ.get(BASE_PORT_ENV, "")
    if not text:
        return DEFAULT_BASE_PORT
    if not (text.isascii() and text.isdecimal() and 1024 <= int(text) <= 60000):
        raise LocalNetError(f"${BASE_PORT_ENV}={text!r}: not a port from 1024 to 60000")
    return int(text)


def free_base_port(node_count: int, start: int | None = None) -> int:
    """The first base port from ``start`` (default ``search_start()``; in steps of one whole
    layout) whose every port of the real-tor.md layout, and the service port on 127.0.0.2, is free."""
    start = search_start() if start is None else start
    step = SERVICE_OFFSET + PORT_STRIDE
    for base in range(start, 65535 - SERVICE_OFFSET, step):
        ports = [base + k * PORT_STRIDE + i for k in range(5) for i in range(node_count)]
        if not any(procs.port_in_use(LOOPBACK, p) for p in ports) and not procs.port_in_use(
            SERVICE_ADDRESS, base + SERVICE_OFFSET
        ):
            return base
    raise LocalNetError(f"no free port range for {node_count} nodes from {start} upwards")


def have_tor() -> bool:
    try:
        require_tor()
    except LocalNetError:
        return False
    return True


@attrs.frozen
class DirDocument:
    """A vote or consensus served by one authority's DirPort, parsed by kistexp's
    document parser, with the facts the local network needs at hand."""

    served_by: str
    url: str
    valid_after: dt.datetime
    fresh_until: dt.datetime
    valid_until: dt.datetime
    params: ParamItems
    voters: tuple[str, ...]  # dir-source nicknames (a consensus: whose votes it used)
    relays: int
    signatures: int
    text: str = attrs.field(repr=False)
    document: Any = attrs.field(repr=False, eq=False)  # the parsed NetworkStatus

    def summary(self) -> dict:
        return {
            "served_by": self.served_by,
            "valid_after": self.valid_after,
            "fresh_until": self.fresh_until,
            "valid_until": self.valid_until,
            "params": ConsensusParams(self.params).format(),
            "voters": list(self.voters),
            "relays": self.relays,
            "signatures": self.signatures,
        }


def parse_network_status(body: bytes | str, where: str) -> Any:
    """kistexp's vote/consensus parser (dirauth.documents, or the netstatus layer under it)."""
    try:
        from kistexp.dirauth.documents import parse_network_status as parse
    except ImportError:
        from kistexp.dirauth.netstatus import parse_network_status as parse
    return parse(body, where)


def read_dir_document(body: bytes | str, url: str, served_by: str) -> DirDocument:
    doc = parse_network_status(body, url)
    return DirDocument(
        served_by=served_by,
        url=url,
        valid_after=doc.valid_after,
        fresh_until=doc.fresh_until,
        valid_until=doc.valid_until,
        params=tuple(doc.params),
        voters=tuple(a.nickname for a in doc.authorities if not a.legacy),
        relays=doc.relay_count,
        signatures=len(doc.signatures),
        text=body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body,
        document=doc,
    )


class LocalNetwork:
    """A local tor network rooted at a directory; see module docstring."""

    def __init__(self, root: Path, spec: NetworkSpec, state: dict) -> None:
        self.root = Path(root).resolve()
        self.spec = spec
        self.nodes: tuple[Node, ...] = layout(spec, self.root)
        self._state = state
        self._client: DirectoryClient | None = None

    # ---- creation and persistence -------------------------------------------------

    @classmethod
    def create(cls, root: Path | str, spec: NetworkSpec) -> LocalNetwork:
        """Write keys, torrcs and network.json under ``root`` (created, must hold no network)."""
        tor, gencert = require_tor()
        root = Path(root).resolve()
        if (root / STATE_FILE).exists():
            raise LocalNetError(f"{root / STATE_FILE} exists: a network is already set up there")
        root.mkdir(parents=True, exist_ok=True)
        net = cls(root, spec, {"pids": {}, "params": {}, "keys": {}})
        for node in net.nodes:
            Path(node.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(node.data_dir, 0o700)
            (Path(node.data_dir) / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        servers = [n for n in net.nodes if n.is_server]
        authorities = net.authorities
        with ThreadPoolExecutor(max_workers=4) as pool:
            v3idents = list(pool.map(lambda n: _gencert(gencert, n), authorities))
            fingerprints = list(pool.map(lambda n: _fingerprint(tor, n), servers))
        keys = {n.nickname: {"fingerprint": fp} for n, fp in zip(servers, fingerprints, strict=True)}
        for node, v3 in zip(authorities, v3idents, strict=True):
            keys[node.nickname]["v3ident"] = v3
        net._state["keys"] = keys
        lines = [authority_line(n, keys[n.nickname]["v3ident"], keys[n.nickname]["fingerprint"]) for n in authorities]
        (root / "authorities.inc").write_text("\n".join(lines) + "\n")
        for i, node in enumerate(authorities):
            net._write_params(node, spec.params_for(i))
        for node in net.nodes:
            node.torrc.write_text(render_torrc(node, spec, root))
        net._save()
        return net

    @classmethod
    def load(cls, root: Path | str) -> LocalNetwork:
        root = Path(root).resolve()
        path = root / STATE_FILE
        if not path.exists() and not path.is_symlink():
            raise LocalNetError(f"{path} not found: no local network there (run 'kistexp localnet up')")
        try:
            data = json.loads(read_bounded_text(path, MAX_STATE_BYTES, "the network state", LocalNetError))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise LocalNetError(f"{path}: cannot read the network state ({exc})") from None
        if not isinstance(data, dict) or "spec" not in data:
            raise LocalNetError(f"{path}: not a kistexp localnet state file")
        spec = spec_from_json(data["spec"], str(path))
        state = {k: data.get(k, {}) for k in ("pids", "params", "keys")}
        return cls(root, spec, state)

    def _save(self) -> None:
        data = {
            "spec": spec_to_json(self.spec),
            "nodes": [attrs.asdict(n) for n in self.nodes],
            "service": {"address": SERVICE_ADDRESS, "port": self.spec.service_port},
            **self._state,
        }
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.root / STATE_FILE)

    # ---- nodes ------------------------------------------------------------------------

    @property
    def authorities(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == "authority")

    def by_role(self, role: str) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == role)

    def node(self, name: str | int) -> Node:
        """A node by nickname, or an authority by its 0-based index."""
        index = name if isinstance(name, int) else ascii_uint(str(name))
        if index is not None:
            i = index
            if not 0 <= i < len(self.authorities):
                raise LocalNetError(f"authority index {i} is out of range 0..{len(self.authorities) - 1}")
            return self.authorities[i]
        for n in self.nodes:
            if n.nickname == name:
                return n
        raise LocalNetError(f"no node named {name!r} in {self.root} (nodes: {', '.join(self.nicknames)})")

    @property
    def nicknames(self) -> tuple[str, ...]:
        return tuple(n.nickname for n in self.nodes)

    def fingerprint(self, name: str) -> str:
        try:
            return self._state["keys"][name]["fingerprint"]
        except KeyError:
            raise LocalNetError(f"{name} has no relay fingerprint (clients have none)") from None

    def v3ident(self, name: str) -> str:
        return self._state["keys"][name]["v3ident"]

    def pid(self, node: Node) -> int | None:
        return self._state["pids"].get(node.nickname)

    def is_running(self, node: Node) -> bool:
        return procs.is_our_tor(self.pid(node), node.torrc)

    def params(self, node: Node) -> ParamItems:
        """The ConsensusParams currently configured for an authority."""
        raw = self._state["params"].get(node.nickname, [])
        return tuple((str(k), int(v)) for k, v in raw)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = LAUNCH_TIMEOUT_S, consensus_timeout_s: float = 60.0) -> None:
        """Launch every node not already running; tor daemonises once its ports are open.

        Clients start only once the consensus lists every relay: a client that samples its
        guards from an earlier, partial consensus never adds the missing relays, and a path
        pinned to one of them then fails ("no sampled guards were available"). On any
        failure the nodes started here are stopped again before the error is raised.
        """
        todo = [n for n in self.nodes if not self.is_running(n)]
        if not todo:
            return
        for node in todo:
            for what, port in node.listen_ports():
                if procs.port_in_use(LOOPBACK, port):
                    raise LocalNetError(f"port {port} on {LOOPBACK} ({what} of {node.nickname}) is in use")
        servers = [n for n in todo if n.is_server]
        clients = [n for n in todo if not n.is_server]
        try:
            self._launch(servers, timeout_s)
            if clients:
                self.wait_for_relays(consensus_timeout_s)
                self._launch(clients, timeout_s)
        except LocalNetError:
            self.stop()
            raise

    def _launch(self, nodes: list[Node], timeout_s: float) -> None:
        if not nodes:
            return
        tor, _ = require_tor()
        launched: dict[str, subprocess.Popen] = {}
        for node in nodes:
            (Path(node.data_dir) / "pid").unlink(missing_ok=True)
            launched[node.nickname] = subprocess.Popen(
                [tor, "-f", str(node.torrc), "--hush"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        error = None
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            proc = launched[node.nickname]
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                error = error or f"{node.nickname}: tor did not daemonise within {timeout_s:g} s"
                continue
            if proc.returncode != 0:
                last = _tor_complaint(out.decode(errors="replace")) or procs.last_log_line(
                    Path(node.data_dir) / "notice.log"
                )
                error = error or f"{node.nickname}: tor exited with status {proc.returncode}: {last}"
                continue
            pid = self._read_pidfile(node)
            if pid is None:
                error = error or f"{node.nickname}: tor started but wrote no pid file {node.data_dir}/pid"
                continue
            self._state["pids"][node.nickname] = pid
        self._save()
        if error:
            raise LocalNetError(error)

    def _read_pidfile(self, node: Node) -> int | None:
        path = Path(node.data_dir) / "pid"
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                pid = int(read_bounded(path, MAX_TOR_FILE_BYTES, "pid file", LocalNetError).strip())
            except (LocalNetError, ValueError):
                pid = None
            if pid and procs.is_our_tor(pid, node.torrc):
                return pid
            time.sleep(procs.POLL_S)
        return None

    def stop(self, timeout_s: float = 10.0) -> dict[str, str]:
        """SIGTERM our tors, SIGKILL after ``timeout_s``; returns {nickname: outcome}."""
        pairs = [(self.pid(n), n.torrc) for n in self.nodes]
        outcome = procs.terminate(pairs, timeout_s=timeout_s)
        result = {}
        for node in self.nodes:
            pid = self.pid(node)
            result[node.nickname] = outcome.get(pid, "not started") if pid else "not started"
        self._state["pids"] = {}
        self._save()
        return result

    def stop_node(self, name: str, timeout_s: float = 10.0) -> str:
        node = self.node(name)
        pid = self.pid(node)
        outcome = procs.terminate([(pid, node.torrc)], timeout_s=timeout_s).get(pid or 0, "not started")
        self._state["pids"].pop(node.nickname, None)
        self._save()
        return outcome

    def restart_client(self, name: str, forget_consensus: bool = True,
                       timeout_s: float = LAUNCH_TIMEOUT_S) -> None:
        """Stop a client and start it again, optionally without the consensus it cached, and
        wait until it has bootstrapped anew. Options set over the control port are lost.

        A client holding no consensus bootstraps from the authorities over one-hop circuits
        made with CREATE_FAST (without a consensus it knows no onion key for them:
        should_use_create_fast_for_circuit(), circuitbuild.c), which negotiate nothing; that
        is the one way back for a client stranded by a ``cc_alg`` change (docs/localnet.md,
        Pitfalls)."""
        node = self.node(name)
        if node.is_server:
            raise LocalNetError(f"{node.nickname} is a {node.role}, not a client")
        self.stop_node(node.nickname)
        if forget_consensus:
            for cached in CLIENT_CONSENSUS_CACHE:
                (Path(node.data_dir) / cached).unlink(missing_ok=True)
        log = Path(node.data_dir) / "notice.log"
        offset = log.stat().st_size if log.exists() else 0
        self._launch([node], timeout_s)
        self.wait_bootstrapped(timeout_s, [node], log_offsets={node.nickname: offset})

    def check_alive(self) -> None:
        """LocalNetError for the first started node that has exited, with its last log line,
        or when no authority was started at all (nothing could ever answer)."""
        if not any(self.pid(n) for n in self.authorities):
            raise LocalNetError(f"the local network in {self.root} is not running (run 'kistexp localnet up')")
        for node in self.nodes:
            pid = self.pid(node)
            if pid and not self.is_running(node):
                last = procs.last_log_line(Path(node.data_dir) / "notice.log")
                raise LocalNetError(f"{node.nickname} (pid {pid}) exited early: {last}")

    def __enter__(self) -> LocalNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- control port -------------------------------------------------------------------

    def control(self, name: str) -> ControlPort:
        """An authenticated control connection to a running node (close it after use)."""
        node = self.node(name)
        if not self.is_running(node):
            raise LocalNetError(f"{node.nickname} is not running; its ControlPort is closed")
        return ControlPort(node.control_port, Path(node.data_dir) / "control_auth_cookie", node.nickname)

    def set_conf(self, name: str, options: Mapping[str, str | Sequence[str] | None]) -> None:
        """SETCONF on a running node; tor applies e.g. Schedulers, KISTSchedRunInterval and
        EntryNodes at once (real-tor.md, problem 10)."""
        with self.control(name) as ctl:
            ctl.set_conf(options)

    def set_sched_debug(self, name: str, enabled: bool) -> Path:
        """Turn the scheduler's debug log (sched.log) on or off on a running node; returns
        its path. Used around a short measurement only, since it is voluminous."""
        node = self.node(name)
        self.set_conf(node.nickname, {"Log": list(log_values(node, enabled or self.spec.sched_debug))})
        return sched_log(node)

    def pin_path(self, client: str, guard: str, middle: str, exit_: str) -> None:
        """Make ``client`` build every new circuit as guard -> middle -> exit."""
        self.set_conf(
            client,
            {
                "EntryNodes": self.fingerprint(guard),
                "MiddleNodes": self.fingerprint(middle),
                "ExitNodes": self.fingerprint(exit_),
                "StrictNodes": "1",
            },
        )

    # ---- ConsensusParams ----------------------------------------------------------------

    def _write_params(self, node: Node, params: ParamItems) -> None:
        path = Path(node.data_dir) / "params.inc"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(params_include(params))
            os.replace(tmp, path)
        except OSError as exc:
            raise LocalNetError(f"{path}: cannot write ConsensusParams: {exc.strerror or exc}") from None
        self._state["params"][node.nickname] = [list(item) for item in params]

    def write_consensus_params(self, authority: str | int,
                               params: ParamItems | Mapping[str, int] | str) -> ParamItems:
        """Rewrite an authority's params.inc (temp file and rename; not reloaded yet); returns the items.

        A line tor could not vote with is refused before anything is written (``parse_params_arg``).
        """
        node = self.node(authority)
        if node.role != "authority":
            raise LocalNetError(f"{node.nickname} is a {node.role}, not an authority")
        if isinstance(params, str):
            items = parse_params_arg(params, where=f"ConsensusParams for {node.nickname}")
        elif isinstance(params, Mapping):
            items = parse_params_arg(" ".join(f"{k}={v}" for k, v in params.items()), node.nickname)
        else:
            items = parse_params_arg(" ".join(f"{k}={v}" for k, v in params), node.nickname)
        self._write_params(node, items)
        self._save()
        return items

    def set_consensus_params(self, authority: str | int, params: ParamItems | Mapping[str, int] | str,
                             confirm_timeout_s: float | None = None) -> DirDocument | None:
        """Rewrite an authority's params.inc and SIGHUP it (real-tor.md problem 6).

        With ``confirm_timeout_s``, wait that long at most for the authority's first vote made after the
        reload and return it: an authority that reloaded a line it cannot vote with makes none (it logs
        "Generated a networkstatus vote we couldn't parse"), which is then a LocalNetError, not silence.
        The change reaches the consensus one or two voting periods later.
        """
        node = self.node(authority)
        items = self.write_consensus_params(node.nickname, params)
        reloaded_at = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        if self.pid(node) and not procs.signal_ours(self.pid(node), node.torrc, signal.SIGHUP):
            raise LocalNetError(f"{node.nickname} is not running: params.inc rewritten but nothing reloaded it")
        if confirm_timeout_s is None or not self.pid(node):
            return None
        return self.wait_for_own_vote(node.nickname, reloaded_at, items, confirm_timeout_s)

    def confirm_timeout(self) -> float:
        """How long the first vote after a reload may take: the rest of this period and one more, plus slack."""
        return 2.0 * self.spec.voting_interval_s + 10.0

    def wait_for_own_vote(self, authority: str | int, made_after: dt.datetime, params: ParamItems,
                          timeout_s: float) -> DirDocument:
        """The authority's first vote published at or after ``made_after`` (next or current period), which
        must list ``params`` (plus what tor appends); LocalNetError naming its log if none comes in time."""
        node = self.node(authority)
        want = {k: v for k, v in params}

        def check() -> DirDocument | None:
            self.check_alive()
            for path in (NEXT_VOTE_PATH, VOTE_PATH):
                text = self._get(node, path)
                if not text:
                    continue
                try:
                    doc = read_dir_document(text, node.dir_url + path, node.nickname)
                except KistexpError:
                    continue
                published = getattr(doc.document, "published", None)
                if published is None or published < made_after:
                    continue
                # published has whole seconds: a vote from the second of the reload counts only if it is the new one
                if published > made_after or _own_params(doc) == want:
                    return doc
            return None

        try:
            vote = procs.poll(f"{node.nickname}'s first vote after the reload", check, timeout_s)
        except LocalNetError:
            log = Path(node.data_dir) / "notice.log"
            bug = procs.last_log_line(log, containing="vote we couldn't parse", tail_bytes=1 << 20)
            said = f"; tor logged: {bug[:200]}" if bug != "(empty log)" else f" (see {log})"
            raise LocalNetError(
                f"{node.nickname} made no vote within {timeout_s:g} s of reloading its ConsensusParams; it may "
                f"not be able to vote with them{said}") from None
        got = _own_params(vote)  # type: ignore[arg-type]
        if got != want:
            raise LocalNetError(f"{node.nickname}'s vote after the reload lists params {got}, not {want}")
        return vote  # type: ignore[return-value]

    # ---- directory documents ------------------------------------------------------------

    def directory_client(self, **kwargs: Any) -> DirectoryClient:
        """kistexp's directory client aimed at this network's authorities (N = configured)."""
        endpoints = [Endpoint(n.nickname, LOOPBACK, n.dir_port, self.v3ident(n.nickname)) for n in self.authorities]
        kwargs.setdefault("timeout_s", HTTP_TIMEOUT_S)
        return DirectoryClient(endpoints, n_authorities=len(endpoints), **kwargs)

    def _get(self, node: Node, path: str) -> bytes | None:
        """One bounded GET of a DirPort document; None on 404 or when the node does not
        answer (callers poll, so no retries here)."""
        if self._client is None:
            self._client = self.directory_client(retries=0)
        try:
            return self._client.fetch_once(self._client.endpoint(node.nickname), path).body or None
        except DirectoryError:
            return None

    def fetch_consensus(self, authority: str | int | None = None) -> DirDocument | None:
        """The current ns consensus from one authority (default: the first that answers)."""
        nodes = [self.node(authority)] if authority is not None else list(self.authorities)
        for node in nodes:
            text = self._get(node, CONSENSUS_PATH)
            if text:
                return read_dir_document(text, node.dir_url + CONSENSUS_PATH, node.nickname)
        return None

    def fetch_vote(self, authority: str | int) -> DirDocument | None:
        """An authority's own vote for the current period (404 -> None)."""
        node = self.node(authority)
        text = self._get(node, VOTE_PATH)
        return read_dir_document(text, node.dir_url + VOTE_PATH, node.nickname) if text else None

    def wait_for_consensus(
        self,
        timeout_s: float = 60.0,
        newer_than_valid_after: dt.datetime | None = None,
        authority: str | int | None = None,
    ) -> DirDocument:
        """Poll the DirPorts until a consensus (valid-after later than the given one) is served."""

        def check() -> DirDocument | None:
            self.check_alive()
            doc = self.fetch_consensus(authority)
            if doc and (newer_than_valid_after is None or doc.valid_after > newer_than_valid_after):
                return doc
            return None

        what = "a consensus" if newer_than_valid_after is None else f"a consensus newer than {newer_than_valid_after}"
        return procs.poll(what, check, timeout_s)  # type: ignore[return-value]

    def fetch_round(
        self, timeout_s: float = 30.0, newer_than_valid_after: dt.datetime | None = None
    ) -> tuple[DirDocument, dict[str, DirDocument]]:
        """A consensus and exactly the votes it was made from (its dir-source authorities),
        all with the same valid-after. Polls: right after valid-after an authority may still
        serve the previous period's vote."""

        def check() -> tuple[DirDocument, dict[str, DirDocument]] | None:
            self.check_alive()
            cons = self.fetch_consensus()
            if cons is None or (newer_than_valid_after and cons.valid_after <= newer_than_valid_after):
                return None
            votes = {}
            for name in cons.voters:
                vote = self.fetch_vote(name) if name in self.nicknames else None
                if vote is None or vote.valid_after != cons.valid_after:
                    return None
                votes[name] = vote
            again = self.fetch_consensus(cons.served_by)
            if again is None or again.valid_after != cons.valid_after:
                return None  # the period turned over while we fetched
            return cons, votes

        return procs.poll("a consensus and its votes", check, timeout_s)  # type: ignore[return-value]

    def wait_for_relays(self, timeout_s: float = 60.0) -> DirDocument:
        """Poll until the consensus lists every server node, each relay and exit with the
        flags a pinned path needs (USABLE_FLAGS: a guard must be Stable, Fast and Guard)."""
        servers = {n.nickname: n for n in self.nodes if n.is_server}

        def check() -> DirDocument | None:
            self.check_alive()
            doc = self.fetch_consensus()
            if doc is None:
                return None
            listed = {r.nickname: set(r.flags) for r in doc.document.routers}
            for name, node in servers.items():
                if name not in listed:
                    return None
                if node.role != "authority" and not USABLE_FLAGS <= listed[name]:
                    return None
            return doc

        return procs.poll(  # type: ignore[return-value]
            f"a consensus listing all {len(servers)} relays as usable", check, timeout_s
        )

    def wait_bootstrapped(self, timeout_s: float = 60.0, clients: Iterable[Node] | None = None,
                          log_offsets: Mapping[str, int] | None = None) -> None:
        """Poll the clients' notice logs for ``Bootstrapped 100%``, each read from its byte
        offset in ``log_offsets`` (a restarted client's earlier bootstrap does not count)."""
        targets = list(clients if clients is not None else self.by_role("client"))
        offsets = log_offsets or {}

        def check() -> bool:
            self.check_alive()
            for node in targets:
                try:
                    with (Path(node.data_dir) / "notice.log").open("rb") as fh:
                        fh.seek(offsets.get(node.nickname, 0))
                        if b"Bootstrapped 100%" not in fh.read():
                            return False
                except FileNotFoundError:
                    return False
            return True

        procs.poll("the clients to bootstrap", check, timeout_s)

    # ---- status ---------------------------------------------------------------------------

    def status(self) -> dict:
        nodes = []
        for node in self.nodes:
            entry = {
                "nickname": node.nickname,
                "role": node.role,
                "pid": self.pid(node),
                "running": self.is_running(node),
                "or_port": node.or_port if node.is_server else None,
                "dir_port": node.dir_port if node.is_server else None,
                "control_port": node.control_port,
                "socks_port": None if node.is_server else node.socks_port,
            }
            if node.role == "authority":
                entry["consensus_params"] = ConsensusParams(self.params(node)).format()
            nodes.append(entry)
        consensus = None
        if any(n["running"] for n in nodes):
            doc = self.fetch_consensus()
            consensus = doc.summary() if doc else None
        return {
            "root": str(self.root),
            "nodes": nodes,
            "running": sum(1 for n in nodes if n["running"]),
            "consensus": consensus,
            "service": f"{SERVICE_ADDRESS}:{self.spec.service_port}",
        }


def _own_params(vote: DirDocument) -> dict[str, int]:
    """A vote's params without the AuthDirMaxServersPerAddr tor appends (§1.2)."""
    return {k: v for k, v in vote.params if k != AUTH_DIR_MAX_SERVERS_PER_ADDR}


def _tor_complaint(output: str) -> str:
    """The informative line of tor's start-up output: its last warning (the final [err]
    only says "see warnings above"), without the timestamp."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    warns = [ln for ln in lines if "[warn]" in ln] or lines
    if not warns:
        return ""
    line = warns[-1]
    return line[line.index("["):] if "[" in line else line


def _run(argv: list[str], what: str, stdin: str | None = None, cwd: str | None = None) -> str:
    try:
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=KEYGEN_TIMEOUT_S, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired:
        raise LocalNetError(f"{what}: {argv[0]} took longer than {KEYGEN_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise LocalNetError(f"{what}: {Path(argv[0]).name} failed: {lines[-1] if lines else proc.returncode}")
    return proc.stdout


def _gencert(gencert: str, node: Node) -> str:
    """Make an authority's identity/signing keys and certificate; returns its v3ident."""
    keys = Path(node.data_dir) / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    _run(
        [
            gencert, "--create-identity-key", "-m", "12", "-a", f"{LOOPBACK}:{node.dir_port}",
            "-i", str(keys / "authority_identity_key"), "-s", str(keys / "authority_signing_key"),
            "-c", str(keys / "authority_certificate"), "--passphrase-fd", "0",
        ],
        f"{node.nickname} key generation",
        stdin="\n",
        cwd=str(keys),
    )
    cert = read_bounded_text(keys / "authority_certificate", MAX_TOR_FILE_BYTES, "authority certificate",
                             LocalNetError)
    for line in cert.splitlines():
        if line.startswith("fingerprint "):
            return line.split()[1]
    raise LocalNetError(f"{keys / 'authority_certificate'}: no fingerprint line")


def _fingerprint(tor: str, node: Node) -> str:
    """Create a server's relay identity key and return its fingerprint."""
    _run(
        [
            tor, "--ignore-missing-torrc", "-f", "/dev/null", "--list-fingerprint", "--orport", "1",
            "--datadirectory", node.data_dir, "--nickname", node.nickname, "--quiet",
        ],
        f"{node.nickname} identity key",
    )
    text = read_bounded_text(Path(node.data_dir) / "fingerprint", MAX_TOR_FILE_BYTES, "fingerprint",
                             LocalNetError).split()
    if len(text) < 2:
        raise LocalNetError(f"{node.data_dir}/fingerprint: unexpected content")
    return text[1]
