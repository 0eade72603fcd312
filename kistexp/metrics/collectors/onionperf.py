"""OnionPerf analysis JSON (3.0, 3.1, 4.0) and tgen-only analysis files -> transfers,
circuits and client samples.

Formats: metrics-sources.md §1 (OnionPerf's schema/onionperf-{3.0,3.1,4.0}.json). All
three share the tgen stream fields; 4.0 adds ``filters`` and ``filtered_out``, 3.1 adds
``cbt_set``/``current_guards`` too (§1.5). tgen-only files (``"type": "tgen"``, version
1.x, tgentools) have the same streams without a ``tor`` section (§1.9).

Meaning of the samples (§1.7): time to first/last byte only of successful streams, in
seconds since the stream started (tgen's ``usecs-to-*-byte-recv``); the time a smaller
size had arrived within a larger transfer (Tor Metrics' PARTIAL rows) from
``elapsed_seconds.payload_bytes_recv``; one failure sample per transfer (1 = failed or
timed out, so the mean is the failure ratio); circuit build time LAUNCHED -> BUILT.
A timed-out stream carries the time of its last received byte (§1.3 trap): it is a
failure, never a download time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp.metrics.collectors import (
    XZ_MAGIC,
    Collected,
    CorruptSource,
    MiB,
    SourceTooLarge,
    check_time,
    decompress_bounded,
    group_samples,
    read_bounded,
)
from kistexp.metrics.series import Sample, from_unix

KIND = "onionperf"

# Transfer sizes and the catalogue metric of the time their last byte arrived.
TTLB_METRICS = {51200: "client_ttlb_50kib_s", 1048576: "client_ttlb_1mib_s", 5242880: "client_ttlb_5mib_s"}
# metrics-sources.md §1.6: a tgen stream and a tor stream are the same if their end times
# are within this many seconds (and the tgen local port is the tor stream's source port).
JOIN_WINDOW_S = 150.0
# What a damaged record raises while being read (int(inf) is an OverflowError).
_BAD_RECORD = (KeyError, TypeError, ValueError, AttributeError, OverflowError)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")


@attrs.frozen
class Limits:
    """metrics-sources.md §5.3 defaults, and what bounds the memory of parsing: a full day of the
    busiest vantage is about 31 MB of JSON holding about 1.2 million JSON values (numbers, strings,
    objects, arrays), parsed into about 80 MB of Python objects. ``max_values`` is counted on the
    raw text before it is parsed, so a file of 200,000 streams (430 MB of JSON, 2.3 GB once parsed)
    is refused in a second instead of after the memory is spent; ``max_int_digits`` keeps Python
    from converting integers of thousands of digits (a 5,000-digit one ended in a traceback)."""

    max_compressed: int = 64 * MiB
    max_raw: int = 256 * MiB
    max_values: int = 4_000_000
    max_int_digits: int = 20  # an unsigned 64-bit integer has 20
    max_streams: int = 50_000
    max_circuits: int = 500_000


@attrs.frozen
class Transfer:
    """One tgen stream (a client download)."""

    source: str
    stream_id: str
    start: dt.datetime
    size: int  # requested payload bytes (recvsize)
    server: str  # "onion" or "public" (exit)
    success: bool
    error: str  # tgen error code, "NONE" on success
    ttfb_s: float | None
    ttlb_s: float | None
    last_byte_s: float | None  # tgen's last-byte time, also on errors (§1.3)
    command_s: float | None  # when the request was sent (tgentools' summaries count from it, §1.9)
    partial_s: Mapping[int, float] = attrs.field(hash=False)  # payload bytes -> s since start
    read_bytes: int
    local_port: int | None
    end_unix: float


@attrs.frozen
class Circuit:
    source: str
    circuit_id: int
    launched: dt.datetime
    build_time_s: float | None
    build_timeout_ms: int | None
    failure_local: str | None
    failure_remote: str | None
    filtered_out: bool


@attrs.frozen
class Analysis:
    """A parsed analysis file."""

    location: str
    type: str  # "onionperf" or "tgen"
    version: tuple[int, int]
    has_filters: bool
    measurement_ip: Mapping[str, str] = attrs.field(hash=False)
    transfers: tuple[Transfer, ...] = ()
    circuits: tuple[Circuit, ...] = ()
    problems: tuple[str, ...] = ()
    sha256: str | None = None
    # (source, tgen local port) -> circuit id of the tor stream it used, where the join works
    stream_circuit: Mapping[tuple[str, int], int | None] = attrs.field(factory=dict, hash=False)


def parse_version(raw: object, where: str) -> tuple[int, int]:
    """``major.minor`` as integers (OnionPerf compares version strings, §1.1)."""
    text = str(raw) if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else ""
    m = _VERSION.match(text)
    if not m:
        raise CorruptSource(f"{where}: version {raw!r} is not of the form MAJOR.MINOR")
    return int(m.group(1)), int(m.group(2))


def load(path: str | Path, *, limits: Limits = Limits(), now: dt.datetime | None = None) -> Analysis:
    """Read an OnionPerf or tgen analysis file (plain or .xz). Raises CorruptSource for a
    file that cannot be used at all; bad streams/circuits become problems."""
    path = Path(path)
    raw, digest = read_bounded(path, max_compressed=limits.max_compressed, max_raw=limits.max_raw,
                               what="OnionPerf analysis")
    return _decode(raw, str(path), limits, now, digest)


def load_bytes(stored: bytes, location: str, *, limits: Limits = Limits(),
               now: dt.datetime | None = None) -> Analysis:
    """``load`` for a file's bytes got some other way (an HTTP body): the same limits, xz
    recognised by ``location``'s suffix or the xz magic bytes."""
    if len(stored) > limits.max_compressed:
        raise SourceTooLarge(f"{location}: {len(stored)} bytes is over the {limits.max_compressed}-byte limit "
                             "for this source")
    digest = hashlib.sha256(stored).hexdigest()
    xz = location.endswith(".xz") or stored[:6] == XZ_MAGIC
    return _decode(decompress_bounded(stored, location, xz=xz, max_raw=limits.max_raw), location, limits, now, digest)


class _LongInteger(ValueError):
    """An integer literal longer than the limit (raised from inside the JSON parser)."""


def json_values(raw: bytes) -> int:
    """An upper bound on the number of values (and keys) ``json.loads(raw)`` makes: every one but
    the first follows a ',' or ':' or opens with '{' or '['; those characters inside strings only
    raise the count. One pass of ``bytes.count`` per character (0.3 s for 256 MB)."""
    return 1 + sum(raw.count(c) for c in (b",", b":", b"{", b"["))


def _decode(raw: bytes, location: str, limits: Limits, now: dt.datetime | None, digest: str) -> Analysis:
    values = json_values(raw)
    if values > limits.max_values:
        raise SourceTooLarge(f"{location}: about {values} JSON values is over the limit of {limits.max_values} "
                             "(counted before parsing: a day of OnionPerf holds about 1.2 million)")

    def integer(text: str) -> int:
        if len(text.lstrip("-")) > limits.max_int_digits:
            raise _LongInteger(f"{location}: an integer of {len(text.lstrip('-'))} digits is longer than the "
                               f"{limits.max_int_digits} digits any field of an analysis file needs")
        return int(text)

    try:
        doc = json.loads(raw, parse_int=integer)
    except _LongInteger as exc:
        raise CorruptSource(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise CorruptSource(f"{location}: not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise CorruptSource(f"{location}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    except RecursionError:
        raise CorruptSource(f"{location}: JSON nested too deeply to be an analysis file") from None
    except ValueError as exc:  # whatever else the parser refuses, in one line
        raise CorruptSource(f"{location}: not valid JSON ({' '.join(str(exc).split())[:200]})") from None
    del raw
    return parse(doc, location, limits=limits, now=now, sha256=digest)


def parse(doc: object, location: str, *, limits: Limits = Limits(), now: dt.datetime | None = None,
          sha256: str | None = None) -> Analysis:
    now = now or dt.datetime.now(dt.timezone.utc)
    if not isinstance(doc, dict):
        raise CorruptSource(f"{location}: top level is not a JSON object")
    kind = doc.get("type")
    version = parse_version(doc.get("version"), f"{location}: key 'version'")
    if kind == "onionperf":
        # 3.0/3.1/4.0 and develop's short-lived 5.0 (= 3.1, §1.1); 1.0/2.0 use tgen.transfers
        if version[0] not in (1, 2, 3, 4, 5):
            raise CorruptSource(f"{location}: OnionPerf analysis version {version[0]}.{version[1]} is not supported "
                                "(kistexp reads 1.x to 5.x)")
    elif kind == "tgen":
        if version[0] != 1:
            raise CorruptSource(f"{location}: tgen analysis version {version[0]}.{version[1]} is not supported "
                                "(kistexp reads 1.x)")
    else:
        raise CorruptSource(f"{location}: key 'type' is {kind!r}, expected 'onionperf' or 'tgen'")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise CorruptSource(f"{location}: key 'data' is missing or not an object")
    has_filters = kind == "onionperf" and isinstance(doc.get("filters"), dict) and bool(doc["filters"])
    problems: list[str] = []
    transfers: list[Transfer] = []
    circuits: list[Circuit] = []
    ips: dict[str, str] = {}
    joined: dict[tuple[str, int], int | None] = {}
    for source, body in data.items():
        where = f"{location}: data.{source}"
        if not isinstance(body, dict):
            problems.append(f"{where}: not an object; source skipped")
            continue
        ips[source] = str(body.get("measurement_ip", "unknown"))
        tgen = body.get("tgen")
        legacy = kind == "onionperf" and version[0] <= 2
        section = "transfers" if legacy else "streams"
        streams = tgen.get(section) if isinstance(tgen, dict) else None
        if not isinstance(streams, dict):
            # metrics-lib skips a source without tgen data (§5.1)
            problems.append(f"{where}: no tgen.{section}; source skipped")
            continue
        if len(streams) > limits.max_streams:
            raise CorruptSource(f"{where}.tgen.streams: {len(streams)} streams is over the limit of "
                                f"{limits.max_streams}")
        src_transfers = []
        read = _legacy_transfer if legacy else _transfer
        for key, stream in streams.items():
            try:
                src_transfers.append(read(source, key, stream, now))
            except _BAD_RECORD as exc:
                problems.append(f"{where}.tgen.{section}[{key!r}]: {_why(exc)}; record skipped")
        transfers.extend(src_transfers)
        tor = body.get("tor")
        if kind == "onionperf" and isinstance(tor, dict):
            circ_raw = tor.get("circuits") or {}
            if not isinstance(circ_raw, dict):
                problems.append(f"{where}.tor.circuits: not an object; circuits skipped")
                circ_raw = {}
            if len(circ_raw) > limits.max_circuits:
                raise CorruptSource(f"{where}.tor.circuits: {len(circ_raw)} circuits is over the limit of "
                                    f"{limits.max_circuits}")
            for key, circ in circ_raw.items():
                try:
                    circuits.append(_circuit(source, circ, now))
                except _BAD_RECORD as exc:
                    problems.append(f"{where}.tor.circuits[{key!r}]: {_why(exc)}; circuit skipped")
            tor_streams = tor.get("streams") or {}
            joined.update(_join(source, src_transfers, tor_streams if isinstance(tor_streams, dict) else {}))
    transfers.sort(key=lambda t: (t.start, t.source, t.stream_id))
    circuits.sort(key=lambda c: (c.launched, c.source, c.circuit_id))
    return Analysis(location, kind, version, has_filters, ips, tuple(transfers), tuple(circuits), tuple(problems),
                    sha256, joined)


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}"
    return str(exc) or type(exc).__name__


def _num(value: object, what: str) -> float:
    """A finite, non-negative number of the file (numbers may be JSON numbers or strings)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} is {value!r}, not a number")
    x = float(value)  # type: ignore[arg-type]
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {value!r} is not a finite non-negative number")
    return x


def _start(value: object, now: dt.datetime) -> dt.datetime:
    t = from_unix(_num(value, "unix_ts_start"))
    check_time(t, "unix_ts_start", now)
    return t


def _usecs(info: Mapping, key: str) -> float | None:
    value = int(info[key])
    return None if value < 0 else value / 1e6


def _transfer(source: str, key: str, s: Mapping, now: dt.datetime) -> Transfer:
    info, times, trans = s["stream_info"], s["time_info"], s["transport_info"]
    start = _start(s["unix_ts_start"], now)
    success = bool(s["is_success"]) and not bool(s.get("is_error", False))
    ttfb = _usecs(times, "usecs-to-first-byte-recv")
    last = _usecs(times, "usecs-to-last-byte-recv")
    elapsed = s.get("elapsed_seconds") or {}
    marks = elapsed.get("payload_bytes_recv") or {}
    partial = {int(k): _num(v, f"payload_bytes_recv[{k}]") for k, v in marks.items()}
    remote = str(trans.get("remote", ""))
    local = str(trans.get("local", "")).split(":")
    port = int(local[2]) if len(local) >= 3 and local[2].isdigit() else None
    return Transfer(
        source=source, stream_id=str(key), start=start, size=int(info["recvsize"]),
        server="onion" if ".onion:" in remote else "public", success=success, error=str(info.get("error", "")),
        ttfb_s=ttfb if success else None, ttlb_s=last if success else None, last_byte_s=last,
        command_s=_usecs(times, "usecs-to-command"),
        partial_s=partial, read_bytes=int(s["byte_info"]["total-bytes-recv"]), local_port=port,
        end_unix=_num(s["unix_ts_end"], "unix_ts_end"))


def _legacy_transfer(source: str, key: str, s: Mapping, now: dt.datetime) -> Transfer:
    """A 1.0/2.0 ``tgen.transfers`` record (README_JSON.md): times already in seconds."""
    start = _start(s["unix_ts_start"], now)
    success = bool(s["is_success"]) and not bool(s.get("is_error", False))
    el = s["elapsed_seconds"]

    def secs(name: str) -> float | None:
        v = el.get(name)
        return None if v is None or _num(v, name) == 0 else float(v)

    last = secs("last_byte")
    local = str(s.get("endpoint_local", "")).split(":")
    return Transfer(
        source=source, stream_id=str(key), start=start, size=int(s["filesize_bytes"]),
        server="onion" if ".onion:" in str(s.get("endpoint_remote", "")) else "public", success=success,
        error=str(s.get("error_code", "")), ttfb_s=secs("first_byte") if success else None,
        ttlb_s=last if success else None, last_byte_s=last, command_s=secs("command"),
        partial_s={int(k): _num(v, f"payload_bytes[{k}]") for k, v in (el.get("payload_bytes") or {}).items()},
        read_bytes=int(s.get("total_bytes_read", 0)),
        local_port=int(local[2]) if len(local) >= 3 and local[2].isdigit() else None,
        end_unix=_num(s["unix_ts_end"], "unix_ts_end"))


def _circuit(source: str, c: Mapping, now: dt.datetime) -> Circuit:
    launched = _start(c["unix_ts_start"], now)
    bt = c.get("buildtime_seconds")
    timeout = c.get("build_timeout")
    return Circuit(source, int(c["circuit_id"]), launched, None if bt is None else _num(bt, "buildtime_seconds"),
                   None if timeout is None else int(timeout), c.get("failure_reason_local"),
                   c.get("failure_reason_remote"), bool(c.get("filtered_out", False)))


def _join(source: str, transfers: Sequence[Transfer], tor_streams: Mapping) -> dict[tuple[str, int], int | None]:
    """tgen local port -> tor stream's circuit (metrics-sources.md §1.6)."""
    by_port: dict[int, list[tuple[float, int | None]]] = {}
    for ts in tor_streams.values():
        src = ts.get("source") if isinstance(ts, dict) else None
        if not isinstance(src, str) or ":" not in src:
            continue  # DIR_FETCH streams have no source
        port, circ = src.rsplit(":", 1)[1], ts.get("circuit_id")
        try:
            end = float(ts.get("unix_ts_end", 0.0))
            circ = None if circ is None else int(circ)  # a string in the file, or null (§5.1)
        except (TypeError, ValueError, OverflowError):
            continue
        if port.isdigit():
            by_port.setdefault(int(port), []).append((end, circ))
    out = {}
    for t in transfers:
        if t.local_port is None:
            continue
        best = None
        for end, circ in by_port.get(t.local_port, ()):
            gap = abs(end - t.end_unix)
            if gap <= JOIN_WINDOW_S and (best is None or gap < best[0]):
                best = (gap, circ)
        if best is not None:
            out[(source, t.local_port)] = best[1]
    return out


def kept_transfers(a: Analysis, *, honour_filters: bool = False) -> tuple[Transfer, ...]:
    """Transfers to use. With ``honour_filters`` and a file that has ``filters``, only
    those whose circuit is known and not ``filtered_out`` (what OnionPerf's own plots
    keep, §1.6); otherwise all, as Tor Metrics does (it ignores ``filtered_out``)."""
    if not (honour_filters and a.has_filters):
        return a.transfers
    circ = {(c.source, c.circuit_id): c for c in a.circuits}
    keep = []
    for t in a.transfers:
        cid = a.stream_circuit.get((t.source, t.local_port)) if t.local_port is not None else None
        c = circ.get((t.source, cid)) if cid is not None else None
        if c is not None and not c.filtered_out:
            keep.append(t)
    return tuple(keep)


def samples(a: Analysis, *, honour_filters: bool = False, param_value: int | None = None) -> Collected:
    """The catalogue samples of an analysis, each at its transfer's (circuit's) start."""
    pairs = transfer_samples(kept_transfers(a, honour_filters=honour_filters), param_value)
    pairs += circuit_samples(kept_circuits(a, honour_filters=honour_filters), param_value)
    return Collected(KIND, a.location, group_samples(pairs), a.problems, a.sha256)


def kept_circuits(a: Analysis, *, honour_filters: bool = False) -> tuple[Circuit, ...]:
    """Circuits with a build time to use (``filtered_out`` ones left out only with
    ``honour_filters`` in a file that has ``filters``)."""
    drop_filtered = honour_filters and a.has_filters
    return tuple(c for c in a.circuits if c.build_time_s is not None and not (drop_filtered and c.filtered_out))


def transfer_samples(transfers: Sequence[Transfer], param_value: int | None = None) -> list[tuple[str, Sample]]:
    """The client samples of the given transfers (labels source, server, size)."""
    pairs: list[tuple[str, Sample]] = []
    for t in transfers:
        labels = {"source": t.source, "server": t.server, "size": str(t.size)}
        pairs.append(("client_transfer_failure_ratio", Sample(t.start, 0.0 if t.success else 1.0, labels,
                                                              param_value)))
        if not t.success:
            continue
        if t.ttfb_s is not None:
            pairs.append(("client_ttfb_s", Sample(t.start, t.ttfb_s, labels, param_value)))
        for size, metric in TTLB_METRICS.items():
            if size == t.size and t.ttlb_s is not None:
                pairs.append((metric, Sample(t.start, t.ttlb_s, labels, param_value)))
            elif size < t.size and size in t.partial_s:
                pairs.append((metric, Sample(t.start, t.partial_s[size], labels, param_value)))
        lo, hi = t.partial_s.get(1048576), t.partial_s.get(5242880)
        # 4 MiB in 5e-324 s is an infinite throughput: no sample, not a ValueError
        if lo is not None and hi is not None and hi > lo and math.isfinite(rate := (5242880 - 1048576) / (hi - lo)):
            pairs.append(("client_throughput_mbytes_per_s", Sample(t.start, rate / 1e6, labels, param_value)))
    return pairs


def circuit_samples(circuits: Sequence[Circuit], param_value: int | None = None) -> list[tuple[str, Sample]]:
    """``circuit_build_time_s`` of the given circuits that were built (label source)."""
    return [("circuit_build_time_s", Sample(c.launched, c.build_time_s, {"source": c.source}, param_value))
            for c in circuits if c.build_time_s is not None]


def collect(path: str | Path, *, limits: Limits = Limits(), honour_filters: bool = False,
            now: dt.datetime | None = None) -> Collected:
    return samples(load(path, limits=limits, now=now), honour_filters=honour_filters)


# --- Tor Metrics' "Time to download files over Tor" (metrics-sources.md §1.7) ------------

def _r2(x: float) -> float:
    # metrics-lib writes every Torperf time with %.2f
    return float(f"{x:.2f}")


def tor_metrics_times_ms(a: Analysis, filesize: int, server: str) -> list[int]:
    """Download times in ms as Tor Metrics computes them: DATACOMPLETE - START (or the
    PARTIAL row of a larger file) from 10 ms-rounded times, including timed-out streams'
    last-byte time (the view has no didtimeout filter, §1.7 step 4)."""
    out = []
    for t in a.transfers:
        if t.server != server:
            continue
        start = _r2(t.start.timestamp())
        if t.size == filesize:
            if t.last_byte_s is None:
                continue
            complete = _r2(t.start.timestamp() + t.last_byte_s)
        elif t.size > filesize and filesize in t.partial_s:
            complete = _r2(t.start.timestamp() + t.partial_s[filesize])
        else:
            continue
        if complete > start:
            out.append(round((complete - start) * 1000))
    return out


def tor_metrics_quartiles(a: Analysis, filesize: int, server: str) -> tuple[int, int, int] | None:
    """(q1, median, q3) in ms, PERCENTILE_CONT (linear) truncated to ms, as Tor Metrics
    publishes per day, file size and server kind."""
    times = tor_metrics_times_ms(a, filesize, server)
    if not times:
        return None
    q = np.quantile(np.asarray(times, dtype=float), [0.25, 0.5, 0.75], method="linear")
    return tuple(int(v) for v in np.floor(q))


def tgentools_ttlb(a: Analysis) -> dict[tuple[str, int], list[float]]:
    """Successful streams' time to last byte counted from the command, as tgentools'
    ``stream_summary`` and tornettools' plots count it (§1.9), by (server, size)."""
    out: dict[tuple[str, int], list[float]] = {}
    for t in a.transfers:
        if t.success and t.ttlb_s is not None and t.command_s is not None:
            out.setdefault((t.server, t.size), []).append(round(t.ttlb_s - t.command_s, 6))
    return out
