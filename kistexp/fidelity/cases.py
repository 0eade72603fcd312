"""The fidelity harness's cases: the scenarios that real tor and the simulator both run
(``FIDELITY_SCENARIOS``), and a case, one scenario under one scheduler at one
``KISTSchedRunInterval``, as ``kistexp fidelity`` parses them from its comma lists.

Scenarios (every one also runs alone as ``kistexp sim experiment``):

* ``circuit``: one bulk download over a pinned 3-hop path (guard -> middle -> exit).
* ``circuits-2``, ``circuits-4``, ``ceiling`` (8): that many simultaneous downloads on as many
  circuits over the same pinned path, so they share one channel per hop; with KISTLite that
  channel moves at most 64 cells per run.
* ``streams-4``: one download split over 4 streams of one circuit (one SOCKS username).
* ``client-10ms``: one circuit, relays at the case's interval, the client at 10 ms
  (``KISTSchedRunIntervalClient``; here its torrc twin, which overrides it, kist-ewma.md §5.1).
* ``cc-off``: one circuit with congestion control off: ``cc_alg=0`` voted by the authorities'
  ``ConsensusParams``, so circuits use the fixed SENDME windows (§13.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kistexp.asciinum import ascii_uint
from kistexp.errors import SimConfigError

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


@attrs.frozen
class Case:
    """One row of the report: a scenario under one scheduler at one KISTSchedRunInterval."""

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
