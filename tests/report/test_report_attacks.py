"""The section "What an attacker gains" of the experiment and plan reports, and the announcement's line:
attack measures written straight into the experiment database (``MetricStore.save_attack_values``) come
out as differences stage - baseline with their 95 % intervals, flagged, plotted and counted; without
them, one sentence says how to make them."""

import base64
import html as htmllib
import json
import math
import re
import shutil
import sqlite3
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import matplotlib
import pytest
from scipy import stats
from typer.testing import CliRunner

from kistexp.anonymity import stage_differences
from kistexp.cli import app
from kistexp.expdir import ExperimentDir
from kistexp.metrics.series import AttackValue
from kistexp.metrics.store import MetricStore
from kistexp.report import attacks, plots
from kistexp.report.browser import dump_dom, find_chromium
from kistexp.report.data import load_experiment
from tests.rollout_helpers import KIST_EFFECTS, KIST_PLAN, STEP_BACK, dry_run_kist, write_predictions

TPR = "attack_flow_tpr_at_fpr_0.01"
ENTROPY = "attack_guard_entropy_after_bits"  # lower is leakier
MI_RTT = "attack_mi_region_rtt_bits"
# +0.05 TPR in 2ms over three networks (+0.04, +0.05, +0.06): mean 0.05, sd 0.01, t interval over 2 df
HALF = stats.t.ppf(0.975, 2) * 0.01 / math.sqrt(3)
BASE_TPR = (0.70, 0.72, 0.74)


def _values() -> list[AttackValue]:
    rows = []
    for n, (base, rise) in enumerate(zip(BASE_TPR, (0.04, 0.05, 0.06), strict=True)):
        rows += [AttackValue("baseline", TPR, n, base), AttackValue("2ms", TPR, n, base + rise),
                 # 5ms: +0.01, -0.01, +0.003, no significant change
                 AttackValue("5ms", TPR, n, base + (0.01, -0.01, 0.003)[n]),
                 # guard entropy left falls by 0.08, 0.09, 0.10 bits in 2ms: leakier (lower is leakier)
                 AttackValue("baseline", ENTROPY, n, 3.6), AttackValue("2ms", ENTROPY, n, 3.52 - 0.01 * n),
                 # the region leaks less by RTT: 0.009, 0.010, 0.011 bits fewer
                 AttackValue("baseline", MI_RTT, n, 0.13), AttackValue("2ms", MI_RTT, n, 0.121 - 0.001 * n)]
    return rows


def _save(path, rows) -> None:
    with ExperimentDir.open(path) as exp:
        assert MetricStore(exp.db).save_attack_values(rows) == len(rows)


def _cli(*argv):
    return CliRunner().invoke(app, list(argv))


def _text(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _section(html: str) -> str:
    start = html.index('<h2 id="attacks">')
    return html[start:html.index("<h2", start + 10)] if "<h2" in html[start + 10:] else html[start:]


def _images(html: str) -> list[tuple[str, str]]:
    return [(u, htmllib.unescape(a)) for u, a in
            re.findall(r'<img src="(data:image/svg\+xml;base64,[^"]+)" alt="([^"]*)"', html)]


def _svg_texts(uri: str) -> list[str]:
    root = ET.fromstring(base64.b64decode(uri.partition(",")[2], validate=True))
    assert root.tag.endswith("svg")
    return ["".join(t.itertext()) for t in root.iter() if t.tag.endswith("}text")]


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """A dry run of the KIST plan (no attack measures stored)."""
    path = tmp_path_factory.mktemp("attacks") / "exp"
    dry_run_kist(path, [STEP_BACK])
    return path


@pytest.fixture(scope="module")
def with_attacks(dry, tmp_path_factory):
    """The same dry run with attack measures for 2ms and 5ms over three networks, and its report."""
    path = tmp_path_factory.mktemp("with") / "exp"
    shutil.copytree(dry, path)
    _save(path, _values())
    out = path.parent / "report.html"
    result = _cli("report", str(path), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    return SimpleNamespace(path=path, out=out, html=out.read_text(), json=json.loads(result.stdout))


def test_the_differences_are_the_paired_ones_with_their_interval(with_attacks):
    figures = {(f.stage, f.measure): f for f in load_experiment(with_attacks.path).attacks}
    tpr = figures[("2ms", TPR)].difference
    assert tpr.units == 3 and tpr.mean_difference == pytest.approx(0.05)
    assert (tpr.low, tpr.high) == pytest.approx((0.05 - HALF, 0.05 + HALF))
    assert tpr.low > 0 and figures[("2ms", TPR)].leakier
    assert not figures[("5ms", TPR)].leakier and not figures[("5ms", TPR)].difference.significant
    assert figures[("2ms", ENTROPY)].leakier and figures[("2ms", ENTROPY)].difference.high < 0
    assert not figures[("2ms", MI_RTT)].leakier and figures[("2ms", MI_RTT)].difference.high < 0
    assert [k for k in figures] == [("2ms", TPR), ("2ms", ENTROPY), ("2ms", MI_RTT), ("5ms", TPR)]


def test_experiment_report_section_numbers(with_attacks):
    section = _section(with_attacks.html)
    text = _text(section)
    assert text.startswith("What an attacker gains")
    assert '<a href="#attacks">What an attacker gains</a>' in with_attacks.html
    # simulated, never measured on the live network, and how many networks back the figures
    assert "simulated networks" in text and "none of this is measured on the live Tor network" in text
    assert re.search(r'id="attack-networks">3</strong>', section)
    assert "Leakier means the attack does better than at the baseline" in text
    # the +0.05 TPR of 2ms with its t interval over three networks, flagged leakier; 5ms's straddles 0
    lo, hi = f"{0.05 - HALF:+.3f}", f"{0.05 + HALF:+.3f}"
    assert (lo, hi) == ("+0.025", "+0.075")
    row = re.search(r"flow correlation TPR at FPR 0\.01 \(0–1\).*?</tr>", section, re.S).group(0)
    cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells == ["higher", "0.72", f"+0.050 [{lo}, {hi}] leakier", "+0.001 [-0.024, +0.026]", "3"]
    assert 'class="num leakier"' in row
    # guard entropy left: lower is leakier, -0.09 bits; the region leaks 0.01 bits less by RTT: less leaky
    assert re.search(r"guard entropy left \(bits\) .*? lower 3\.6 -0\.090 \[-0\.115, -0\.065\] leakier – 3", text)
    assert re.search(r"region leaked by RTT \(bits\) .*? higher 0\.13 -0\.010 \[-0\.012, -0\.008\] less leaky – 3",
                     text)
    # the stage's leakier figures in one line
    assert (f"2ms: flow correlation TPR at FPR 0.01 +0.050 [{lo}, {hi}], guard entropy left -0.090 "
            "[-0.115, -0.065] over 3 simulated networks") in text
    assert "5ms:" not in text.split("Flow correlation")[0]
    # every attack's plain words; batching has no stored measure and no subsection
    assert "RAPTOR" in text and "Mittal et al." in text and "Hopper et al." in text
    assert "Batching" not in text


def test_experiment_report_plots_one_figure_per_attack(with_attacks, dry, tmp_path):
    images = _images(_section(with_attacks.html))
    assert len(images) == 3  # flow correlation, fingerprinting, latency
    # the report's figure count: the dry run's own and these three
    out = tmp_path / "plain.html"
    plain = json.loads(_cli("report", str(dry), "-o", str(out), "--json").stdout)
    assert with_attacks.json["figures"] == plain["figures"] + 3
    assert set(with_attacks.json) == {"report", "kind", "bytes", "figures"}
    uri, alt = images[0]
    assert alt.startswith("Error bars of the difference stage minus baseline of 1 flow correlation measure")
    assert "leakier: 2ms flow correlation TPR at FPR 0.01 +0.050 [+0.025, +0.075]" in alt
    texts = _svg_texts(uri)
    assert "↑ leakier" in texts and "2ms" in texts and "5ms" in texts and "stage − baseline" in texts
    assert "0: as at the baseline" in texts and "leakier: the interval lies wholly on the leakier side" in texts
    assert any("mean over 3 simulated networks" in t for t in texts)
    # lower is leakier for the guard's entropy: the arrow points down
    assert "↓ leakier" in _svg_texts(images[1][0])


def test_the_plot_draws_each_interval_the_zero_line_and_the_margin(monkeypatch):
    """The error bars span [low, high] at each stage, zero and the margin are horizontal lines, the leakier
    side is shaded: read back from the figure matplotlib drew."""
    drawn = []
    encode = plots._encode
    monkeypatch.setattr(plots, "_encode", lambda fig, title, alt: (drawn.append(fig), encode(fig, title, alt))[1])
    figures = stage_differences(_values(), ["2ms", "5ms"])
    criterion = SimpleNamespace(name="flow TPR", measure=TPR, comparison="absolute-increase", threshold=0.02,
                                margin=0.02)
    section = attacks.section(figures, [criterion], "kistexp simulate PLAN --dir EXP")
    flow = section["groups"][0]
    assert flow["attack"] == "flow correlation" and flow["rows"][0]["margin"] == "flow TPR: margin +0.020"
    ax = drawn[0].axes[0]
    bars = [c for c in ax.collections if isinstance(c, matplotlib.collections.LineCollection)]
    spans = sorted(tuple(sorted(round(y, 6) for y in seg[:, 1])) for b in bars for seg in b.get_segments())
    expected = sorted((round(f.difference.low, 6), round(f.difference.high, 6)) for f in figures if f.measure == TPR)
    assert spans == expected and (round(0.05 - HALF, 6), round(0.05 + HALF, 6)) in spans
    lines = {(round(line.get_ydata()[0], 6), line.get_linestyle()) for line in ax.get_lines()
             if len(line.get_xdata()) == 2 and list(line.get_xdata()) == [0, 1]}
    assert (0.0, "-") in lines and (0.02, "--") in lines
    lo, hi = ax.get_ylim()
    assert lo < 0.05 - HALF and hi > 0.05 + HALF and lo < 0 < hi
    assert any(t.get_text() == "↑ leakier" for t in ax.texts)
    assert "criterion margins: flow correlation TPR at FPR 0.01 (flow TPR: margin +0.020)" in flow["figure"].alt


def test_margins_follow_the_criterion():
    """An anonymity criterion's margin: its own where it has one, else the threshold on the side its
    comparison names; a rollout criterion carries the plan's as ``base``; a metric criterion has none."""
    tpr = attacks.describe(TPR)
    entropy = attacks.describe(ENTROPY)
    assert attacks.margin_of(SimpleNamespace(comparison="absolute-increase", threshold=0.02), tpr, 0.7) == 0.02
    assert attacks.margin_of(SimpleNamespace(comparison="absolute-decrease", threshold=0.1), entropy, 3.6) == -0.1
    assert attacks.margin_of(SimpleNamespace(comparison="", threshold=0.1), entropy, 3.6) == -0.1
    assert attacks.margin_of(SimpleNamespace(comparison="relative-increase", threshold=0.1), tpr, 0.7) == \
        pytest.approx(0.07)
    assert attacks.margin_of(SimpleNamespace(threshold="two points"), tpr, 0.7) is None
    assert attacks.criterion_measure(SimpleNamespace(name="x", base=SimpleNamespace(measure=TPR))) == TPR
    assert attacks.criterion_measure(SimpleNamespace(name="cpu", metric="relay_cpu_utilization")) is None
    # an uncatalogued false-positive rate reads like the catalogued ones
    assert attacks.describe("attack_flow_tpr_at_fpr_0.005").label == "flow correlation TPR at FPR 0.005"


def test_one_network_has_no_interval_and_no_flag():
    rows = [AttackValue("baseline", TPR, 0, 0.7), AttackValue("2ms", TPR, 0, 0.8)]
    section = attacks.section(stage_differences(rows, ["2ms"]), [], "")
    cell = section["groups"][0]["rows"][0]["cells"][0]
    assert cell["text"] == "+0.100 (1 network: no interval)" and cell["flag"] == ""
    assert section["leakier"] == [] and section["networks"] == "1"


def test_experiment_without_attack_measures_says_how_to_make_them(dry, tmp_path):
    out = tmp_path / "r.html"
    assert _cli("report", str(dry), "-o", str(out)).exit_code == 0
    section = _section(out.read_text())
    assert _images(section) == []
    assert _text(section) == (f"What an attacker gains No attack measures here: make them with kistexp simulate "
                              f"{dry / 'plan.toml'} --dir {dry} , which simulates what four traffic-analysis "
                              "attacks gain at each stage against the baseline.")


def test_a_corrupt_attack_row_is_one_line(dry, tmp_path):
    path = tmp_path / "exp"
    shutil.copytree(dry, path)
    with sqlite3.connect(path / "experiment.db") as conn:
        conn.execute("INSERT INTO attack_measures VALUES ('2ms', 'attack_made_up', 0, 0.5)")
    result = _cli("report", str(path), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 1 and "corrupt attack measures: unknown attack measure 'attack_made_up'" in str(
        result.exception)
    assert not (tmp_path / "r.html").exists()


# --- the plan report and the announcement -----------------------------------------------------------------

ANONYMITY_CRITERION = """
[[criteria]]
name = "flow TPR"
measure = "attack_flow_tpr_at_fpr_0.01"
comparison = "absolute-increase"
threshold = 0.02
on_fail = "hold"
"""


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """Predictions over three networks; a copy with the attack measures beside them."""
    root = tmp_path_factory.mktemp("plan")
    write_predictions(root / "none", KIST_EFFECTS, networks=3).close()
    shutil.copytree(root / "none", root / "with")
    _save(root / "with", _values())
    plan = root / "plan.toml"
    plan.write_text(open(KIST_PLAN).read() + ANONYMITY_CRITERION)
    return root


def test_plan_report_section_with_the_criterion_margin(predicted, tmp_path):
    out = tmp_path / "plan.html"
    result = _cli("report", str(predicted / "plan.toml"), "--dir", str(predicted / "with"), "-o", str(out))
    assert result.exit_code == 0, result.output
    section = _section(out.read_text())
    text = _text(section)
    assert "+0.050 [+0.025, +0.075] leakier" in text and "+0.001 [-0.024, +0.026]" in text
    assert "over 3 simulated networks" in text and 'id="attack-networks">3<' in section
    # the plan's anonymity criterion on the measure: its margin under the measure and on the plot
    assert "criterion flow TPR: margin +0.020" in text
    uri, alt = _images(section)[0]
    assert "criterion margins: flow correlation TPR at FPR 0.01 (flow TPR: margin +0.020)" in alt
    assert "flow TPR: margin +0.020" in _svg_texts(uri)
    assert "margin of an anonymity criterion" in _svg_texts(uri)


def test_plan_report_without_attack_measures(predicted, tmp_path):
    out = tmp_path / "plan.html"
    assert _cli("report", KIST_PLAN, "--dir", str(predicted / "none"), "-o", str(out)).exit_code == 0
    text = _text(_section(out.read_text()))
    assert f"make them with kistexp simulate {KIST_PLAN} --dir {predicted / 'none'}" in text


def test_announcement_says_which_stage_is_leakier(predicted):
    text = _cli("announce", KIST_PLAN, "--dir", str(predicted / "with")).stdout
    flat = " ".join(text.split())
    assert ("Anonymity, on simulated networks only (never measured on the live network): simple traffic-analysis "
            "attacks do significantly better than at the baseline in 2ms: flow correlation TPR at FPR 0.01 +0.050 "
            "[+0.025, +0.075], guard entropy left -0.090 [-0.115, -0.065] over 3 simulated networks.") in flat
    md = _cli("announce", KIST_PLAN, "--dir", str(predicted / "with"), "--format", "markdown").stdout
    assert "**Anonymity, on simulated networks only**" in md and r"+0.050 \[+0.025, +0.075\]" in md
    # no stored measures, or none leakier: no such line
    assert "Anonymity" not in _cli("announce", KIST_PLAN, "--dir", str(predicted / "none")).stdout


def test_an_anonymity_criterion_failed_in_a_dry_run(tmp_path):
    """A plan whose anonymity criterion (TPR may rise by at most 0.02) meets the stored +0.05 [+0.025, +0.075]:
    the dry run's verdict shows in the summary and in the stage's cell, with the margin."""
    from kistexp.plan.loader import load_plan
    from kistexp.rollout.dryrun import dry_run

    plan = tmp_path / "plan.toml"
    plan.write_text(open(KIST_PLAN).read() + ANONYMITY_CRITERION)
    write_predictions(tmp_path / "exp", KIST_EFFECTS, networks=3).close()
    _save(tmp_path / "exp", _values())
    dry_run(load_plan(str(plan)), tmp_path / "exp")
    data = load_experiment(tmp_path / "exp")
    fail = [f for f in data.summary.failures if f.criterion == "flow TPR"]
    assert [(f.stage, f.effect, f.interval, f.limit) for f in fail] == [
        ("2ms", "+0.050", "[+0.025, +0.075] on 3 simulated networks", "+0.020")]
    out = tmp_path / "r.html"
    assert _cli("report", str(tmp_path / "exp"), "-o", str(out)).exit_code == 0
    html = out.read_text()
    failed = _text(re.search(r'<dd id="summary-failed">.*?</dd>', html, re.S).group(0))
    assert "flow TPR in stage 2ms" in failed
    assert "+0.050 [+0.025, +0.075] on 3 simulated networks (limit +0.020)" in failed
    text = _text(_section(html))
    assert ("criterion flow TPR: margin +0.020 higher 0.72 +0.050 [+0.025, +0.075] leakier "
            "criterion flow TPR: fail") in text


# --- in a browser ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed")
def test_section_in_chromium(with_attacks):
    dom = dump_dom(with_attacks.out)
    section = _section(dom)
    text = _text(section)
    assert "+0.050 [+0.025, +0.075] leakier" in text and "over 3 simulated networks" in text
    for uri, alt in _images(section):
        assert _svg_texts(uri) and alt
