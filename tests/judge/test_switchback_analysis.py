"""Switchback analysis as experimentation platforms make it (judge.md §6, rollout.md §1.6): burn-in and
burn-out per switch, one observation per time bucket, a regression over buckets with clustered and
Newey-West standard errors, and the engine's cycle extension."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pytest
from scipy import stats

from kistexp.errors import PlanError
from kistexp.judge import CriterionSpec, Period, judge_switchback
from kistexp.judge.switchback import bucket_regression, horizon_cycles
from kistexp.plan.loader import load_plan, parse_plan
from kistexp.rollout.dryrun import dry_run
from kistexp.rollout.machine import step
from kistexp.rollout.spec import spec_from_plan
from kistexp.rollout.state import (
    COMPLETED,
    MEASURING,
    PAUSED,
    ROLLING_BACK,
    TRANSITIONING,
    ConsensusCheck,
    Counters,
    DecisionDue,
    Evaluate,
    MachineVerdict,
    Status,
)
from tests.rollout_helpers import write_predictions

DAY = 86400.0
T0 = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # a UTC midnight
MEDIAN = CriterionSpec("median", "relative-increase", 0.10, 0)
PLAN = "plans/kist-switchback-2-vs-3ms.toml"
KIST = "KISTSchedRunInterval"


def ar1_switchback(seed: int, effect: float = 1.05, periods: int = 14, hours: int = 24, per_hour: int = 12,
                   phi: float = 0.8, sd: float = 0.06, daily: float = 0.05) -> list[Period]:
    """judge.md §6.3's simulation: 24 h periods with a random first arm, log-normal transfer times
    (σ_log 0.6, 12/h), an hourly effect that is AR(1) over the whole run (φ 0.8, SD 0.06) and a
    daily cycle (±5 %)."""
    rng = np.random.default_rng(seed)
    n_hours = periods * hours
    hourly = np.empty(n_hours)
    hourly[0] = rng.normal(0.0, sd)
    shocks = rng.normal(0.0, sd * np.sqrt(1 - phi ** 2), n_hours)
    for h in range(1, n_hours):
        hourly[h] = phi * hourly[h - 1] + shocks[h]
    first = int(rng.integers(2))
    out = []
    for i in range(periods):
        arm = "treatment" if (i + first) % 2 == 0 else "control"
        start = T0 + i * hours * 3600.0
        n = hours * per_hour
        t = start + (np.arange(n) + 0.5) / n * hours * 3600.0
        h = ((t - T0) // 3600).astype(int)
        log_x = (rng.normal(0.0, 0.6, n) + hourly[h] + daily * np.sin(2 * np.pi * (h % 24) / 24)
                 + (np.log(effect) if arm == "treatment" else 0.0))
        out.append(Period(arm, np.exp(log_x), start, start + hours * 3600.0, t))
    return out


# --- the judge ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bucket", ["hour", "period"])
def test_the_90_percent_interval_covers_under_ar1_hours(bucket):
    """judge.md §6.3: per-sample intervals cover 79 %, period Welch 89.3 %. The bucket regression's
    two-sided 90 % interval (the FAIL and PASS bounds at 5 % each) covers within 3 points of 90 %."""
    reps, started, covered = 1000, time.perf_counter(), 0
    for seed in range(reps):
        v = judge_switchback(MEDIAN, ar1_switchback(seed), washout=2 * 3600.0, bucket=bucket)
        covered += v.ci_low <= 1.05 <= v.ci_high
    assert abs(covered / reps - 0.90) <= 0.03, covered / reps
    assert time.perf_counter() - started < 20


def test_burn_in_and_burn_out_are_dropped_and_counted():
    periods = []
    for i in range(10):
        start = T0 + i * DAY
        t = start + (np.arange(24 * 12) + 0.5) * 300.0  # 12 samples an hour
        x = np.exp(0.1 * np.sin(2 * np.pi * (t % DAY) / DAY))  # the same day every day: no effect
        periods.append(Period("treatment" if i % 2 == 0 else "control", x, start, start + DAY, t))
    v = judge_switchback(MEDIAN, periods, washout=2 * 3600.0, burnout=3600.0)
    assert v.excluded == 10 * (24 + 12)
    assert "burn-in 240, burn-out 120 samples excluded" in v.detail
    assert v.n_stage == v.n_baseline == 5 * 21 * 12
    # a carry-over in the hour before each switch away from the treatment counts as an effect unless burnt out
    hot = [Period(p.arm, np.where((p.arm == "treatment") & (p.times >= p.end - 3600.0), 3.0, 1.0) * p.values,
                  p.start, p.end, p.times) for p in periods]
    assert judge_switchback(MEDIAN, hot, washout=2 * 3600.0).effect > 1.03
    assert judge_switchback(MEDIAN, hot, washout=2 * 3600.0, burnout=3600.0).effect == pytest.approx(1.0)


def test_one_bucket_per_period_is_the_paired_t_over_cycles():
    rng = np.random.default_rng(3)
    t_val, c_val = rng.normal(0.1, 0.05, 7), rng.normal(0.0, 0.05, 7)
    y = np.ravel(np.column_stack([t_val, c_val]))
    reg = bucket_regression(y, np.tile([1.0, 0.0], 7), np.repeat(np.arange(7), 2), lags=0)
    d = t_val - c_val
    assert reg.theta == pytest.approx(d.mean())
    assert reg.se == pytest.approx(d.std(ddof=1) / np.sqrt(7))
    assert reg.df == 6
    lo, hi = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert reg.theta - stats.t.ppf(0.95, 6) * reg.se == pytest.approx(lo)


def test_newey_west_widens_the_se_only_when_cycles_are_positively_autocorrelated():
    drift = np.linspace(-0.1, 0.1, 8)  # the effect drifts from cycle to cycle: neighbours alike
    y = np.ravel(np.column_stack([0.05 + drift, np.zeros(8)]))
    treated, cycles = np.tile([1.0, 0.0], 8), np.repeat(np.arange(8), 2)
    reg = bucket_regression(y, treated, cycles, lags=1)
    assert reg.r1 > 0.5 and reg.newey_west and reg.se > reg.se_cluster
    alternating = np.ravel(np.column_stack([0.05 + 0.05 * (-1.0) ** np.arange(8), np.zeros(8)]))
    reg = bucket_regression(alternating, treated, cycles, lags=1)
    assert reg.r1 < 0 and not reg.newey_west and reg.se == pytest.approx(reg.se_cluster)


def test_hour_of_day_effects_keep_a_metrics_gap_from_biasing_the_estimate():
    # a strong daily cycle and no effect; the treatment periods lost their 03-15 UTC samples (the peak)
    periods = []
    for i in range(10):
        start = T0 + i * DAY
        t = start + (np.arange(24 * 12) + 0.5) * 300.0
        hod = (t // 3600) % 24
        x = np.exp(0.2 * np.sin(2 * np.pi * (hod - 3) / 24) + 0.01 * np.cos(t))
        keep = (hod < 3) | (hod >= 15) if i % 2 == 0 else np.ones(t.size, dtype=bool)
        periods.append(Period("treatment" if i % 2 == 0 else "control", x[keep], start, start + DAY, t[keep]))
    by_hour = judge_switchback(MEDIAN, periods, bucket="hour")
    by_period = judge_switchback(MEDIAN, periods, bucket="period")
    assert by_hour.effect == pytest.approx(1.0, abs=0.005) and "hour-of-day fixed effects" in by_hour.method
    assert by_period.effect < 0.9  # the treatment's statistic comes from the trough hours only


def test_sparse_samples_make_one_bucket_per_period():
    v = judge_switchback(MEDIAN, ar1_switchback(1, per_hour=4))
    assert "period buckets" in v.detail and "14 period buckets" in v.detail
    v = judge_switchback(MEDIAN, ar1_switchback(1))
    assert "hour buckets" in v.detail and "cycle and hour-of-day fixed effects" in v.method


# --- the engine: cycles appended while the analysis is undecided, FAIL stops on the control values ---


def test_burnout_is_a_plan_key_that_reaches_the_engine():
    text = open(PLAN).read().replace('washout = "2h"', 'washout = "2h"\nburnout = "30m"')
    assert parse_plan(text).switchback.burnout == dt.timedelta(minutes=30)
    assert spec_from_plan(parse_plan(text)).burnout == dt.timedelta(minutes=30)
    assert load_plan(PLAN).switchback.burnout == dt.timedelta(0)  # none unless the plan says so
    with pytest.raises(PlanError, match="washout and burnout together must be shorter than the period"):
        parse_plan(text.replace('burnout = "30m"', 'burnout = "22h"'))


def test_the_spec_knows_the_appendable_cycles():
    spec = spec_from_plan(load_plan(PLAN))  # 7 cycles: 3 may be appended
    assert (spec.n_stages, spec.last_stage, spec.max_appended_cycles) == (14, 20, 3)
    assert [spec.stage(i).name for i in (14, 15, 16, 20)] == ["control-7", "treatment-8", "control-8", "control-10"]
    assert spec.stage(15).values == spec.stage(1).values and spec.stage(16).values == spec.stage(2).values
    assert [spec.may_end(i) for i in (13, 14, 15, 16)] == [False, True, False, True]
    assert horizon_cycles(7) == 10


def _at_cycle_end(spec, stage, outcome):
    counters = tuple((c.name, Counters(latest=outcome, consecutive_success=int(outcome == "pass")))
                     for c in spec.criteria)
    at = dt.datetime(2027, 6, 1, tzinfo=dt.timezone.utc)
    return Status(state=MEASURING, stage=stage, values=spec.values_of(stage), stage_va=at - dt.timedelta(days=1),
                  decision_at=at, counters=counters), at


def test_an_undecided_final_analysis_appends_a_cycle_at_a_time_then_pauses():
    spec = spec_from_plan(load_plan(PLAN))
    st, at = _at_cycle_end(spec, 14, "inconclusive")
    out = step(spec, st, DecisionDue(at, 14))
    assert out.decision == "cycle-appended:1" and out.status.state == TRANSITIONING and out.status.stage == 15
    assert out.message.startswith("cycle appended: 1 of 3 (treatment-8, control-8)")
    assert dict(out.transition.values) == {KIST: 2}
    st, at = _at_cycle_end(spec, 15, "inconclusive")  # an appended treatment period goes on to its control
    assert step(spec, st, DecisionDue(at, 15)).status.stage == 16
    st, at = _at_cycle_end(spec, 18, "inconclusive")
    assert step(spec, st, DecisionDue(at, 18)).decision == "cycle-appended:3"
    st, at = _at_cycle_end(spec, 20, "inconclusive")
    out = step(spec, st, DecisionDue(at, 20))
    assert out.status.state == PAUSED and out.status.reasons == {"inconclusive"} and out.transition is None
    assert "after 3 appended cycle(s)" in out.message
    st, at = _at_cycle_end(spec, 16, "pass")
    assert step(spec, st, DecisionDue(at, 16)).status.state == COMPLETED


def test_a_fail_on_the_treatment_stops_alternation_on_the_control_values():
    spec = spec_from_plan(load_plan(PLAN))
    st, at = _at_cycle_end(spec, 3, "inconclusive")  # treatment-2
    out = step(spec, st, Evaluate(at, (MachineVerdict("1 MiB downloads", "fail", detail="+50 %"),)))  # on_fail hold
    assert out.status.state == ROLLING_BACK and dict(out.transition.values) == {KIST: 3}
    va = out.transition.target_va
    out = step(spec, out.status, ConsensusCheck(va, va, ((KIST, 3),)))
    assert out.status.state == PAUSED and out.status.reasons == {"criterion-hold"}
    assert out.status.stage == 4 and out.decision == "stopped:hold"  # control-2, its cycle's control period
    st, at = _at_cycle_end(spec, 4, "inconclusive")  # already on the control values: nothing to vote
    out = step(spec, st, Evaluate(at, (MachineVerdict("1 MiB downloads", "fail"),)))
    assert out.transition is None and out.status.state == PAUSED and out.decision == "rollback:hold"


def _short_copy(threshold: str) -> object:
    text = open(PLAN).read().replace('duration = "3d"', 'duration = "1d"').replace("cycles = 7", "cycles = 4")
    return parse_plan(text.replace("threshold = 0.10", f"threshold = {threshold}"))


@pytest.mark.slow  # 13 days of hourly rounds of nine fake authorities
def test_dry_run_without_an_effect_appends_cycles_up_to_half_then_pauses(tmp_path):
    # a 1 % limit on the 1 MiB median: 4 cycles of 24 h cannot tell it from no change
    write_predictions(tmp_path / "e", {"baseline": {}, "treatment": {}, "control": {}}).close()
    r = dry_run(_short_copy("0.01"), tmp_path / "e")
    assert r.final_state == "PAUSED" and "inconclusive" in r.status
    made = [d["decision"] for d in r.decisions]
    assert [d for d in made if d.startswith("cycle-appended")] == ["cycle-appended:1", "cycle-appended:2"]
    assert made[-1] == "pause:inconclusive"
    # 4 planned and 2 appended cycles alternate 2 and 3 ms; the pause leaves the control's 3 ms
    assert [c["params"][KIST] for c in r.consensus_changes] == [3] + [2, 3] * 6
    assert r.rollbacks == ()


def test_dry_run_with_a_50_percent_rise_fails_and_stops_on_the_control_values(tmp_path):
    write_predictions(tmp_path / "e", {"baseline": {}, "treatment": {}, "control": {}}).close()
    r = dry_run(_short_copy("0.10"), tmp_path / "e", injections=["stage=1:client_ttlb_1mib_s=+50%"])
    assert r.final_state == "PAUSED" and "criterion-hold" in r.status
    assert [c["params"][KIST] for c in r.consensus_changes] == [3, 2, 3]
    (rb,) = r.rollbacks
    assert rb["kind"] == "hold" and rb["targets"] == {KIST: 3} and "1 MiB downloads" in rb["cause"]
    assert [d["decision"] for d in r.decisions][-2:] == ["rollback:hold", "stopped:hold"]
