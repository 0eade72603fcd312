"""Starting and resuming live runs: the plan-change refusal and the journal checks (rollout.md §3.8)."""

import pytest

from kistexp.clock import RealClock
from kistexp.dirauth.schedule import AcceleratedSchedule
from kistexp.rollout.runs import embedded_delay_s, open_run
from kistexp.rollout.spec import LIVE_CADENCE, RolloutError
from tests.plan_helpers import VALID_PLAN


def _open(plan, exp, **kw):
    setup = open_run(plan, exp, "instructions", LIVE_CADENCE, RealClock(), **kw)
    setup.journal.close()
    setup.lock.release()
    return setup


def test_an_edited_plan_is_refused_saying_what_changed_until_accepted(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN)
    exp = tmp_path / "exp"
    first = _open(plan, exp)
    assert (exp / "plan.toml").is_file()
    plan.write_text(VALID_PLAN + "\n# a comment changes the bytes, not the plan\n")
    assert _open(plan, exp).spec == first.spec  # raw-only edits pass
    plan.write_text(VALID_PLAN.replace('duration = "14d"', 'duration = "7d"', 1))
    with pytest.raises(RolloutError, match=r"changed since the run started \(stages\[0\]\.duration: "
                                           r"1209600\.0 -> 604800\.0\).*--accept-plan-change"):
        _open(plan, exp)
    accepted = _open(plan, exp, accept_plan_change=True)
    assert accepted.spec.stages[0].duration.days == 7
    again = _open(plan, exp)  # acknowledged once, then it is the plan of record
    assert again.spec == accepted.spec


def test_another_experiment_or_mode_on_the_same_directory_is_refused(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN)
    _open(plan, tmp_path / "exp")
    other = tmp_path / "other.toml"
    other.write_text(VALID_PLAN.replace('name = "test-plan"', 'name = "other-plan"'))
    with pytest.raises(RolloutError, match="the journal is experiment 'test-plan', not 'other-plan'"):
        _open(other, tmp_path / "exp")
    with pytest.raises(RolloutError, match="started with --authorities instructions, not fake"):
        setup = open_run(plan, tmp_path / "exp", "fake", LIVE_CADENCE, RealClock())
        setup.lock.release()


@pytest.mark.parametrize(("interval_s", "delay_s"), [(2, 0.5), (4, 1.0), (10, 1.0), (60, 5.0), (3600, 300.0)])
def test_embedded_authorities_get_at_least_a_second_to_vote_within_tors_quarter_rule(interval_s, delay_s):
    # the embedded authorities share the run's process: the live 300 s of 3600 scaled, but at least 1 s
    # each, and tor's rule (Vote + Dist > Interval/2: both Interval/4) still bounds them
    d = embedded_delay_s(interval_s)
    timing = AcceleratedSchedule.scaled(interval_s, d, d)
    assert (timing.vote_delay_s, timing.dist_delay_s) == (pytest.approx(delay_s), pytest.approx(delay_s))
