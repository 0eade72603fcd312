"""The report's figures: matplotlib (Agg) drawn to SVG, embedded as ``data:`` URIs so the page
fetches nothing. Every function takes what ``kistexp.report.data`` read and returns a ``Figure``
(title, alt text, data URI); none decides anything about the experiment."""

from __future__ import annotations

import base64
import datetime as dt
import io
from collections.abc import Mapping, Sequence

import attrs
import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402 - after choosing the backend
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kistexp.dirauth.propagation import NodeClass, PropagationModel  # noqa: E402
from kistexp.metrics import catalogue  # noqa: E402

# Byte-identical SVGs for identical input: no random ids, no timestamp. Names from plans (stages,
# criteria) are text, never mathtext: "$" in a criterion name must not be parsed (or fail to parse).
matplotlib.rcParams.update({"svg.hashsalt": "kistexp", "svg.fonttype": "none", "figure.dpi": 96,
                            "text.parse_math": False,
                            "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
OUTCOME_COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#f9a825", "error": "#6a1b9a"}
BASELINE_COLOUR, STAGE_COLOUR = "#546e7a", "#1565c0"
RELAYS_COLOUR, CLIENTS_COLOUR = "#ef6c00", "#00897b"
ECDF_POINTS = 400


@attrs.frozen
class Figure:
    title: str
    alt: str
    uri: str


def _encode(fig, title: str, alt: str) -> Figure:
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


def timeline(param: str, votes: Mapping[str, Sequence[tuple[dt.datetime, float | None]]],
             consensus: Sequence[tuple[dt.datetime, float | None]], end: dt.datetime, cadence,
             stages: Sequence[tuple[str, dt.datetime, dt.datetime]] = (), marks: Sequence = ()) -> Figure:
    """The parameter in each authority's vote (thin, offset so coinciding votes stay visible) and in
    the consensus (thick), stage spans behind; below, the share of relays and clients that hold the
    latest consensus change (adoption shading). ``marks``: injections, commands, outages and gaps."""
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
    n = max(1, len(votes))
    cmap = plt.get_cmap("tab10")
    for i, (auth, points) in enumerate(sorted(votes.items())):
        xs, ys = _steps(points, end)
        offset = (i - (n - 1) / 2) * 0.08
        ax.plot(xs, np.asarray(ys, dtype=float) + offset, lw=0.9, color=cmap(i % 10), alpha=0.8,
                label=f"vote: {auth}")
    xs, ys = _steps(consensus, end)
    ax.plot(xs, ys, lw=3.2, color="black", alpha=0.85, label="consensus")
    ax.set_ylabel(param)
    n_marks = draw_marks((ax, ad), marks)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.8)  # beside: lines stay visible
    ax.set_title(f"{param} in each authority's vote and in the consensus")
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
            ad.fill_between(grid_t, 0, share, step=None, color=colour, alpha=0.35, label=f"{pop} on the latest value")
            ad.plot(grid_t, share, color=colour, lw=0.8)
    ad.set_ylim(0, 1.05)
    ad.set_ylabel("adopted")
    if changes:  # nothing adopted yet: no legend to show
        ad.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _time_axis(ad)
    alt = (f"Step plot of {param} over time: {len(votes)} authorities' votes and the consensus, with "
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
                  verdict: str, detail: str) -> Figure:
    """CDF of a criterion's metric in one stage against the baseline: the statistic each side, the
    limit the stage's statistic must not cross, and the last verdict."""
    m = catalogue.get(criterion.metric)
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    if baseline.size:
        _ecdf(ax, baseline, BASELINE_COLOUR, f"baseline (n={baseline.size})")
    if stage.size:
        _ecdf(ax, stage, STAGE_COLOUR, f"{stage_name} (n={stage.size})")
    if baseline_stat is not None:
        ax.axvline(baseline_stat, color=BASELINE_COLOUR, ls=":", lw=1)
    if stage_stat is not None:
        ax.axvline(stage_stat, color=STAGE_COLOUR, ls=":", lw=1)
    if limit is not None:
        ax.axvline(limit, color=OUTCOME_COLOURS["fail"], ls="--", lw=1.4, label=f"limit ({criterion.statistic})")
    colour = OUTCOME_COLOURS.get(verdict, "black")
    ax.set_title(f"{criterion.name} — {stage_name}: {verdict.upper()}", color=colour, fontsize=9)
    ax.set_xlabel(f"{criterion.metric} ({m.unit if m else ''})")
    ax.set_ylabel("share of samples")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    alt = (f"Empirical CDF of {criterion.metric} in stage {stage_name} ({stage.size} samples) against the "
           f"baseline ({baseline.size} samples); verdict {verdict}: {detail}")
    return _encode(fig, f"{criterion.name}: {stage_name}", alt)


def effects_over_time(criterion, looks: Sequence, threshold: float, names: Mapping[int, str],
                      marks: Sequence = ()) -> Figure:
    """The judge's effect and interval at each sequential look, coloured by outcome, with the limit;
    ``marks`` that touch the criterion's metric (injections, commands, outages, gaps) behind."""
    fig, ax = plt.subplots(figsize=(9, 2.8))
    drawn = [v for v in looks if v.effect is not None]
    # one band per stage for the interval (hourly looks over weeks are too many for error bars)
    for stage in sorted({v.stage for v in drawn}):
        sel = [v for v in drawn if v.stage == stage]
        t = [v.window_end for v in sel]
        lo = [v.ci_low if v.ci_low is not None and np.isfinite(v.ci_low) else v.effect for v in sel]
        hi = [v.ci_high if v.ci_high is not None and np.isfinite(v.ci_high) else v.effect for v in sel]
        ax.fill_between(t, lo, hi, color=STAGE_COLOUR, alpha=0.18, lw=0, step="mid")
        ax.plot(t, [v.effect for v in sel], color=STAGE_COLOUR, lw=0.8)
    for outcome, colour in OUTCOME_COLOURS.items():
        sel = [v for v in drawn if v.outcome == outcome]
        if sel:
            ax.plot([v.window_end for v in sel], [v.effect for v in sel], "o", ms=2.5, color=colour, rasterized=True,
                    label=f"{outcome} ({len(sel)})")
    missing = [v for v in looks if v.effect is None]
    if missing:
        ax.plot([v.window_end for v in missing], [0] * len(missing), "x", color=OUTCOME_COLOURS["inconclusive"],
                ms=4, label=f"no estimate ({len(missing)})")
    times = [v.window_end for v in looks]
    pad = max(dt.timedelta(hours=2), (max(times) - min(times)) / 40)
    ax.set_xlim(min(times) - pad, max(times) + pad)
    ax.axhline(threshold, color=OUTCOME_COLOURS["fail"], ls="--", lw=1.2, label="limit")
    ax.axhline(0, color="black", lw=0.6)
    relative = criterion.comparison.startswith("relative")
    if relative:
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_ylabel("effect vs baseline")
    ax.set_title(f"{criterion.name}: {criterion.statistic} {criterion.comparison}, effect with interval per look")
    # only the marks inside the looks' span: one outside would widen nothing (the limits are set) but crowd the legend
    lo_t, hi_t = min(times) - pad, max(times) + pad
    near = [m for m in marks if m.start <= hi_t and (m.end or m.start) >= lo_t]
    n_marks = draw_marks((ax,), near, criterion.metric)
    ax.set_xlim(lo_t, hi_t)
    ax.legend(fontsize=7, ncol=5, loc="best")
    _time_axis(ax)
    stages = sorted({v.stage for v in looks})
    alt = (f"{len(looks)} sequential looks of criterion {criterion.name} in "
           f"{', '.join(names.get(s, str(s)) for s in stages)}; effect estimates with intervals against the "
           f"limit {threshold:g}" + (f"; {n_marks} injections, commands, outages or gaps marked." if n_marks else "."))
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
    ax.set_yticks(ys, labels=list(classes), fontsize=7)
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
    ax.set_xticks(x, labels=list(stages), fontsize=7, rotation=20)
    ax.set_ylabel(unit)
    ax.set_title(metric, fontsize=9)
    alt = f"Predicted median and 95 % range of {metric} for stages {', '.join(stages)}."
    return _encode(fig, metric, alt)


def rollback_recovery(kind: str, valid_after: dt.datetime, decided: dt.datetime, cadence) -> Figure:
    """Share of relays and clients back on the rollback's values over time after the decision."""
    span = (valid_after - decided).total_seconds() + 3 * cadence.interval_s
    t = np.linspace(0, span, 600)
    since = t - (valid_after - decided).total_seconds()
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    for pop, colour in (("relays", RELAYS_COLOUR), ("clients", CLIENTS_COLOUR)):
        share = np.where(since >= 0, adoption_curve(cadence, pop, np.maximum(since, 0)), 0.0)
        ax.plot(t / 3600 * (3600 / cadence.interval_s), share, color=colour, label=pop)
    ax.axvline((valid_after - decided).total_seconds() / cadence.interval_s, color="black", ls=":", lw=1,
               label="consensus carries it")
    ax.set_xlabel("voting intervals after the decision")
    ax.set_ylabel("back on rollback values")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{kind}: recovery", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    alt = f"Share of relays and clients running the values of rollback {kind} over time after the decision."
    return _encode(fig, f"{kind} recovery", alt)
