"""Fidelity harness: the same scenarios on a real local tor network and in the simulator,
side by side (issue 4 point 7; real-tor.md "Throughput"; kist-ewma.md §5.2, §12).

The package, one idea per module:

* ``cases``: the scenarios (``FIDELITY_SCENARIOS``) and the cases parsed from the command line.
* ``realtor``: the real side, one local tor network for all cases (``RealTor``).
* ``simside``: the simulator side, one run per seed from the scenario registry (``simulate``).
* ``report``: both sides per case, the report's conclusions and its JSON (``Report``).
* ``run``: the orchestration of a whole run (``run_fidelity``).
* ``history``: every measured run, row by row, in one CSV (``kistexp fidelity --history``).

The names other code uses are importable from the package itself. Code that replaces one of
them in a test patches the module that looks it up (e.g. ``kistexp.fidelity.realtor``), not
this package.
"""

from __future__ import annotations

from kistexp.fidelity.cases import (
    CEILING_CIRCUITS,
    FIDELITY_SCENARIOS,
    SCENARIOS,
    SCHEDULERS,
    TOR_SCHEDULER,
    Case,
    FidelityScenario,
    parse_cases,
)
from kistexp.fidelity.realtor import (
    CLIENT_RESTART_TIMEOUT_S,
    MACHINE_PROBE_S,
    PERIOD_PROBE_MIN_BYTES,
    PERIOD_PROBE_SHARE,
    STOLEN_RETRIES,
    WARMUP_BYTES,
    Progress,
    RealTor,
    fidelity_spec,
)
from kistexp.fidelity.report import (
    CPU_BOUND_FRACTION,
    ORDER_MARGIN,
    TARGET_RATIO_TOLERANCE,
    RealSide,
    Report,
    Row,
    SimSide,
    load_machine,
    load_real_sides,
)
from kistexp.fidelity.run import DEFAULT_REPETITIONS, DEFAULT_SEEDS, run_fidelity
from kistexp.fidelity.simside import SimUnavailable, simulate, simulate_case

__all__ = [
    "CEILING_CIRCUITS", "CLIENT_RESTART_TIMEOUT_S", "CPU_BOUND_FRACTION", "DEFAULT_REPETITIONS", "DEFAULT_SEEDS",
    "FIDELITY_SCENARIOS", "MACHINE_PROBE_S", "ORDER_MARGIN", "PERIOD_PROBE_MIN_BYTES", "PERIOD_PROBE_SHARE",
    "SCENARIOS", "SCHEDULERS", "STOLEN_RETRIES", "TARGET_RATIO_TOLERANCE", "TOR_SCHEDULER", "WARMUP_BYTES",
    "Case", "FidelityScenario", "Progress", "RealSide", "RealTor", "Report", "Row", "SimSide", "SimUnavailable",
    "fidelity_spec", "load_machine", "load_real_sides", "parse_cases", "run_fidelity", "simulate", "simulate_case",
]
