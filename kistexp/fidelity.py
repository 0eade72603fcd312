"""Fidelity harness: the same scenarios on a real local tor network and in the simulator,
side by side (issue 4 point 7; real-tor.md "Throughput"; kist-ewma.md §5.2, §12).

Scenarios (``FIDELITY_SCENARIOS``; every one also runs alone as ``kistexp sim experiment``):

* ``circuit``: one bulk download over a pinned 3-hop path (guard -> middle -> exit).
* ``circuits-2``, ``circuits-4``, ``ceiling`` (8): that many simultaneous downloads on as many
  circuits over the same pinned path, so they share one channel per hop; with KISTLite that
  channel moves at most 64 cells per run.
* ``streams-4``: one download split over 4 streams of one circuit (one SOCKS username).
* ``client-10ms``: one circuit, relays at the case's interval, the client at 10 ms
  (``KISTSchedRunIntervalClient``; here its torrc twin, which overrides it, kist-ewma.md §5.1).
* ``cc-off``: one circuit with congestion control off: ``cc_alg=0`` voted by the authorities'
  ``ConsensusParams``, so circuits use the fixed SENDME windows (§13.1).

Real side: one local network (3 authorities, 2 relays, 1 exit, 1 client) for all cases;
each case switches ``Schedulers`` / ``KISTSchedRunInterval`` on every node over the
control port (tor applies both at once), then runs its repetitions on fresh circuits.
After the repetitions a shorter transfer runs with the middle relay's scheduler debug log
on, which gives the real run period and cells per run on the busy channel; it is kept
apart so the voluminous debug log does not slow the throughput runs.

Sim side: the scenario registry (``kistexp.sim.scenarios``), one run per seed, built like the
real scenario from one :class:`~kistexp.sim.scenarios.PathScenario` (same path, circuits,
streams, bytes, intervals and flow control). The single-relay ``ceiling()`` experiment
measures a channel kept backlogged in steady state, which is not what the real scenario
measures for KIST and Vanilla, so it is not compared here.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from kistexp.asciinum import ascii_uint
from kistexp.errors import KistexpError, LocalNetError, SimConfigError
from kistexp.localnet import machine, procs
from kistexp.localnet.network import LocalNetwork, free_base_port, have_tor
from kistexp.localnet.schedlog import RunStats, log_size, read_runs
from kistexp.localnet.spec import SERVICE_ADDRESS, NetworkSpec, scheduler_options
from kistexp.localnet.torrc import Node
from kistexp.localnet.traffic import MB, BulkServerProcess, download, parallel_download

SCHEDULERS = ("kist", "kistlite", "vanilla")
TOR_SCHEDULER = {"kist": "KIST", "kistlite": "KISTLite", "vanilla": "Vanilla"}
CEILING_CIRCUITS = 8


@attrs.frozen
class FidelityScenario:
    """One real-tor scenario and its twin in the simulator's registry."""

    name: str
    sim: str  # name in kistexp.sim.scenarios.REGISTRY
    circuits: int = 1
    streams: int = 1
    client_interval_ms: int | None = None  # None: the case's interval
    cc_alg: int = 2
    schedulers: tuple[str, ...] = ("kist", "kistlite")  # defaults when --schedulers is not given
    intervals_ms: tuple[int, ...] = (2, 10)
    doc: str = ""


FIDELITY_SCENARIOS: Mapping[str, FidelityScenario] = {s.name: s for s in (
    FidelityScenario("circuit", "circuit", schedulers=SCHEDULERS, doc="one download, one circuit"),
    FidelityScenario("ceiling", "ceiling-path", circuits=CEILING_CIRCUITS, schedulers=SCHEDULERS,
                     doc="8 downloads on 8 circuits sharing the path"),
    FidelityScenario("circuits-2", "ceiling-path", circuits=2, doc="2 downloads on 2 circuits"),
    FidelityScenario("circuits-4", "ceiling-path", circuits=4, doc="4 downloads on 4 circuits"),
    FidelityScenario("streams-4", "circuit", streams=4, doc="one download split over 4 streams of one circuit"),
    FidelityScenario("client-10ms", "circuit", client_interval_ms=10, intervals_ms=(2,),
                     doc="one circuit, relays at the interval, client at 10 ms"),
    FidelityScenario("cc-off", "circuit", cc_alg=0, doc="one circuit, cc_alg=0 (SENDME windows)"),
)}
SCENARIOS = tuple(FIDELITY_SCENARIOS)
#: A tor process (or the measuring client) busier than this share of one core during a
#: repetition makes the figure CPU-bound on this machine: reported, not compared.
CPU_BOUND_FRACTION = 0.85
#: Issue 4's target: the simulator's mean within this share of real tor's mean.
TARGET_RATIO_TOLERANCE = 0.25
#: Real tor orders two rows clearly when the ranges of their repetitions do not overlap and the
#: faster mean is at least this much above the slower: real-tor.md puts run-to-run noise at
#: 10-20 %, so three tight repetitions a few per cent apart are not an order.
ORDER_MARGIN = 0.10
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


@attrs.frozen
class Case:
    scenario: str
    scheduler: str  # kist | kistlite | vanilla
    interval_ms: int

    @property
    def label(self) -> str:
        return f"{self.scenario}/{self.scheduler}/{self.interval_ms}ms"

    @property
    def spec(self) -> FidelityScenario:
        return FIDELITY_SCENARIOS[self.scenario]

    @property
    def client_interval_ms(self) -> int:
        ci = self.spec.client_interval_ms
        return self.interval_ms if ci is None else ci


def parse_cases(scenarios: str | None = None, schedulers: str | None = None,
                intervals: str | None = None) -> tuple[Case, ...]:
    """Cases from comma lists, e.g. ``circuit,ceiling`` / ``kist,vanilla`` / ``2,10``. A list
    left out (None) takes each scenario's defaults (all scenarios; KIST and KISTLite, plus
    Vanilla for the two original ones; 2 and 10 ms)."""

    def items(text: str, what: str) -> list[str]:
        out = [t.strip().lower() for t in text.split(",") if t.strip()]
        if not out:
            raise SimConfigError(f"--{what}: empty list")
        return out

    scen = items(scenarios, "scenarios") if scenarios is not None else list(SCENARIOS)
    for name in scen:
        if name not in FIDELITY_SCENARIOS:
            raise SimConfigError(f"--scenarios: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    scheds = items(schedulers, "schedulers") if schedulers is not None else None
    for name in scheds or ():
        if name not in SCHEDULERS:
            raise SimConfigError(f"--schedulers: unknown scheduler {name!r} (known: {', '.join(SCHEDULERS)})")
    ivals: list[int] | None = None
    if intervals is not None:
        ivals = []
        for raw in items(intervals, "intervals"):
            raw = raw.removesuffix("ms")
            if ascii_uint(raw) is None or not 1 <= int(raw) <= 100:
                raise SimConfigError(f"--intervals: {raw!r} is not a KISTSchedRunInterval in 1..100 ms")
            ivals.append(int(raw))
    out = []
    for s in scen:
        spec = FIDELITY_SCENARIOS[s]
        for k in scheds or spec.schedulers:
            for i in ivals or spec.intervals_ms:
                out.append(Case(s, k, i))
    return tuple(out)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _stdev(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


@attrs.frozen
class RealSide:
    """Real tor's figures for one case."""

    throughputs_mbytes_per_s: tuple[float, ...]
    cpu_busiest_fraction: float  # highest share of one core used by one process in a repetition
    run_period: RunStats | None  # from the middle relay's scheduler debug log
    cpu_total_cores: float = 0.0  # highest sum over all tors and the measurer, in cores
    #: CPU seconds all tors and the measurer spent per MB moved (mean over repetitions)
    cpu_seconds_per_mbyte: float = 0.0
    #: the machine's 1-minute load average when the case's repetitions started, their mean
    #: (os.getloadavg, as uptime prints it): the machine may be shared, and load lowers real figures
    load_1min: float | None = None
    #: per repetition, the share of the machine's CPU time its hypervisor took during the
    #: transfer (``machine.stolen_fraction``): while it lasts no tor runs, so a latency-bound
    #: figure falls with it; empty where /proc/stat gives none or the report predates it
    stolen_fractions: tuple[float, ...] = ()
    #: repetitions measured again because the host took more than ``--max-stolen`` during them
    remeasured: int = 0
    #: per repetition, the largest share of the transfer's wall time that one tor of the network
    #: spent runnable but waiting for a core (``procs.core_wait_seconds``): the simulator gives
    #: every node a core of its own, so a real figure whose tors wait measures the machine too;
    #: empty where the kernel keeps no such account or the report predates it
    core_wait_fractions: tuple[float, ...] = ()

    def as_json(self) -> dict:
        return {"throughputs_mbytes_per_s": list(self.throughputs_mbytes_per_s),
                "cpu_busiest_fraction": self.cpu_busiest_fraction,
                "run_period": self.run_period.as_json() if self.run_period else None,
                "cpu_total_cores": self.cpu_total_cores, "cpu_seconds_per_mbyte": self.cpu_seconds_per_mbyte,
                "load_1min": self.load_1min, "stolen_fractions": list(self.stolen_fractions),
                "remeasured": self.remeasured, "core_wait_fractions": list(self.core_wait_fractions)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> RealSide:
        try:
            rp = data.get("run_period")
            return cls(tuple(float(x) for x in data["throughputs_mbytes_per_s"]), float(data["cpu_busiest_fraction"]),
                       RunStats(**rp) if rp else None, float(data["cpu_total_cores"]),
                       float(data["cpu_seconds_per_mbyte"]), data.get("load_1min"),
                       tuple(float(x) for x in data.get("stolen_fractions") or ()),
                       int(data.get("remeasured") or 0),
                       tuple(float(x) for x in data.get("core_wait_fractions") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise SimConfigError(f"{where}: not a real-side record of a fidelity report ({exc})") from None

    @property
    def mean_mbytes_per_s(self) -> float | None:
        return _mean(self.throughputs_mbytes_per_s)

    @property
    def stolen_mean(self) -> float | None:
        return _mean(self.stolen_fractions)

    @property
    def core_wait_mean(self) -> float | None:
        return _mean(self.core_wait_fractions)

    def cores_needed(self, mbytes_per_s: float) -> float:
        """Cores this machine would need to move `mbytes_per_s` through the same processes, at
        the CPU per MB real tor spent here."""
        return self.cpu_seconds_per_mbyte * mbytes_per_s

    @property
    def cpu_bound(self) -> bool:
        machine = CPU_BOUND_FRACTION * (os.cpu_count() or 1)
        return self.cpu_busiest_fraction >= CPU_BOUND_FRACTION or self.cpu_total_cores >= machine


@attrs.frozen
class SimSide:
    throughputs_mbytes_per_s: tuple[float, ...]
    run_period_ms: float | None = None
    cells_per_run_median: float | None = None

    @property
    def mean_mbytes_per_s(self) -> float | None:
        return _mean(self.throughputs_mbytes_per_s)


@attrs.frozen
class Row:
    case: Case
    real: RealSide | None
    sim: SimSide | None
    real_note: str = ""
    sim_note: str = ""

    @property
    def sim_needs_cores(self) -> float | None:
        """Cores this machine would need to reach the simulator's figure, at the CPU per MB that
        real tor spent (the simulator gives every node a core of its own)."""
        if self.real is None or self.sim is None or not self.real.cpu_seconds_per_mbyte:
            return None
        sim = self.sim.mean_mbytes_per_s
        return None if sim is None else self.real.cores_needed(sim)

    @property
    def cpu_bound(self) -> bool:
        """Real tor used most of this machine's CPU, or the simulator's figure would need more
        of it than the machine has: the comparison would measure the machine, not tor."""
        if self.real is None:
            return False
        needs = self.sim_needs_cores
        machine = CPU_BOUND_FRACTION * (os.cpu_count() or 1)
        return self.real.cpu_bound or (needs is not None and needs >= machine)

    @property
    def within_target(self) -> bool | None:
        """Simulator mean within 25 % of real tor's (None where a side is missing or the case
        is CPU-bound on this machine)."""
        ratio = self.ratio
        if ratio is None or self.cpu_bound:
            return None
        return abs(ratio - 1.0) <= TARGET_RATIO_TOLERANCE

    @property
    def ratio(self) -> float | None:
        """Simulator mean over real mean."""
        if self.real is None or self.sim is None:
            return None
        real, sim = self.real.mean_mbytes_per_s, self.sim.mean_mbytes_per_s
        return sim / real if real and sim is not None else None

    def as_json(self) -> dict:
        real = self.real
        rp = real.run_period if real else None
        spec = self.case.spec
        return {
            "scenario": self.case.scenario,
            "scheduler": self.case.scheduler,
            "interval_ms": self.case.interval_ms,
            "client_interval_ms": self.case.client_interval_ms,
            "circuits": spec.circuits,
            "streams": spec.streams,
            "cc_alg": spec.cc_alg,
            "real_throughput_mbytes_per_s": list(real.throughputs_mbytes_per_s) if real else None,
            "real_mean_mbytes_per_s": real.mean_mbytes_per_s if real else None,
            "real_stdev_mbytes_per_s": _stdev(real.throughputs_mbytes_per_s) if real else None,
            "real_run_period_ms_median": rp.period_ms_median if rp else None,
            "real_run_period_ms_mean": rp.period_ms_mean if rp else None,
            "real_cells_per_run_median": rp.cells_per_run_median if rp else None,
            "real_cells_per_run_mean": rp.cells_per_run_mean if rp else None,
            "real_cpu_busiest_fraction": real.cpu_busiest_fraction if real else None,
            "real_load_1min": real.load_1min if real else None,
            "real_stolen_fraction_mean": real.stolen_mean if real else None,
            "real_core_wait_fraction_mean": real.core_wait_mean if real else None,
            "real": real.as_json() if real else None,
            "real_cpu_total_cores": real.cpu_total_cores if real else None,
            "real_cpu_bound": real.cpu_bound if real else None,
            "real_cpu_seconds_per_mbyte": real.cpu_seconds_per_mbyte if real else None,
            "sim_needs_cores": self.sim_needs_cores,
            "cpu_bound": self.cpu_bound,
            "sim_throughput_mbytes_per_s": list(self.sim.throughputs_mbytes_per_s) if self.sim else None,
            "sim_mean_mbytes_per_s": self.sim.mean_mbytes_per_s if self.sim else None,
            "sim_run_period_ms": self.sim.run_period_ms if self.sim else None,
            "sim_cells_per_run_median": self.sim.cells_per_run_median if self.sim else None,
            "sim_over_real": self.ratio,
            "sim_within_25pct": self.within_target,
            "real_note": self.real_note,
            "sim_note": self.sim_note,
        }


@attrs.frozen
class Report:
    rows: tuple[Row, ...]
    repetitions: int
    size_mb: float
    real_skipped: str = ""
    sim_skipped: str = ""
    seeds: int | None = None
    """Simulator seeds per case (None: as many as ``repetitions``)."""
    timers: machine.TimerLateness | None = None
    """How late the machine's timers woke while the tors idled before the real runs."""

    @property
    def sim_seeds(self) -> int:
        return self.repetitions if self.seeds is None else self.seeds

    def _compared(self) -> list[Row]:
        return [r for r in self.rows if r.real and r.sim and r.real.throughputs_mbytes_per_s
                and r.sim.mean_mbytes_per_s is not None and not r.cpu_bound]

    def clear_pairs(self) -> list[tuple[Row, Row]]:
        """Every pair of compared rows (any scenarios) that real tor orders clearly: the ranges
        of their repetitions do not overlap and the means are at least ORDER_MARGIN apart. Each
        pair is (faster, slower) on real tor."""
        out = []
        compared = self._compared()
        for i, a in enumerate(compared):
            for b in compared[i + 1:]:
                fast, slow = (a, b) if a.real.mean_mbytes_per_s >= b.real.mean_mbytes_per_s else (b, a)
                rf, rs = fast.real.throughputs_mbytes_per_s, slow.real.throughputs_mbytes_per_s
                if min(rf) > max(rs) and statistics.fmean(rf) >= (1 + ORDER_MARGIN) * statistics.fmean(rs):
                    out.append((fast, slow))
        return out

    def ordering_disagreements(self) -> list[str]:
        """Pairs that real tor orders clearly and the simulator orders the other way, or not
        at all."""
        return [f"{fast.case.label} > {slow.case.label} on real tor, not in the simulator"
                for fast, slow in self.clear_pairs()
                if not fast.sim.mean_mbytes_per_s > slow.sim.mean_mbytes_per_s]

    def real_runs(self) -> tuple[int, ...]:
        """How many real repetitions the rows' means are over (a report recomputed with
        ``--real-from`` keeps the real run's count, which need not be the simulator's seeds)."""
        return tuple(sorted({len(r.real.throughputs_mbytes_per_s) for r in self.rows if r.real}))

    def means_over(self) -> str:
        """What each mean is over, for the report's title."""
        runs = self.real_runs()
        real = "/".join(map(str, runs)) if runs else "-"
        return f"real tor: mean of {real} runs; simulator: mean of {self.sim_seeds} seeds"

    def within_target_count(self) -> tuple[int, int]:
        """(rows within 25 % of real tor, rows compared)."""
        compared = [r for r in self.rows if r.within_target is not None]
        return sum(bool(r.within_target) for r in compared), len(compared)

    def summary_lines(self) -> list[str]:
        hits, n = self.within_target_count()
        lines = []
        if n:
            lines.append(f"simulator within 25 % of real tor: {hits} of {n} compared cases")
        cpu = [r.case.label for r in self.rows if r.cpu_bound]
        if cpu:
            lines.append(f"CPU-bound on this machine, reported, not compared: {', '.join(cpu)}")
        pairs = self.clear_pairs()
        if pairs:
            wrong = self.ordering_disagreements()
            lines.append(f"ordering: {len(pairs) - len(wrong)} of {len(pairs)} pairs that real tor orders clearly "
                         "are ordered the same way by the simulator")
            lines.extend(f"  wrong: {w}" for w in wrong)
        lines.extend(self.machine_lines())
        return lines

    def stolen_range(self) -> tuple[float, float, float] | None:
        """(lowest case mean, mean over every repetition, highest case mean) of the CPU time the
        hypervisor took during real tor's repetitions, or None where none was measured."""
        means = [r.real.stolen_mean for r in self.rows if r.real and r.real.stolen_fractions]
        every = [x for r in self.rows if r.real for x in r.real.stolen_fractions]
        if not every:
            return None
        return min(means), statistics.fmean(every), max(means)

    def machine_lines(self) -> list[str]:
        """What the machine did to real tor's timing, and a warning when it stalls."""
        lines = []
        if self.timers is not None:
            lines.append(machine.describe(self.timers))
        stolen = self.stolen_range()
        if stolen is not None:
            lo, mean, hi = stolen
            lines.append(f"during real tor's repetitions the hypervisor took {100 * mean:.1f} % of this machine's "
                         f"CPU time (case means {100 * lo:.1f}-{100 * hi:.1f} %)")
        again = sum(r.real.remeasured for r in self.rows if r.real)
        if again:
            lines.append(f"{again} repetition(s) measured again because the host took more than --max-stolen "
                         "during them")
        if (self.timers is not None and self.timers.stalls) or (stolen and stolen[1] >= machine.STALL_WARN_FRACTION):
            lines.append("warning: this machine's cores are held off by its host: real tor runs slower here than on "
                         "cores of its own, most on the latency-bound rows (KIST, KISTLite at 2 ms), while the "
                         "simulator gives every node a core that nothing holds off (docs/fidelity.md)")
        return lines

    def as_json(self) -> dict:
        return {
            "repetitions": self.repetitions,
            "real_repetitions": list(self.real_runs()),
            "seeds": self.sim_seeds,
            "size_mb": self.size_mb,
            "real_skipped": self.real_skipped,
            "sim_skipped": self.sim_skipped,
            "rows": [r.as_json() for r in self.rows],
            "ordering_disagreements": self.ordering_disagreements(),
            "clearly_ordered_pairs": len(self.clear_pairs()),
            "sim_within_25pct_count": self.within_target_count()[0],
            "compared_count": self.within_target_count()[1],
            "machine": self.timers.as_json() if self.timers else None,
            "real_stolen_fraction_mean": stolen[1] if (stolen := self.stolen_range()) else None,
        }


# ---- the real side ----------------------------------------------------------------------


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
            params = {k: v for k, v in self.net.params(auth) if k != "cc_alg"}
            params["cc_alg"] = cc_alg
            self.net.set_consensus_params(auth.nickname, params)
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
            for token in line.split()[1:]:
                key, _, value = token.partition("=")
                if key == "cc_alg":
                    return int(value)
            return 2
    return None


# ---- the simulator side -----------------------------------------------------------------


class SimUnavailable(KistexpError):
    """The simulator does not offer this scenario (yet)."""


def simulate(case: Case, seed: int, size_bytes: int) -> SimSide:
    """One simulator run of ``case``: the registry's scenario (``kistexp.sim.scenarios``) built
    from the case, moving the same bytes over the same circuits and streams as real tor."""
    try:
        from kistexp.sim import scenarios
    except ImportError as exc:
        raise SimUnavailable(f"the simulator is not available ({exc})") from None
    spec = case.spec
    scenario = scenarios.PathScenario(
        scheduler=case.scheduler, interval_ms=case.interval_ms, client_interval_ms=case.client_interval_ms,
        circuits=spec.circuits, streams=spec.streams, cc_alg=spec.cc_alg, transfer_bytes=size_bytes, seed=seed)
    fig, _res = scenarios.run_scenario(spec.sim, scenario)
    return SimSide((fig.throughput_mbytes_per_s,), fig.run_period_ms, fig.cells_per_run_median)


def simulate_case(case: Case, seeds: Iterable[int], size_bytes: int) -> SimSide:
    runs = [simulate(case, seed, size_bytes) for seed in seeds]
    periods = [r.run_period_ms for r in runs if r.run_period_ms is not None]
    cells = [r.cells_per_run_median for r in runs if r.cells_per_run_median is not None]
    return SimSide(tuple(v for r in runs for v in r.throughputs_mbytes_per_s), _mean(periods), _mean(cells))


def _read_report(path: Path | str) -> Any:
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SimConfigError(f"{path}: cannot read a fidelity report ({exc})") from None


def load_machine(path: Path | str) -> machine.TimerLateness | None:
    """The machine record of an earlier ``--json`` report (None where it has none)."""
    return _machine_of(_read_report(path))


def _machine_of(data: Any) -> machine.TimerLateness | None:
    return machine.TimerLateness.from_json(data.get("machine")) if isinstance(data, dict) else None


def load_real_sides(path: Path | str) -> dict[Case, RealSide]:
    """Real tor's figures from an earlier ``kistexp fidelity --json`` report, so the simulator
    side can be recomputed against the same real run."""
    return _real_sides_of(_read_report(path), str(path))


def _real_sides_of(data: Any, where: str) -> dict[Case, RealSide]:
    out = {}
    for i, row in enumerate(data.get("rows", []) if isinstance(data, dict) else []):
        if row.get("real") and row.get("scenario") in FIDELITY_SCENARIOS:
            case = Case(row["scenario"], row["scheduler"], int(row["interval_ms"]))
            out[case] = RealSide.from_json(row["real"], f"{where} row {i}")
    if not out:
        raise SimConfigError(f"{where}: no real tor rows (write one with kistexp fidelity --json)")
    return out


# ---- both -------------------------------------------------------------------------------


#: Real runs per case unless told otherwise.
DEFAULT_REPETITIONS = 3
#: Simulator seeds per case unless told otherwise. Each seed starts the downloads at its own
#: phase within the kernel tick (scenarios.start_phase_ms), and on some rows the simulator's
#: figure varies more from seed to seed than real tor's from run to run (4 streams under KISTLite
#: at 2 ms: 0.33 MB/s standard deviation over seeds, 0.12 over real runs, 2026-12-03), so a mean
#: over as few seeds as real repetitions would carry +-3 % of start-phase noise into every ratio
#: and order; 20 seeds bring it to about +-1.5 %.
DEFAULT_SEEDS = 20


def run_fidelity(
    cases: Sequence[Case],
    repetitions: int | None = None,
    size_mb: float = 20.0,
    real: bool = True,
    sim: bool = True,
    root: Path | str | None = None,
    base_port: int | None = None,
    progress: Progress | None = None,
    real_from: Path | str | None = None,
    interleaved: bool = True,
    seeds: int | None = None,
    max_stolen_pct: float | None = None,
) -> Report:
    """Run every case on real tor (``repetitions`` times, default 3; in rounds over the cases
    unless ``interleaved`` is False, see ``RealTor.measure_interleaved``) and in the simulator
    (seeds 1..``seeds``, default ``DEFAULT_SEEDS``). A side that cannot run is skipped with its
    reason in the report. With ``real_from`` the real figures are that run's, over its own
    repetitions."""
    loaded = timers = None
    if real_from is not None:
        report = _read_report(real_from)  # once, for both the real sides and the machine record
        loaded, timers = _real_sides_of(report, str(real_from)), _machine_of(report)
    if repetitions is None:
        runs = [len(side.throughputs_mbytes_per_s) for side in (loaded or {}).values()]
        repetitions = max(runs) if runs else DEFAULT_REPETITIONS
    if repetitions < 1:
        raise SimConfigError(f"--repetitions must be >= 1, got {repetitions}")
    seeds = DEFAULT_SEEDS if seeds is None else seeds
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 1000:
        raise SimConfigError(f"--seeds must be an integer in [1, 1000], got {seeds!r}")
    if not 0 < size_mb <= 1000:
        raise SimConfigError(f"--size-mb must be within (0, 1000], got {size_mb}")
    if max_stolen_pct is not None and not 0 <= max_stolen_pct < 100:
        raise SimConfigError(f"--max-stolen must be a percentage within [0, 100), got {max_stolen_pct}")
    size = int(size_mb * MB)
    say = progress or (lambda _msg: None)
    real_sides: dict[Case, RealSide] = {}
    real_notes: dict[Case, str] = {}
    real_skipped = ""
    if loaded is not None:
        real_sides = {c: loaded[c] for c in cases if c in loaded}
        real_skipped = "" if real_sides else f"real tor: {real_from} has none of these cases"
    elif real and not have_tor():
        real_skipped = "real tor skipped: tor and tor-gencert are not installed (Debian: apt-get install -y tor)"
    elif real:
        try:
            bound = None if max_stolen_pct is None else max_stolen_pct / 100
            with RealTor(root=root, base_port=base_port, progress=say, max_stolen=bound) as rt:
                measure = rt.measure_interleaved if interleaved else rt.measure_case_by_case
                real_sides, real_notes = measure(cases, repetitions, size)
                timers = rt.timers
        except KistexpError as exc:
            real_skipped = f"real tor failed: {exc}"
    else:
        real_skipped = "real tor not requested"
    sim_sides: dict[Case, SimSide] = {}
    sim_notes: dict[Case, str] = {}
    sim_skipped = ""
    if sim:
        for case in cases:
            say(f"simulator {case.label}")
            try:
                sim_sides[case] = simulate_case(case, range(1, seeds + 1), size)
            except SimUnavailable as exc:
                sim_notes[case] = str(exc)
            except KistexpError as exc:
                sim_notes[case] = f"simulator error: {exc}"
        if sim_notes and not sim_sides:
            sim_skipped = next(iter(sim_notes.values()))
    else:
        sim_skipped = "simulator not requested"
    rows = []
    for case in cases:
        real_side = real_sides.get(case)
        note = real_notes.get(case, "")
        row = Row(case, real_side, sim_sides.get(case), note, sim_notes.get(case, ""))
        if real_side is not None and real_side.cpu_bound:
            note = (f"CPU-bound on this machine (busiest process {real_side.cpu_busiest_fraction:.0%} of one core, "
                    f"all {real_side.cpu_total_cores:.1f} cores): not a fair comparison")
        elif row.cpu_bound:
            note = (f"CPU-bound on this machine: the simulator's figure would need {row.sim_needs_cores:.1f} cores "
                    f"at real tor's {real_side.cpu_seconds_per_mbyte * 1e3:.0f} ms of CPU per MB "
                    f"(all processes; {os.cpu_count()} cores here): not compared")
        rows.append(attrs.evolve(row, real_note=note))
    return Report(tuple(rows), repetitions, size_mb, real_skipped, sim_skipped, seeds, timers)

