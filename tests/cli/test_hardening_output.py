"""Text from plans and inputs is shown, never acted on (issue 34, point 5).

A plan whose stage names, notes, owner, contact, description and criterion name carry escape sequences
(CSI, OSC 8 hyperlinks, BEL, C1), a bidi override, pipes, newlines, ``<script>`` and spreadsheet formulas,
and predictions whose relay class does too, go through every command that prints them, the Markdown and
text announcements, both HTML reports, the sweep and fidelity-history exports and the metrics tables.
Property tests feed arbitrary text to each neutraliser of kistexp.textsafe and arbitrary plan names to the
announcement's and the plan report's renderers."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import html
import io
import re
import unicodedata
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from plan_helpers import short_plan
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.metrics.series import Prediction
from kistexp.plan.loader import load_plan, parse_plan
from kistexp.population.predict import summarize_predictions
from kistexp.report import announce
from kistexp.report import html as report_html
from kistexp.report.data import PlanData, plan_stage_names
from kistexp.textsafe import FORMULA_STARTS, csv_cell, csv_row, markdown, one_line, visible
from tests.rollout_helpers import LEVELS, RELAY_CPU_CRITERION, curve, write_predictions

# an OSC 8 hyperlink, BEL, a screen clear, a C1 CSI, a bidi override, a pipe, a newline, live HTML, formulas
HOSTILE = ("\x1b]8;;http://evil.example/\x07link\x1b]8;;\x07 \x1b[2J\x9b31m\u202e|a\n<script>alert(1)</script> "
           '=HYPERLINK("http://evil.example") @SUM(1)')
STAGE_A = "@SUM(1) " + HOSTILE
STAGE_B = '=HYPERLINK("x")|b\n-c'
CRITERION = "+cmd|" + HOSTILE
RELAY_CLASS = "=cls|<b>\x1b[31m\u202e"
# what a terminal, a mail or a page must never receive raw: controls (but the line break), format and
# separator characters, surrogates, private use
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
MD = MarkdownIt("commonmark", {"html": True}).enable("table")


def hidden(text: str, allowed: str = "\n") -> set[str]:
    return {ch for ch in text if ch not in allowed and unicodedata.category(ch) in _HIDDEN}


def toml_str(text: str) -> str:
    """``text`` as a TOML basic string, every character a plan can hold."""
    def one(ch: str) -> str:
        if ch in '"\\' or not ch.isprintable():
            return f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
        return ch
    return '"' + "".join(one(ch) for ch in text) + '"'


def hostile_plan_text() -> str:
    criterion = RELAY_CPU_CRITERION.replace('name = "relay CPU"', f"name = {toml_str(CRITERION)}")
    text = short_plan("hostile", {"A": 2, "B": 5}, criterion)
    for placeholder, name in (("A", STAGE_A), ("B", STAGE_B)):
        text = text.replace(f'name = "{placeholder}"', f"name = {toml_str(name)}\nnote = {toml_str(HOSTILE)}", 1)
    return (text.replace('owner = "network-team"', f"owner = {toml_str('@SUM(1) ' + HOSTILE)}")
            .replace('contact = "ops@example.org"', f"contact = {toml_str('<ops@example.org> ' + HOSTILE)}")
            .replace('description = "test"', f"description = {toml_str('=1+1 ' + HOSTILE)}"))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """(plan path, experiment directory): predictions under the hostile names, a dry run's journal in
    which the criterion failed and stepped back, and an operator command queued by a hostile user."""
    from kistexp.rollout.dryrun import dry_run

    root = tmp_path_factory.mktemp("hostile")
    plan_path = root / "hostile.toml"
    plan_path.write_text(hostile_plan_text())
    exp = root / "exp"
    write_predictions(exp, {"baseline": {}, STAGE_A: {"relay_cpu_utilization": 0.5}, STAGE_B: {}},
                      classes=("middle", RELAY_CLASS)).close()
    dry_run(load_plan(str(plan_path)), exp)
    queued = CliRunner().invoke(app, ["pause", str(exp)], env={"USER": "mallory" + HOSTILE})
    assert queued.exit_code == 0, queued.output
    assert not hidden(queued.output)
    return plan_path, exp


def _cli(*argv: str, codes=(0,)) -> str:
    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code in codes, (argv, result.output, result.exception)
    assert "Traceback" not in result.output
    return result.output


# --- the terminal ---------------------------------------------------------------------------------------


def test_every_command_prints_names_as_text(hostile, tmp_path):
    plan, exp = map(str, hostile)
    outputs = {
        "lint": _cli("lint", plan, "--now", "2029-01-01T00:00:00Z", codes=(0, 1)),
        "show": _cli("show", plan),
        "status": _cli("status", exp),
        "history": _cli("history", exp),
        "rollback": _cli("rollback", exp, "--dry-run"),
        "judge": _cli("judge", plan, "--dir", exp, "--now", "2030-01-08T00:00:00Z"),
        "dry-run": _cli("dry-run", plan, "--predictions", exp, "--dir", str(tmp_path / "again")),
    }
    for command, out in outputs.items():
        assert not hidden(out), (command, hidden(out))
    # the names are there, their control characters spelled out, not dropped
    for command in ("show", "status", "history", "judge", "dry-run"):
        assert "\\x1b]8;;http://evil.example/\\x07link" in outputs[command], command
    assert "\\u202e" in outputs["show"] and "\\x9b31m" in outputs["dry-run"]
    assert "by mallory\\x1b]8;;" in outputs["history"]  # the command's user, from $USER


def test_metrics_tables_and_warnings_print_sources_and_labels_as_text(tmp_path):
    from kistexp.expdir import ExperimentDir
    from kistexp.metrics.series import Sample
    from kistexp.metrics.store import MetricStore

    with ExperimentDir.open_or_create(tmp_path / "exp") as exp:
        store = MetricStore(exp.db)
        source = store.record_source("onionperf", "[bold]" + HOSTILE, n_samples=1)
        store.add_samples("relay_cpu_utilization", [Sample(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), 0.5,
                                                           {"relay": HOSTILE, "note": "[red]x"})], source_id=source)
    d = str(tmp_path / "exp")
    for out in (_cli("metrics", "list", "--dir", d),
                _cli("metrics", "show", "relay_cpu_utilization", "--dir", d, "--samples")):
        assert not hidden(out) and "\\x1b]8;;http://evil.example/" in out
    assert "[bold]" in _cli("metrics", "list", "--dir", d)  # markup printed, not applied
    # two sources that cannot be read: the first is the error, the second a warning, both one visible line
    missing = [str(tmp_path / f"missing-{i}-\x1b]0;title\x07\u202e") for i in range(2)]
    result = CliRunner().invoke(app, ["metrics", "import", *missing, "--dir", d])
    assert result.exit_code == 1 and not hidden(result.output), result.output
    assert "kistexp: warning:" in result.output and "\\x1b]0;title\\x07" in result.output


def test_sweep_lines_and_tables_print_names_as_text(tmp_path, capsys):
    from kistexp.commands.sweep import _print
    from kistexp.sweep import SweepReport
    from kistexp.sweep.results import Recommendation, RiseRow
    from kistexp.sweep.spec import parse_sweep

    path = tmp_path / "s.toml"
    path.write_text(_sweep_text(name="[bold]" + HOSTILE.replace("/", "_")))
    out = _cli("sweep", str(path), "--check")
    assert not hidden(out) and "[bold]\\x1b]8;;" in out
    spec = parse_sweep(path.read_text(), str(path))
    context = f"load=0.4 loss=0 mix={HOSTILE}"
    report = SweepReport(name=spec.name, out=str(tmp_path), cells=2, ran=2, cached=0, failed=0, outcomes=(),
                         recommendations=(Recommendation(0, "KISTSchedRunInterval", "relay_cpu_utilization",
                                                         RELAY_CLASS, 50.0, 10, context, None, None, HOSTILE),),
                         rises=(RiseRow(0, context, 2, 0.1, 0.05, 0.2, 2, False),), files=(), backend="local",
                         wall_s=1.0)
    _print(spec, report)
    out = capsys.readouterr().out
    words = " ".join(out.split())  # the table and the long line wrap at spaces
    assert not hidden(out) and "mix=\\x1b]8;;" in words and "none: \\x1b]8;;" in words


def test_progress_descriptions_are_text():
    from rich.progress import TextColumn

    from kistexp.output import progress_bar

    with progress_bar(TextColumn("{task.description}")) as bar:
        task = bar.add_task("[bold]" + HOSTILE)
        column = TextColumn("{task.description}")
        assert column.render(bar.tasks[0]).plain == visible("[bold]" + HOSTILE)
        bar.update(task, description="[/red]" + HOSTILE)  # a closing tag alone would raise MarkupError
        assert column.render(bar.tasks[0]).plain == visible("[/red]" + HOSTILE)


# --- the announcement -----------------------------------------------------------------------------------


def _tables(md: str) -> list[list[str]]:
    """Each Markdown table's lines (a run of lines starting with '|')."""
    tables, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _columns(line: str) -> int:
    """The cells of a table line: pipes not escaped by a backslash separate them."""
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line)) - 1


def _check_markdown(md: str) -> None:
    assert not hidden(md)
    assert "<" not in md  # "&" and "<" of names are entities: no tag, no autolink
    tables = _tables(md)
    assert tables
    for table in tables:
        assert len({_columns(line) for line in table}) == 1, table
    rendered = MD.render(md)  # raw HTML allowed: any that got through would be in the page
    assert "<script" not in rendered.lower() and "<b>" not in rendered
    assert rendered.count("<table>") == len(tables)  # no table lost its delimiter row


def test_markdown_announcement_keeps_its_tables_and_shows_names_literally(hostile):
    plan, exp = map(str, hostile)
    md = _cli("announce", plan, "--dir", exp, "--format", "markdown")
    _check_markdown(md)
    rendered = MD.render(md)
    # the stage's name as a reader sees it: its newline a space, its control characters spelled out
    assert one_line(STAGE_A) in html.unescape(rendered)
    assert "\\x1b]8;;http://evil.example/\\x07link" in html.unescape(rendered)


def test_text_announcement_has_no_control_characters_and_names_stay_on_their_line(hostile):
    plan, exp = map(str, hostile)
    text = _cli("announce", plan, "--dir", exp)
    assert not hidden(text)
    assert one_line(STAGE_A) in text and "|a <script>alert(1)</script>" in text
    assert '=HYPERLINK("x")|b -c' in text  # the second stage's newline did not start a line of its own


# --- the HTML reports -----------------------------------------------------------------------------------


def _check_html(page: str) -> None:
    assert "<script" not in page.lower()
    assert not hidden(page)
    uris = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]*)"', page)
    assert uris and len(uris) == page.count('src="data:')
    for uri in uris:
        svg = base64.b64decode(uri, validate=True)
        ET.fromstring(svg)  # names in titles, legends and ticks leave the SVG well-formed XML
        assert b"<script" not in svg.lower()


def test_html_reports_escape_names_and_keep_figures_well_formed(hostile, tmp_path):
    plan, exp = map(str, hostile)
    _cli("report", exp, "-o", str(tmp_path / "run.html"))
    _cli("report", plan, "--dir", exp, "-o", str(tmp_path / "plan.html"))
    for name in ("run.html", "plan.html"):
        page = (tmp_path / name).read_text()
        _check_html(page)
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, name


# --- CSV and Parquet ------------------------------------------------------------------------------------


def _sweep_text(name: str = "tiny", mix: str = "=HYPERLINK(\"x\")", relay_class: str = "@SUM(1)") -> str:
    return f"""
name = {toml_str(name)}
duration = "4s"

[values]
KISTSchedRunInterval = [2, 10]

[population]
scale = 0.005
samples = [1, 2]

[class_mixes]
{toml_str(mix)} = "bundled"

[[recommend]]
parameter = "KISTSchedRunInterval"
relay_class = {toml_str(relay_class)}
max_rise_percent = 50
baseline = 10
"""


def _assert_no_formula(cell: str) -> None:
    assert not cell.startswith(FORMULA_STARTS) or re.fullmatch(r"[+-]?[\d.]+(?:[eE][+-]?\d+)?", cell), cell


def test_sweep_exports_neutralise_formulas_and_keep_numbers(tmp_path):
    import pyarrow.parquet as pq

    from kistexp.sweep import _PartialWriter
    from kistexp.sweep.cells import CellResult, CellTask
    from kistexp.sweep.execute import CellOutcome
    from kistexp.sweep.results import recommend, tidy_rows, write_csv, write_table
    from kistexp.sweep.spec import parse_sweep

    spec = parse_sweep(_sweep_text())
    mix = spec.class_mixes[0][0]
    task = CellTask("0" * 64, 0, 0, 1, (("KISTSchedRunInterval", 2),), 0.4, 0.0, mix, 1, 4.0, 0.005, None, None)
    result = CellResult("0" * 64, (("relay_cpu_utilization", "@SUM(1)", -1.5, 2.0),
                                   ("relay_cpu_utilization", "-2+cmd", 0.25, 1e-7)), 10, 5, 1.0, 0.4, 1.0, "+host")
    outcome = CellOutcome(task, "ok", 1, "", result)
    rows = tidy_rows(spec, [outcome])
    parquet, results_csv = write_table(spec, rows, tmp_path)
    partial = _PartialWriter(spec, tmp_path / "partial.csv")
    partial.add(outcome)
    partial.close()
    write_csv(tmp_path / "cells.csv", [{"error": "=cmd|' /C calc'!A0", "host": "\t=1+1", "note": "\r@x",
                                        "wall_s": -0.5}], ["error", "host", "note", "wall_s"])
    rises, recs = recommend(spec, rows)
    write_csv(tmp_path / "recommendation.csv", [attrs.asdict(r) for r in recs], list(attrs.asdict(recs[0])))
    for path in (results_csv, tmp_path / "partial.csv", tmp_path / "cells.csv", tmp_path / "recommendation.csv"):
        for row in csv.DictReader(path.open(newline="")):
            for cell in row.values():
                _assert_no_formula(cell)
    got = list(csv.DictReader(results_csv.open(newline="")))
    assert {r["class_mix"] for r in got} == {"'=HYPERLINK(\"x\")"}
    assert [r["relay_class"] for r in got][::2] == ["'@SUM(1)", "'-2+cmd"]
    assert [r["value"] for r in got][:2] == ["-1.5", "2.0"]  # numbers stay numbers
    assert next(csv.DictReader((tmp_path / "cells.csv").open(newline="")))["wall_s"] == "-0.5"
    assert next(csv.DictReader((tmp_path / "recommendation.csv").open(newline="")))["relay_class"] == "'@SUM(1)"
    table = pq.read_table(parquet).to_pylist()
    assert table[0]["class_mix"] == "'=HYPERLINK(\"x\")" and table[0]["relay_class"] == "'@SUM(1)"
    assert table[0]["value"] == -1.5 and table[0]["KISTSchedRunInterval"] == 2


def test_fidelity_history_record_neutralises_text_cells(tmp_path):
    from kistexp.fidelity.history import HistoryRow, parse, to_csv

    row = HistoryRow(run_id="-run", measured_utc=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), scenario="=x()",
                     scheduler="kist", interval_ms=2, real_mbytes_per_s=1.5, sim_mbytes_per_s=1.2,
                     sim_over_real=0.8, compared=True, machine="@SUM(1)", note="+cmd", run_note="\t=1",
                     size_mb=1.5)
    text = to_csv([row])
    for cells in list(csv.reader(io.StringIO(text)))[1:]:
        for cell in cells:
            _assert_no_formula(cell)
    back = parse(text, "history.csv").rows[0]
    assert back.machine == "'@SUM(1)" and back.note == "'+cmd" and back.size_mb == 1.5


# --- properties -----------------------------------------------------------------------------------------

PIECES = st.sampled_from(["|", "\\", "\\|", "<script>", "</td>", "&amp;", "&#124;", "`", "*", "_", "[", "](x)",
                          "!", "#", "-", "+", "=", ">", "@", "1.", "2)", "\n", "\r", "\t", " ", "\x1b[31m",
                          "\x1b]8;;http://x/\x07", "\x07", "\x9b", "\x85", "\u2028", "\u202e", "\u200b", "~",
                          "<", "&", "http://x.y", "<a@b.c>", "    ", "---", "===", "\\\\", "\udcff", "\x00"])
TEXT = st.lists(st.text(max_size=8) | PIECES, max_size=8).map("".join)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(TEXT)
def test_visible_and_one_line_leave_no_hidden_character(text):
    assert not hidden(visible(text), allowed="")
    assert hidden(visible(text, keep="\n"), allowed="\n") == set()
    line = one_line(text)
    assert not hidden(line, allowed="") and "\n" not in line and line == line.strip()
    assert not any(ch.isspace() and ch != " " for ch in line)


@FAST
@given(TEXT, TEXT)
def test_markdown_cells_keep_the_table_and_render_back_to_their_text(a, b):
    cells = [markdown(a), markdown(b)]
    for cell in cells:
        assert "\n" not in cell and "<" not in cell and _columns(f"| {cell} |") == 1
    out = MD.render(f"| one | two |\n|---|---|\n| {cells[0]} | {cells[1]} |\n")
    shown = re.findall(r"<td>(.*?)</td>", out, re.S)
    assert [html.unescape(c) for c in shown] == [one_line(a), one_line(b)], out


@FAST
@given(TEXT)
def test_markdown_at_the_start_of_a_line_is_a_plain_paragraph(text):
    if not one_line(text):
        return
    out = MD.render(f"Thanks,\n{markdown(text)}\n")
    body = re.fullmatch(r"<p>Thanks,\n(.*)</p>\n", out, re.S)
    assert body is not None, out  # no heading, list, quote, rule, code block or HTML block
    assert html.unescape(body.group(1)) == one_line(text)


_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


@FAST
@given(TEXT | st.from_regex(_DECIMAL, fullmatch=True))
def test_csv_cells_never_start_a_formula_unless_numeric(text):
    out = csv_cell(text)
    if _DECIMAL.fullmatch(text):
        assert out == text
    else:
        assert not out.startswith(FORMULA_STARTS) and out in (text, "'" + text)
    assert csv_cell(out) == out  # written twice, it is not prefixed twice


@FAST
@given(st.integers() | st.floats() | st.none() | st.booleans())
def test_csv_numbers_and_other_values_are_unchanged(value):
    assert csv_row({"v": value})["v"] is value and csv_row([value])[0] is value


# arbitrary names through the renderers: two distinct stage names (not the reserved ones), owner, contact,
# description and a relay class
NAME = TEXT.filter(lambda s: s.strip() and s != "baseline" and not s.startswith("transition:"))
NAMES = st.tuples(st.lists(NAME, min_size=2, max_size=2, unique=True), TEXT, TEXT, TEXT,
                  TEXT.filter(lambda s: s != "middle"))
BASE_PLAN = parse_plan(short_plan("any", {"one": 2, "two": 5}, RELAY_CPU_CRITERION), "any.toml")
MEDIANS = {"relay_cpu_utilization": 0.4, "relay_rss_bytes": 6e7, "relay_bandwidth_bytes_per_s": 2e6,
           "client_ttlb_1mib_s": 2.5}


def _renamed(names):
    (first, second), owner, contact, description, relay_class = names
    plan = attrs.evolve(BASE_PLAN, owner=owner, contact=contact, description=description,
                        stages=(attrs.evolve(BASE_PLAN.stages[0], name=first, note=owner),
                                attrs.evolve(BASE_PLAN.stages[1], name=second)),
                        criteria=(attrs.evolve(BASE_PLAN.criteria[0], name=description),))
    stages = plan_stage_names(plan)
    rows = [Prediction(stage, metric, cls, net, q, v)
            for stage in ("baseline", *stages) for metric, median in MEDIANS.items()
            for cls in ([""] if metric.startswith("client") else ("middle", relay_class))
            for net in range(2) for q, v in zip(LEVELS, curve(median * (1 + 0.01 * net)), strict=True)]
    return plan, PlanData(plan, stages, tuple(summarize_predictions(rows, list(stages))), tuple(rows), Path("x"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES)
def test_announcement_renders_any_names(names):
    plan, data = _renamed(names)
    text = announce.render(plan, data, "text")
    assert not hidden(text)
    _check_markdown(announce.render(plan, data, "markdown"))


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # a name's character DejaVu Sans lacks
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES)
def test_plan_report_renders_any_names(names):
    plan, data = _renamed(names)
    _check_html(report_html.render_plan(plan, data))
