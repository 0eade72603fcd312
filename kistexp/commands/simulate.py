"""`kistexp simulate PLAN`: predict every stage of a plan on sampled relay populations
(docs/population.md, "Stage predictions")."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kistexp.metrics import catalogue
from kistexp.output import console, emit_json, plain, progress_bar, say, visible


def _fmt(value: float, factor: float) -> str:
    v = value * factor
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _change(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f} %"


def _figure_dict(f) -> dict:
    return {"stage": f.stage, "metric": f.metric, "relay_class": f.relay_class, "median": f.median,
            "low_2_5": f.low, "high_97_5": f.high, "networks": f.networks, "change_vs_baseline": f.change}


def _signed(v: float) -> str:
    if v != v:  # nan: one network, no interval
        return "n/a"
    return f"{v:+.3f}" if v == 0 or abs(v) >= 0.001 else f"{v:+.1e}"


def _attack_dict(f) -> dict:
    """One stage's measure against the baseline (``kistexp.anonymity.AttackFigure``) as JSON: NaN as null."""
    m = catalogue.attack_measure(f.measure)
    d = f.difference

    def num(v: float) -> float | None:
        return None if v != v else v

    return {"stage": f.stage, "measure": f.measure, "label": m.label if m else f.measure,
            "unit": m.unit if m else "ratio", "leakier_when": "higher" if (m.leakier if m else 1) > 0 else "lower",
            "networks": d.units, "baseline_mean": num(d.baseline_mean), "stage_mean": num(d.stage_mean),
            "mean_difference": num(d.mean_difference), "low_2_5": num(d.low), "high_97_5": num(d.high),
            "leakier": f.leakier}


def _print_attacks(plan_name: str, stages: list[str], attack_figures) -> None:
    """The table "What an attacker gains": per measure and stage, the mean over networks of stage minus
    baseline with its 95 % interval, marked where the whole interval lies on the leakier side."""
    shown = [s for s in stages if s != "baseline" and any(f.stage == s for f in attack_figures)]
    if not shown:
        console.print(plain(f"{plan_name}: what an attacker gains: no attack measures (the stage windows hold "
                            "no whole second of trace)"))
        return
    sep = "\n" if console.width < 160 else " "
    by = {(f.stage, f.measure): f for f in attack_figures}
    rows = []
    for measure in dict.fromkeys(f.measure for f in attack_figures):
        m = catalogue.attack_measure(measure)
        label = m.label if m else measure
        way = "higher" if (m.leakier if m else 1) > 0 else "lower"
        cells = {}
        for s in shown:
            f = by.get((s, measure))
            if f is None:
                cells[s] = "-"
                continue
            d = f.difference
            cells[s] = sep.join([_signed(d.mean_difference), f"[{_signed(d.low)}, {_signed(d.high)}]"]
                                + (["LEAKIER"] if f.leakier else []))
        rows.append((f"{label}{sep}({m.unit if m else 'ratio'}; leakier {way})", cells))
    for t in _tables(f"{plan_name}: what an attacker gains (stage - baseline, mean over networks [95 % interval]; "
                     "LEAKIER: the whole interval on the attacker's side)", "measure", rows, shown):
        console.print(t)


def _heading(stage: str) -> Text:
    # "transition:back-to-10ms" on two lines: the column is as wide as the stage's name (the plan's text,
    # its control characters made visible)
    return Text(visible(stage).replace("transition:", "transition:\n", 1))


def _width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _tables(title: str, label: str, rows: list[tuple[str, dict[str, str]]], stages: list[str]) -> list[Table]:
    """One table of ``rows`` (label, {stage: cell}) over ``stages``; when it would not fit the console, the
    stage columns are split over several tables, each repeating the label column, so no label or cell is
    cut (every cell keeps its lines whole)."""
    # relay classes come from the predictions' rows: text, their control characters made visible (the
    # cells' own line breaks kept)
    rows = [(visible(name, keep="\n"), {s: visible(c, keep="\n") for s, c in cells.items()}) for name, cells in rows]
    label_w = max([_width(label), *(_width(r) for r, _ in rows)])
    widths = {s: max([_width(_heading(s).plain), *(_width(c.get(s, "-")) for _, c in rows)]) for s in stages}
    room = console.width - label_w - 2
    chunks: list[list[str]] = [[]]
    used = 0
    for s in stages:
        if chunks[-1] and used + widths[s] + 2 > room:
            chunks.append([])
            used = 0
        chunks[-1].append(s)
        used += widths[s] + 2
    out = []
    for i, chunk in enumerate(chunks):
        more = f" ({i + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        t = Table(title=plain(title + more), box=None, title_justify="left")
        t.add_column(label, no_wrap=True, min_width=min(label_w, console.width // 2), overflow="fold")
        for s in chunk:
            t.add_column(_heading(s), justify="right", no_wrap=True)
        for name, cells in rows:
            t.add_row(Text(name), *(Text(cells.get(s, "-")) for s in chunk))
        out.append(t)
    return out


def _print(plan_name: str, stages: list[str], figures, header: Text, classes: int) -> None:
    console.print(header)
    by = {(f.stage, f.metric, f.relay_class): f for f in figures}
    # narrow consoles: each figure on lines of its own (median / [95 % range] / change), so columns are narrow
    sep = "\n" if console.width < 160 else " "
    rows = []
    for metric in catalogue.simulated():
        if metric.startswith("relay_"):
            continue
        unit, factor = catalogue.display(metric)
        cells = {}
        for s in stages:
            f = by.get((s, metric, ""))
            cells[s] = "-" if f is None else sep.join(
                x for x in (_fmt(f.median, factor), f"[{_fmt(f.low, factor)}, {_fmt(f.high, factor)}]",
                            _change(f.change)) if x)
        rows.append((f"{metric}{sep}({unit})", cells))
    for t in _tables(f"{plan_name}: clients (median over networks [95 % range], change vs baseline)", "metric",
                     rows, stages):
        console.print(t)
    groups = [c for c in dict.fromkeys(f.relay_class for f in figures if f.relay_class)]
    shown = [g for g in groups if g == "all" or " HZ=" in g and len(g.split()) == 2]
    fine = [g for g in groups if g.count(" ") >= 3]
    fine.sort(key=lambda g: -sum(1 for f in figures if f.relay_class == g))
    for metric in ("relay_cpu_utilization", "relay_rss_bytes", "relay_bandwidth_bytes_per_s",
                   "relay_kernel_queue_bytes"):
        unit, factor = catalogue.display(metric)
        rows = []
        for g in shown + fine[:classes]:
            cells = {}
            for s in stages:
                f = by.get((s, metric, g))
                cells[s] = "-" if f is None else sep.join(x for x in (_fmt(f.median, factor), _change(f.change)) if x)
            rows.append((g, cells))
        for t in _tables(f"{metric} ({unit}) per relay class", "relay class", rows, stages):
            console.print(t)


def _notice(bar, message: str) -> None:  # noqa: ANN001
    """A line on stderr, shown at a terminal (above the bar) and in a pipe alike."""
    if bar.live.is_started:
        bar.console.print(f"kistexp: {message}", markup=False, highlight=False)
    else:
        say(f"kistexp: {message}", err=True)


def simulate(
    plan: Path = typer.Argument(..., help="Experiment plan (TOML) with a [simulation] table."),
    exp_dir: Path = typer.Option(None, "--dir", help="Experiment directory for the predictions "
                                 "(default: experiments/<plan name>)."),
    consensus: Path = typer.Option(None, "--consensus", help="Consensus to sample, ns or microdesc, plain or xz "
                                   "(default: the bundled 2022-11-19 one; kistexp consensus fetch gets today's)."),
    certs: Path = typer.Option(None, "--certs", help="Authority key certificates: refuse a --consensus the pinned "
                               "authorities did not sign."),
    load: float = typer.Option(0.4, "--load", help="Target mean relay utilisation, in (0, 1)."),
    loss: float = typer.Option(0.0, "--loss", help="Packet loss rate on every link, in [0, 0.5)."),
    stored: bool = typer.Option(False, "--stored", help="Print the predictions stored in --dir; run nothing."),
    classes: int = typer.Option(6, "--classes", help="Fine relay classes shown per table."),
    workers: int = typer.Option(None, "--workers", help="Local worker processes (default: CPU count)."),
    dask: str = typer.Option(None, "--dask", metavar="ADDRESS",
                             help="Run on an existing Dask scheduler, e.g. tcp://10.0.0.5:8786."),
    dask_timeout: float = typer.Option(10.0, "--dask-timeout", help="Seconds to wait for the Dask scheduler."),
    probes: int = typer.Option(0, "--probes", help="Throughput-fingerprinting probes per network (attacker "
                               "clients that load the relays they measure, so every figure is of the probed "
                               "network; default 0: no fingerprinting measures)."),
    fast: bool = typer.Option(False, "--fast", help="Scale the NICs down so that the offered traffic fits 75 MB/s "
                              "per network: minutes faster, but each relay moves fewer cells per scheduler run, "
                              "which shrinks a run-interval change's effects (docs/validation.md); the experiment, "
                              "report and announcement say so."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Run the baseline and every stage (switchback: treatment and control) on the plan's sampled networks;
    print medians with 95 % ranges over networks, per relay class for relay costs, and save the
    predicted distributions in the experiment directory, with what an attacker gains at each stage
    (docs/anonymity.md). Each network x stage is one run, on local worker processes or a Dask cluster as
    `kistexp sweep` runs its cells."""
    import attrs

    from kistexp.anonymity import stage_differences
    from kistexp.errors import PopulationError
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore
    from kistexp.plan.loader import load_plan
    from kistexp.population import predict
    from kistexp.population.dispatch import check_options
    from kistexp.population.predict import (
        check_experiment_dir,
        save_plan_predictions,
        simulate_plan,
        summarize_predictions,
    )
    from kistexp.population.simnet import TrafficModel
    from kistexp.population.stageruns import default_warmup_s

    p = load_plan(plan)
    path = exp_dir if exp_dir is not None else Path("experiments") / p.name
    stages = list(p.stage_runs().stages)
    order = stages + [f"transition:{s}" for s in stages]
    if stored:
        exp = ExperimentDir.open(path)
        store = MetricStore(exp.db)
        rows = store.load_predictions()
        figures = summarize_predictions(rows, stages)
        attack_figures = stage_differences(store.load_attack_values(), stages)
        if as_json:
            emit_json({"plan": p.name, "dir": str(path), "stages": stages,
                       "figures": [_figure_dict(f) for f in figures],
                       "attack_figures": [_attack_dict(f) for f in attack_figures]})
        else:
            _print(p.name, order, figures, plain(p.name, "bold").append_text(plain(f": stored predictions in {path}")),
                   classes)
            _print_attacks(p.name, stages, attack_figures)
        return
    duration = p.simulation.duration.total_seconds()
    traffic = TrafficModel(load=load, loss_rate=loss, warmup_s=default_warmup_s(duration))
    traffic.validate()
    check_options(workers, dask, dask_timeout)  # as `kistexp sweep` checks them
    if not 0 <= probes <= predict.MAX_PROBES:
        raise PopulationError(f"--probes {probes}: must be in 0..{predict.MAX_PROBES}")
    check_experiment_dir(path)  # nothing is written until every prediction is made
    backend = predict.plan_backend(workers, dask, dask_timeout)  # a Dask scheduler must answer now
    try:
        with progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                          TimeElapsedColumn(), as_json=as_json) as bar:
            task = bar.add_task("loading the consensus", total=1.0)
            result = simulate_plan(p.stage_runs(), consensus=consensus, certs=certs, traffic=traffic,
                                   backend=backend, probes=probes,
                                   byte_budget=predict.FAST_BYTE_BUDGET if fast else predict.FULL_RATES,
                                   progress=lambda f, what: bar.update(task, completed=f, description=what),
                                   notify=lambda message: _notice(bar, message))
    finally:
        backend.close()
    save_plan_predictions(path, plan, result.predictions, result.attack_values,
                          predict.prediction_run(result, p.simulation.population_scale))
    if as_json:
        out = attrs.asdict(result, filter=lambda a, _v: a.name not in ("predictions", "figures", "attack_values",
                                                                       "attack_figures"))
        out["dir"] = str(path)
        out["figures"] = [_figure_dict(f) for f in result.figures]
        out["attack_figures"] = [_attack_dict(f) for f in result.attack_figures]
        emit_json(out)
        return
    header = plain(p.name, "bold").append_text(plain(
        f": {result.networks} networks of {', '.join(map(str, result.relays_per_network))} relays and "
        f"{result.clients_per_network[0]} client processes, scale "
        f"{p.simulation.population_scale:g}, {duration:g} s each (warm-up {traffic.warmup_s:g} s), load "
        f"{load:g} (reached {min(result.achieved_utilisation):.2f}-{max(result.achieved_utilisation):.2f}), "
        + (f"fast mode: NICs x {min(result.bandwidth_scale):.2g}-{max(result.bandwidth_scale):.2g}, effects shrunk"
           if result.rates == "fast" else "full NIC rates") + f"; {result.wall_s:.0f} s on {backend.description}; "
        f"{len(result.predictions)} predicted quantiles and {len(result.attack_values)} attack measures saved in "
        f"{path}" + (f"; {probes} fingerprinting probes per network load the relays" if probes else "")))
    _print(p.name, order, result.figures, header, classes)
    _print_attacks(p.name, stages, result.attack_figures)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
