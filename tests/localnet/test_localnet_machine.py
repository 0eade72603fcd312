"""The machine's own stalls (kistexp.localnet.machine): CPU time its hypervisor takes, late timers."""

from __future__ import annotations

import pytest

from kistexp import jsonout
from kistexp.localnet import machine
from kistexp.localnet.machine import CpuTicks, TimerLateness


def test_cpu_line_with_and_without_steal() -> None:
    # proc(5): user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    # already inside user and nice, so it is not added twice
    line = "cpu  1172395 287 82134 1378176 15645 0 3458 98959 500 7"
    assert machine.parse_cpu_line(line) == CpuTicks(1172395 + 287 + 82134 + 1378176 + 15645 + 3458 + 98959, 98959)
    assert machine.parse_cpu_line("cpu 10 0 5 85") == CpuTicks(100, 0)  # a kernel without the field
    assert machine.parse_cpu_line("cpu0 1 2 3 4 5 6 7 8") is None  # one core's line, not the machine's
    assert machine.parse_cpu_line("cpu a b c d") is None
    assert machine.parse_cpu_line("") is None


def test_stolen_fraction_between_two_readings(tmp_path) -> None:
    before, after = CpuTicks(10_000, 300), CpuTicks(12_000, 420)
    assert machine.stolen_fraction(before, after) == pytest.approx(120 / 2000)
    assert machine.stolen_fraction(before, before) is None  # no tick passed
    assert machine.stolen_fraction(None, after) is None
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 0 0 0 50\ncpu0 50 0 25 400 0 0 0 25\n")
    assert machine.cpu_ticks(stat) == CpuTicks(1000, 50)
    assert machine.cpu_ticks(tmp_path / "missing") is None


def test_lateness_summary() -> None:
    overshoots = [0.1] * 90 + [2.0] * 9 + [7.5]  # 10 of 100 more than 1 ms late
    t = machine.lateness_of(overshoots, 1.0, stolen=0.06)
    assert (t.sleeps, t.median_ms, t.p99_ms, t.max_ms) == (100, 0.1, 2.0, 7.5)
    assert t.late_fraction == pytest.approx(0.10) and t.stalls
    quiet = machine.lateness_of([0.1] * 999 + [1.5], 1.0, stolen=0.002)
    assert quiet.late_fraction == pytest.approx(0.001) and not quiet.stalls
    # a machine whose timers are on time but whose host takes 1 % of its CPU still stalls tor
    assert machine.lateness_of([0.1] * 10, 1.0, stolen=0.01).stalls
    assert machine.lateness_of([-0.05], 1.0).median_ms == 0.0  # early wake-ups count as on time
    with pytest.raises(ValueError):
        machine.lateness_of([], 1.0)
    assert TimerLateness.from_json(jsonout.to_json(t)) == t
    assert TimerLateness.from_json(None) is None and TimerLateness.from_json({"sleeps": 3}) is None
    text = machine.describe(t)
    assert "10.0 % more than 1 ms late" in text and "99th percentile 2.0 ms" in text and "6.0 %" in text


def test_probe_measures_real_sleeps() -> None:
    t = machine.probe_timers(duration_s=0.3, sleep_ms=2.0)
    # 0.3 s of 2 ms sleeps: at most 150 wake-ups, and even a stalling machine manages a few
    assert 3 <= t.sleeps <= 150 and t.sleep_ms == 2.0
    assert 0.0 <= t.median_ms <= t.p99_ms <= t.max_ms
    assert 0.0 <= t.late_fraction <= 1.0
    with pytest.raises(ValueError, match="sleep_ms"):
        machine.probe_timers(duration_s=0.1, sleep_ms=0)


def test_peak_rss_is_the_process_own_not_its_forking_parents(tmp_path):
    """A child's peak memory is its own: ru_maxrss would carry a large parent's resident memory across
    the child's exec (bench/sim_bench.py's compiling parent once made every first child report it)."""
    import subprocess
    import sys

    code = "from kistexp.localnet import machine; print(machine.peak_rss_mib())"
    small = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    ballast = bytearray(400 * 2**20)  # this process resident 400 MiB more when it forks the child
    ballast[::4096] = b"x" * len(ballast[::4096])
    after = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    del ballast
    assert 5 < small < 200 and after < small + 50, (small, after)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  9000 kB\nVmHWM:\t  204800 kB\n")
    assert machine.peak_rss_mib(status) == 200.0
