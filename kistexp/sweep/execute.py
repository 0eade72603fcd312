"""A sweep's cells through ``kistexp.population.dispatch`` (the one code path ``kistexp simulate`` takes
too): a local process pool or an existing Dask scheduler, a dead worker's cell retried once (the
accounting is described there), a raising cell failed at once. Here a sweep adds its cell function
(``run_cell``), its model version (``model_version``, asked of every Dask worker), its error type and its
cache: a cell already in the cache is not run, and a finished one is checked as a cache entry is before
it is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from kistexp.errors import SweepError
from kistexp.population import dispatch
from kistexp.population.dispatch import MAX_ATTEMPTS, MAX_WORKERS_PER_CPU, CellOutcome
from kistexp.sweep.cache import CellCache, check_result
from kistexp.sweep.cells import CellResult, CellTask, model_version, run_cell

__all__ = ["MAX_ATTEMPTS", "MAX_WORKERS_PER_CPU", "CellOutcome", "DaskBackend", "LocalBackend", "execute"]


class LocalBackend(dispatch.LocalBackend):
    """``dispatch.LocalBackend`` of ``workers`` spawned processes running ``cell_fn`` (a sweep cell)."""

    def __init__(self, workers: int, cell_fn: Callable[[CellTask], CellResult] = run_cell) -> None:
        super().__init__(workers, cell_fn, error=SweepError)


class DaskBackend(dispatch.DaskBackend):
    """``dispatch.DaskBackend``: sweep cells as tasks of an existing Dask scheduler."""

    def __init__(self, address: str, cell_fn: Callable[[CellTask], CellResult] = run_cell,
                 timeout_s: float = 10.0) -> None:
        super().__init__(address, cell_fn, model=model_version, timeout_s=timeout_s, error=SweepError)


def execute(tasks: Iterable[CellTask], backend, cache: CellCache, *,
            on_start: Callable[[int, int], None] | None = None,
            on_outcome: Callable[[CellOutcome], None] | None = None) -> list[CellOutcome]:
    """Run every task not already in ``cache``; ``on_start`` gets the numbers of cells and of cached
    cells once the cache has been read, ``on_outcome`` sees each cell as it finishes (cached cells
    first). Results are stored as they arrive, so an interrupted sweep resumes where it stopped.

    ``tasks`` is read once, in order (a ``CellGrid`` builds each task as it is read)."""

    def accept(task: CellTask, result) -> CellResult | str:
        # checked as a cache entry is: a worker of another build, or one gone wrong, cannot put NaN or a
        # wrong shape into the cache and the tables
        if not isinstance(result, CellResult):
            return f"is {type(result).__name__}, not a cell result"
        checked = check_result(attrs.asdict(result), task.key)
        if not isinstance(checked, str):
            cache.put(checked)
        return checked

    return dispatch.execute(tasks, backend, cached=lambda task: cache.get(task.key), accept=accept,
                            on_start=on_start, on_outcome=on_outcome)
