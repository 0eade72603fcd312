"""KX201 knows what each stage can detect (issue 35, point 2): the engine's sample model, washout, sequential
boundary and alpha shares; a baseline too short for any extension; one line per repeated finding."""

from __future__ import annotations

import datetime as dt
import json
import math
import re

import pytest
from plan_helpers import VALID_PLAN
from scipy.stats import norm
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.metrics import catalogue
from kistexp.plan import parse_plan
from kistexp.plan.lint import detectable_changes, lint_paths
from kistexp.rollout.spec import spec_from_plan
from kistexp.stats import power
from kistexp.stats.sequential import mixture_boundary

NOW = dt.datetime(2029, 12, 1, tzinfo=dt.timezone.utc)
Z80 = norm.ppf(0.8)
# DEFF of a median of 24 samples an hour (2 vantage points at 12/h) under the AR(1) hour effect measured in real
# OnionPerf data (spec judge.md §5.4: SD 0.06, lag-1 0.8): 1 + 0.06^2 (1.8/0.2) / (pi/2 0.6^2 / 24) = 2.375
DEFF_MEDIAN = 1 + 0.06**2 * (1.8 / 0.2) / (math.pi / 2 * 0.6**2 / 24)
V_MEDIAN = math.pi / 2 * 0.6**2 * DEFF_MEDIAN  # kappa sigma^2 DEFF of client transfer medians
THREE_DAYS = VALID_PLAN.replace('duration = "7d"', 'duration = "3d"', 1)


def _lint(tmp_path, text):
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return lint_paths([str(path)], now=NOW)


def _kx201(report):
    return [f for f in report.findings if f.code == "KX201"]


def test_detectable_change_is_the_engines_design(tmp_path):
    """14d stages after a 7d baseline: the engine measures after its 2 h washout from 2 OnionPerf vantage
    points at 12/h and judges with the normal-mixture sequence tuned at half the planned stage."""
    plan = parse_plan(VALID_PLAN, "plan.toml")
    spec = spec_from_plan(plan)
    assert spec.washout == dt.timedelta(hours=2)
    metric = catalogue.get("client_ttlb_1mib_s")
    n_s, n_b = catalogue.samples_in(metric, 14 * 24 - 2), catalogue.samples_in(metric, 7 * 24)
    assert (n_s, n_b) == (8016, 4032)
    c = float(mixture_boundary((2 / n_s + 1 / n_b) / (1 / n_s + 1 / n_b), 0.05))
    se = math.sqrt(V_MEDIAN * (1 / n_s + 1 / n_b))
    expected = math.exp(math.log(1.1) + (c + Z80) * se) - 1
    found = detectable_changes(plan)
    assert [(d.stage, d.n_stage, d.n_baseline) for d in found] == [("two", n_s, n_b), ("eight", n_s, n_b)]
    assert found[0].change == pytest.approx(expected, rel=1e-9)
    assert found[0].change == pytest.approx(0.1925, abs=0.001)
    assert _lint(tmp_path, VALID_PLAN).findings == ()


def test_fail_alpha_is_the_criterions_share(tmp_path):
    criterion = VALID_PLAN[VALID_PLAN.index("[[criteria]]"):]
    text = VALID_PLAN + "\n" + criterion.replace("client_ttlb_1mib_s", "client_ttlb_50kib_s")
    found = detectable_changes(parse_plan(text, "plan.toml"))
    assert {d.alpha_fail for d in found} == {0.025}
    # a smaller share, a larger boundary: less detectable than the criterion alone
    alone = detectable_changes(parse_plan(VALID_PLAN, "plan.toml"))[0]
    assert found[0].change > alone.change
    tripwire = text.replace('on_fail = "step-back"', 'on_fail = "step-back"\ncritical = true', 1)
    assert [d.alpha_fail for d in detectable_changes(parse_plan(tripwire, "plan.toml"))][:2] == [0.001, 0.049]


def test_three_day_baseline_is_too_short_for_any_extension(tmp_path):
    """The issue's newcomer: a 3-day baseline, limit 10 % on 1 MiB download times. With n_B = 1,728 the interval
    never gets narrower than the baseline's own se = 0.0279, and at the mixture's best boundary (2.764, an
    endless stage) a +20 % rise FAILs with Phi(ln(1.2/1.1)/0.0279 - 2.764) = 0.64 < 0.8: an error, whatever the
    stage's length."""
    n_b = 24 * 72
    se_b = math.sqrt(V_MEDIAN / n_b)
    best = norm.cdf(math.log(1.2 / 1.1) / se_b - 2.764)
    assert best == pytest.approx(0.639, abs=0.002)
    endless = math.exp(math.log(1.1) + (2.764 + Z80) * se_b) - 1  # +20.6 %
    # the least baseline an endless stage needs: n_B >= v (c + z)^2 / delta^2 = 2,307 samples = 97 h
    least = math.ceil(V_MEDIAN * (2.764 + Z80) ** 2 / math.log(1.2 / 1.1) ** 2 / 24)
    assert least == 97

    (finding,) = _kx201(_lint(tmp_path, THREE_DAYS))
    assert finding.severity == "error" and finding.key == "stages[0].duration"
    assert finding.message.startswith("stages 'two' (14d), 'eight' (14d): criterion 'client_ttlb_1mib_s' can "
                                      "detect +22.9 % (limit +10 %); 53 % power to FAIL at +20 %")
    assert f"no extension gets below {endless * 100:+.1f} %: the 3d baseline is too short" in finding.message
    fix = re.search(r"a (\S+) baseline would let the stage reach 80 %", finding.message).group(1)
    assert fix == "5d16h"
    fixed = THREE_DAYS.replace('duration = "3d"', f'duration = "{fix}"', 1)
    assert _kx201(_lint(tmp_path, fixed)) == []
    # a stage too short as well: the baseline needs at least the endless stage's 97 h, and the stage more time
    short = THREE_DAYS.replace('duration = "14d"', 'duration = "3d"')
    (finding,) = _kx201(_lint(tmp_path, short))
    assert finding.message.endswith("the baseline needs 4d1h or more, and the stage more time")


def test_power_levels_follow_spec_4_4(tmp_path):
    """Warn below 80 % power, error below 50 %; the named duration lints clean."""
    levels = {}
    for stage in ("3d", "4d", "8d"):
        (finding,) = _kx201(_lint(tmp_path, VALID_PLAN.replace('duration = "14d"', f'duration = "{stage}"', 1)))
        p_fail = int(re.search(r"; (\d+) % power to FAIL", finding.message).group(1))
        levels[stage] = (finding.severity, p_fail)
        need = re.search(r"; (\S+) would reach 80 %$", finding.message).group(1)
        assert _kx201(_lint(tmp_path, VALID_PLAN.replace('duration = "14d"', f'duration = "{need}"', 1))) == []
    assert levels["3d"][0] == "error" and levels["3d"][1] < 50
    assert levels["4d"][0] == "warning" and 50 <= levels["4d"][1] < 80
    assert levels["8d"][0] == "warning"


def test_repeated_findings_are_one_line(tmp_path):
    """Two criteria over two stages of one length: one line naming both stages, both criteria and one
    detectable change (the same for both metrics' defaults)."""
    criterion = VALID_PLAN[VALID_PLAN.index("[[criteria]]"):]
    text = (VALID_PLAN.replace('duration = "14d"', 'duration = "4d"') + "\n"
            + criterion.replace("client_ttlb_1mib_s", "client_ttlb_50kib_s") + 'name = "50 KiB downloads"\n')
    (finding,) = _kx201(_lint(tmp_path, text))
    assert re.fullmatch(r"stages 'two' \(4d\), 'eight' \(4d\): criteria 'client_ttlb_1mib_s', '50 KiB downloads' "
                        r"can detect \+\d+\.\d % \(limit \+10 %\); \d+ % power to FAIL at \+20 %(, \d+ % to PASS at "
                        r"no change)?; \S+ would reach 80 %", finding.message), finding.message


def test_baseline_below_min_samples(tmp_path):
    text = VALID_PLAN.replace('duration = "7d"', 'duration = "3h"', 1)
    findings = [f for f in _lint(tmp_path, text).findings if f.key == "baseline.duration"]
    assert [f.severity for f in findings] == ["error"]
    assert findings[0].message == ("criterion 'client_ttlb_1mib_s' needs 5h: the 3h baseline gathers 72 samples of "
                                   "client_ttlb_1mib_s, fewer than 100, so no stage can be decided (24 a collection: "
                                   "12/h from each of 2 OnionPerf vantage points)")


def _relay_plan(threshold: float) -> str:
    return VALID_PLAN.replace('metric = "client_ttlb_1mib_s"', 'metric = "relay_cpu_utilization"').replace(
        'statistic = "median"', 'statistic = "mean"').replace("threshold = 0.1", f"threshold = {threshold}")


def test_relay_metrics_are_judged_over_the_engines_relays(tmp_path, monkeypatch):
    """Relay CPU is compared relay by relay over the relays measured. The signed-rank interval over 10 relays
    has no bound at the mixture's boundary (2.77 at the stage's end > 2.70), so the judge takes the paired t
    interval (t quantile with the boundary's tail, 9 df) and the forecast does too: the relay-to-relay spread of
    the change (0.2) is what keeps it below 80 %, and the message names the relays or the limit that would do."""
    monkeypatch.setattr(catalogue, "RELAY_INSTANCES", 10)  # a network with only 10 relays measured
    (finding,) = _kx201(_lint(tmp_path, _relay_plan(0.25)))
    assert finding.severity == "error"
    assert finding.message.startswith("stages 'two' (14d), 'eight' (14d): criterion 'relay_cpu_utilization' "
                                      "can detect +65.7 % (limit +25 %); 23 % power to FAIL at +50 %, 47 % to "
                                      "PASS at no change; with the engine's 10 relays at a relay-to-relay spread "
                                      "of 0.2 no stage or baseline length reaches 80 %")
    relays = int(re.search(r": (\d+) relays would reach 80 %", finding.message).group(1))
    # the same arithmetic from kistexp.stats.power: the first relay count whose power reaches 80 % on both sides
    n_s, n_b = 600 * (14 * 24 - 2), 600 * 7 * 24
    c = power.boundary("mixture", 0.05, n_s, n_b, n_s)

    def least(r):
        var = power.Variability("relay", 0.3, 2.0, 0.3, spread=0.2, relays=r)
        return min(power.decision_power("mean", "relative-increase", 0.25, var, n_s, n_b, c, c_pass=c))

    assert least(relays) >= 0.8 > least(relays - 1)
    assert power.signed_rank_limit(10) < c and power.paired_t_decides(10, c)


def test_relay_spread_bounds_what_more_time_detects(tmp_path, monkeypatch):
    """With 30 relays the judge's interval is bounded (up to c = 4.76), but the relay-to-relay spread of the
    change (0.2) keeps a 10 % limit on CPU below 80 % power however long stage and baseline run: the message
    names the relays or the wider limit that would reach it, and the limit named lints clean."""
    monkeypatch.setattr(catalogue, "RELAY_INSTANCES", 30)
    (finding,) = _kx201(_lint(tmp_path, _relay_plan(0.1)))
    assert finding.severity == "error"
    assert "with the engine's 30 relays at a relay-to-relay spread of 0.2 no stage or baseline length reaches " \
           "80 %: " in finding.message
    found = re.search(r": (\d+) relays would reach 80 %, or a limit of \+(\d+) %$", finding.message)
    assert found, finding.message
    assert int(found.group(1)) > 30
    wider = _relay_plan(int(found.group(2)) / 100)
    assert _kx201(_lint(tmp_path, wider)) == []


def test_cli_json_and_show(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(VALID_PLAN)
    runner = CliRunner()
    result = runner.invoke(app, ["lint", str(path), "--json", "--now", "2029-12-01T00:00:00Z"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["detectable"]
    assert [(r["stage"], r["criterion"]) for r in rows] == [("two", "client_ttlb_1mib_s"),
                                                            ("eight", "client_ttlb_1mib_s")]
    assert rows[0]["detectable_change"] == pytest.approx(0.1925, abs=1e-4)
    assert rows[0]["power_fail"] > 0.8 and rows[0]["alpha_fail"] == 0.05
    result = runner.invoke(app, ["show", str(path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("Smallest change"):]
    assert re.search(r"client_ttlb_1mib_s\s+│ \+10 %\s+│ \+19\.3 %\s+│ 87 %\s+│ all", table), table
    shown = json.loads(runner.invoke(app, ["show", str(path), "--json"]).output)
    assert shown["detectable"] == rows
