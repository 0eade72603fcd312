"""Shape of the simulator's experiments (issue 4 point 6; kist-ewma.md §5.2, §6, §9, §11, §12).

Sizes are chosen so that each experiment runs in a second or two once the engine is compiled.
"""

from __future__ import annotations

import pytest

from kistexp import jsonout
from kistexp.errors import SimConfigError
from kistexp.sim import experiments as E

KISTLITE_BUDGET_BYTES = 64 * 514  # §6: 64 cells from an empty outbuf


@pytest.fixture(scope="module")
def lite10():
    return E.ceiling(scheduler="kistlite", interval_ms=10)


def test_kistlite_ceiling_is_64_cells_per_real_period(lite10):
    """§6 + §5.2: 64 cells per run, and the run period at interval 10 with a 4 ms tick is 12 ms."""
    assert lite10.cells_per_run_mode == 64
    assert lite10.cells_per_run_median == 64
    assert lite10.run_period_ms == pytest.approx(12.0, abs=0.3)
    expected = KISTLITE_BUDGET_BYTES / (lite10.run_period_ms / 1e3) / 1e6
    assert lite10.throughput_mbytes_per_s == pytest.approx(expected, rel=0.03)
    assert lite10.throughput_mbytes_per_s == pytest.approx(2.74, rel=0.03)  # §6 table, real period
    d = jsonout.to_json(lite10)
    assert d["throughput_mbytes_per_s"] == lite10.throughput_mbytes_per_s and "run_period_ms" in d


def test_kistlite_ceiling_at_2ms_follows_the_4ms_tick_not_the_interval(lite10):
    lite2 = E.ceiling(scheduler="kistlite", interval_ms=2)
    assert lite2.cells_per_run_mode == 64
    assert lite2.run_period_ms == pytest.approx(4.0, abs=0.2)
    assert lite2.throughput_mbytes_per_s == pytest.approx(8.22, rel=0.03)
    # the period shrinks 3x (12 -> 4 ms), not 5x as the nominal intervals would suggest
    assert lite2.throughput_mbytes_per_s / lite10.throughput_mbytes_per_s == pytest.approx(3.0, rel=0.05)


def test_vanilla_and_loopback_kist_are_not_bound_by_the_kistlite_budget(lite10):
    vanilla = E.ceiling(scheduler="vanilla", interval_ms=10)
    kist = E.ceiling(scheduler="kist", interval_ms=10)
    # Vanilla has no interval: it runs again whenever the outbuf drains (§9)
    assert vanilla.run_period_ms < 2.0
    assert vanilla.throughput_mbytes_per_s > 10 * lite10.throughput_mbytes_per_s
    # KIST with a 64 KiB mss: the per-socket limit allows far more than 64 cells (§6 table)
    assert kist.cells_per_run_mode > 10 * 64
    assert kist.throughput_mbytes_per_s > 10 * lite10.throughput_mbytes_per_s


def test_kist_first_run_moves_53_cells_on_an_idle_iw10_socket():
    r = E.kist_first_run()
    # §6: limit = (10 - 0) * 1448 + 10 * 1448 = 28,960 B; floor(28960 / 543) = 53
    assert r.first_run_cells == 53
    bigger = E.kist_first_run(initial_cwnd=20)
    assert bigger.first_run_cells == (2 * 20 * 1448) // 543


@pytest.fixture(scope="module")
def sweep():
    return E.circuit_sweep(transfer_bytes=5 * 1024 * 1024)


def test_one_circuit_throughput_ordering_and_range(sweep):
    """Loopback 3-hop circuit. Real tor 0.4.9 (real-tor.md): ~2.7 MB/s at 10 ms, ~8.2 at 2 ms,
    Vanilla several times faster. Ranges are a factor of two either way: the model is not tuned
    to these figures (docs/simulator.md, Fidelity)."""
    k10, k5, k2 = (sweep.throughput("kist", iv) for iv in (10, 5, 2))
    vanilla = sweep.throughput("vanilla", 10)
    # real tor: 9.27 / 7.13 / 3.47 MB/s at 2 / 5 / 10 ms (kistexp/data/fidelity-history.csv, run
    # 2026-11-30T14:10Z); the model with Nagle on the
    # 10 µs loopback has 5 ms at 2.0 times 10 ms
    assert k2 > 2 * k10 and k5 > 1.8 * k10
    # real tor's order (the same run, and every run of the history): 2 > 5 > 10 ms, and KIST above
    # KISTLite at 10 ms, which
    # needs the timer's wake-up phase and the pass length of §5.2. The model's run periods at 2
    # and 5 ms are both about 4 ms (timeouts of 1 and 4 ms on a 4 ms tick); with the exit's read
    # share it had them within a fifth of each other, either way by seed, and since the exit
    # reads its servers in the pass after a SENDME's (docs/simulator.md, "Design choices") 5 ms is 0.73
    # of 2 ms, real tor's 0.77 (7.13 against 9.27 MB/s)
    assert k2 > k5 > k10
    assert k5 / k2 == pytest.approx(7.13 / 9.27, rel=0.15)
    assert k10 > sweep.throughput("kistlite", 10)
    assert vanilla > 3 * max(k2, k5, k10, sweep.throughput("kistlite", 2))
    assert 2.7 / 2 < k10 < 2.7 * 2
    assert 8.2 / 2 < k2 < 8.2 * 2
    assert all(p.finished for p in sweep.points)
    assert sweep.throughput("kistlite", 2) > sweep.throughput("kistlite", 10)


def test_one_circuit_is_window_bound_not_budget_bound(sweep):
    """With a 64 KiB mss the KIST socket limit is huge (§6 table); what binds is the circuit's
    window over a round trip that each hop's run period inflates (§12.2), so throughput scales
    with 1 / P: 12 ms at 10 and 4 ms at 2 with a 4 ms tick (§5.2), a factor 3, not 10 / 2 = 5."""
    k10, k2 = sweep.throughput("kist", 10), sweep.throughput("kist", 2)
    assert 2.4 < k2 / k10 < 3.6
    budget = E.ceiling(scheduler="kist", interval_ms=10, duration_s=1.0).throughput_mbytes_per_s
    assert k10 < 0.2 * budget
    p10 = next(p for p in sweep.points if p.scheduler == "kist" and p.interval_ms == 10)
    assert p10.client_interval_ms == 10 and p10.flow_control == "vegas"


def test_ewma_interactive_far_below_bulk_and_advantage_shrinks_toward_1ms():
    """§11.7: EWMA serves the quiet circuits first, so their cells barely wait at the relay while
    bulk cells queue. At 1-2 ms KIST refills the socket almost continuously, so interactive cells
    wait more behind bulk bytes already in the kernel, where EWMA cannot reorder them (§12.1)."""
    r = E.ewma(duration_s=10.0)
    assert [p.interval_ms for p in r.points] == [1, 2, 5, 10, 20]
    for p in r.points:
        assert p.interactive_delay_ms_p50 < p.bulk_delay_ms_p50 / 5
        assert p.interactive_delay_ms_mean < p.bulk_delay_ms_mean / 5
    at = {p.interval_ms: p for p in r.points}
    assert at[1].interactive_delay_ms_mean > 1.05 * at[10].interactive_delay_ms_mean
    assert at[2].interactive_delay_ms_mean > 1.05 * at[10].interactive_delay_ms_mean
    assert at[1].interactive_kernel_delay_ms_mean > at[20].interactive_kernel_delay_ms_mean
    d = jsonout.to_json(r)
    assert {"interval_ms", "interactive_delay_ms_p50", "bulk_delay_ms_p50"} <= set(d["points"][0])
    assert d["client_interval_ms"] == 2


def test_kernel_queue_kist_queues_in_the_application_vanilla_in_the_kernel():
    r = E.kernel_queue(duration_s=5.0)
    kist, vanilla = r.point("kist"), r.point("vanilla")
    assert kist.kernel_delay_ms_mean * 4 < vanilla.kernel_delay_ms_mean
    assert kist.mean_kernel_bytes * 2 < vanilla.mean_kernel_bytes
    # KIST's cells wait in the circuit queues, where EWMA orders them; Vanilla's in the kernel
    assert kist.kernel_delay_share < 0.25
    assert vanilla.kernel_delay_share > 2 * kist.kernel_delay_share
    assert kist.mean_app_bytes > kist.mean_kernel_bytes
    # both keep the relay busy: the queue moves, the throughput does not collapse
    assert kist.throughput_mbytes_per_s > 0.5 * vanilla.throughput_mbytes_per_s
    assert jsonout.to_json(r)["points"][0]["kernel_delay_share"] == kist.kernel_delay_share


@pytest.mark.parametrize("kwargs, key", [
    (dict(name="nosuch"), "unknown experiment"),
    (dict(name="ceiling", scheduler="fifo"), "unknown scheduler"),
    (dict(name="circuit", interval_ms=0), "kist_interval_ms"),
    (dict(name="circuit", interval_ms=101), "kist_interval_ms"),
    (dict(name="ewma", client_interval_ms=500), "kist_interval_ms"),
    (dict(name="ceiling", circuits=0), "circuits"),
    (dict(name="kist-first-run", scheduler="vanilla"), "kist"),
])
def test_bad_arguments_fail_before_running(kwargs, key):
    with pytest.raises(SimConfigError, match=key):
        E.check_experiment_args(**kwargs)
    with pytest.raises(SimConfigError):
        E.ceiling(interval_ms=0)


def test_unfinished_transfer_reports_delivered_bytes_and_valid_json():
    import json

    r = E.circuit(scheduler="kist", interval_ms=10, transfer_bytes=50 * 1024 * 1024, max_duration_s=0.5)
    assert not r.finished and r.ttlb_s is None
    # about 2.6 MB/s minus the start-up: well under what a finished 50 MiB transfer would claim
    assert 0.5 < r.throughput_mbytes_per_s < 5
    json.dumps(jsonout.to_json(r), allow_nan=False)
