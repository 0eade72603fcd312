"""The judge's numbers in the words a report prints: effects as plain changes in display units, the
verdict's statistics kept apart from what a reader needs first, and repeated text said once.

The judge's effect is a ratio stage/baseline for relative comparisons, a difference for absolute
ones and the stage's own statistic for above/below (kistexp.judge Verdict); a reader sees a
relative change ("+76.8 %"), a difference in the metric's display unit ("+3.25 ms") or the value.
Nothing here decides anything: the verdicts are the ones the journal holds."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from kistexp.metrics import catalogue

# An absolute change of a metric shown in % is a difference of percentage points: "+1 %" would read
# as a relative change of the metric.
POINTS = "percentage points"


def _signed(x: float, unit: str) -> str:
    if unit == "%":
        # a wide interval's end can be thousands of per cent: separators keep it readable
        return f"{x:+,.0f} %" if abs(x) >= 1000 else f"{x:+.1f} %"
    return f"{x:+.3g} {unit}".rstrip()


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def difference_unit(unit: str) -> str:
    """The unit of a difference of a metric shown in ``unit``."""
    return POINTS if unit == "%" else unit


def effect_words(comparison: str, effect: float | None, unit: str, factor: float = 1.0) -> str:
    """The judge's effect in plain words: a ratio stage/baseline as the relative change
    (1.706 -> "+70.6 %"), a difference with the metric's unit, the stage's value for above/below.
    ``unit`` and ``factor`` are the metric's display unit and the factor to it
    (``kistexp.metrics.catalogue.display``); relative changes need neither."""
    if effect is None:
        return "no estimate"
    if comparison.startswith("relative"):
        return _signed(100 * (effect - 1), "%")
    if comparison.startswith("absolute"):
        return _signed(effect * factor, difference_unit(unit))
    return f"{effect * factor:.3g} {unit}".rstrip()


def interval_words(comparison: str, low: float | None, high: float | None, unit: str, factor: float = 1.0) -> str:
    if not (_finite(low) and _finite(high)):
        return "no interval"
    return f"[{effect_words(comparison, low, unit, factor)}, {effect_words(comparison, high, unit, factor)}]"


def limit_words(comparison: str, threshold: float, unit: str, factor: float = 1.0) -> str:
    """The criterion's limit on the same scale as ``effect_words``: "+25.0 %", "+5 ms", "below 1 %"."""
    sign = 1 if comparison.endswith("increase") else -1
    if comparison.startswith("relative"):
        return _signed(100 * threshold * sign, "%")
    if comparison.startswith("absolute"):
        return _signed(threshold * factor * sign, difference_unit(unit))
    return f"{comparison} {threshold * factor:g} {unit}".rstrip()


@attrs.frozen
class VerdictText:
    """One look's verdict as a reader takes it in: the outcome, the effect in plain words with its
    interval and the limit; the reason when there is no estimate or no decision; and the judge's
    own detail (theta, se, design effect, sequential boundaries) for whoever checks the statistics."""

    outcome: str
    effect: str  # "+76.8 % [+39.2 %, +124.6 %]"; "" without an estimate
    limit: str  # "+25.0 %"
    note: str  # why there is no estimate, or what kept a pass from counting; "" otherwise
    statistics: str  # the judge's detail; "" when it says no more than ``note``

    @property
    def line(self) -> str:
        """The whole verdict on one line: "fail: +76.8 % [+39.2 %, +124.6 %] (limit +25.0 %)"."""
        what = f"{self.effect} (limit {self.limit})" if self.effect else "no estimate"
        return f"{self.outcome}: {what}" + (f"; {self.note}" if self.note else "")


def verdict_text(criterion, verdict) -> VerdictText:
    """``criterion``: anything with metric, comparison and threshold (a plan criterion or the
    rollout's RolloutCriterion); ``verdict``: a journal VerdictRow or a judge Verdict."""
    unit, factor = catalogue.display(criterion.metric)
    comparison = criterion.comparison
    limit = limit_words(comparison, criterion.threshold, unit, factor)
    detail = verdict.detail or ""
    if verdict.effect is None:
        # no estimate: the judge's detail is the reason itself ("stage 48 samples < 200 needed per side")
        return VerdictText(verdict.outcome, "", limit, detail, "")
    effect = effect_words(comparison, verdict.effect, unit, factor)
    if _finite(verdict.ci_low) and _finite(verdict.ci_high):
        effect += " " + interval_words(comparison, verdict.ci_low, verdict.ci_high, unit, factor)
    # a pass held back by a gate is the one remark of the judge's a reader must see beside the effect
    note = next((p.strip() for p in detail.split("; ") if p.startswith("would PASS but")), "")
    return VerdictText(verdict.outcome, effect, limit, note, detail)


def plain_message(message: str, judged: Iterable[tuple[str, VerdictText]]) -> tuple[str, str]:
    """An engine message that quotes a verdict's detail ("criterion 'relay CPU' failed (ratio
    stage/baseline 1.768 [...]; theta ...) -> step-back") with the effect in plain words instead,
    and the quoted detail apart: (visible text, statistics). ``judged``: (detail, its VerdictText)
    of the verdicts the message may quote. A message quoting none is returned whole."""
    for detail, text in judged:
        if detail and text.effect and detail in message:
            return message.replace(detail, f"{text.effect} vs limit {text.limit}"), detail
    return message, ""


def collapse(items: Sequence[tuple[str, str]], min_chars: int = 24) -> list[str]:
    """Each (label, text) as shown in a table or grid: a text already shown under another label
    becomes "same as <that label>", so a reader reads a long remark once. Short texts (under
    ``min_chars``) are repeated: a reference would be no shorter."""
    first: dict[str, str] = {}
    out = []
    for label, text in items:
        if text and len(text) >= min_chars and text in first:
            out.append(f"same as {first[text]}")
        else:
            first.setdefault(text, label)
            out.append(text)
    return out


def attack_number(x: float | None) -> str:
    """An attack measure's difference as the report writes it: three decimals with its sign (+0.050),
    small ones in exponent form (+2.1e-04) so they do not read as zero; "n/a" when not computed."""
    if not _finite(x):
        return "n/a"
    if x == 0:
        return "+0.000"
    return f"{x:+.3f}" if abs(x) >= 0.001 else f"{x:+.1e}"


def attack_difference_words(mean: float | None, low: float | None, high: float | None, units: int) -> str:
    """A stage-minus-baseline difference with its interval: "+0.050 [+0.025, +0.075]"; with a single
    network there is no interval, and the text says so."""
    if units == 0:
        return "n/a (no network has both)"
    if not (_finite(low) and _finite(high)):
        return f"{attack_number(mean)} ({units} network{'s' if units != 1 else ''}: no interval)"
    return f"{attack_number(mean)} [{attack_number(low)}, {attack_number(high)}]"
