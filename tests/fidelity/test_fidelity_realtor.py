"""Real tor, small fidelity cases (issue 4 point 7; real-tor.md "Throughput": about 2.7 MB/s at
10 ms and about 8 MB/s at 2 ms on one circuit on this kind of machine; kist-ewma.md §5.2: the
real run period is tick-quantised, 12 ms and 4 ms with a 4 ms kernel tick; §6/§12: KISTLite
moves 64 cells per channel per run). Checks ordering and rough ranges, not exact figures.
One network serves every test of the module."""

from __future__ import annotations

import pytest
from conftest import have_real_tor

from kistexp.fidelity import Case, RealTor, simulate

pytestmark = [
    pytest.mark.realtor,
    pytest.mark.slow,
    pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor and tor-gencert"),
    pytest.mark.timeout(180),
]

SIZE = 10_000_000
# real-tor.md means; the range allows run-to-run noise on a shared 2-core machine (a 10 MB
# transfer at 10 ms has been seen at 3.9 MB/s while other work ran).
EXPECTED_MBYTES_PER_S = {10: 2.7, 2: 8.2}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    with RealTor(root=tmp_path_factory.mktemp("fidelity") / "net") as rt:
        yield rt


def test_kist_2ms_circuit_is_faster_than_10ms_and_in_range(real) -> None:
    slow = real.measure(Case("circuit", "kist", 10), repetitions=2, size_bytes=SIZE)
    fast = real.measure(Case("circuit", "kist", 2), repetitions=2, size_bytes=SIZE)
    assert all(real.net.pid(n) for n in real.net.nodes)

    # the period ratio is 12 ms / 4 ms = 3; demand a clear majority of it
    assert fast.mean_mbytes_per_s > 1.6 * slow.mean_mbytes_per_s
    for interval, side in ((10, slow), (2, fast)):
        expected = EXPECTED_MBYTES_PER_S[interval]
        assert 0.5 * expected <= side.mean_mbytes_per_s <= 1.6 * expected, (interval, side.throughputs_mbytes_per_s)
        assert not side.cpu_bound
        assert side.cpu_seconds_per_mbyte > 0

    # The middle relay's scheduler log: runs come further apart than the interval at 10 ms
    # (timer deadline rounded up to kernel ticks) and the 2 ms period is far shorter.
    assert slow.run_period is not None and fast.run_period is not None
    assert 9.0 <= slow.run_period.period_ms_median <= 16.0
    assert 1.0 <= fast.run_period.period_ms_median <= 6.0
    assert slow.run_period.busy_runs > 20


def test_kistlite_8_circuit_ceiling_matches_the_simulated_path(real) -> None:
    """8 downloads over one pinned path share one channel per hop; KISTLite moves 64 cells per
    run on it, 12 ms apart at 10 ms. The simulator's like-for-like scenario (ceiling_path) has
    come within 10 % of real tor here in every measurement so far; 25 % is the issue's target."""
    pytest.importorskip("kistexp.sim.experiments")
    case = Case("ceiling", "kistlite", 10)
    side = real.measure(case, repetitions=1, size_bytes=8_000_000)
    assert side.run_period is not None
    assert side.run_period.cells_per_run_median == 64
    assert 9.0 <= side.run_period.period_ms_median <= 16.0
    sim = simulate(case, seed=1, size_bytes=8_000_000)
    assert 0.75 <= sim.mean_mbytes_per_s / side.mean_mbytes_per_s <= 1.25, side.throughputs_mbytes_per_s


@pytest.mark.timeout(600)  # two bounded waits of PARAMS_TIMEOUT_S and a client restart at worst
def test_cc_off_via_consensus_params_kistlite_matches_the_simulator(real) -> None:
    """cc_alg=0 voted by the authorities reaches every node's consensus (the harness waits for
    it, restarting the client that tor 0.4.9 would otherwise strand), new circuits then use
    the fixed SENDME windows, and with KISTLite at 10 ms the shared channel still moves 64
    cells per run about 12 ms apart. The simulator's cc_alg=0 twin stays below that channel's
    ceiling (64 cells per 12 ms, 2.74 MB/s of payload) and, with tor's read share and the stream
    SENDMEs held behind the edge's outbuf, within a few % of real tor (2.31 against 2.22-2.29
    MB/s at 20 MB, kistexp/data/fidelity-history.csv, runs 2026-12-02T12:54Z to 17:12Z; 2.21 against
    2.29-2.36 here at 4 MB): the check is the
    25 % target above and a floor below (real tor falls further under load). Runs last: it
    leaves cc_alg=0 in the consensus."""
    from kistexp.fidelity.realtor import _consensus_cc_alg

    case = Case("cc-off", "kistlite", 10)
    pid_before = real.net.pid(real.client)
    with real.net.control(real.client.nickname) as ctl:
        built_before = ctl.circuit_ids()
    assert built_before  # the harness's warm-up download built at least one
    side = real.measure(case, repetitions=2, size_bytes=4_000_000)
    # no download ran on a circuit that negotiated Vegas before the vote: the client was
    # restarted (a new process numbers its circuits anew), or its old circuits were all closed
    if real.net.pid(real.client) == pid_before:
        with real.net.control(real.client.nickname) as ctl:
            assert not built_before & ctl.circuit_ids()
    for node in (real.client, real.guard, real.middle, real.exit):
        assert _consensus_cc_alg(real.net, node.nickname) == 0
    assert side.run_period is not None and side.run_period.cells_per_run_median == 64
    assert 9.0 <= side.run_period.period_ms_median <= 16.0
    sim = simulate(case, seed=1, size_bytes=4_000_000)
    assert sim.mean_mbytes_per_s <= 64 * 498 / 0.012 / 1e6
    assert 0.6 * sim.mean_mbytes_per_s <= side.mean_mbytes_per_s <= 1.25 * sim.mean_mbytes_per_s, \
        side.throughputs_mbytes_per_s
