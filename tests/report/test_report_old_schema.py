"""An experiment directory written by an older kistexp (journal schema 3, before measured metrics; schema
4, before attack measures) still gets its report and status; opening it brings the schema forward without
losing a row, and a directory whose journal is too damaged to read gets one line and no half-written page."""

import re
import shutil
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.store.schema import MIGRATIONS
from tests.rollout_helpers import STEP_BACK, dry_run_kist


def _drop_tables_of(*versions: int) -> str:
    """DROP TABLE for every table the migrations to ``versions`` created (kistexp/store/schema.py)."""
    return "".join(f"DROP TABLE {t};\n" for v in versions
                   for t in re.findall(r"CREATE TABLE (\w+)", MIGRATIONS[v - 1]))


# What schema 5 added (attack measures and the prediction runs): dropping it gives schema 4 as written then.
BACK_TO_V4 = _drop_tables_of(5) + "PRAGMA user_version = 4;\n"
# What schemas 4 and 5 added (MIGRATIONS[3:]); dropping them gives schema 3.
BACK_TO_V3 = _drop_tables_of(5) + """
DROP TABLE rollout_source_health; DROP TABLE rollout_exposure; DROP TABLE rollout_authority_health;
ALTER TABLE rollout_metric_batches DROP COLUMN origin; ALTER TABLE rollout_metric_batches DROP COLUMN excluded;
PRAGMA user_version = 3;
"""


@pytest.fixture(scope="module")
def v3_experiment(tmp_path_factory):
    path = tmp_path_factory.mktemp("old") / "exp"
    dry_run_kist(path, [STEP_BACK])
    conn = sqlite3.connect(path / "experiment.db", isolation_level=None)
    conn.executescript(BACK_TO_V3)
    conn.close()
    return path


def test_report_of_a_schema_3_experiment(v3_experiment, tmp_path):
    out = tmp_path / "r.html"
    conn = sqlite3.connect(v3_experiment / "experiment.db")
    verdicts_before = conn.execute("SELECT count(*) FROM rollout_verdicts").fetchone()[0]
    conn.close()
    assert verdicts_before > 0
    result = CliRunner().invoke(app, ["report", str(v3_experiment), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert 'id="summary-outcome"' in page and "step-back" in page
    conn = sqlite3.connect(v3_experiment / "experiment.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("SELECT count(*) FROM rollout_verdicts").fetchone()[0] == verdicts_before
    conn.close()


def test_status_of_a_schema_3_experiment(v3_experiment):
    result = CliRunner().invoke(app, ["status", str(v3_experiment), "--json"])
    assert result.exit_code == 0, result.output
    assert '"state"' in result.output


def test_a_schema_3_journal_missing_a_table_is_one_line(v3_experiment, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(v3_experiment, broken)
    conn = sqlite3.connect(broken / "experiment.db", isolation_level=None)
    conn.execute("DROP TABLE rollout_verdicts")
    conn.close()
    out = tmp_path / "r.html"
    for command in (["report", str(broken), "-o", str(out)], ["status", str(broken)], ["history", str(broken)]):
        proc = subprocess.run([sys.executable, "-m", "kistexp", *command], capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stdout == "", proc
        assert proc.stderr.startswith("kistexp: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "table rollout_verdicts is missing" in proc.stderr
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_report_of_a_schema_4_experiment_without_attack_measures(tmp_path):
    """Before schema 5 there was no attack_measures table: the report is made, the table is added on
    opening, and the section says how to make the measures."""
    path = tmp_path / "exp"
    dry_run_kist(path, [STEP_BACK])
    conn = sqlite3.connect(path / "experiment.db", isolation_level=None)
    conn.executescript(BACK_TO_V4)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'attack_measures'").fetchone()[0] == 0
    conn.close()
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert 'id="attacks-none"' in page and f"kistexp simulate {path / 'plan.toml'} --dir {path}" in page
    conn = sqlite3.connect(path / "experiment.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("SELECT count(*) FROM attack_measures").fetchone()[0] == 0
    conn.close()


def test_a_database_without_the_attack_table_reads_as_none(tmp_path):
    """A connection to a database that was never migrated (read as it is) has no attack measures."""
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore
    from kistexp.report.data import attack_figures

    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute("CREATE TABLE predictions (stage TEXT)")
    assert attack_figures(ExperimentDir(tmp_path), MetricStore(conn), ("baseline", "2ms")) == ()
    conn.close()
