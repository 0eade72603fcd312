"""Plot a measured live run: every measured sample of one metric over the run's time, coloured by the
value of the consensus its node held when it was measured, with the run's decisions marked.

Run: .venv/bin/python bench/plot_measured_run.py EXP [--metric client_ttlb_1mib_s] [-o docs/img/x.png]
EXP is the experiment directory of a `kistexp run` with measured metrics (for example the one the
real-tor end-to-end test tests/rollout/test_rollout_measured_realtor.py leaves in its temporary directory).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PARAM = "KISTSchedRunInterval"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exp", type=Path)
    ap.add_argument("--metric", default="client_ttlb_1mib_s")
    ap.add_argument("-o", "--output", type=Path, default=Path("measured-run.png"))
    args = ap.parse_args()
    db = args.exp / "experiment.db"
    if not db.is_file():
        print(f"{args.exp}: no experiment.db", file=sys.stderr)
        return 1
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = conn.execute("SELECT x.t_us, x.value, s.labels FROM samples x JOIN series s ON s.id = x.series_id "
                        "WHERE s.metric = ? ORDER BY x.t_us", (args.metric,)).fetchall()
    decisions = conn.execute("SELECT at_us, decision FROM rollout_decisions ORDER BY id").fetchall()
    consensus = {r[0]: json.loads(r[1]) for r in conn.execute(
        "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE params != 'null'")}
    conn.close()
    if not rows:
        print(f"{args.exp}: no {args.metric} samples", file=sys.stderr)
        return 1
    t0 = rows[0][0] / 1e6
    # the value each sample's node held: the newest consensus the run saw at or before its valid-after
    seen = sorted(consensus.items())

    def value_of(labels: str) -> str:
        va = json.loads(labels).get("valid_after")
        if not va:
            return "unknown"
        import datetime as dt

        us = int(dt.datetime.fromisoformat(va).timestamp() * 1e6)
        older = [p for t, p in seen if t <= us]
        return f"{older[-1].get(PARAM)} ms" if older and PARAM in older[-1] else "unknown"

    groups: dict[str, tuple[list[float], list[float]]] = {}
    for t_us, value, labels in rows:
        xs, ys = groups.setdefault(value_of(labels), ([], []))
        xs.append(t_us / 1e6 - t0)
        ys.append(value)
    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=110)
    for name, (xs, ys) in sorted(groups.items()):
        ax.scatter(xs, ys, s=12, label=f"{PARAM} held: {name}")
    top = max(v for _, v, _ in rows)
    for at_us, what in decisions:
        if what.startswith(("stage:", "rollback:", "stepped-back", "in-consensus")):
            x = at_us / 1e6 - t0
            ax.axvline(x, color="grey", lw=0.8, ls="--")
            ax.text(x, top * 1.02, what.split(":")[0], rotation=90, va="bottom", ha="right", fontsize=7)
    ax.set_xlabel("seconds since the first measurement (one plan hour = one 10 s voting round)")
    ax.set_ylabel(f"{args.metric} (s)")
    ax.set_ylim(0, top * 1.25)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.set_title("Measured 1 MiB download times through a local tor network", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output} ({len(rows)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
