"""The fidelity history (issue 33 point 7): the bundled CSV of every measured run, its summaries, the
current standing docs/fidelity.md shows, `kistexp fidelity --history` and `--plot`, `--record`, and a
one-line error for every file it cannot read."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kistexp.commands.fidelity as fidelity_cmd
from kistexp.cli import app
from kistexp.errors import FidelityHistoryError
from kistexp.fidelity import Case, RealSide, Report, Row, SimSide
from kistexp.fidelity import history as fh
from kistexp.localnet.schedlog import RunStats

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "fidelity.md"

# Each run's summary line as its table in docs/fidelity.md printed it ("simulator within 25 % of real
# tor: N of M compared cases"); the four runs without that line (two markdown tables of one circuit
# under KIST, the 12:31 equal-load table, the 2026-11-30 ceiling run's "4 of 7 cases") by the rule
# the harness applies to their rows.
DOC_COUNTS = {
    "2026-11-30T14:10Z": (3, 3), "2026-11-30T14:24Z": (4, 7), "2026-12-01T09:06Z": (17, 25),
    "2026-12-01T12:31Z": (4, 8), "2026-12-01T13:02Z": (0, 2), "2026-12-01T17:30Z": (20, 25),
    "2026-12-01T23:05Z": (17, 24), "2026-12-01T23:39Z": (20, 24), "2026-12-02T06:10Z": (19, 25),
    "2026-12-02T09:02Z": (24, 27), "2026-12-02T12:54Z": (23, 27), "2026-12-02T15:09Z": (23, 25),
    "2026-12-02T17:12Z": (24, 25), "2026-12-03T00:23Z": (25, 25), "2026-12-03T05:57Z": (24, 25),
    "2026-12-03T15:56Z": (15, 25), "2026-12-03T16:20Z": (1, 6), "2026-12-03T16:42Z": (18, 23),
    "2026-12-03T17:13Z": (20, 25), "2026-12-03T19:04Z": (20, 24), "2026-12-04T01:54Z": (19, 24),
    "2026-12-04T10:44Z": (24, 27), "2026-12-04T13:06Z": (30, 30), "2026-12-04T13:48Z": (29, 29),
    "2026-12-04T14:00Z": (27, 28),
}


@pytest.fixture(scope="module")
def bundled() -> fh.History:
    return fh.load()


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kistexp", *argv], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)


def test_the_bundled_history_holds_every_run_of_the_measurements(bundled):
    assert bundled.source == str(REPO / "kistexp" / "data" / "fidelity-history.csv")
    assert bundled.run_ids() == tuple(sorted(DOC_COUNTS))
    assert len(bundled.rows) == 631
    counts = {s.run_id: (s.within, s.compared) for s in bundled.summaries()}
    assert counts == DOC_COUNTS
    eighth = {s.run_id: s for s in bundled.summaries() if s.machine == "eighth machine"}
    assert sorted(eighth) == ["2026-12-04T13:06Z", "2026-12-04T13:48Z", "2026-12-04T14:00Z"]
    first = eighth["2026-12-04T13:06Z"]
    assert (first.cases, first.compared, first.within, first.outside) == (30, 30, 30, ())
    assert (first.tor_version, first.cores, first.repetitions, first.seeds) == ("0.4.9.11", 2, 5, 20)
    assert first.sim_model == "2026-12-03 06:30 UTC" and first.complete
    # a row as that run's table printed it: 9.75 (9.1-10.4) real, 9.76 sim, 1.00, run period 4.0 / 4.1,
    # cells per run 91.0 / 85.9, load 0.4, nothing stolen, the tors waited 6.2 % for a core
    (row,) = [r for r in bundled.run("2026-12-04T13:06Z") if r.label == "circuit/kist/2ms"]
    assert (row.real_mbytes_per_s, row.real_min_mbytes_per_s, row.real_max_mbytes_per_s) == (9.75, 9.1, 10.4)
    assert (row.sim_mbytes_per_s, round(row.sim_over_real, 2), row.compared) == (9.76, 1.0, True)
    assert (row.real_run_period_ms, row.sim_run_period_ms, row.real_cells_per_run, row.sim_cells_per_run) == (
        4.0, 4.1, 91.0, 85.9)
    assert (row.load_1min, row.stolen_pct, row.core_wait_pct) == (0.4, 0.0, 6.2)


def test_ratios_are_the_means_ratios_and_cpu_bound_rows_are_not_compared(bundled):
    for row in bundled.rows:
        assert row.sim_over_real == pytest.approx(row.sim_mbytes_per_s / row.real_mbytes_per_s, abs=1e-4)
        # the tables printed the range to 0.1 MB/s: 7.51 (7.5-7.5)
        assert row.real_min_mbytes_per_s - 0.05 <= row.real_mbytes_per_s <= row.real_max_mbytes_per_s + 0.05
        assert row.compared == (row.note == ""), row
    # the 2026-11-30 run's Vanilla circuit needed 7 cores for the simulator's figure: reported, not compared
    (vanilla,) = [r for r in bundled.run("2026-11-30T14:24Z") if r.label == "circuit/vanilla/2ms"]
    assert not vanilla.compared and vanilla.within_target is None and round(vanilla.sim_over_real, 2) == 8.02


def _doc_standing_table() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## How close the simulator is today\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| `")]


def test_the_current_standing_is_the_latest_complete_run_and_the_docs_table(bundled):
    current = bundled.current()
    assert current.run_id == "2026-12-04T14:00Z" and current.machine == "eighth machine"
    assert (current.within, current.compared, current.outside) == (27, 28, ("client-10ms/kist/2ms",))
    rows = bundled.run(current.run_id)
    table = _doc_standing_table()
    assert len(table) == len(rows) == 30
    names = {"KIST": "kist", "KISTLite": "kistlite", "Vanilla": "vanilla"}
    earlier = tuple({r.case: r for r in bundled.run(run)} for run in ("2026-12-04T13:06Z", "2026-12-04T13:48Z"))
    for cells, row in zip(table, rows, strict=True):
        scenario, scheduler, interval, real, sim, ratio, before = cells
        assert (scenario.strip("`"), names[scheduler]) == (row.scenario, row.scheduler)
        assert interval.startswith(f"{row.interval_ms} ms")
        assert real == (f"{row.real_mbytes_per_s:.2f} ({row.real_min_mbytes_per_s:.1f}-"
                        f"{row.real_max_mbytes_per_s:.1f})")
        assert float(sim) == row.sim_mbytes_per_s
        value, mark = re.fullmatch(r"([\d.]+)([x*]?)", ratio).groups()
        # the doc prints the run's own ratio; the history's is that of the printed means, within 0.01 of it
        assert abs(float(value) - row.sim_over_real) <= 0.011
        assert mark == {True: "", False: "x", None: "*"}[row.within_target]
        for text, run in zip(before.split(" / "), earlier, strict=True):
            assert abs(float(text.rstrip("x*")) - run[row.case].sim_over_real) <= 0.011
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert "**27 of 28 compared rows within 25 % of real tor" in text
    assert "gave 30 of 30 (377 of 377 orders) and 29 of 29" in text


def test_history_json_without_tor(bundled):
    result = CliRunner().invoke(app, ["fidelity", "--history", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["source"] == bundled.source and out["plot"] is None
    assert [r["run_id"] for r in out["runs"]] == list(bundled.run_ids())
    by_id = {r["run_id"]: r for r in out["runs"]}
    assert (by_id["2026-12-04T13:06Z"]["within"], by_id["2026-12-04T13:06Z"]["compared"]) == (30, 30)
    current = out["current"]
    assert current["run_id"] == "2026-12-04T14:00Z" and (current["within"], current["compared"]) == (27, 28)
    assert current["measured_utc"] == "2026-12-04T14:00Z" and current["tor_version"] == "0.4.9.11"
    assert len(current["rows"]) == 30
    (row,) = [r for r in current["rows"] if r["scenario"] == "client-10ms" and r["scheduler"] == "kist"]
    assert (row["client_interval_ms"], row["real_mbytes_per_s"], row["sim_mbytes_per_s"]) == (10, 6.82, 9.12)
    assert row["within_25pct"] is False


def test_history_fits_80_columns():
    from tests.cli.test_cli_80_columns import check_80

    proc = _run("fidelity", "--history", env=dict(os.environ, COLUMNS="80"))
    assert proc.returncode == 0, proc.stderr
    check_80(proc.stdout, ("2026-12-04 14:00", "2-core test", "eighth", "client-10ms", "2 ms (client 10)",
                           "27 of 28", "30 of 30"))


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_plot_writes_a_figure(tmp_path, suffix):
    out = tmp_path / f"history.{suffix}"
    result = CliRunner().invoke(app, ["fidelity", "--history", "--plot", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["plot"] == str(out)
    data = out.read_bytes()
    assert len(data) > 10_000
    if suffix == "png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        assert b"<svg" in data[:2000] and b"within 25 %" in data
    with pytest.raises(FidelityHistoryError, match=r"history\.pdf: a plot is written as \.png or \.svg"):
        fh.plot(fh.load(), tmp_path / "history.pdf")


def _header() -> str:
    return ",".join(fh.COLUMNS)


def _corrupt(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_corrupt_history_is_one_line_naming_file_line_and_column(tmp_path):
    bundled_lines = (REPO / "kistexp" / "data" / "fidelity-history.csv").read_text().splitlines()
    header, first, second = bundled_lines[0], bundled_lines[1], bundled_lines[2]
    missing = _corrupt(tmp_path, "missing.csv", header.replace(",sim_over_real", "") + "\n")
    not_a_number = _corrupt(tmp_path, "nan.csv", "\n".join([header, first, second.replace(",8.5,", ",ten,")]))
    for path, expected in (
            (missing, f"{missing}: line 1: column 'sim_over_real' is missing"),
            (not_a_number, f"{not_a_number}: line 3: column 'sim_mbytes_per_s': 'ten' is not a number")):
        proc = _run("fidelity", "--history", "--history-file", str(path))
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"kistexp: error: {expected}"), line
        assert proc.stdout == ""


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h, rows: h + ",extra\n" + "\n".join(r + "," for r in rows), "line 1: unknown column 'extra'"),
    (lambda h, rows: h + "\n" + rows[0] + "\n" + rows[0], "line 3: run 2026-11-30T14:10Z: case circuit/kist/2ms "
                                                          "again (first on line 2)"),
    (lambda h, rows: h + "\n" + rows[0] + "\n" + rows[1].replace(",3,1,", ",3,2,"),
     "line 3: run 2026-11-30T14:10Z: column 'seeds' differs from line 2"),
    (lambda h, rows: h + "\n" + rows[0].replace("2026-11-30T14:10Z,", "2026-11-30 14:10,", 2),
     "line 2: column 'measured_utc': '2026-11-30 14:10' is not a UTC time"),
    (lambda h, rows: h + "\n" + rows[0].replace(",true,", ",yes,"), "line 2: column 'compared': 'yes' is not true or"),
    (lambda h, rows: h + "\n" + rows[0].replace(",10.87,", ",nan,"), "line 2: column 'sim_mbytes_per_s': 'nan' is "
                                                                     "not a finite number"),
    (lambda h, rows: h + "\n" + rows[0].replace(",kist,", ",fifo,"), "line 2: column 'scheduler': 'fifo' is not one"),
    (lambda h, rows: h + "\n" + rows[0] + ",", "line 2: 31 cells, but the header names 30 columns"),
    (lambda h, rows: "", "empty file"),
])
def test_parse_refuses_what_it_cannot_trust(edit, message):
    lines = (REPO / "kistexp" / "data" / "fidelity-history.csv").read_text().splitlines()
    with pytest.raises(FidelityHistoryError) as info:
        fh.parse(edit(lines[0], lines[1:3]), "h.csv")
    assert str(info.value).startswith("h.csv: ") and message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_parse_takes_a_spreadsheets_bom_blank_lines_and_a_subset_of_columns():
    text = "\ufeffrun_id,measured_utc,scenario,scheduler,interval_ms,real_mbytes_per_s,sim_mbytes_per_s," \
           "sim_over_real,compared\n\nr1,2027-01-02T03:04:05Z,circuit,kist,2,8,9,1.125,true\n"
    history = fh.parse(text, "mine.csv")
    (row,) = history.rows
    assert row.measured_utc == dt.datetime(2027, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert row.within_target and row.client_interval == 2 and row.machine == "" and row.cores is None
    assert history.current().run_id == "r1" and not history.current().complete


def _report() -> Report:
    stats = RunStats(100, 8, 90, 4.0, 4.1, 80.0, 82.0, 5760)
    fast = Row(Case("circuit", "kist", 2), RealSide((8.0, 9.0, 10.0), 0.3, stats, 0.6, 0.02, load_1min=0.5,
                                                    stolen_fractions=(0.0, 0.01, 0.02),
                                                    core_wait_fractions=(0.05, 0.05, 0.05)),
               SimSide((9.5, 10.5), 4.1, 85.0))
    slow = Row(Case("client-10ms", "kist", 2), RealSide((5.0, 7.0), 0.2, None, 0.4, 0.02),
               SimSide((9.0,), 4.1, 85.0))
    busy = Row(Case("ceiling", "vanilla", 2), RealSide((60.0, 70.0), 0.95, None, 1.8, 0.03), SimSide((80.0,)))
    no_real = Row(Case("circuit", "kist", 10), None, SimSide((3.5,)))
    return Report((fast, slow, busy, no_real), 3, 20.0, seeds=2)


def test_record_round_trips_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setattr(fidelity_cmd, "run_fidelity", lambda *a, **k: _report())
    monkeypatch.setattr(fh, "installed_tor_version", lambda: "0.4.9.11")
    path = tmp_path / "mine.csv"
    result = CliRunner().invoke(app, ["fidelity", "--record", str(path), "--machine", "laptop", "--json"])
    assert result.exit_code == 0, result.output
    recorded = json.loads(result.output)["recorded"]
    assert recorded["file"] == str(path) and recorded["rows"] == 3
    history = fh.load(path)
    assert history.run_ids() == (recorded["run_id"],)
    fast, slow, busy = history.rows
    assert (fast.machine, fast.tor_version, fast.cores, fast.mode) == ("laptop", "0.4.9.11", os.cpu_count(), "rounds")
    assert (fast.repetitions, fast.seeds, fast.sim_model) == (3, 2, "kistexp 0.1.0")
    assert (fast.real_mbytes_per_s, fast.real_min_mbytes_per_s, fast.real_max_mbytes_per_s) == (9.0, 8.0, 10.0)
    assert (fast.sim_mbytes_per_s, fast.sim_over_real, fast.compared) == (10.0, pytest.approx(1.1111, abs=1e-4), True)
    assert (fast.real_run_period_ms, fast.real_cells_per_run, fast.sim_cells_per_run) == (4.0, 80.0, 85.0)
    assert (fast.stolen_pct, fast.core_wait_pct, fast.load_1min) == (1.0, 5.0, 0.5)
    assert slow.client_interval_ms == 10 and slow.within_target is False  # 9 against 6: 1.5
    assert not busy.compared and busy.note.startswith("CPU-bound on this machine")
    summary = history.current()
    assert (summary.within, summary.compared, summary.outside) == (1, 2, ("client-10ms/kist/2ms",))
    # read back by --history
    shown = CliRunner().invoke(app, ["fidelity", "--history", "--history-file", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["current"]["run_id"] == recorded["run_id"]
    # a second run is appended, the lines already there kept as they were; the same run twice is refused
    before = path.read_text()
    later = [fh.HistoryRow(**{**_fields(r), "run_id": "later", "measured_utc": r.measured_utc + dt.timedelta(hours=1)})
             for r in history.rows]
    fh.record(path, later)
    assert path.read_text().startswith(before) and fh.load(path).run_ids() == (recorded["run_id"], "later")
    assert fh.load(path).current().run_id == "later"
    with pytest.raises(FidelityHistoryError, match="run later is already recorded"):
        fh.record(path, later)


def _fields(row: fh.HistoryRow) -> dict:
    import attrs

    return attrs.asdict(row)


def test_record_is_checked_before_the_run(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(fidelity_cmd, "run_fidelity", lambda *a, **k: ran.append(1) or _report())
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,history\n")
    result = CliRunner().invoke(app, ["fidelity", "--record", str(bad)])
    assert isinstance(result.exception, FidelityHistoryError) and "unknown column 'not'" in str(result.exception)
    result = CliRunner().invoke(app, ["fidelity", "--record", str(tmp_path / "nowhere" / "h.csv")])
    assert isinstance(result.exception, FidelityHistoryError) and "no directory" in str(result.exception)
    result = CliRunner().invoke(app, ["fidelity", "--record", str(tmp_path / "h.csv"), "--no-real"])
    assert isinstance(result.exception, FidelityHistoryError) and "--no-real" in str(result.exception)
    assert ran == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--history", "--scenarios", "circuit"], "--scenarios does not go with it"),
    (["--history", "--record", "x.csv"], "--record does not go with it"),
    (["--plot", "x.png"], "--plot goes with --history"),
    (["--history-file", "x.csv"], "--history-file goes with --history"),
    (["--machine", "laptop"], "it goes with --record"),
])
def test_history_options_go_together(argv, message):
    result = CliRunner().invoke(app, ["fidelity", *argv])
    assert isinstance(result.exception, FidelityHistoryError), result.output
    assert message in str(result.exception)
