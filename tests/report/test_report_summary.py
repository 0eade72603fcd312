"""The report's summary: rendered in headless Chromium, its facts checked against the journal."""

import json
import re
from html.parser import HTMLParser

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.report.browser import dump_dom, find_chromium
from kistexp.report.data import effect_words, load_experiment
from kistexp.rollout.journal import JournalReader
from tests.rollout_helpers import STEP_BACK, dry_run_kist

# a gap in the OnionPerf samples during the baseline: stated in the summary, the CPU failure unchanged
GAP = "metrics=onionperf:gap@day2+1h..day2+5h"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("summary") / "exp"
    result = dry_run_kist(path, [STEP_BACK, GAP])
    assert [r["kind"] for r in result.rollbacks] == ["step-back"]
    out = path.parent / "report.html"
    run = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert run.exit_code == 0, run.output
    return path, out


class _Summary(HTMLParser):
    """The text of each <dd id="summary-..."> of the summary, and where the summary starts."""

    def __init__(self):
        super().__init__()
        self.fields, self.current, self.order = {}, None, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "dd" and (a.get("id") or "").startswith("summary-"):
            self.current = a["id"].removeprefix("summary-")
            self.fields[self.current] = ""
        if tag in ("h2", "section", "table", "figure"):
            self.order.append(a.get("id") or tag)

    def handle_endtag(self, tag):
        if tag == "dd":
            self.current = None

    def handle_data(self, data):
        if self.current:
            self.fields[self.current] += data


def _fields(dom: str) -> tuple[dict[str, str], list[str]]:
    page = _Summary()
    page.feed(dom)
    return {k: " ".join(v.split()) for k, v in page.fields.items()}, page.order


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="chromium not installed")
def test_summary_in_chromium_matches_the_journal(report):
    path, out = report
    fields, order = _fields(dump_dom(out))
    assert order[0] == "summary"  # before every other section, table and figure
    with JournalReader.of_experiment(path) as reader:
        verdicts = reader.looks()
        decisions = reader.decisions()
        meta = reader.meta()
        missing = [b for b in reader.metric_batches() if b.missing]
    # the failing criterion and stage, with the effect and interval as relative change from the verdict row
    fail = next(v for v in verdicts if v.outcome == "fail")
    assert fail.criterion == "relay CPU" and fail.stage == 1
    pct = f"{100 * (fail.effect - 1):+.1f} %"
    interval = f"[{100 * (fail.ci_low - 1):+.1f} %, {100 * (fail.ci_high - 1):+.1f} %]"
    assert f"relay CPU in stage 2ms at {fail.window_end:%Y-%m-%d %H:%M} UTC: {pct} {interval}" in fields["failed"]
    assert "(limit +25.0 %)" in fields["failed"]
    assert 50 < 100 * (fail.effect - 1) < 90  # +50 % injected on the predicted +12 %
    # the action the journal decided, and the authorities it names
    kind = next(d.decision for d in decisions if d.decision.startswith("rollback:")).split(":", 1)[1]
    assert kind == "step-back"
    assert fields["action"].startswith(f"{kind} from 2ms")
    assert "authorities that had to change their vote: dizum, dannenberg;" in fields["action"]
    data = load_experiment(path)
    acted = data.summary.actions[0].acted
    assert acted and set(acted) <= set(data.spec.participating)
    assert f"acted: {', '.join(acted)};" in fields["action"]
    # back on 10 in the consensus the journal saw, with relays and clients after it
    back = next(c for c in data.consensuses
                if c["valid_after"] > fail.window_end and c["params"]["KISTSchedRunInterval"] == 10)
    assert re.search(rf"KISTSchedRunInterval=10 back in the consensus of {back['valid_after']:%Y-%m-%d %H:%M} UTC, "
                     r"99 % of relays by \S+ \S+ UTC, 99 % of clients by \S+ \S+ UTC", fields["action"])
    assert fields["outcome"] == "rolled back (step-back from 2ms); now paused (stepped-back) at baseline"
    # where the metrics came from, and the injected faults as the dry run journaled them
    assert meta.get("metrics") == "predicted" and fields["metrics"].startswith("predicted")
    assert json.loads(meta.get("injections")) == [STEP_BACK, GAP]
    injected = f"relay_cpu_utilization +50 % injected into every sample of 2ms (--inject {STEP_BACK})"
    assert injected in fields["injections"]
    assert "not an effect of the change" in fields["injections"]
    assert f"--inject {GAP}" in fields["injections"]
    # the gap as the journal's missing batches show it
    first, last = min(b.window for b in missing), max(b.window for b in missing)
    assert {b.source for b in missing} == {"onionperf"}
    assert (f"onionperf: no samples from {first:%Y-%m-%d %H:%M} to {last + data.spec.hour:%Y-%m-%d %H:%M} UTC"
            in fields["gaps"])
    assert fields["commands"] == "none" and fields["outages"] == "none"


def test_marks_on_the_time_axis_plots(report):
    """The injected rise is marked on the timeline and on relay CPU's effect plot, not on the others'."""
    path, out = report
    alts = re.findall(r'alt="([^"]*)"', out.read_text())
    marked = [a for a in alts if "injections, commands, outages or gaps marked" in a]
    assert any(a.startswith("Step plot of KISTSchedRunInterval") for a in marked)
    assert any("criterion relay CPU" in a for a in marked)
    # the gap is in the baseline, before the first look: no effect plot of the OnionPerf criteria marks it (with
    # too few samples in the stage they have no plot at all, one line instead)
    assert not any("criterion 1 MiB downloads" in a for a in marked)
    assert "1 MiB downloads (client_ttlb_1mib_s): no estimate yet" in out.read_text()


def test_effect_words():
    assert effect_words("relative-increase", 1.706, "ratio") == "+70.6 %"
    assert effect_words("relative-decrease", 0.9, "s") == "-10.0 %"
    assert effect_words("absolute-increase", 3.25, "ms") == "+3.25 ms"
    assert effect_words("relative-increase", None, "") == "no estimate"
