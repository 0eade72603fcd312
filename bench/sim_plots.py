"""Regenerate the simulator curves in docs/img/ and the figure tables of docs/simulator.md (between
its <!-- table:NAME --> markers), and print the tables.

    .venv/bin/python bench/sim_plots.py            # all: ewma, circuit, ceiling plots + ceiling-path and
                                                   # kernel-queue tables
    .venv/bin/python bench/sim_plots.py ewma       # only some
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from kistexp.sim import experiments as E  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "simulator.md"
IMG = DOC.parent / "img"
INTERVALS_MS = (1, 2, 3, 5, 10, 20)
# real-tor.md, one loopback circuit, tor 0.4.9.11, mean of 3 runs: a reference, not a target
REAL_TOR_KIST_MBYTES_PER_S = {10: 2.7, 2: 8.2}
REAL_TOR_VANILLA_MBYTES_PER_S = 30.0


def _log_axes(ax, ticks) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ticks, [str(i) for i in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)


def _save(fig, ax, name: str, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the curves stay visible
    fig.tight_layout()
    fig.savefig(IMG / f"sim_{name}.png", dpi=110)
    plt.close(fig)


def _table(header: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def period_ms(interval_ms: int, tick_ms: float = 4.0) -> float:
    """kist-ewma.md §5.2: the post-run timeout interval - 1 ms, quantised to the kernel tick."""
    return tick_ms * -(-(interval_ms - 1) // tick_ms)


def plot_ewma() -> str:
    r = E.ewma(intervals_ms=INTERVALS_MS)
    iv = [p.interval_ms for p in r.points]
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    ax.plot(iv, [p.bulk_delay_ms_mean for p in r.points], "s-", color="tab:red", label="bulk, mean")
    ax.plot(iv, [p.bulk_delay_ms_p50 for p in r.points], "s--", color="tab:red", alpha=0.5, label="bulk, median")
    ax.plot(iv, [p.interactive_delay_ms_mean for p in r.points], "o-", color="tab:blue", label="interactive, mean")
    ax.plot(iv, [p.interactive_delay_ms_p50 for p in r.points], "o--", color="tab:blue", alpha=0.5,
            label="interactive, median")
    ax.plot(iv, [p.interactive_kernel_delay_ms_mean for p in r.points], "o:", color="tab:blue", alpha=0.6,
            label="interactive, mean in kernel")
    _log_axes(ax, iv)
    _save(fig, ax, "ewma", "relay KISTSchedRunInterval (ms)", "time at the relay per cell (ms)",
          f"KIST + EWMA, one channel: {r.interactive_circuits} interactive and {r.bulk_circuits} bulk circuits")
    return _table(["relay interval (ms)", "interactive p50 (ms)", "interactive mean (ms)", "of which kernel (ms)",
                   "bulk p50 (ms)", "bulk mean (ms)", "bulk / interactive (means)"],
                  [[p.interval_ms, f"{p.interactive_delay_ms_p50:.2f}", f"{p.interactive_delay_ms_mean:.2f}",
                    f"{p.interactive_kernel_delay_ms_mean:.2f}", f"{p.bulk_delay_ms_p50:.1f}",
                    f"{p.bulk_delay_ms_mean:.1f}", f"{p.advantage:.1f}"] for p in r.points])


def plot_circuit() -> str:
    cases = [(s, iv) for s in ("kist", "kistlite") for iv in INTERVALS_MS if iv >= 2] + [("vanilla", 10)]
    r = E.circuit_sweep(cases=cases)
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    for sched, style in (("kist", "o-"), ("kistlite", "s-")):
        pts = [p for p in r.points if p.scheduler == sched]
        ax.plot([p.interval_ms for p in pts], [p.throughput_mbytes_per_s for p in pts], style, label=f"{sched} (sim)")
    vanilla = r.throughput("vanilla", 10)
    ax.axhline(vanilla, color="tab:green", label=f"vanilla (sim) {vanilla:.0f} MB/s")
    ax.axhline(REAL_TOR_VANILLA_MBYTES_PER_S, color="tab:green", ls=":", label="vanilla, real tor (~30, noisy)")
    ax.plot(list(REAL_TOR_KIST_MBYTES_PER_S), list(REAL_TOR_KIST_MBYTES_PER_S.values()), "k*", ms=11,
            label="kist, real tor 0.4.9 (loopback)")
    _log_axes(ax, [iv for iv in INTERVALS_MS if iv >= 2])
    _save(fig, ax, "circuit", "KISTSchedRunInterval on every node, client included (ms)",
          "one-circuit throughput (MB/s)", "One 3-hop circuit on loopback, 20 MiB, Vegas")
    return _table(["scheduler", "interval (ms)", "MB/s", "max in flight (cells)", "busiest node CPU (cores)"],
                  [[p.scheduler, p.interval_ms, f"{p.throughput_mbytes_per_s:.2f}", p.max_inflight_cells,
                    f"{p.cpu_core_fraction_max:.3f}"] for p in r.points])


def plot_ceiling() -> str:
    lite = [E.ceiling(scheduler="kistlite", interval_ms=iv) for iv in INTERVALS_MS]
    kist = [E.ceiling(scheduler="kist", interval_ms=iv) for iv in INTERVALS_MS]
    vanilla = E.ceiling(scheduler="vanilla")
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    ax.plot(INTERVALS_MS, [r.throughput_mbytes_per_s for r in lite], "s-", label="kistlite (sim)")
    ax.plot(INTERVALS_MS, [64 * 514 / iv / 1e3 for iv in INTERVALS_MS], "k:",
            label="64 cells / nominal interval")
    real = [iv for iv in INTERVALS_MS if iv >= 2]
    ax.plot(real, [64 * 514 / period_ms(iv) / 1e3 for iv in real], "k--", alpha=0.6,
            label="64 cells / period of §5.2")
    ax.plot(INTERVALS_MS, [r.throughput_mbytes_per_s for r in kist], "o-", label="kist, 64 KiB mss (sim)")
    ax.axhline(vanilla.throughput_mbytes_per_s, color="tab:green", label="vanilla (sim)")
    _log_axes(ax, INTERVALS_MS)
    _save(fig, ax, "ceiling", "KISTSchedRunInterval (ms), kernel tick 4 ms", "channel throughput (MB/s)",
          "One channel, 8 bulk circuits, loopback")
    return _table(["scheduler", "interval (ms)", "run period (ms)", "cells per run", "MB/s"],
                  [[r.scheduler, r.interval_ms, f"{r.run_period_ms:.2f}", r.cells_per_run_mode,
                    f"{r.throughput_mbytes_per_s:.2f}"] for r in [*lite, *kist, vanilla]])


def table_kernel_queue() -> str:
    r = E.kernel_queue()
    return _table(["scheduler", "app p50 (ms)", "kernel p50 (ms)", "app mean (ms)", "kernel mean (ms)",
                   "mean app bytes", "mean kernel bytes", "MB/s"],
                  [[p.scheduler, f"{p.app_delay_ms_p50:.2f}", f"{p.kernel_delay_ms_p50:.2f}",
                    f"{p.app_delay_ms_mean:.1f}", f"{p.kernel_delay_ms_mean:.1f}", f"{p.mean_app_bytes:,.0f}",
                    f"{p.mean_kernel_bytes:,.0f}", f"{p.throughput_mbytes_per_s:.2f}"] for p in r.points])


def table_ceiling_path() -> str:
    """The fidelity harness's ceiling scenario: 8 downloads over one 3-hop path (20 MiB in all)."""
    cases = [("kistlite", 10), ("kistlite", 2), ("kist", 10), ("kist", 2), ("vanilla", 10)]
    rows = []
    for sched, iv in cases:
        r = E.ceiling_path(scheduler=sched, interval_ms=iv)
        rows.append([sched, "–" if sched == "vanilla" else iv, f"{r.throughput_mbytes_per_s:.2f}",
                     f"{r.run_period_ms:.2f}", f"{r.cells_per_run_median:.0f}"])
    return _table(["scheduler", "interval (ms)", "MB/s", "run period (ms)", "cells per run (median)"], rows)


PLOTS = {"ewma": plot_ewma, "circuit": plot_circuit, "ceiling": plot_ceiling, "ceiling-path": table_ceiling_path,
         "kernel-queue": table_kernel_queue}


def update_doc(tables: dict[str, str]) -> None:
    """Replace each table between <!-- table:NAME --> and <!-- /table:NAME --> in the docs page."""
    text = DOC.read_text()
    for name, table in tables.items():
        pattern = re.compile(rf"(<!-- table:{re.escape(name)} -->\n).*?(\n<!-- /table:{re.escape(name)} -->)", re.S)
        text = pattern.sub(lambda m, t=table: m.group(1) + t + m.group(2), text)
    DOC.write_text(text)


def main(names: list[str]) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name in names or list(PLOTS):
        t0 = time.perf_counter()
        tables[name] = PLOTS[name]()
        print(f"{tables[name]}\n{name}: {time.perf_counter() - t0:.1f} s\n")
    update_doc(tables)


if __name__ == "__main__":
    main(sys.argv[1:])
