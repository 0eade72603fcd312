"""kistexp report and kistexp announce: what the page and the announcement show, bad input, and the
page as Chromium renders it."""

import base64
import csv
import io
import re
import stat
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.metrics.collectors import operator_report
from kistexp.plan.loader import load_plan
from kistexp.report.data import ReportError, load_experiment
from kistexp.rollout.dryrun import dry_run
from kistexp.safeio import write_atomic
from tests.rollout_helpers import KIST_EFFECTS, KIST_PLAN, STEP_BACK, dry_run_kist, write_predictions

PLAN = KIST_PLAN


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "exp"
    result = dry_run_kist(path, [STEP_BACK])
    assert [r["kind"] for r in result.rollbacks] == ["step-back"]
    return path


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    path = tmp_path_factory.mktemp("predicted") / "exp"
    write_predictions(path, KIST_EFFECTS).close()
    return path


def _cli(*argv):
    return CliRunner().invoke(app, list(argv))


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.scripts, self.external, self.text = [], 0, [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a)
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)

    def handle_data(self, data):
        self.text.append(data)


def _parse(path):
    page = _Page()
    page.feed(path.read_text())
    return page, " ".join(" ".join(page.text).split())


def _decode_svg(uri):
    head, _, payload = uri.partition(",")
    assert head == "data:image/svg+xml;base64"
    root = ET.fromstring(base64.b64decode(payload, validate=True))
    assert root.tag.endswith("svg")
    return root


def test_experiment_report_shows_the_run(rolled_back, tmp_path):
    out = tmp_path / "r.html"
    result = _cli("report", str(rolled_back), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = __import__("json").loads(result.stdout)
    assert doc == {"report": str(out), "kind": "experiment", "bytes": out.stat().st_size, "figures": 11}
    page, text = _parse(out)
    assert page.scripts == 0 and page.external == []  # self-contained, readable without JavaScript
    # timeline, one CDF per criterion in stage 1, the effects of relay CPU and of quiet circuits (the criteria
    # with an estimate: a p90 needs 50 samples), relay CPU, the rollback's recovery twice (the decided step-back
    # and the rehearsed revert)
    assert len(page.images) == 1 + 5 + 2 + 1 + 2
    for img in page.images:
        _decode_svg(img["src"])
        assert img["alt"]
    # the three criteria without an estimate are one line each, not an empty plot
    for name in ("50 KiB downloads", "1 MiB downloads", "5 MiB downloads"):
        assert re.search(rf"{name} \(\w+\): no estimate yet — 0 of \d+ looks had enough samples", text), name
    # the verdict that fired, with the judge's interval as a relative change, and the decision it caused
    assert any("stage 2ms" in i["alt"] and re.search(r"verdict fail: \+\d+\.\d % \[\+", i["alt"]) for i in page.images)
    assert re.search(r"rollback:step-back .*criterion 'relay CPU' failed \(\+\d+\.\d % \[\+\d+\.\d %, \+\d+\.\d %\] "
                     r"vs limit \+25\.0 %\) -> step-back statistics ratio stage/baseline \d\.\d+ \[", text)
    # who acted: the six participating authorities' intents, and the rollback's minimal acting set
    for auth in ("moria1", "tor26", "dizum", "gabelmoo", "dannenberg", "maatuska"):
        assert auth in text
    assert "authorities that must act dizum, dannenberg" in text
    # the consensus history the journal saw: 10 -> 2 -> 10
    assert re.search(r"KISTSchedRunInterval=10 9 of 9 .*KISTSchedRunInterval=2 9 of 9 .*KISTSchedRunInterval=10", text)
    assert "Rehearsed revert-default" in text


def test_experiment_report_data_come_from_the_journal(rolled_back):
    data = load_experiment(rolled_back)
    fail = [v for v in data.verdicts if v.outcome == "fail"]
    assert [v.criterion for v in fail] == ["relay CPU"] and fail[0].ci_low > 0.25
    # the batches the judge saw: baseline CPU around the predicted 0.40, stage 1 shifted +50 % on top of +12 %
    base, stage = data.batches[("relay_cpu_utilization", 0)], data.batches[("relay_cpu_utilization", 1)]
    assert 0.35 < np.mean(base) < 0.45 and 1.5 < np.mean(stage) / np.mean(base) < 1.9
    assert data.rollbacks[0].plan.kind == "step-back" and not data.rollbacks[0].rehearsal


def test_plan_report_before_any_run(predicted, tmp_path):
    out = tmp_path / "plan.html"
    result = _cli("report", PLAN, "--dir", str(predicted), "-o", str(out))
    assert result.exit_code == 0, result.output
    page, text = _parse(out)
    assert page.scripts == 0 and page.external == []
    for img in page.images:
        _decode_svg(img["src"])
    # medians with their 95 % range over networks and the change: 2 ms raises middle relays' CPU by 12 %
    # (two networks, the second 1 % above the first: medians 40 and 40.4 % of one core)
    assert re.search(r"relay_cpu_utilization \(% of one core\), relays: middle 40\.2 40–40\.4 "
                     r"45 \(\+12\.0 %\) 44\.8–45\.2", text)
    # the timeline: the authorities reload 10 minutes before the 2 ms stage's first consensus
    assert "2ms KISTSchedRunInterval=2 2027-03-01 12:00 UTC 2027-03-15 12:00 UTC auto 2027-03-01 11:50 UTC" in text


def test_announcement_text_and_markdown(predicted):
    text = _cli("announce", PLAN, "--dir", str(predicted))
    assert text.exit_code == 0, text.output
    out = text.stdout
    assert "Subject: [network experiment] KISTSchedRunInterval: kist-run-interval-2020" in out
    assert "middle" in out and "2ms 45 (+12.0 %)" in out  # the predicted CPU change for the class
    for auth in ("moria1", "tor26", "dizum", "gabelmoo", "dannenberg", "maatuska"):
        assert f"\n{auth}:\n  2ms            before 2027-03-01 11:50 UTC" in out
    assert "e.g. ConsensusParams KISTSchedRunInterval=5" in out
    assert "Not participating (longclaw, bastet, faravahar)" in out
    md = _cli("announce", PLAN, "--dir", str(predicted), "--format", "markdown").stdout
    assert "| 2ms | 2027-03-01 11:50 UTC |" in md and "`ConsensusParams KISTSchedRunInterval=2`" in md
    assert "section: issue" in md and "**What changed?**" in md


def test_announcement_example_report_imports(predicted):
    """The CSV example operators copy is a valid kistexp-operator-report/1 file."""
    result = _cli("announce", PLAN, "--dir", str(predicted), "--json")
    doc = __import__("json").loads(result.stdout)
    assert doc["report_format"] == operator_report.FORMAT
    # parsed as it would be once the stage has begun (reports from the future are refused)
    collected = operator_report.parse(doc["report_example"].encode(), "example.csv",
                                      now=load_plan(PLAN).end)
    assert collected.problems == () and len(collected.samples) > 0
    rows = list(csv.DictReader(io.StringIO(doc["report_example"])))
    assert rows[0]["param_value"] == "2"
    assert {s["nickname"] for s in doc["authorities"]} == {"moria1", "tor26", "dizum", "gabelmoo", "dannenberg",
                                                          "maatuska"}


# --- bad input --------------------------------------------------------------------------------------------

def _one_line_error(result, *needles):
    from kistexp.errors import KistexpError
    from kistexp.output import error_line

    assert result.exit_code == 1 and isinstance(result.exception, KistexpError), (result.output, result.exception)

    line = error_line(result.exception)
    assert "\n" not in line
    for n in needles:
        assert n in line, line
    return line


def test_directory_without_journal(predicted, tmp_path):
    _one_line_error(_cli("report", str(predicted), "-o", str(tmp_path / "x.html")), "no rollout journal",
                    "kistexp dry-run")
    assert not (tmp_path / "x.html").exists()


def test_corrupt_database(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.db").write_bytes(b"not a database at all" * 100)
    _one_line_error(_cli("report", str(exp)), "experiment.db", "not an SQLite database")
    assert sorted(p.name for p in exp.iterdir()) == ["experiment.db"]


def test_damaged_journal(rolled_back, tmp_path):
    import shutil
    import sqlite3

    exp = tmp_path / "exp"
    shutil.copytree(rolled_back, exp)
    with sqlite3.connect(exp / "experiment.db") as c:
        c.execute("UPDATE rollout_meta SET value = '{\"bogus\": 1}' WHERE key = 'cadence'")
    _one_line_error(_cli("report", str(exp)), "experiment.db: rollout_meta row cadence: ", "(bogus)")


def test_plan_without_predictions_says_how_to_make_them(tmp_path):
    for exp in (tmp_path / "none", tmp_path / "empty"):
        if exp.name == "empty":
            from kistexp.expdir import ExperimentDir

            ExperimentDir.create(exp).close()
        for argv in (["report", PLAN, "--dir", str(exp)], ["announce", PLAN, "--dir", str(exp)]):
            _one_line_error(_cli(*argv), "no predictions", f"kistexp simulate {PLAN} --dir {exp}")


def test_unwritable_output_leaves_nothing(rolled_back, tmp_path):
    _one_line_error(_cli("report", str(rolled_back), "-o", str(tmp_path / "missing" / "r.html")),
                    "cannot write the report")
    _one_line_error(_cli("announce", PLAN, "--dir", str(rolled_back), "-o", str(tmp_path / "missing" / "a.txt")),
                    "cannot write the announcement")
    (tmp_path / "adir").mkdir()
    _one_line_error(_cli("report", str(rolled_back), "-o", str(tmp_path / "adir")), "is a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "r.html").write_text("the previous report")
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = locked / "probe"
        try:
            probe.write_text("")
            probe.unlink()
            pytest.skip("running as root: a read-only directory is still writable")
        except OSError:
            pass
        _one_line_error(_cli("report", str(rolled_back), "-o", str(locked / "r.html")), "cannot write the report")
        assert (locked / "r.html").read_text() == "the previous report"
        assert sorted(p.name for p in locked.iterdir()) == ["r.html"]
    finally:
        locked.chmod(stat.S_IRWXU)


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    import os

    target = tmp_path / "r.html"
    target.write_text("old")

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(ReportError, match="r.html: cannot write the report: No space left on device"):
        write_atomic(target, b"new", "the report", ReportError)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


# --- the page in a browser ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_report_renders_in_headless_chromium(rolled_back, tmp_path):
    from PIL import Image

    from kistexp.report.browser import find_chromium, render

    if find_chromium() is None:
        pytest.skip("chromium not installed (.ci/run installs it)")
    out = tmp_path / "r.html"
    assert _cli("report", str(rolled_back), "-o", str(out)).exit_code == 0
    shot = render(out, tmp_path / "shot.png", width=1200, height=2400, timeout_s=90)
    assert shot.console == (), shot.console  # no errors, no refused loads, nothing logged at all
    img = np.asarray(Image.open(shot.screenshot).convert("RGB"), dtype=float)
    assert img.shape[:2] == (2400, 1200)
    # not blank: text and figures cover a good part of the page and use many colours
    ink = (img.sum(axis=2) < 600).mean()
    colours = len(np.unique(img.reshape(-1, 3)[::7], axis=0))
    assert ink > 0.02 and colours > 50, (ink, colours)
    # every figure decodes: each data: URI is well-formed base64 of a parseable SVG document
    page, _ = _parse(out)
    assert page.images
    for tag in page.images:
        _decode_svg(tag["src"])


def test_a_hung_chromium_is_killed_and_the_page_rendered_again(tmp_path, monkeypatch):
    """A browser that never exits costs one attempt, not the render; one that always hangs is a
    clear error naming the page."""
    import kistexp.report.browser as browser

    calls = tmp_path / "calls"
    fake = tmp_path / "chromium"
    # the first run hangs (in a child, as chromium's helpers do); later ones write the screenshot
    fake.write_text(f"""#!/bin/sh
echo x >> {calls}
if [ "$(wc -l < {calls})" -le "${{HANG_RUNS:-1}}" ]; then sleep 60 & wait; fi
for a in "$@"; do case "$a" in --screenshot=*) printf png > "${{a#--screenshot=}}";; esac; done
echo ':INFO:CONSOLE(1)] "hello", source: x' >&2
""")
    fake.chmod(0o755)
    monkeypatch.setattr(browser, "find_chromium", lambda: str(fake))
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    started = time.monotonic()
    shot = browser.render(page, tmp_path / "s.png", timeout_s=1.0)
    assert shot.screenshot.read_bytes() == b"png" and shot.console == ('"hello", source: x',)
    assert len(calls.read_text().splitlines()) == 2 and time.monotonic() - started < 10
    calls.unlink()
    monkeypatch.setenv("HANG_RUNS", "9")
    with pytest.raises(browser.BrowserError, match=r"p.html: chromium did not finish within 1 s \(2 attempts\)"):
        browser.render(page, tmp_path / "t.png", timeout_s=1.0)


@pytest.mark.slow
def test_browser_check_catches_console_errors(tmp_path):
    """The console scan is not vacuous: a page that logs an error is caught."""
    from kistexp.report.browser import find_chromium, render

    if find_chromium() is None:
        pytest.skip("chromium not installed")
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>console.error('broken figure'); nosuch();</script></body></html>")
    shot = render(page, tmp_path / "bad.png", width=400, height=300, timeout_s=120)
    assert any("broken figure" in m for m in shot.console)
    assert any("nosuch is not defined" in m for m in shot.console)


# --- terminal views -------------------------------------------------------------------------------------------

def test_sparkline_and_bar():
    from kistexp.report.terminal import bar, sparkline

    assert sparkline([0, 0.5, 1.0, None]) == "▁▅█ "
    assert sparkline([0.1, 0.3], lo=0, hi=0.3) == "▃█"
    assert bar(0.5, 4) == "██  " and bar(2.0, 3) == "███" and bar(-1, 2) == "  "


def test_status_and_history_tables(rolled_back):
    status = _cli("status", str(rolled_back))
    assert status.exit_code == 0, status.output
    # the failed criterion with its latest estimate as a relative change (+~65 %, past its +25 % limit, which is
    # said under the sparkline)
    lines = status.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "relay CPU" in line)
    row = lines[at]
    assert "fail" in row and "█" in row
    effect = re.search(r"\+(\d+\.\d) %", row)
    assert effect and float(effect.group(1)) > 25 and "█ = +25 %" in lines[at + 1]
    history = _cli("history", str(rolled_back))
    assert history.exit_code == 0
    assert re.search(r"2027-03-01 15:00 .*rollback:step-back .*criterion 'relay CPU' failed", history.stdout)
    assert _cli("status", str(rolled_back), "--json").stdout.lstrip().startswith("{")


def test_names_from_the_plan_are_text_not_markup(tmp_path):
    """A criterion or stage name with HTML or mathtext characters is shown as written."""
    text = open(PLAN).read().replace('name = "relay CPU"', 'name = "<b>CPU</b> $x_{1}$ & more"')
    plan = tmp_path / "plan.toml"
    plan.write_text(text)
    exp = tmp_path / "exp"
    write_predictions(exp, KIST_EFFECTS).close()
    dry_run(load_plan(str(plan)), exp, injections=[STEP_BACK])
    out = tmp_path / "r.html"
    assert _cli("report", str(exp), "-o", str(out)).exit_code == 0
    html = out.read_text()
    assert "<b>CPU</b>" not in html and "&lt;b&gt;CPU&lt;/b&gt; $x_{1}$ &amp; more" in html
    page, _ = _parse(out)
    for img in page.images:
        _decode_svg(img["src"])


def test_error_is_the_only_line_on_stderr(tmp_path):
    import subprocess
    import sys

    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.db").write_bytes(b"garbage" * 10)
    proc = subprocess.run([sys.executable, "-m", "kistexp", "report", str(exp)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("kistexp: error: ") and proc.stderr.count("\n") == 1


def test_measured_relay_costs_per_class_and_value_in_effect(rolled_back, tmp_path):
    """Samples in the metric store (collectors, operator reports) count for the stage whose value was in
    effect when they were taken; samples of unknown value are left out."""
    import datetime as dt
    import shutil

    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.series import Sample
    from kistexp.metrics.store import MetricStore

    exp = tmp_path / "exp"
    shutil.copytree(rolled_back, exp)
    t = dt.datetime(2027, 3, 1, 12, tzinfo=dt.timezone.utc)
    with ExperimentDir.open(exp) as e:
        MetricStore(e.db).add_samples("relay_cpu_utilization", [
            Sample(t, 0.30, {"relay_class": "exit"}, 10), Sample(t, 0.34, {"relay_class": "exit"}, 10),
            Sample(t, 0.50, {"relay_class": "exit"}, 2), Sample(t, 0.90, {"relay_class": "exit"}, None),
            Sample(t, 0.20, {"position": "guard"}, 2),
            # after the step back at 16:00 the journal's rollback transition runs 10 ms again
            Sample(t + dt.timedelta(hours=5), 0.31, {"relay_class": "exit"}, 10)])
    data = load_experiment(exp)
    got = {k: sorted(v.tolist()) for k, v in data.measured.items()}
    assert got == {("relay_cpu_utilization", "exit", "baseline"): [0.30, 0.31, 0.34],
                   ("relay_cpu_utilization", "exit", "2ms"): [0.50],
                   ("relay_cpu_utilization", "guard", "2ms"): [0.20]}
    out = tmp_path / "r.html"
    assert _cli("report", str(exp), "-o", str(out)).exit_code == 0
    assert "Horizontal bars of relay_cpu_utilization for 3 relay classes and 4 stages." in out.read_text()
