"""The rollback judge: PASS / FAIL / INCONCLUSIVE for a plan criterion (docs/judge.md).

Public API (stable):

    judge(criterion, baseline, stage, *, sequential_state=None, alpha_fail=0.05, alpha_pass=0.05,
          now=None, stale_after=None, washout_until=None, final=False, min_relays=10) -> Verdict

* ``criterion``: a kistexp.plan.model.Criterion or a CriterionSpec (statistic, comparison,
  threshold, min_samples[, metric, name]). Statistics: mean, median, p10..p99, shift
  (Hodges–Lehmann); comparisons: relative-/absolute-increase/-decrease, above, below.
* ``baseline`` / ``stage``: sequences of floats or Window(values, times=epoch s, excluded);
  Counts(events, exposure[, dispersion, newest]) for rare events; or mappings
  relay fingerprint -> samples for per-relay paired comparisons.
* ``sequential_state``: None = one fixed-horizon look (90 % interval, 5 % per direction);
  SequentialState.plan(planned_stage=N, method="obf"|"pocock"|"mixture") for hourly looks
  ("pocock": flat boundaries, for tripwires), then
  ``verdict.state`` of the previous look.
* ``relay_weights`` (keyword): relay -> baseline bandwidth; the bandwidth-weighted paired
  change decides bandwidth metrics and is reported for the others.
* Windows with times on both sides: the baseline is re-weighted to the stage's hours of day.
* Verdict (frozen): outcome, reason, effect, ci_low, ci_high, bound, n_baseline, n_stage,
  rule, detail, statistic, comparison, threshold, method, sequential, look, information,
  c_fail, c_pass, excluded, warnings, state, criterion; ``jsonout.to_json(verdict)`` for JSON.

    judge_switchback(criterion, periods, *, washout=0.0, burnout=0.0, planned_cycles=None,
                     sequential_state=None, alpha_fail=0.05, alpha_pass=0.05, final=False,
                     min_cycles=MIN_CYCLES, bucket="auto", lags=1) -> Verdict

* ``periods``: Period(arm="treatment"|"control", values, start, end[, times]) (epoch s);
  each period's first ``washout`` and last ``burnout`` seconds are dropped; adjacent
  opposite-arm periods form cycles; the effect is the slope of a regression of hour (or
  period) bucket log-statistics on the arm with cycle and hour-of-day fixed effects, its SE
  clustered by cycle with a Newey-West term, t over cycles (spec §6).
  ``planned_cycles`` starts sequential looks at cycle ends; then pass ``verdict.state``.
"""

from kistexp.judge.core import COMPARISONS, MIN_EVENTS, MIN_RELAYS, STATISTICS, JudgeError, judge
from kistexp.judge.model import OUTCOMES, REASONS, Counts, CriterionSpec, SequentialState, Verdict, Window
from kistexp.judge.switchback import MIN_CYCLES, Period, judge_switchback

__all__ = [
    "COMPARISONS", "MIN_EVENTS", "MIN_RELAYS", "OUTCOMES", "REASONS", "STATISTICS",
    "Counts", "CriterionSpec", "JudgeError", "MIN_CYCLES", "Period", "SequentialState", "Verdict", "Window",
    "judge", "judge_switchback",
]
