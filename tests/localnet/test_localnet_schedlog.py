"""Scheduler runs from tor's [sched]debug log (kist-ewma.md §5.2, §12; the message texts of
tor 0.4.9's scheduler_kist.c / scheduler_vanilla.c)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kistexp.errors import LocalNetError
from kistexp.localnet.schedlog import log_size, parse_runs, read_runs, summarise


def _kistlite_log(runs: int, period_ms: int, cells: int = 64, start_ms: int = 5000) -> list[str]:
    """A KISTLite stretch as tor 0.4.9 logs it: one backlogged channel (8) moving ``cells``
    per run, plus a few SENDMEs on channel 7."""
    lines = []
    for r in range(runs):
        t = start_ms + r * period_ms
        stamp = f"Nov 30 13:07:{t // 1000:02d}.{t % 1000:03d}"
        lines.append(f"{stamp} [debug] scheduler_evt_callback(): Scheduler event callback called")
        lines.append(f"{stamp} [debug] update_socket_info(): chan=8 updated socket info, limit: 34752, cwnd: 0, "
                     "unacked: 0, notsent: 0, mss: 0")
        lines.append(f"{stamp} [debug] kist_scheduler_run(): Running the scheduler. 2 channels pending")
        if r % 10 == 0:
            lines.append(f"{stamp} [debug] update_socket_written(): chan=7 wrote 543 bytes, old was 0")
        for c in range(cells):
            lines.append(f"{stamp} [debug] update_socket_written(): chan=8 wrote 543 bytes, old was {543 * c}")
            lines.append(f"{stamp} [debug] scheduler_set_channel_state(): chan 8 changed from scheduler state "
                         "PENDING to PENDING")
        lines.append(f"{stamp} [debug] kist_scheduler_run(): len pending=0, len to_readd=1")
    return lines


def test_kistlite_period_and_cells_per_run() -> None:
    runs = parse_runs(_kistlite_log(runs=40, period_ms=12))
    assert len(runs) == 40
    stats = summarise(runs)
    assert stats.busy_channel == 8
    assert stats.period_ms_median == pytest.approx(12.0)
    assert stats.period_ms_mean == pytest.approx(12.0)
    assert stats.cells_per_run_median == 64
    assert stats.cells_total == 40 * 64
    # 64 cells of 514 bytes every 12 ms: the KISTLite channel ceiling of kist-ewma.md §12
    assert stats.cells_per_run_median * 514 / stats.period_ms_median / 1000 == pytest.approx(2.74, abs=0.01)


def test_idle_gaps_are_not_periods() -> None:
    lines = _kistlite_log(runs=10, period_ms=4) + _kistlite_log(runs=10, period_ms=4, start_ms=9000)
    stats = summarise(parse_runs(lines))
    assert stats.period_ms_median == pytest.approx(4.0)
    assert stats.busy_runs == 20


def test_vanilla_runs() -> None:
    lines = []
    for i in range(5):
        stamp = f"Nov 30 13:07:10.{100 + i:03d}"
        lines += [
            f"{stamp} [debug] vanilla_scheduler_run(): We have a chance to run the scheduler",
            f"{stamp} [debug] vanilla_scheduler_run(): Scheduler saw pending channel 8 at 0x55f "
            "with 32 cells writeable",
            f"{stamp} [debug] vanilla_scheduler_run(): Scheduler flushed 32 cells onto pending channel 8 at 0x55f",
            f"{stamp} [debug] vanilla_scheduler_run(): Scheduler handled 1 of 1 pending channels",
        ]
    stats = summarise(parse_runs(lines))
    assert stats.runs == 5 and stats.cells_per_run_median == 32 and stats.period_ms_median == pytest.approx(1.0)


def test_no_runs_and_missing_log(tmp_path: Path) -> None:
    stats = summarise(parse_runs(["Nov 30 13:07:10.100 [notice] Tor 0.4.9.11 opening log file."]))
    assert stats.runs == 0 and stats.busy_channel is None and stats.period_ms_median is None
    with pytest.raises(LocalNetError, match="no scheduler debug log"):
        read_runs(tmp_path / "sched.log")
    assert log_size(tmp_path / "sched.log") == 0


def test_read_from_offset(tmp_path: Path) -> None:
    path = tmp_path / "sched.log"
    path.write_text("\n".join(_kistlite_log(runs=20, period_ms=12)) + "\n")
    offset = log_size(path)
    with path.open("a") as fh:
        fh.write("\n".join(_kistlite_log(runs=20, period_ms=4, start_ms=20000)) + "\n")
    assert read_runs(path, offset).period_ms_median == pytest.approx(4.0)
    assert read_runs(path).runs == 40
