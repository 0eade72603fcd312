"""The report's figures: matplotlib (Agg) drawn to SVG, embedded as ``data:`` URIs so the page
fetches nothing. Every function takes what ``kistexp.report.data`` read and returns a ``Figure``
(title, alt text, data URI); none decides anything about the experiment."""

from __future__ import annotations

import base64
import datetime as dt
import io
import textwrap
from collections.abc import Mapping, Sequence

import attrs
import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402 - after choosing the backend
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kistexp import params as tor_params  # noqa: E402
from kistexp.dirauth.propagation import NodeClass, PropagationModel  # noqa: E402
from kistexp.durations import format_duration  # noqa: E402
from kistexp.metrics import catalogue  # noqa: E402
from kistexp.report.wording import attack_difference_words, difference_unit, limit_words  # noqa: E402
from kistexp.textsafe import visible  # noqa: E402

# Byte-identical SVGs for identical input: no random ids, no timestamp. Names from plans (stages,
# criteria) are text, never mathtext: "$" in a criterion name must not be parsed (or fail to parse).
matplotlib.rcParams.update({"svg.hashsalt": "kistexp", "svg.fonttype": "none", "figure.dpi": 96,
                            "text.parse_math": False,
                            "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
OUTCOME_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#f9a825", "error": "#6a1b9a"}
BASELINE_COLOUR, STAGE_COLOUR = "#546e7a", "#1565c0"
RELAYS_COLOUR, CLIENTS_COLOUR = "#ef6c00", "#00897b"
LEAKIER_COLOUR, LESS_LEAKY_COLOUR = "#c62828", "#2e7d32"
ECDF_POINTS = 400


@attrs.frozen
class Figure:
    title: str
    alt: str
    uri: str
    caption: str = ""  # shown under the figure instead of ``alt`` where the alt text would repeat its neighbours'


@attrs.frozen
class Panel:
    """A figure, or the one line saying why there is none (no estimate yet, no samples in a stage):
    an empty frame would look like a measurement of nothing."""

    title: str
    figure: Figure | None = None
    why: str = ""


def param_label(param: str) -> str:
    """A consensus parameter with its unit, as an axis label: "KISTSchedRunInterval (ms)"."""
    p = tor_params.get(param)
    unit = p.unit if p is not None and p.unit not in ("", "-") else ""
    return f"{param} ({unit})" if unit else param


def metric_label(metric: str) -> str:
    """A metric with its display unit (``catalogue.display``), as an axis label."""
    unit, _factor = catalogue.display(metric)
    return f"{metric} ({unit})" if unit else metric


def _percent_axis(axis, signed: bool = False) -> None:
    """Tick labels in per cent of values already multiplied by 100, "+20 %" when ``signed``."""
    def fmt(y: float, _pos) -> str:
        text = f"{y:,.0f}" if float(y).is_integer() else f"{y:.3g}"
        return f"{'+' if signed and y > 0 else ''}{text} %"

    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(fmt))


def _encode(fig, title: str, alt: str) -> Figure:
    # stage, criterion, authority and mark names reach titles, legends and annotations as they are in the
    # plan or journal: a control character in one would make the SVG invalid XML (an image the browser
    # refuses) and a lone surrogate stops matplotlib, so every text is made visible first (tick labels,
    # drawn from their formatter, are made visible where they are set)
    for text in fig.findobj(matplotlib.text.Text):
        text.set_text(visible(text.get_text(), keep="\n"))
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return Figure(title, alt, "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii"))


def _time_axis(ax) -> None:
    loc = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))


MARK_COLOURS = {"injection": "#d81b60", "command": "#5e35b1", "outage": "#6d4c41", "gap": "#757575"}


def draw_marks(axes: Sequence, marks: Sequence, metric: str | None = None) -> int:
    """Injections, scripted commands, outages and metric gaps (``kistexp.report.data.Mark``) on time
    axes: a hatched span or a dashed vertical line, labelled on the first axes. Marks scoped to
    metrics are drawn only on the plot of one of them (``metric``; None: the plot is about no single
    metric and shows every mark). Returns how many were drawn."""
    drawn = 0
    seen_labels: set[str] = set()
    for i, m in enumerate(marks):
        if metric is not None and m.metrics and metric not in m.metrics:
            continue
        colour = MARK_COLOURS.get(m.kind, "black")
        label = f"{m.kind}: {m.label}"
        for k, ax in enumerate(axes):
            legend = label if k == 0 and label not in seen_labels else None
            if m.end is not None and m.end > m.start:
                ax.axvspan(m.start, m.end, facecolor=colour, alpha=0.10, edgecolor=colour, hatch="///", lw=0.6,
                           label=legend)
            else:
                ax.axvline(m.start, color=colour, ls="--", lw=1.1, label=legend)
            if k == 0:
                ax.annotate(m.label, (m.start, 0.0), xycoords=("data", "axes fraction"), xytext=(2, 3 + 9 * (i % 3)),
                            textcoords="offset points", fontsize=7, color=colour, annotation_clip=True)
        seen_labels.add(label)
        drawn += 1
    return drawn


def adoption_curve(cadence, population: str, t_s: np.ndarray) -> np.ndarray:
    """Share of relays (caches) or clients holding a consensus ``t_s`` seconds after its valid-after,
    on ``cadence`` (kistexp.dirauth.propagation, scaled to the cadence's interval as the engine does)."""
    model = PropagationModel(schedule=cadence.schedule())
    factor = cadence.interval_s / model.interval_s
    klass = NodeClass.CACHE if population == "relays" else NodeClass.CLIENT
    return np.asarray(model.adoption(klass, np.asarray(t_s) / factor))


def _steps(points: Sequence[tuple[dt.datetime, float | None]], end: dt.datetime):
    xs, ys = [], []
    for (t, v), nxt in zip(points, list(points[1:]) + [(end, None)], strict=True):
        xs += [t, nxt[0]]
        ys += [np.nan if v is None else v] * 2
    return xs, ys


VoteSeries = Sequence[tuple[dt.datetime, float | None]]


def vote_groups(votes: Mapping[str, VoteSeries]) -> list[tuple[tuple[str, ...], VoteSeries]]:
    """Authorities whose votes carried the same value at every round, grouped: (their names in the
    order given, the series), the largest group first. Nine authorities as nine lines in ten
    colours cannot be told apart; "the six that changed, the three that did not" can."""
    groups: dict[tuple, list[str]] = {}
    for auth, points in votes.items():
        groups.setdefault(tuple(points), []).append(auth)
    order = sorted(groups.items(), key=lambda kv: -len(kv[1]))  # stable: ties keep the authorities' order
    return [(tuple(names), list(series)) for series, names in order]


def vote_label(names: Sequence[str], width: int = 34) -> str:
    """The legend entry of a group of authorities, every name in it, wrapped to the legend's width."""
    return textwrap.fill(f"vote of {', '.join(names)} ({len(names)})", width)


def timeline(param: str, votes: Mapping[str, VoteSeries], consensus: VoteSeries, end: dt.datetime, cadence,
             stages: Sequence[tuple[str, dt.datetime, dt.datetime]] = (), marks: Sequence = ()) -> Figure:
    """The parameter in the authorities' votes (one line per group voting alike, offset so coinciding
    lines stay visible) and in the consensus (thick), stage spans behind; below, the share of relays
    and clients that hold the latest consensus change (adoption shading). ``votes`` in the order the
    legend should name the authorities. ``marks``: injections, commands, outages and gaps."""
    fig, (ax, ad) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    changes = [t for (t, v), (_, prev) in zip(consensus[1:], consensus[:-1], strict=True) if v != prev]
    # weeks of unchanged baseline would squeeze the changes into a sliver: show one day of it
    start = min([end] + [t for t, _ in consensus])
    if changes:
        start = max(start, changes[0] - dt.timedelta(days=1))
    for i, (name, begin, stop) in enumerate(stages):
        ax.axvspan(begin, stop, color="#90a4ae" if i % 2 else "#cfd8dc", alpha=0.25, lw=0)
        ax.annotate(name, (max(begin, start), 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12 - 10 * (i % 2)),
                    textcoords="offset points", fontsize=8, color="#37474f", annotation_clip=True)
    groups = vote_groups(votes)
    values = [v for _a, points in votes.items() for _t, v in points if v is not None]
    values += [v for _t, v in consensus if v is not None]
    # offsets relative to the values' spread, so a parameter counted in bytes separates its lines too
    spread = (max(values) - min(values)) if values else 0.0
    step = 0.01 * (spread or 1.0)
    n = max(1, len(groups))
    cmap = plt.get_cmap("tab10")
    for i, (names, points) in enumerate(groups):
        xs, ys = _steps(points, end)
        offset = (i - (n - 1) / 2) * step
        ax.plot(xs, np.asarray(ys, dtype=float) + offset, lw=1.2, color=cmap(i % 10), alpha=0.9,
                ls="-" if i < 10 else "--", label=vote_label(names))
    xs, ys = _steps(consensus, end)
    # beneath the votes (zorder), half-transparent: a vote coinciding with the consensus stays visible on it
    ax.plot(xs, ys, lw=4.5, color="black", alpha=0.45, zorder=1.9, label="consensus")
    ax.set_ylabel(param_label(param))
    n_marks = draw_marks((ax, ad), marks)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.8)  # beside: lines stay visible
    ax.set_title(f"{param} in the authorities' votes and in the consensus")
    # adoption: after each change, the share on the new value rises along the propagation curve
    ax.set_xlim(start, end)
    if changes:
        grid_t = np.array([start + (end - start) * f for f in np.linspace(0, 1, 1500)])
        for pop, colour in (("relays", RELAYS_COLOUR), ("clients", CLIENTS_COLOUR)):
            share = np.full(grid_t.size, np.nan)  # nothing to adopt before the first change
            for c in changes:
                since = np.array([(t - c).total_seconds() for t in grid_t])
                after = since >= 0
                share[after] = adoption_curve(cadence, pop, since[after])
            ad.fill_between(grid_t, 0, 100 * share, step=None, color=colour, alpha=0.35,
                            label=f"% of {pop} on the latest value")
            ad.plot(grid_t, 100 * share, color=colour, lw=0.8)
    ad.set_ylim(0, 105)
    ad.set_yticks([0, 50, 100])
    _percent_axis(ad.yaxis)
    ad.set_ylabel("adopted (% of\nrelays, clients)")
    if changes:  # nothing adopted yet: no legend to show
        ad.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _time_axis(ad)
    who = "; ".join(f"{', '.join(names)} voted alike" for names, _p in groups)
    alt = (f"Step plot of {param} over time: {len(votes)} authorities' votes in {len(groups)} "
           f"group{'s' if len(groups) != 1 else ''} ({who}) and the consensus, with "
           f"{len(changes)} consensus changes and the relays' and clients' adoption after each"
           + (f"; {n_marks} injections, commands, outages or gaps marked." if n_marks else "."))
    return _encode(fig, f"{param}: votes, consensus and adoption", alt)


def _ecdf(ax, values: np.ndarray, colour: str, label: str) -> None:
    v = np.sort(np.asarray(values, dtype=float))
    share = np.arange(1, v.size + 1) / v.size
    if v.size > ECDF_POINTS:  # the eye cannot tell more steps apart; the SVG stays small
        pick = np.unique(np.linspace(0, v.size - 1, ECDF_POINTS).round().astype(int))
        v, share = v[pick], share[pick]
    ax.step(v, share, where="post", color=colour, lw=1.6, label=label)


def criterion_cdf(criterion, stage_name: str, baseline: np.ndarray, stage: np.ndarray,
                  baseline_stat: float | None, stage_stat: float | None, limit: float | None,
                  verdict: str, words: str) -> Figure:
    """CDF of a criterion's metric in one stage against the baseline: the statistic each side, the
    limit the stage's statistic must not cross, and the last verdict (``words``: its plain line).
    Values, statistics and limit come in the catalogue's unit and are drawn in the display unit."""
    unit, factor = catalogue.display(criterion.metric)
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    if baseline.size:
        _ecdf(ax, baseline * factor, BASELINE_COLOUR, f"baseline (n={baseline.size})")
    if stage.size:
        _ecdf(ax, stage * factor, STAGE_COLOUR, f"{stage_name} (n={stage.size})")
    if baseline_stat is not None:
        ax.axvline(baseline_stat * factor, color=BASELINE_COLOUR, ls=":", lw=1)
    if stage_stat is not None:
        ax.axvline(stage_stat * factor, color=STAGE_COLOUR, ls=":", lw=1)
    if limit is not None:
        ax.axvline(limit * factor, color=OUTCOME_COLOURS["fail"], ls="--", lw=1.4,
                   label=f"limit ({criterion.statistic})")
    colour = OUTCOME_COLOURS.get(verdict, "black")
    ax.set_title(f"{criterion.name} — {stage_name}: {verdict.upper()}", color=colour, fontsize=9)
    ax.set_xlabel(metric_label(criterion.metric))
    ax.set_ylabel("share of samples (%)")
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, symbol=" %"))  # "80 %" as in the text
    ax.legend(fontsize=7, loc="lower right")
    alt = (f"Empirical CDF of {metric_label(criterion.metric)} in stage {stage_name} "
           f"({stage.size} samples) against the baseline ({baseline.size} samples); verdict {words}")
    return _encode(fig, f"{criterion.name}: {stage_name}", alt)


@attrs.frozen
class EffectScale:
    """How the effects plot shows the judge's effect: ``(effect - offset) * factor``. A ratio
    stage/baseline as the relative change in % (offset 1, factor 100: 1.77 is "+77 %"), a
    difference or a stage value in the metric's display unit. ``limit`` is the criterion's threshold
    on the shown scale (``limit_text`` in words), ``origin`` "no change" on it (0 for changes and
    differences)."""

    label: str
    offset: float
    factor: float
    limit: float
    limit_text: str
    percent: bool = False
    origin: float = 0.0

    def show(self, effect: float) -> float:
        return (effect - self.offset) * self.factor


def effect_scale(criterion) -> EffectScale:
    """The scale of ``criterion``'s effects (anything with metric, statistic, comparison, threshold)."""
    unit, factor = catalogue.display(criterion.metric)
    comparison, threshold = criterion.comparison, criterion.threshold
    sign = 1 if comparison.endswith("increase") else -1
    text = limit_words(comparison, threshold, unit, factor)
    if comparison.startswith("relative"):
        return EffectScale(f"change of the {criterion.statistic} vs baseline (%)", 1.0, 100.0, 100 * threshold * sign,
                           text, percent=True)
    if comparison.startswith("absolute"):
        diff = difference_unit(unit)
        return EffectScale(f"{criterion.statistic} stage − baseline" + (f" ({diff})" if diff else ""), 0.0, factor,
                           threshold * factor * sign, text, percent=diff == "%")
    # above/below: the stage's own statistic against a fixed value
    return EffectScale(f"stage {criterion.statistic}" + (f" ({unit})" if unit else ""), 0.0, factor,
                       threshold * factor, text, percent=unit == "%")


def effect_axis(scale: EffectScale, looks: Sequence, reach: float = 1.0, margin: float = 0.08
                ) -> tuple[float, float]:
    """The effects plot's y-limits: around the point estimates, the limit and the origin, with a
    margin. Intervals widen the axis by at most ``reach`` times that core span on each side: a
    quiet-circuit interval of [0.000004, 6531] (a ratio) must not squeeze estimates of -84 % and a
    +20 % limit into a line at the bottom of an axis reaching +650,000 %. Interval ends beyond the
    axis are drawn as arrows at its edge."""
    est = [scale.show(v.effect) for v in looks if _finite(v.effect)]
    core = est + [scale.limit, scale.origin]
    lo, hi = min(core), max(core)
    span = hi - lo
    if span <= 0:  # a single value: give it a visible neighbourhood
        span = abs(hi) or 1.0
        lo, hi = lo - span / 2, hi + span / 2
    ends_lo = [scale.show(v.ci_low) for v in looks if _finite(v.effect) and _finite(v.ci_low)]
    ends_hi = [scale.show(v.ci_high) for v in looks if _finite(v.effect) and _finite(v.ci_high)]
    lo = max(min([lo, *ends_lo]), lo - reach * span)
    hi = min(max([hi, *ends_hi]), hi + reach * span)
    pad = margin * (hi - lo)
    return lo - pad, hi + pad


def _finite(x: float | None) -> bool:
    return x is not None and bool(np.isfinite(x))


def _beyond(show, end: float | None, edge: float, direction: int) -> bool:
    """Whether an interval end lies past the axis edge (``direction`` 1: above the top, -1: below
    the bottom). An end the judge did not compute (None) is no arrow; an infinite one is."""
    if end is None:
        return False
    if not np.isfinite(end):
        return end * direction > 0
    return (show(end) - edge) * direction > 0


def effects_over_time(criterion, looks: Sequence, scale: EffectScale, names: Mapping[int, str],
                      marks: Sequence = ()) -> Figure:
    """The judge's effect and interval at each sequential look, coloured by outcome, with the limit,
    on ``scale`` (relative change in %, or the difference in the metric's unit); ``marks`` that
    touch the criterion's metric (injections, commands, outages, gaps) behind."""
    fig, ax = plt.subplots(figsize=(9, 2.8))
    lo_y, hi_y = effect_axis(scale, looks)
    drawn = [v for v in looks if v.effect is not None and np.isfinite(v.effect)]

    def shown(x: float | None, fallback: float) -> float:
        # an interval end is clipped to the axis (an arrow marks it), an infinite one too
        return float(np.clip(scale.show(x) if _finite(x) else fallback, lo_y, hi_y))

    # one band per stage for the interval (hourly looks over weeks are too many for error bars); a stage's
    # lone look has no band to draw and gets a bar
    for stage in sorted({v.stage for v in drawn}):
        sel = [v for v in drawn if v.stage == stage]
        t = [v.window_end for v in sel]
        lo = [shown(v.ci_low, scale.show(v.effect)) for v in sel]
        hi = [shown(v.ci_high, scale.show(v.effect)) for v in sel]
        if len(sel) > 1:
            ax.fill_between(t, lo, hi, color=STAGE_COLOUR, alpha=0.18, lw=0, step="mid")
            ax.plot(t, [scale.show(v.effect) for v in sel], color=STAGE_COLOUR, lw=0.8)
        else:
            ax.vlines(t, lo, hi, color=STAGE_COLOUR, alpha=0.35, lw=4)
    for outcome, colour in OUTCOME_COLOURS.items():
        sel = [v for v in drawn if v.outcome == outcome]
        if sel:
            ax.plot([v.window_end for v in sel], [scale.show(v.effect) for v in sel], "o", ms=2.5, color=colour,
                    rasterized=True, label=f"{outcome} ({len(sel)})")
    # interval ends beyond the axis: an arrow at its edge says "continues", with no false end drawn
    up = [v.window_end for v in drawn if _beyond(scale.show, v.ci_high, hi_y, 1)]
    down = [v.window_end for v in drawn if _beyond(scale.show, v.ci_low, lo_y, -1)]
    beyond = len(up) + len(down)
    label = f"interval beyond the axis ({beyond})"
    for at, edge, marker in ((up, hi_y, "^"), (down, lo_y, "v")):
        if at:
            ax.plot(at, [edge] * len(at), marker, ms=6, color=STAGE_COLOUR, clip_on=False, label=label)
            label = None  # one legend entry for both directions
    missing = [v for v in looks if v.effect is None or not np.isfinite(v.effect)]
    if missing:
        ax.plot([v.window_end for v in missing], [scale.origin] * len(missing), "x",
                color=OUTCOME_COLOURS["inconclusive"], ms=4, label=f"no estimate ({len(missing)})")
    times = [v.window_end for v in looks]
    pad = max(dt.timedelta(hours=2), (max(times) - min(times)) / 40)
    ax.axhline(scale.limit, color=OUTCOME_COLOURS["fail"], ls="--", lw=1.2, label=f"limit {scale.limit_text}")
    ax.axhline(scale.origin, color="black", lw=0.6)
    ax.set_ylim(lo_y, hi_y)
    if scale.percent:
        _percent_axis(ax.yaxis, signed=True)
    ax.set_ylabel(scale.label)
    ax.set_title(f"{criterion.name}: {criterion.statistic} {criterion.comparison}, effect with interval per look")
    # only the marks inside the looks' span: one outside would widen nothing (the limits are set) but crowd the legend
    lo_t, hi_t = min(times) - pad, max(times) + pad
    near = [m for m in marks if m.start <= hi_t and (m.end or m.start) >= lo_t]
    n_marks = draw_marks((ax,), near, criterion.metric)
    ax.set_xlim(lo_t, hi_t)
    # beside the axes: inside, it would cover looks or the arrows at the edge
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _time_axis(ax)
    stages = sorted({v.stage for v in looks})
    alt = (f"{len(looks)} sequential looks of criterion {criterion.name} in "
           f"{', '.join(names.get(s, str(s)) for s in stages)}; effect estimates as {scale.label} with intervals "
           f"against the limit {scale.limit_text}"
           + (f"; {beyond} interval end{'s' if beyond != 1 else ''} beyond the axis drawn as arrows" if beyond else "")
           + (f"; {n_marks} injections, commands, outages or gaps marked." if n_marks else "."))
    return _encode(fig, f"{criterion.name}: effect over time", alt)


def relay_costs(metric: str, stages: Sequence[str], classes: Sequence[str],
                predicted: Mapping[tuple[str, str], tuple[float, float, float]],
                measured: Mapping[tuple[str, str], tuple[float, int]], scale: float, unit: str) -> Figure:
    """Per relay class and stage: the predicted median with its 95 % range over sampled networks
    (bars with whiskers) beside the measured median (diamonds)."""
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.22 * max(1, len(classes)) * max(1, len(stages))))
    width = 0.8 / max(1, len(stages))
    cmap = plt.get_cmap("viridis")
    ys = np.arange(len(classes))
    for j, stage in enumerate(stages):
        colour = cmap(j / max(1, len(stages) - 1) * 0.85)
        pos = ys + (j - (len(stages) - 1) / 2) * width
        med = np.array([predicted.get((stage, c), (np.nan,) * 3)[0] for c in classes]) * scale
        lo = np.array([predicted.get((stage, c), (np.nan,) * 3)[1] for c in classes]) * scale
        hi = np.array([predicted.get((stage, c), (np.nan,) * 3)[2] for c in classes]) * scale
        ax.barh(pos, med, height=width * 0.9, color=colour, alpha=0.55, label=f"{stage}: predicted")
        ax.errorbar(med, pos, xerr=[np.nan_to_num(med - lo), np.nan_to_num(hi - med)], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=2)
        got = np.array([measured.get((stage, c), (np.nan, 0))[0] for c in classes]) * scale
        if np.isfinite(got).any():
            ax.plot(got, pos, "D", color=colour, mec="black", ms=5, label=f"{stage}: measured")
    ax.set_yticks(ys, labels=[visible(c) for c in classes], fontsize=7)
    ax.set_ylim(len(classes) - 0.5, -0.5)  # first class on top
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{metric} ({unit})")
    ax.set_title(f"{metric} per relay class: predicted (bar, 95 % range) and measured (diamond)")
    # below the axes: inside, the legend would hide the bars it explains
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=4.5)
    alt = f"Horizontal bars of {metric} for {len(classes)} relay classes and {len(stages)} stages."
    return _encode(fig, f"{metric} per relay class", alt)


def predictions(metric: str, stages: Sequence[str], rows: Mapping[str, tuple[float, float, float]],
                scale: float, unit: str) -> Figure:
    """One metric's predicted median and 95 % range over sampled networks, per stage."""
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    x = np.arange(len(stages))
    med = np.array([rows.get(s, (np.nan,) * 3)[0] for s in stages]) * scale
    lo = np.array([rows.get(s, (np.nan,) * 3)[1] for s in stages]) * scale
    hi = np.array([rows.get(s, (np.nan,) * 3)[2] for s in stages]) * scale
    ax.errorbar(x, med, yerr=[np.nan_to_num(med - lo), np.nan_to_num(hi - med)], fmt="o", color=STAGE_COLOUR,
                capsize=4)
    if len(stages) and np.isfinite(med[0]):
        ax.axhline(med[0], color=BASELINE_COLOUR, ls=":", lw=1)
    ax.set_xticks(x, labels=[visible(s) for s in stages], fontsize=7, rotation=20)
    ax.set_ylabel(f"median, 95 % range ({unit})" if unit else "median, 95 % range")
    ax.set_title(metric, fontsize=9)
    alt = f"Predicted median and 95 % range of {metric} for stages {', '.join(stages)}."
    return _encode(fig, metric, alt)


def rollback_recovery(kind: str, valid_after: dt.datetime, decided: dt.datetime, cadence) -> Figure:
    """Share of relays and clients back on the rollback's values over time after the decision."""
    wait = (valid_after - decided).total_seconds()
    span = wait + 3 * cadence.interval_s
    t = np.linspace(0, span, 600)
    since = t - wait
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    for pop, colour in (("relays", RELAYS_COLOUR), ("clients", CLIENTS_COLOUR)):
        share = np.where(since >= 0, adoption_curve(cadence, pop, np.maximum(since, 0)), 0.0)
        ax.plot(t / 3600, 100 * share, color=colour, label=pop)
    ax.axvline(wait / 3600, color="black", ls=":", lw=1, label="consensus carries it")
    # hours, not voting intervals: a reader compares them with the clock times in the table beside
    ax.set_xlabel("hours after the decision (voting interval "
                  f"{format_duration(dt.timedelta(seconds=cadence.interval_s), 1)})")
    ax.set_ylabel("back on its values (%)")
    ax.set_ylim(0, 105)
    _percent_axis(ax.yaxis)
    ax.set_title(f"{kind}: recovery", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    alt = f"Share of relays and clients running the values of rollback {kind} over time after the decision."
    return _encode(fig, f"{kind} recovery", alt)


@attrs.frozen
class DifferencePoint:
    """One stage's mean difference stage - baseline of an attack measure with its interval; ``flag``
    "leakier" or "less leaky" when the interval lies wholly on one side of zero, "" otherwise."""

    stage: str
    mean: float
    low: float
    high: float
    units: int
    flag: str = ""


@attrs.frozen
class DifferencePanel:
    """One attack measure across the stages: its label and unit, which way is leakier (+1: up), its
    points and, where an anonymity criterion names the measure, that criterion's margin."""

    label: str
    unit: str
    leakier: int
    points: tuple[DifferencePoint, ...]
    margin: float | None = None
    margin_label: str = ""


def attack_differences(attack: str, panels: Sequence[DifferencePanel], stages: Sequence[str],
                       networks: int) -> Figure:
    """One panel per measure of ``attack``: per stage the mean difference stage - baseline over the
    simulated networks with its 95 % interval as an error bar, red where the interval lies wholly on
    the leakier side, green on the other; zero (as at the baseline) as a solid line, the leakier side
    shaded and labelled, and a criterion's margin as a dashed line."""
    ncols = max(1, min(len(panels), 4))
    nrows = max(1, -(-len(panels) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.6, 0.6 + 2.2 * ncols), 1.2 + 2.5 * nrows), squeeze=False)
    x_of = {s: i for i, s in enumerate(stages)}
    colours = {"leakier": LEAKIER_COLOUR, "less leaky": LESS_LEAKY_COLOUR, "": STAGE_COLOUR}
    for ax, p in zip(axes.flat, panels, strict=False):
        for flag, colour in colours.items():
            sel = [q for q in p.points if q.flag == flag and q.stage in x_of and np.isfinite(q.mean)]
            if not sel:
                continue
            mean = np.array([q.mean for q in sel])
            low = np.array([q.low for q in sel])
            high = np.array([q.high for q in sel])
            ax.errorbar([x_of[q.stage] for q in sel], mean,
                        yerr=[np.nan_to_num(mean - low), np.nan_to_num(high - mean)], fmt="o", ms=4,
                        color=colour, ecolor=colour, elinewidth=1.4, capsize=4)
        ax.axhline(0.0, color="black", lw=0.8)
        if p.margin is not None and np.isfinite(p.margin):
            ax.axhline(p.margin, color=LEAKIER_COLOUR, ls="--", lw=1.2)
            ax.annotate(p.margin_label, (0.0, p.margin), xycoords=("axes fraction", "data"), xytext=(3, 2),
                        textcoords="offset points", fontsize=6.5, color=LEAKIER_COLOUR)
        lo, hi = ax.get_ylim()
        # the leakier side always shows, however far the points lie on the other
        if p.leakier > 0:
            hi = max(hi, 0.2 * (hi - lo))
        else:
            lo = min(lo, -0.2 * (hi - lo))
        if p.leakier > 0:
            ax.axhspan(0.0, hi, color=LEAKIER_COLOUR, alpha=0.06, lw=0)
            ax.text(0.99, 0.97, "↑ leakier", transform=ax.transAxes, ha="right", va="top", fontsize=7,
                    color=LEAKIER_COLOUR)
        else:
            ax.axhspan(lo, 0.0, color=LEAKIER_COLOUR, alpha=0.06, lw=0)
            ax.text(0.99, 0.03, "↓ leakier", transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                    color=LEAKIER_COLOUR)
        ax.set_ylim(lo, hi)
        ax.set_xlim(-0.5, len(stages) - 0.5)
        ax.set_xticks(range(len(stages)), labels=[visible(s) for s in stages], fontsize=7, rotation=20)
        ax.set_title(textwrap.fill(p.label, 30), fontsize=8)
        ax.set_ylabel(f"stage − baseline ({p.unit})" if p.unit else "stage − baseline", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = [matplotlib.lines.Line2D([], [], color=LEAKIER_COLOUR, marker="o", ls="",
                                       label="leakier: the interval lies wholly on the leakier side"),
               matplotlib.lines.Line2D([], [], color=LESS_LEAKY_COLOUR, marker="o", ls="", label="less leaky"),
               matplotlib.lines.Line2D([], [], color=STAGE_COLOUR, marker="o", ls="",
                                       label="no significant change"),
               matplotlib.lines.Line2D([], [], color="black", lw=0.8, label="0: as at the baseline")]
    if any(p.margin is not None for p in panels):
        handles.append(matplotlib.lines.Line2D([], [], color=LEAKIER_COLOUR, ls="--", lw=1.2,
                                               label="margin of an anonymity criterion"))
    fig.legend(handles=handles, fontsize=7, ncol=2 if ncols <= 2 else 4, loc="lower center",
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"{attack}: stage − baseline, mean over {networks} simulated network{'s' if networks != 1 else ''}"
                 " with its 95 % interval", fontsize=9)
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, (0.8 if ncols <= 2 else 0.5) / height, 1, 1))
    flagged = [f"{q.stage} {p.label} {attack_difference_words(q.mean, q.low, q.high, q.units)}"
               for p in panels for q in p.points if q.flag == "leakier"]
    margins = [f"{p.label} ({p.margin_label})" for p in panels if p.margin is not None]
    alt = (f"Error bars of the difference stage minus baseline of {len(panels)} {attack} measure"
           f"{'s' if len(panels) != 1 else ''} ({'; '.join(p.label for p in panels)}) for stages "
           f"{', '.join(stages)}, over {networks} simulated networks; leakier: "
           + ("; ".join(flagged) if flagged else "none")
           + (f"; criterion margins: {'; '.join(margins)}" if margins else "") + ".")
    return _encode(fig, f"{attack}: what an attacker gains", alt)
