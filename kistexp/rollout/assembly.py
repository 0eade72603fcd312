"""Where a rollout engine is put together (issue 32; rollout.md §2.5 "one trigger, two drivers").

A rollout is one engine with four ports: the clock and its driver, the actuator, the metric source
and the journal. Dry run, replay and live run differ only in the parts plugged in:

- dry run: virtual clock; embedded fake authorities; predicted metrics;
- replay: virtual clock; embedded fake authorities; recorded metrics;
- live (``--authorities fake|local|instructions``): the real clock on APScheduler; fake authorities on
  127.0.0.1, a local tor network's authorities, or operator instructions with public documents;
  measured metrics (the local network's own measurements, or ``--source`` instruments), or predicted
  ones when the user asks with ``--metrics predicted``.

``assemble`` is the one place an ``Engine`` is made; ``measured_source`` the one place a live run's
measured source is made from its instruments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from kistexp.clock import Clock
from kistexp.rollout.actuators import Actuator
from kistexp.rollout.engine import AnonymityVerdicts, Engine, Hook
from kistexp.rollout.exposure import ExposureProbe
from kistexp.rollout.journal import Journal
from kistexp.rollout.sources import MEASURED, PREDICTED, MeasuredMetrics, MetricSource
from kistexp.rollout.spec import RolloutError, RolloutSpec

METRICS_MODES = (MEASURED, PREDICTED)


def assemble(spec: RolloutSpec, journal: Journal, actuator: Actuator, metrics: MetricSource, clock: Clock, *,
             experiment_id: str, plan_check: Callable[[], str] | None = None, hook: Hook | None = None,
             exposure: ExposureProbe | None = None, anonymity: AnonymityVerdicts | None = None) -> Engine:
    """The engine with its four ports (the driver is the caller's: ``VirtualDriver`` or ``LiveDriver``).
    ``anonymity`` judges the plan's anonymity criteria from the predictions, in every kind of run
    (``kistexp.rollout.anonymity``: nothing on a network measures an attack)."""
    return Engine(spec, journal, actuator, metrics, clock, experiment_id=experiment_id, plan_check=plan_check,
                  hook=hook, exposure=exposure, anonymity=anonymity)


def require_measured(metrics: Sequence[str], instruments: Sequence, where: str) -> None:
    """Every criterion's metric must come from some instrument: a criterion nothing measures would
    hold for ever on missing data, so the run is refused before it starts."""
    provided = {m for i in instruments for m in i.metrics}
    unmeasured = sorted(set(metrics) - provided)
    if unmeasured:
        kinds = ", ".join(sorted({i.kind for i in instruments})) or "no instrument"
        raise RolloutError(f"{where}: nothing measures {', '.join(unmeasured)} (sources: {kinds}); add a --source "
                           "that does, or rehearse on predictions with --metrics predicted")


def measured_source(db_path: Path, instruments: Sequence, clock: Clock, spec: RolloutSpec,
                    where: str, params_at=None) -> MeasuredMetrics:
    """A live run's measured source over ``instruments`` (checked with ``require_measured``)."""
    require_measured([c.metric for c in spec.criteria], instruments, where)
    return MeasuredMetrics(db_path, instruments, clock, params_at)
