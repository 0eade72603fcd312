"""Running cells (population runs) through ``concurrent.futures``: a local process pool or an existing Dask
scheduler. One code path for ``kistexp sweep`` (``kistexp.sweep.execute``: a sweep's cells, with their
cache) and ``kistexp simulate`` (``kistexp.population.predict.simulate_plan``: a plan's network x
transition runs).

A cell is a picklable task (with an ``index``, its position in the caller's order) handed to a pure
function that returns a picklable result. Both backends hand out ``concurrent.futures.Future`` objects
(``ProcessPoolExecutor.submit``; ``distributed.Client.get_executor().submit``), so one loop drives either.
At most as many cells are in flight as there are worker slots: a slot is never idle for long, and when a
worker process dies the cells it could have been running are known.

A cell whose worker process dies (killed, out of memory, a crash in compiled code) is retried once, then
reported failed; the others go on. Accounting:

* local pool: a dying worker breaks the whole ``ProcessPoolExecutor`` (``BrokenProcessPool`` on every
  cell in flight), so each of them is charged one attempt, the pool is rebuilt and the charged cells run
  again **one at a time**: a cell that kills its worker while alone is the culprit, and a second death
  fails it. Bystanders of the first death run alone once and go on normally.
* Dask: the scheduler knows which task a dead worker held; after its ``allowed-failures`` (scheduler
  configuration, default 3) it raises ``KilledWorker``, which counts as one attempt here; the cell is
  submitted once more under a new key, and a second ``KilledWorker`` fails it.

A cell raising an exception (bad input, a ``KistexpError``) is deterministic: reported failed at once.

This module knows no cell type: the cell function, the model version a Dask worker must run and the
error type of the command (``--workers``, ``--dask`` problems) come from the caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import cloudpickle

from kistexp.errors import DispatchError, KistexpError

MAX_ATTEMPTS = 2  # the first run and one retry
MAX_WORKERS_PER_CPU = 4
# a longer wait for a scheduler and its workers is a hung command, not patience
MAX_DASK_TIMEOUT_S = 3600.0

_PKG = Path(__file__).resolve().parent.parent


def source_version(patterns: Iterable[str]) -> str:
    """SHA-256 (16 hex digits) of the kistexp sources matching ``patterns`` (globs relative to the
    package, e.g. ``"sim/*.py"``) and numba's version: what a cell's numbers depend on besides its inputs."""
    digest = hashlib.sha256()
    for pattern in patterns:
        for path in sorted(_PKG.glob(pattern)):
            digest.update(str(path.relative_to(_PKG)).encode())
            digest.update(path.read_bytes())
    digest.update(metadata.version("numba").encode())
    return digest.hexdigest()[:16]


@attrs.frozen
class CellOutcome:
    task: Any  # the caller's task (has ``index``)
    status: str  # "ok" | "cached" | "failed"
    attempts: int
    error: str = ""
    result: Any = None


def _call_pickled(blob: bytes, task):
    # the cell function travels by value (cloudpickle), so tests can inject one a worker can import
    return cloudpickle.loads(blob)(task)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def check_options(workers: int | None, dask: str | None, dask_timeout: float,
                  error: type[KistexpError] = DispatchError) -> None:
    """``--workers``, ``--dask`` and ``--dask-timeout`` as a command takes them, checked before anything
    starts."""
    if dask is not None and workers is not None:
        raise error("--workers and --dask exclude each other (a Dask cluster has its own workers)")
    # finite and at most an hour: nan or inf would wait for ever (the timeout also bounds the wait for workers)
    if not 0 < dask_timeout <= MAX_DASK_TIMEOUT_S:
        raise error(f"--dask-timeout {dask_timeout:g}: must be a number of seconds in (0, {MAX_DASK_TIMEOUT_S:g}]")


class LocalBackend:
    """``ProcessPoolExecutor`` of ``workers`` spawned processes (spawn: no state forked from the caller)."""

    isolate_after_crash = True
    local = True  # cells run on this machine (its numba cache, its CPUs)

    def __init__(self, workers: int, cell_fn: Callable, *, error: type[KistexpError] = DispatchError) -> None:
        if workers < 1:
            raise error(f"--workers {workers}: need at least one worker")
        # a cell is one single-threaded process of about 250 MB: more processes than this only share the
        # cores, and as many as the grid has cells would all be started at once
        most = MAX_WORKERS_PER_CPU * (os.cpu_count() or 1)
        if workers > most:
            raise error(f"--workers {workers}: at most {most} ({MAX_WORKERS_PER_CPU} per CPU of this machine)")
        self.workers = workers
        self._blob = cloudpickle.dumps(cell_fn)
        self._pool: cf.ProcessPoolExecutor | None = None
        self.description = f"{workers} local worker process{'es' if workers > 1 else ''}"

    def submit(self, task) -> cf.Future:
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

    def abandon(self) -> None:
        """Stop now (a failed cell or Ctrl-C ends the command): the cells running are killed, not waited for."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)


# how long past its own timeout a call into distributed may take before it is given up
_GRACE_S = 2.0


def _within(seconds: float, fn: Callable[[], object]):
    """``fn()`` in a daemon thread, given up after ``seconds`` (TimeoutError): a call that never returns
    is left behind instead of holding the command (and, being a daemon, does not hold the exit either)."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="kistexp-dask-connect", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer after {seconds:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def _check_address(address: str, shown: str, error: type[KistexpError]) -> None:
    """An empty address or an unknown scheme, refused before anything connects (distributed would retry
    it until its timeout, then print a traceback while collecting the half-made client)."""
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address

    if not address.strip():
        raise error("--dask: the scheduler address is empty (e.g. tcp://10.0.0.5:8786)")
    try:
        scheme, location = parse_address(address)
    except ValueError as exc:
        raise error(f"--dask {shown}: not a Dask address ({_one_line(exc)})") from None
    if scheme not in registry.backends:
        raise error(f"--dask {shown}: unknown address scheme {scheme!r} (known: "
                    f"{', '.join(sorted(registry.backends))}; e.g. tcp://10.0.0.5:8786)")
    if not location:
        raise error(f"--dask {shown}: no host in the address (e.g. tcp://10.0.0.5:8786)")


def _probe(address: str, shown: str, timeout_s: float, error: type[KistexpError]) -> None:
    """Connect and complete distributed's handshake within ``timeout_s``. distributed's ``connect()``
    bounds the TCP connection but then waits for the peer's handshake without a deadline, so a server
    that accepts and never answers held ``Client()`` for ever whatever its timeout."""
    import asyncio

    from distributed.comm import connect
    from distributed.security import Security

    async def handshake() -> None:
        comm = await connect(address, timeout=timeout_s, **Security().get_connection_args("client"))
        await comm.close()

    try:
        _within(timeout_s + _GRACE_S, lambda: asyncio.run(asyncio.wait_for(handshake(), timeout_s)))
    except (TimeoutError, asyncio.TimeoutError):
        raise error(f"--dask {shown}: no Dask scheduler answered within {timeout_s:g} s") from None
    except Exception as exc:  # OSError (refused, unreachable), a TLS address without certificates, ...
        raise error(f"--dask {shown}: no Dask scheduler answered within {timeout_s:g} s "
                    f"({_one_line(exc)})") from None


class DaskBackend:
    """Cells as tasks of an existing Dask distributed scheduler (workers must have kistexp installed).

    ``model`` is an importable function returning the model version (``source_version`` of what the
    cells' numbers depend on): every worker is asked for it before the first cell, and one without
    kistexp, or with another version, is refused."""

    isolate_after_crash = False
    local = False

    def __init__(self, address: str, cell_fn: Callable, *, model: Callable[[], str], timeout_s: float = 10.0,
                 error: type[KistexpError] = DispatchError) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise error("--dask needs Dask's distributed package: pip install 'kistexp[dask]'") from None
        shown = address if address.isprintable() else repr(address)
        _check_address(address, shown, error)
        _probe(address, shown, timeout_s, error)
        try:
            self.client = _within(timeout_s + _GRACE_S,
                                  lambda: Client(address, timeout=f"{timeout_s}s", set_as_default=False))
        except Exception as exc:  # OSError, TimeoutError, ...
            raise error(f"--dask {shown}: no Dask scheduler answered within {timeout_s:g} s "
                        f"({_one_line(exc)})") from None
        try:
            self.client.wait_for_workers(1, timeout=timeout_s)
        except Exception:
            self.client.close()
            raise error(f"--dask {shown}: the scheduler has no workers (waited {timeout_s:g} s)") from None
        try:
            models = self.client.run(model)
        except Exception as exc:  # kistexp missing on a worker: the probe cannot even be unpickled there
            self.client.close()
            raise error(f"--dask {shown}: the workers cannot run kistexp ({_one_line(exc)}); install it on "
                        "every worker (docs/sweeps.md, \"Running on a Dask cluster\")") from None
        here = model()
        other = sorted(w for w, m in models.items() if m != here)
        if other:
            self.client.close()
            raise error(f"--dask {shown}: {len(other)} worker(s) run another kistexp model (e.g. {other[0]}: "
                        f"{models[other[0]]}, here {here}): install the same kistexp everywhere")
        self.workers = max(1, sum(self.client.nthreads().values()))
        self._fn = cell_fn
        # pure=False: a resubmitted cell is a new task, not the erred one
        self._executor = self.client.get_executor(pure=False)
        self.description = f"Dask scheduler {address} ({self.workers} worker threads)"

    def submit(self, task) -> cf.Future:
        return self._executor.submit(self._fn, task)

    def crashed(self, exc: BaseException) -> bool:
        from distributed import KilledWorker

        return isinstance(exc, KilledWorker)

    def after_crash(self) -> None:
        pass

    def close(self) -> None:
        if self.client.status in ("closing", "closed"):
            return
        self._executor.shutdown(wait=False)
        self.client.close()

    def abandon(self) -> None:
        self.close()  # the client's futures are released with it: the scheduler drops their tasks


def execute(tasks: Iterable, backend, *, cached: Callable[[Any], Any] | None = None,
            accept: Callable[[Any, Any], Any] | None = None,
            on_start: Callable[[int, int], None] | None = None,
            on_outcome: Callable[[CellOutcome], None] | None = None) -> list[CellOutcome]:
    """Run every task ``cached(task)`` has no result for (None: every task); ``on_start`` gets the numbers
    of cells and of cached cells once those are known, ``on_outcome`` sees each cell as it finishes
    (cached cells first). ``accept(task, result)`` returns the result to keep (and may store it), or a
    string saying why it is unusable: the cell then fails with it. Outcomes come back in the order of
    ``tasks``; an exception raised by a callback stops the run (the cells in flight are cancelled).

    ``tasks`` is read once, in order (a sweep's ``CellGrid`` builds each task as it is read)."""
    order: list[int] = []
    outcomes: dict[int, CellOutcome] = {}

    def finish(outcome: CellOutcome) -> None:
        outcomes[outcome.task.index] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    pending: deque = deque()
    for task in tasks:
        order.append(task.index)
        hit = cached(task) if cached is not None else None
        if hit is not None:
            finish(CellOutcome(task, "cached", 0, result=hit))
        else:
            pending.append(task)
    if on_start is not None:
        on_start(len(order), len(outcomes))
    suspects: deque = deque()
    attempts: dict[int, int] = {}
    in_flight: dict[cf.Future, Any] = {}

    def submit(task, queue: deque) -> bool:
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
                    kept = future.result()
                    if accept is not None:
                        kept = accept(task, kept)
                    if accept is not None and isinstance(kept, str):
                        finish(CellOutcome(task, "failed", attempts[task.index],
                                           f"the worker returned an unusable result ({kept})"))
                        continue
                    finish(CellOutcome(task, "ok", attempts[task.index], result=kept))
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
    return [outcomes[i] for i in order if i in outcomes]
