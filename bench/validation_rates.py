"""What scaling the NICs down does to stage effects: the bundled plan's stages predicted at the scaled rates
`kistexp simulate --fast` uses (offered traffic fitted into 75 MB/s per network) and at full NIC rates, on
the same sampled networks, seeds and traffic, with samples of about 120, 600 and 2,000 relays at full rates.

For each configuration the plan's runs (``Plan.stage_runs()``; ``--stages`` of them, the baseline first) go
through ``kistexp.population.predict.simulate_plan`` exactly as `kistexp simulate` makes them. A stage's
effect on one network is its median over the baseline's median on that network, minus 1 (relay CPU: the
median relay of a position); the table gives the mean over networks with a 95 % t interval. Run by
``bench/validation.py --rates``, which writes the section into docs/validation.md between its markers;
the raw figures go to bench/history/rates-validation.csv.

    .venv/bin/python bench/validation.py --rates [--configs scaled-120,full-120,full-600,full-2000]
                                                 [--seeds 1,2,3] [--stages 3] [--workers 2] [--from-history]

``--from-history`` writes the section from the latest recorded run of each configuration instead of
running them (configurations can then be run one at a time, e.g. the 2,000-relay one with fewer stages).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import time
from pathlib import Path

import attrs
import numpy as np
from scipy import stats

from kistexp.localnet.machine import cpu_model
from kistexp.plan.loader import load_plan
from kistexp.population.predict import FAST_BYTE_BUDGET, plan_backend, simulate_plan

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "plans" / "kist-run-interval-2020.toml"
HISTORY = ROOT / "bench" / "history" / "rates-validation.csv"
BEGIN, END = "<!-- rates:begin -->", "<!-- rates:end -->"

#: name -> (population scale, byte budget): 0.02, 0.1 and 0.33 of the 6,088-relay consensus sample
#: about 120, 600 and 2,000 relays
CONFIGS = {
    "scaled-120": (0.02, FAST_BYTE_BUDGET),
    "full-120": (0.02, math.inf),
    "full-600": (0.1, math.inf),
    "full-2000": (0.33, math.inf),
}
#: (metric, relay class, quantile) -> row label; client metrics have no class. Quiet-circuit latency at its
#: 90th percentile: most quiet cells wait no time at all, so its median is 0 at 2 ms and no ratio
ROWS = (
    ("client_ttlb_50kib_s", "", 0.5, "TTLB 50 KiB"),
    ("client_ttlb_1mib_s", "", 0.5, "TTLB 1 MiB"),
    ("client_ttlb_5mib_s", "", 0.5, "TTLB 5 MiB"),
    ("client_throughput_mbytes_per_s", "", 0.5, "throughput"),
    ("quiet_circuit_latency_ms", "", 0.9, "quiet-circuit latency, p90"),
    ("relay_cpu_utilization", "guard", 0.5, "relay CPU, guards"),
    ("relay_cpu_utilization", "middle", 0.5, "relay CPU, middles"),
    ("relay_cpu_utilization", "exit", 0.5, "relay CPU, exits"),
)


@attrs.frozen
class Effect:
    config: str
    stage: str
    row: str
    per_network: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.per_network)) if self.per_network else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        v = np.asarray(self.per_network)
        if len(v) < 2 or np.ptp(v) == 0:
            return self.mean, self.mean
        ci = stats.ttest_1samp(v, 0.0).confidence_interval(0.95)
        return float(ci.low), float(ci.high)


def effects(config: str, prediction, stages: list[str]) -> list[Effect]:
    at: dict[tuple[str, str, str, float], dict[int, float]] = {}
    for p in prediction.predictions:
        if p.quantile in (0.5, 0.9):
            at.setdefault((p.stage, p.metric, p.relay_class, p.quantile), {})[p.network] = p.value
    out = []
    for stage in stages:
        for metric, cls, q, label in ROWS:
            base, run = at.get(("baseline", metric, cls, q), {}), at.get((stage, metric, cls, q), {})
            nets = sorted(n for n in set(base) & set(run) if base[n])
            out.append(Effect(config, stage, label, tuple(run[n] / base[n] - 1 for n in nets)))
    return out


def run(configs: list[str], seeds: tuple[int, ...], stages: int, workers: int) -> tuple[list[Effect], dict]:
    plan = load_plan(PLAN)
    runs = plan.stage_runs()
    runs = attrs.evolve(runs, transitions=runs.transitions[:stages], seeds=seeds)
    names = [t.to_stage for t in runs.transitions if t.to_stage != "baseline"]
    out: list[Effect] = []
    info: dict[str, dict] = {}
    for name in configs:
        scale, budget = CONFIGS[name]
        backend = plan_backend(workers)
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        try:
            pred = simulate_plan(attrs.evolve(runs, population_scale=scale), byte_budget=budget, backend=backend)
        finally:
            backend.close()
        info[name] = {"relays": pred.relays_per_network, "nic": pred.bandwidth_scale,
                      "utilisation": pred.achieved_utilisation, "wall_s": time.perf_counter() - wall0,
                      "cpu_s_parent": time.process_time() - cpu0}
        got = effects(name, pred, names)
        out += got
        print(f"{name}: relays {pred.relays_per_network}, NICs x {[round(x, 3) for x in pred.bandwidth_scale]}, "
              f"{info[name]['wall_s']:.0f} s wall", flush=True)
        for e in got:
            lo, hi = e.interval
            print(f"  {e.stage:>6} {e.row:<24} {100 * e.mean:+6.1f} % [{100 * lo:+.1f}, {100 * hi:+.1f}]", flush=True)
        _history(name, got, info[name], seeds)
    return out, info


def _history(name: str, got: list[Effect], info: dict, seeds) -> None:
    new = not HISTORY.exists()
    with HISTORY.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["date", "cpu", "config", "seeds", "relays", "stage", "row", "mean", "low", "high",
                        "per_network", "wall_s", "nic_min", "nic_max"])
        when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        for e in got:
            lo, hi = e.interval
            w.writerow([when, cpu_model(), name, " ".join(map(str, seeds)), " ".join(map(str, info["relays"])),
                        e.stage, e.row, f"{e.mean:.5f}", f"{lo:.5f}", f"{hi:.5f}",
                        " ".join(f"{x:.5f}" for x in e.per_network), f"{info['wall_s']:.0f}",
                        f"{min(info['nic']):.4f}", f"{max(info['nic']):.4f}"])


def _cell(e: Effect | None) -> str:
    if e is None or not e.per_network:
        return "n/a"
    lo, hi = e.interval
    return f"{100 * e.mean:+.1f} % [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def agree(a: Effect, ref: Effect) -> bool:
    """``a``'s mean lies within ``ref``'s interval, or ``ref``'s within ``a``'s."""
    (alo, ahi), (rlo, rhi) = a.interval, ref.interval
    return rlo <= a.mean <= rhi or alo <= ref.mean <= ahi


def section(found: list[Effect], info: dict, seeds, default: str, reason: str) -> str:
    configs = list(info)
    by = {(e.config, e.stage, e.row): e for e in found}
    stages = list(dict.fromkeys(e.stage for e in found))
    lines = [BEGIN, "## Scaled against full NIC rates", "",
             f"Written by `bench/validation.py --rates` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
             f"({cpu_model()}). The bundled plan's stages on the same sampled networks (seeds "
             f"{', '.join(map(str, seeds))}), traffic and values, predicted as `kistexp simulate` predicts them: "
             "NICs scaled down so that the offered traffic fits 75 MB/s per network (`--fast`) and at full NIC "
             "rates, with samples of about 120, 600 and 2,000 relays. Each cell: the stage's effect (its median, "
             "or p90 where named, "
             "over the baseline's, per network, minus 1), mean over networks [95 % t interval].", ""]
    head = "| stage | measure | " + " | ".join(
        f"{c} ({', '.join(map(str, info[c]['relays']))} relays; NICs x "
        f"{min(info[c]['nic']):.2g}-{max(info[c]['nic']):.2g})" for c in configs) + " |"
    lines += [head, "|---|---|" + "---|" * len(configs)]
    for s in stages:
        for *_, row in ROWS:
            lines.append(f"| {s} | {row} | " + " | ".join(_cell(by.get((c, s, row))) for c in configs) + " |")
    fulls = [c for c in configs if c.startswith("full-")]
    for c in (c for c in configs if not c.startswith("full-")):
        if not fulls:
            break
        ref = fulls[-1]
        off = [f"{s} {r} ({_cell(by[(c, s, r)])} against {_cell(by[(ref, s, r)])})" for s in stages
               for *_, r in ROWS if (c, s, r) in by and (ref, s, r) in by and not agree(by[(c, s, r)], by[(ref, s, r)])]
        lines += ["", f"**{c} against {ref}**: " + (f"disagrees on {'; '.join(off)}." if off else
                                                   "agrees on every effect.")]
    lines += ["", "Wall time per configuration (2 worker processes): " + ", ".join(
        f"{c} {info[c]['wall_s']:.0f} s" for c in configs) + ".", "",
        f"**Default chosen: {default}.** {reason}", "", END]
    return "\n".join(lines)


def width(e: Effect) -> float:
    lo, hi = e.interval
    return hi - lo


def choose(found: list[Effect], info: dict) -> tuple[str, str]:
    """The smallest full-rate sample whose effects all agree with the largest full-rate sample's (its mean
    inside that one's interval or the reverse); where its intervals are much wider than the largest's
    (more than twice, plus 5 points), the reason says so: agreement is what decides, precision is what a
    plan buys with more seeds or a larger sample."""
    fulls = [c for c in info if c.startswith("full-")]
    if not fulls:
        return "n/a", "no full-rate configuration was run."
    ref = fulls[-1]
    by = {(e.config, e.stage, e.row): e for e in found}
    keys = [(e.stage, e.row) for e in found if e.config == ref]
    notes = []
    for c in fulls:
        pairs = [(s, r, by[(c, s, r)], by[(ref, s, r)]) for s, r in keys if (c, s, r) in by]
        off = [f"{s} {r}" for s, r, e, f in pairs if not agree(e, f)]
        if off:
            notes.append(f"{c} disagrees with {ref} on {', '.join(off)}.")
            continue
        loose = [f"{s} {r} ({100 * width(e):.0f} points wide against {100 * width(f):.0f})"
                 for s, r, e, f in pairs if width(e) > 2 * width(f) + 0.05]
        why = (f"every effect at {c} agrees with {ref} within their intervals (each mean inside the other's "
               f"interval), in direction and size." + (" " + " ".join(notes) if notes else ""))
        if loose and c != ref:
            why += (f" Its intervals over {len(info[c]['relays'])} networks are wider, though: "
                    f"{'; '.join(loose)}: a plan that needs those effects precisely raises its seeds or "
                    "population_scale.")
        return c, why
    return ref, " ".join(notes)


def from_history(configs: list[str], path: Path = HISTORY) -> tuple[list[Effect], dict, tuple[int, ...]]:
    """The latest recorded run of each of ``configs`` (bench/history/rates-validation.csv), as ``run``
    returns them: configurations run at different times (the 2,000-relay one takes an hour) make one
    table."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    found: list[Effect] = []
    info: dict[str, dict] = {}
    seeds: tuple[int, ...] = ()
    for name in configs:
        mine = [r for r in rows if r["config"] == name]
        if not mine:
            raise SystemExit(f"{path}: no recorded run of {name}: run bench/validation.py --rates --configs {name}")
        last = max(r["date"] for r in mine)
        mine = [r for r in mine if r["date"] == last]
        r0 = mine[0]
        seeds = tuple(int(x) for x in r0["seeds"].split())
        info[name] = {"relays": tuple(int(x) for x in r0["relays"].split()), "wall_s": float(r0["wall_s"]),
                      "nic": (float(r0["nic_min"]), float(r0["nic_max"]))}
        found += [Effect(name, r["stage"], r["row"], tuple(float(x) for x in r["per_network"].split()))
                  for r in mine]
    return found, info, seeds


def write(doc: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """``text`` (which starts with ``begin`` and ends with ``end``) in place of the page's section between
    those markers, or at its end; the rest of the page kept."""
    old = doc.read_text() if doc.exists() else ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + text + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(new)
