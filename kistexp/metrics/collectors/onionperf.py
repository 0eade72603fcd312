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
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp.metrics.collectors import Collected, CorruptSource, MiB, check_time, group_samples, read_bounded
from kistexp.metrics.series import Sample, from_unix

KIND = "onionperf"

# Transfer sizes and the catalogue metric of the time their last byte arrived.
TTLB_METRICS = {51200: "client_ttlb_50kib_s", 1048576: "client_ttlb_1mib_s", 5242880: "client_ttlb_5mib_s"}
# metrics-sources.md §1.6: a tgen stream and a tor stream are the same if their end times
# are within this many seconds (and the tgen local port is the tor stream's source port).
JOIN_WINDOW_S = 150.0
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?$")


@attrs.frozen
class Limits:
    """metrics-sources.md §5.3 defaults."""

    max_compressed: int = 64 * MiB
    max_raw: int = 1024 * MiB
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
    raw, digest = read_bounded(path, max_compressed=limits.max_compressed, max_raw=limits.max_raw)
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise CorruptSource(f"{path}: not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise CorruptSource(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    del raw
    return parse(doc, str(path), limits=limits, now=now, sha256=digest)


def parse(doc: object, location: str, *, limits: Limits = Limits(), now: dt.datetime | None = None,
          sha256: str | None = None) -> Analysis:
    now = now or dt.datetime.now(dt.timezone.utc)
    if not isinstance(doc, dict):
        raise CorruptSource(f"{location}: top level is not a JSON object")
    kind = doc.get("type")
    version = parse_version(doc.get("version"), f"{location}: key 'version'")
    if kind == "onionperf":
        # 3.0/3.1/4.0 and develop's short-lived 5.0 (= 3.1, §1.1); 1.0/2.0 use tgen.transfers
        if version[0] not in (3, 4, 5):
            raise CorruptSource(f"{location}: OnionPerf analysis version {version[0]}.{version[1]} is not supported "
                                "(kistexp reads 3.x, 4.x and 5.0)")
    elif kind == "tgen":
        if version[0] != 1:
            raise CorruptSource(f"{location}: tgen analysis version {version[0]}.{version[1]} is not supported "
                                "(kistexp reads 1.x)")
    else:
        raise CorruptSource(f"{location}: key 'type' is {kind!r}, expected 'onionperf' or 'tgen'")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise CorruptSource(f"{location}: key 'data' is missing or not an object")
    has_filters = kind == "onionperf" and isinstance(doc.get("filters"), dict)
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
        streams = tgen.get("streams") if isinstance(tgen, dict) else None
        if not isinstance(streams, dict):
            # metrics-lib skips a source without tgen data (§5.1)
            problems.append(f"{where}: no tgen.streams; source skipped")
            continue
        if len(streams) > limits.max_streams:
            raise CorruptSource(f"{where}.tgen.streams: {len(streams)} streams is over the limit of "
                                f"{limits.max_streams}")
        src_transfers = []
        for key, stream in streams.items():
            try:
                src_transfers.append(_transfer(source, key, stream, now))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                problems.append(f"{where}.tgen.streams[{key!r}]: {_why(exc)}; stream skipped")
        transfers.extend(src_transfers)
        tor = body.get("tor")
        if kind == "onionperf" and isinstance(tor, dict):
            circ_raw = tor.get("circuits") or {}
            if len(circ_raw) > limits.max_circuits:
                raise CorruptSource(f"{where}.tor.circuits: {len(circ_raw)} circuits is over the limit of "
                                    f"{limits.max_circuits}")
            for key, circ in circ_raw.items():
                try:
                    circuits.append(_circuit(source, circ, now))
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    problems.append(f"{where}.tor.circuits[{key!r}]: {_why(exc)}; circuit skipped")
            joined.update(_join(source, src_transfers, tor.get("streams") or {}))
    transfers.sort(key=lambda t: (t.start, t.source, t.stream_id))
    circuits.sort(key=lambda c: (c.launched, c.source, c.circuit_id))
    return Analysis(location, kind, version, has_filters, ips, tuple(transfers), tuple(circuits), tuple(problems),
                    sha256, joined)


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing key {exc.args[0]!r}"
    return str(exc) or type(exc).__name__


def _usecs(info: Mapping, key: str) -> float | None:
    value = int(info[key])
    return None if value < 0 else value / 1e6


def _transfer(source: str, key: str, s: Mapping, now: dt.datetime) -> Transfer:
    info, times, trans = s["stream_info"], s["time_info"], s["transport_info"]
    start = from_unix(float(s["unix_ts_start"]))
    check_time(start, "unix_ts_start", now)
    success = bool(s["is_success"]) and not bool(s.get("is_error", False))
    ttfb = _usecs(times, "usecs-to-first-byte-recv")
    last = _usecs(times, "usecs-to-last-byte-recv")
    elapsed = s.get("elapsed_seconds") or {}
    partial = {int(k): float(v) for k, v in (elapsed.get("payload_bytes_recv") or {}).items()}
    remote = str(trans.get("remote", ""))
    local = str(trans.get("local", "")).split(":")
    port = int(local[2]) if len(local) >= 3 and local[2].isdigit() else None
    return Transfer(
        source=source, stream_id=str(key), start=start, size=int(info["recvsize"]),
        server="onion" if ".onion:" in remote else "public", success=success, error=str(info.get("error", "")),
        ttfb_s=ttfb if success else None, ttlb_s=last if success else None, last_byte_s=last,
        command_s=_usecs(times, "usecs-to-command"),
        partial_s=partial, read_bytes=int(s["byte_info"]["total-bytes-recv"]), local_port=port,
        end_unix=float(s["unix_ts_end"]))


def _circuit(source: str, c: Mapping, now: dt.datetime) -> Circuit:
    launched = from_unix(float(c["unix_ts_start"]))
    check_time(launched, "unix_ts_start", now)
    bt = c.get("buildtime_seconds")
    timeout = c.get("build_timeout")
    return Circuit(source, int(c["circuit_id"]), launched, None if bt is None else float(bt),
                   None if timeout is None else int(timeout), c.get("failure_reason_local"),
                   c.get("failure_reason_remote"), bool(c.get("filtered_out", False)))


def _join(source: str, transfers: Sequence[Transfer], tor_streams: Mapping) -> dict[tuple[str, int], int | None]:
    """tgen local port -> tor stream's circuit (metrics-sources.md §1.6)."""
    by_port: dict[int, list[tuple[float, object]]] = {}
    for ts in tor_streams.values():
        src = ts.get("source") if isinstance(ts, dict) else None
        if not isinstance(src, str) or ":" not in src:
            continue  # DIR_FETCH streams have no source
        port = src.rsplit(":", 1)[1]
        if port.isdigit():
            by_port.setdefault(int(port), []).append((float(ts.get("unix_ts_end", 0.0)), ts.get("circuit_id")))
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
            out[(source, t.local_port)] = None if best[1] is None else int(best[1])
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
    pairs: list[tuple[str, Sample]] = []
    for t in kept_transfers(a, honour_filters=honour_filters):
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
        if lo is not None and hi is not None and hi > lo:
            pairs.append(("client_throughput_mbytes_per_s",
                          Sample(t.start, (5242880 - 1048576) / (hi - lo) / 1e6, labels, param_value)))
    for c in a.circuits:
        if c.build_time_s is None or (honour_filters and a.has_filters and c.filtered_out):
            continue
        pairs.append(("circuit_build_time_s", Sample(c.launched, c.build_time_s, {"source": c.source}, param_value)))
    return Collected(KIND, a.location, group_samples(pairs), a.problems, a.sha256)


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
