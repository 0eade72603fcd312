"""What every instrument shares: the poll guard (a poll never raises), one-line problems, the
``instance`` label, and the metrics each collector kind can yield."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from kistexp.errors import KistexpError
from kistexp.metrics import catalogue
from kistexp.metrics.live import Reading
from kistexp.metrics.series import Sample

#: Longest problem line kept: it is journalled once per gap, and a server chooses part of it.
MAX_PROBLEM_CHARS = 400


def one_line(text: str) -> str:
    """``text`` on one line (every run of whitespace one space), at most MAX_PROBLEM_CHARS."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_PROBLEM_CHARS else flat[:MAX_PROBLEM_CHARS - 3] + "..."


def summarise(problems: Sequence[str]) -> str:
    """One line for a poll's problems: as many whole ones as fit in MAX_PROBLEM_CHARS (the first
    always, shortened if need be), joined by "; ", and how many more there were."""
    if not problems:
        return ""
    text = one_line(problems[0])
    shown = 1
    for p in problems[1:]:
        more = f"{text}; {one_line(p)}"
        if len(more) > MAX_PROBLEM_CHARS:
            break
        text, shown = more, shown + 1
    left = len(problems) - shown
    return text if not left else f"{text} (and {left} more problem{'s' if left > 1 else ''})"


def metrics_of(kind: str) -> tuple[str, ...]:
    """The catalogue metrics a collector kind provides: the only ones its instruments return."""
    return tuple(m.name for m in catalogue.METRICS if kind in m.collectors)


def labelled(pairs: Iterable[tuple[str, Sample]], extra: Mapping[str, str],
             metrics: Sequence[str]) -> list[tuple[str, Sample]]:
    """``pairs`` with ``extra`` labels added, keeping only ``metrics`` (the instrument's own)."""
    wanted = frozenset(metrics)
    out = []
    for metric, s in pairs:
        if metric in wanted:
            out.append((metric, Sample(s.time, s.value, {**s.labels, **extra}, s.param_value)))
    return out


class Polled:
    """Base of the instruments: ``poll`` runs ``_poll`` and turns whatever goes wrong into a
    Reading with a one-line problem, so the engine's collection never stops on a source."""

    name: str
    kind: str
    metrics: tuple[str, ...]

    def _poll(self, now: dt.datetime) -> tuple[list[tuple[str, Sample]], str]:
        raise NotImplementedError

    def poll(self, now: dt.datetime) -> Reading:
        try:
            samples, problem = self._poll(now)
        except KistexpError as exc:
            samples, problem = [], str(exc)
        except Exception as exc:  # the protocol: a poll never raises; an unforeseen failure is a named gap
            samples, problem = [], f"{self.name}: unexpected {type(exc).__name__}: {exc}"
        return Reading(self.name, self.kind, now, tuple(samples), one_line(problem) if problem else "")

    def close(self) -> None:
        """Nothing held between polls but memory (each fetch has its own connection)."""
