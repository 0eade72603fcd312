"""The fidelity harness's orchestration (``run_fidelity``): the cases on real tor, or real tor's
figures from an earlier report, then in the simulator, and the rows of the report, with a note
on every row that measures this machine rather than tor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from kistexp.errors import KistexpError, SimConfigError
from kistexp.fidelity.cases import Case
from kistexp.fidelity.realtor import Progress, RealTor
from kistexp.fidelity.report import RealSide, Report, Row, SimSide, _machine_of, _read_report, _real_sides_of
from kistexp.fidelity.simside import SimUnavailable, simulate_case
from kistexp.localnet.network import have_tor
from kistexp.localnet.traffic import MB

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

