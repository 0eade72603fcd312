"""Sample files for `kistexp judge compare` (docs/judge.md "Input files").

A sample source is one of:

* ``FILE`` — one number per line; blank lines and ``#`` comments are skipped;
* ``FILE:COLUMN`` — the column named COLUMN of a CSV file with a header row;
* ``FILE@METRIC`` or ``FILE@METRIC/SERVER`` — an OnionPerf or tgen analysis file (plain or
  .xz), read by kistexp's OnionPerf collector: METRIC is a catalogue name
  (``client_ttlb_1mib_s``) or a short name (``ttlb-1mib``, ``ttlb-50kib``, ``ttlb-5mib``,
  ``ttfb``, ``build-time``, ``failures``, ``throughput``); SERVER is ``public`` or
  ``onion``. These samples carry their times, so the judge also checks hour-of-day
  coverage and the design effect.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from kistexp.errors import KistexpError
from kistexp.judge.model import Window
from kistexp.metrics import catalogue

ONIONPERF_NAMES = {
    "ttfb": "client_ttfb_s",
    "ttlb-50kib": "client_ttlb_50kib_s",
    "ttlb-1mib": "client_ttlb_1mib_s",
    "ttlb-5mib": "client_ttlb_5mib_s",
    "build-time": "circuit_build_time_s",
    "failures": "client_transfer_failure_ratio",
    "throughput": "client_throughput_mbytes_per_s",
}
SERVERS = ("public", "onion")
_MAX_BYTES = 256 * 1024 * 1024


class SampleFileError(KistexpError):
    """A sample file that cannot be judged: missing, no numbers, a bad line or column."""


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SampleFileError(f"{where}: {text.strip()[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise SampleFileError(f"{where}: {text.strip()!r} is not a finite number")
    return value


def _open_text(path: Path):
    if not path.is_file():
        raise SampleFileError(f"{path}: no such file")
    if path.stat().st_size > _MAX_BYTES:
        raise SampleFileError(f"{path}: larger than {_MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return path.open(encoding="utf-8-sig", newline="")  # spreadsheets write a BOM
    except OSError as exc:
        raise SampleFileError(f"{path}: {exc.strerror}") from None


def read_numbers(path: Path) -> Window:
    values = []
    with _open_text(path) as fh:
        try:
            for lineno, line in enumerate(fh, 1):
                text = line.split("#", 1)[0].strip()
                if text:
                    values.append(_number(text, f"{path}:{lineno}"))
        except UnicodeDecodeError:
            raise SampleFileError(f"{path}: not UTF-8 text") from None
    if not values:
        raise SampleFileError(f"{path}: no numbers (one number per line expected)")
    return Window(values)


def read_csv_column(path: Path, column: str) -> Window:
    values = []
    with _open_text(path) as fh:
        try:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise SampleFileError(f"{path}: empty CSV file")
            names = [h.strip() for h in header]
            if column not in names:
                raise SampleFileError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
            idx = names.index(column)
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if not row or all(not c.strip() for c in row):
                    continue
                if idx >= len(row):
                    raise SampleFileError(f"{where}: row has {len(row)} cells, no {column!r}")
                values.append(_number(row[idx], f"{where}: column {column}"))
        except UnicodeDecodeError:
            raise SampleFileError(f"{path}: not UTF-8 text") from None
        except csv.Error as exc:
            raise SampleFileError(f"{path}:{reader.line_num}: {exc}") from None
    if not values:
        raise SampleFileError(f"{path}: column {column!r} has no numbers")
    return Window(values)


def read_onionperf(path: Path, name: str) -> Window:
    from kistexp.metrics.collectors import onionperf

    metric, _, server = name.partition("/")
    metric = ONIONPERF_NAMES.get(metric, metric)
    if metric not in ONIONPERF_NAMES.values():
        known = ", ".join([*ONIONPERF_NAMES, *ONIONPERF_NAMES.values()])
        raise SampleFileError(f"{path}@{name}: unknown OnionPerf metric (known: {known})")
    if server and server not in SERVERS:
        raise SampleFileError(f"{path}@{name}: server {server!r} is not one of {', '.join(SERVERS)}")
    if not path.is_file():
        raise SampleFileError(f"{path}: no such file")
    collected = onionperf.collect(path)
    samples = [s for s in collected.samples.get(metric, ())
               if not server or s.labels.get("server") == server]
    if not samples:
        raise SampleFileError(f"{path}: no {metric} samples{f' from {server} servers' if server else ''}")
    return Window([s.value for s in samples], [s.time.timestamp() for s in samples])


def read_samples(spec: str) -> Window:
    """The samples a FILE, FILE:COLUMN or FILE@METRIC source names (an existing file wins)."""
    path = Path(spec)
    if path.is_file():
        return read_numbers(path)
    if "@" in spec:
        file, _, name = spec.rpartition("@")
        if Path(file).is_file():
            return read_onionperf(Path(file), name)
    if ":" in spec:
        file, _, column = spec.rpartition(":")
        if Path(file).is_file():
            return read_csv_column(Path(file), column)
    raise SampleFileError(f"{spec}: no such file (sources: FILE, FILE:COLUMN, FILE@METRIC)")


def metric_of(spec: str) -> str:
    """The catalogue metric an OnionPerf source names, else ""."""
    if "@" not in spec or Path(spec).is_file():
        return ""
    name = spec.rpartition("@")[2].partition("/")[0]
    name = ONIONPERF_NAMES.get(name, name)
    return name if catalogue.get(name) is not None else ""
