"""What a stage prediction runs (``kistexp.population.predict.simulate_plan``), as plain values: each
change of consensus-parameter values in order, and the networks to run them on.

A plan makes its own (``kistexp.plan.model.Plan.stage_runs``); nothing here knows about plans, so the
population stays below them (docs/architecture.md).
"""

from __future__ import annotations

import datetime as dt

import attrs


@attrs.frozen
class StageRun:
    """One run: every node starts on ``from_values`` and switches to ``to_values``. Values are the
    ones tor sees: a parameter left out runs at tor's compiled default."""

    from_stage: str
    from_values: tuple[tuple[str, int], ...]
    to_stage: str
    to_values: tuple[tuple[str, int], ...]


@attrs.frozen
class StageRuns:
    """The runs of a prediction: ``transitions`` in order (the baseline held constant first), each on
    a network sampled at ``population_scale`` for every seed, for ``duration`` of simulated time."""

    name: str  # what is predicted (the plan's name)
    source: str  # where it comes from, for messages (the plan's path)
    transitions: tuple[StageRun, ...]
    seeds: tuple[int, ...]
    population_scale: float
    duration: dt.timedelta

    @property
    def stages(self) -> tuple[str, ...]:
        """The stage each run ends in, in order: the names predictions are stored under."""
        return tuple(t.to_stage for t in self.transitions)


def default_warmup_s(duration_s: float) -> float:
    """The warm-up a prediction excludes unless told otherwise: 10 s, at most a sixth of the run."""
    return min(10.0, duration_s / 6)


def run_windows(duration_s: float, warmup_s: float) -> tuple[float, float, float]:
    """Where a prediction run's windows start: (warm-up end ``w0``, transition ``a``, stage ``b``); the
    stage window is [b, end). After the warm-up the run is cut in thirds: old values | transition |
    new values (``kistexp.population.predict``, which refuses a run too short for them)."""
    r = (duration_s - warmup_s) / 3
    return warmup_s, warmup_s + r, warmup_s + 2 * r
