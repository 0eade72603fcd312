"""The fidelity harness's ``ceiling`` scenario as real tor runs it: 8 downloads started together
over one client-guard-middle-exit path (issue 4 point 7; kist-ewma.md §5.2, §6, §12.2, §13.2).

Sizes keep each run well under a second once the engine is compiled.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kistexp import jsonout
from kistexp.cli import app
from kistexp.errors import SimConfigError
from kistexp.sim import experiments as E

SIZE = 8_000_000  # 1 MB per circuit


@pytest.fixture(scope="module")
def path_runs():
    cases = [("kistlite", 10), ("kistlite", 2), ("kist", 10), ("kist", 2), ("vanilla", 10)]
    return {c: E.ceiling_path(scheduler=c[0], interval_ms=c[1], transfer_bytes=SIZE) for c in cases}


def test_kistlite_is_bound_by_64_cells_per_run_on_the_shared_channel(path_runs):
    """§6 + §5.2: the 8 circuits share one channel per hop, which moves 64 cells per run, 12 ms
    apart at 10 ms and 4 ms apart at 2 ms (4 ms tick): 2.74 and 8.22 MB/s of cells at most,
    a little less as payload (498 of 514 B) and with the start-up included."""
    lite10, lite2 = path_runs["kistlite", 10], path_runs["kistlite", 2]
    assert lite10.cells_per_run_median == 64 and lite2.cells_per_run_median == 64
    assert lite10.run_period_ms == pytest.approx(12.0, abs=0.5)
    assert lite2.run_period_ms == pytest.approx(4.0, abs=0.5)
    assert 0.8 * 2.74 < lite10.throughput_mbytes_per_s < 2.74
    assert 0.8 * 8.22 < lite2.throughput_mbytes_per_s < 8.22
    assert lite10.finished and lite10.circuits == 8 and lite10.client_interval_ms == 10


def test_kist_and_vanilla_are_bound_by_the_circuits_windows_not_a_channel_budget(path_runs):
    """With a loopback mss KIST's socket limit is far above 64 cells (§6 table): 8 circuits each
    window-bound over the round trip (§12.2) move several times what one circuit does, and
    several times KISTLite's channel budget; Vanilla has no interval at all (§9)."""
    kist10, kist2, vanilla = path_runs["kist", 10], path_runs["kist", 2], path_runs["vanilla", 10]
    one = E.circuit(scheduler="kist", interval_ms=10, transfer_bytes=SIZE // 8).throughput_mbytes_per_s
    assert kist10.throughput_mbytes_per_s > 3 * one
    assert kist10.throughput_mbytes_per_s > 3 * path_runs["kistlite", 10].throughput_mbytes_per_s
    assert kist10.cells_per_run_median > 64
    assert kist2.throughput_mbytes_per_s > 1.5 * kist10.throughput_mbytes_per_s
    # Vanilla against KIST at 2 ms is not compared with real tor (both CPU-bound on two cores in most
    # runs of kistexp/data/fidelity-history.csv, ceiling rows); with tor's read share the model's Vanilla,
    # one 32-cell flush per read, is below real tor's three times KIST at 10 ms (the same rows; the model
    # here: 29.9 against 21.3 MB/s over 8 MB)
    assert vanilla.throughput_mbytes_per_s > 1.2 * kist10.throughput_mbytes_per_s
    assert vanilla.run_period_ms < 1.0


def test_json_and_cli():
    d = jsonout.to_json(E.ceiling_path(scheduler="kistlite", interval_ms=10, circuits=2, transfer_bytes=400_000))
    json.dumps(d, allow_nan=False)
    assert {"throughput_mbytes_per_s", "run_period_ms", "cells_per_run_median", "max_inflight_cells"} <= set(d)
    result = CliRunner().invoke(app, ["sim", "experiment", "ceiling-path", "--scheduler", "kistlite",
                                      "--interval-ms", "2", "--circuits", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["circuits"] == 2 and out["interval_ms"] == 2
    # 64 data cells toward the client, plus the odd SENDME the middle sends toward the exit
    assert 64 <= out["cells_per_run_median"] <= 70


@pytest.mark.parametrize("kwargs, key", [
    (dict(circuits=0), "circuits"),
    (dict(transfer_bytes=4), "transfer_bytes"),
    (dict(interval_ms=0), "kist_interval_ms"),
    (dict(scheduler="fifo"), "scheduler"),
])
def test_bad_arguments(kwargs, key):
    with pytest.raises(SimConfigError, match=key):
        E.ceiling_path(**kwargs)
