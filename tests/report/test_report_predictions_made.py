"""How the predictions were made, beside them in both reports and the announcement: a ``prediction_runs`` row
written straight into the experiment database (``MetricStore.save_prediction_run``) beside the predictions
reads "predicted at full NIC rates on 3 networks of 120 relays", or a fast-mode warning with the NIC scale,
and an experiment without one says that how its predictions were made is not recorded."""

import datetime as dt
import html as htmllib
import json
import re
import shutil
import sqlite3
from types import SimpleNamespace

import attrs
import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.expdir import ExperimentDir
from kistexp.metrics.series import PredictionRun
from kistexp.metrics.store import MetricStore
from kistexp.report.data import PredictionsMade, load_experiment
from kistexp.report.html import render_experiment
from tests.rollout_helpers import KIST_EFFECTS, KIST_PLAN, STEP_BACK, dry_run_kist, write_predictions

MADE = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
FULL = PredictionRun(MADE, "full", 0.02, (120, 120, 120), 1.0, 1.0, 60.0, 400.0)
FAST = PredictionRun(MADE, "fast", 0.02, (120, 120, 120), 0.331, 0.342, 60.0, 40.0)
FULL_LABEL = "predicted at full NIC rates on 3 networks of 120 relays"
FAST_LABEL = ("fast mode: NICs scaled down x0.33-0.34 so traffic fits 75 MB/s per network; stage effects of a "
              "run-interval change are shrunk (docs/validation.md)")
UNRECORDED = "how these predictions were made is not recorded"


def _cli(*argv):
    return CliRunner().invoke(app, [str(a) for a in argv])


def _text(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _record(path, *runs: PredictionRun) -> None:
    with ExperimentDir.open(path) as exp:
        for run in runs:
            MetricStore(exp.db).save_prediction_run(run)


def _fast_warnings(html: str) -> dict[str, str]:
    """id -> text of every element the page marks as a fast-mode warning."""
    return {re.search(r'id="([^"]+)"', m.group(2)).group(1): _text(m.group(3)) for m in
            re.finditer(r'<(p|dd)( [^>]*)>(.*?)</\1>', html, re.S) if 'class="fast-mode"' in m.group(2)}


def _by_id(html: str, ident: str) -> str | None:
    m = re.search(rf'<(p|dd)[^>]* id="{ident}"[^>]*>(.*?)</\1>', html, re.S)
    return None if m is None else _text(m.group(2))


def test_the_labels_say_how_the_predictions_were_made():
    assert PredictionsMade(FULL).label == FULL_LABEL and not PredictionsMade(FULL).fast
    assert PredictionsMade(FAST).label == FAST_LABEL and PredictionsMade(FAST).fast
    assert PredictionsMade().label == UNRECORDED and not PredictionsMade().fast
    # samples of different sizes, one network, 2,000 relays, every network scaled alike
    assert PredictionsMade(attrs.evolve(FULL, relays=(118, 2000, 121))).label == \
        "predicted at full NIC rates on 3 networks of 118-2,000 relays"
    assert PredictionsMade(attrs.evolve(FULL, relays=(2000,))).label == \
        "predicted at full NIC rates on 1 network of 2,000 relays"
    same = PredictionsMade(attrs.evolve(FAST, nic_scale_min=0.017, nic_scale_max=0.017))
    assert same.nic_scale == "x0.017" and same.label.startswith("fast mode: NICs scaled down x0.017 so traffic")
    assert PredictionsMade(attrs.evolve(FAST, nic_scale_min=0.017, nic_scale_max=0.6)).nic_scale == "x0.017-0.6"
    assert PredictionsMade(FAST).as_json() == {
        "rates": "fast", "relays": [120, 120, 120], "nic_scale_min": 0.331, "nic_scale_max": 0.342, "made": MADE,
        "label": FAST_LABEL}
    assert PredictionsMade().as_json() == {"rates": None, "relays": [], "nic_scale_min": None,
                                           "nic_scale_max": None, "made": None, "label": UNRECORDED}


# --- the plan report and the announcement ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    """The KIST plan's predictions over three networks: unrecorded, made at full rates, made in fast mode,
    and made in fast mode then again at full rates (the last run made the predictions stored now)."""
    root = tmp_path_factory.mktemp("made")
    write_predictions(root / "unrecorded", KIST_EFFECTS, networks=3).close()
    for name, runs in (("full", (FULL,)), ("fast", (FAST,)), ("fast-then-full", (FAST, FULL))):
        shutil.copytree(root / "unrecorded", root / name)
        _record(root / name, *runs)
    return root


def _plan_report(directory, out) -> str:
    result = _cli("report", KIST_PLAN, "--dir", directory, "-o", out)
    assert result.exit_code == 0, result.output
    return out.read_text()


def test_plan_report_in_fast_mode_warns_beside_the_predictions(predicted, tmp_path):
    html = _plan_report(predicted / "fast", tmp_path / "plan.html")
    # at the top, at the stage predictions and at the relay costs, each the whole label in a warning
    assert _fast_warnings(html) == {"predictions-made": FAST_LABEL, "predictions-made-stages": FAST_LABEL,
                                    "predictions-made-costs": FAST_LABEL}
    top, stages = html.index('id="predictions-made"'), html.index('<h2 id="predictions">')
    assert html.index('<h2 id="timeline">') > top  # before the first section
    assert stages < html.index('id="predictions-made-stages"') < html.index('<div class="fit">', stages)
    assert html.index('<h2 id="costs">') < html.index('id="predictions-made-costs"')
    assert ".fast-mode {" in html  # styled as a warning
    assert UNRECORDED not in _text(html) and "full NIC rates" not in html


def test_plan_report_at_full_rates_and_unrecorded(predicted, tmp_path):
    html = _plan_report(predicted / "full", tmp_path / "full.html")
    assert _fast_warnings(html) == {}
    assert _by_id(html, "predictions-made-stages") == FULL_LABEL
    assert 'id="predictions-made"' not in html and "fast mode" not in _text(html)
    html = _plan_report(predicted / "unrecorded", tmp_path / "unrecorded.html")
    assert _fast_warnings(html) == {} and _by_id(html, "predictions-made-stages") == UNRECORDED
    # the last recorded run made the predictions stored now
    html = _plan_report(predicted / "fast-then-full", tmp_path / "last.html")
    assert _fast_warnings(html) == {} and _by_id(html, "predictions-made-stages") == FULL_LABEL


def test_announcement_cautions_only_on_fast_mode(predicted):
    caution = ("Caution: these predictions were made in fast mode (NICs scaled down x0.33-0.34 so the traffic fits "
               "75 MB/s per network), which shrinks the stage effects of a run-interval change (kistexp's "
               "docs/validation.md).")
    fast = _cli("announce", KIST_PLAN, "--dir", predicted / "fast").stdout
    assert caution in " ".join(fast.split())
    # one sentence, beside what operators should watch: after its explanation, before the first metric's rows
    assert fast.index("What to watch") < fast.index("Caution:") < fast.index("relay_cpu_utilization (")
    assert "slower links" in fast  # the CPU note on scaled-down NICs
    md = _cli("announce", KIST_PLAN, "--dir", predicted / "fast", "--format", "markdown").stdout
    assert "**Caution:** " + caution.removeprefix("Caution: ") in md
    for name in ("full", "unrecorded", "fast-then-full"):
        for fmt in ("text", "markdown"):
            assert "Caution" not in _cli("announce", KIST_PLAN, "--dir", predicted / name, "--format", fmt).stdout
    # at full rates the links are the relays' own: the CPU note does not speak of slower ones
    full = " ".join(_cli("announce", KIST_PLAN, "--dir", predicted / "full").stdout.split())
    assert "slower links" not in full
    assert "The simulated relays run at their own NIC rates but carry the traffic of a sampled network" in full
    assert "slower links" in _cli("announce", KIST_PLAN, "--dir", predicted / "unrecorded").stdout


def test_announcement_json_says_how_the_predictions_were_made(predicted):
    docs = {name: json.loads(_cli("announce", KIST_PLAN, "--dir", predicted / name, "--json").stdout)
            for name in ("full", "fast", "unrecorded")}
    assert docs["fast"]["predictions_made"] == {
        "rates": "fast", "relays": [120, 120, 120], "nic_scale_min": 0.331, "nic_scale_max": 0.342,
        "made": "2030-01-02T03:04:05Z", "label": FAST_LABEL}
    assert docs["full"]["predictions_made"]["rates"] == "full"
    assert docs["full"]["predictions_made"]["label"] == FULL_LABEL
    assert docs["unrecorded"]["predictions_made"] == {"rates": None, "relays": [], "nic_scale_min": None,
                                                      "nic_scale_max": None, "made": None, "label": UNRECORDED}
    assert "Caution: these predictions were made in fast mode" in docs["fast"]["text"]
    assert "**Caution:**" in docs["fast"]["markdown"]


def test_an_unreadable_prediction_run_is_one_line(predicted, tmp_path):
    path = tmp_path / "exp"
    shutil.copytree(predicted / "unrecorded", path)
    with sqlite3.connect(path / "experiment.db") as conn:
        conn.execute("INSERT INTO prediction_runs (made_us, rates, population_scale, relays, nic_scale_min, "
                     "nic_scale_max, duration_s, wall_s) VALUES (0, 'fast', 0.02, 'many', 0.3, 0.3, 60, 1)")
    out = tmp_path / "plan.html"
    result = _cli("report", KIST_PLAN, "--dir", path, "-o", out)
    assert result.exit_code == 1 and not out.exists()
    assert f"{path / 'experiment.db'}: corrupt prediction runs: " in str(result.exception)
    assert _cli("announce", KIST_PLAN, "--dir", path).exit_code == 1


# --- the experiment report of a dry run ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """A dry run of the KIST plan on its predictions, its copies with a fast and a full prediction run, and the
    report of each."""
    root = tmp_path_factory.mktemp("dry")
    dry_run_kist(root / "unrecorded", [STEP_BACK])
    pages = {}
    for name, runs in (("unrecorded", ()), ("fast", (FAST,)), ("full", (FULL,))):
        if runs:
            shutil.copytree(root / "unrecorded", root / name)
            _record(root / name, *runs)
        pages[name] = _cli("report", root / name, "-o", root / f"{name}.html").exit_code, root / f"{name}.html"
    assert all(code == 0 for code, _out in pages.values())
    return SimpleNamespace(root=root, html={name: out.read_text() for name, (_code, out) in pages.items()})


def test_dry_run_report_in_fast_mode(dry):
    html = dry.html["fast"]
    # in the summary, over the criteria's predicted samples and at the relay costs
    assert _fast_warnings(html) == {"summary-predictions": FAST_LABEL, "predictions-made-samples": FAST_LABEL,
                                    "predictions-made-costs": FAST_LABEL}
    summary = html[html.index('<section id="summary"'):html.index("</section>")]
    assert "<dt>Predictions</dt>" in summary and 'id="summary-predictions"' in summary
    cdfs = html.index('<h2 id="cdfs">')
    assert cdfs < html.index('id="predictions-made-samples"') < html.index("<h3>", cdfs)
    assert html.index('<h2 id="costs">') < html.index('id="predictions-made-costs"')


def test_dry_run_report_at_full_rates_and_unrecorded(dry):
    for name, label in (("full", FULL_LABEL), ("unrecorded", UNRECORDED)):
        html = dry.html[name]
        assert _fast_warnings(html) == {}, name
        for ident in ("summary-predictions", "predictions-made-samples", "predictions-made-costs"):
            assert _by_id(html, ident) == label, (name, ident)
        assert "fast mode" not in _text(html)


def test_a_report_without_predictions_says_nothing_of_them(dry):
    """A run on measured metrics with no predictions in its directory: no label, since nothing predicted is
    shown."""
    data = attrs.evolve(load_experiment(dry.root / "fast"), figures=(), metrics="measured")
    html = render_experiment(data)
    assert _fast_warnings(html) == {} and "predictions-made" not in html and "summary-predictions" not in html
