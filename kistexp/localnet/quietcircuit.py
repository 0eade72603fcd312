"""The quiet-circuit latency probe's sidecar: what one long-lived interactive stream
(``GET /echo``) of a vantage point timed, one JSON line per probe in
``YYYY-MM-DD.<vantage>.interactive.jsonl``, and how it is read back: ``read_interactive``
turns its lines into ``quiet_circuit_latency_ms`` samples, and ``InteractiveInstrument`` is the
live-run instrument that polls them. The probe itself runs in ``kistexp.localnet.vantage``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from kistexp.metrics.collectors import check_time
from kistexp.metrics.live import Reading
from kistexp.metrics.series import Sample, from_unix

QUIET_METRIC = "quiet_circuit_latency_ms"
INTERACTIVE_KIND = "interactive"
#: A sidecar line longer than this is garbage, not a probe record.
MAX_SIDECAR_LINE = 4096


def sidecar_name(day: dt.date, vantage: str) -> str:
    """The name of a vantage point's sidecar for one UTC day."""
    return f"{day:%Y-%m-%d}.{vantage}.interactive.jsonl"


@attrs.frozen
class InteractiveLines:
    """What ``read_interactive`` got from a sidecar: latency samples of answered probes, the
    number of failed probes, problems with lines it skipped, and the bytes of whole lines read
    (the offset to continue from)."""

    samples: tuple[Sample, ...]
    failures: int
    problems: tuple[str, ...]
    consumed: int
    last_failure: str = ""


def read_interactive(path: Path | str, *, source: str, instance: str, offset: int = 0,
                     max_bytes: int = 4 * 1024 * 1024, now: dt.datetime | None = None,
                     labels: Callable[[dt.datetime], tuple[Mapping[str, str], int | None]] | None = None,
                     ) -> InteractiveLines:
    """``quiet_circuit_latency_ms`` samples (labels ``instance`` and ``source``) from the whole
    lines of a sidecar from byte ``offset`` on, at most ``max_bytes`` of them. A line that is not a
    probe record (not JSON, no finite time, an answered probe without a finite non-negative
    ``rtt_ms``) is skipped with a problem naming it; a last line without its newline is left for
    the next read. ``labels(time)`` may add labels and a ``param_value`` per sample."""
    path = Path(path)
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            raw = fh.read(max_bytes)
    except OSError as exc:
        return InteractiveLines((), 0, (f"{path}: cannot read: {exc.strerror or exc}",), 0)
    end = raw.rfind(b"\n") + 1
    if end == 0 and len(raw) >= max_bytes:
        # no newline in a whole read: one over-long line; skip it rather than stall on it for ever
        return InteractiveLines((), 0, (f"{path}: a line at byte {offset} is longer than {max_bytes} bytes; "
                                         "skipped",), len(raw))
    samples: list[Sample] = []
    problems: list[str] = []
    failures = 0
    last_failure = ""
    position = offset
    for line in raw[:end].split(b"\n")[:-1]:
        where = f"{path}@{position}"
        position += len(line) + 1
        if not line.strip():
            continue
        try:
            if len(line) > MAX_SIDECAR_LINE:
                raise ValueError(f"line of {len(line)} bytes")
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
            at = _finite(rec.get("time"), "time")
            when = from_unix(at)
            check_time(when, "time", now)
            if rec.get("ok") is not True:
                failures += 1
                last_failure = f"{rec.get('error', 'MISC')}: {str(rec.get('detail', ''))[:120]}".rstrip(": ")
                continue
            rtt = _finite(rec.get("rtt_ms"), "rtt_ms")
        except (ValueError, OverflowError, RecursionError) as exc:
            problems.append(f"{where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; line skipped")
            continue
        extra, param_value = labels(when) if labels is not None else ({}, None)
        samples.append(Sample(when, rtt, {**extra, "instance": instance, "source": source}, param_value))
    return InteractiveLines(tuple(samples), failures, tuple(problems), end, last_failure)


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} {value!r} is not a number")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {value!r} is not a finite non-negative number")
    return x


class InteractiveInstrument:
    """An ``Instrument`` (kistexp.metrics.live) over one vantage point's interactive sidecars:
    each poll returns the probes written since the previous poll as ``quiet_circuit_latency_ms``
    samples, never the same one twice.

    The poll is a problem (a gap) when no sidecar exists, when every new probe failed, or when the
    sidecar has not grown for ``stale_after_s`` (the measurement is not running). Lines it had to
    skip are kept in ``problems``. With a ``watch`` (HeldConsensusWatch) each sample gets the label
    ``valid_after`` of the consensus the vantage's tor held then, and ``param_value`` the value of
    ``param`` in it."""

    kind = INTERACTIVE_KIND
    metrics = (QUIET_METRIC,)

    def __init__(self, out_dir: Path | str, vantage: str, *, name: str | None = None, watch: object = None,
                 param: str | None = None, stale_after_s: float | None = None,
                 max_bytes_per_poll: int = 4 * 1024 * 1024) -> None:
        self.out_dir = Path(out_dir)
        self.vantage = vantage
        self.name = name or f"{INTERACTIVE_KIND}:{vantage}"
        self.watch = watch
        self.param = param
        self.stale_after_s = stale_after_s
        self.max_bytes_per_poll = max_bytes_per_poll
        self.problems: list[str] = []
        self._offsets: dict[Path, int] = {}
        self._last_growth = time.monotonic()

    def _labels(self, when: dt.datetime) -> tuple[Mapping[str, str], int | None]:
        held = self.watch.held(self.vantage, when) if self.watch is not None else None  # type: ignore[attr-defined]
        if held is None or held.valid_after is None:
            return {}, None
        return {"valid_after": held.valid_after.isoformat()}, (held.param(self.param) if self.param else None)

    def poll(self, now: dt.datetime) -> Reading:
        """The probes new since the last poll; never raises (an unforeseen failure is a gap)."""
        try:
            pairs, problem = self._poll(now)
        except Exception as exc:  # the Instrument protocol: a poll never raises
            pairs, problem = (), f"{self.name}: unexpected {type(exc).__name__}: {exc}"
        problem = " ".join(problem.split())
        return Reading(self.name, self.kind, now, pairs, problem[:397] + "..." if len(problem) > 400 else problem)

    def _poll(self, now: dt.datetime) -> tuple[tuple[tuple[str, Sample], ...], str]:
        files = sorted(self.out_dir.glob(f"*.{self.vantage}.interactive.jsonl"))
        if not files:
            return (), f"{self.name}: no sidecar *.{self.vantage}.interactive.jsonl in {self.out_dir} yet"
        budget = self.max_bytes_per_poll
        samples: list[Sample] = []
        failures, skipped, last_failure = 0, [], ""
        for path in files:
            offset = self._offsets.get(path, 0)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size < offset:
                offset = 0  # the sidecar was replaced by a shorter one: read the new one from its start
            if size <= offset:
                continue
            got = read_interactive(path, source=self.vantage, instance=self.name, offset=offset, max_bytes=budget,
                                   now=now, labels=self._labels if self.watch is not None else None)
            self._offsets[path] = offset + got.consumed
            budget -= got.consumed
            samples.extend(got.samples)
            failures += got.failures
            skipped.extend(got.problems)
            last_failure = got.last_failure or last_failure
            if budget <= 0:
                break
        self.problems = (self.problems + skipped)[-100:]
        if samples or failures or skipped:
            self._last_growth = time.monotonic()
        pairs = tuple((QUIET_METRIC, s) for s in samples)
        problem = ""
        if not samples and failures:
            problem = f"{self.name}: {failures} probe(s) failed, the last with {last_failure or 'an error'}"
        elif not samples and skipped:
            problem = f"{self.name}: {len(skipped)} unreadable line(s), the first: {skipped[0]}"
        elif not samples and self.stale_after_s is not None and \
                time.monotonic() - self._last_growth > self.stale_after_s:
            problem = f"{self.name}: no probe recorded for over {self.stale_after_s:g} s"
        return pairs, problem

    def close(self) -> None:
        self._offsets.clear()
