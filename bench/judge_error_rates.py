"""Measured error rates of the rollback judge (issue 10, point 4): the tables of docs/judge.md.

Synthetic data shaped like the real data, seeded:

* client download times: log-normal, log-SD 0.6 (spec judge.md §5.4; the OnionPerf
  files' tgen records are truncated, so the spread is the spec's assumption), 12 samples/h
  from one OnionPerf instance (kistexp/metrics/catalogue.py);
* relay CPU: relay levels log-normal with log-SD 1.15 (relays ~100x apart), each relay's
  change spread 0.2 around the true change, per-minute noise log-SD 0.3.

Tables: one fixed-horizon look at the bundled plans' min_samples (100, 200, 300, 500) with
the analytic forecast the linter uses beside each measured rate; per-relay CPU, paired and
pooled; hourly looks for 14 days (336 looks) with the O'Brien-Fleming-type spending the
judge uses, the mixture confidence sequence and naive fixed-horizon peeking; the real
op-hk6a circuit build times; switchback plans (7 cycles of 24 h periods) judged period
against period with drifting hour effects. Writes the tables between the <!-- table:NAME --> markers of
docs/judge.md and plots docs/img/judge-sequential.png.

    PYTHONPATH=$PWD .venv/bin/python bench/judge_error_rates.py [--seeds 1000] [--only NAME] [--no-write]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import numpy as np
from rich.progress import Progress
from scipy.stats import norm

from kistexp.judge import CriterionSpec, Period, Window, judge, judge_switchback, simulate
from kistexp.judge import estimators as est
from kistexp.judge.inputs import read_samples
from kistexp.stats import power

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "judge.md"
IMG = ROOT / "docs" / "img" / "judge-sequential.png"
HK6A = ROOT.parent / "shared" / "data" / "onionperf" / "2021-06-01.op-hk6a.onionperf.analysis.json.xz"
SIGMA = 0.6
SHIFTS = (0.05, 0.10, 0.15, 0.25)
PLAN_MIN_SAMPLES = (100, 200, 300, 500)  # plans/*.toml
Z = norm.isf(0.05)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def one_look(seeds: int) -> str:
    """P(FAIL) with threshold 0 (any rise is bad): false alarm at no change, power at the shifts."""
    rng = np.random.default_rng(20261201)
    var = power.Variability("continuous", SIGMA, 1.0)
    rows = []
    for statistic in ("median", "mean", "p90"):
        for n in PLAN_MIN_SAMPLES:
            if statistic == "p90" and n < 200:
                continue  # the judge needs n(1 - p) >= 20 per side
            cells = [statistic, str(n)]
            se = power.end_se(statistic, "relative-increase", var, n, n)
            for shift in (0.0, *SHIFTS):
                fail, _ = simulate.one_look(rng, seeds, n, statistic, SIGMA, 1.0 + shift, 0.0)
                forecast = norm.cdf(math.log1p(shift) / se - Z)
                cells.append(f"{_pct(fail)} ({_pct(forecast)})")
            rows.append(cells)
    return _table(["statistic", "n per side", "no change", "+5 %", "+10 %", "+15 %", "+25 %"], rows)


def bootstrap(seeds: int) -> str:
    """The bootstrap-SE option at n = 200: the SE does not move with a scale shift, so one
    bootstrap per seed serves every shift."""
    rng = np.random.default_rng(20261204)
    n = 200
    thetas, ses = np.empty(seeds), np.empty(seeds)
    for i in range(seeds):
        base = simulate.lognormal(rng, (n,), SIGMA)
        stage = simulate.lognormal(rng, (n,), SIGMA)
        e = est.bootstrap_two_sample(stage, base, "median", True, seed=i)
        thetas[i], ses[i] = e.theta, e.se
    cells = ["median, bootstrap SE", str(n)]
    for shift in (0.0, *SHIFTS):
        out = simulate.classify(thetas + math.log1p(shift), ses, 0.0, Z, Z)
        cells.append(_pct(float(np.mean(out == simulate.FAIL))))
    return _table(["statistic", "n per side", "no change", "+5 %", "+10 %", "+15 %", "+25 %"], [cells])


def relays(seeds: int) -> str:
    rng = np.random.default_rng(20261202)
    rows = []
    for n_relays, total in ((20, 300), (20, 500), (50, 500), (100, 500)):
        per_relay = max(2, total // n_relays)
        var = power.Variability("relay", 0.3, 1.0, spread=0.2, relays=n_relays)
        se = power.end_se("mean", "relative-increase", var, n_relays * per_relay, n_relays * per_relay)
        c = Z * power.t_dist.isf(0.05, n_relays - 1) / Z
        for pooled in (False, True):
            cells = [str(n_relays), str(per_relay), "pooled" if pooled else "paired"]
            for shift in (0.0, *SHIFTS):
                fail, _ = simulate.paired_relays(rng, seeds, n_relays, per_relay, 1.0 + shift, 0.0, pooled=pooled)
                if pooled:
                    cells.append(_pct(fail))
                else:
                    cells.append(f"{_pct(fail)} ({_pct(norm.cdf(math.log1p(shift) / se - c))})")
            rows.append(cells)
    return _table(["relays", "samples/relay/side", "comparison", "no change", "+5 %", "+10 %", "+15 %", "+25 %"],
                  rows)


def sequential(seeds: int):
    ratios = tuple(1.0 + x for x in (0.0, 0.025, 0.05, 0.075, 0.10, 0.125, 0.15, 0.20, 0.25))
    with Progress(transient=True) as bar:
        task = bar.add_task("336 hourly looks", total=None)
        res = simulate.sequential_looks(np.random.default_rng(20261203), seeds, ratios=ratios,
                                        threshold=(0.0, 0.10), methods=("obf", "mixture", "naive"),
                                        progress=lambda i, n: bar.update(task, completed=i, total=n))
    by = {(r.method, round(r.ratio, 3), r.threshold): r for r in res}
    names = {"obf": "OBF spending (judge default)", "mixture": "mixture CS", "naive": "naive 1.645 every hour"}

    def hours(x):
        return "-" if x is None else f"{x:.0f} h"

    rows = []
    for m in ("obf", "mixture", "naive"):
        r = by[(m, 1.0, 0.0)]
        rows.append([names[m], "0 (any rise)", "no change", f"{_pct(r.fail)} ± {_pct(2 * _se(r.fail, seeds))}",
                     _pct(r.passed), hours(r.median_fail_hour)])
        for ratio in (1.0, 1.05, 1.10, 1.15, 1.25):
            r = by[(m, ratio, 0.10)]
            fail = _pct(r.fail) + (f" ± {_pct(2 * _se(r.fail, seeds))}" if ratio == 1.10 else "")
            rows.append([names[m], "10 %", f"+{round(100 * (ratio - 1))} %", fail, _pct(r.passed),
                         f"{hours(r.median_fail_hour)} / {hours(r.median_pass_hour)}"])
    table = _table(["method", "threshold", "true change", "FAIL (± 2 SE)", "PASS", "median hour FAIL / PASS"],
                   rows)
    _plot(by, ratios)
    return table


def _plot(by, ratios) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [100 * (r - 1) for r in ratios]
    for m, style in (("obf", "-"), ("mixture", "--"), ("naive", ":")):
        ax.plot(x, [100 * by[(m, round(r, 3), 0.10)].fail for r in ratios], "r" + style, label=f"FAIL, {m}")
        ax.plot(x, [100 * by[(m, round(r, 3), 0.10)].passed for r in ratios], "g" + style, label=f"PASS, {m}")
    ax.axvline(10, color="grey", lw=0.8)
    ax.axhline(5, color="grey", lw=0.8)
    ax.set_xlabel("true change of the median (%), threshold 10 %")
    ax.set_ylabel("share of 14-day stages (%)")
    ax.set_title("Hourly looks for 14 days: first decision")
    ax.legend(fontsize=7, ncol=3)
    IMG.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(IMG, dpi=110)
    plt.close(fig)


def real_build_times() -> str:
    w = read_samples(f"{HK6A}@build-time")
    order = np.argsort(w.times, kind="stable")
    t, x = w.times[order], w.values[order]
    hour = (t // 3600) % 24
    base = Window(x[0::2], t[0::2])
    cases = [("interleaved halves", base, Window(x[1::2], t[1::2])),
             ("interleaved halves, stage +20 %", base, Window(x[1::2] * 1.2, t[1::2])),
             ("12-24 UTC vs 00-12 UTC", Window(x[hour < 12], t[hour < 12]), Window(x[hour >= 12], t[hour >= 12]))]
    rows = []
    for statistic in ("median", "mean", "p90", "shift"):
        crit = CriterionSpec(statistic, "relative-increase", 0.10, 200)
        for name, b, s in cases:
            v = judge(crit, b, s)
            ci = "-" if v.ci_low is None else f"[{v.ci_low:.3f}, {v.ci_high:.3f}]"
            eff = "-" if v.effect is None else f"{v.effect:.3f}"
            verdict = v.outcome.upper() + (f" ({v.reason})" if v.reason and v.reason != "undecided" else "")
            rows.append([statistic, name, verdict, eff, ci, f"{v.n_baseline} / {v.n_stage}"])
    return _table(["statistic", "windows", "verdict", "ratio", "90 % interval", "n baseline / stage"], rows)


def _switchback_periods(rng, factor: float, cycles: int = 7, per_hour: int = 12, washout_h: int = 2
                        ) -> list[Period]:
    """24 h periods with a random start arm, an hour-of-day cycle (afternoons ~10 % slower,
    as op-hk6a) and AR(1) hour effects (φ 0.8, SD 0.06; spec §5.4 rule 3) that carry
    across periods; the washout hours are left out as the judge would."""
    hours = 2 * cycles * 24
    eps = rng.normal(0.0, 0.06 * math.sqrt(1 - 0.8 ** 2), hours)
    ar = np.empty(hours)
    ar[0] = rng.normal(0.0, 0.06)
    for h in range(1, hours):
        ar[h] = 0.8 * ar[h - 1] + eps[h]
    level = ar + 0.05 * -np.cos(2 * np.pi * (np.arange(hours) % 24 - 6) / 24)
    first = rng.integers(2)
    out = []
    for i in range(2 * cycles):
        arm = ("treatment", "control")[(i + first) % 2]
        hs = np.arange(i * 24 + washout_h, (i + 1) * 24)
        y = np.repeat(level[hs], per_hour) + rng.normal(0.0, SIGMA, hs.size * per_hour)
        x = np.exp(y) * (factor if arm == "treatment" else 1.0)
        out.append(Period(arm, x, i * 86400.0, (i + 1) * 86400.0))
    return out


def switchback(seeds: int) -> str:
    """FAIL/PASS of switchback plans, fixed look after 7 cycles and looks at each cycle end."""
    cases = [(0.0, 0.0), (0.10, 0.0), (0.10, 0.05), (0.10, 0.10), (0.10, 0.15), (0.10, 0.25)]
    rows = []
    with Progress(transient=True) as bar:
        task = bar.add_task("switchback", total=len(cases) * seeds)
        for thr, true in cases:
            crit = CriterionSpec("median", "relative-increase", thr, 100)
            fixed = {"fail": 0, "pass": 0, "inconclusive": 0}
            seq = {"fail": 0, "pass": 0, "inconclusive": 0}
            for seed in range(seeds):
                periods = _switchback_periods(np.random.default_rng([seed, int(1000 * thr), int(1000 * true)]),
                                              1.0 + true)
                fixed[judge_switchback(crit, periods).outcome] += 1
                state, v = None, None
                for k in range(4, 8):  # decisions need 4 cycles (MIN_CYCLES)
                    v = judge_switchback(crit, periods[: 2 * k], planned_cycles=None if state else 7,
                                         sequential_state=state, final=k == 7)
                    state = v.state or state
                    if v.outcome != "inconclusive":
                        break
                seq[v.outcome] += 1
                bar.advance(task)
            bad = thr == 0.0 or true == thr  # every FAIL is a false alarm
            for name, c in (("fixed, after 7 cycles", fixed), ("looks at cycle ends (OBF)", seq)):
                f, pa = c["fail"] / seeds, c["pass"] / seeds
                rows.append([name, "0 (any rise)" if thr == 0 else f"{thr:.0%}".replace("%", " %"),
                             "no change" if true == 0 and thr == 0 else f"+{true:.0%}".replace("%", " %"),
                             _pct(f) + (f" ± {_pct(2 * _se(f, seeds))}" if bad else ""), _pct(pa)])
    return _table(["analysis", "threshold", "true change", "FAIL", "PASS"], rows)


def update_doc(tables: dict[str, str]) -> None:
    text = DOC.read_text()
    for name, table in tables.items():
        pattern = re.compile(rf"(<!-- table:{re.escape(name)} -->\n).*?(\n<!-- /table:{re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            sys.exit(f"{DOC}: no <!-- table:{name} --> marker")
        text = pattern.sub(lambda m, t=table: m.group(1) + t + m.group(2), text)
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2000,
                    help="replications (at least 1,000): the bootstrap table; 2x for the others")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/judge.md alone")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="make only this table (repeatable): one-look, bootstrap, relays, sequential, real, switchback")
    args = ap.parse_args()
    if args.seeds < 1000:
        sys.exit("--seeds: at least 1,000 replications")
    tables = {}
    for name, fn in (("one-look", lambda: one_look(2 * args.seeds)), ("bootstrap", lambda: bootstrap(args.seeds)),
                     ("relays", lambda: relays(2 * args.seeds)),
                     ("sequential", lambda: sequential(2 * args.seeds)), ("real", real_build_times),
                     ("switchback", lambda: switchback(args.seeds))):
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        tables[name] = fn()
        print(f"{tables[name]}\n{name}: {time.perf_counter() - t0:.1f} s\n", flush=True)
    if not args.no_write:
        update_doc(tables)


if __name__ == "__main__":
    main()
