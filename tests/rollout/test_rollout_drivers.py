"""Triggers' fire times, and one plan through the live (APScheduler) and the virtual driver."""

import datetime as dt
import time

import pytest

from kistexp.clock import UTC, RealClock, VirtualClock
from kistexp.dirauth.schedule import AcceleratedSchedule
from kistexp.metrics.store import MetricStore
from kistexp.plan.loader import parse_plan
from kistexp.rollout.drivers import LiveDriver, VirtualDriver
from kistexp.rollout.dryrun import PredictedMetrics, initial_configs, load_curves
from kistexp.rollout.engine import Engine
from kistexp.rollout.journal import Journal
from kistexp.rollout.spec import LIVE_CADENCE, Cadence, spec_from_plan
from kistexp.rollout.triggers import TorScheduleTrigger, interval_trigger
from tests.model_authorities import SimulatedAuthorities
from tests.plan_helpers import VALID_PLAN
from tests.rollout_helpers import write_predictions

VA = dt.datetime(2027, 3, 1, 12, 0, tzinfo=UTC)


def test_tor_schedule_trigger_fires_at_tor_round_instants_live():
    votes = TorScheduleTrigger(LIVE_CADENCE, "votes")
    # the 12:00 vote is built at 11:50; vote_check 60 s later
    assert votes.get_next_fire_time(None, VA - dt.timedelta(minutes=30)) == VA - dt.timedelta(minutes=9)
    assert votes.get_next_fire_time(VA - dt.timedelta(minutes=9), VA) == VA + dt.timedelta(minutes=51)
    deadline = TorScheduleTrigger(LIVE_CADENCE, "deadline", VA)
    assert deadline.get_next_fire_time(None, VA - dt.timedelta(hours=5)) == VA - dt.timedelta(minutes=12)
    assert deadline.get_next_fire_time(VA - dt.timedelta(minutes=12), VA) is None  # once only
    window = TorScheduleTrigger(LIVE_CADENCE, "window", VA)
    # a reload before 10:50 lands in the 11:00 consensus, an hour early (§2.1)
    assert window.get_next_fire_time(None, VA) == VA - dt.timedelta(hours=1, minutes=10)
    publish = TorScheduleTrigger(LIVE_CADENCE, "publish")
    assert publish.get_next_fire_time(None, VA) == VA + dt.timedelta(minutes=1)


def test_interval_trigger_catches_up_from_its_previous_fire_time():
    t = interval_trigger(dt.timedelta(hours=1), VA)
    assert t.get_next_fire_time(None, VA - dt.timedelta(hours=3)) == VA
    # after downtime the next run is previous + interval even if that is in the past (§2.5)
    assert t.get_next_fire_time(VA, VA + dt.timedelta(hours=5)) == VA + dt.timedelta(hours=1)


PLAN = (VALID_PLAN.replace('duration = "7d"', 'duration = "2h"').replace('duration = "14d"', 'duration = "3h"')
        .replace('gate = "manual"', 'gate = "auto"')
        .replace('metric = "client_ttlb_1mib_s"', 'metric = "relay_cpu_utilization"')
        .replace('min_samples = 100', 'min_samples = 50'))
EFFECTS = {"baseline": {}, "two": {"relay_cpu_utilization": 0.0}, "eight": {"relay_cpu_utilization": 0.60}}


def stepped_back(engine):
    return engine.status.state == "PAUSED"


def _run(tmp_path, name, spec, clock, drive):
    write_predictions(tmp_path / name, EFFECTS)
    journal = Journal(tmp_path / name / "experiment.db", durable=False)
    sim = SimulatedAuthorities(spec.authorities, initial_configs(spec), spec.cadence, clock)
    curves, levels = load_curves(MetricStore(journal.conn), spec, "plan")
    engine = Engine(spec, journal, sim, PredictedMetrics(spec, curves, levels, sim), clock)
    drive(engine)
    return [(d["decision"], d["stage"], d["valid_after"]) for d in journal.decisions()], engine


@pytest.mark.slow
def test_one_plan_through_both_drivers_gives_one_decision_log(tmp_path):
    cadence = Cadence.of(AcceleratedSchedule.scaled(4), margin_s=1.0)
    spec = spec_from_plan(parse_plan(PLAN), cadence, start=dt.datetime.now(UTC) + dt.timedelta(seconds=10))
    assert spec.baseline_start > dt.datetime.now(UTC)
    vclock = VirtualClock(spec.baseline_start - dt.timedelta(seconds=1))
    virtual, v_engine = _run(tmp_path, "virtual", spec, vclock,
                             lambda e: VirtualDriver(e, vclock).run(stop=stepped_back))
    started = time.monotonic()
    live, l_engine = _run(tmp_path, "live", spec, RealClock(),
                          lambda e: LiveDriver(e, RealClock(), poll_s=0.5, stop=stepped_back).run(timeout_s=120))
    assert time.monotonic() - started < 90
    # stage 2 costs 30 % more CPU: the criterion's on_fail (step-back) fires in stage 2 under both drivers
    assert v_engine.status.state == l_engine.status.state
    assert virtual == live
    kinds = [d for d, _, _ in virtual]
    assert "stage:1" in kinds and "stage:2" in kinds and "rollback:step-back" in kinds


def test_live_driver_skips_polls_during_a_long_step_without_warning(caplog):
    # a step longer than the poll period makes APScheduler skip polls (max_instances=1): by design,
    # and not something to print on the operator's terminal; the steps themselves all run
    class SlowEngine:
        class status:  # noqa: N801  (the attribute the driver reads)
            terminal = False

        def __init__(self) -> None:
            self.steps = 0

        def step(self, now) -> None:
            self.steps += 1
            time.sleep(0.35)

        def next_wakeup(self, now):
            return now + dt.timedelta(seconds=0.05)

    engine = SlowEngine()
    with caplog.at_level("DEBUG"):
        LiveDriver(engine, RealClock(), poll_s=0.1, stop=lambda e: e.steps >= 4).run(timeout_s=30)
    assert engine.steps >= 4
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert "maximum number of running instances" not in caplog.text
