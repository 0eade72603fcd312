"""The fidelity harness's real side: one local tor network (3 authorities, 2 relays, 1 exit,
1 client; real-tor.md) and its bulk server, set up once for all cases (``RealTor``).

Each case switches ``Schedulers`` / ``KISTSchedRunInterval`` on every node over the control
port (tor applies both at once), votes its ``cc_alg`` through the authorities'
``ConsensusParams`` where it differs, then runs its repetitions on fresh circuits, with every
process's CPU, the machine's load and how long its host held the tors off. After the
repetitions a shorter transfer runs with the middle relay's scheduler debug log on, which gives
the real run period and cells per run on the busy channel; it is kept apart so the voluminous
debug log does not slow the throughput runs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import KistexpError, LocalNetError
from kistexp.fidelity.cases import TOR_SCHEDULER, Case
from kistexp.fidelity.report import RealSide
from kistexp.localnet import machine, procs
from kistexp.localnet.network import LocalNetwork, free_base_port
from kistexp.localnet.schedlog import RunStats, log_size, read_runs
from kistexp.localnet.spec import SERVICE_ADDRESS, NetworkSpec, scheduler_options
from kistexp.localnet.torrc import Node
from kistexp.localnet.traffic import MB, BulkServerProcess, download, parallel_download

#: The run-period probe moves this share of the case's transfer size, but at least
#: PERIOD_PROBE_MIN_BYTES: a shorter probe ends while congestion windows are still growing,
#: before the channel is backlogged.
PERIOD_PROBE_SHARE = 0.25
PERIOD_PROBE_MIN_BYTES = 4_000_000
WARMUP_BYTES = 200_000
#: Seconds of timer probing (``machine.probe_timers``) after the warm-up, before any case.
MACHINE_PROBE_S = 2.0
#: With ``max_stolen``: how many times one repetition is measured again while the host takes
#: more than the bound, before the last measurement is kept as it is.
STOLEN_RETRIES = 3
#: How long a ConsensusParams change may take to reach every node's consensus: one or two
#: 10 s voting periods, then the nodes' fetch (real-tor.md problem 6), and on a loaded machine
#: a round or two whose consensus the authorities fail to sign in time (problem 5's noise).
PARAMS_TIMEOUT_S = 180.0
#: A client restarted without its consensus fetches one and its microdescriptors and builds
#: its first circuits: seconds here, more on a loaded machine.
CLIENT_RESTART_TIMEOUT_S = 90.0

Progress = Callable[[str], None]


def fidelity_spec(base_port: int) -> NetworkSpec:
    """3 authorities, guard and middle relays, one exit, one client (real-tor.md)."""
    return NetworkSpec(authorities=3, relays=2, exits=1, clients=1, base_port=base_port)


@attrs.frozen
class _Repetition:
    """One timed transfer: its throughput, CPU and the machine's load when it started."""

    mbytes_per_s: float
    busiest: float  # highest share of one core used by one process
    total: float  # all processes, in cores
    cpu_per_mb: float
    load_1min: float
    stolen: float | None = None  # share of the machine's CPU time its hypervisor took
    remeasured: int = 0  # earlier tries of this repetition dropped for the host (max_stolen)
    core_wait: float | None = None  # largest share of the wall time one tor waited for a core


def _real_side(reps: Sequence[_Repetition], probe: RunStats | None) -> RealSide:
    return RealSide(tuple(r.mbytes_per_s for r in reps), max(r.busiest for r in reps), probe,
                    max(r.total for r in reps), statistics.fmean(r.cpu_per_mb for r in reps),
                    statistics.fmean(r.load_1min for r in reps),
                    tuple(r.stolen for r in reps if r.stolen is not None), sum(r.remeasured for r in reps),
                    tuple(r.core_wait for r in reps if r.core_wait is not None))


class RealTor:
    """A local network plus the bulk server, set up once for a series of cases.

    ``root``: keep the network there (default: a temporary directory, removed on close).
    ``max_stolen``: measure a repetition again (at most ``STOLEN_RETRIES`` times) while the
    machine's host took more than this share of its CPU time during it (None: never).
    """

    def __init__(self, root: Path | str | None = None, base_port: int | None = None,
                 progress: Progress | None = None, max_stolen: float | None = None) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="kistexp-fidelity-"))
        self._base_port = base_port
        self._progress = progress or (lambda _msg: None)
        self.net: LocalNetwork | None = None
        self._server: BulkServerProcess | None = None
        self._cc_alg = 2  # tor's default; the fidelity network's authorities vote no cc_alg
        self.timers: machine.TimerLateness | None = None
        self.max_stolen = max_stolen

    def __enter__(self) -> RealTor:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout_s: float = 90.0) -> None:
        base = self._base_port or free_base_port(fidelity_spec(15000).node_count)
        spec = fidelity_spec(base)
        self._progress(f"starting a local tor network in {self.root} (ports {base}..{spec.service_port})")
        self.net = LocalNetwork.create(self.root, spec)
        self._server = BulkServerProcess(spec.service_port)
        self.net.start(consensus_timeout_s=timeout_s)
        self.net.wait_bootstrapped(timeout_s)
        guard, middle = self.net.by_role("relay")[:2]
        self.exit = self.net.by_role("exit")[0]
        self.guard, self.middle = guard, middle
        self.client = self.net.by_role("client")[0]
        self._pin_path()
        # One small transfer proves the pinned path works before any case is timed.
        self._progress("checking the pinned path guard -> middle -> exit")
        download(self.client.socks_port, SERVICE_ADDRESS, spec.service_port, WARMUP_BYTES, f"warmup-{uuid.uuid4().hex}")
        self._progress(f"timing this machine's timers for {MACHINE_PROBE_S:g} s")
        self.timers = machine.probe_timers(MACHINE_PROBE_S)

    def close(self) -> None:
        if self.net is not None:
            self.net.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def configure(self, case: Case) -> None:
        """The case's cc_alg in every node's consensus; then scheduler and run interval on every
        node: the relays' interval on the relays, the client's on the client (the torrc option
        overrides KISTSchedRunInterval[Client] of the consensus, kist-ewma.md §5.1). In this
        order because a cc_alg change may restart the client, which forgets options set over
        its control port."""
        assert self.net is not None
        self.set_cc_alg(case.spec.cc_alg)
        for node in self.net.nodes:
            iv = case.client_interval_ms if node.role == "client" else case.interval_ms
            lines = scheduler_options(TOR_SCHEDULER[case.scheduler], iv)
            self.net.set_conf(node.nickname, dict(line.split(" ", 1) for line in lines))

    def _pin_path(self) -> None:
        assert self.net is not None
        self.net.pin_path(self.client.nickname, self.guard.nickname, self.middle.nickname, self.exit.nickname)

    def set_cc_alg(self, cc_alg: int) -> None:
        """Vote ``cc_alg`` on every authority (ConsensusParams, SIGHUP) and wait until the client
        and every relay of the path hold a consensus carrying it: the client negotiates
        congestion control per new circuit from its consensus (congestion_control_enabled(),
        congestion_control_common.c), the exit accepts it by its own.

        The client does not wait for its own fetch: tor 0.4.9 strands a client whose consensus
        still has congestion control on once relays hold cc_alg=0. Its ntor-v3 handshakes ask
        for congestion control and the v1 relay cell format together, and a relay without
        congestion control refuses that pair ("The V1 cell format is incompatible with pre-CC
        circuits", negotiate_v3_ntor_server_circ_params(), onion_crypto.c), its one-hop
        directory circuits included, so it cannot fetch the consensus that would free it
        (docs/localnet.md, Pitfalls). Once the authorities publish the new value, the client
        restarts without its cached consensus and bootstraps from them again, as a new client
        would."""
        assert self.net is not None
        if self._cc_alg == cc_alg:
            return
        self._progress(f"voting cc_alg={cc_alg} and waiting for the authorities' consensus")
        for auth in self.net.authorities:
            params = ConsensusParams.from_pairs(self.net.params(auth)).with_values(cc_alg=cc_alg)
            self.net.set_consensus_params(auth.nickname, params.as_dict())
        self._poll_cc_alg(cc_alg, self.net.authorities)
        if _consensus_cc_alg(self.net, self.client.nickname) != cc_alg:
            self._progress(f"restarting {self.client.nickname} without its cached consensus")
            self.net.restart_client(self.client.nickname, timeout_s=CLIENT_RESTART_TIMEOUT_S)
            self._pin_path()
        self._progress(f"waiting for cc_alg={cc_alg} in every node's consensus")
        self._poll_cc_alg(cc_alg, (self.client, self.guard, self.middle, self.exit))
        # Circuits built before the change keep the flow control they negotiated, and a clean
        # preemptive one takes the next new SOCKS username (NEWNYM would not retire it: a circuit
        # no stream has used is compatible with every isolation). Both runs of 2026-12-02 showed
        # it: the first cc-off download, on such a circuit, moved 8.2 MB/s, the others 6.1-6.9.
        with self.net.control(self.client.nickname) as ctl:
            ctl.close_circuits()
        self._cc_alg = cc_alg

    def _poll_cc_alg(self, cc_alg: int, nodes: Sequence[Node]) -> None:
        assert self.net is not None
        net = self.net
        names = ", ".join(n.nickname for n in nodes)
        try:
            procs.poll(f"cc_alg={cc_alg} in the consensus of {names}",
                       lambda: all(_consensus_cc_alg(net, n.nickname) == cc_alg for n in nodes),
                       PARAMS_TIMEOUT_S, interval_s=1.0)
        except LocalNetError as exc:
            # say who holds what: a node that never fetched, or authorities that never agreed
            held = ", ".join(f"{n.nickname} {_consensus_cc_alg(net, n.nickname)}" for n in net.nodes)
            raise LocalNetError(f"{exc} (cc_alg in each consensus now: {held})") from None

    def _transfer(self, case: Case, size: int, tag: str) -> float:
        assert self.net is not None
        port = self.net.spec.service_port
        stem = f"{case.label}-{tag}-{uuid.uuid4().hex[:8]}"
        spec = case.spec
        if spec.circuits == 1 and spec.streams == 1:
            return download(self.client.socks_port, SERVICE_ADDRESS, port, size, stem).throughput_mbytes_per_s
        # one SOCKS username per circuit (IsolateSOCKSAuth); streams of one circuit share it
        names = [f"{stem}-{i}" for i in range(spec.circuits) for _ in range(spec.streams)]
        per_stream = max(1, size // len(names))
        measured = parallel_download(self.client.socks_port, SERVICE_ADDRESS, port, per_stream, names)
        return measured.throughput_mbytes_per_s

    def _cpu_sample(self) -> dict[str, float]:
        assert self.net is not None
        sample = {n.nickname: procs.cpu_seconds(self.net.pid(n)) or 0.0 for n in self.net.nodes}
        t = os.times()
        sample["client-measurer"] = t.user + t.system
        if self._server is not None:
            sample["bulk-server"] = procs.cpu_seconds(self._server.pid) or 0.0
        return sample

    def _core_wait_sample(self) -> dict[str, float]:
        """Each relay's and the client's time waiting for a core so far (authorities are idle
        during transfers); empty before the network runs or where the kernel keeps no account."""
        if self.net is None:
            return {}
        waits = {n.nickname: procs.core_wait_seconds(self.net.pid(n)) for n in self.net.nodes
                 if n.role != "authority"}
        return {k: v for k, v in waits.items() if v is not None}

    def _repetition(self, case: Case, size_bytes: int, tag: str) -> _Repetition:
        """One timed transfer of ``case`` (already configured), with every process's CPU and how
        long the tors waited for a core."""
        load = os.getloadavg()[0]
        ticks = machine.cpu_ticks()
        waited = self._core_wait_sample()
        before, t0 = self._cpu_sample(), time.monotonic()
        value = self._transfer(case, size_bytes, tag)
        after, wall = self._cpu_sample(), time.monotonic() - t0
        spent = [after[k] - before.get(k, 0.0) for k in after]
        waits = [w - waited[k] for k, w in self._core_wait_sample().items() if k in waited]
        return _Repetition(value, max(x / wall for x in spent), sum(spent) / wall,
                           sum(spent) / (size_bytes / MB), load, machine.stolen_fraction(ticks, machine.cpu_ticks()),
                           core_wait=max(waits) / wall if waits and wall > 0 else None)

    def _calm_repetition(self, case: Case, size_bytes: int, tag: str) -> _Repetition:
        """``_repetition``, measured again while the host took more than ``max_stolen`` of the
        machine's CPU time during it: the simulator's nodes have cores of their own, and a
        repetition the host held off measures the host (docs/fidelity.md). After
        ``STOLEN_RETRIES`` tries the last one is kept, and the report counts the dropped ones."""
        rep = self._repetition(case, size_bytes, tag)
        tries = 0
        while (self.max_stolen is not None and rep.stolen is not None and rep.stolen > self.max_stolen
               and tries < STOLEN_RETRIES):
            tries += 1
            self._progress(f"real tor {case.label}: the host took {rep.stolen:.1%} of the CPU time; "
                           f"measuring again ({tries}/{STOLEN_RETRIES})")
            rep = self._repetition(case, size_bytes, f"{tag}-again{tries}")
        return attrs.evolve(rep, remeasured=tries)

    def _probe(self, case: Case, size_bytes: int) -> RunStats:
        probe = max(PERIOD_PROBE_MIN_BYTES, int(size_bytes * PERIOD_PROBE_SHARE))
        return self.run_period(case, probe)

    def measure(self, case: Case, repetitions: int, size_bytes: int, period_probe: bool = True) -> RealSide:
        """Every repetition of one case back to back, then its run-period probe."""
        assert self.net is not None
        self.configure(case)
        reps = []
        for rep in range(repetitions):
            self._progress(f"real tor {case.label}: repetition {rep + 1}/{repetitions}")
            reps.append(self._calm_repetition(case, size_bytes, f"r{rep}"))
        return _real_side(reps, self._probe(case, size_bytes) if period_probe else None)

    def measure_case_by_case(self, cases: Sequence[Case], repetitions: int,
                             size_bytes: int) -> tuple[dict[Case, RealSide], dict[Case, str]]:
        """``measure`` for each case in turn; a case that fails gets its error as its note."""
        sides: dict[Case, RealSide] = {}
        notes: dict[Case, str] = {}
        for case in cases:
            try:
                sides[case] = self.measure(case, repetitions, size_bytes)
            except KistexpError as exc:
                notes[case] = str(exc)
        return sides, notes

    def measure_interleaved(self, cases: Sequence[Case], repetitions: int, size_bytes: int,
                            period_probe: bool = True) -> tuple[dict[Case, RealSide], dict[Case, str]]:
        """The cases in rounds: repetition 1 of every case, then repetition 2 of every case, and
        so on, so that a slow stretch of the machine (real-tor.md puts run-to-run noise at
        10-20 %) falls on every case alike instead of on the few measured during it, and an
        order between two cases is one the machine kept throughout. Cases with another
        ``cc_alg`` form their own rounds, after the others: each change of it is a vote and a
        wait for every node's consensus (``set_cc_alg``). A case that fails is dropped from
        the later rounds with its error as its note. The run-period probes follow the rounds."""
        assert self.net is not None
        groups: dict[int, list[Case]] = {}
        for case in cases:
            groups.setdefault(case.spec.cc_alg, []).append(case)
        reps: dict[Case, list[_Repetition]] = {c: [] for c in cases}
        notes: dict[Case, str] = {}
        sides: dict[Case, RealSide] = {}
        for group in sorted(groups.values(), key=lambda g: g[0].spec.cc_alg != self._cc_alg):
            for rep in range(repetitions):
                for case in group:
                    if case in notes:
                        continue
                    self._progress(f"real tor {case.label}: repetition {rep + 1}/{repetitions} (in rounds)")
                    try:
                        self.configure(case)
                        reps[case].append(self._calm_repetition(case, size_bytes, f"r{rep}"))
                    except KistexpError as exc:
                        notes[case] = str(exc)
            for case in group:
                if case in notes:
                    continue
                try:
                    probe = None
                    if period_probe:
                        self.configure(case)
                        probe = self._probe(case, size_bytes)
                    sides[case] = _real_side(reps[case], probe)
                except KistexpError as exc:
                    notes[case] = str(exc)
        return sides, notes

    def run_period(self, case: Case, size_bytes: int) -> RunStats:
        """Scheduler runs on the middle relay during a transfer with its debug log on."""
        assert self.net is not None
        self._progress(f"real tor {case.label}: scheduler run period")
        path = self.net.set_sched_debug(self.middle.nickname, True)
        offset = log_size(path)
        try:
            self._transfer(case, size_bytes, "period")
        finally:
            self.net.set_sched_debug(self.middle.nickname, False)
        return read_runs(path, offset)


def _consensus_cc_alg(net: LocalNetwork, name: str) -> int | None:
    """cc_alg in the microdesc consensus a node holds (2, tor's default, when absent)."""
    with net.control(name) as ctl:
        doc = ctl.get_info("dir/status-vote/current/consensus-microdesc")
    for line in doc.splitlines():
        if line.startswith("params"):
            return ConsensusParams.parse(line).get("cc_alg", 2)
    return None
