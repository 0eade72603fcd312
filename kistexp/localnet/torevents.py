"""The ``tor`` section of an OnionPerf analysis file, from the client tor's control-port events:
stem listeners for CIRC, CIRC_MINOR, STREAM, BUILDTIMEOUT_SET and GUARD events keep each
circuit, stream and entry guard as OnionPerf's analysis does (format 3.1: ``cbt_set``,
``filtered_out``, ``current_guards``, ``tor.guards``), and hand a circuit's or stream's record
over once it is closed (``TorEvents``). They also tell which circuit carried a transfer, by the
SOCKS connection's local port, so that the measurement can close it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kistexp import jsonout

_GUARD_TIMES = ("new_ts", "up_ts", "down_ts", "dropped_ts")


def _guard_time(key: str) -> Callable[[_Guard], Any]:
    """A guard's time to the microsecond, as OnionPerf writes it; no key while it has none."""
    def value(g: _Guard) -> Any:
        t = getattr(g, key)
        return jsonout.OMIT if t is None else round(t, 6)
    return value


# OnionPerf's guard record (``tor.guards``, ``current_guards``): the times it has, each rounded
@jsonout.shape(omit=_GUARD_TIMES, derived={key: _guard_time(key) for key in _GUARD_TIMES})
@attrs.define(eq=False)  # mutable as GUARD events arrive; a guard is itself, not its fields
class _Guard:
    """One entry guard as OnionPerf tracks it from GUARD events."""

    fingerprint: str
    nickname: str
    new_ts: float | None = None
    up_ts: float | None = None
    down_ts: float | None = None
    dropped_ts: float | None = None

    def current_at(self, t: float) -> bool:
        # OnionPerf: up before the circuit launched, and neither dropped nor down since
        return bool(self.up_ts and t >= self.up_ts and (not self.dropped_ts or t < self.dropped_ts)
                    and (not self.down_ts or t < self.down_ts))


class _Circuit:
    """One circuit of the client tor, from its LAUNCHED event to its CLOSED or FAILED one."""

    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.start: float | None = None
        self.built: float | None = None
        self.events: list[tuple[str, float]] = []
        self.path: list[tuple[str, float]] = []
        self.build_timeout: int | None = None
        self.build_quantile: float | None = None
        self.cbt_set = False
        self.failure_local: str | None = None
        self.failure_remote: str | None = None

    def record(self, end: float, guards: Iterable[_Guard]) -> dict | None:
        """OnionPerf's circuit record (schema 3.1, additionalProperties false); None when the
        LAUNCHED event came before the listener (OnionPerf drops those too)."""
        if self.start is None:
            return None
        s = self.start
        out: dict = {
            "circuit_id": self.cid,
            "unix_ts_start": round(s, 6),
            "unix_ts_end": round(end, 6),
            "elapsed_seconds": [[k, round(t - s, 6)] for k, t in self.events],
            "cbt_set": self.cbt_set,
            # written on every circuit by 3.1's analyze: true only under the exclude_cbt filter,
            # which this client does not apply (it writes no ``filters``)
            "filtered_out": False,
        }
        if self.path:
            out["path"] = [[hop, round(t - s, 6)] for hop, t in self.path]
        if self.built is not None:
            out["buildtime_seconds"] = round(self.built - s, 6)
        if self.build_timeout is not None:
            out["build_timeout"] = self.build_timeout
        if self.build_quantile is not None:
            out["build_quantile"] = self.build_quantile
        current = [jsonout.to_json(g) for g in guards if g.current_at(s)]
        if current:
            out["current_guards"] = current
        if self.failure_local:
            out["failure_reason_local"] = self.failure_local
        if self.failure_remote:
            out["failure_reason_remote"] = self.failure_remote
        return out


class _Stream:
    """One stream of the client tor, from its NEW (or NEWRESOLVE) event to its CLOSED or FAILED one."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.circuit_id: str | None = None
        self.start: float | None = None
        self.events: list[tuple[str, float]] = []
        self.purpose: str | None = None
        self.source: str | None = None
        self.target: str | None = None
        self.failure_local: str | None = None
        self.failure_remote: str | None = None

    def record(self, end: float) -> dict | None:
        if self.start is None:
            return None
        s = self.start
        out: dict = {
            "stream_id": self.sid,
            "circuit_id": self.circuit_id,  # a string, or null for a stream never attached (§1.4)
            "unix_ts_start": round(s, 6),
            "unix_ts_end": round(end, 6),
            "elapsed_seconds": [[k, round(t - s, 6)] for k, t in self.events],
        }
        if self.source:
            out["source"] = self.source
        if self.target:
            out["target"] = self.target
        if self.failure_local:
            out["failure_reason_local"] = self.failure_local
        if self.failure_remote:
            out["failure_reason_remote"] = self.failure_remote
        return out


_HS_PURPOSES = frozenset({"HS_CLIENT_INTRO", "HS_CLIENT_REND", "HS_SERVICE_INTRO", "HS_SERVICE_REND"})
_STREAM_START = frozenset({"NEW", "NEWRESOLVE"})
_ENDED = frozenset({"CLOSED", "FAILED"})


def _text(value: object) -> str | None:
    """stem's enum members are strings; None stays None."""
    return None if value is None else str(value)


class TorEvents:
    """The client tor's circuits, streams and guards from its control-port events, turned into
    OnionPerf's ``tor`` records as they end (OnionPerf's TorCtlParser semantics, analysis.py).
    Every method is called from stem's event thread or under ``lock``; finished records go to
    ``sink(kind, id, record, end_unix)`` with kind "circuit" or "stream"."""

    def __init__(self, sink: Callable[[str, str, dict, float], None], clock: Callable[[], float] = time.time) -> None:
        self.sink = sink
        self.clock = clock
        self.lock = threading.Lock()
        self._circuits: dict[int, _Circuit] = {}
        self._streams: dict[int, _Stream] = {}
        self.guards: list[_Guard] = []
        self._build_timeout: int | None = None
        self._build_quantile: float | None = None
        self._cbt_set = False
        # source port -> (circuit id, when tor saw the stream): ports are reused, so a lookup
        # names the earliest time its stream may have started
        self._port_circuit: dict[int, tuple[str, float]] = {}
        self._done: list[tuple[str, str, dict, float]] = []

    def reset(self, build_timeout_ms: int | None = None) -> None:
        """A new connection (possibly to a restarted tor, which numbers circuits anew): open state
        is dropped; guards stay (their times are history)."""
        with self.lock:
            self._circuits.clear()
            self._streams.clear()
            self._port_circuit.clear()
            self._build_timeout, self._build_quantile, self._cbt_set = build_timeout_ms, None, False

    def seed_guards(self, entry_guards: str, at: float) -> None:
        """Guards tor already had when the listener attached (``GETINFO entry-guards``: ``$FP~nick
        status`` lines). Their GUARD UP came before us, so a guard that is up counts as up from now."""
        with self.lock:
            for line in entry_guards.splitlines():
                parts = line.split()
                if not parts or not parts[0].startswith("$"):
                    continue
                fp, _, nick = parts[0][1:].partition("~")
                guard = self._guard(fp, nick or fp)
                if len(parts) > 1 and parts[1] == "up" and guard.up_ts is None:
                    guard.up_ts = at

    def circuit_of(self, local_port: int, since_unix: float) -> str | None:
        """The circuit tor attached the stream from ``127.0.0.1:local_port`` to, if that stream
        started at ``since_unix`` or later (an earlier one had the port before)."""
        with self.lock:
            found = self._port_circuit.get(local_port)
        return found[0] if found is not None and found[1] >= since_unix else None

    def guards_json(self) -> list[dict]:
        with self.lock:
            return [jsonout.to_json(g) for g in self.guards]

    def _guard(self, fingerprint: str, nickname: str) -> _Guard:
        for g in reversed(self.guards):
            if g.fingerprint == fingerprint and g.dropped_ts is None:
                return g
        g = _Guard(fingerprint, nickname)
        self.guards.append(g)
        return g

    def handle(self, event: object) -> None:
        """stem's listener: never raises (a malformed event is skipped)."""
        at = self.clock()  # stem's own arrived_at has whole seconds only
        name = type(event).__name__
        with self.lock:
            try:
                if name == "CircuitEvent":
                    self._on_circuit(event, at)
                elif name == "CircMinorEvent":
                    self._on_circuit_minor(event, at)
                elif name == "StreamEvent":
                    self._on_stream(event, at)
                elif name == "BuildTimeoutSetEvent":
                    self._on_build_timeout(event)
                elif name == "GuardEvent":
                    self._on_guard(event, at)
            except (AttributeError, TypeError, ValueError):
                pass
            done, self._done = self._done, []
        # handed over outside the lock: the sink takes the day files' lock, whose rendering
        # takes this one for the guards
        for record in done:
            self.sink(*record)

    def _on_circuit(self, ev, at: float) -> None:
        cid = int(ev.id)
        circ = self._circuits.setdefault(cid, _Circuit(cid))
        status, purpose = _text(ev.status), _text(ev.purpose)
        if status == "LAUNCHED" and circ.start is None:
            circ.start = at
            circ.build_timeout, circ.build_quantile, circ.cbt_set = (self._build_timeout, self._build_quantile,
                                                                     self._cbt_set)
        circ.events.append((f"{purpose}:{status}", at))
        if status == "EXTENDED" and ev.path:
            fp, nick = ev.path[-1]
            circ.path.append((f"${fp}~{nick or 'Unnamed'}", at))
        elif status == "FAILED":
            circ.failure_local = _text(ev.reason)
            if ev.remote_reason:
                circ.failure_remote = _text(ev.remote_reason)
        elif status == "BUILT":
            if circ.built is None:
                circ.built = at
            if purpose in _HS_PURPOSES and ev.hs_state:
                key = _text(ev.hs_state)
                circ.events.append((f"{key}:{ev.rend_query}" if ev.rend_query else str(key), at))
        if status in _ENDED:
            del self._circuits[cid]
            record = circ.record(at, self.guards)
            if record is not None:
                self._done.append(("circuit", str(cid), record, at))

    def _on_circuit_minor(self, ev, at: float) -> None:
        cid = int(ev.id)
        circ = self._circuits.setdefault(cid, _Circuit(cid))
        event, purpose = _text(ev.event), _text(ev.purpose)
        if purpose != _text(ev.old_purpose) or event != "PURPOSE_CHANGED":
            circ.events.append((f"{event}:{purpose}", at))
        if purpose in _HS_PURPOSES and ev.hs_state:
            key = _text(ev.hs_state)
            circ.events.append((f"{key}:{ev.rend_query}" if ev.rend_query else str(key), at))

    def _on_stream(self, ev, at: float) -> None:
        sid = int(ev.id)
        strm = self._streams.setdefault(sid, _Stream(sid))
        if ev.circ_id is not None:
            strm.circuit_id = str(ev.circ_id)
        if ev.purpose is not None:
            strm.purpose = _text(ev.purpose)
        status = _text(ev.status)
        strm.events.append((f"{strm.purpose}:{status}", at))
        strm.target = _text(ev.target)
        if status in _STREAM_START:
            if strm.start is None:
                strm.start = at
            strm.source = _text(ev.source_addr)
        elif status == "FAILED":
            strm.failure_local = _text(ev.reason)
            if ev.remote_reason:
                strm.failure_remote = _text(ev.remote_reason)
        port = _source_port(strm.source)
        if port is not None and strm.circuit_id is not None and strm.start is not None:
            self._port_circuit[port] = (strm.circuit_id, strm.start)
        if status in _ENDED:
            del self._streams[sid]
            record = strm.record(at)
            if record is not None:
                self._done.append(("stream", str(sid), record, at))

    def _on_build_timeout(self, ev) -> None:
        # 3.1's cbt_set: a computed timeout sets it, RESET clears it (metrics-sources.md §1.4)
        set_type = _text(ev.set_type)
        if set_type == "RESET":
            self._cbt_set = False
        elif set_type == "COMPUTED":
            self._cbt_set = True
        if ev.timeout is not None:
            self._build_timeout = int(ev.timeout)
        if ev.quantile is not None:
            self._build_quantile = float(ev.quantile)

    def _on_guard(self, ev, at: float) -> None:
        if _text(ev.guard_type) != "ENTRY" or not ev.endpoint_fingerprint:
            return
        fp, nick = str(ev.endpoint_fingerprint), _text(ev.endpoint_nickname) or str(ev.endpoint_fingerprint)
        guard = None
        for g in reversed(self.guards):
            if g.fingerprint == fp:
                guard = g
                break
        if guard is None or guard.dropped_ts is not None:
            guard = _Guard(fp, nick)
            self.guards.append(guard)
        status = _text(ev.status)
        field = {"NEW": "new_ts", "UP": "up_ts", "DOWN": "down_ts", "DROPPED": "dropped_ts"}.get(status or "")
        if field and getattr(guard, field) is None:
            setattr(guard, field, at)


def _source_port(source: str | None) -> int | None:
    if not source or ":" not in source:
        return None
    port = source.rsplit(":", 1)[1]
    return int(port) if port.isascii() and port.isdecimal() else None
