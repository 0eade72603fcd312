"""What `kistexp simulate` leaves and says (issue 33, point 1): a failed or interrupted run leaves no
experiment.db for the next `make demo` to mistake for predictions, a first compile is announced once on
stderr, and progress bars never move back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import PopulationError
from kistexp.metrics.series import Prediction
from kistexp.population import predict
from kistexp.population.predict import check_experiment_dir, save_plan_predictions
from kistexp.store.schema import StoreError

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "plans" / "kist-run-interval-2020.toml"


def _rows(n: int, stage: str = "baseline") -> list[Prediction]:
    return [Prediction(stage, "client_ttlb_1mib_s", "", 0, round(q / 100, 2), float(q)) for q in range(n)]


def _interrupted(rows: list[Prediction], after: int):
    for i, row in enumerate(rows):
        if i == after:
            raise KeyboardInterrupt
        yield row


def test_predictions_land_whole_in_a_new_experiment(tmp_path):
    exp = tmp_path / "a" / "exp"
    check_experiment_dir(exp)
    assert not (tmp_path / "a").exists()  # the check creates nothing
    save_plan_predictions(exp, PLAN, _rows(101))
    assert sorted(p.name for p in exp.iterdir()) == ["experiment.db", "plan.toml"]
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore

    with ExperimentDir.open(exp) as e:
        assert len(MetricStore(e.db).load_predictions()) == 101


def test_an_interrupted_save_leaves_no_experiment(tmp_path):
    exp = tmp_path / "exp"
    with pytest.raises(KeyboardInterrupt):
        save_plan_predictions(exp, PLAN, _interrupted(_rows(101), 50))
    assert list(exp.iterdir()) == []  # no experiment.db, no plan, no temporary directory


def test_an_interrupted_save_into_an_existing_experiment_keeps_what_it_had(tmp_path):
    exp = tmp_path / "exp"
    save_plan_predictions(exp, PLAN, _rows(101))
    with pytest.raises(KeyboardInterrupt):
        save_plan_predictions(exp, PLAN, _interrupted(_rows(101, "2ms"), 50))
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore

    with ExperimentDir.open(exp) as e:
        assert {p.stage for p in MetricStore(e.db).load_predictions()} == {"baseline"}
    assert sorted(p.name for p in exp.iterdir()) == ["experiment.db", "plan.toml"]


def test_a_bad_destination_is_refused_before_any_work(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file, not an experiment directory"):
        check_experiment_dir(tmp_path / "file")
    with pytest.raises(StoreError, match=r"file is a file"):
        check_experiment_dir(tmp_path / "file" / "exp")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "experiment.db").write_text("not sqlite")
    with pytest.raises(StoreError, match="experiment.db"):
        check_experiment_dir(tmp_path / "bad")


def test_a_failed_simulate_leaves_no_experiment(tmp_path, monkeypatch):
    def failing(*args, progress=None, notify=None, **kwargs):
        progress(0.25, "network 1: baseline -> baseline")
        raise PopulationError("network 2: no relay qualifies as a guard")

    monkeypatch.setattr(predict, "simulate_plan", failing)
    exp = tmp_path / "exp"
    result = CliRunner().invoke(app, ["simulate", str(PLAN), "--dir", str(exp)])
    assert result.exit_code == 1 and "no relay qualifies as a guard" in str(result.exception)
    assert not exp.exists()


@pytest.mark.slow
def test_an_interrupted_simulate_process_leaves_no_experiment(tmp_path):
    exp = tmp_path / "exp"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "kistexp", "simulate", str(PLAN), "--dir", str(exp)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(6)  # loading, compiling or running: the plan's simulation takes minutes
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not (exp / "experiment.db").exists(), err
    assert not exp.exists() or [p.name for p in exp.iterdir()] == []


# --- the first compile and the progress bar --------------------------------------------------------------


def test_the_first_compile_is_announced_once(tmp_path, monkeypatch):
    from kistexp.sim import numbacache, simulation

    monkeypatch.setattr(numbacache, "_active", tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(simulation, "warm_up", lambda: calls.append("compiled") or 12.5)
    said: list[str] = []
    assert not numbacache.is_compiled()
    assert simulation.ensure_compiled(said.append) == 12.5
    assert said == ["compiling the simulator, first run only (one to two minutes)"] and calls == ["compiled"]
    assert numbacache.is_compiled()
    assert simulation.ensure_compiled(said.append) is None
    assert len(said) == 1 and calls == ["compiled"]


def test_without_a_writable_cache_every_run_says_it_compiles(monkeypatch):
    from kistexp.sim import numbacache, simulation

    monkeypatch.setattr(numbacache, "_active", None)
    monkeypatch.setattr(simulation, "warm_up", lambda: 3.0)
    said: list[str] = []
    simulation.ensure_compiled(said.append)
    simulation.ensure_compiled(said.append)
    assert len(said) == 2 and all("so every run compiles" in s for s in said)


def test_the_compile_notice_reaches_a_pipe(tmp_path, monkeypatch):
    """stderr piped (CliRunner captures it): the notice is printed all the same, as a `kistexp:` line."""
    from kistexp.sim import numbacache, simulation

    monkeypatch.setattr(numbacache, "_active", tmp_path)
    monkeypatch.setattr(simulation, "warm_up", lambda: 0.5)

    def fake_plan(plan, *, progress=None, notify=None, **kwargs):
        simulation.ensure_compiled(notify)
        raise PopulationError("stopped after the compile")

    monkeypatch.setattr(predict, "simulate_plan", fake_plan)
    result = CliRunner().invoke(app, ["simulate", str(PLAN), "--dir", str(tmp_path / "exp")])
    assert result.stderr.splitlines() == ["kistexp: compiling the simulator, first run only (one to two minutes)"]
    assert result.stdout == ""


def test_a_progress_bar_never_moves_back():
    from kistexp.output import progress_bar

    with progress_bar(as_json=True) as bar:
        task = bar.add_task("x", total=1.0)
        for value in (0.2, 0.5, 0.3, 0.5, 0.9, 0.1):
            bar.update(task, completed=value, description=f"at {value}")
        (t,) = bar.tasks
        assert t.completed == 0.9 and t.description == "at 0.1"
        bar.reset(task)
        assert bar.tasks[0].completed == 0
