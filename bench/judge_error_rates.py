"""Measured error rates of the rollback judge: the tables of docs/judge-error-rates.md.

Synthetic data shaped like the real data, seeded:

* client download times: log-normal, log-SD 0.6 (spec judge.md §5.4; the OnionPerf
  files' tgen records are truncated, so the spread is the spec's assumption);
* relay CPU: relay levels log-normal with log-SD 1.15 (relays ~100x apart), each relay's
  change spread 0.2 around the true change, per-minute noise log-SD 0.3.

Tables:

* ``stages`` (issue 35, point 8): whole stages as the rollout engine runs them. One
  relative-increase criterion (limit 10 %) on 1 MiB download times, 24 samples/h (the
  catalogue's sample model), a 3- or 7-day baseline, the median, mean or p90; iid hours or an
  AR(1) hour effect (phi 0.8, SD 0.06 on the log scale) on top of the iid sample noise; true
  changes of 0, 0.5, 1, 1.5 and 2 times the limit. The stage is as long as lint approves
  (80 % power, kistexp/plan/lint.py) or 14 days where lint approves no length; the judge looks
  every hour of it and of the extension the plan allows, and the stage ends as
  kistexp/rollout/machine.py ends it. P(FAIL), P(PASS), P(inconclusive at the stage's end),
  P(undecided after the longest extension) with Clopper-Pearson 95 % intervals, and the
  median hours to a decision; appended to bench/history/judge-error-rates.csv;
* one fixed-horizon look at the bundled plans' min_samples (100, 200, 300, 500) with the
  analytic forecast the linter uses beside each measured rate; per-relay CPU, paired and
  pooled; hourly looks for 14 days (336 looks) with the O'Brien-Fleming-type spending, the
  mixture confidence sequence and naive fixed-horizon peeking; the real op-hk6a circuit build
  times; switchback plans (7 cycles of 24 h periods) judged period against period with
  drifting hour effects.

Writes the tables between the <!-- table:NAME --> markers of docs/judge-error-rates.md and plots
docs/img/judge-sequential.png.

    PYTHONPATH=$PWD .venv/bin/python bench/judge_error_rates.py [--seeds 1000] [--only NAME] [--no-write]
    PYTHONPATH=$PWD .venv/bin/python bench/judge_error_rates.py --only stages --quick   # 100 seeds, print only
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import functools
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import attrs
import numpy as np
from rich.progress import Progress
from scipy import stats
from scipy.signal import lfilter
from scipy.stats import norm

from kistexp.durations import parse_duration
from kistexp.judge import CriterionSpec, Period, Window, judge, judge_switchback, simulate
from kistexp.judge import estimators as est
from kistexp.judge.core import MAX_QUANTILE_SPAN
from kistexp.judge.inputs import read_samples
from kistexp.judge.multiple import fail_alphas, step_down
from kistexp.localnet.machine import cpu_model
from kistexp.metrics import catalogue
from kistexp.plan import lint
from kistexp.plan.loader import parse_plan
from kistexp.rollout import judging, machine
from kistexp.rollout import state as state_mod
from kistexp.rollout.analysis import FAMILY_ALPHA
from kistexp.rollout.spec import spec_from_plan
from kistexp.stats import power
from kistexp.stats import sequential as seq

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "judge-error-rates.md"
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


# --- stages as the engine runs them (issue 35, point 8) ---------------------------------------------------------
#
# One criterion on 1 MiB download times, judged the way the rollout engine judges it: the plan is real plan text
# read by the loader, the stage length is what lint approves for it, the washout, the decision time, the extension
# budget and the sequential state come from kistexp.rollout (spec_from_plan, planned_state), the sample times from
# judging.judge_input. The judge is asked at every hourly look through the stage and its extension; a FAIL at any
# look rolls back, and at the decision time (and each extension hour) the stage ends as kistexp/rollout/machine.py
# ends it. A stage that does not FAIL runs to its planned end (a PASS before it does not end the stage), so most
# stages need every look: those are computed for all seeds at once, along a leading axis, with the judge's own
# estimators, weights, design effect and boundaries (see _ChunkJudge); --check replays seeds look by look through
# judging.judge_criterion and machine.step and the run reports every disagreement.

STAGE_METRIC = "client_ttlb_1mib_s"
STAGE_LIMIT = 0.10
STAGE_MULTIPLES = (0.0, 0.5, 1.0, 1.5, 2.0)  # the true change as a multiple of the limit
STAGE_CHANGES = tuple(m * STAGE_LIMIT for m in STAGE_MULTIPLES)
STAGE_STATISTICS = ("median", "mean", "p90")
BASELINE_DAYS = (3, 7)
HOUR_KINDS = ("iid", "AR(1)")
# Hour-to-hour drift of the real OnionPerf data (spec judge.md §5.4 rule 3): an AR(1) hour effect on the log scale.
AR_PHI, AR_SD = 0.8, 0.06
STAGE_MIN_SAMPLES = 200  # spec §7, and the bundled plan's 1 MiB criterion
FALLBACK_STAGE_H = 14 * 24
PLAN_START = "2027-01-04T00:00:00Z"  # a Monday, 00 UTC: baseline and stage start at midnight
# Seeds per task: stage samples x seeds held at once (a few hundred MB per worker at most).
CHUNK_VALUES = 6_000_000
RUNNING, FAIL_LOOK, FAIL_END, PASSED, PAUSE_LIMITED, PAUSE_LONGEST, PAUSE_MISSING, ADVANCED = range(8)
OUTCOME_NAMES = ("running", "FAIL at a look", "FAIL at the end (estimate beyond the limit)", "PASS",
                 "paused: the baseline bounds the interval", "paused: longest extension reached",
                 "paused: no data verdict", "advanced: estimate within the limit (on_inconclusive advance)")
# What an undecided stage does (the plan's on_inconclusive): pause for an operator, or go on once extending
# cannot decide. Both run the same looks and extensions; only the last step differs, so one run gives both
# and the replays check each through the engine.
POLICIES = ("extend", "advance")
# The judge's verdict at one look, per seed and change.
_V_FAIL, _V_PASS, _V_UNDECIDED, _V_GATE, _V_SHORT = range(5)


def _plan_text(statistic: str, baseline_days: int, stage_h: int, max_extension: str | None) -> str:
    extension = f'max_extension = "{max_extension}"\n' if max_extension else ""
    return f"""[experiment]
name = "judge-error-rates"
kind = "staged"
owner = "bench"
contact = "bench@example.org"
description = "bench/judge_error_rates.py: one criterion, synthetic samples"
start = {PLAN_START}
tor_versions = ">=0.4.7.1"
parameters = ["KISTSchedRunInterval"]
{extension}
[baseline]
duration = "{baseline_days}d"
values = {{ KISTSchedRunInterval = 10 }}

[[stages]]
name = "2ms"
duration = "{stage_h}h"
values = {{ KISTSchedRunInterval = 2 }}

[authorities]
participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg", "maatuska"]
others = "listing"

[[criteria]]
name = "1 MiB downloads"
metric = "{STAGE_METRIC}"
statistic = "{statistic}"
comparison = "relative-increase"
threshold = {STAGE_LIMIT}
min_samples = {STAGE_MIN_SAMPLES}
on_fail = "revert-default"
"""


@functools.lru_cache(maxsize=64)
def _spec(text: str):
    return spec_from_plan(parse_plan(text))


def _with_policy(text: str, policy: str) -> str:
    """The plan text with ``on_inconclusive`` set for the plan (the default, extend, left unwritten)."""
    if policy == "extend":
        return text
    return text.replace('parameters = ["KISTSchedRunInterval"]\n',
                        f'parameters = ["KISTSchedRunInterval"]\non_inconclusive = "{policy}"\n', 1)


def _lint_hours(statistic: str, baseline_days: int) -> int | None:
    """The stage length lint approves (80 % power to PASS at no change and to FAIL at twice the limit at the
    planned end, kistexp/plan/lint.py KX201), washout included; None when no length reaches it because the
    baseline alone bounds the interval."""
    plan = parse_plan(_plan_text(statistic, baseline_days, FALLBACK_STAGE_H, None))
    crit = plan.criteria[0]
    washout, (fc,) = lint._design(plan, [(crit, catalogue.get(crit.metric))])
    baseline_h = plan.baseline.duration / dt.timedelta(hours=1)
    if fc.at(math.inf, baseline_h).least < power.TARGET_POWER:
        return None
    top = lint._MAX_FORECAST / dt.timedelta(hours=1)
    need = fc.smallest(1.0, top, lambda h, c: fc.at(h, baseline_h, c=c))
    return None if need is None else int(math.ceil(need + washout / dt.timedelta(hours=1)))


@attrs.frozen
class StageDesign:
    """One plan as the engine runs it; every number below is read from kistexp, not restated."""

    statistic: str
    baseline_days: int
    stage_h: int
    source: str  # where the stage length comes from
    plan_text: str
    washout_h: int
    end_hours: int  # measured hours in the look the planned end decides on
    extensions: int  # hourly extensions the engine allows after it (the plan's max_extension)
    per_hour: int
    alpha_fail: float
    alpha_pass: float
    planned: float
    target: float

    @property
    def looks(self) -> int:
        return self.end_hours + self.extensions


def stage_design(statistic: str, baseline_days: int, stage_h: int | None, max_extension: str | None) -> StageDesign:
    if stage_h is None:
        need = _lint_hours(statistic, baseline_days)
        stage_h, source = ((FALLBACK_STAGE_H, "14 d: lint approves no length") if need is None else (need, "lint"))
    else:
        source = "--stage-length"
    text = _plan_text(statistic, baseline_days, stage_h, max_extension)
    spec = _spec(text)
    hour = spec.hour
    va = spec.start
    decision = spec.cadence.deadline(spec.cadence.va_at_or_after(va + spec.stages[0].duration))
    per_hour = catalogue.samples_in(catalogue.get(STAGE_METRIC), 1.0)
    state = judging.planned_state(spec, 1, per_hour, 1, alpha_fail=_share(spec))
    return StageDesign(statistic, baseline_days, stage_h, source, text, round(spec.washout / hour),
                       math.floor((decision - va - spec.washout) / hour), spec.extensions_for(1, spec.criteria[0]),
                       per_hour, state.alpha_fail, state.alpha_pass, state.planned_stage, state.target_stage)


def _share(spec) -> float:
    """The criterion's FAIL error as the engine gives it (kistexp/rollout/analysis.py, _family): the
    plan's correction over its one criterion."""
    return fail_alphas([c.base for c in spec.criteria], FAMILY_ALPHA, spec.correction,
                       [not c.shadow for c in spec.criteria])[0]


@functools.lru_cache(maxsize=16)
def _times(text: str, looks: int) -> tuple[np.ndarray, np.ndarray]:
    """Baseline and stage sample times (plan seconds) as the engine lays out its hourly batches."""
    spec = _spec(text)
    per = catalogue.samples_in(catalogue.get(STAGE_METRIC), 1.0)
    hours = round(spec.baseline_duration / spec.hour)
    zeros = np.zeros(per)
    base = judging.judge_input(spec, STAGE_METRIC, [judging.Batch(spec.baseline_start + i * spec.hour, zeros)
                                                    for i in range(hours)])
    first = spec.start + spec.washout
    stage = judging.judge_input(spec, STAGE_METRIC, [judging.Batch(first + i * spec.hour, zeros)
                                                     for i in range(looks)])
    return base.times, stage.times


def _draw(d: StageDesign, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, stage) samples of one seed at no change: log-normal, log-SD SIGMA, plus with AR(1) hours
    one hour effect per hour running on through the baseline, the washout and the stage."""
    rng = np.random.default_rng([20270104, STAGE_STATISTICS.index(d.statistic), d.baseline_days,
                                 HOUR_KINDS.index(kind), seed])
    hb, hs = 24 * d.baseline_days, d.looks
    e = rng.standard_normal(hb + d.washout_h + hs)
    if kind == "AR(1)":
        e *= AR_SD * math.sqrt(1.0 - AR_PHI**2)
        e[0] /= math.sqrt(1.0 - AR_PHI**2)  # the first hour from the stationary law
        hour = lfilter([1.0], [1.0, -AR_PHI], e)
    else:
        hour = np.zeros_like(e)
    zb = rng.normal(0.0, SIGMA, hb * d.per_hour) + np.repeat(hour[:hb], d.per_hour)
    zs = rng.normal(0.0, SIGMA, hs * d.per_hour) + np.repeat(hour[hb + d.washout_h:], d.per_hour)
    return np.exp(zb), np.exp(zs)


class _Ranks:
    """Order statistics of each seed's growing stage window: a Fenwick tree over the seed's sorted samples, so
    an hourly look costs O(log n) instead of a partition of weeks of samples."""

    def __init__(self, y: np.ndarray) -> None:
        seeds, n = y.shape
        self.order = np.argsort(y, axis=1, kind="stable")
        self.sorted = np.take_along_axis(y, self.order, axis=1)
        self.rank = np.empty((seeds, n), dtype=np.int64)
        np.put_along_axis(self.rank, self.order, np.broadcast_to(np.arange(n), (seeds, n)), axis=1)
        self.n = n
        self.tree = np.zeros((seeds, n + 1), dtype=np.int32)
        self.offset = (np.arange(seeds) * (n + 1))[:, None]
        self.rows = np.arange(seeds)[:, None]

    def add(self, lo: int, hi: int) -> None:
        """Samples lo..hi-1 (arrival order) join the window."""
        pos = (self.rank[:, lo:hi] + 1).ravel()
        at = np.broadcast_to(self.offset, (self.offset.shape[0], hi - lo)).ravel()
        flat = self.tree.reshape(-1)
        while pos.size:
            np.add.at(flat, at + pos, 1)
            pos = pos + (pos & -pos)
            keep = pos <= self.n
            pos, at = pos[keep], at[keep]

    def kth(self, ks: np.ndarray) -> np.ndarray:
        """Index into ``sorted`` of each seed's k-th smallest window sample (k 1-based), shape (seeds, len(ks))."""
        pos = np.zeros((self.tree.shape[0], len(ks)), dtype=np.int64)
        rem = np.broadcast_to(np.asarray(ks, dtype=np.int64), pos.shape).copy()
        step = 1 << (self.n.bit_length() - 1)
        while step:
            nxt = pos + step
            val = self.tree[self.rows, np.minimum(nxt, self.n)]
            go = (nxt <= self.n) & (val < rem)
            pos = np.where(go, nxt, pos)
            rem = np.where(go, rem - val, rem)
            step >>= 1
        return pos

    def values(self, ks) -> np.ndarray:
        return np.take_along_axis(self.sorted, self.kth(np.asarray(ks)), axis=1)


def _lerp(a: np.ndarray, b: np.ndarray, t) -> np.ndarray:
    """numpy's linear-interpolation step of np.quantile, so the stage's quantiles match the judge's digit for digit."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


def _interp(x: float, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """np.interp(x, xp[i], fp[i]) for each row i (xp rows increasing), as numpy computes it."""
    n = xp.shape[1]
    j = (xp <= x).sum(axis=1) - 1
    jj = np.clip(j, 0, n - 2)[:, None]
    x0, x1 = np.take_along_axis(xp, jj, 1)[:, 0], np.take_along_axis(xp, jj + 1, 1)[:, 0]
    y0, y1 = np.take_along_axis(fp, jj, 1)[:, 0], np.take_along_axis(fp, jj + 1, 1)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = (y1 - y0) / (x1 - x0) * (x - x0) + y0
    out = np.where(x0 == x, y0, inner)
    out = np.where(j < 0, fp[:, 0], out)
    return np.where(j >= n - 1, fp[:, -1], out)


def _deff(d) -> tuple[float, float]:
    """(value, df) of est.design_effect's answer (a float in older judges: its df was infinite)."""
    return float(getattr(d, "value", d)), float(getattr(d, "df", math.inf))


class _ChunkJudge:
    """judge() at one hourly look for many seeds at once, with the judge's own functions where they take arrays
    (side_statistic, side_df, satterthwaite, hour_weights, kish_n, design_effect, mixture_boundary) and its
    arithmetic where they take one window (the post-stratified baseline, core's decide and _floor); every change
    shifts log(stage) by log(1 + change), so one pass over the looks serves all five."""

    def __init__(self, d: StageDesign, xb: np.ndarray, xs: np.ndarray) -> None:
        self.d, self.stat = d, d.statistic
        self.seeds = xb.shape[0]
        self.b_times, self.s_times = _times(d.plan_text, d.looks)
        self.bound = math.log1p(STAGE_LIMIT)
        self.shift = np.log1p(np.array(STAGE_CHANGES))[None, :]
        self.n_b = xb.shape[1]
        self.xb = xb
        self.b_val, self.b_se = est.side_statistic(xb, self.stat, True)
        self.b_df = float(est.side_df(self.stat, self.n_b))
        deffs = np.array([_deff(est.design_effect(xb[i], self.b_times, True)) for i in range(self.seeds)])
        self.deff, self.deff_df = deffs[:, 0], deffs[:, 1]
        if self.stat == "mean":
            per = d.per_hour
            hourly = xs.reshape(self.seeds, -1, per)
            self.s1 = np.cumsum(hourly.sum(axis=2), axis=1)
            self.s2 = np.cumsum(np.square(hourly).sum(axis=2), axis=1)
        else:
            yb = np.log(xb)
            self.b_order = np.argsort(yb, axis=1, kind="stable")
            self.yb_sorted = np.take_along_axis(yb, self.b_order, axis=1)
            self.ranks = _Ranks(np.log(xs))
            if self.stat == "median":
                self.xs_sorted = np.take_along_axis(xs, self.ranks.order, axis=1)
            self.p = est.quantile_level(self.stat)
        tail = est.quantile_samples_needed(self.p) if self.stat not in ("mean", "median") else 0
        self.need = max(STAGE_MIN_SAMPLES, tail, 2)

    def _stage(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = k * self.d.per_hour
        if self.stat == "mean":
            s1, s2 = self.s1[:, k - 1], self.s2[:, k - 1]
            m = s1 / n
            sd = np.sqrt(np.maximum(s2 - s1 * m, 0.0) / (n - 1))
            return np.log(m), sd / (math.sqrt(n) * m)
        self.ranks.add((k - 1) * self.d.per_hour, n)
        if self.stat == "median":  # est.bonett_price_median; ln of np.median(x) for even n, as side_statistic
            a = max(1, int(round(n / 2 - math.sqrt(n))))
            z0 = float(stats.norm.isf(stats.binom.cdf(a - 1, n, 0.5)))
            idx = self.ranks.kth(np.array([a, n - a + 1, (n - 1) // 2 + 1, n // 2 + 1]))
            y = np.take_along_axis(self.ranks.sorted, idx[:, :2], axis=1)
            x = np.take_along_axis(self.xs_sorted, idx[:, 2:], axis=1)
            med = np.log((x[:, 0] + x[:, 1]) / 2.0) if n % 2 == 0 else np.log(x[:, 1])
            return med, (y[:, 1] - y[:, 0]) / (2.0 * z0)
        p = self.p  # est.quantile_woodruff: np.quantile at p, p -+ half, linear
        half = est.WOODRUFF_Z * math.sqrt(p * (1.0 - p) / n)
        v = (n - 1) * np.array([p, max(p - half, 0.0), min(p + half, 1.0)])
        prev = np.floor(v)
        top = v >= n - 1
        lo_i = np.where(top, n - 1, prev).astype(np.int64)
        hi_i = np.where(top, n - 1, prev + 1).astype(np.int64)
        gamma = v - np.where(top, -1.0, prev)
        vals = self.ranks.values(np.concatenate([lo_i, hi_i]) + 1)
        q = _lerp(vals[:, :3], vals[:, 3:], gamma[None, :])
        return q[:, 0], (q[:, 2] - q[:, 1]) / (2.0 * est.WOODRUFF_Z)

    def _baseline(self, n: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The baseline's statistic, SE and df, post-stratified to the stage's hours of day as
        core._Context._post_stratify and est.weighted_side_statistic do."""
        w = est.hour_weights(self.b_times, self.s_times[:n])
        if np.all(np.abs(w - 1.0) <= 0.10):
            return self.b_val, self.b_se, self.b_df
        keep = w > 0
        wk = w[keep]
        n_eff = est.kish_n(wk)
        df = float(est.side_df(self.stat, n_eff))
        if self.stat == "mean":
            xk = self.xb[:, keep]
            scl = wk.sum()
            m = (xk * wk).sum(axis=1) / scl
            var = (np.square(xk - m[:, None]) * wk).sum(axis=1) / scl
            se = np.sqrt(var * n_eff / max(n_eff - 1.0, 1.0)) / math.sqrt(n_eff)
            return np.log(m), se / m, df
        ws = w[self.b_order]
        ys = self.yb_sorted
        if not keep.all():
            mask = keep[self.b_order]
            ys, ws = ys[mask].reshape(self.seeds, -1), ws[mask].reshape(self.seeds, -1)
        cum = (np.cumsum(ws, axis=1) - 0.5 * ws) / ws.sum(axis=1, keepdims=True)
        p = self.p
        half = est.WOODRUFF_Z * math.sqrt(p * (1.0 - p) / n_eff)
        q, hi, lo = (_interp(level, cum, ys) for level in (p, min(p + half, 1.0), max(p - half, 0.0)))
        return q, (hi - lo) / (2.0 * est.WOODRUFF_Z), df

    def _c(self, n_stage: float, alpha: float) -> np.ndarray:
        """The mixture sequence's boundary at stage size n_stage (core._Look)."""
        of_target = (1.0 / self.d.target + 1.0 / self.n_b) / (1.0 / np.maximum(n_stage, 1e-12) + 1.0 / self.n_b)
        return np.asarray(seq.mixture_boundary(of_target, alpha))

    def look(self, k: int, decision: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(verdict codes, θ per change, baseline-limited flags at a decision look), shapes (seeds, changes)."""
        n = k * self.d.per_hour
        shape = (self.seeds, len(STAGE_CHANGES))
        if self.stat != "mean":
            s_val, s_se = self._stage(k)  # the tree must take every hour's samples
        if n < self.need or self.n_b < self.need:
            return np.full(shape, _V_SHORT, dtype=np.int8), np.zeros(shape), None
        if self.stat == "mean":
            s_val, s_se = self._stage(k)
        b_val, b_se, b_df = self._baseline(n)
        theta0 = s_val - b_val
        se = np.hypot(s_se, b_se)
        df = est.satterthwaite(s_se, float(est.side_df(self.stat, n)), b_se, b_df)
        c_fail, c_pass = float(self._c(n, self.d.alpha_fail)), float(self._c(n, self.d.alpha_pass))
        corr = self.deff > 1.0
        scale = np.where(corr, np.sqrt(self.deff), 1.0)
        with np.errstate(divide="ignore"):
            df = np.where(corr, 1.0 / (1.0 / df + 1.0 / self.deff_df), df)
        tf = np.minimum(stats.t.isf(stats.norm.sf(c_fail), df), 1e6)[:, None]
        tp = np.minimum(stats.t.isf(stats.norm.sf(c_pass), df), 1e6)[:, None]
        theta = theta0[:, None] + self.shift
        lo = theta - (tf * scale[:, None]) * se[:, None]
        hi = theta + (tp * scale[:, None]) * se[:, None]
        fail = lo > self.bound
        passed = (hi < self.bound) & ~fail
        covered = np.count_nonzero(np.bincount(est.hour_of_day(self.s_times[:n]), minlength=24))
        codes = np.full(shape, _V_UNDECIDED, dtype=np.int8)
        codes[fail] = _V_FAIL
        codes[passed] = _V_GATE if covered < 24 else _V_PASS
        if self.stat not in ("mean", "median", "shift"):
            with np.errstate(over="ignore"):
                codes[np.exp(hi) / np.exp(lo) > MAX_QUANTILE_SPAN] = _V_SHORT  # core._estimable
        limited = None
        if decision:  # core._Context._floor for a mixture look: the narrowest interval any longer stage reaches
            grown = n * np.append(2.0 ** np.arange(41), np.inf)
            half = np.sqrt(np.maximum(se * se - b_se * b_se, 0.0)[:, None] * n / grown[None, :]
                           + (b_se * b_se)[:, None]) * scale[:, None]
            floor_fail = (self._c(grown, self.d.alpha_fail)[None, :] * half).min(axis=1)[:, None]
            floor_pass = (self._c(grown, self.d.alpha_pass)[None, :] * half).min(axis=1)[:, None]
            floor = np.where(theta > self.bound, floor_fail, floor_pass)
            limited = (codes == _V_UNDECIDED) & (np.abs(theta - self.bound) <= floor)
        return codes, theta, limited


def _simulate_chunk(d: StageDesign, kind: str, seeds: range) -> dict:
    """Every look of the stages of ``seeds``, and the end of each as kistexp/rollout/machine.py makes it."""
    t0 = time.process_time()
    draws = [_draw(d, kind, s) for s in seeds]
    judge_ = _ChunkJudge(d, np.stack([b for b, _ in draws]), np.stack([s for _, s in draws]))
    del draws
    shape = (len(seeds), len(STAGE_CHANGES))
    code = np.full(shape, RUNNING, dtype=np.int8)
    hour = np.zeros(shape, dtype=np.int32)
    open_at_end = np.zeros(shape, dtype=bool)
    for k in range(1, d.looks + 1):
        decision = k >= d.end_hours
        verdict, theta, limited = judge_.look(k, decision)
        run = code == RUNNING
        hit = run & (verdict == _V_FAIL)  # any look's FAIL rolls back at once (failure_limit 0)
        code[hit], hour[hit] = FAIL_LOOK, d.washout_h + k
        if decision:
            e = k - d.end_hours
            run = code == RUNNING
            at = d.stage_h + e  # hours since the stage's value took effect
            judged = verdict == _V_UNDECIDED
            last = e >= d.extensions
            for mask, outcome in (
                    (run & (verdict == _V_PASS), PASSED),
                    (run & judged & (theta > judge_.bound), FAIL_END),  # likely over the limit: on_fail
                    (run & judged & (theta <= judge_.bound) & limited, PAUSE_LIMITED),
                    (run & judged & (theta <= judge_.bound) & ~limited & last, PAUSE_LONGEST),
                    (run & ~judged & (verdict != _V_PASS) & last, PAUSE_MISSING)):
                code[mask], hour[mask] = outcome, at
            if e == 0:
                open_at_end = ~np.isin(code, (FAIL_LOOK, FAIL_END, PASSED))
        if not (code == RUNNING).any():
            break
    return {"code": code, "hour": hour, "open_at_end": open_at_end, "cpu": time.process_time() - t0}


def _replay(d: StageDesign, kind: str, seed: int, change_index: int, policy: str = "extend"
            ) -> tuple[int, int, bool, float]:
    """One seed's stage through the engine's own code, look by look: judging.judge_criterion and
    machine.step, as kistexp/rollout/engine.py calls them (the check on _simulate_chunk)."""
    t0 = time.process_time()
    spec = _spec(_with_policy(d.plan_text, policy))
    crit = spec.criteria[0]
    xb, xs = _draw(d, kind, seed)
    xs = xs * (1.0 + STAGE_CHANGES[change_index])
    per, hour = d.per_hour, spec.hour
    base = judging.judge_input(spec, STAGE_METRIC, [judging.Batch(spec.baseline_start + i * hour,
                                                                  xb[i * per:(i + 1) * per])
                                                    for i in range(24 * d.baseline_days)])
    va = spec.start
    first = spec.cadence.deadline(spec.cadence.va_at_or_after(va + spec.stages[0].duration))
    status = state_mod.Status(state=state_mod.MEASURING, stage=1, values=spec.values_of(1), stage_va=va,
                              decision_at=first)
    batches: list = []
    stage = None
    seq_state = None
    open_at_end = False

    share = _share(spec)

    def look(at, k):
        # as Analysis.look: the criterion's share, the family step of the plan's correction, the state kept
        nonlocal seq_state
        b, s = base, stage
        if judging.short_stage(spec, 1):
            b, s = judging.untimed(b), judging.untimed(s)
        if seq_state is None:
            seq_state = judging.planned_state(spec, 1, judging.size(s), k, alpha_fail=share)
        now_s = judging.plan_seconds(spec, at)
        (v, nxt), = step_down([lambda a, label: judging.judge_criterion(crit, b, s, seq_state, now_s, alpha_fail=a,
                                                                        correction=label)],
                              [share], spec.correction, lambda r: r[0].outcome == state_mod.FAIL)
        seq_state = nxt if nxt is not None else seq_state
        return v

    def done(outcome: int, h: int) -> tuple[int, int, bool, float]:
        return outcome, h, open_at_end, time.process_time() - t0

    for k in range(1, d.looks + 1):
        new = [judging.Batch(va + spec.washout + (k - 1) * hour, xs[(k - 1) * per:k * per])]
        stage = (judging.judge_input(spec, STAGE_METRIC, new) if stage is None
                 else judging.extend(spec, STAGE_METRIC, stage, batches + new, new))
        batches += new
        at = va + spec.washout + k * hour
        out = machine.step(spec, status, state_mod.Evaluate(at, (look(at, k),)))
        status = out.status
        if out.decision.startswith("rollback"):
            return done(FAIL_LOOK, d.washout_h + k)
        while status.state == state_mod.MEASURING and status.decision_at < at + hour:
            # the decision falls before the next batch: the engine looks again on the same samples, then decides
            when = status.decision_at
            e = round((when - first) / hour)
            v = look(when, k)
            out = machine.step(spec, status, state_mod.Evaluate(when, (v,)))
            status = out.status
            if out.decision.startswith("rollback"):
                return done(FAIL_LOOK, d.washout_h + k)
            out = machine.step(spec, status, state_mod.DecisionDue(when, 1, (), (v,)))
            status = out.status
            if out.decision.startswith("rollback"):
                open_at_end = open_at_end or e > 0
                return done(FAIL_END, d.stage_h + e)
            if status.state == state_mod.COMPLETED or out.decision.startswith("stage"):
                advanced = "advanced as on_inconclusive" in out.message
                open_at_end = open_at_end or advanced  # inconclusive at this decision, then went on
                return done(ADVANCED if advanced else PASSED, d.stage_h + e)
            open_at_end = True
            if out.decision.startswith("pause"):
                paused = (PAUSE_LIMITED if v.limited_by else PAUSE_LONGEST if v.reason == "undecided"
                          else PAUSE_MISSING)
                return done(paused, d.stage_h + e)
    return done(RUNNING, d.washout_h + d.looks)


def _binomial_ci(k: int, n: int) -> tuple[float, float]:
    """Clopper–Pearson 95 % interval of k successes in n (exact: honest at 0 and n)."""
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def _commit() -> str:
    """HEAD's short hash, "+changes" when the judge, the engine or this file differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "kistexp/judge",
                                "kistexp/rollout", "kistexp/plan", "kistexp/stats", "kistexp/metrics",
                                "bench/judge_error_rates.py"],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


@attrs.frozen
class StageCell:
    design: StageDesign
    policy: str  # the plan's on_inconclusive
    kind: str
    change: float
    seeds: int
    fail: int
    fail_at_end: int  # of them, taken at a decision time because the estimate was beyond the limit
    fail_by_end: int
    passed: int
    open_at_end: int
    undecided: int
    limited: int
    median_hours: float | None
    advanced: int = 0  # went on at the end with the estimate within the limit (on_inconclusive advance)


def run_stages(seeds: int, stage_h: int | None, max_extension: str | None, workers: int, check: int
               ) -> tuple[list[StageCell], dict]:
    """All 60 cells; returns them and the run's facts (CPU seconds, wall time, check results)."""
    wall = time.perf_counter()
    cpu_main = time.process_time()
    designs = [stage_design(s, b, stage_h, max_extension) for s in STAGE_STATISTICS for b in BASELINE_DAYS]
    tasks = []
    for d in designs:
        size = max(1, min(seeds, CHUNK_VALUES // (d.looks * d.per_hour)))
        for kind in HOUR_KINDS:
            for lo in range(0, seeds, size):
                tasks.append(("sim", d, kind, range(lo, min(seeds, lo + size))))
            for s in range(min(check, seeds)):
                for j in range(len(STAGE_CHANGES)):
                    for policy in POLICIES:
                        tasks.append(("replay", d, kind, s, j, policy))
    # longest first, so the two workers finish together
    tasks.sort(key=lambda t: -(t[1].looks * (len(t[3]) if t[0] == "sim" else 40)))
    results: dict = {}
    replays: dict = {}
    cpu = 0.0
    with ProcessPoolExecutor(max_workers=workers) as pool, Progress(transient=True) as bar:
        job = bar.add_task("stages", total=len(tasks))
        futures = {pool.submit(_simulate_chunk, t[1], t[2], t[3]) if t[0] == "sim"
                   else pool.submit(_replay, t[1], t[2], t[3], t[4], t[5]): t for t in tasks}
        for f in as_completed(futures):
            t = futures[f]
            out = f.result()
            if t[0] == "sim":
                results[(t[1], t[2], t[3].start)] = out
                cpu += out["cpu"]
            else:
                replays[(t[1], t[2], t[3], t[4], t[5])] = out[:3]
                cpu += out[3]
            bar.advance(job)
    cells = []
    mismatches = []
    for d in designs:
        for kind in HOUR_KINDS:
            parts = sorted((lo, r) for (dd, kk, lo), r in results.items() if dd == d and kk == kind)
            extend = np.concatenate([r["code"] for _, r in parts])
            hour = np.concatenate([r["hour"] for _, r in parts])
            open_end = np.concatenate([r["open_at_end"] for _, r in parts])
            for policy in POLICIES:
                code = extend
                if policy == "advance":
                    # a pause because extending cannot decide, or at the longest extension, becomes going on
                    code = np.where(np.isin(extend, (PAUSE_LIMITED, PAUSE_LONGEST)), ADVANCED, extend)
                for (dd, kk, s, j, pp), got in replays.items():
                    if dd == d and kk == kind and pp == policy:
                        mine = (int(code[s, j]), int(hour[s, j]), bool(open_end[s, j]))
                        if mine != (int(got[0]), int(got[1]), bool(got[2])):
                            mismatches.append((policy, d.statistic, d.baseline_days, kind, STAGE_CHANGES[j], s,
                                               mine, got))
                for j, change in enumerate(STAGE_CHANGES):
                    c, h, o = code[:, j], hour[:, j], open_end[:, j]
                    fail = np.isin(c, (FAIL_LOOK, FAIL_END))
                    decided = fail | np.isin(c, (PASSED, ADVANCED))
                    cells.append(StageCell(d, policy, kind, change, seeds, int(fail.sum()),
                                           int((c == FAIL_END).sum()), int((fail & ~o).sum()),
                                           int((c == PASSED).sum()), int(o.sum()), int((~decided).sum()),
                                           int((c == PAUSE_LIMITED).sum()),
                                           float(np.median(h[decided])) if decided.any() else None,
                                           int((c == ADVANCED).sum())))
    facts = {"cpu_s": cpu + time.process_time() - cpu_main, "wall_s": time.perf_counter() - wall,
             "replays": len(replays), "mismatches": mismatches, "designs": designs}
    return cells, facts


def _pct_ci(k: int, n: int) -> str:
    lo, hi = _binomial_ci(k, n)
    return f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _change_text(change: float) -> str:
    multiple = change / STAGE_LIMIT
    name = {0.0: "no change", 0.5: "½ limit", 1.0: "at limit", 1.5: "1.5× limit", 2.0: "2× limit"}[round(multiple, 1)]
    return f"+{100 * change:.0f} % ({name})"


def _stage_text(d: StageDesign) -> str:
    return f"{d.stage_h} h ({d.source}) + {d.extensions} h"


def stage_table(cells: list[StageCell]) -> str:
    rows = []
    for c in cells:
        d = c.design
        rows.append([c.policy, d.statistic, f"{d.baseline_days} d", c.kind, _stage_text(d), _change_text(c.change),
                     _pct_ci(c.fail, c.seeds)
                     + (f"; by the estimate at a decision {_pct(c.fail_at_end / c.seeds)}" if c.fail_at_end else ""),
                     _pct_ci(c.fail_by_end, c.seeds), _pct_ci(c.passed, c.seeds)
                     + (f"; advanced {_pct_ci(c.advanced, c.seeds)}" if c.advanced else ""),
                     _pct_ci(c.open_at_end, c.seeds),
                     _pct_ci(c.undecided, c.seeds)
                     + (f"; baseline-bound {_pct(c.limited / c.seeds)}" if c.limited else ""),
                     "-" if c.median_hours is None else f"{c.median_hours:.0f}"])
    return _table(["on_inconclusive", "statistic", "baseline", "hours", "stage + longest extension", "true change",
                   "FAIL",
                   "FAIL by the stage's end", "PASS", "inconclusive at the stage's end",
                   "undecided after the longest extension", "median hours to decision"], rows)


def targets_table(cells: list[StageCell]) -> str:
    """Issue 35's targets per design and on_inconclusive: point estimates, with the interval's far end in brackets.
    A design lint refuses (no stage length reaches 80 % power on its baseline, KX201 error) is shown, but the
    targets hold for the stage lengths lint approves."""
    by = {(c.policy, c.design.statistic, c.design.baseline_days, c.kind, round(c.change / STAGE_LIMIT, 1)): c
          for c in cells}
    rows = []
    for policy in POLICIES:
        for st in STAGE_STATISTICS:
            for b in BASELINE_DAYS:
                for kind in HOUR_KINDS:
                    key = (policy, st, b, kind)
                    z, h, m15 = by[key + (0.0,)], by[key + (0.5,)], by[key + (1.5,)]
                    approved = z.design.source == "lint"
                    false_fail = max(z.fail / z.seeds, h.fail / h.seeds)
                    ff_hi = max(_binomial_ci(z.fail, z.seeds)[1], _binomial_ci(h.fail, h.seeds)[1])
                    went_on = m15.passed + m15.advanced  # a 1.5x regression let through, either way
                    fp = went_on / m15.seeds
                    pw = m15.fail_by_end / m15.seeds
                    und = max(by[key + (m,)].undecided / by[key + (m,)].seeds for m in STAGE_MULTIPLES)

                    def mark(ok: bool, approved: bool = approved) -> str:
                        return ("yes" if ok else "**no**") if approved else ("yes" if ok else "no")

                    rows.append([policy, st, f"{b} d", kind,
                                 f"{z.design.stage_h} h" if approved else "none (KX201 error)",
                                 f"{_pct(false_fail)} (≤ {_pct(ff_hi)}): {mark(false_fail <= 0.05)}",
                                 f"{_pct(fp)} (≤ {_pct(_binomial_ci(went_on, m15.seeds)[1])}): {mark(fp <= 0.05)}",
                                 f"{_pct(pw)} (≥ {_pct(_binomial_ci(m15.fail_by_end, m15.seeds)[0])}): "
                                 f"{mark(pw >= 0.8)}",
                                 f"{_pct(1.0 - und)}: {mark(und == 0.0)}"])
    return _table(["on_inconclusive", "statistic", "baseline", "hours", "stage lint approves",
                   "false FAIL ≤ 5 % (no change, ½ limit)", "false PASS ≤ 5 % (1.5× limit)",
                   "power ≥ 80 % at 1.5× by the stage's end", "stages decided by end + longest extension"], rows)


HISTORY = ROOT / "bench" / "history" / "judge-error-rates.csv"
HISTORY_COLUMNS = ["date_utc", "cpu_model", "cores", "commit", "on_inconclusive", "statistic", "baseline_days",
                   "hours", "change",
                   "limit", "stage_h", "stage_source", "max_extension_h", "min_samples", "samples_per_h", "seeds",
                   "p_fail", "fail_lo", "fail_hi", "p_fail_at_decision_by_estimate", "p_fail_by_end", "fail_by_end_lo",
                   "fail_by_end_hi", "p_pass", "pass_lo", "pass_hi", "p_inconclusive_at_end", "inconclusive_lo",
                   "inconclusive_hi",
                   "p_undecided", "undecided_lo", "undecided_hi", "p_paused_baseline_bound", "median_hours",
                   "checked_replays", "check_mismatches", "cpu_s", "wall_s", "p_advanced"]


def append_history(cells: list[StageCell], facts: dict, date: str, cpu: str, commit: str) -> None:
    new = not HISTORY.exists()
    HISTORY.parent.mkdir(parents=True, exist_ok=True)
    if not new:
        with HISTORY.open(newline="") as fh:
            old = list(csv.DictReader(fh))
        if old and list(old[0]) != HISTORY_COLUMNS:
            # columns added since: rewrite the file under the new header, older rows ran the default (extend)
            with HISTORY.open("w", newline="") as fh:
                w = csv.DictWriter(fh, HISTORY_COLUMNS)
                w.writeheader()
                for row in old:
                    w.writerow({k: row.get(k, "extend" if k == "on_inconclusive" else "") for k in HISTORY_COLUMNS})
    with HISTORY.open("a", newline="") as fh:
        w = csv.DictWriter(fh, HISTORY_COLUMNS)
        if new:
            w.writeheader()
        for c in cells:
            d = c.design
            row = {"date_utc": date, "cpu_model": cpu, "cores": os.cpu_count(), "commit": commit,
                   "on_inconclusive": c.policy, "p_advanced": f"{c.advanced / c.seeds:.4f}",
                   "statistic": d.statistic, "baseline_days": d.baseline_days, "hours": c.kind,
                   "change": f"{c.change:.2f}", "limit": STAGE_LIMIT, "stage_h": d.stage_h, "stage_source": d.source,
                   "max_extension_h": d.extensions, "min_samples": STAGE_MIN_SAMPLES, "samples_per_h": d.per_hour,
                   "seeds": c.seeds, "median_hours": "" if c.median_hours is None else f"{c.median_hours:.0f}",
                   "p_paused_baseline_bound": f"{c.limited / c.seeds:.4f}", "checked_replays": facts["replays"],
                   "p_fail_at_decision_by_estimate": f"{c.fail_at_end / c.seeds:.4f}",
                   "check_mismatches": len(facts["mismatches"]), "cpu_s": f"{facts['cpu_s']:.0f}",
                   "wall_s": f"{facts['wall_s']:.0f}"}
            for name, k in (("fail", c.fail), ("fail_by_end", c.fail_by_end), ("pass", c.passed),
                            ("inconclusive", c.open_at_end), ("undecided", c.undecided)):
                lo, hi = _binomial_ci(k, c.seeds)
                key = {"fail": "p_fail", "fail_by_end": "p_fail_by_end", "pass": "p_pass",
                       "inconclusive": "p_inconclusive_at_end", "undecided": "p_undecided"}[name]
                row[key], row[f"{name}_lo"], row[f"{name}_hi"] = f"{k / c.seeds:.4f}", f"{lo:.4f}", f"{hi:.4f}"
            w.writerow(row)


def stages(seeds: int, stage_h: int | None, max_extension: str | None, workers: int, check: int,
           history: bool) -> dict[str, str]:
    cells, facts = run_stages(seeds, stage_h, max_extension, workers, check)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    cpu, commit = cpu_model(), _commit()
    table, targets = stage_table(cells), targets_table(cells)
    ext = (f"the plan's `max_extension = \"{max_extension}\"`" if max_extension else
           "no `max_extension` in the plan: the engine's default, as long as the stage itself")
    lengths = "; ".join(f"{d.statistic} {d.baseline_days} d: {d.stage_h} h ({d.source})" for d in facts["designs"])
    mism = facts["mismatches"]
    run = (f"Run {date}, commit `{commit or 'unknown'}`, {cpu}, {workers} worker processes: "
           f"{facts['cpu_s']:.0f} CPU-s, {facts['wall_s']:.0f} s wall; {seeds:,} seeds per row (common to the five "
           f"changes of a row group; the two on_inconclusive policies share the looks). Stage lengths: {lengths}. "
           f"Extension: {ext}. "
           f"{facts['replays']} stages replayed look by look through `judging.judge_criterion` and "
           f"`machine.step`: {len(mism)} disagreed with the vectorised run.")
    print(f"{run}\n\n{table}\n\n{targets}\n", flush=True)
    for policy, st, b, kind, change, seed, mine, got in mism[:20]:
        print(f"check: {policy}: {st} {b} d {kind} +{100 * change:.0f} % seed {seed}: "
              f"vectorised {OUTCOME_NAMES[mine[0]]} at "
              f"{mine[1]} h (open at the end: {mine[2]}), engine {OUTCOME_NAMES[got[0]]} at {got[1]} h "
              f"(open at the end: {got[2]})", flush=True)
    if history:
        append_history(cells, facts, date, cpu, commit)
    # the doc keeps the targets; every row of the full table is in the history file
    return {"stages-run": run, "stage-targets": targets}


def update_doc(tables: dict[str, str]) -> None:
    text = DOC.read_text()
    for name, table in tables.items():
        # the markers may enclose nothing yet (a new table)
        tag = re.escape(name)
        pattern = re.compile(rf"(<!-- table:{tag} -->\n)(?:.*?\n)?(<!-- /table:{tag} -->)", re.S)
        if not pattern.search(text):
            sys.exit(f"{DOC}: no <!-- table:{name} --> marker")
        text = pattern.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), text)
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=1000,
                    help="seeds per row of the stages and switchback tables (at least 1,000 to write); 2x for "
                         "bootstrap, 4x for one-look, relays and sequential")
    ap.add_argument("--quick", action="store_true", help="100 seeds, print only: for trying the harness")
    ap.add_argument("--no-write", action="store_true",
                    help="print only; leave docs/judge-error-rates.md and bench/history/judge-error-rates.csv alone")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="make only this table (repeatable): stages, one-look, bootstrap, relays, sequential, real, "
                         "switchback")
    ap.add_argument("--stage-length", metavar="DURATION",
                    help="stages table: this stage length for every row instead of the one lint approves")
    ap.add_argument("--max-extension", metavar="DURATION",
                    help="stages table: the plan's max_extension (default: none set, the engine's default of "
                         "as long as the stage)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    ap.add_argument("--check", type=int, default=2, metavar="N",
                    help="stages table: replay the first N seeds of each row group through the engine's own "
                         "code, look by look, and report every disagreement (default 2)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.no_write = 100, True
    if args.seeds < 1000 and not args.no_write:
        sys.exit("--seeds: at least 1,000 replications to write the tables (or --no-write, --quick)")
    stage_h = None
    if args.stage_length:
        stage_h = round(parse_duration(args.stage_length) / dt.timedelta(hours=1))
    if args.max_extension:
        parse_duration(args.max_extension)  # refused here rather than by the plan loader in a worker
    tables = {}
    makers = (("stages", lambda: stages(args.seeds, stage_h, args.max_extension, args.workers, args.check,
                                        history=not args.no_write)),
              ("one-look", lambda: one_look(4 * args.seeds)), ("bootstrap", lambda: bootstrap(2 * args.seeds)),
              ("relays", lambda: relays(4 * args.seeds)),
              ("sequential", lambda: sequential(4 * args.seeds)), ("real", real_build_times),
              ("switchback", lambda: switchback(args.seeds)))
    for name, fn in makers:
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        made = fn()
        if isinstance(made, dict):
            tables.update(made)
        else:
            tables[name] = made
            print(f"{made}\n", flush=True)
        print(f"{name}: {time.perf_counter() - t0:.1f} s\n", flush=True)
    if not args.no_write:
        update_doc(tables)


if __name__ == "__main__":
    main()
