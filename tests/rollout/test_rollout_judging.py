"""The engine judges with kistexp.judge: hourly sequential looks, per-relay pairs, holds, and a
sequential test that survives a restart."""

import datetime as dt

import numpy as np

from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import parse_plan
from kistexp.rollout import judging
from kistexp.rollout.journal import Journal
from kistexp.rollout.spec import spec_from_plan
from kistexp.rollout.state import FAIL, INCONCLUSIVE, PASS
from tests.rollout.test_rollout_engine import SHORT_EFFECTS, SHORT_PLAN, Killed, run_with_restarts
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

CPU_PLAN = SHORT_PLAN + "\n" + RELAY_CPU_CRITERION


def _spec():
    return spec_from_plan(parse_plan(CPU_PLAN))


def _batches(spec, start, hours, per_hour, scale, rng, relays=None):
    out = []
    for h in range(hours):
        t0 = start + h * spec.hour
        if relays is None:
            out.append(judging.Batch(t0, rng.gamma(4.0, 0.05 * scale, per_hour)))
        else:
            # each relay has its own level; the stage multiplies it by ``scale``
            vals = [rng.normal(level * scale, 0.01, per_hour) for level in relays.values()]
            out.append(judging.Batch(t0, np.concatenate(vals), tuple((r, per_hour) for r in relays)))
    return out


def _look_at(spec, crit, base, stage, hours):
    b = judging.judge_input(spec, crit.metric, base)
    s = judging.judge_input(spec, crit.metric, stage)
    state = judging.planned_state(spec, 1, judging.size(s), hours)
    end = stage[-1].t0 + spec.hour if stage else spec.baseline_start
    return judging.judge_criterion(crit, b, s, state, judging.plan_seconds(spec, end))


def test_a_stage_shifted_by_half_fails_and_no_shift_passes_at_decision_time():
    spec = _spec()
    crit = spec.criterion("relay CPU")  # mean, relative-increase, limit +25 %
    rng = np.random.default_rng(7)
    base = _batches(spec, spec.baseline_start, 48, 60, 1.0, rng)
    stage_start = spec.baseline_start + 48 * spec.hour
    shifted, _ = _look_at(spec, crit, base, _batches(spec, stage_start, 3, 60, 1.5, rng), 3)
    assert shifted.outcome == FAIL
    assert 1.25 < shifted.ci_low < shifted.effect < shifted.ci_high  # ratio stage/baseline, lower bound past 1.25
    assert shifted.n_baseline == 48 * 60 and shifted.n_stage == 3 * 60
    assert "confidence sequence" in shifted.rule  # the hourly look is sequential
    same, state = _look_at(spec, crit, base, _batches(spec, stage_start, 30, 60, 1.0, rng), 30)
    assert same.outcome == PASS and same.ci_high < 1.25
    assert state.looks == 1


def test_too_few_samples_and_a_stale_stage_hold():
    spec = _spec()
    crit = spec.criterion("relay CPU")
    rng = np.random.default_rng(8)
    base = _batches(spec, spec.baseline_start, 48, 60, 1.0, rng)
    stage_start = spec.baseline_start + 48 * spec.hour
    few, _ = _look_at(spec, crit, base, _batches(spec, stage_start, 1, 50, 1.5, rng), 1)
    assert few.outcome == INCONCLUSIVE and few.reason == "insufficient_samples"  # 50 < min_samples 100
    stage = _batches(spec, stage_start, 30, 60, 1.0, rng)
    b, s = (judging.judge_input(spec, crit.metric, x) for x in (base, stage))
    state = judging.planned_state(spec, 1, s.n, 30)
    late = stage[-1].t0 + 3 * spec.hour  # two hourly batches missed
    stale, _ = judging.judge_criterion(crit, b, s, state, judging.plan_seconds(spec, late))
    assert stale.outcome == INCONCLUSIVE and stale.reason == "stale"


def test_relay_labelled_samples_are_compared_relay_by_relay():
    spec = _spec()
    crit = spec.criterion("relay CPU")
    rng = np.random.default_rng(9)
    # relays differ tenfold in load: pooled samples would hide a +50 % change in the spread
    relays = {f"relay{i:02d}": 0.05 * (1 + i) for i in range(12)}
    base = _batches(spec, spec.baseline_start, 24, 10, 1.0, rng, relays)
    stage = _batches(spec, spec.baseline_start + 24 * spec.hour, 24, 10, 1.5, rng, relays)
    b = judging.judge_input(spec, crit.metric, base)
    assert isinstance(b, dict) and sorted(b) == sorted(relays)
    v, _ = _look_at(spec, crit, base, stage, 24)
    assert v.outcome == FAIL and "12 relays" in v.detail
    assert abs(v.effect - 1.5) < 0.01


def test_the_sequential_test_survives_a_restart(tmp_path):
    spec = spec_from_plan(parse_plan(SHORT_PLAN))
    write_predictions(tmp_path / "e", SHORT_EFFECTS)
    store = MetricStore(Journal(tmp_path / "e" / "experiment.db").conn)

    def run(db, kill_after_looks=None):
        killed = {"done": False}

        def hook(name, journal):
            if kill_after_looks is None or killed["done"] or name != "mid_batch":
                return
            looks = journal.conn.execute("SELECT MAX(looks) FROM rollout_sequential").fetchone()[0] or 0
            if looks >= kill_after_looks:
                killed["done"] = True
                raise Killed(name)

        journal, _, kills = run_with_restarts(spec, db, store, hook)
        return journal, kills

    clean, _ = run(tmp_path / "e" / "experiment.db")
    (tmp_path / "k").mkdir()
    write_predictions(tmp_path / "k", SHORT_EFFECTS)
    killed, kills = run(tmp_path / "k" / "experiment.db", kill_after_looks=5)
    assert kills == 1
    states = killed.sequential_states()
    assert states == clean.sequential_states()  # the same looks, at the same information fractions
    assert states and all(s.method == "mixture" and s.looks > 5 for s in states.values())

    def verdict_rows(j):
        return j.conn.execute("SELECT criterion, phase, window_end_us, outcome, effect, record FROM rollout_verdicts "
                              "ORDER BY window_end_us, criterion").fetchall()
    assert verdict_rows(killed) == verdict_rows(clean)  # every look once, none lost or repeated
    assert [(d["decision"], d["stage"]) for d in killed.decisions()] == \
        [(d["decision"], d["stage"]) for d in clean.decisions()]
    rec = killed.verdicts()[-1]
    assert rec["record"]["n_stage"] == rec["n_stage"] and rec["rule"] == rec["record"]["rule"]
    assert dt.datetime.fromisoformat(str(rec["window_end"]))
