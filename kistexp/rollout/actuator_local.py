"""The local tor network actuator: `kistexp run --authorities local` (rollout.md §4 "Local real tor").

The network is `kistexp.localnet`: Debian's tor as directory authorities on 127.0.0.1, voting every
``V3AuthVotingInterval`` seconds (10 s and up under ``TestingTorNetwork``; one plan hour per round).
To act on authority A the actuator writes A's whole ``ConsensusParams`` line to its ``params.inc``
(which A's torrc ``%include``s; checked as tor would vote it before anything is written; temp file
and rename), sends ``SIGNAL RELOAD`` over A's ControlPort with stem's ``Controller`` (the same as
SIGHUP, control-spec §3.7) and reads back ``GETCONF ConsensusParams`` on the same connection. That
is tor's configuration, not yet its vote: success is what A's next vote
(``/tor/status-vote/next/authority`` before valid-after, ``current/authority`` after) and then the
consensus show, fetched from the DirPorts through the directory client and its signature checks.

One control connection per action, opened and closed here: nothing stays connected while the
engine waits or when the network stops. ``LocalTorRun`` makes (or attaches to) the network before
the run and stops it after.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from kistexp.clock import Clock
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.schedule import AcceleratedSchedule
from kistexp.errors import KistexpError
from kistexp.rollout.actuators import OWN_KEYS, ActuationError, DirectoryObserver, Intent, Params, _parse_lines
from kistexp.rollout.spec import Cadence, RolloutError

CHANGE_LOG = "changes.jsonl"
#: relays, exits and measurement clients of the network a measured run makes: six relays that carry
#: the clients' circuits (three hops each, so every transfer crosses a relay running the stage's
#: value), and two vantage points, as OnionPerf measures from more than one place.
MEASURED_NETWORK = (4, 2, 2)  # in the network's directory: every params.inc rewrite, with its key


def local_cadence(interval_s: int, delay_s: int) -> Cadence:
    """The engine's view of the network's voting: the torrc's interval and delays, aligned to
    wall-clock multiples of the interval as tor aligns them, ``V3AuthNIntervalsValid 2``.

    The engine's margin before tor builds its vote is a quarter interval (2.5 s at 10 s), not the
    interval/20 of an accelerated network: acting on three authorities (params.inc, a control
    connection, RELOAD, GETCONF, each journaled with fsync) took 0.2-0.3 s on the 2-core test host,
    and with a 1 s margin the last reload once came 0.1 s after the vote's nominal time.
    """
    return Cadence.of(AcceleratedSchedule.scaled(interval_s, float(delay_s), float(delay_s), n_intervals_valid=2),
                      margin_s=interval_s / 4)


def _line(params: Mapping[str, int]) -> str:
    return ConsensusParams(params).format()


class LocalTorActuator:
    """Acts on a running ``LocalNetwork``; ``names`` maps the plan's authority nicknames to the
    network's (auth000, ...)."""

    name = "local"

    def __init__(self, net, directory, clock: Clock, names: Mapping[str, str], cadence: Cadence,
                 seen: Mapping[dt.datetime, Params] | None = None) -> None:
        self.net, self.clock, self.cadence = net, clock, cadence
        self.names = dict(names)
        self._plan_name = {v: k for k, v in self.names.items()}
        self.observer = DirectoryObserver(directory, clock)
        # consensuses seen, by valid-after: on resume, the journal's (windows missed while the run was
        # down are collected late and must be drawn for the value nodes held then)
        self._held: dict[dt.datetime, Params] = dict(seen or {})
        self.history = _HeldConsensus(self)  # for the predicted metrics: which value nodes held

    def _node(self, authority: str) -> str:
        try:
            return self.names[authority]
        except KeyError:
            raise ActuationError(f"{authority}: not an authority of the local network in {self.net.root}") from None

    def current(self, authority: str) -> Params | None:
        """``GETCONF ConsensusParams``: what tor is configured with now (None when it does not answer)."""
        try:
            with self.net.control(self._node(authority)) as ctl:
                return _parse_lines(ctl.get_conf("ConsensusParams"))
        except KistexpError:
            return None

    def apply(self, intent: Intent) -> str:
        authority, desired, idem_key = intent.authority, intent.desired, intent.idem_key
        node = self._node(authority)
        if not self.net.is_running(self.net.node(node)):
            # nothing written: a tor started later must not read a set made without its current keys
            raise ActuationError(f"{authority} ({node}): tor is not running (kistexp localnet up {self.net.root})")
        try:
            old = dict(self.net.params(self.net.node(node)))
            self.net.write_consensus_params(node, tuple(sorted(desired.items())))
            with self.net.control(node) as ctl:
                ctl.reload()
                configured = _parse_lines(ctl.get_conf("ConsensusParams"))
        except KistexpError as exc:
            raise ActuationError(f"{authority} ({node}): {exc}") from None
        if configured != desired:
            raise ActuationError(f"{authority} ({node}): after the reload GETCONF ConsensusParams is "
                                 f"{_line(configured) or '(none)'}, not {_line(desired) or '(none)'}")
        self._log(authority, node, old, desired, idem_key)
        return (f"{node}: params.inc ConsensusParams {_line(desired) or '(none)'}; SIGNAL RELOAD; "
                f"GETCONF ConsensusParams={_line(configured) or '(none)'}; used from its next vote")

    def _log(self, authority: str, node: str, old: Params, new: Params, idem_key: str) -> None:
        entry = {"at": self.clock.now().isoformat(), "authority": authority, "node": node, "old": old, "new": new,
                 "idem_key": idem_key}
        with open(self.net.root / CHANGE_LOG, "a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _until(self, valid_after: dt.datetime, fetch):
        """Poll ``fetch`` (-> (final, answer)) until it is final or the round's documents should long be
        out: tor posts its vote at voting-starts and its consensus at valid-after, a loaded host late."""
        deadline = valid_after + dt.timedelta(seconds=self.cadence.check_delay_s + self.cadence.interval_s / 4)
        while True:
            final, got = fetch()
            now = self.clock.now()
            if final or now >= deadline:
                return got
            self.clock.sleep_until(min(deadline, now + dt.timedelta(seconds=0.25)))

    def fetch_vote(self, authority: str, valid_after: dt.datetime) -> Params | None:
        node = self._node(authority)

        def vote():
            got = self.observer.fetch_vote(node, valid_after)
            return got is not None, got

        return self._until(valid_after, vote)

    def _served(self) -> tuple[dt.datetime, Params, list[str]] | None:
        """The consensus the DirPorts serve now (signature-checked), remembered by its valid-after."""
        try:
            doc = self.observer.directory.fetch_consensus("microdesc")
        except KistexpError:
            return None
        params = {k: v for k, v in doc.params if k not in OWN_KEYS}
        self._held[doc.valid_after] = params
        return doc.valid_after, params, [self._plan_name.get(a.nickname, a.nickname) for a in doc.authorities]

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        def exact():
            got = self._served()
            if got is None or got[0] < valid_after:
                return False, None  # not out yet: ask again
            return True, (got if got[0] == valid_after else None)  # a later one: this round is over

        got = self._until(valid_after, exact)
        return (None, []) if got is None else (got[1], got[2])

    def fetch_round(self, valid_after: dt.datetime | None = None):
        """The voters and signers of the consensus of ``valid_after``, by the plan's names."""
        got = self.observer.fetch_round(valid_after)
        if got is None:
            return None
        return attrs.evolve(got, voters=tuple(self._plan_name.get(a, a) for a in got.voters),
                            signers=tuple(self._plan_name.get(a, a) for a in got.signers))

    def held_at(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        """The consensus nodes hold at ``valid_after``. The DirPorts serve only the current one, so
        an earlier one is the newest this run saw at or before it (None before the first)."""
        self._served()
        older = [va for va in self._held if va <= valid_after]
        return (self._held[max(older)], []) if older else (None, [])


class _HeldConsensus:
    """``fetch_consensus`` as the metric source asks it: what nodes held at a valid-after."""

    def __init__(self, actuator: LocalTorActuator) -> None:
        self.actuator = actuator

    def fetch_consensus(self, valid_after: dt.datetime) -> tuple[Params | None, list[str]]:
        return self.actuator.held_at(valid_after)


class _HeldLabels:
    """An instrument whose samples are labelled with the consensus their nodes held when they were
    measured (``valid_after``), from the held-consensus watch, so the engine can leave out samples
    taken while nodes were mid-switch. ``nodes`` are the nodes whose value the sample reflects: the
    relay itself for its MetricsPort and /proc, every relay for a client's transfer (the scheduler
    that moves its cells runs on the relays of its circuit; a client's own value is another param,
    ``KISTSchedRunIntervalClient``, and clients take a new consensus up later than relays). With
    several nodes the label is the oldest consensus any of them held: a sample is the stage's only
    once every relay it may have crossed runs the stage's value."""

    def __init__(self, inner, watch, nodes: tuple[str, ...]) -> None:
        self.inner, self.watch, self.nodes = inner, watch, tuple(nodes)
        self.name, self.kind, self.metrics = inner.name, inner.kind, inner.metrics

    def _oldest(self, t: dt.datetime) -> dt.datetime | None:
        held = [self.watch.held(n, t) for n in self.nodes]
        vas = [h.valid_after for h in held if h is not None and h.valid_after is not None]
        return min(vas) if vas else None

    def poll(self, now: dt.datetime):
        from kistexp.metrics.series import Sample

        reading = self.inner.poll(now)
        labelled = []
        for metric, s in reading.samples:
            va = self._oldest(s.time)
            if va is not None:
                s = Sample(s.time, s.value, {**s.labels, "valid_after": va.isoformat()}, s.param_value)
            labelled.append((metric, s))
        return attrs.evolve(reading, samples=tuple(labelled))

    def close(self) -> None:
        self.inner.close()


# --- the network a run drives ----------------------------------------------------------------------

def authority_names(plan_nicknames: tuple[str, ...], local: tuple[str, ...], where: str) -> dict[str, str]:
    """Plan authority -> network authority: by nickname when the plan uses the network's, else by
    position (the plan's first authority is auth000). The counts must agree: T, the configured
    authorities, decides which params enter the consensus (dirvote.c ``dirvote_compute_params``)."""
    if len(plan_nicknames) != len(local):
        raise RolloutError(f"{where}: the plan configures {len(plan_nicknames)} authorities, the local network "
                           f"{len(local)} ({', '.join(local)}); tor's params rule counts them, so they must agree")
    if set(plan_nicknames) == set(local):
        return {n: n for n in plan_nicknames}
    return dict(zip(plan_nicknames, local, strict=True))


@attrs.define
class LocalTorRun:
    """The local network of one ``kistexp run``: ``EXP/localnet`` (made for the run, stopped when it
    ends) or an existing one given by ``--localnet`` (stopped only if the run started it)."""

    net: object
    names: dict[str, str]
    cadence: Cadence
    owned: bool  # EXP/localnet: the run's own network
    started_here: bool  # this process started some of its tors
    client: object = None
    measurement: object = None  # kistexp.localnet.measure.MeasurementClient of a measured run
    watch: object = None  # kistexp.localnet.heldconsensus.HeldConsensusWatch of a measured run

    @classmethod
    def prepare(cls, plan, exp_path: Path, localnet: Path | None, interval_s: int,
                start_timeout_s: float = 180.0, measured: bool = False) -> LocalTorRun:
        """Make or load the network, start whatever of it is not running and wait for its consensus.
        A new network votes the plan's baseline (the participants its values, the others per ``others``).
        A measured run's new network also has relays, exits and measurement clients (MEASURED_NETWORK),
        whose traffic the run's criteria are judged on; a network without them cannot be measured."""
        from kistexp.localnet import LocalNetwork, NetworkSpec
        from kistexp.localnet.network import STATE_FILE, free_base_port
        from kistexp.rollout.dryrun import initial_configs
        from kistexp.rollout.spec import spec_from_plan

        root = Path(localnet) if localnet is not None else Path(exp_path) / "localnet"
        nicknames = tuple(a.nickname for a in plan.authorities.authorities)
        made = False
        if (root / STATE_FILE).exists():
            net = LocalNetwork.load(root)
        elif localnet is not None:
            raise RolloutError(f"--localnet {root}: no local tor network there (make one with `kistexp localnet up "
                               f"{root} --authorities {len(nicknames)}`, or leave --localnet out to have the run "
                               "make its own in EXP/localnet)")
        else:
            baseline = initial_configs(spec_from_plan(plan, local_cadence(interval_s, 2)))
            relays, exits, clients = MEASURED_NETWORK if measured else (0, 0, 0)
            spec = NetworkSpec(authorities=len(nicknames), relays=relays, exits=exits, clients=clients,
                               base_port=free_base_port(len(nicknames)), voting_interval_s=interval_s,
                               consensus_params=tuple(tuple(sorted(baseline[n].items())) for n in nicknames))
            net = LocalNetwork.create(root, spec)
            made = True
        names = authority_names(nicknames, tuple(n.nickname for n in net.authorities), str(root))
        if measured and (not net.by_role("client") or not net.by_role("exit")):
            raise RolloutError(f"{root}: the local network has no exit or no client to measure with; make one with "
                               f"`kistexp localnet up DIR --relays 4 --exits 2 --clients 2`, or rehearse on "
                               "predictions with --metrics predicted")
        started = any(not net.is_running(n) for n in net.nodes)
        if started:
            # eleven tors of a measured network bootstrap on a shared machine: give the relays' first
            # listing in the consensus longer than an authorities-only network needs
            try:
                net.start(consensus_timeout_s=start_timeout_s if measured else 60.0)
            except BaseException:
                net.stop()  # a network that never came up is not left running
                raise
        run = cls(net, names, local_cadence(net.spec.voting_interval_s, net.spec.vote_delay_s),
                  owned=localnet is None, started_here=made or started)
        try:
            net.wait_for_consensus(timeout_s=start_timeout_s)
        except BaseException:
            run.close(refused=True)
            raise
        return run

    def actuator(self, clock: Clock, journal) -> LocalTorActuator:
        self.client = self.net.directory_client(retries=1, timeout_s=max(1.0, self.cadence.interval_s / 4))
        seen = {c["valid_after"]: c["params"] for c in journal.consensuses() if c["params"] is not None}
        return LocalTorActuator(self.net, self.client, clock, self.names, self.cadence, seen)

    def start_measuring(self, exp_path: Path, clock: Clock, period_s: float | None = None) -> list:
        """Measure the network as OnionPerf and relay operators would (issue 32): the measurement
        clients' transfers and interactive probes (``kistexp.localnet.measure``, OnionPerf analysis
        JSON in EXP/measurements/onionperf read back by the OnionPerf collector), every relay's
        MetricsPort and /proc, and a watch of the consensus each relay and client holds, which labels
        every sample with the valid-after its node held and answers the exposure checks. Stopped by
        ``close``. ``period_s``: seconds between transfers per vantage point (default a fifth of the
        voting interval: about five transfers per plan hour and vantage point, as OnionPerf makes 12)."""
        from kistexp.localnet.heldconsensus import HeldConsensusWatch
        from kistexp.localnet.measure import MeasurementClient, MeasurementConfig
        from kistexp.metrics.instruments import MetricsPortInstrument, OnionPerfInstrument, ProcInstrument

        out = Path(exp_path) / "measurements"
        relays = [*self.net.by_role("relay"), *self.net.by_role("exit")]
        clients = list(self.net.by_role("client"))
        interval = self.cadence.interval_s
        self.watch = HeldConsensusWatch(self.net, [n.nickname for n in relays + clients], out / "held",
                                        period_s=min(1.0, interval / 10))
        self.watch.start()
        self.measurement = MeasurementClient(self.net, MeasurementConfig(
            out_dir=out / "onionperf", period_s=period_s or max(0.5, interval / 5),
            transfer_timeout_s=max(30.0, 3 * interval), max_concurrent=2, interactive_period_s=max(0.5, interval / 10)))
        self.measurement.start()
        now = clock.now()
        watched: list = []
        on_path = tuple(r.nickname for r in relays)
        for v in self.measurement.vantages:
            watched.append(_HeldLabels(OnionPerfInstrument(v, out / "onionperf", since=now), self.watch, on_path))
            watched.append(_HeldLabels(self.measurement.interactive_instrument(v), self.watch, on_path))
        for r in relays:
            watched.append(_HeldLabels(MetricsPortInstrument(r.nickname, f"http://127.0.0.1:{r.metrics_port}/metrics",
                                                             clock=clock), self.watch, (r.nickname,)))
            pid = self.net.pid(r)
            if pid is not None:
                watched.append(_HeldLabels(ProcInstrument(r.nickname, pid, expect_name="tor", clock=clock),
                                           self.watch, (r.nickname,)))
        return watched

    def params_at(self, valid_after_unix: float) -> dict | None:
        """The params of the consensus of a valid-after, as any watched node held it (None: unseen)."""
        if self.watch is None:
            return None
        for node in self.watch.nodes:
            for held in self.watch.history(node):
                if held.valid_after is not None and abs(held.valid_after.timestamp() - valid_after_unix) < 0.5:
                    return dict(held.params)
        return None

    def exposure_probe(self):
        """Who runs the stage's values, from the held-consensus watch (``start_measuring``)."""
        from kistexp.rollout.exposure import NodeExposureProbe, NodeView

        roles = {n.nickname: ("clients" if n.role == "client" else "relays") for n in self.net.nodes}

        def views(at: dt.datetime) -> list[NodeView]:
            out = []
            for node, held in self.watch.snapshot(at).items():
                if held is None:
                    out.append(NodeView(node, roles[node], None))
                else:
                    pinned = {} if held.pinned_ms is None else {"KISTSchedRunInterval": held.pinned_ms}
                    out.append(NodeView(node, roles[node], dict(held.params), pinned))
            return out

        return NodeExposureProbe(views, self.cadence)

    def close(self, refused: bool = False) -> None:
        """End of the run: stop the measurement, then the network if it is the run's own or the run
        started it. A run refused before it began (another run holds the directory) stops only what it
        started itself."""
        if self.measurement is not None:
            self.measurement.stop(timeout_s=10.0)
            self.measurement = None
        if self.watch is not None:
            self.watch.stop(timeout_s=5.0)
            self.watch = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.started_here or (self.owned and not refused):
            self.net.stop()
