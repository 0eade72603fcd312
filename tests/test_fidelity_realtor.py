"""Real tor, small fidelity case: one circuit under KIST at 10 ms and at 2 ms (issue 4
point 7; real-tor.md "Throughput": about 2.7 MB/s at 10 ms and about 8 MB/s at 2 ms on
this kind of machine; kist-ewma.md §5.2: the real run period is tick-quantised, 12 ms and
4 ms with a 4 ms kernel tick). Checks ordering and rough ranges, not exact figures."""

from __future__ import annotations

import pytest
from conftest import have_real_tor

from kistexp.fidelity import Case, RealTor

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


def test_kist_2ms_circuit_is_faster_than_10ms_and_in_range(tmp_path) -> None:
    with RealTor(root=tmp_path / "net") as real:
        slow = real.measure(Case("circuit", "kist", 10), repetitions=2, size_bytes=SIZE)
        fast = real.measure(Case("circuit", "kist", 2), repetitions=2, size_bytes=SIZE)
        pids = [real.net.pid(n) for n in real.net.nodes]
    assert all(pids)

    # the period ratio is 12 ms / 4 ms = 3; demand a clear majority of it
    assert fast.mean_mbytes_per_s > 1.6 * slow.mean_mbytes_per_s
    for interval, side in ((10, slow), (2, fast)):
        expected = EXPECTED_MBYTES_PER_S[interval]
        assert 0.5 * expected <= side.mean_mbytes_per_s <= 1.6 * expected, (interval, side.throughputs_mbytes_per_s)
        assert not side.cpu_bound

    # The middle relay's scheduler log: runs come further apart than the interval at 10 ms
    # (timer deadline rounded up to kernel ticks) and the 2 ms period is far shorter.
    assert slow.run_period is not None and fast.run_period is not None
    assert 9.0 <= slow.run_period.period_ms_median <= 16.0
    assert 1.0 <= fast.run_period.period_ms_median <= 6.0
    assert slow.run_period.busy_runs > 20
