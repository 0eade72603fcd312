"""Relay CPU reads the same everywhere a person sees it: in % of one core (``catalogue.display``), the
stored fraction times 100 — in `kistexp simulate`'s tables, `kistexp metrics show`, the run's feed, the
simulator's experiment tables and the announcement — never as "% core", "of a core" or a bare fraction."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from rollout_helpers import KIST_EFFECTS, KIST_PLAN, write_predictions
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.expdir import ExperimentDir
from kistexp.metrics import catalogue
from kistexp.metrics.series import Sample
from kistexp.metrics.store import MetricStore
from kistexp.rollout.watch import effect_text

# a relay at 0.0026 of one core, stored as the catalogue's fraction, reads 0.26 % of one core
CPU = 0.0026
OTHER_WORDINGS = re.compile(r"% core|of a core|cpu ratio", re.IGNORECASE)


def _cli(*argv: str) -> str:
    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code == 0, result.output
    return result.stdout


def _plain(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def predictions(tmp_path_factory):
    path = tmp_path_factory.mktemp("cpu-unit") / "exp"
    medians = {"relay_cpu_utilization": CPU, "client_ttlb_1mib_s": 2.5}
    write_predictions(path, KIST_EFFECTS, networks=2, medians=medians, levels=(1.0, 1.0),
                      classes=("all", "KIST HZ=250")).close()
    return path


def test_the_one_display_unit_of_relay_cpu():
    assert catalogue.display("relay_cpu_utilization") == ("% of one core", 100.0)
    assert catalogue.get("relay_cpu_utilization").unit == "ratio"  # what the database holds


def test_simulate_prints_cpu_in_percent_of_one_core_within_80_columns(predictions, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = _cli("simulate", KIST_PLAN, "--dir", str(predictions), "--stored")
    assert all(len(line) <= 80 for line in out.splitlines()), [line for line in out.splitlines() if len(line) > 80]
    assert "relay_cpu_utilization (% of one core)" in _plain(out)
    # the baseline's median for all relays: 0.0026 of one core is printed as 0.26
    assert re.search(r"^\s*all\s+0\.26\b", out, re.MULTILINE), out
    assert not OTHER_WORDINGS.search(out)


def test_announcement_prints_cpu_in_percent_of_one_core(predictions):
    for fmt, baseline in (("text", "all baseline 0.26;"), ("markdown", "| all | 0.26 |")):
        out = _cli("announce", KIST_PLAN, "--dir", str(predictions), "--format", fmt)
        assert "relay_cpu_utilization** (% of one core)" in out or "relay_cpu_utilization (% of one core):" in out
        assert baseline in _plain(out)
        assert not OTHER_WORDINGS.search(out)


def test_metrics_show_and_list_print_cpu_in_percent_of_one_core(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    t0 = dt.datetime(2027, 3, 1, tzinfo=dt.timezone.utc)
    with ExperimentDir.open_or_create(tmp_path / "exp") as exp:
        MetricStore(exp.db).add_samples("relay_cpu_utilization", [
            Sample(t0 + dt.timedelta(minutes=i), CPU, {"relay": "r1"}) for i in range(5)])
    shown = _cli("metrics", "show", "relay_cpu_utilization", "--dir", str(tmp_path / "exp"), "--samples")
    assert "relay_cpu_utilization (% of one core)" in _plain(shown)
    assert "0.26" in shown and "0.0026" not in shown
    listed = _cli("metrics", "list", "--dir", str(tmp_path / "exp"))
    assert "% of one core" in _plain(listed)
    for out in (shown, listed):
        assert not OTHER_WORDINGS.search(out)
    # --json keeps the stored fraction and the catalogue unit
    doc = _cli("metrics", "show", "relay_cpu_utilization", "--dir", str(tmp_path / "exp"), "--json")
    assert '"unit": "ratio"' in doc and "0.0026" in doc


def test_the_feed_says_absolute_cpu_changes_in_percent_of_one_core():
    unit, factor = catalogue.display("relay_cpu_utilization")
    assert effect_text("absolute-increase", 0.05, 0.012, 0.004, 0.02, unit, factor) == \
        "+1.2 % of one core [+0.4 % of one core, +2 % of one core] vs limit +5 % of one core"
    assert effect_text("above", 0.5, 0.26, None, None, unit, factor) == \
        "26 % of one core vs limit above 50 % of one core"
    # a relative change needs no unit
    assert effect_text("relative-increase", 0.25, 1.1, None, None, unit, factor) == "+10.0 % vs limit +25 %"
    # a difference of a metric shown in % is one of percentage points, not a relative change
    unit, factor = catalogue.display("client_transfer_failure_ratio")
    assert effect_text("absolute-increase", 0.02, 0.01, None, None, unit, factor) == \
        "+1 percentage points vs limit +2 percentage points"


def test_simulator_experiment_tables_print_cpu_in_percent_of_one_core(monkeypatch, capsys):
    from kistexp.commands.sim import _print_result

    monkeypatch.setenv("COLUMNS", "100")
    _print_result("circuit", {"cpu_core_fraction_max": 0.3512,
                              "curve": [{"scheduler": "kist", "interval_ms": 2, "cpu_core_fraction_max": 0.5}]})
    out = capsys.readouterr().out
    assert _plain(out).count("cpu_max (% of one core)") == 2
    assert "35.12" in out and "50" in out and "0.3512" not in out
