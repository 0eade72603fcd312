"""What a sweep's cells add up to: the tidy table, bands across networks, plots and the recommendation.

* tidy table: one row per cell, metric, relay class and statistic (median, p95 of the cell's samples),
  with the cell's coordinates (values, load, loss rate, class mix, seed, network) as columns;
* bands: per point of the grid without the network, the median over networks of each network's value
  (the mean over simulation seeds) and the 2.5-97.5 % range over networks (tornettools' method, as
  ``kistexp simulate``);
* recommendation: per context (load, loss rate, class mix and the other swept parameters), each value's
  rise of the metric over the baseline value, measured network by network (same network, seed and traffic:
  common random numbers), and the lowest value whose rise stays under the limit for the whole 95 % range.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from kistexp.sweep.execute import CellOutcome
from kistexp.sweep.spec import Recommend, Sweep

COORDS = ("network", "sample_seed", "seed", "load", "loss_rate", "class_mix")
STATISTICS = ("median", "p95")


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
    return rows


def _columns(sweep: Sweep) -> list[str]:
    return ["cell", *COORDS, *sweep.parameters, "metric", "relay_class", "statistic", "value"]


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def write_table(sweep: Sweep, rows: Sequence[dict], out: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = _columns(sweep)
    table = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows],
                                 schema=_schema(sweep)) if rows else _schema(sweep).empty_table()
    parquet = out / "results.parquet"
    pq.write_table(table, parquet.with_name("results.parquet.tmp"))
    parquet.with_name("results.parquet.tmp").replace(parquet)
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
    """(point, metric, class) -> {network: mean over simulation seeds}"""
    acc: dict = {}
    for r in rows:
        if r["statistic"] != statistic or not math.isfinite(r["value"]):
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
# metric -> (axis unit, factor from the catalogue's unit); CPU as everywhere: % of one core (100 = one core)
PLOT_UNITS = {"client_ttfb_s": ("s", 1.0), "client_ttlb_50kib_s": ("s", 1.0), "client_ttlb_1mib_s": ("s", 1.0),
              "client_ttlb_5mib_s": ("s", 1.0), "client_throughput_mbytes_per_s": ("MB/s", 1.0),
              "quiet_circuit_latency_ms": ("ms", 1.0), "relay_cpu_utilization": ("% of one core", 100.0),
              "relay_rss_bytes": ("MB", 1e-6), "relay_bandwidth_bytes_per_s": ("MB/s", 1e-6),
              "relay_kernel_queue_bytes": ("KB", 1e-3)}


def _axes(sweep: Sweep) -> list[tuple[str, list]]:
    """Swept axes with at least two levels: each parameter, load, loss rate, class mix."""
    out = []
    for j, p in enumerate(sweep.parameters):
        levels = sorted({vs[j][1] for vs in sweep.value_sets})
        if len(levels) > 1:
            out.append((p, levels))
    for name, levels in (("load", list(sweep.loads)), ("loss_rate", list(sweep.loss_rates)),
                         ("class_mix", [m for m, _ in sweep.class_mixes])):
        if len(levels) > 1:
            out.append((name, levels))
    return out


def plot(sweep: Sweep, rows: Sequence[dict], out: Path, relay_classes: Sequence[str] = ("all",)) -> list[Path]:
    """One PNG per swept axis: each metric against it, median over networks with the 95 % band; one line
    per combination of the other axes (the first few). Relay metrics for each of ``relay_classes``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    band_by = {(b.point, b.metric, b.relay_class): b for b in bands(sweep, rows)}
    panels = [(m, "") for m in PLOT_METRICS if not m.startswith("relay_")]
    panels += [(m, c) for c in relay_classes for m in PLOT_METRICS if m.startswith("relay_")]
    panels = [(m, c) for m, c in panels if any(k[1] == m and k[2] == c for k in band_by)]
    written = []
    for axis, levels in _axes(sweep):
        ncols = 4
        nrows = max(1, math.ceil(len(panels) / ncols))
        fig, grid = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
        for ax in grid.flat[len(panels):]:
            ax.set_visible(False)
        for ax, (metric, cls) in zip(grid.flat, panels, strict=False):
            lines: dict[tuple, list[tuple]] = {}
            for (point, m, c), b in band_by.items():
                if m != metric or c != cls:
                    continue
                x, rest = _split_point(sweep, point, axis)
                lines.setdefault(rest, []).append((x, b))
            unit, k = PLOT_UNITS[metric]
            for rest in sorted(lines, key=str)[:MAX_LINES]:
                pts = sorted(lines[rest], key=lambda xb: levels.index(xb[0]))
                xs = [levels.index(x) if axis == "class_mix" else x for x, _ in pts]
                med = [b.median * k for _, b in pts]
                ax.plot(xs, med, marker="o", label=rest[1] or "all")
                ax.fill_between(xs, [b.low * k for _, b in pts], [b.high * k for _, b in pts], alpha=0.2)
            ax.set_ylabel(unit, fontsize=8)
            if axis == "class_mix":
                ax.set_xticks(range(len(levels)), levels, rotation=20)
            ax.set_title(f"{metric}" + (f" [{cls}]" if cls else ""), fontsize=9)
            ax.set_xlabel(axis, fontsize=8)
            ax.tick_params(labelsize=7)
            if len(lines) > 1:
                ax.legend(fontsize=6)
        fig.suptitle(f"{sweep.name}: metrics against {axis} (median over networks, 95 % band across networks)",
                     fontsize=11)
        fig.tight_layout()
        path = out / f"plot-{axis}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def _split_point(sweep: Sweep, point: tuple, axis: str) -> tuple[object, tuple[str, str]]:
    values, load, loss, mix = point
    coords = dict(zip(sweep.parameters, values, strict=True))
    coords.update(load=load, loss_rate=loss, class_mix=mix)
    x = coords.pop(axis)
    varying = {name for name, _ in _axes(sweep)}
    label = " ".join(f"{k}={v}" for k, v in coords.items() if k in varying)
    return x, (axis, label)


def recommend_rows(rises: Sequence[RiseRow], recs: Sequence[Recommendation]) -> list[dict]:
    return [attrs.asdict(r) for r in recs]


def rule_text(rule: Recommend) -> str:
    return (f"lowest {rule.parameter} whose {rule.metric} rise over {rule.parameter}={rule.baseline} stays under "
            f"{rule.max_rise_percent:g} % for relay class {rule.relay_class!r} (upper end of the 95 % range "
            "across networks)")
