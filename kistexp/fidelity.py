"""Fidelity harness: the same scenarios on a real local tor network and in the simulator,
side by side (issue 4 point 7; real-tor.md "Throughput"; kist-ewma.md §5.2, §12).

Scenarios:

* ``circuit``: one bulk download over a pinned 3-hop path (guard -> middle -> exit).
* ``ceiling``: 8 simultaneous downloads on 8 circuits over the same pinned path, so they
  share one channel per hop; with KISTLite that channel moves at most 64 cells per run.

Real side: one local network (3 authorities, 2 relays, 1 exit, 1 client) for all cases;
each case switches ``Schedulers`` / ``KISTSchedRunInterval`` on every node over the
control port (tor applies both at once), then runs its repetitions on fresh circuits.
After the repetitions a shorter transfer runs with the middle relay's scheduler debug log
on, which gives the real run period and cells per run on the busy channel; it is kept
apart so the voluminous debug log does not slow the throughput runs.

Sim side: ``kistexp.sim.experiments``, one run per seed, built like the real scenario:
``circuit()`` for ``circuit`` and ``ceiling_path()`` for ``ceiling`` (8 downloads started
together over one client-guard-middle-exit path, Vegas, the client at
``KISTSchedRunIntervalClient``). The single-relay ``ceiling()`` experiment measures a channel
kept backlogged in steady state, which is not what the real scenario measures for KIST and
Vanilla, so it is not compared here.
"""

from __future__ import annotations

import inspect
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
from kistexp.errors import KistexpError, SimConfigError
from kistexp.localnet import procs
from kistexp.localnet.network import LocalNetwork, free_base_port, have_tor
from kistexp.localnet.schedlog import RunStats, log_size, read_runs
from kistexp.localnet.spec import SERVICE_ADDRESS, NetworkSpec, scheduler_options
from kistexp.localnet.traffic import MB, BulkServer, download, parallel_download

SCENARIOS = ("circuit", "ceiling")
SCHEDULERS = ("kist", "kistlite", "vanilla")
TOR_SCHEDULER = {"kist": "KIST", "kistlite": "KISTLite", "vanilla": "Vanilla"}
CEILING_CIRCUITS = 8
#: The simulator experiment that mirrors each real scenario (same path, transfer size and
#: flow control).
SIM_EXPERIMENT = {"circuit": "circuit", "ceiling": "ceiling_path"}
#: A tor process (or the measuring client) busier than this share of one core during a
#: repetition makes the figure CPU-bound on this machine: reported, not compared.
CPU_BOUND_FRACTION = 0.85
#: Issue 4's target: the simulator's mean within this share of real tor's mean.
TARGET_RATIO_TOLERANCE = 0.25
#: The run-period probe moves this share of the case's transfer size, but at least
#: PERIOD_PROBE_MIN_BYTES: a shorter probe ends while congestion windows are still growing,
#: before the channel is backlogged.
PERIOD_PROBE_SHARE = 0.25
PERIOD_PROBE_MIN_BYTES = 4_000_000
WARMUP_BYTES = 200_000

Progress = Callable[[str], None]


@attrs.frozen
class Case:
    scenario: str
    scheduler: str  # kist | kistlite | vanilla
    interval_ms: int

    @property
    def label(self) -> str:
        return f"{self.scenario}/{self.scheduler}/{self.interval_ms}ms"


def parse_cases(scenarios: str, schedulers: str, intervals: str) -> tuple[Case, ...]:
    """Cases from comma lists, e.g. ``circuit,ceiling`` / ``kist,vanilla`` / ``2,10``."""

    def items(text: str, what: str) -> list[str]:
        out = [t.strip().lower() for t in text.split(",") if t.strip()]
        if not out:
            raise SimConfigError(f"--{what}: empty list")
        return out

    scen = items(scenarios, "scenarios")
    scheds = items(schedulers, "schedulers")
    for name in scen:
        if name not in SCENARIOS:
            raise SimConfigError(f"--scenarios: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    for name in scheds:
        if name not in SCHEDULERS:
            raise SimConfigError(f"--schedulers: unknown scheduler {name!r} (known: {', '.join(SCHEDULERS)})")
    ivals = []
    for raw in items(intervals, "intervals"):
        raw = raw.removesuffix("ms")
        if ascii_uint(raw) is None or not 1 <= int(raw) <= 100:
            raise SimConfigError(f"--intervals: {raw!r} is not a KISTSchedRunInterval in 1..100 ms")
        ivals.append(int(raw))
    return tuple(Case(s, k, i) for s in scen for k in scheds for i in ivals)


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

    @property
    def mean_mbytes_per_s(self) -> float | None:
        return _mean(self.throughputs_mbytes_per_s)

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
        return {
            "scenario": self.case.scenario,
            "scheduler": self.case.scheduler,
            "interval_ms": self.case.interval_ms,
            "real_throughput_mbytes_per_s": list(real.throughputs_mbytes_per_s) if real else None,
            "real_mean_mbytes_per_s": real.mean_mbytes_per_s if real else None,
            "real_stdev_mbytes_per_s": _stdev(real.throughputs_mbytes_per_s) if real else None,
            "real_run_period_ms_median": rp.period_ms_median if rp else None,
            "real_run_period_ms_mean": rp.period_ms_mean if rp else None,
            "real_cells_per_run_median": rp.cells_per_run_median if rp else None,
            "real_cells_per_run_mean": rp.cells_per_run_mean if rp else None,
            "real_cpu_busiest_fraction": real.cpu_busiest_fraction if real else None,
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

    def ordering_disagreements(self) -> list[str]:
        """Pairs of cases of one scenario that real tor orders clearly (the ranges of its
        repetitions do not overlap) and the simulator orders the other way, or not at all."""
        out = []
        compared = [r for r in self.rows if r.real and r.sim and r.real.throughputs_mbytes_per_s
                    and r.sim.mean_mbytes_per_s is not None and not r.cpu_bound]
        for i, a in enumerate(compared):
            for b in compared[i + 1:]:
                if a.case.scenario != b.case.scenario:
                    continue
                ra, rb = a.real.throughputs_mbytes_per_s, b.real.throughputs_mbytes_per_s
                if min(ra) > max(rb):
                    fast, slow = a, b
                elif min(rb) > max(ra):
                    fast, slow = b, a
                else:
                    continue
                if not fast.sim.mean_mbytes_per_s > slow.sim.mean_mbytes_per_s:
                    out.append(f"{fast.case.label} > {slow.case.label} on real tor, not in the simulator")
        return out

    def as_json(self) -> dict:
        return {
            "repetitions": self.repetitions,
            "size_mb": self.size_mb,
            "real_skipped": self.real_skipped,
            "sim_skipped": self.sim_skipped,
            "rows": [r.as_json() for r in self.rows],
            "ordering_disagreements": self.ordering_disagreements(),
        }


# ---- the real side ----------------------------------------------------------------------


def fidelity_spec(base_port: int) -> NetworkSpec:
    """3 authorities, guard and middle relays, one exit, one client (real-tor.md)."""
    return NetworkSpec(authorities=3, relays=2, exits=1, clients=1, base_port=base_port)


class RealTor:
    """A local network plus the bulk server, set up once for a series of cases.

    ``root``: keep the network there (default: a temporary directory, removed on close).
    """

    def __init__(self, root: Path | str | None = None, base_port: int | None = None,
                 progress: Progress | None = None) -> None:
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="kistexp-fidelity-"))
        self._base_port = base_port
        self._progress = progress or (lambda _msg: None)
        self.net: LocalNetwork | None = None
        self._server: BulkServer | None = None

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
        self._server = BulkServer(spec.service_port)
        self.net.start(consensus_timeout_s=timeout_s)
        self.net.wait_bootstrapped(timeout_s)
        guard, middle = self.net.by_role("relay")[:2]
        self.exit = self.net.by_role("exit")[0]
        self.guard, self.middle = guard, middle
        self.client = self.net.by_role("client")[0]
        self.net.pin_path(self.client.nickname, guard.nickname, middle.nickname, self.exit.nickname)
        # One small transfer proves the pinned path works before any case is timed.
        self._progress("checking the pinned path guard -> middle -> exit")
        download(self.client.socks_port, SERVICE_ADDRESS, spec.service_port, WARMUP_BYTES, f"warmup-{uuid.uuid4().hex}")

    def close(self) -> None:
        if self.net is not None:
            self.net.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def configure(self, case: Case) -> None:
        """Scheduler and run interval on every node, clients included (kist-ewma.md §5.1)."""
        assert self.net is not None
        lines = scheduler_options(TOR_SCHEDULER[case.scheduler], case.interval_ms)
        options = dict(line.split(" ", 1) for line in lines)
        for node in self.net.nodes:
            self.net.set_conf(node.nickname, options)

    def _transfer(self, case: Case, size: int, tag: str) -> float:
        assert self.net is not None
        port = self.net.spec.service_port
        stem = f"{case.label}-{tag}-{uuid.uuid4().hex[:8]}"
        if case.scenario == "circuit":
            return download(self.client.socks_port, SERVICE_ADDRESS, port, size, stem).throughput_mbytes_per_s
        names = [f"{stem}-{i}" for i in range(CEILING_CIRCUITS)]
        per_circuit = max(1, size // CEILING_CIRCUITS)
        measured = parallel_download(self.client.socks_port, SERVICE_ADDRESS, port, per_circuit, names)
        return measured.throughput_mbytes_per_s

    def _cpu_sample(self) -> dict[str, float]:
        assert self.net is not None
        sample = {n.nickname: procs.cpu_seconds(self.net.pid(n)) or 0.0 for n in self.net.nodes}
        t = os.times()
        sample["client-measurer"] = t.user + t.system
        return sample

    def measure(self, case: Case, repetitions: int, size_bytes: int, period_probe: bool = True) -> RealSide:
        assert self.net is not None
        self.configure(case)
        values: list[float] = []
        per_mb: list[float] = []
        busiest = total = 0.0
        for rep in range(repetitions):
            self._progress(f"real tor {case.label}: repetition {rep + 1}/{repetitions}")
            before, t0 = self._cpu_sample(), time.monotonic()
            values.append(self._transfer(case, size_bytes, f"r{rep}"))
            after, wall = self._cpu_sample(), time.monotonic() - t0
            spent = [after[k] - before.get(k, 0.0) for k in after]
            busiest, total = max(busiest, *(x / wall for x in spent)), max(total, sum(spent) / wall)
            per_mb.append(sum(spent) / (size_bytes / MB))
        probe = max(PERIOD_PROBE_MIN_BYTES, int(size_bytes * PERIOD_PROBE_SHARE))
        stats = self.run_period(case, probe) if period_probe else None
        return RealSide(tuple(values), busiest, stats, total, statistics.fmean(per_mb))

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


# ---- the simulator side -----------------------------------------------------------------


class SimUnavailable(KistexpError):
    """The simulator does not offer this scenario (yet)."""


def _result_value(result: Any, key: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(key)
    return getattr(result, key, None)


def simulate(case: Case, seed: int, size_bytes: int) -> SimSide:
    """One simulator run of ``case``: kistexp.sim.experiments.<SIM_EXPERIMENT[scenario]>(...).

    Arguments are passed by the names the experiment function declares (scheduler,
    interval_ms, client_interval_ms, seed, circuits, transfer_bytes), so the simulator moves
    the same bytes over the same number of circuits as the real downloads.
    """
    try:
        from kistexp.sim import experiments
    except ImportError as exc:
        raise SimUnavailable(f"the simulator's experiments are not available ({exc})") from None
    name = SIM_EXPERIMENT[case.scenario]
    func = getattr(experiments, name, None)
    if not callable(func):
        raise SimUnavailable(f"kistexp.sim.experiments has no {name}() experiment")
    wanted = {
        "scheduler": case.scheduler,
        "interval_ms": case.interval_ms,
        "client_interval_ms": case.interval_ms,
        "seed": seed,
        "circuits": CEILING_CIRCUITS if case.scenario == "ceiling" else 1,
        "transfer_bytes": size_bytes,
    }
    params = inspect.signature(func).parameters
    kwargs = {k: v for k, v in wanted.items() if k in params}
    result = func(**kwargs)
    value = _result_value(result, "throughput_mbytes_per_s")
    if value is None:
        raise SimUnavailable(f"kistexp.sim.experiments.{name}() gave no throughput_mbytes_per_s")
    period = _result_value(result, "run_period_ms")
    cells = _result_value(result, "cells_per_run_median")
    return SimSide((float(value),), None if period is None else float(period), None if cells is None else float(cells))


def simulate_case(case: Case, seeds: Iterable[int], size_bytes: int) -> SimSide:
    runs = [simulate(case, seed, size_bytes) for seed in seeds]
    periods = [r.run_period_ms for r in runs if r.run_period_ms is not None]
    cells = [r.cells_per_run_median for r in runs if r.cells_per_run_median is not None]
    return SimSide(tuple(v for r in runs for v in r.throughputs_mbytes_per_s), _mean(periods), _mean(cells))


# ---- both -------------------------------------------------------------------------------


def run_fidelity(
    cases: Sequence[Case],
    repetitions: int = 3,
    size_mb: float = 20.0,
    real: bool = True,
    sim: bool = True,
    root: Path | str | None = None,
    base_port: int | None = None,
    progress: Progress | None = None,
) -> Report:
    """Run every case on real tor (``repetitions`` times) and in the simulator (seeds
    1..repetitions). A side that cannot run is skipped with its reason in the report."""
    if repetitions < 1:
        raise SimConfigError(f"--repetitions must be >= 1, got {repetitions}")
    if not 0 < size_mb <= 1000:
        raise SimConfigError(f"--size-mb must be within (0, 1000], got {size_mb}")
    size = int(size_mb * MB)
    say = progress or (lambda _msg: None)
    real_sides: dict[Case, RealSide] = {}
    real_notes: dict[Case, str] = {}
    real_skipped = ""
    if real and not have_tor():
        real_skipped = "real tor skipped: tor and tor-gencert are not installed (Debian: apt-get install -y tor)"
    elif real:
        try:
            with RealTor(root=root, base_port=base_port, progress=say) as rt:
                for case in cases:
                    try:
                        real_sides[case] = rt.measure(case, repetitions, size)
                    except KistexpError as exc:
                        real_notes[case] = str(exc)
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
                sim_sides[case] = simulate_case(case, range(1, repetitions + 1), size)
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
            note = (f"CPU-bound on this machine (busiest process {real_side.cpu_busiest_fraction:.0%} of a core, "
                    f"all {real_side.cpu_total_cores:.1f} cores): not a fair comparison")
        elif row.cpu_bound:
            note = (f"CPU-bound on this machine: the simulator's figure would need {row.sim_needs_cores:.1f} cores "
                    f"at real tor's {real_side.cpu_seconds_per_mbyte * 1e3:.0f} ms of CPU per MB "
                    f"(all processes; {os.cpu_count()} cores here): not compared")
        rows.append(attrs.evolve(row, real_note=note))
    return Report(tuple(rows), repetitions, size_mb, real_skipped, sim_skipped)

