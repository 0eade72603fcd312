"""The fidelity report's model: real tor's and the simulator's figures for each case, side by
side (``RealSide``, ``SimSide``, ``Row``), and the whole run (``Report``) with what it
concludes: which rows are within issue 4's 25 % target, which are CPU-bound on this machine and
so not compared, which orders real tor shows clearly and whether the simulator keeps them, and
what the machine's host did to real tor's timing. ``jsonout.to_json(report)`` is ``kistexp
fidelity --json`` (each class's ``@jsonout.shape`` names its keys); ``load_real_sides`` and
``load_machine`` read such a report back (``--real-from``). The table itself is printed by
``kistexp.commands.fidelity``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from kistexp import jsonout
from kistexp.errors import SimConfigError
from kistexp.fidelity.cases import FIDELITY_SCENARIOS, Case
from kistexp.localnet import machine
from kistexp.localnet.schedlog import RunStats

#: A tor process (or the measuring client) busier than this share of one core during a
#: repetition makes the figure CPU-bound on this machine: reported, not compared.
CPU_BOUND_FRACTION = 0.85
#: Issue 4's target: the simulator's mean within this share of real tor's mean.
TARGET_RATIO_TOLERANCE = 0.25
#: Real tor orders two rows clearly when the ranges of their repetitions do not overlap and the
#: faster mean is at least this much above the slower: real-tor.md puts run-to-run noise at
#: 10-20 %, so three tight repetitions a few per cent apart are not an order.
ORDER_MARGIN = 0.10


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
    """The simulator's figures for one case: throughput per seed, and the run period and cells
    per run on the busy channel (means over the seeds)."""

    throughputs_mbytes_per_s: tuple[float, ...]
    run_period_ms: float | None = None
    cells_per_run_median: float | None = None

    @property
    def mean_mbytes_per_s(self) -> float | None:
        return _mean(self.throughputs_mbytes_per_s)


def _of_real(value_of: Callable[[RealSide], Any]) -> Callable[[Row], Any]:
    """A row's key from its real side (null where it has none)."""
    return lambda row: value_of(row.real) if row.real else None


def _of_period(value_of: Callable[[RunStats], Any]) -> Callable[[Row], Any]:
    """A row's key from real tor's run period (null where it has none)."""
    return lambda row: value_of(row.real.run_period) if row.real and row.real.run_period else None


def _of_sim(value_of: Callable[[SimSide], Any]) -> Callable[[Row], Any]:
    """A row's key from its simulator side (null where it has none)."""
    return lambda row: value_of(row.sim) if row.sim else None


#: A row of ``kistexp fidelity --json``, key by key (its notes follow).
_ROW_KEYS: dict[str, Callable[[Row], Any]] = {
    "scenario": lambda row: row.case.scenario,
    "scheduler": lambda row: row.case.scheduler,
    "interval_ms": lambda row: row.case.interval_ms,
    "client_interval_ms": lambda row: row.case.client_interval_ms,
    "circuits": lambda row: row.case.spec.circuits,
    "streams": lambda row: row.case.spec.streams,
    "cc_alg": lambda row: row.case.spec.cc_alg,
    "real_throughput_mbytes_per_s": _of_real(lambda real: real.throughputs_mbytes_per_s),
    "real_mean_mbytes_per_s": _of_real(lambda real: real.mean_mbytes_per_s),
    "real_stdev_mbytes_per_s": _of_real(lambda real: _stdev(real.throughputs_mbytes_per_s)),
    "real_run_period_ms_median": _of_period(lambda rp: rp.period_ms_median),
    "real_run_period_ms_mean": _of_period(lambda rp: rp.period_ms_mean),
    "real_cells_per_run_median": _of_period(lambda rp: rp.cells_per_run_median),
    "real_cells_per_run_mean": _of_period(lambda rp: rp.cells_per_run_mean),
    "real_cpu_busiest_fraction": _of_real(lambda real: real.cpu_busiest_fraction),
    "real_load_1min": _of_real(lambda real: real.load_1min),
    "real_stolen_fraction_mean": _of_real(lambda real: real.stolen_mean),
    "real_core_wait_fraction_mean": _of_real(lambda real: real.core_wait_mean),
    "real": lambda row: row.real,  # the whole side, as --real-from reads it back
    "real_cpu_total_cores": _of_real(lambda real: real.cpu_total_cores),
    "real_cpu_bound": _of_real(lambda real: real.cpu_bound),
    "real_cpu_seconds_per_mbyte": _of_real(lambda real: real.cpu_seconds_per_mbyte),
    "sim_needs_cores": lambda row: row.sim_needs_cores,
    "cpu_bound": lambda row: row.cpu_bound,
    "sim_throughput_mbytes_per_s": _of_sim(lambda sim: sim.throughputs_mbytes_per_s),
    "sim_mean_mbytes_per_s": _of_sim(lambda sim: sim.mean_mbytes_per_s),
    "sim_run_period_ms": _of_sim(lambda sim: sim.run_period_ms),
    "sim_cells_per_run_median": _of_sim(lambda sim: sim.cells_per_run_median),
    "sim_over_real": lambda row: row.ratio,
    "sim_within_25pct": lambda row: row.within_target,
}


@jsonout.shape(omit=("case", "real", "sim"), derived=_ROW_KEYS, order=tuple(_ROW_KEYS))
@attrs.frozen
class Row:
    """One case with both sides (either may be missing, its note saying why)."""

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


def _stolen_mean(report: Report) -> float | None:
    stolen = report.stolen_range()
    return stolen[1] if stolen else None


@jsonout.shape(
    omit=("seeds",), rename={"timers": "machine"},
    derived={"real_repetitions": lambda r: r.real_runs(), "seeds": lambda r: r.sim_seeds,
             "ordering_disagreements": lambda r: r.ordering_disagreements(),
             "clearly_ordered_pairs": lambda r: len(r.clear_pairs()),
             "sim_within_25pct_count": lambda r: r.within_target_count()[0],
             "compared_count": lambda r: r.within_target_count()[1], "real_stolen_fraction_mean": _stolen_mean},
    order=("repetitions", "real_repetitions", "seeds", "size_mb", "real_skipped", "sim_skipped", "rows",
           "ordering_disagreements", "clearly_ordered_pairs", "sim_within_25pct_count", "compared_count", "machine",
           "real_stolen_fraction_mean"))
@attrs.frozen
class Report:
    """A whole ``kistexp fidelity`` run: its rows and what they conclude."""

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


# ---- a report read back (--real-from) ------------------------------------------------------


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
