"""N fake directory authorities voting among themselves on an accelerated schedule.

``FakeAuthorityNetwork`` owns the authorities, their DirPort servers (one per authority on
127.0.0.1, port+1 .. port+N; the operator API on ``port``), the voting loop and an optional
node population. The voting loop follows dirspec-params.md §2.2 with every time scaled
(``kistexp.dirauth.schedule.AcceleratedSchedule``): ``interval_s`` is one "hour"; the vote and
distribution delays are 300/3600 of it unless given. Votes and detached signatures travel as
HTTP POSTs (over sockets, or through the in-process transport when the network does not listen).

Time comes from a ``kistexp.clock.Clock``. On the wall clock a thread runs the rounds. On a
``VirtualClock`` (with ``listen=False``) each phase of a round is a ``call_at`` on the clock:
advancing the clock votes, computes, signs and publishes with no real waiting, and the
exchanges between authorities run to completion inside their phase (a slow or hanging peer
costs no real time; whether its answer arrives is decided against the request's timeout).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from fake_authorities import docs
from fake_authorities.authority import FakeAuthority, Published
from fake_authorities.dirport import DirPortApp, DirPortServer, DirRequest, Gate, dirport_admit, require_loopback
from fake_authorities.faults import Fault
from fake_authorities.transport import InProcessTransport, Route, Unreachable, deliver
from kistexp.clock import Clock, RealClock, Timer, as_utc
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES, DirectoryAuthority
from kistexp.dirauth.keys import AuthorityKeys, KeyCertificate
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.schedule import AcceleratedSchedule, RoundTimes, ScheduleError
from kistexp.errors import KistexpError
from kistexp.safeio import read_bounded, read_bounded_text

if TYPE_CHECKING:
    from fake_authorities.fetchers import FetcherFleet

class NetworkError(KistexpError):
    """Misuse of the fake network (bad name, bad option); the CLI reports it in one line."""


def default_nicknames(count: int) -> list[str]:
    """Today's authority nicknames first, so plans naming moria1 etc. map onto the fakes."""
    names = [a.nickname for a in DEFAULT_AUTHORITIES][:count]
    return names + [f"auth{i}" for i in range(len(names) + 1, count + 1)]


def generate_keys(count: int, bits: tuple[int, int] = (3072, 2048),
                  clock: Clock | None = None) -> list[AuthorityKeys]:
    return [AuthorityKeys.generate(identity_bits=bits[0], signing_bits=bits[1], clock=clock) for _ in range(count)]


#: Keys, certificates, the token and consensus-params.json in a state directory are a few KiB each.
MAX_STATE_FILE_BYTES = 256 * 1024
#: The operator's change log (one JSON line per ConsensusParams change) in the state directory.
CHANGE_LOG = "changes.jsonl"
MAX_CHANGE_LOG_BYTES = 16 * 1024 * 1024


def _state_bytes(path: Path) -> bytes:
    return read_bounded(path, MAX_STATE_FILE_BYTES, "state file", NetworkError)


def _check_state_dir(path: Path) -> None:
    """The state directory must be a directory, or creatable as one, before anything is written."""
    if os.path.lexists(path) and not path.is_dir():
        raise NetworkError(f"--state-dir {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NetworkError(f"--state-dir {path}: cannot create it ({exc.strerror or exc})") from None


def _load_or_make_keys(state_dir: Path | None, names: list[str], bits: tuple[int, int],
                       clock: Clock) -> list[AuthorityKeys]:
    out = []
    for name in names:
        d = state_dir / name if state_dir else None
        if d and os.path.lexists(d / "authority_certificate"):
            out.append(AuthorityKeys.load_pem(_state_bytes(d / "authority_identity_key"),
                                              _state_bytes(d / "authority_signing_key"),
                                              _state_bytes(d / "authority_certificate").decode("ascii", "replace"),
                                              str(d)))
            continue
        keys = AuthorityKeys.generate(identity_bits=bits[0], signing_bits=bits[1], clock=clock)
        if d:
            d.mkdir(parents=True, exist_ok=True)
            for fname, data in (("authority_identity_key", keys.identity_pem()),
                                ("authority_signing_key", keys.signing_pem())):
                (d / fname).write_bytes(data)
                os.chmod(d / fname, 0o600)
            (d / "authority_certificate").write_text(keys.certificate_text)
        out.append(keys)
    return out


ParamsInput = str | Mapping[str, int] | Iterable[str] | Iterable[tuple[str, int]]


def params_lines(params: ParamsInput | None) -> tuple[str, ...]:
    """ConsensusParams as torrc lines from a ``k=v ...`` string, a mapping, lines or pairs."""
    if params is None:
        return ()
    if isinstance(params, str):
        return (params,) if params.strip() else ()
    if isinstance(params, Mapping):
        return (" ".join(f"{k}={v}" for k, v in params.items()),) if params else ()
    items = list(params)
    if items and all(isinstance(i, tuple) for i in items):
        return (" ".join(f"{k}={v}" for k, v in items),)
    return tuple(str(i) for i in items)


class FakeAuthorityNetwork:
    """N authorities on loopback (or in-process only with ``listen=False``).

    >>> net = FakeAuthorityNetwork(count=5, interval_s=4, port=0).start()
    >>> net.set_params("moria1", "KISTSchedRunInterval=2")
    >>> net.wait_for_consensus(lambda c: c.params_dict.get("KISTSchedRunInterval") == 2)
    >>> net.stop()
    """

    def __init__(self, count: int = 9, interval_s: int = 10, *, port: int = 7000, host: str = "127.0.0.1",
                 listen: bool = True, token: str | None = None, state_dir: str | Path | None = None,
                 nicknames: list[str] | None = None, keys: list[AuthorityKeys] | None = None,
                 key_bits: tuple[int, int] = (3072, 2048), vote_delay_s: float | None = None,
                 dist_delay_s: float | None = None,
                 initial_params: Mapping[str, ParamsInput] | ParamsInput | None = None,
                 clock: Clock | None = None) -> None:
        if not 1 <= count <= 64:
            raise NetworkError(f"count must be between 1 and 64, got {count}")
        try:
            require_loopback(host)
        except ValueError as exc:
            raise NetworkError(str(exc)) from None
        if listen and port and not 1024 <= port <= 65535 - count:
            raise NetworkError(f"port {port} leaves no room for {count} authorities (1024 .. {65535 - count})")
        self.count = count
        try:
            self.timing = AcceleratedSchedule.scaled(interval_s, vote_delay_s, dist_delay_s)
        except ScheduleError as exc:
            raise NetworkError(str(exc)) from None
        self.host = host
        # Without sockets the ports are only names for the in-process transport.
        self.base_port = port if listen or port else 17000
        self.listen = listen
        self.state_dir = Path(state_dir) if state_dir else None
        if self.state_dir is not None:
            _check_state_dir(self.state_dir)
        saved_token = self.state_dir / "operator-token" if self.state_dir else None
        if token is None and saved_token is not None and os.path.lexists(saved_token):
            token = read_bounded_text(saved_token, MAX_STATE_FILE_BYTES, "operator token",
                                      NetworkError).strip() or None  # a restart keeps the operator's token
        self.token = token or secrets.token_urlsafe(18)
        self.names = list(nicknames) if nicknames else default_nicknames(count)
        if len(self.names) != count or len(set(n.lower() for n in self.names)) != count:
            raise NetworkError(f"need {count} distinct nicknames, got {self.names}")
        if keys is not None and len(keys) < count:
            raise NetworkError(f"{len(keys)} key sets given for {count} authorities")
        self._given_keys = keys
        self._key_bits = key_bits
        self._initial_params = initial_params
        self.clock: Clock = clock or RealClock()
        self.virtual = bool(getattr(self.clock, "virtual", False))
        if self.virtual and listen:
            raise NetworkError("a network on a virtual clock runs in-process only (listen=False)")
        self._now = self.clock.timestamp
        self._timer: Timer | None = None
        self.authorities: dict[str, FakeAuthority] = {}
        self._gates: dict[str, Gate] = {}
        self._apps: dict[str, DirPortApp] = {}
        self._servers: dict[str, DirPortServer] = {}
        self._ports: dict[str, int] = {}
        self.operator_server: DirPortServer | None = None
        self._operator_gate = Gate()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None
        self._io_pool: ThreadPoolExecutor | None = None
        self._http: httpx.Client | None = None
        self.population: FetcherFleet | None = None
        self.current_round: RoundTimes | None = None
        self.rounds_done = 0
        self.started = False
        self.changes: list[dict[str, Any]] = []  # the change log, oldest first
        self._changes_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FakeAuthorityNetwork:
        if self.started:
            return self
        from fake_authorities.operator import MAX_BODY_BYTES as OPERATOR_MAX_BODY_BYTES
        from fake_authorities.operator import OperatorApi

        keys = (self._given_keys[: self.count] if self._given_keys
                else _load_or_make_keys(self.state_dir, self.names, self._key_bits, self.clock))
        certs: dict[str, KeyCertificate] = {k.v3ident: k.certificate for k in keys}
        if len(certs) != self.count:
            raise NetworkError("two authorities share an identity key")
        for i, (name, k) in enumerate(zip(self.names, keys, strict=True), start=1):
            port = self.base_port + i if self.base_port else 0
            auth = FakeAuthority(name, k, self.host, port, port,
                                 lambda: certs, self.count, now=self._now)
            self.authorities[name] = auth
            self._gates[name] = Gate()
            self._apps[name] = DirPortApp(auth)
        self._apply_initial_params()
        if self.listen:
            try:
                for name in self.names:
                    app = self._apps[name]
                    srv = DirPortServer(app.handle, self.host, self.authorities[name].dirport, self._gates[name],
                                        admit=dirport_admit)
                    srv.listen()
                    self._servers[name] = srv
                    self._ports[name] = srv.port
                    self.authorities[name].dirport = self.authorities[name].orport = srv.port
                operator = OperatorApi(self)
                self.operator_server = DirPortServer(operator.handle, self.host, self.base_port,
                                                     self._operator_gate, admit=operator.admit,
                                                     refuse=operator.refuse, max_body_bytes=OPERATOR_MAX_BODY_BYTES)
                self.operator_server.listen()
            except OSError as exc:
                self.stop()
                raise NetworkError(f"cannot listen on {self.host}: {exc.strerror or exc}") from None
        else:
            for i, name in enumerate(self.names, start=1):
                self._ports[name] = self.base_port + i
                self.authorities[name].dirport = self.authorities[name].orport = self._ports[name]
        self._pool = ThreadPoolExecutor(max_workers=max(4, self.count), thread_name_prefix="fake-auth")
        self._io_pool = ThreadPoolExecutor(max_workers=min(64, max(8, self.count * (self.count - 1))),
                                           thread_name_prefix="fake-auth-io")
        self._http = httpx.Client(transport=None if self.listen else self.transport(),
                                  timeout=httpx.Timeout(max(1.0, self.timing.interval_s / 2)))
        self._write_state()
        self.started = True
        if self.virtual:
            self._schedule_round()
        else:
            self._thread = threading.Thread(target=self._run, name="fake-auth-voting", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self.population is not None:
            self.population.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for srv in self._servers.values():
            srv.close()
        if self.operator_server is not None:
            self.operator_server.close()
        for pool in (self._pool, self._io_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if self._http is not None:
            self._http.close()
        self.started = False

    def __enter__(self) -> FakeAuthorityNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _apply_initial_params(self) -> None:
        init = self._initial_params
        saved = self.state_dir / "consensus-params.json" if self.state_dir else None
        if init is None and saved is not None and os.path.lexists(saved):
            # ConsensusParams set through the operator API survive a restart, as a torrc would.
            try:
                init = {n: p for n, p in json.loads(_state_bytes(saved)).items() if n in self.authorities}
            except (ValueError, RecursionError, AttributeError):
                raise NetworkError(f"{saved}: not valid JSON") from None
        if isinstance(init, Mapping) and all(n in self.authorities for n in init):
            for name, p in init.items():
                self.authorities[name].set_consensus_params(params_lines(p))  # type: ignore[arg-type]
        elif init is not None:
            for auth in self.authorities.values():
                auth.set_consensus_params(params_lines(init))  # type: ignore[arg-type]
        self._replay_change_log()

    def _write_state(self) -> None:
        if not self.state_dir:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        info = {"operator_url": self.operator_url, "authorities": [
            {"nickname": a.nickname, "v3ident": a.v3ident, "dirport": a.dirport} for a in self.authorities.values()]}
        (self.state_dir / "network.json").write_text(json.dumps(info, indent=2) + "\n")
        token_file = self.state_dir / "operator-token"
        token_file.write_text(self.token + "\n")
        os.chmod(token_file, 0o600)

    def now(self) -> float:
        """The network's clock (POSIX seconds)."""
        return self._now()

    # -- addressing --------------------------------------------------------------------

    @property
    def operator_url(self) -> str:
        port = self.operator_server.port if self.operator_server else self.base_port
        return f"http://{self.host}:{port}"

    def authority(self, name: str) -> FakeAuthority:
        for n, a in self.authorities.items():
            if n.lower() == name.lower() or a.v3ident == name.upper():
                return a
        raise NetworkError(f"no authority named {name!r} (have {', '.join(self.names)})")

    def directory_authorities(self) -> tuple[DirectoryAuthority, ...]:
        """The fakes as DirectoryAuthority entries (for DirectoryClient or a tor DirAuthority line)."""
        return tuple(DirectoryAuthority(a.nickname, a.v3ident, self.host, a.dirport, a.orport)
                     for a in self.authorities.values())

    def certificates(self) -> list[KeyCertificate]:
        return [a.keys.certificate for a in self.authorities.values()]

    def transport(self) -> httpx.BaseTransport:
        """An httpx transport reaching every authority (and the operator API) in-process."""
        from fake_authorities.operator import OperatorApi

        operator = OperatorApi(self)

        def route(host: str, port: int) -> Route | None:
            if host != self.host:
                return None
            if port == (self.operator_server.port if self.operator_server else self.base_port):
                return operator.handle, self._operator_gate, lambda: True
            for name, p in self._ports.items():
                if p == port:
                    return self._dirport_route(name)
            return None

        return InProcessTransport(route, sleep=self._transport_sleep)

    def _dirport_route(self, name: str) -> Route:
        auth = self.authorities[name]
        return (self._apps[name].handle, self._gates[name],
                lambda: not (auth.has("down") and auth.faults["down"].mode == "refuse"))

    def _transport_sleep(self, seconds: float) -> None:
        if not self.virtual:  # on a virtual clock a slow or hanging peer costs no real time
            time.sleep(seconds)

    # -- operator actions ----------------------------------------------------------------

    def set_params(self, name: str, params: ParamsInput | None, idem_key: str = "") -> tuple[tuple[str, int], ...]:
        """Set an authority's ConsensusParams (torrc edit + SIGHUP): used from its next vote.

        Each state change is appended to the change log (time, authority, old, new lines and the
        request's Idempotency-Key, rollout.md §3.10); a PUT that changes nothing, or repeats a key
        already logged, is a no-op. With a state directory the log line is written (fsync) before
        consensus-params.json is replaced, and a restart replays the log over that file, so a change
        is either in both or in neither, whenever the process dies."""
        auth = self.authority(name)
        lines = params_lines(params)
        with self._changes_lock:
            old = tuple(auth.consensus_params)
            if idem_key and any(c["idempotency_key"] == idem_key for c in self.changes):
                return auth.vote_params()
            result = auth.set_consensus_params(lines)  # validates before anything is written
            new = tuple(auth.consensus_params)
            if new == old:
                return result
            change = {"at": self.now(), "authority": auth.nickname, "old": list(old), "new": list(new),
                      "idempotency_key": idem_key}
            self.changes.append(change)
            if self.state_dir:
                with open(self.state_dir / CHANGE_LOG, "a") as fh:
                    fh.write(json.dumps(change, sort_keys=True) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                self._save_params()
        return result

    def _save_params(self) -> None:
        saved = {n: list(a.consensus_params) for n, a in self.authorities.items()}
        path = self.state_dir / "consensus-params.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved, indent=2) + "\n")
        os.replace(tmp, path)  # never a half-written file after a kill

    def _replay_change_log(self) -> None:
        """The change log is written ahead of consensus-params.json: its newest line per authority wins."""
        path = self.state_dir / CHANGE_LOG if self.state_dir else None
        if path is None or not os.path.lexists(path):
            return
        try:
            text = read_bounded_text(path, MAX_CHANGE_LOG_BYTES, "change log", NetworkError)
            lines = text.splitlines()
            if lines and not text.endswith("\n"):
                lines.pop()  # a line cut short by a kill was never acknowledged: drop it from the file too
                with open(path, "r+b") as fh:
                    fh.truncate(len(text.encode()) - len(text.rsplit("\n", 1)[-1].encode()))
            changes = [json.loads(line) for line in lines if line.strip()]
        except (ValueError, RecursionError):
            raise NetworkError(f"{path}: not a JSON-lines change log") from None
        self.changes = changes
        latest = {c["authority"]: c["new"] for c in changes if c.get("authority") in self.authorities}
        if any(tuple(self.authorities[n].consensus_params) != tuple(v) for n, v in latest.items()):
            for n, v in latest.items():
                self.authorities[n].set_consensus_params(v)
            self._save_params()

    def inject_fault(self, name: str, fault: Fault | str) -> None:
        auth = self.authority(name)
        fault = Fault(fault) if isinstance(fault, str) else fault
        auth.set_fault(fault)
        self._sync_gate(auth)

    def clear_fault(self, name: str, kind: str | None = None) -> None:
        auth = self.authority(name)
        auth.clear_fault(kind)
        self._sync_gate(auth)

    def _sync_gate(self, auth: FakeAuthority) -> None:
        gate = self._gates[auth.nickname]
        down = auth.faults.get("down")
        slow = auth.faults.get("slow")
        gate.delay_s = slow.delay_s if slow else 0.0
        if down is not None and down.mode == "hang":
            gate.hang.set()
        else:
            gate.hang.clear()
        srv = self._servers.get(auth.nickname)
        if srv is not None:
            if down is not None and down.mode == "refuse":
                srv.stop_listening()
            elif not srv.listening:
                srv.listen()

    def attach_population(self, caches: int = 100, clients: int = 100, seed: int = 1) -> FetcherFleet:
        """Simulated relays (directory caches) and clients fetching per the propagation model."""
        from fake_authorities.fetchers import FetcherFleet

        if self.population is not None:
            self.population.stop()
        self.population = FetcherFleet(self.consensus_source(), caches=caches, clients=clients, seed=seed,
                                       clock=self.clock).start()
        return self.population

    def consensus_source(self) -> _MirrorView:
        """What the fetcher fleet may see of the authorities (``fetchers.ConsensusSource``)."""
        return _MirrorView(self)

    # -- consensus state -----------------------------------------------------------------

    def latest(self, flavour: str = "microdesc") -> Published | None:
        """The newest consensus any authority has published."""
        best: Published | None = None
        for auth in self.authorities.values():
            pub = auth.published.get(flavour)
            if pub is not None and (best is None or pub.valid_after > best.valid_after):
                best = pub
        return best

    def wait_for_consensus(self, predicate: Callable[[Published], bool] | None = None, *,
                           after: float | None = None, timeout_s: float | None = None,
                           flavour: str = "microdesc") -> Published:
        """Block until a published consensus satisfies ``predicate`` (and has valid-after >
        ``after``); TimeoutError after ``timeout_s`` (default: four intervals)."""
        timeout_s = timeout_s if timeout_s is not None else 4 * self.timing.interval_s + 2
        if self.virtual:
            return self._advance_for_consensus(predicate, after, timeout_s, flavour)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                pub = self.latest(flavour)
                if pub is not None and (after is None or pub.valid_after > after) and (
                        predicate is None or predicate(pub)):
                    return pub
                left = deadline - time.monotonic()
                if left <= 0:
                    have = "none" if pub is None else f"valid-after {pub.valid_after:.0f} params {pub.params}"
                    raise TimeoutError(f"no matching consensus within {timeout_s:g} s (latest: {have})")
                self._cond.wait(min(left, 0.5))

    def _advance_for_consensus(self, predicate: Callable[[Published], bool] | None, after: float | None,
                               timeout_s: float, flavour: str) -> Published:
        """``wait_for_consensus`` on a virtual clock: run the clock's calls until one publishes a match."""
        clock = self.clock
        deadline = as_utc(self._now() + timeout_s)
        while True:
            pub = self.latest(flavour)
            if pub is not None and (after is None or pub.valid_after > after) and (
                    predicate is None or predicate(pub)):
                return pub
            due = clock.next_due()  # type: ignore[attr-defined]
            if due is None or due > deadline:
                clock.run_until(deadline)  # type: ignore[attr-defined]
                have = "none" if pub is None else f"valid-after {pub.valid_after:.0f} params {pub.params}"
                raise TimeoutError(f"no matching consensus within {timeout_s:g} s (latest: {have})")
            clock.step()  # type: ignore[attr-defined]

    def status(self) -> dict[str, Any]:
        latest = self.latest()
        rnd = self.current_round
        return {
            "interval_s": self.timing.interval_s,
            "vote_delay_s": self.timing.vote_delay_s,
            "dist_delay_s": self.timing.dist_delay_s,
            "rounds_done": self.rounds_done,
            "next_valid_after": docs.fmt_time(rnd.valid_after) if rnd else None,
            "operator_url": self.operator_url,
            "latest_consensus": None if latest is None else {
                "valid_after": docs.fmt_time(latest.valid_after),
                "params": ConsensusParams(latest.params).format(),
                "signers": list(latest.signers),
            },
            "authorities": [a.status() for a in self.authorities.values()],
            "population": None if self.population is None else self.population.summary(),
        }

    # -- the voting loop (§2.2) ------------------------------------------------------------

    def _sleep_until(self, t: float) -> bool:
        while not self._stop.is_set():
            left = t - self._now()
            if left <= 0:
                return True
            self._stop.wait(min(left, 0.25))
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            rnd = self.timing.next_round(self._now())
            self.current_round = rnd
            try:
                if not self._round(rnd):
                    return
            except Exception as exc:  # keep voting next round; the status log tells why
                for a in self.authorities.values():
                    a.note(f"voting round failed: {type(exc).__name__}: {exc}")
            self.rounds_done += 1
            with self._cond:
                self._cond.notify_all()

    def _schedule_round(self) -> None:
        """On a virtual clock: the next round as one ``call_at`` per phase (§2.2)."""
        rnd = self.timing.next_round(self._now())
        self.current_round = rnd
        phases = [(rnd.vote_at, self._phase_vote), (rnd.late_vote_cutoff, self._phase_fetch_votes),
                  (rnd.consensus_at, self._phase_consensus), (rnd.signature_fetch_at, self._phase_fetch_signatures),
                  (rnd.valid_after, self._phase_publish)]

        def run(i: int) -> None:
            if self._stop.is_set():
                return
            try:
                phases[i][1](rnd)
            except Exception as exc:  # keep voting next round; the status log tells why
                for a in self.authorities.values():
                    a.note(f"voting round failed: {type(exc).__name__}: {exc}")
                i = len(phases) - 1
            if i + 1 < len(phases):
                self._timer = self.clock.call_at(as_utc(phases[i + 1][0]), lambda: run(i + 1))
                return
            self.rounds_done += 1
            with self._cond:
                self._cond.notify_all()
            self._schedule_round()

        self._timer = self.clock.call_at(as_utc(phases[0][0]), lambda: run(0))

    def _active(self) -> list[FakeAuthority]:
        return [a for a in self.authorities.values() if not a.has("down")]

    def _round(self, rnd: RoundTimes) -> bool:
        """One round on the wall clock: each phase at its time (the virtual clock calls them itself)."""
        for at, phase in ((rnd.vote_at, self._phase_vote), (rnd.late_vote_cutoff, self._phase_fetch_votes),
                          (rnd.consensus_at, self._phase_consensus),
                          (rnd.signature_fetch_at, self._phase_fetch_signatures),
                          (rnd.valid_after, self._phase_publish)):
            if not self._sleep_until(at):
                return False
            phase(rnd)
        return True

    def _phase_vote(self, rnd: RoundTimes) -> None:
        for a in self.authorities.values():
            a.begin_round(rnd.valid_after, rnd.late_vote_cutoff)
        vote_delay, dist_delay = self.timing.voting_delay_line()
        votes = dict(self._parallel(
            self._active(),
            lambda a: (a.nickname, a.make_vote(rnd.valid_after, rnd.fresh_until, rnd.valid_until,
                                               vote_delay, dist_delay))))
        for name, vote in votes.items():
            self._upload(self.authorities[name], "/tor/post/vote", vote, timeout_s=self.timing.vote_delay_s)

    def _phase_fetch_votes(self, rnd: RoundTimes) -> None:
        self._io([lambda a=a, i=i: self._fetch_vote(a, i) for a in self._active() for i in a.missing_voters()],
                 until=rnd.consensus_at)

    def _phase_consensus(self, rnd: RoundTimes) -> None:
        detached = dict(self._parallel(self._active(), lambda a: (a.nickname, a.compute_consensus())))
        for name, sigs in detached.items():
            if sigs:
                self._upload(self.authorities[name], "/tor/post/consensus-signature", sigs,
                             timeout_s=self.timing.dist_delay_s / 2)

    def _phase_fetch_signatures(self, rnd: RoundTimes) -> None:
        self._io([lambda a=a, p=p: self._fetch_signatures(a, p) for a in self._active() if a.needs_signatures()
                  for p in self.authorities.values() if p is not a], until=rnd.valid_after)

    def _phase_publish(self, rnd: RoundTimes) -> None:
        names = {a.v3ident: a.nickname for a in self.authorities.values()}
        for a in self._active():
            a.publish(rnd.valid_after, names)

    def _parallel(self, items: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """Run one step for each authority at once; a failing one is logged and skipped."""
        if self.virtual:  # no time passes inside a phase: run in turn, no thread hand-offs
            out = []
            for item in items:
                try:
                    out.append(fn(item))
                except Exception as exc:
                    for a in self.authorities.values():
                        a.note(f"{type(exc).__name__}: {exc}")
            return [o for o in out if o is not None]
        assert self._pool is not None
        futures = [self._pool.submit(fn, item) for item in items]
        out = []
        for f in futures:
            try:
                out.append(f.result(timeout=self.timing.interval_s))
            except Exception as exc:  # one authority's trouble must not stop the round
                for a in self.authorities.values():
                    a.note(f"{type(exc).__name__}: {exc}")
        return [o for o in out if o is not None]

    def _io(self, tasks: list[Callable[[], None]], until: float | None = None) -> None:
        """Start one request per task (each with its own timeout); wait for them at most until
        ``until``, like an authority's asynchronous connections (None: do not wait)."""
        if self.virtual:  # every exchange completes within its phase of virtual time
            for t in tasks:
                t()
            return
        assert self._io_pool is not None
        futures = [self._io_pool.submit(t) for t in tasks]
        if until is not None and futures:
            concurrent.futures.wait(futures, timeout=max(0.0, until - self._now()))

    def _url(self, auth: FakeAuthority, path: str) -> str:
        return f"http://{self.host}:{auth.dirport}{path}"

    def _upload(self, sender: FakeAuthority, path: str, body: bytes, timeout_s: float) -> None:
        """POST to every other authority at once, as an authority uploads its vote or signatures."""
        slow = sender.faults.get("slow")
        delay = slow.delay_s if slow else 0.0

        def post(peer: FakeAuthority) -> None:
            if delay and self.virtual:
                if delay >= timeout_s:
                    return  # arrives after the peer stopped waiting
            elif delay:
                time.sleep(delay)
            # a down peer: it will fetch what it misses, or go without
            self._exchange(peer, "POST", path, body, max(0.2, timeout_s))

        self._io([lambda p=p: post(p) for p in self.authorities.values() if p is not sender])

    def _get(self, peer: FakeAuthority, path: str, timeout_s: float) -> bytes | None:
        return self._exchange(peer, "GET", path, b"", max(0.2, timeout_s))

    def _exchange(self, peer: FakeAuthority, method: str, path: str, body: bytes, timeout_s: float) -> bytes | None:
        """One request to a peer's DirPort; the body of a 200 answer, else None. Over sockets
        when the network listens; otherwise handed straight to the peer's DirPort handler with
        the faults a socket shows (``transport.deliver``), without building HTTP messages: an
        hourly round on a virtual clock makes some 150 of these."""
        if not self.listen:
            req = DirRequest(method, path, {"accept-encoding": "identity"}, body)
            try:
                resp = deliver(self._dirport_route(peer.nickname), req, timeout_s, self._transport_sleep)
            except Unreachable:
                return None
            return resp.body if resp.status == 200 else None
        try:
            assert self._http is not None
            r = self._http.request(method, self._url(peer, path), content=body or None,
                                   headers={"Accept-Encoding": "identity"}, timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.content if r.status_code == 200 else None

    def _fetch_vote(self, auth: FakeAuthority, ident: str) -> None:
        """At the vote cutoff: ask a missing voter for its vote itself (§2.2)."""
        peer = self.authority(ident)
        if peer is not auth:
            body = self._get(peer, "/tor/status-vote/next/authority", self.timing.vote_delay_s / 2)
            if body:
                auth.receive_vote(body, fetched=True)

    def _fetch_signatures(self, auth: FakeAuthority, peer: FakeAuthority) -> None:
        """At VA - Dist/2: collect the signatures another authority holds (§2.2)."""
        body = self._get(peer, "/tor/status-vote/next/consensus-signatures", self.timing.dist_delay_s / 2)
        if body:
            auth.receive_signatures(body)


class _MirrorView:
    """The network as the fetcher fleet sees it (``fetchers.ConsensusSource``): a clock and
    mirrors that serve a microdesc consensus or do not answer."""

    def __init__(self, network: FakeAuthorityNetwork) -> None:
        self._network = network
        self.interval_s = float(network.timing.interval_s)
        self.scale = network.timing.scale

    def mirror_count(self) -> int:
        return self._network.count

    def served_microdesc(self, index: int) -> bytes | None:
        auth = list(self._network.authorities.values())[index]
        if auth.has("down"):
            return None
        served = auth.served_consensus("microdesc")
        return None if served is None else served.text

    def certificates(self) -> list[KeyCertificate]:
        return self._network.certificates()
