"""`show`, `lint`, `status`, `simulate` and `sweep` on an 80-column terminal (issue 33, point 4): every line
fits, no date is broken from its time or cut in two, and no name is cut to a prefix ("client…") that two
names share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plan_helpers import VALID_PLAN
from rollout_helpers import KIST_EFFECTS, KIST_PLAN, STEP_BACK, write_predictions

REPO = Path(__file__).resolve().parents[2]
_BOX = " │┃║|"
_DATE = re.compile(r"^(?:\d{4}-)?\d{2}-\d{2}$")
_TIME = re.compile(r"^\d{2}:\d{2}")
_CUT_DATE = re.compile(r"^\d{4}-(?:\d{0,2}-?\d?)?$")


def _run(*argv: str, cwd: Path = REPO) -> str:
    env = dict(os.environ, COLUMNS="80")
    proc = subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.stdout


def _tokens(line: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group().strip(_BOX)) for m in re.finditer(r"[^\s│┃║]+", line)]


def split_dates(text: str) -> list[str]:
    """Dates cut in two or broken from their time across lines."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        tokens = _tokens(line)
        for k, (at, token) in enumerate(tokens):
            if _CUT_DATE.match(token) and not _DATE.match(token):
                found.append(f"line {i + 1}: {token!r} is a cut date")
            if not _DATE.match(token) or (k + 1 < len(tokens) and _TIME.match(tokens[k + 1][1])):
                continue
            below = _tokens(lines[i + 1]) if i + 1 < len(lines) else []
            last = k == len(tokens) - 1
            if any(_TIME.match(t) and (b == at or (last and j == 0)) for j, (b, t) in enumerate(below)):
                found.append(f"line {i + 1}: {token!r} is broken from its time")
    return found


def check_80(text: str, names: tuple[str, ...] = ()) -> None:
    assert text.strip(), "no output"
    long = [line for line in text.splitlines() if len(line) > 80]
    assert not long, long
    assert split_dates(text) == []
    # nothing is cut with an ellipsis, so no two names show as the same prefix
    cut = re.findall(r"\S*…", text)
    assert not cut, cut
    for name in names:
        assert name in text, f"{name!r} is not shown whole"


def test_the_checks_catch_what_they_look_for():
    assert split_dates("start 2027-03-01\n    12:00 UTC") == ["line 1: '2027-03-01' is broken from its time"]
    assert split_dates("│ 03-01 │ x │\n│ 12:00 │   │") == ["line 1: '03-01' is broken from its time"]
    assert split_dates("│ 2027-03- │\n│ 01 12:00 │") == ["line 1: '2027-03-' is a cut date"]
    assert split_dates("start 2027-03-01 12:00 UTC\nnext 12:00") == []
    with pytest.raises(AssertionError):
        check_80("client_ttlb_1… 2\nclient_ttlb_5… 3")
    with pytest.raises(AssertionError):
        check_80("x" * 81)


def test_show():
    out = _run("show", KIST_PLAN)
    check_80(out, ("2ms", "5ms", "back-to-10ms", "KISTSchedRunInterval=10", "03-29 12:00", "04-12 12:00",
                   "03-29 13:51", "2027-02-22 12:00"))


def test_lint(tmp_path):
    # repeated findings over stages and criteria, a date-time in a message, a long file path
    short = VALID_PLAN.replace('duration = "14d"', 'duration = "2h"')
    criterion = short[short.index("[[criteria]]"):]
    plan = tmp_path / "a-plan-with-a-rather-long-file-name-for-an-80-column-terminal.toml"
    plan.write_text(short + "\n" + criterion + 'name = "bulk again"\n')
    out = _run("lint", *sorted(str(p) for p in (REPO / "plans").glob("*.toml")), str(plan),
               "--now", "2031-01-01T00:00:00Z")
    check_80(out, ("KX106", "KX201", "KX501", "2030-01-07 12:00", "2031-01-01 00:00"))
    # stages 'two' and 'eight', both criteria: one finding; one more for the bundled 2020 plan's stages
    assert out.count("KX201") == 2
    assert "stages 'two' (2h), 'eight' (2h): criteria" in " ".join(out.split())


def test_status(tmp_path):
    write_predictions(tmp_path / "pred", KIST_EFFECTS)
    _run("dry-run", KIST_PLAN, "--dir", str(tmp_path / "run"), "--predictions", str(tmp_path / "pred"),
         "--inject", STEP_BACK)
    out = _run("status", str(tmp_path / "run"))
    check_80(out, ("relay CPU", "downloads", "inconclusive", "2027-03-01 16:00 UTC"))


def test_simulate(tmp_path):
    write_predictions(tmp_path / "exp", KIST_EFFECTS)
    out = _run("simulate", KIST_PLAN, "--dir", str(tmp_path / "exp"), "--stored")
    check_80(out, ("client_ttlb_50kib_s", "client_ttlb_1mib_s", "client_ttlb_5mib_s",
                   "client_throughput_mbytes_per_s", "quiet_circuit_latency_ms", "back-to-10ms", "-5.0 %"))


@pytest.mark.slow
def test_sweep(tmp_path):
    from tests.sweep.test_sweep import TINY

    sweep = tmp_path / "tiny.toml"
    sweep.write_text(TINY)
    out = _run("sweep", str(sweep), "--workers", "1", "--out", str(tmp_path / "out"), "--cache",
               str(tmp_path / "cache"), "--no-plots")
    check_80(out, ("KISTSchedRunInterval", "recommended for", "mix=bundled"))
    assert re.search(r"[+-]\d+\.\d \.\. [+-]\d+\.\d %", out)  # a range on one line, with its unit
