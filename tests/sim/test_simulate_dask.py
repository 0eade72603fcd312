"""`kistexp simulate --dask ADDRESS` (issue 38, point 4): a plan's network x transition runs go through the
sweep's backends (kistexp.population.dispatch), so a Dask LocalCluster gives the local pool's numbers,
prediction for prediction; a bad address or --workers with --dask is a one-line error before any run."""

from __future__ import annotations

import json
import os

import pytest
from conftest import free_port
from plan_helpers import VALID_PLAN
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.errors import DispatchError
from kistexp.plan.loader import load_plan
from kistexp.population.dispatch import DaskBackend
from kistexp.population.predict import PlanCell, model_version, plan_backend, run_plan_cell, simulate_plan
from kistexp.population.simnet import TrafficModel

# baseline -> two -> eight (3 runs) on 2 networks of 30 relays, 8 simulated seconds each: 6 cells
PLAN = VALID_PLAN + '\n[simulation]\npopulation_scale = 0.005\nseeds = [1, 2]\nduration = "8s"\n'


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.toml"
    path.write_text(PLAN)
    return path


@pytest.fixture(scope="module")
def dask_cluster():
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    try:
        yield cluster
    finally:
        cluster.close()


def _run(plan_file, backend):
    try:
        return simulate_plan(load_plan(plan_file).stage_runs(), traffic=TrafficModel(bandwidth_scale=0.2,
                                                                                      warmup_s=1.5),
                             backend=backend)
    finally:
        backend.close()


@pytest.mark.slow
def test_a_dask_cluster_predicts_what_the_local_pool_predicts(plan_file, dask_cluster):
    local = _run(plan_file, plan_backend(workers=2))
    backend = plan_backend(dask=dask_cluster.scheduler_address, dask_timeout=30)
    assert isinstance(backend, DaskBackend) and backend.workers == 2
    remote = _run(plan_file, backend)
    assert remote.stages == local.stages == ("baseline", "two", "eight")
    assert remote.networks == 2 and remote.relays_per_network == local.relays_per_network == (30, 30)
    # the same numbers, cell for cell: every quantile of every stage, metric, class and network
    assert len(local.predictions) > 1000
    assert remote.predictions == local.predictions
    assert {(p.network, p.stage) for p in remote.predictions} == \
        {(n, s) for n in (0, 1) for s in ("baseline", "two", "eight", "transition:baseline", "transition:two",
                                          "transition:eight")}
    assert (remote.bandwidth_scale, remote.expected_utilisation, remote.achieved_utilisation, remote.figures) == \
        (local.bandwidth_scale, local.expected_utilisation, local.achieved_utilisation, local.figures)
    # the cells ran in the workers' processes, not here
    ran = dask_cluster.scheduler.task_prefixes["run_plan_cell"].state_counts
    assert sum(ran.values()) >= 6


def test_a_cell_is_one_run_in_this_process_as_in_a_worker(plan_file):
    """The cell function alone, without any backend: a pure function of its (picklable) cell."""
    import pickle

    from kistexp.population.classes import load_class_shares
    from kistexp.population.relays import load_population
    from kistexp.population.sampling import sample

    runs = load_plan(plan_file).stage_runs()
    cell = PlanCell(1, 0, 1, runs.transitions[1], 8.0, 0.005, TrafficModel(bandwidth_scale=0.2, warmup_s=1.5),
                    75e6, sample(load_population(), 0.005, 1), load_class_shares(), model_version())
    result = run_plan_cell(pickle.loads(pickle.dumps(cell)))
    assert result.index == 1 and result.relays == 30 and result.host.endswith(f":{os.getpid()}")
    assert {p.stage for p in result.predictions} == {"two", "transition:two"}
    assert result.cpu_s > 0
    again = run_plan_cell(cell)
    assert again.predictions == result.predictions


def _cli(*argv: str):
    return CliRunner().invoke(app, ["simulate", *argv])


def test_an_address_nobody_answers_is_a_one_line_error_naming_it(plan_file, tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    result = _cli(str(plan_file), "--dir", str(tmp_path / "exp"), "--dask", address, "--dask-timeout", "1")
    assert result.exit_code == 1 and isinstance(result.exception, DispatchError), result.output
    message = str(result.exception)
    assert message == f"--dask {address}: no Dask scheduler answered within 1 s" or \
        message.startswith(f"--dask {address}: no Dask scheduler answered within 1 s (")
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize("argv, words", [
    (["--workers", "2", "--dask", "tcp://127.0.0.1:1"], "--workers and --dask exclude each other"),
    (["--dask", ""], "--dask: the scheduler address is empty"),
    (["--dask", "foo://127.0.0.1:1"], "--dask foo://127.0.0.1:1: unknown address scheme 'foo'"),
    (["--dask", "tcp://127.0.0.1:1", "--dask-timeout", "nan"], "--dask-timeout nan: must be a number of seconds"),
    (["--workers", "0"], "--workers 0: need at least one worker"),
])
def test_bad_backend_options_are_refused_before_any_run(plan_file, tmp_path, argv, words):
    result = _cli(str(plan_file), "--dir", str(tmp_path / "exp"), *argv)
    assert isinstance(result.exception, DispatchError), result.output
    assert words in str(result.exception) and "\n" not in str(result.exception)
    assert not (tmp_path / "exp").exists()


@pytest.mark.slow
def test_the_command_on_a_dask_cluster_stores_the_local_predictions(plan_file, dask_cluster, tmp_path):
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.store import MetricStore

    stored = {}
    for name, argv in (("local", ["--workers", "2"]), ("dask", ["--dask", dask_cluster.scheduler_address])):
        result = _cli(str(plan_file), "--dir", str(tmp_path / name), "--json", *argv)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["networks"] == 2
        with ExperimentDir.open(tmp_path / name) as exp:
            stored[name] = sorted(MetricStore(exp.db).load_predictions(),
                                  key=lambda p: (p.network, p.stage, p.metric, p.relay_class, p.quantile))
    assert len(stored["local"]) > 1000 and stored["dask"] == stored["local"]
