"""Running cells through ``concurrent.futures``: a local process pool or an existing Dask scheduler.

Both backends hand out ``concurrent.futures.Future`` objects (``ProcessPoolExecutor.submit``;
``distributed.Client.get_executor().submit``), so one loop drives either. At most as many cells are in
flight as there are worker slots: a slot is never idle for long, and when a worker process dies the cells
it could have been running are known.

A cell whose worker process dies (killed, out of memory, a crash in compiled code) is retried once, then
reported failed; the sweep goes on with the rest. Accounting:

* local pool: a dying worker breaks the whole ``ProcessPoolExecutor`` (``BrokenProcessPool`` on every
  cell in flight), so each of them is charged one attempt, the pool is rebuilt and the charged cells run
  again **one at a time**: a cell that kills its worker while alone is the culprit, and a second death
  fails it. Bystanders of the first death run alone once and go on normally.
* Dask: the scheduler knows which task a dead worker held; after its ``allowed-failures`` (scheduler
  configuration, default 3) it raises ``KilledWorker``, which counts as one attempt here; the cell is
  submitted once more under a new key, and a second ``KilledWorker`` fails it.

A cell raising an exception (bad input, a ``KistexpError``) is deterministic: reported failed at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable

import attrs
import cloudpickle

from kistexp.errors import SweepError
from kistexp.sweep.cache import CellCache
from kistexp.sweep.cells import CellResult, CellTask, model_version, run_cell

MAX_ATTEMPTS = 2  # the first run and one retry


@attrs.frozen
class CellOutcome:
    task: CellTask
    status: str  # "ok" | "cached" | "failed"
    attempts: int
    error: str = ""
    result: CellResult | None = None


def _call_pickled(blob: bytes, task: CellTask) -> CellResult:
    # the cell function travels by value (cloudpickle), so tests can inject one a worker can import
    return cloudpickle.loads(blob)(task)


def _worker_model() -> str:
    return model_version()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class LocalBackend:
    """``ProcessPoolExecutor`` of ``workers`` spawned processes (spawn: no state forked from the caller)."""

    isolate_after_crash = True

    def __init__(self, workers: int, cell_fn: Callable[[CellTask], CellResult] = run_cell) -> None:
        if workers < 1:
            raise SweepError(f"--workers {workers}: need at least one worker")
        self.workers = workers
        self._blob = cloudpickle.dumps(cell_fn)
        self._pool: cf.ProcessPoolExecutor | None = None
        self.description = f"{workers} local worker process{'es' if workers > 1 else ''}"

    def submit(self, task: CellTask) -> cf.Future:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(_call_pickled, self._blob, task)

    def crashed(self, exc: BaseException) -> bool:
        return isinstance(exc, cf.process.BrokenProcessPool)

    def after_crash(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DaskBackend:
    """Cells as tasks of an existing Dask distributed scheduler (workers must have kistexp installed)."""

    isolate_after_crash = False

    def __init__(self, address: str, cell_fn: Callable[[CellTask], CellResult] = run_cell,
                 timeout_s: float = 10.0) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise SweepError("--dask needs Dask's distributed package: pip install 'kistexp[dask]'") from None
        try:
            self.client = Client(address, timeout=f"{timeout_s}s", set_as_default=False)
        except Exception as exc:  # OSError, TimeoutError, ValueError for a malformed address, ...
            raise SweepError(f"--dask {address}: no Dask scheduler answered within {timeout_s:g} s "
                             f"({_one_line(exc)})") from None
        try:
            self.client.wait_for_workers(1, timeout=timeout_s)
        except Exception:
            self.client.close()
            raise SweepError(f"--dask {address}: the scheduler has no workers (waited {timeout_s:g} s)") from None
        try:
            models = self.client.run(_worker_model)
        except Exception as exc:  # kistexp missing on a worker: the probe cannot even be unpickled there
            self.client.close()
            raise SweepError(f"--dask {address}: the workers cannot run kistexp ({_one_line(exc)}); install it on "
                             "every worker (docs/sweeps.md, \"Running on a Dask cluster\")") from None
        other = sorted(w for w, m in models.items() if m != model_version())
        if other:
            self.client.close()
            raise SweepError(f"--dask {address}: {len(other)} worker(s) run another kistexp model (e.g. {other[0]}: "
                             f"{models[other[0]]}, here {model_version()}): install the same kistexp everywhere")
        self.workers = max(1, sum(self.client.nthreads().values()))
        self._fn = cell_fn
        # pure=False: a resubmitted cell is a new task, not the erred one
        self._executor = self.client.get_executor(pure=False)
        self.description = f"Dask scheduler {address} ({self.workers} worker threads)"

    def submit(self, task: CellTask) -> cf.Future:
        return self._executor.submit(self._fn, task)

    def crashed(self, exc: BaseException) -> bool:
        from distributed import KilledWorker

        return isinstance(exc, KilledWorker)

    def after_crash(self) -> None:
        pass

    def close(self) -> None:
        self._executor.shutdown(wait=False)
        self.client.close()


def execute(tasks: Iterable[CellTask], backend, cache: CellCache, *,
            on_outcome: Callable[[CellOutcome], None] | None = None) -> list[CellOutcome]:
    """Run every task not already in ``cache``; ``on_outcome`` sees each cell as it finishes (cached
    cells first). Results are stored as they arrive, so an interrupted sweep resumes where it stopped."""
    tasks = list(tasks)
    outcomes: dict[int, CellOutcome] = {}

    def finish(outcome: CellOutcome) -> None:
        outcomes[outcome.task.index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    pending: deque[CellTask] = deque()
    for task in tasks:
        hit = cache.get(task.key)
        if hit is not None:
            finish(CellOutcome(task, "cached", 0, result=hit))
        else:
            pending.append(task)
    suspects: deque[CellTask] = deque()
    attempts: dict[int, int] = {}
    in_flight: dict[cf.Future, CellTask] = {}
    def submit(task: CellTask, queue: deque[CellTask]) -> bool:
        """Submit ``task``; if the backend broke since the last wait (a worker died while another
        cell finished, so no future has said so yet), put it back: the in-flight futures will
        report the death, and the next round submits to a fresh pool."""
        try:
            in_flight[backend.submit(task)] = task
            return True
        except Exception as exc:
            if not backend.crashed(exc):
                raise
            queue.appendleft(task)
            if not in_flight:  # nothing left to report it: start afresh now
                backend.after_crash()
            return False

    try:
        while pending or suspects or in_flight:
            if suspects:
                if not in_flight:  # alone, so a death is its own
                    submit(suspects.popleft(), suspects)
            else:
                while pending and len(in_flight) < backend.workers:
                    if not submit(pending.popleft(), pending):
                        break
            if not in_flight:
                continue
            done, _ = cf.wait(list(in_flight), return_when=cf.FIRST_COMPLETED)
            broke = False
            for future in done:
                task = in_flight.pop(future)
                attempts[task.index] = attempts.get(task.index, 0) + 1
                try:
                    exc = future.exception()
                except cf.CancelledError as cancelled:
                    exc = cancelled
                if exc is None:
                    result = future.result()
                    cache.put(result)
                    finish(CellOutcome(task, "ok", attempts[task.index], result=result))
                elif backend.crashed(exc):
                    broke = True
                    if attempts[task.index] >= MAX_ATTEMPTS:
                        finish(CellOutcome(task, "failed", attempts[task.index],
                                           f"the worker process died in each of {MAX_ATTEMPTS} attempts "
                                           f"({_one_line(exc)})"))
                    elif backend.isolate_after_crash:
                        suspects.append(task)
                    else:
                        pending.appendleft(task)
                else:
                    finish(CellOutcome(task, "failed", attempts[task.index], _one_line(exc)))
            if broke:
                backend.after_crash()
    finally:
        for future in in_flight:
            future.cancel()
    return [outcomes[t.index] for t in tasks if t.index in outcomes]
