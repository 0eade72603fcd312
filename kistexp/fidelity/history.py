"""The fidelity history: every measured ``kistexp fidelity`` run, row by row, in one CSV
(docs/fidelity.md, "The history of measurements").

The package ships the runs measured while the simulator was built
(``kistexp/data/fidelity-history.csv``); ``kistexp fidelity --record FILE`` appends a run to a
file of the user's own in the same format, so that a machine's standing can be followed after
a change of tor or of the model. One row is one case of one run; the run's own facts (when,
where, which tor, how many repetitions and seeds, which model) are repeated on each of its rows,
so the file stays one flat table that a spreadsheet or pandas reads as it is.

A row is *compared* when both sides were measured and the row was not CPU-bound on its machine
(``kistexp.fidelity.report.Row.cpu_bound``); a compared row is within the target when the simulator's
mean is within 25 % of real tor's. Summaries count only compared rows, as the report does.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import io
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kistexp import jsonout
from kistexp.errors import FidelityHistoryError
from kistexp.safeio import read_bounded_text, write_atomic
from kistexp.textsafe import csv_row, visible

if TYPE_CHECKING:
    from kistexp.fidelity.report import Report

BUNDLED_NAME = "fidelity-history.csv"
#: A history holds tens of rows per run; this is thousands of runs, and keeps a wrong file
#: (a log, a device) from being read whole.
MAX_BYTES = 32 * 1024 * 1024
#: Issue 4's target, as ``kistexp.fidelity.report.TARGET_RATIO_TOLERANCE`` (not imported: reading the
#: history needs neither tor nor the simulator).
TOLERANCE = 0.25
SCHEDULERS = ("kist", "kistlite", "vanilla")
PLOT_FORMATS = ("png", "svg")

#: The columns, in the order written. A file may leave out any but REQUIRED; a column not named
#: here is refused, so a misspelt one is not silently dropped.
COLUMNS = (
    # the run
    "run_id", "measured_utc", "machine", "cpu_model", "cores", "tor_version", "repetitions", "seeds",
    "sim_model", "mode", "size_mb", "run_note",
    # the case
    "scenario", "scheduler", "interval_ms", "client_interval_ms",
    "real_mbytes_per_s", "real_min_mbytes_per_s", "real_max_mbytes_per_s", "sim_mbytes_per_s",
    "sim_over_real", "compared",
    "real_run_period_ms", "sim_run_period_ms", "real_cells_per_run", "sim_cells_per_run",
    "load_1min", "stolen_pct", "core_wait_pct", "note",
)
REQUIRED = ("run_id", "measured_utc", "scenario", "scheduler", "interval_ms", "real_mbytes_per_s",
            "sim_mbytes_per_s", "sim_over_real", "compared")
#: Facts of the run, the same on each of its rows.
RUN_COLUMNS = COLUMNS[:12]


def utc_text(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ" if when.second else "%Y-%m-%dT%H:%MZ")


@attrs.frozen
class HistoryRow:
    """One case of one measured run."""

    run_id: str
    measured_utc: dt.datetime  # when the run started, UTC
    scenario: str
    scheduler: str  # kist | kistlite | vanilla
    interval_ms: int  # KISTSchedRunInterval of the relays
    real_mbytes_per_s: float | None  # mean over the real repetitions, 10^6 B/s
    sim_mbytes_per_s: float | None  # mean over the simulator's seeds
    sim_over_real: float | None
    compared: bool  # both sides measured and not CPU-bound on the machine
    machine: str = ""  # as the user names it ("eighth machine")
    cpu_model: str = ""
    cores: int | None = None
    tor_version: str = ""
    repetitions: int | None = None  # real tor's runs per case
    seeds: int | None = None  # the simulator's seeds per case
    sim_model: str = ""  # which model the simulator side is ("2026-12-03 06:30 UTC", "kistexp 0.1.0")
    mode: str = ""  # rounds | case-by-case
    size_mb: float | None = None
    run_note: str = ""
    client_interval_ms: int | None = None  # None: the relays' interval
    # the range of real tor's repetitions; the bundled runs have it to 0.1 MB/s, as their tables printed it
    real_min_mbytes_per_s: float | None = None
    real_max_mbytes_per_s: float | None = None
    real_run_period_ms: float | None = None  # median, the middle relay's scheduler log
    sim_run_period_ms: float | None = None
    real_cells_per_run: float | None = None  # median, the middle relay's busy channel
    sim_cells_per_run: float | None = None
    load_1min: float | None = None
    stolen_pct: float | None = None  # CPU time the machine's host took during the repetitions
    core_wait_pct: float | None = None  # the longest a tor of the path waited for a core
    note: str = ""

    @property
    def client_interval(self) -> int:
        return self.interval_ms if self.client_interval_ms is None else self.client_interval_ms

    @property
    def label(self) -> str:
        """``scenario/scheduler/2ms``, as the report names cases (``client-10ms`` names the client's interval)."""
        return f"{self.scenario}/{self.scheduler}/{self.interval_ms}ms"

    @property
    def case(self) -> tuple[str, str, int, int]:
        return self.scenario, self.scheduler, self.interval_ms, self.client_interval

    @property
    def within_target(self) -> bool | None:
        """Within 25 % of real tor; None for a row that is not compared."""
        if not self.compared or self.sim_over_real is None:
            return None
        return abs(self.sim_over_real - 1.0) <= TOLERANCE


# a row in `kistexp fidelity --history --json`: its fields in their order, the time as the file writes it,
# client_interval_ms the client's interval even where the file leaves it to the relays'; then within_25pct
jsonout.shape(fields={"measured_utc": utc_text}, omit=("client_interval_ms",),
              derived={"client_interval_ms": lambda r: r.client_interval, "within_25pct": lambda r: r.within_target},
              order=tuple(a.name for a in attrs.fields(HistoryRow)))(HistoryRow)


@jsonout.shape(fields={"measured_utc": utc_text})  # a run in `kistexp fidelity --history --json`
@attrs.frozen
class RunSummary:
    """One run in a line: where and how it was measured, and how close the simulator came."""

    run_id: str
    measured_utc: dt.datetime
    machine: str
    cpu_model: str
    cores: int | None
    tor_version: str
    repetitions: int | None
    seeds: int | None
    sim_model: str
    cases: int
    compared: int
    within: int
    complete: bool  # every case of a default ``kistexp fidelity`` run, with both sides
    ratio_min: float | None  # over the compared rows
    ratio_max: float | None
    outside: tuple[str, ...]  # labels of the compared rows outside 25 %


@attrs.frozen
class History:
    rows: tuple[HistoryRow, ...]
    source: str  # the file, as errors and reports name it

    def run_ids(self) -> tuple[str, ...]:
        """Every run, oldest first (by start time; ties in the file's order)."""
        first: dict[str, tuple[dt.datetime, int]] = {}
        for i, row in enumerate(self.rows):
            first.setdefault(row.run_id, (row.measured_utc, i))
        return tuple(sorted(first, key=first.__getitem__))

    def run(self, run_id: str) -> tuple[HistoryRow, ...]:
        rows = tuple(r for r in self.rows if r.run_id == run_id)
        if not rows:
            raise FidelityHistoryError(f"{self.source}: no run {run_id!r} (runs: {', '.join(self.run_ids())})")
        return rows

    def summaries(self) -> tuple[RunSummary, ...]:
        return tuple(summarise(self.run(run_id)) for run_id in self.run_ids())

    def current(self) -> RunSummary | None:
        """The current standing: the latest complete run (every case of a default run, both sides
        measured), or the latest run where none is complete; None for an empty history."""
        runs = self.summaries()
        complete = [s for s in runs if s.complete]
        return (complete or list(runs) or [None])[-1]


@functools.cache
def default_cases() -> frozenset[tuple[str, str, int, int]]:
    """The cases of ``kistexp fidelity`` without --scenarios, --schedulers and --intervals."""
    from kistexp.fidelity.cases import parse_cases

    return frozenset((c.scenario, c.scheduler, c.interval_ms, c.client_interval_ms) for c in parse_cases())


def summarise(rows: Sequence[HistoryRow]) -> RunSummary:
    """The summary of one run's rows."""
    first = rows[0]
    compared = [r for r in rows if r.within_target is not None]
    ratios = [r.sim_over_real for r in compared if r.sim_over_real is not None]
    measured = {r.case for r in rows if r.real_mbytes_per_s is not None and r.sim_mbytes_per_s is not None}
    return RunSummary(
        first.run_id, first.measured_utc, first.machine, first.cpu_model, first.cores, first.tor_version,
        first.repetitions, first.seeds, first.sim_model, len(rows), len(compared),
        sum(bool(r.within_target) for r in compared), default_cases() <= measured,
        min(ratios) if ratios else None, max(ratios) if ratios else None,
        tuple(r.label for r in compared if not r.within_target))


# ---- reading -----------------------------------------------------------------------------


def bundled_path() -> Path:
    """The history shipped with the package."""
    return Path(str(resources.files("kistexp").joinpath("data", BUNDLED_NAME)))


def load(path: str | os.PathLike[str] | None = None) -> History:
    """The history in ``path`` (default: the bundled one). Any problem is one line naming the file,
    the line and the column."""
    where = bundled_path() if path is None else Path(path)
    text = read_bounded_text(where, MAX_BYTES, "fidelity history", FidelityHistoryError)
    return parse(text, str(where))


def _text(value: str) -> str:
    return value.strip()


def _number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError("not a finite number >= 0")
    return number


def _count(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError("not a whole number >= 1")
    return int(value)


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise ValueError("not true or false")
    return lowered == "true"


def _when(value: str) -> dt.datetime:
    for fmt in ("%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return dt.datetime.strptime(value, fmt).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            continue
    raise ValueError("not a UTC time such as 2026-12-04T13:06Z")


def _scheduler(value: str) -> str:
    if value not in SCHEDULERS:
        raise ValueError(f"not one of {', '.join(SCHEDULERS)}")
    return value


def _nonempty(value: str) -> str:
    if not value:
        raise ValueError("empty")
    return value


#: How each column's cell becomes a field; an empty optional cell is None (numbers) or "" (text).
_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "run_id": _nonempty, "measured_utc": _when, "machine": _text, "cpu_model": _text, "cores": _count,
    "tor_version": _text, "repetitions": _count, "seeds": _count, "sim_model": _text, "mode": _text,
    "size_mb": _number, "run_note": _text, "scenario": _nonempty, "scheduler": _scheduler,
    "interval_ms": _count, "client_interval_ms": _count, "real_mbytes_per_s": _number,
    "real_min_mbytes_per_s": _number, "real_max_mbytes_per_s": _number, "sim_mbytes_per_s": _number,
    "sim_over_real": _number, "compared": _bool, "real_run_period_ms": _number, "sim_run_period_ms": _number,
    "real_cells_per_run": _number, "sim_cells_per_run": _number, "load_1min": _number, "stolen_pct": _number,
    "core_wait_pct": _number, "note": _text,
}
_MUST_HAVE_VALUE = frozenset({"run_id", "measured_utc", "scenario", "scheduler", "interval_ms", "compared"})
_TEXT_COLUMNS = frozenset({"machine", "cpu_model", "tor_version", "sim_model", "mode", "run_note", "note"})


def parse(text: str, source: str) -> History:
    """A history from CSV ``text``; ``source`` names it in errors."""

    def fail(line: int, message: str) -> FidelityHistoryError:
        return FidelityHistoryError(f"{source}: line {line}: {message}")

    text = text.removeprefix("\ufeff")  # a spreadsheet's byte-order mark
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise fail(reader.line_num, f"not CSV ({exc})") from None
    if header is None:
        raise FidelityHistoryError(f"{source}: empty file: a fidelity history starts with a header line "
                                   f"naming its columns ({', '.join(REQUIRED)}, ...)")
    header = [h.strip() for h in header]
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise fail(1, f"unknown column {unknown[0]!r} (known: {', '.join(COLUMNS)})")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise fail(1, f"column {missing[0]!r} is missing (a fidelity history needs {', '.join(REQUIRED)})")
    twice = [h for h in header if header.count(h) > 1]
    if twice:
        raise fail(1, f"column {twice[0]!r} appears twice")
    rows: list[HistoryRow] = []
    run_first: dict[str, tuple[int, dict[str, Any]]] = {}
    seen: dict[tuple[str, tuple[str, str, int, int]], int] = {}
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise fail(reader.line_num, f"not CSV ({exc})") from None
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue  # a blank line
        if len(cells) != len(header):
            raise fail(line, f"{len(cells)} cells, but the header names {len(header)} columns")
        values: dict[str, Any] = {}
        for column, raw in zip(header, cells, strict=True):
            raw = raw.strip()
            if not raw and column not in _MUST_HAVE_VALUE:
                values[column] = "" if column in _TEXT_COLUMNS else None
                continue
            try:
                values[column] = _PARSERS[column](raw)
            except ValueError as exc:
                raise fail(line, f"column {column!r}: {raw!r} is {exc}") from None
        if values["compared"] and values["sim_over_real"] is None:
            raise fail(line, "column 'sim_over_real' is empty on a compared row")
        row = HistoryRow(**{k: v for k, v in values.items()})
        run = {c: values.get(c, "" if c in _TEXT_COLUMNS else None) for c in RUN_COLUMNS}
        if row.run_id in run_first:
            first_line, first = run_first[row.run_id]
            for column in RUN_COLUMNS:
                if run[column] != first[column]:
                    raise fail(line, f"run {row.run_id}: column {column!r} differs from line {first_line} "
                                     "(a run's own facts are the same on each of its rows)")
        else:
            run_first[row.run_id] = (line, run)
        key = (row.run_id, row.case)
        if key in seen:
            raise fail(line, f"run {row.run_id}: case {row.label} again (first on line {seen[key]})")
        seen[key] = line
        rows.append(row)
    return History(tuple(rows), source)


# ---- writing -----------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return utc_text(value)
    if isinstance(value, float):
        return format(round(value, 4), "g") if value else "0"
    return str(value)


def row_cells(row: HistoryRow, columns: Sequence[str] = COLUMNS) -> list[str]:
    values = attrs.asdict(row)
    return [_cell(values[c]) for c in columns]


def to_csv(rows: Iterable[HistoryRow], columns: Sequence[str] = COLUMNS, header: bool = True) -> str:
    buf = io.StringIO(newline="")
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(columns)
    for row in rows:
        # machine names and notes are the user's text: never a formula in the spreadsheet that opens the file
        writer.writerow(csv_row(row_cells(row, columns)))
    return buf.getvalue()


def rows_from_report(report: Report, *, run_id: str, measured_utc: dt.datetime, machine: str = "",
                     cpu_model: str = "", cores: int | None = None, tor_version: str = "", sim_model: str = "",
                     mode: str = "", run_note: str = "") -> tuple[HistoryRow, ...]:
    """A ``kistexp fidelity`` report as history rows, one per case whose real side was measured."""
    runs = report.real_runs()
    out = []
    for r in report.rows:
        real = r.real
        if real is None or not real.throughputs_mbytes_per_s:
            continue
        rp = real.run_period
        sim = r.sim
        compared = r.within_target is not None
        if r.cpu_bound:
            note = "CPU-bound on this machine: reported, not compared"
        else:
            note = "; ".join(n for n in (r.real_note, r.sim_note) if n)
        out.append(HistoryRow(
            run_id=run_id, measured_utc=measured_utc, machine=machine, cpu_model=cpu_model, cores=cores,
            tor_version=tor_version, repetitions=max(runs) if runs else None,
            seeds=report.sim_seeds if sim else None, sim_model=sim_model if sim else "", mode=mode,
            size_mb=report.size_mb, run_note=run_note, scenario=r.case.scenario, scheduler=r.case.scheduler,
            interval_ms=r.case.interval_ms, client_interval_ms=r.case.client_interval_ms,
            real_mbytes_per_s=real.mean_mbytes_per_s, real_min_mbytes_per_s=min(real.throughputs_mbytes_per_s),
            real_max_mbytes_per_s=max(real.throughputs_mbytes_per_s),
            sim_mbytes_per_s=sim.mean_mbytes_per_s if sim else None, sim_over_real=r.ratio, compared=compared,
            real_run_period_ms=rp.period_ms_median if rp else None,
            sim_run_period_ms=sim.run_period_ms if sim else None,
            real_cells_per_run=rp.cells_per_run_median if rp else None,
            sim_cells_per_run=sim.cells_per_run_median if sim else None, load_1min=real.load_1min,
            stolen_pct=100 * real.stolen_mean if real.stolen_mean is not None else None,
            core_wait_pct=100 * real.core_wait_mean if real.core_wait_mean is not None else None,
            note=" ".join(note.split())))
    return tuple(out)


def installed_tor_version() -> str:
    """The version of the tor a local network runs here ("0.4.9.11"), or "" where none answers."""
    import subprocess

    from kistexp.errors import LocalNetError
    from kistexp.localnet.network import require_tor

    try:
        tor, _gencert = require_tor()
        out = subprocess.run([tor, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (LocalNetError, OSError, subprocess.SubprocessError):
        return ""
    words = out.split()
    # "Tor version 0.4.9.11." on the first line
    return words[2].rstrip(".") if len(words) > 2 and words[:2] == ["Tor", "version"] else ""


def report_rows(report: Report, started: dt.datetime, *, machine: str | None = None,
                real_from: str | os.PathLike[str] | None = None, rounds: bool = True,
                max_stolen: float | None = None) -> tuple[HistoryRow, ...]:
    """A finished ``kistexp fidelity`` run as history rows, described by this machine: its host name
    (unless ``machine``), processor, cores and tor. Where the real side was read from an earlier report
    (``real_from``) it was measured elsewhere or earlier, so the machine's own facts are left blank."""
    import socket

    from kistexp import __version__
    from kistexp.localnet.machine import cpu_model

    here = real_from is None
    notes = [f"--max-stolen {max_stolen:g}"] if max_stolen is not None and here else []
    if not here:
        notes.append(f"real tor's figures from {os.fsdecode(real_from)}")
    started = started.astimezone(dt.timezone.utc).replace(microsecond=0)
    return rows_from_report(
        report, run_id=utc_text(started), measured_utc=started, machine=machine or socket.gethostname(),
        cpu_model=cpu_model() if here else "", cores=os.cpu_count() if here else None,
        tor_version=installed_tor_version() if here else "", sim_model=f"kistexp {__version__}",
        mode=("rounds" if rounds else "case-by-case") if here else "", run_note="; ".join(notes))


def check_recordable(path: str | os.PathLike[str]) -> History | None:
    """The history already in ``path`` (None where there is no file yet), read before a run so that
    a file that cannot take the run is refused before the run's minutes are spent."""
    where = Path(path)
    if not where.exists() and not where.is_symlink():
        folder = where.resolve().parent
        if not folder.is_dir():
            raise FidelityHistoryError(f"{where}: cannot record the run: no directory {folder}")
        return None
    if where.is_file() and not where.is_symlink() and where.stat().st_size == 0:
        return None  # a file made empty beforehand (touch) takes the header with the first run
    return load(where)


def record(path: str | os.PathLike[str], rows: Sequence[HistoryRow]) -> History:
    """Append ``rows`` (one run) to the history in ``path``, creating it with a header if absent.
    The file is written whole or not at all; the lines already there are kept as they are."""
    if not rows:
        raise FidelityHistoryError(f"{path}: nothing to record: no case of this run has real tor's figures")
    existing = check_recordable(path)
    run_ids = {r.run_id for r in rows}
    if len(run_ids) != 1:
        raise FidelityHistoryError(f"{path}: one run at a time (got {len(run_ids)})")
    (run_id,) = run_ids
    if existing is None:
        text = to_csv(rows)
    else:
        if run_id in {r.run_id for r in existing.rows}:
            raise FidelityHistoryError(f"{path}: run {run_id} is already recorded")
        old = read_bounded_text(path, MAX_BYTES, "fidelity history", FidelityHistoryError)
        header = next(csv.reader(io.StringIO(old.removeprefix("\ufeff"))))
        columns = [h.strip() for h in header]
        if not old.endswith("\n"):
            old += "\n"
        text = old + to_csv(rows, columns, header=False)
    history = parse(text, os.fsdecode(path))
    write_atomic(path, text.encode("utf-8"), "fidelity history", FidelityHistoryError)
    return history


# ---- plotting ----------------------------------------------------------------------------

SCENARIO_ORDER = ("circuit", "circuits-2", "circuits-4", "ceiling", "streams-4", "client-10ms", "cc-off")
SCHEDULER_MARKERS = {"kist": "o", "kistlite": "s", "vanilla": "^"}


def plot(history: History, out: str | os.PathLike[str], title: str = "") -> Path:
    """Every compared row's sim/real ratio, one column of points per run (oldest on the left), coloured by
    scenario and shaped by scheduler, over the ±25 % band; each run's "within / compared" count above it.
    PNG or SVG by ``out``'s suffix; written whole or not at all."""
    where = Path(out)
    fmt = where.suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        raise FidelityHistoryError(f"{where}: a plot is written as .png or .svg, not {where.suffix or 'no suffix'}")
    runs = history.summaries()
    if not runs:
        raise FidelityHistoryError(f"{history.source}: no runs to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    scenarios = sorted({r.scenario for r in history.rows},
                       key=lambda s: (SCENARIO_ORDER.index(s) if s in SCENARIO_ORDER else len(SCENARIO_ORDER), s))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(scenarios)}
    width = 0.7  # of a run's slot, shared by its scenarios
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * len(runs) + 3.5), 5.2))
    with plt.rc_context({"text.parse_math": False}):
        ax.axhspan(1 - TOLERANCE, 1 + TOLERANCE, color="#2e7d32", alpha=0.12, lw=0)
        ax.axhline(1.0, color="#2e7d32", lw=0.8)
        top = 1 + TOLERANCE
        for x, run in enumerate(runs):
            rows = [r for r in history.run(run.run_id) if r.within_target is not None]
            for r in rows:
                k = scenarios.index(r.scenario)
                offset = (k - (len(scenarios) - 1) / 2) * width / max(1, len(scenarios))
                ax.plot(x + offset, r.sim_over_real, SCHEDULER_MARKERS.get(r.scheduler, "D"),
                        color=colours[r.scenario], ms=4.5, alpha=0.85, mfc="none" if r.interval_ms >= 10 else None)
                top = max(top, r.sim_over_real or 0)
        for x, run in enumerate(runs):
            ax.annotate(f"{run.within}/{run.compared}" if run.compared else "-", (x, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(0, 3), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([f"{r.measured_utc:%m-%d %H:%M}\n{_short(visible(r.machine))}" for r in runs],
                           rotation=90, fontsize=7)
        ax.set_xlim(-0.6, len(runs) - 0.4)
        ax.set_ylim(min([0.5, *(r.ratio_min for r in runs if r.ratio_min is not None)]) - 0.05, top * 1.05)
        ax.set_xlabel("run (start, UTC, and machine; oldest first)")
        ax.set_ylabel("simulator / real tor throughput (ratio of means)")
        ax.set_title(title or "kistexp fidelity: the simulator against real tor, per run\n"
                     "(compared rows only; above each run: rows within 25 % / rows compared)", fontsize=10,
                     pad=42)
        ax.grid(axis="y", alpha=0.3)
        # scenario and machine names are the history file's text: control characters would make an SVG invalid
        handles = [Line2D([], [], ls="", marker="o", color=colours[s], label=visible(s)) for s in scenarios]
        handles += [Line2D([], [], ls="", marker=m, color="0.3", label=k) for k, m in SCHEDULER_MARKERS.items()]
        handles += [Line2D([], [], ls="", marker="o", color="0.3", mfc="none", label="interval 10 ms or more"),
                    plt.Rectangle((0, 0), 1, 1, color="#2e7d32", alpha=0.12, label="within 25 %")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  title="scenario, scheduler", title_fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
        finally:
            plt.close(fig)
    write_atomic(where, buf.getvalue(), "plot", FidelityHistoryError)
    return where


def _short(machine: str) -> str:
    """A machine's name for a tick label: "eighth machine" -> "eighth"."""
    text = machine.removesuffix(" machine").strip()
    return text if len(text) <= 14 else text[:13] + "."
