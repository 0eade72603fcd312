"""Parameter sweeps: many population runs (cells) on a local process pool or an existing Dask cluster.

* ``spec``: the sweep file (``load_sweep``), docs/sweeps.md
* ``cells``: the grid (``expand``), content-hash keys, ``run_cell`` (one
  ``kistexp.population.predict.simulate_values`` run)
* ``cache``: finished cells on disk, keyed by content hash
* ``execute``: ``LocalBackend`` / ``DaskBackend`` behind ``concurrent.futures``, retry accounting
* ``results``: tidy table (Parquet, CSV), bands across networks, plots, recommendation

``run_sweep`` ties them together and writes the output directory.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from kistexp.errors import SweepError
from kistexp.safeio import open_output, read_bounded, write_atomic
from kistexp.sweep import results
from kistexp.sweep.cache import CellCache
from kistexp.sweep.cells import CellTask, expand
from kistexp.sweep.execute import CellOutcome, execute
from kistexp.sweep.spec import CONFIRM_CELLS, MAX_SWEEP_BYTES, Sweep, load_sweep
from kistexp.textsafe import csv_row

__all__ = ["CONFIRM_CELLS", "SweepReport", "load_sweep", "run_sweep"]


@attrs.frozen
class SweepReport:
    name: str
    out: str
    cells: int
    ran: int
    cached: int
    failed: int
    outcomes: tuple[CellOutcome, ...] = attrs.field(repr=False)
    recommendations: tuple[results.Recommendation, ...]
    rises: tuple[results.RiseRow, ...]
    files: tuple[str, ...]
    backend: str
    wall_s: float
    attacks: tuple[results.AttackBand, ...] = ()  # what an attacker gains per point of the grid


def _prepare_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SweepError(f"{out}: output directory is not writable ({exc.strerror or exc})") from None


class _PartialWriter:
    """Appends each finished cell's tidy rows to partial.csv as it arrives."""

    def __init__(self, sweep: Sweep, path: Path) -> None:
        self.columns = results._columns(sweep)
        self.sweep = sweep
        self.f = open_output(path, "the partial results", SweepError, newline="", encoding="utf-8")
        self.w = csv.DictWriter(self.f, fieldnames=self.columns)
        self.w.writeheader()

    def add(self, outcome: CellOutcome) -> None:
        rows = results.tidy_rows(self.sweep, [outcome])
        # text cells neutralised as in results.csv (kistexp.textsafe.csv_cell)
        self.w.writerows(csv_row({c: r.get(c) for c in self.columns}) for r in rows)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _cell_rows(sweep: Sweep, outcomes) -> list[dict]:
    out = []
    for o in outcomes:
        t: CellTask = o.task
        row = {"cell": t.key[:16], "key": t.key, "index": t.index, "network": t.network,
               "sample_seed": t.sample_seed, "seed": t.seed, "load": t.load, "loss_rate": t.loss_rate,
               "class_mix": t.class_mix, **dict(t.values), "status": o.status, "attempts": o.attempts,
               "error": o.error}
        r = o.result
        row.update(relays=r.relays if r else None, clients=r.clients if r else None,
                   achieved_utilisation=r.achieved_utilisation if r else None,
                   wall_s=r.wall_s if r else None, host=r.host if r else "")
        out.append(row)
    return out


def run_sweep(sweep: Sweep, out: Path, backend, cache: CellCache, *,
              on_start: Callable[[int, int], None] | None = None,
              on_outcome: Callable[[CellOutcome], None] | None = None,
              plots: bool = True) -> SweepReport:
    """Run (or resume) ``sweep`` on ``backend`` and write ``out``: results.parquet/.csv, cells.csv,
    recommendation.csv, rises.csv, attacks.csv (what an attacker gains per point), plot-*.png, summary.json;
    partial.csv grows as cells finish."""
    wall0 = time.perf_counter()
    _prepare_out(out)
    if Path(sweep.path).is_file():
        write_atomic(out / "sweep.toml", read_bounded(sweep.path, MAX_SWEEP_BYTES, "sweep", SweepError), "the sweep",
                     SweepError)
    tasks = expand(sweep)  # lazy: each cell's task is built as execute() reaches it
    partial = _PartialWriter(sweep, out / "partial.csv")

    def seen(outcome: CellOutcome) -> None:
        partial.add(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    try:
        outcomes = execute(tasks, backend, cache, on_start=on_start, on_outcome=seen)
    finally:
        partial.close()
    rows = results.tidy_rows(sweep, outcomes)
    files = list(results.write_table(sweep, rows, out))
    cells = _cell_rows(sweep, outcomes)
    cell_cols = list(dict.fromkeys(k for row in cells for k in row))
    results.write_csv(out / "cells.csv", cells, cell_cols)
    rises, recs = results.recommend(sweep, rows)
    results.write_csv(out / "recommendation.csv", [attrs.asdict(r) for r in recs],
                      [a.name for a in attrs.fields(results.Recommendation)])
    results.write_csv(out / "rises.csv", [attrs.asdict(r) for r in rises],
                      [a.name for a in attrs.fields(results.RiseRow)])
    attack_bands = results.attack_bands(sweep, rows)
    results.write_csv(out / "attacks.csv", [a.row() for a in attack_bands], results.attack_columns(sweep))
    files += [out / "cells.csv", out / "recommendation.csv", out / "rises.csv", out / "attacks.csv",
              out / "partial.csv"]
    if plots:
        classes = list(dict.fromkeys(["all", *(r.relay_class for r in sweep.recommend)]))
        files += results.plot(sweep, rows, out, classes, recs)
    report = SweepReport(
        name=sweep.name, out=str(out), cells=len(tasks), ran=sum(o.status == "ok" for o in outcomes),
        cached=sum(o.status == "cached" for o in outcomes), failed=sum(o.status == "failed" for o in outcomes),
        outcomes=tuple(outcomes), recommendations=tuple(recs), rises=tuple(rises), attacks=tuple(attack_bands),
        files=tuple(str(f) for f in files), backend=getattr(backend, "description", type(backend).__name__),
        wall_s=time.perf_counter() - wall0)
    summary = attrs.asdict(report, filter=lambda a, _v: a.name != "outcomes")
    summary["failures"] = [{"cell": o.task.key[:16], "index": o.task.index, "attempts": o.attempts,
                            "error": o.error} for o in outcomes if o.status == "failed"]
    write_atomic(out / "summary.json", (json.dumps(summary, indent=2, default=str) + "\n").encode("utf-8"),
                 "the summary", SweepError)
    return report
