"""The fidelity harness's simulator side: each case run in the simulator's scenario registry
(``kistexp.sim.scenarios``), one run per seed, built like the real scenario from one
:class:`~kistexp.sim.scenarios.PathScenario` (same path, circuits, streams, bytes, intervals and
flow control). The single-relay ``ceiling()`` experiment measures a channel kept backlogged in
steady state, which is not what the real scenario measures for KIST and Vanilla, so it is not
compared here.
"""

from __future__ import annotations

from collections.abc import Iterable

from kistexp.errors import KistexpError
from kistexp.fidelity.cases import Case
from kistexp.fidelity.report import SimSide, _mean


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
