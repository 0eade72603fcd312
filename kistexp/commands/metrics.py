"""`kistexp metrics import|list|show|params`: collect real measurements into an
experiment directory and look at them (docs/metrics.md)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from kistexp.errors import KistexpError
from kistexp.metrics import catalogue
from kistexp.output import add_row, emit_json, make_table, print_table, progress_bar, say, visible

# Sources, labels and problems come from imported files and servers: every table cell and line is
# plain text (kistexp.output), never markup or escape sequences.
_FOLD = {"overflow": "fold"}

metrics_app = typer.Typer(help="Collect measurements (OnionPerf, MetricsPort, consensus archives, operator "
                               "reports) into an experiment directory and show them.", no_args_is_help=True)

_DIR = typer.Option(..., "--dir", help="Experiment directory (created by import if it does not exist).")
_JSON = typer.Option(False, "--json", help="Machine-readable output.")
# Problems printed one per line; a file with 100,000 bad rows gets the first ones and a count.
_MAX_WARNINGS = 50


def register(app: typer.Typer) -> None:
    app.add_typer(metrics_app, name="metrics")


def _labels(items: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KistexpError(f"{option} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _time(text: str | None, option: str) -> dt.datetime | None:
    if text is None:
        return None
    raw = text.strip()
    try:
        t = dt.datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)
    except ValueError:
        raise KistexpError(f"{option} {text!r}: not an ISO 8601 time (e.g. 2026-03-01T12:00:00Z)") from None
    try:
        return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)
    except OverflowError:  # 0001-01-01T00:00+05:00 is before year 1 in UTC
        raise KistexpError(f"{option} {text!r}: outside years 1 to 9999 in UTC") from None


def _fmt(t: dt.datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


@metrics_app.command("import")
def import_cmd(
    sources: list[str] = typer.Argument(..., help="Files, directories, tarballs, URLs or proc:PID."),
    exp_dir: Path = _DIR,
    kind: str | None = typer.Option(None, "--kind", help="Source kind if not detected: onionperf, "
                                    "operator-report, consensus-archive, metricsport, prometheus, proc."),
    label: list[str] = typer.Option(None, "--label", help="KEY=VALUE added to every sample (e.g. relay=FPR, "
                                    "position=guard); repeatable."),
    param_value: int | None = typer.Option(None, "--param-value", help="Consensus value in effect for every "
                                           "imported sample, if known."),
    param: str | None = typer.Option(None, "--param", help="Consensus parameter whose value in effect each "
                                     "sample gets from the experiment's consensus history (unknown while a "
                                     "change propagates)."),
    honour_filters: bool = typer.Option(False, "--honour-filters", help="OnionPerf: leave out what the file's "
                                        "filters (e.g. exclude_cbt) mark filtered_out."),
    certs: Path | None = typer.Option(None, "--certs", help="Consensus archives: authority key certificates "
                                      "(e.g. tor's cached-certs), besides any in the archive."),
    trust: list[str] = typer.Option(None, "--trust", help="Consensus archives: a trusted authority v3ident "
                                    "(repeatable; default: today's nine authorities)."),
    consensus: Path | None = typer.Option(None, "--consensus", help="Operator reports: refuse relays not in "
                                          "this consensus and label rows with their position (guard, exit, ...)."),
    scrapes: int = typer.Option(2, "--scrapes", help="Live sources: number of scrapes (samples are changes "
                                "between two)."),
    interval: float = typer.Option(10.0, "--interval", help="Live sources: seconds between scrapes."),
    group: str = typer.Option("tor", "--group", help="process-exporter group name of the tor process."),
    as_json: bool = _JSON,
) -> None:
    """Import measurements into the experiment directory's database."""
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics import importer
    from kistexp.metrics.store import MetricStore

    opts = importer.ImportOptions(labels=_labels(label, "--label"), param_value=param_value, param_name=param,
                                  honour_filters=honour_filters, certificates=certs,
                                  trusted=tuple(trust) if trust else None, consensus=consensus,
                                  scrapes=scrapes, interval_s=interval, group=group)
    if kind is not None and kind not in importer.KINDS:
        raise KistexpError(f"--kind {kind!r}: unknown (known: {', '.join(importer.KINDS)})")
    with ExperimentDir.open_or_create(exp_dir) as exp:
        store = MetricStore(exp.db)
        quick = len(sources) == 1 and Path(sources[0]).is_file() and kind not in ("metricsport", "prometheus", "proc")
        if as_json or quick:
            results, errors = importer.import_all(store, sources, kind, opts)
        else:
            with progress_bar(TextColumn("[bold]import"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                              TextColumn("{task.description}")) as bar:
                task = bar.add_task("", total=len(sources))
                results, errors = importer.import_all(
                    store, sources, kind, opts,
                    progress=lambda done, total, src: bar.update(task, completed=done, description=src))
    problems = [p for r in results for p in r.problems]
    if as_json:
        emit_json({"directory": str(exp_dir), "imported": [
            {"kind": r.kind, "source": r.location, "samples": dict(r.samples), "consensuses": r.consensuses,
             "votes": r.votes, "skipped_files": r.skipped, "problems": list(r.problems)} for r in results],
            "failed": errors})
    elif results:
        table = make_table(f"Imported into {exp_dir}", [(col, _FOLD) for col in (
            "source", "kind", "samples", "consensuses / votes", "left out")])
        for r in results:
            add_row(table, r.location, r.kind, str(r.n_samples),
                    f"{r.consensuses} / {r.votes}" if r.kind == "consensus-archive" else "-", str(len(r.problems)))
        print_table(table)
    # One line per failed source or record left out, never wrapped: scripts grep these.
    # The first becomes the error the command ends with, the others are warnings.
    messages = errors + problems
    for m in messages[1:_MAX_WARNINGS + 1]:
        print(f"kistexp: warning: {visible(m)}", file=sys.stderr)
    if len(messages) > _MAX_WARNINGS + 1:
        print(f"kistexp: warning: ... and {len(messages) - _MAX_WARNINGS - 1} more (all are kept with the source: "
              "kistexp metrics list --json)", file=sys.stderr)
    if messages:
        more = len(messages) - 1
        kept = sum(r.n_samples for r in results)
        tail = f" ({more} more problem{'s' if more != 1 else ''}; " if more else " ("
        raise KistexpError(f"{messages[0]}{tail}{kept} samples from {len(results)} source(s) imported)")


@metrics_app.command("list")
def list_cmd(exp_dir: Path = _DIR, as_json: bool = _JSON) -> None:
    """What the experiment holds: samples per metric, imported sources, consensuses."""
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore

    with ExperimentDir.open(exp_dir) as exp:
        store = MetricStore(exp.db)
        summary, sources, consensuses = store.summary(), store.sources(), store.consensuses()
        n_votes = len(store.votes())
        n_pred = len(store.load_predictions())
    if as_json:
        emit_json({"metrics": summary, "sources": sources, "consensuses": len(consensuses), "votes": n_votes,
                   "prediction_rows": n_pred})
        return
    table = make_table(f"Metrics in {exp_dir}", [(col, _FOLD) for col in (
        "metric", "shown in", "series", "samples", "first", "last", "consensus values")])
    for m in summary:
        # the unit `metrics show` prints the metric in; --json keeps the stored unit
        add_row(table, m.metric, catalogue.display(m.metric)[0], str(m.n_series), str(m.n_samples), _fmt(m.first),
                _fmt(m.last), ", ".join(map(str, m.param_values)) or "-")
    print_table(table)
    src = make_table("Sources", [(col, _FOLD) for col in ("#", "kind", "source", "imported", "samples", "left out")])
    for s in sources:
        add_row(src, str(s.id), s.kind, s.location, _fmt(s.imported), str(s.n_samples), str(s.n_rejected))
    print_table(src)
    say(f"{len(consensuses)} consensuses, {n_votes} votes, {n_pred} prediction rows")


@metrics_app.command("show")
def show_cmd(
    metric: str = typer.Argument(..., help="A catalogue metric (see docs/metrics.md)."),
    exp_dir: Path = _DIR,
    start: str | None = typer.Option(None, "--from", help="Window start, ISO 8601 UTC (inclusive)."),
    end: str | None = typer.Option(None, "--to", help="Window end, ISO 8601 UTC (exclusive)."),
    label: list[str] = typer.Option(None, "--label", help="Only series with KEY=VALUE; repeatable."),
    param_value: int | None = typer.Option(None, "--param-value", help="Only samples taken while this "
                                           "consensus value was in effect."),
    samples: bool = typer.Option(False, "--samples", help="List every sample, not only per-series figures."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write a plot of the samples over time, one "
                                     "colour per consensus value in effect (PNG, SVG, PDF by suffix)."),
    as_json: bool = _JSON,
) -> None:
    """Per-series figures (count, quantiles) of one metric in a window."""
    import numpy as np

    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore, require_metric

    info = require_metric(metric)
    with ExperimentDir.open(exp_dir) as exp:
        got = MetricStore(exp.db).select(metric, _time(start, "--from"), _time(end, "--to"),
                                         _labels(label, "--label"), param_value)
    if plot is not None:
        from kistexp.metrics.plot import plot_samples

        plot_samples(metric, got, plot)
    groups: dict[tuple, list] = {}
    for s in got:
        groups.setdefault(tuple(sorted(s.labels.items())), []).append(s)
    rows = []
    for key, ss in groups.items():
        v = np.array([s.value for s in ss])
        q = np.quantile(v, [0.1, 0.5, 0.9])
        rows.append({"labels": dict(key), "n": len(ss), "first": ss[0].time, "last": ss[-1].time,
                     "min": float(v.min()), "p10": float(q[0]), "median": float(q[1]), "p90": float(q[2]),
                     "max": float(v.max()), "mean": float(v.mean()),
                     "param_values": sorted({s.param_value for s in ss if s.param_value is not None})})
    if as_json:
        out = {"metric": metric, "unit": info.unit, "series": rows}
        if samples:
            out["samples"] = [{"time": s.time, "value": s.value, "labels": dict(s.labels),
                               "param_value": s.param_value} for s in got]
        emit_json(out)
        return
    if not got:
        say(f"no samples of {metric} in that window")
        return
    # figures in the display unit (CPU in % of one core, bytes in MB), as every table and plot shows them;
    # --json above keeps the stored unit
    unit, factor = catalogue.display(metric)
    table = make_table(f"{metric} ({unit}): {info.meaning}", [(col, _FOLD) for col in (
        "labels", "n", "first", "last", "min", "p10", "median", "p90", "max", "consensus values")])
    for r in rows:
        add_row(table, " ".join(f"{k}={v}" for k, v in r["labels"].items()) or "-", str(r["n"]), _fmt(r["first"]),
                _fmt(r["last"]), *(f"{r[k] * factor:.6g}" for k in ("min", "p10", "median", "p90", "max")),
                ", ".join(map(str, r["param_values"])) or "-")
    print_table(table)
    if samples:
        raw = make_table(f"samples ({unit})", [(col, _FOLD) for col in ("time", "value", "labels", "value in effect")])
        for s in got:
            add_row(raw, s.time.strftime("%Y-%m-%d %H:%M:%S.%f"), f"{s.value * factor:.6g}",
                    " ".join(f"{k}={v}" for k, v in s.labels.items()), str(s.param_value or "-"))
        print_table(raw)


@metrics_app.command("params")
def params_cmd(
    name: str | None = typer.Argument(None, help="A consensus parameter; without it, all that appear."),
    exp_dir: Path = _DIR,
    flavour: str = typer.Option("ns", "--flavour", help="ns or microdesc."),
    as_json: bool = _JSON,
) -> None:
    """History of consensus parameters from imported archives, and what authorities voted."""
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.collectors import consensus_archive as ca
    from kistexp.metrics.store import MetricStore

    with ExperimentDir.open(exp_dir) as exp:
        store = MetricStore(exp.db)
        consensuses, votes = store.consensuses(flavour), store.votes()
    names = [name] if name else ca.param_names(consensuses)
    history = {n: ca.param_history(consensuses, n, flavour) for n in names}
    voted = {n: ca.votes_by_authority(votes, n) for n in names} if votes else {}
    if as_json:
        emit_json({"flavour": flavour, "consensuses": len(consensuses), "history": history,
                   "votes": {n: [{"valid_after": t, "votes": v} for t, v in sorted(d.items())]
                             for n, d in voted.items()}})
        return
    table = make_table(f"Consensus parameters ({flavour}, {len(consensuses)} consensuses)", [(col, _FOLD) for col in (
        "parameter", "value", "from (valid-after)", "to (valid-after)", "consensuses", "note")])
    for n, spans in history.items():
        for s in spans:
            add_row(table, n, "absent (tor default)" if s.value is None else str(s.value), _fmt(s.first),
                    _fmt(s.last), str(s.n_consensuses), "after a missing hour" if s.after_gap else "")
    print_table(table)
    for n, by_time in voted.items():
        if not by_time:
            continue
        # authority nicknames come from the votes' documents
        auths = sorted({a for v in by_time.values() for a in v})
        vt = make_table(f"Votes for {n}", ("valid-after", *auths))
        for t, v in sorted(by_time.items()):
            add_row(vt, _fmt(t), *("-" if v.get(a) is None else str(v[a]) for a in auths))
        print_table(vt)
