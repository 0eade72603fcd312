"""What a sweep's cells add up to: the tidy table, bands across networks, plots and the recommendation.

* tidy table: one row per cell, metric, relay class and statistic (median, p95 of the cell's samples),
  with the cell's coordinates (values, load, loss rate, class mix, seed, network) as columns; and one row
  per cell and attack measure (``kistexp.metrics.catalogue.ATTACK_MEASURES``, docs/anonymity.md), whose
  statistic is ``value``: a cell gives one figure of what an attacker gains, not a distribution;
* bands: per point of the grid without the network, the median over networks of each network's value
  (the mean over simulation seeds) and the 2.5-97.5 % range over networks (tornettools' method, as
  ``kistexp simulate``);
* recommendation: per context (load, loss rate, class mix and the other swept parameters), each value's
  rise of the metric over the baseline value, measured network by network (same network, seed and traffic:
  common random numbers), and the lowest value whose rise stays under the limit for the whole 95 % range.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp import params
from kistexp.errors import SweepError
from kistexp.metrics import catalogue
from kistexp.safeio import write_atomic
from kistexp.sweep.execute import CellOutcome
from kistexp.sweep.spec import Recommend, Sweep
from kistexp.textsafe import csv_cell, csv_row

COORDS = ("network", "sample_seed", "seed", "load", "loss_rate", "class_mix")
STATISTICS = ("median", "p95")
ATTACK_STATISTIC = "value"  # the statistic of an attack measure's row: the cell's one figure


def tidy_rows(sweep: Sweep, outcomes: Sequence[CellOutcome]) -> list[dict]:
    rows = []
    for o in outcomes:
        if o.result is None:
            continue
        t = o.task
        base = {"cell": t.key[:16], "network": t.network, "sample_seed": t.sample_seed, "seed": t.seed,
                "load": t.load, "loss_rate": t.loss_rate, "class_mix": t.class_mix}
        base.update({name: value for name, value in t.values})
        for metric, cls, median, p95 in o.result.figures:
            for stat, value in (("median", median), ("p95", p95)):
                rows.append({**base, "metric": metric, "relay_class": cls, "statistic": stat, "value": value})
        for measure, value in o.result.attacks:
            rows.append({**base, "metric": measure, "relay_class": "", "statistic": ATTACK_STATISTIC,
                         "value": value})
    return rows


def _columns(sweep: Sweep) -> list[str]:
    return ["cell", *COORDS, *sweep.parameters, "metric", "relay_class", "statistic", "value"]


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=list(columns))
    w.writeheader()
    # class-mix names, relay classes, contexts and error messages are text from the sweep's files: a
    # spreadsheet opening the CSV must not run one as a formula (numbers stay numbers)
    w.writerows(csv_row(r) for r in rows)
    write_atomic(path, f.getvalue().encode("utf-8"), "the results", SweepError)


def write_table(sweep: Sweep, rows: Sequence[dict], out: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = _columns(sweep)
    # text cells neutralised as in the CSV: the same table opened in a spreadsheet runs no formula
    table = pa.Table.from_pylist([{c: csv_cell(r.get(c)) for c in cols} for r in rows],
                                 schema=_schema(sweep)) if rows else _schema(sweep).empty_table()
    parquet = out / "results.parquet"
    buf = io.BytesIO()
    pq.write_table(table, buf)
    write_atomic(parquet, buf.getvalue(), "the results", SweepError)
    csv_path = out / "results.csv"
    write_csv(csv_path, rows, cols)
    return parquet, csv_path


def _schema(sweep: Sweep):
    import pyarrow as pa

    fields = [("cell", pa.string()), ("network", pa.int32()), ("sample_seed", pa.int64()), ("seed", pa.int64()),
              ("load", pa.float64()), ("loss_rate", pa.float64()), ("class_mix", pa.string())]
    fields += [(p, pa.int64()) for p in sweep.parameters]
    fields += [("metric", pa.string()), ("relay_class", pa.string()), ("statistic", pa.string()),
               ("value", pa.float64())]
    return pa.schema(fields)


# --- bands across networks ------------------------------------------------------------------------------


@attrs.frozen
class Band:
    point: tuple  # (values, load, loss_rate, class_mix)
    metric: str
    relay_class: str
    median: float
    low: float
    high: float
    networks: int


def _per_network(rows: Sequence[dict], sweep: Sweep, statistic: str = "median") -> dict:
    """(point, metric, class) -> {network: mean over simulation seeds}; an attack measure's one figure per
    cell counts as its median"""
    acc: dict = {}
    wanted = (statistic, ATTACK_STATISTIC) if statistic == "median" else (statistic,)
    for r in rows:
        if r["statistic"] not in wanted or not math.isfinite(r["value"]):
            continue
        point = (tuple(r[p] for p in sweep.parameters), r["load"], r["loss_rate"], r["class_mix"])
        acc.setdefault((point, r["metric"], r["relay_class"]), {}).setdefault(r["network"], []).append(r["value"])
    return {k: {n: float(np.mean(v)) for n, v in nets.items()} for k, nets in acc.items()}


def _band(values: Sequence[float]) -> tuple[float, float, float]:
    v = np.asarray(values, float)
    return float(np.median(v)), float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))


def bands(sweep: Sweep, rows: Sequence[dict]) -> list[Band]:
    out = []
    for (point, metric, cls), nets in _per_network(rows, sweep).items():
        med, lo, hi = _band(list(nets.values()))
        out.append(Band(point, metric, cls, med, lo, hi, len(nets)))
    return out


@attrs.frozen
class AttackBand:
    """What an attacker gains at one point of the grid: a measure's median over networks (each the mean
    over simulation seeds) with its 2.5-97.5 % range across networks."""

    values: tuple[tuple[str, int], ...]
    load: float
    loss_rate: float
    class_mix: str
    measure: str
    median: float
    low: float
    high: float
    networks: int

    def row(self) -> dict:
        m = catalogue.attack_measure(self.measure)
        return {**dict(self.values), "load": self.load, "loss_rate": self.loss_rate, "class_mix": self.class_mix,
                "measure": self.measure, "unit": m.unit if m else "",
                "leakier_when": "higher" if m is None or m.leakier > 0 else "lower", "median": self.median,
                "low_2_5": self.low, "high_97_5": self.high, "networks": self.networks}


def attack_bands(sweep: Sweep, rows: Sequence[dict]) -> list[AttackBand]:
    """The attack measures' ``bands``, in catalogue order, then the grid's."""
    out = []
    for b in bands(sweep, rows):
        if catalogue.attack_measure(b.metric) is None:
            continue
        values, load, loss, mix = b.point
        out.append(AttackBand(tuple(zip(sweep.parameters, values, strict=True)), load, loss, mix, b.metric,
                              b.median, b.low, b.high, b.networks))
    order = {name: i for i, name in enumerate(catalogue.attack_measure_names())}
    out.sort(key=lambda a: (order[a.measure], tuple(v for _, v in a.values), a.load, a.loss_rate, a.class_mix))
    return out


def attack_columns(sweep: Sweep) -> list[str]:
    """The columns of ``attacks.csv`` (``AttackBand.row``)."""
    return [*sweep.parameters, "load", "loss_rate", "class_mix", "measure", "unit", "leakier_when", "median",
            "low_2_5", "high_97_5", "networks"]


# --- recommendation ---------------------------------------------------------------------------------------


@attrs.frozen
class RiseRow:
    rule: int
    context: str
    value: int
    rise_median: float | None  # relative, e.g. 0.04 = +4 %
    rise_low: float | None
    rise_high: float | None
    networks: int
    within: bool


@attrs.frozen
class Recommendation:
    rule: int
    parameter: str
    metric: str
    relay_class: str
    max_rise_percent: float
    baseline: int
    context: str
    value: int | None  # None: no swept value stays within the limit (or the class is absent)
    rise_high: float | None
    note: str


def _context_label(sweep: Sweep, point: tuple, parameter: str) -> str:
    values, load, loss, mix = point
    parts = [f"{p}={v}" for p, v in zip(sweep.parameters, values, strict=True) if p != parameter]
    parts += [f"load={load:g}", f"loss={loss:g}", f"mix={mix}"]
    return " ".join(parts)


def recommend(sweep: Sweep, rows: Sequence[dict]) -> tuple[list[RiseRow], list[Recommendation]]:
    per_net = _per_network(rows, sweep)
    rises: list[RiseRow] = []
    recs: list[Recommendation] = []
    for i, rule in enumerate(sweep.recommend):
        p = sweep.parameters.index(rule.parameter)
        contexts: dict[tuple, dict[int, dict[int, float]]] = {}
        for (point, metric, cls), nets in per_net.items():
            if metric != rule.metric or cls != rule.relay_class:
                continue
            values = point[0]
            ctx = (tuple(v for j, v in enumerate(values) if j != p), *point[1:])
            contexts.setdefault(ctx, {})[values[p]] = nets
        for ctx in _all_contexts(sweep, p):
            full_point = (_insert(ctx[0], p, rule.baseline), *ctx[1:])
            label = _context_label(sweep, full_point, rule.parameter)
            by_value = contexts.get(ctx, {})
            base = by_value.get(rule.baseline)
            if not base:
                recs.append(Recommendation(i, rule.parameter, rule.metric, rule.relay_class, rule.max_rise_percent,
                                           rule.baseline, label, None, None,
                                           f"no relay of class {rule.relay_class!r} measured at the baseline "
                                           "(absent from the sampled networks, or its cells failed)"))
                continue
            best: RiseRow | None = None
            for value in sorted(by_value):
                nets = by_value[value]
                shared = [n for n in nets if n in base and base[n] != 0]
                if not shared:
                    continue
                r = [nets[n] / base[n] - 1 for n in shared]
                med, lo, hi = _band(r)
                row = RiseRow(i, label, value, med, lo, hi, len(shared), hi * 100 <= rule.max_rise_percent)
                rises.append(row)
                if row.within and best is None:
                    best = row
            note = "" if best else f"every swept value raises {rule.metric} by more than {rule.max_rise_percent:g} %"
            recs.append(Recommendation(i, rule.parameter, rule.metric, rule.relay_class, rule.max_rise_percent,
                                       rule.baseline, label, best.value if best else None,
                                       best.rise_high if best else None, note))
    return rises, recs


def _insert(values: tuple, p: int, v: int) -> tuple:
    return (*values[:p], v, *values[p:])


def _all_contexts(sweep: Sweep, p: int) -> list[tuple]:
    others = list(dict.fromkeys(tuple(v for j, (_, v) in enumerate(vs) if j != p) for vs in sweep.value_sets))
    return [(o, load, loss, mix) for o in others for load in sweep.loads for loss in sweep.loss_rates
            for mix, _ in sweep.class_mixes]


# --- plots ----------------------------------------------------------------------------------------------

PLOT_METRICS = ("client_ttfb_s", "client_ttlb_50kib_s", "client_ttlb_1mib_s", "client_ttlb_5mib_s",
                "client_throughput_mbytes_per_s", "quiet_circuit_latency_ms", "relay_cpu_utilization",
                "relay_rss_bytes", "relay_bandwidth_bytes_per_s", "relay_kernel_queue_bytes")
MAX_LINES = 6
# axes stored as fractions (spec.py: load a target mean relay utilisation, loss a rate) and shown in %
_PERCENT_AXES = ("load", "loss_rate")
_SHORT = {"load": "load", "loss_rate": "loss", "class_mix": "mix"}
# parameter units that name no quantity: the axis says "(value)" and a level prints bare
_UNITLESS = {"", "-", "enum", "bool", "version"}


@attrs.frozen
class PlotAxis:
    """A swept axis as the plots show it: where each level sits on the x axis and how it reads in the axis
    label, the ticks and the legend."""

    name: str  # a parameter, "load", "loss_rate" or "class_mix"
    levels: tuple

    @property
    def unit(self) -> str:
        if self.name in _PERCENT_AXES:
            return "%"
        p = params.get(self.name)
        return "" if p is None or p.unit in _UNITLESS else p.unit

    @property
    def label(self) -> str:
        """The x axis' label, with its unit in parentheses."""
        if self.name == "load":
            return "load: target mean relay utilisation (%)"
        if self.name == "loss_rate":
            return "packet loss on every link (%)"
        if self.name == "class_mix":
            return "relay-class mix (name in [class_mixes])"
        return f"{self.name} ({self.unit or 'value'})"

    def x(self, level) -> float:
        if self.name == "class_mix":
            return float(self.levels.index(level))
        return 100.0 * level if self.name in _PERCENT_AXES else float(level)

    def tick(self, level) -> str:
        return str(level) if self.name == "class_mix" else f"{self.x(level):g}"

    def value_text(self, level) -> str:
        """A level with its unit: ``5 ms``, ``60 %``, ``hz1000``."""
        return f"{self.tick(level)} {self.unit}".rstrip()

    def text(self, level) -> str:
        """A level in a legend: ``load 60 %``, ``loss 1 %``, ``mix hz1000``, ``KISTSchedRunInterval 5 ms``."""
        return f"{_SHORT.get(self.name, self.name)} {self.value_text(level)}"


def plot_axes(sweep: Sweep) -> list[PlotAxis]:
    """Swept axes with at least two levels: each parameter, load, loss rate, class mix (numbers in order,
    class mixes in the file's order)."""
    out = []
    for j, p in enumerate(sweep.parameters):
        levels = sorted({vs[j][1] for vs in sweep.value_sets})
        if len(levels) > 1:
            out.append(PlotAxis(p, tuple(levels)))
    for name, levels in (("load", sorted(sweep.loads)), ("loss_rate", sorted(sweep.loss_rates)),
                         ("class_mix", [m for m, _ in sweep.class_mixes])):
        if len(levels) > 1:
            out.append(PlotAxis(name, tuple(levels)))
    return out


def _coords(sweep: Sweep, point: tuple) -> dict:
    values, load, loss, mix = point
    coords = dict(zip(sweep.parameters, values, strict=True))
    coords.update(load=load, loss_rate=loss, class_mix=mix)
    return coords


def _point(sweep: Sweep, coords: dict) -> tuple:
    return tuple(coords[p] for p in sweep.parameters), coords["load"], coords["loss_rate"], coords["class_mix"]


def _fixed(sweep: Sweep, axes: Sequence[PlotAxis]) -> dict:
    """The coordinates of the axes with a single level."""
    swept = {a.name for a in axes}
    out = {p: sweep.value_sets[0][j][1] for j, p in enumerate(sweep.parameters) if p not in swept}
    for name, levels in (("load", sweep.loads), ("loss_rate", sweep.loss_rates),
                         ("class_mix", [m for m, _ in sweep.class_mixes])):
        if name not in swept:
            out[name] = levels[0]
    return out


def _class_words(relay_class: str) -> str:
    return "all relays" if relay_class == "all" else f"{relay_class} relays"


def value_text(parameter: str, value: int) -> str:
    """A parameter's value with its unit from the parameter catalogue: ``10 ms``."""
    return PlotAxis(parameter, ()).value_text(value)


def _rule_words(rule: Recommend) -> str:
    return (f"the lowest {rule.parameter} whose {catalogue.label(rule.metric)} of {_class_words(rule.relay_class)} "
            f"rises at most {rule.max_rise_percent:g} % over {value_text(rule.parameter, rule.baseline)} on every "
            "sampled network")


@attrs.frozen
class _Marks:
    """What a figure marks of the recommendation: vertical lines at the recommended value (plots against the
    recommended parameter), rings on the recommended value's line (plots against another axis), and the
    contexts where no swept value qualifies."""

    vlines: tuple[tuple[float, str, str], ...]  # (x, legend label, colour)
    rings: frozenset  # (line key, level)
    ring_label: str
    notes: tuple[str, ...]


def _marks(sweep: Sweep, axis: PlotAxis, others: Sequence[PlotAxis], lines: dict[tuple, tuple[str, str]],
           fixed: dict, recommendations: Sequence[Recommendation]) -> _Marks:
    rec_by = {(r.rule, r.context): r for r in recommendations}
    names = [a.name for a in others]

    def rec_at(i: int, rule: Recommend, key: tuple, level) -> Recommendation | None:
        coords = {**fixed, **dict(zip(names, key, strict=True)), axis.name: level}
        return rec_by.get((i, _context_label(sweep, _point(sweep, coords), rule.parameter)))

    vlines, rings, ring_params, notes = [], set(), [], []
    own = [(i, r) for i, r in enumerate(sweep.recommend) if r.parameter == axis.name]
    for i, rule in own:
        tag = "recommended" if len(own) == 1 else f"recommended by rule {i + 1}"
        by_value: dict = {}
        for key in lines:
            rec = rec_at(i, rule, key, rule.baseline)
            if rec is not None:
                by_value.setdefault(rec.value, []).append(key)
        found = sorted(v for v in by_value if v is not None)
        if len(found) == 1 and None not in by_value:  # every line agrees: one line, no context to name
            vlines.append((axis.x(found[0]), f"{tag}: {axis.value_text(found[0])}", "black"))
        else:
            for v in found:
                keys = by_value[v]
                colour = lines[keys[0]][1] if len(keys) == 1 else "black"
                # wrapped: with several other axes the contexts make a label wider than the figure
                vlines.append((axis.x(v), textwrap.fill(f"{tag} for {'; '.join(lines[k][0] for k in keys)}: "
                                                        f"{axis.value_text(v)}", 56), colour))
        if None in by_value:
            where = "; ".join(lines[k][0] for k in by_value[None] if lines[k][0])
            notes.append(f"{tag}: no swept value qualifies" + (f" for {where}" if where else ""))
    for i, rule in enumerate(sweep.recommend):
        if rule.parameter == axis.name or rule.parameter not in names:
            continue
        p = names.index(rule.parameter)
        for key in lines:
            for level in axis.levels:
                rec = rec_at(i, rule, key, level)
                if rec is not None and rec.value == key[p]:
                    rings.add((key, level))
        ring_params.append(rule.parameter)
    ring_label = (f"ring: the recommended {' / '.join(dict.fromkeys(ring_params))} at that "
                  f"{_SHORT.get(axis.name, axis.name)}") if rings else ""
    return _Marks(tuple(vlines), frozenset(rings), ring_label, tuple(notes))


def figures(sweep: Sweep, rows: Sequence[dict], relay_classes: Sequence[str] = ("all",),
            recommendations: Sequence[Recommendation] = ()) -> list[tuple[PlotAxis, object]]:
    """One matplotlib figure per swept axis (``plot_axes``): each metric against it, the median over networks
    with the 2.5-97.5 % band across networks, one line per combination of the other swept axes (the first
    ``MAX_LINES``), relay metrics for each of ``relay_classes``; the recommended value marked; one legend for
    the whole figure, below the panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    band_by = {(b.point, b.metric, b.relay_class): b for b in bands(sweep, rows)}
    networks = max((b.networks for b in band_by.values()), default=0)
    panels = [(m, "") for m in PLOT_METRICS if not m.startswith("relay_")]
    panels += [(m, c) for c in relay_classes for m in PLOT_METRICS if m.startswith("relay_")]
    panels += [(m, "") for m in catalogue.attack_measure_names()]  # what an attacker gains, where measured
    panels = [(m, c) for m, c in panels if any(k[1] == m and k[2] == c for k in band_by)]
    axes = plot_axes(sweep)
    fixed = _fixed(sweep, axes)
    out = []
    for axis in axes:
        others = [a for a in axes if a is not axis]
        # lines in the order of the other axes' levels, coloured once for the whole figure, so that a line
        # keeps its colour in every panel and the one legend holds for all
        keys = sorted({tuple(_coords(sweep, b.point)[a.name] for a in others) for b in band_by.values()},
                      key=lambda k: tuple(a.levels.index(v) for a, v in zip(others, k, strict=True)))
        lines = {k: (", ".join(a.text(v) for a, v in zip(others, k, strict=True)), f"C{i}")
                 for i, k in enumerate(keys[:MAX_LINES])}
        marks = _marks(sweep, axis, others, lines, fixed, recommendations)
        ncols = max(1, min(4, len(panels)))
        nrows = max(1, math.ceil(len(panels) / ncols))
        fig = Figure(figsize=(4.4 * max(ncols, 2), 3.3 * nrows + 1.8), layout="constrained")
        FigureCanvasAgg(fig)
        grid = fig.subplots(nrows, ncols, squeeze=False)
        for ax in grid.flat[len(panels):]:
            ax.set_visible(False)
        for ax, (metric, cls) in zip(grid.flat, panels, strict=False):
            attack = catalogue.attack_measure(metric)
            unit, factor = (attack.unit, 1.0) if attack else catalogue.display(metric)
            points: dict[tuple, list] = {}
            for (point, m, c), b in band_by.items():
                if m == metric and c == cls:
                    coords = _coords(sweep, point)
                    points.setdefault(tuple(coords[a.name] for a in others), []).append((coords[axis.name], b))
            for key, (_text, colour) in lines.items():
                pts = sorted(points.get(key, []), key=lambda lb: axis.levels.index(lb[0]))
                if not pts:
                    continue
                xs = [axis.x(level) for level, _ in pts]
                ax.plot(xs, [b.median * factor for _, b in pts], marker="o", color=colour)
                ax.fill_between(xs, [b.low * factor for _, b in pts], [b.high * factor for _, b in pts],
                                color=colour, alpha=0.18, linewidth=0)
                ringed = [(axis.x(level), b.median * factor) for level, b in pts if (key, level) in marks.rings]
                if ringed:
                    ax.plot(*zip(*ringed, strict=True), linestyle="none", marker="o", markersize=13,
                            markerfacecolor="none", markeredgecolor="black", markeredgewidth=1.5,
                            label="recommended")
            for x, text, colour in marks.vlines:
                ax.axvline(x, color=colour, linestyle="--", linewidth=1.5, label=text)
            ax.set_title((attack.label + (" (higher: leakier)" if attack.leakier > 0 else " (lower: leakier)")
                          if attack else catalogue.label(metric)) + (f", {_class_words(cls)}" if cls else ""),
                         fontsize=10)
            ax.set_xlabel(axis.label, fontsize=9)
            ax.set_ylabel(f"{'attack' if attack else 'median'} ({unit or 'value'})", fontsize=9)
            ax.set_xticks([axis.x(level) for level in axis.levels], [axis.tick(level) for level in axis.levels])
            ax.margins(x=0.06)  # a recommended value at either end of the axis is not hidden by the frame
            ax.tick_params(labelsize=8)
        handles = [Line2D([], [], color=colour, marker="o", label=text or f"median over {networks} networks")
                   for text, colour in lines.values()]
        handles.append(Patch(facecolor="0.5", alpha=0.35, label="2.5-97.5 % range across networks"))
        handles += [Line2D([], [], color=colour, linestyle="--", linewidth=1.5, label=text)
                    for _x, text, colour in marks.vlines]
        if marks.rings:
            handles.append(Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                                  markeredgecolor="black", markeredgewidth=1.5, label=marks.ring_label))
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), max(ncols, 2)), fontsize=9,
                   frameon=False)
        caption = [f"{sweep.name}: metrics against {axis.label}",
                   f"line: median over {networks} sampled network{'s' if networks != 1 else ''} (each the mean "
                   "over seeds of its cells' medians); band: 2.5-97.5 % range across networks"]
        caption += [f"recommended: {_rule_words(rule)}" for rule in sweep.recommend
                    if rule.parameter == axis.name or marks.rings and rule.parameter in {a.name for a in others}]
        if len(keys) > len(lines):
            caption.append(f"lines: the first {len(lines)} of {len(keys)} combinations of "
                           + ", ".join(_SHORT.get(a.name, a.name) for a in others))
        caption += list(marks.notes)
        fig.suptitle("\n".join(caption), fontsize=11)
        out.append((axis, fig))
    return out


def plot(sweep: Sweep, rows: Sequence[dict], out: Path, relay_classes: Sequence[str] = ("all",),
         recommendations: Sequence[Recommendation] = ()) -> list[Path]:
    """``plot-<axis>.png`` in ``out`` for each figure of ``figures``."""
    written = []
    for axis, fig in figures(sweep, rows, relay_classes, recommendations):
        path = out / f"plot-{axis.name}.png"
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        write_atomic(path, buf.getvalue(), "the plot", SweepError)
        written.append(path)
    return written


def recommend_rows(rises: Sequence[RiseRow], recs: Sequence[Recommendation]) -> list[dict]:
    return [attrs.asdict(r) for r in recs]


def rule_text(rule: Recommend) -> str:
    return (f"lowest {rule.parameter} whose {rule.metric} rise over {rule.parameter}={rule.baseline} stays under "
            f"{rule.max_rise_percent:g} % for relay class {rule.relay_class!r} (upper end of the 95 % range "
            "across networks)")
