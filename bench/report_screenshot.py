"""The screenshot of docs/reports.md: a dry run of the bundled KIST plan with a rehearsed fault
(+50 % relay CPU in stage 1, so the "relay CPU" criterion fails and the run steps back), its
report, and the top of the page as headless Chromium draws it.

    PYTHONPATH=$PWD .venv/bin/python bench/report_screenshot.py [--dir EXP] [--out docs/img/report.png]

EXP holds the plan's predictions (default experiments/kist-run-interval-2020, where
`kistexp simulate plans/kist-run-interval-2020.toml` saves them). Prints the paths and figures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from kistexp.plan.loader import load_plan
from kistexp.report.browser import render
from kistexp.report.data import load_experiment
from kistexp.report.html import render_experiment
from kistexp.rollout.dryrun import dry_run
from kistexp.safeio import write_atomic

PLAN = "plans/kist-run-interval-2020.toml"
FAULT = "stage=1:relay_cpu_utilization=+50%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="experiments/kist-run-interval-2020", help="experiment with the predictions")
    ap.add_argument("--out", default="docs/img/report.png", help="PNG to write")
    ap.add_argument("--html", default=None, help="also keep the report here")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--height", type=int, default=2600)
    args = ap.parse_args()
    plan = load_plan(PLAN)
    with tempfile.TemporaryDirectory(prefix="kistexp-report-shot-") as tmp:
        exp = Path(tmp) / "exp"
        # a copy: the report shows the predictions beside the run, and the dry run rewrites the journal
        shutil.copytree(args.dir, exp, ignore=shutil.ignore_patterns("*.html", "run.lock"))
        t0 = time.perf_counter()
        result = dry_run(plan, exp, injections=[FAULT])
        t1 = time.perf_counter()
        html = render_experiment(load_experiment(exp))
        t2 = time.perf_counter()
        page = Path(args.html) if args.html else Path(tmp) / "report.html"
        write_atomic(page, html.encode("utf-8"), "the report")
        shot = render(page, Path(tmp) / "shot.png", width=args.width, height=args.height)
        if shot.console:
            print("console messages:", *shot.console, sep="\n  ", file=sys.stderr)
            return 1
        # a palette PNG: the page is mostly flat colour, so this keeps docs/img small
        Image.open(shot.screenshot).convert("RGB").quantize(colors=128).save(args.out, optimize=True)
    figures = html.count('src="data:image/')
    print(f"dry run: {result.status} in {t1 - t0:.1f} s; report {len(html) / 1e6:.2f} MB, "
          f"{figures} figures, rendered in {t2 - t1:.1f} s")
    print(f"screenshot: {args.out} ({Path(args.out).stat().st_size / 1e3:.0f} kB)")
    if args.html:
        print(f"report: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
