"""Operator report CSV (``kistexp-operator-report/1``, metrics-sources.md §4): what relay
operators send in about their relays' CPU, memory and bandwidth, one row per relay and
window.

RFC 4180, UTF-8, a header row, units in the column names, UTC times. A file with an
unknown column (an unknown unit), a missing required column or over the size limits is
refused as a whole; a bad row (unknown fingerprint, non-numeric or negative cell, naive
time, end <= start, duplicate relay and window) is reported as "FILE:LINE: what" and left
out, the good rows are imported.

Samples are stamped at the window start: relay_cpu_utilization = cpu_pct_core_mean/100,
relay_rss_bytes = rss_mib_mean x 2^20, relay_bandwidth_bytes_per_s = (read + write
Mbit/s) x 10^6 / 8. ``param_value`` is the row's param_value when given.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

from kistexp.metrics.collectors import Collected, CorruptSource, MiB, check_time, group_samples, read_bounded
from kistexp.metrics.series import Sample

KIND = "operator-report"
FORMAT = "kistexp-operator-report/1"

REQUIRED = ("relay_fingerprint", "window_start_utc", "window_end_utc")
NUMERIC = ("cpu_pct_core_mean", "cpu_pct_core_p95", "rss_mib_mean", "rss_mib_max", "read_mbit_s_mean",
           "write_mbit_s_mean", "sample_interval_s", "restarts", "cpu_cores", "ram_total_mib")
COLUMNS = frozenset(REQUIRED + NUMERIC + ("nickname", "tor_version", "phase", "param_name", "param_value",
                                          "cpu_source", "bw_source", "host_shared", "notes"))
PHASES = frozenset({"", "baseline", "treatment", "rollback"})
SOURCES = frozenset({"", "proc", "process_exporter", "metricsport", "node_exporter", "vnstat", "provider", "other"})
_FPR = re.compile(r"^[0-9A-F]{40}$")
# Numbers are ASCII (float() also reads "١٢" and "1_0"), at most this large: 10^12 MiB of memory or
# Mbit/s is far beyond any relay, and 1e308 MiB once turned into an infinite sample.
MAX_NUMBER = 1e12
# param_value is a consensus parameter: tor's are 32-bit (a value beyond 64 bits made the store fail)
PARAM_MIN, PARAM_MAX = -(2**31), 2**31 - 1
_INTEGER = re.compile(r"-?[0-9]{1,10}")


@attrs.frozen
class Limits:
    max_bytes: int = 10 * MiB
    max_rows: int = 100_000
    max_columns: int = 64
    max_cell: int = 4096


def _time(text: str, column: str) -> dt.datetime:
    raw = text.strip()
    if not raw:
        raise ValueError(f"{column} is empty")
    try:
        t = dt.datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)
    except ValueError:
        raise ValueError(f"{column} {raw[:40]!r} is not an ISO 8601 time") from None
    if t.tzinfo is None:
        raise ValueError(f"{column} {raw!r} has no timezone (write it in UTC with Z)")
    try:
        return t.astimezone(dt.timezone.utc)
    except OverflowError:  # 0001-01-01T00:00+05:00 is before year 1 in UTC
        raise ValueError(f"{column} {raw!r} is outside years 1 to 9999 in UTC") from None


def _number(text: str, column: str) -> float | None:
    raw = text.strip()
    if not raw:
        return None
    try:
        if not raw.isascii():
            raise ValueError
        value = float(raw)
    except ValueError:
        raise ValueError(f"{column} {raw[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{column} {raw[:40]!r} must be a finite non-negative number")
    if value > MAX_NUMBER:
        raise ValueError(f"{column} {raw[:40]!r} is over {MAX_NUMBER:g}")
    return value


def position_from_flags(flags: tuple[str, ...]) -> str:
    """guard+exit, guard, exit or middle, as the consensus flags say (the position names
    of the population model); a BadExit is no exit."""
    exit_ = "Exit" in flags and "BadExit" not in flags
    guard = "Guard" in flags
    return "guard+exit" if exit_ and guard else "exit" if exit_ else "guard" if guard else "middle"


def parse(data: bytes, location: str, *, known: Mapping[str, str] | None = None, limits: Limits = Limits(),
          now: dt.datetime | None = None, sha256: str | None = None) -> Collected:
    """Parse a report. ``known`` maps the fingerprints of a consensus to their position:
    rows naming another relay are refused (and the position becomes a label)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if len(data) > limits.max_bytes:
        raise CorruptSource(f"{location}: {len(data)} bytes is over the {limits.max_bytes}-byte limit")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CorruptSource(f"{location}: not UTF-8 (byte {exc.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise CorruptSource(f"{location}:1: malformed CSV header: {exc}") from None
    if not header:
        raise CorruptSource(f"{location}: empty file (expected a {FORMAT} header row)")
    header = [h.strip() for h in header]
    if len(header) > limits.max_columns:
        raise CorruptSource(f"{location}:1: {len(header)} columns is over the limit of {limits.max_columns}")
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise CorruptSource(f"{location}:1: unknown column {unknown[0]!r} (not in {FORMAT}; units belong in the "
                            "column name, e.g. rss_mib_mean)")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise CorruptSource(f"{location}:1: missing column {missing[0]!r}")
    if len(set(header)) != len(header):
        raise CorruptSource(f"{location}:1: a column appears twice")
    pairs: list[tuple[str, Sample]] = []
    problems: list[str] = []
    seen: set[tuple[str, dt.datetime]] = set()
    rows = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            problems.append(f"{location}:{reader.line_num}: malformed CSV ({exc}); rest of file not read")
            break
        line = reader.line_num
        if not any(c.strip() for c in row):
            continue
        rows += 1
        if rows > limits.max_rows:
            raise CorruptSource(f"{location}:{line}: over {limits.max_rows} rows")
        try:
            pairs.extend(_row(row, header, location, line, known, limits, now, seen))
        except ValueError as exc:
            problems.append(f"{location}:{line}: {exc}; row not imported")
    return Collected(KIND, location, group_samples(pairs), tuple(problems), sha256)


def _row(row: list[str], header: list[str], location: str, line: int, known: Mapping[str, str] | None,
         limits: Limits, now: dt.datetime, seen: set) -> list[tuple[str, Sample]]:
    if len(row) != len(header):
        raise ValueError(f"{len(row)} cells, the header has {len(header)}")
    cells = dict(zip(header, row, strict=True))
    for col, cell in cells.items():
        if len(cell) > limits.max_cell:
            raise ValueError(f"cell {col} is over {limits.max_cell} characters")
    fpr = cells["relay_fingerprint"].strip().lstrip("$").upper()
    if not _FPR.match(fpr):
        raise ValueError(f"relay_fingerprint {cells['relay_fingerprint']!r} is not 40 hex digits")
    if known is not None and fpr not in known:
        raise ValueError(f"relay {fpr} is not in the consensus")
    start = _time(cells["window_start_utc"], "window_start_utc")
    end = _time(cells["window_end_utc"], "window_end_utc")
    if end <= start:
        raise ValueError("window_end_utc is not after window_start_utc")
    check_time(start, "window_start_utc", now)
    check_time(end, "window_end_utc", now)
    if (fpr, start) in seen:
        raise ValueError(f"a second row for relay {fpr} and window {start.isoformat()}")
    phase = cells.get("phase", "").strip()
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not baseline, treatment or rollback")
    for col in ("cpu_source", "bw_source"):
        if cells.get(col, "").strip() not in SOURCES:
            raise ValueError(f"{col} {cells[col].strip()!r} is not one of {', '.join(sorted(SOURCES - {''}))}")
    values = {col: _number(cells[col], col) for col in NUMERIC if col in cells}
    raw_pv = cells.get("param_value", "").strip()
    if raw_pv and not (_INTEGER.fullmatch(raw_pv) and PARAM_MIN <= int(raw_pv) <= PARAM_MAX):
        raise ValueError(f"param_value {raw_pv[:40]!r} is not a 32-bit integer ({PARAM_MIN} to {PARAM_MAX}), as "
                         "consensus parameters are")
    pv = int(raw_pv) if raw_pv else None
    seen.add((fpr, start))
    labels = {"relay": fpr, "source": Path(location).name}
    if phase:
        labels["phase"] = phase
    if known is not None and known[fpr]:
        labels["position"] = known[fpr]
    out = []
    if values.get("cpu_pct_core_mean") is not None:
        out.append(("relay_cpu_utilization", Sample(start, values["cpu_pct_core_mean"] / 100.0, labels, pv)))
    if values.get("rss_mib_mean") is not None:
        out.append(("relay_rss_bytes", Sample(start, values["rss_mib_mean"] * MiB, labels, pv)))
    read, write = values.get("read_mbit_s_mean"), values.get("write_mbit_s_mean")
    if read is not None or write is not None:
        out.append(("relay_bandwidth_bytes_per_s", Sample(start, ((read or 0.0) + (write or 0.0)) * 1e6 / 8, labels,
                                                          pv)))
    return out


def known_relays(consensus_path: str | Path) -> dict[str, str]:
    """Fingerprint -> position (guard+exit, guard, exit, middle) of every relay in a
    consensus (ns or microdesc)."""
    from kistexp.dirauth.netstatus import parse_network_status

    path = Path(consensus_path)
    data, _ = read_bounded(path, max_compressed=64 * MiB, max_raw=64 * MiB, what="consensus")
    doc = parse_network_status(data, str(path))
    return {r.identity: position_from_flags(r.flags) for r in doc.routers}


def collect(path: str | Path, *, known: Mapping[str, str] | None = None, limits: Limits = Limits(),
            now: dt.datetime | None = None) -> Collected:
    """Read a report file; ``known`` as in ``parse`` (see ``known_relays``)."""
    path = Path(path)
    data, digest = read_bounded(path, max_compressed=limits.max_bytes, max_raw=limits.max_bytes,
                                what="operator report")
    return parse(data, str(path), known=known, limits=limits, now=now, sha256=digest)
