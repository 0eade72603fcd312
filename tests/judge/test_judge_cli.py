"""`kistexp judge compare` and `kistexp judge PLAN --dir EXP`."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import KistexpError
from kistexp.expdir import ExperimentDir
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore
from tests.plan_helpers import VALID_PLAN

HK6A = "onionperf/2021-06-01.op-hk6a.onionperf.analysis.json.xz"
HK5 = "onionperf/2021-01-01.op-hk5.onionperf.analysis.json.xz"
runner = CliRunner()


def quantile_sample(n: int) -> np.ndarray:
    return np.exp(0.6 * norm.ppf((np.arange(1, n + 1) - 0.5) / n))


def _write(path, values):
    path.write_text("# seconds\n" + "\n".join(f"{v:.9g}" for v in values) + "\n\n")
    return str(path)


def _compare(*args):
    return runner.invoke(app, ["judge", "compare", *args])


CRIT = ["--statistic", "median", "--comparison", "relative-increase", "--threshold", "0.10"]


def test_compare_number_files_json(tmp_path):
    base = _write(tmp_path / "b.txt", quantile_sample(2000))
    stage = _write(tmp_path / "s.txt", quantile_sample(2000) * 1.25)
    r = _compare("--baseline", base, "--stage", stage, *CRIT, "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["outcome"] == "fail" and v["n_baseline"] == v["n_stage"] == 2000
    assert (round(v["ci_low"], 3), round(v["ci_high"], 3)) == (1.202, 1.300)
    assert "Bonett-Price" in v["rule"]


def test_compare_table_and_csv_column(tmp_path):
    csv = tmp_path / "w.csv"
    rows = ["when,ttlb"] + [f"2021-06-01,{v:.6f}" for v in quantile_sample(400)]
    csv.write_text("\n".join(rows) + "\n")
    stage = _write(tmp_path / "s.txt", quantile_sample(400) * 1.05)
    r = _compare("--baseline", f"{csv}:ttlb", "--stage", stage, *CRIT)
    assert r.exit_code == 0, r.output
    assert "INCONCLUSIVE" in r.output and "[0.9619, 1.146]" in r.output and "400" in r.output
    assert "effect: median of the samples, stage / baseline, ratio 1.05 = +5.0 % change [-3.8 %, +14.6 %]" \
        in r.stdout
    assert r.stderr == ""


def test_csv_with_byte_order_mark(tmp_path):
    from kistexp.judge.inputs import read_samples

    f = tmp_path / "sheet.csv"
    f.write_bytes("\ufeffttlb,other\n1.5,x\n2.5,y\n".encode())
    assert list(read_samples(f"{f}:ttlb").values) == [1.5, 2.5]


def test_compare_onionperf_build_times(shared_data, tmp_path):
    path = shared_data / HK6A
    r = _compare("--baseline", f"{path}@build-time", "--stage", f"{path}@build-time", *CRIT, "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["n_stage"] == 5841 and v["outcome"] == "pass" and v["effect"] == pytest.approx(1.0)


@pytest.mark.parametrize(("content", "source", "message"), [
    ("# nothing\n\n", "{f}", "{f}: no numbers"),
    ("1.0\n2.0\nfast\n", "{f}", "{f}:3: 'fast' is not a number"),
    ("a,b\n1,2\n", "{f}:c", "{f}: no column 'c' (columns: a, b)"),
    ("a,b\n1,2\n3,x\n", "{f}:b", "{f}:3: column b: 'x' is not a number"),
    (None, "{f}", "{f}: no such file"),
])
def test_compare_bad_input_one_line_error(tmp_path, content, source, message):
    f = tmp_path / "data.txt"
    if content is not None:
        f.write_text(content)
    good = _write(tmp_path / "good.txt", quantile_sample(300))
    r = _compare("--baseline", source.format(f=f), "--stage", good, *CRIT)
    assert r.exit_code == 1 and isinstance(r.exception, KistexpError)
    text = str(r.exception)
    assert message.format(f=f) in text and "\n" not in text


def test_compare_bad_input_through_main_exits_1(tmp_path):
    import subprocess
    import sys

    f = tmp_path / "empty.txt"
    f.write_text("\n")
    proc = subprocess.run([sys.executable, "-m", "kistexp", "judge", "compare", "--baseline", str(f), "--stage",
                           str(f), *CRIT], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == f"kistexp: error: {f}: no numbers (one number per " \
        "line expected)"


def test_compare_sequential_state_file_chains_looks(tmp_path):
    base = _write(tmp_path / "b.txt", quantile_sample(4000))
    state = tmp_path / "state.json"
    seen = []
    for n in (500, 1000, 2000):
        stage = _write(tmp_path / f"s{n}.txt", quantile_sample(n) * 1.3)
        r = _compare("--baseline", base, "--stage", stage, *CRIT, "--state", str(state), "--json")
        assert r.exit_code == 0, r.output
        seen.append(json.loads(r.output))
    assert [v["look"] for v in seen] == [1, 2, 3]
    assert seen[0]["c_fail"] > seen[1]["c_fail"] > seen[2]["c_fail"] > 1.645
    assert json.loads(state.read_text())["fractions"] == pytest.approx([v["information"] for v in seen])


def _stored_experiment(tmp_path, factor: float):
    """VALID_PLAN's experiment with 1 MiB download times: 7 baseline days and the first stage."""
    exp = ExperimentDir.create(tmp_path / "exp")
    store = MetricStore(exp.db)
    start = dt.datetime(2030, 1, 7, 12, tzinfo=dt.timezone.utc)
    rng = np.random.default_rng(9)
    samples = []
    for minutes in range(-7 * 24 * 60, 14 * 24 * 60, 5):
        t = start + dt.timedelta(minutes=minutes)
        value = float(np.exp(rng.normal(np.log(10.0), 0.6)))
        if minutes >= 0:
            value *= factor
        samples.append(Sample(t, value, {"source": "op-test", "server": "public", "size": "1048576"}))
    store.add_samples("client_ttlb_1mib_s", samples)
    exp.close()
    plan = tmp_path / "plan.toml"
    plan.write_text(VALID_PLAN)
    return str(plan), str(tmp_path / "exp")


def test_judge_plan_on_stored_metrics(tmp_path):
    plan, exp = _stored_experiment(tmp_path, 1.3)
    r = runner.invoke(app, ["judge", plan, "--dir", exp, "--now", "2030-01-30T00:00:00Z", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    first, second = data["verdicts"]
    assert first["stage"] == "two" and first["outcome"] == "fail" and first["effect"] == pytest.approx(1.3, rel=0.05)
    assert first["n_baseline"] == 7 * 24 * 12 and first["excluded"] == 36  # 3 h washout by time
    assert second["stage"] == "eight" and second["n_stage"] < first["n_stage"]


@pytest.mark.slow
def test_judge_plan_sequential_replay_and_table(tmp_path):
    plan, exp = _stored_experiment(tmp_path, 1.0)
    r = runner.invoke(app, ["judge", "plan", plan, "--dir", exp, "--now", "2030-01-21T12:00:00Z", "--sequential"])
    assert r.exit_code == 0, r.output
    assert "two" in r.output and "PASS" in r.output


CPU_CRITERION = """
[[criteria]]
name = "relay CPU"
metric = "relay_cpu_utilization"
statistic = "mean"
comparison = "relative-increase"
threshold = 0.25
min_samples = 500
on_fail = "step-back"
"""


def test_judge_plan_pairs_relays_by_value_in_effect(tmp_path):
    from kistexp.judge.plan import judge_plan
    from kistexp.plan import load_plan

    plan_path = tmp_path / "plan.toml"
    plan_path.write_text(VALID_PLAN + CPU_CRITERION)
    plan = load_plan(str(plan_path))
    exp = ExperimentDir.create(tmp_path / "exp")
    store = MetricStore(exp.db)
    rng = np.random.default_rng(21)
    samples = []
    for r in range(20):
        fpr = f"{r:040X}"
        level = float(np.exp(rng.normal(np.log(0.3), 1.15)))
        for minutes in range(-7 * 24 * 60, 2 * 24 * 60, 30):
            t = plan.start + dt.timedelta(minutes=minutes)
            propagating = 0 <= minutes < 90 + 3 * r  # relays pick the new value up one by one
            value_in_effect = 10 if minutes < 0 or propagating else 2
            value = level * float(np.exp(rng.normal(0, 0.3)))
            if value_in_effect == 2:
                value *= 1.6
            elif minutes >= 0:
                value *= 50.0  # junk while propagating: counted for the old value, never for the stage
            samples.append(Sample(t, value, {"relay": fpr}, param_value=value_in_effect))
    store.add_samples("relay_cpu_utilization", samples)
    now = plan.start + dt.timedelta(days=2)
    results = [r for r in judge_plan(plan, store, now=now) if r.metric == "relay_cpu_utilization"]
    (first,) = [r for r in results if r.stage == "two"]
    v = first.verdict
    assert v.outcome == "fail" and "paired per-relay" in v.method and "20 relays" in v.detail
    assert 1.5 < v.effect < 1.7 and v.excluded == 0
    # the FAIL error is split over the plan's two criteria (Bonferroni)
    assert v.c_fail == pytest.approx(norm.isf(0.025)) and v.c_pass == pytest.approx(norm.isf(0.05))
    exp.close()


def test_compare_above_a_level_needs_no_baseline(tmp_path):
    stage = _write(tmp_path / "s.txt", quantile_sample(500))
    r = _compare("--stage", stage, "--statistic", "p90", "--comparison", "above", "--threshold", "2.5", "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["outcome"] == "pass" and v["n_baseline"] == 0 and v["effect"] == pytest.approx(2.16, abs=0.01)
    r = _compare("--stage", stage, *CRIT)
    assert r.exit_code == 1 and "--baseline is needed" in str(r.exception)


# --- OnionPerf comparisons that mix servers or vantage points (issue 33 point 6) ------------------------

def _warnings(r) -> list[str]:
    lines = r.stderr.splitlines()
    assert all(ln.startswith("kistexp: warning: ") for ln in lines), r.stderr
    return [ln.removeprefix("kistexp: warning: ") for ln in lines]


def test_compare_warns_when_a_window_mixes_onion_and_public_transfers(shared_data):
    src = f"{shared_data / HK5}@ttlb-50kib"
    r = _compare("--baseline", src, "--stage", src, *CRIT, "--min-samples", "2")
    assert r.exit_code == 0, r.output
    assert _warnings(r) == [
        f"{side} mixes onion and public transfers (onion 2, public 3), which perform differently (onion transfers "
        "take several times as long): keep one with --server onion|public" for side in ("baseline", "stage")]
    assert "median TTLB 50 KiB (s): relative-increase 0.1" in r.stdout
    assert "effect: median TTLB 50 KiB (s), stage / baseline, ratio 1 = +0.0 % change [" in r.stdout


def test_compare_server_filter_keeps_one_kind_and_silences_the_warning(shared_data):
    src = f"{shared_data / HK5}@ttlb-50kib"
    r = _compare("--baseline", src, "--stage", src, *CRIT, "--server", "public", "--min-samples", "2", "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout)
    assert r.stderr == "" and v["input_warnings"] == []
    assert v["n_baseline"] == v["n_stage"] == 3
    r = _compare("--baseline", src, "--stage", src, *CRIT, "--server", "onion", "--json")
    assert json.loads(r.stdout)["n_stage"] == 2


def test_compare_warns_when_the_windows_differ_in_server(shared_data):
    src = f"{shared_data / HK5}@ttlb-1mib"
    r = _compare("--baseline", f"{src}/onion", "--stage", f"{src}/public", *CRIT, "--json")
    assert r.exit_code == 0, r.output
    assert _warnings(r) == ["baseline has onion transfers, stage public: the effect compares different servers"]
    assert json.loads(r.stdout)["input_warnings"] == _warnings(r)


def test_compare_warns_about_different_vantage_points_and_labels_the_effect(shared_data):
    r = _compare("--baseline", f"{shared_data / HK5}@build-time", "--stage", f"{shared_data / HK6A}@build-time",
                 *CRIT, "--json")
    assert r.exit_code == 0, r.output
    assert _warnings(r) == ["baseline is from vantage point op-hk5, stage from op-hk6a: the effect includes the "
                            "difference between vantage points"]
    v = json.loads(r.stdout)
    assert v["n_baseline"] == 897 and v["n_stage"] == 5841
    assert v["effect_percent"] == pytest.approx((v["effect"] - 1) * 100)
    pct = round(v["effect_percent"], 1)
    assert pct < -30 and v["effect_label"].startswith(f"median circuit build time (s), stage / baseline, ratio "
                                                      f"{v['effect']:.4g} = {pct:+.1f} % change [")


def test_compare_source_filter_keeps_one_vantage_point(shared_data):
    src = f"{shared_data / HK6A}@build-time"
    r = _compare("--baseline", src, "--stage", src, *CRIT, "--source", "op-hk6a", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["n_stage"] == 5841 and r.stderr == ""
    r = _compare("--baseline", src, "--stage", src, *CRIT, "--source", "op-hk5")
    assert r.exit_code == 1
    assert str(r.exception) == (f"{shared_data / HK6A}: no circuit_build_time_s samples from vantage point "
                                "'op-hk5' (the file has: op-hk6a)")


def test_mixing_warnings_for_a_window_with_two_vantage_points():
    from kistexp.judge.inputs import Source, mixing_warnings
    from kistexp.judge.model import Window

    both = Source(Window([1.0, 2.0, 3.0]), "client_ttfb_s", {"op-a": 2, "op-b": 1}, {"public": 3})
    one = Source(Window([1.0]), "client_ttfb_s", {"op-a": 1}, {"public": 1})
    assert mixing_warnings(one, both) == [
        "stage mixes 2 vantage points (op-a 2, op-b 1): keep one with --source NAME",
        "baseline is from vantage point op-a, stage from op-a, op-b: the effect includes the difference between "
        "vantage points"]
    assert mixing_warnings(None, one) == [] and mixing_warnings(Source(Window([1.0])), one) == []


@pytest.mark.parametrize(("source", "extra", "message"), [
    ("{txt}", ["--server", "public"], "{txt}: --server selects OnionPerf samples, and this is not an OnionPerf "
                                      "source (FILE@METRIC)"),
    ("{op}@build-time", ["--server", "onion"], "{op}@build-time: circuit build times have no server"),
    ("{op}@ttfb/onion", ["--server", "public"], "{op}@ttfb/onion: the source names server 'onion' but --server "
                                                "is 'public'"),
    ("{op}@ttfb", ["--server", "exit"], "{op}@ttfb: server 'exit' is not one of public, onion"),
])
def test_compare_filters_refuse_what_they_cannot_select(shared_data, tmp_path, source, extra, message):
    txt = _write(tmp_path / "s.txt", quantile_sample(300))
    op = shared_data / HK5
    r = _compare("--baseline", source.format(txt=txt, op=op), "--stage", source.format(txt=txt, op=op), *CRIT,
                 *extra)
    assert r.exit_code == 1 and isinstance(r.exception, KistexpError)
    assert str(r.exception).startswith(message.format(txt=txt, op=op)) and "\n" not in str(r.exception)


def test_compare_absolute_and_level_effects_are_labelled(tmp_path):
    base = _write(tmp_path / "b.txt", quantile_sample(500))
    stage = _write(tmp_path / "s.txt", quantile_sample(500) + 0.5)
    r = _compare("--baseline", base, "--stage", stage, "--statistic", "mean", "--comparison", "absolute-increase",
                 "--threshold", "1", "--json")
    v = json.loads(r.stdout)
    assert v["effect_percent"] is None
    assert v["effect_label"] == f"mean of the samples, stage - baseline, difference {v['effect']:.4g} in the " \
        "samples' units"
    r = _compare("--stage", stage, "--statistic", "p90", "--comparison", "above", "--threshold", "2.5")
    assert "effect: p90 of the samples, stage window: 2.652 (compared with the level 2.5)" in r.stdout
