"""Every number pair the announcement prints adds up: for each relay class and stage, "baseline A; stage B
(X %)" has B / A - 1 = X within the rounding of the printed digits, and A and X are what the predictions
say (A the median over networks of each network's median, X the median over networks of each network's
own change). The synthetic networks differ in level and in effect, so that the median of the stage's
medians is not the baseline times the change: printing it beside the change made pairs like
"0.26 -> 0.31 (+3.6 %)"."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.expdir import ExperimentDir
from kistexp.metrics.store import MetricStore
from tests.rollout_helpers import KIST_PLAN, write_predictions

STAGES = ("2ms", "5ms", "back-to-10ms")
MEDIANS = {"relay_cpu_utilization": 0.0026, "relay_rss_bytes": 61.5e6, "relay_bandwidth_bytes_per_s": 2.4e6,
           "client_ttlb_1mib_s": 2.5}
EFFECTS = {"baseline": {},
           "2ms": {"relay_cpu_utilization": 0.12, "relay_rss_bytes": -0.004, "relay_bandwidth_bytes_per_s": 0.03},
           "5ms": {"relay_cpu_utilization": 0.05, "relay_rss_bytes": -0.002, "relay_bandwidth_bytes_per_s": 0.01},
           "back-to-10ms": {"relay_cpu_utilization": 0.001}}
CLASSES = ("all", "exit", "KIST HZ=250", "exit linux HZ=250 >100 Mbit/s")
# three networks far apart in level, each with its own effect (as sampled networks are)
LEVELS_BY_NET = (1.0, 1.19, 0.93)
EFFECT_SCALES = (0.3, 1.0, 2.6)
# printed unit and factor from the catalogue's unit
UNITS = {"relay_cpu_utilization": ("% of one core", 100.0), "relay_rss_bytes": ("MB", 1e-6),
         "relay_bandwidth_bytes_per_s": ("MB/s", 1e-6)}
PCT = re.compile(r"[+-]?\d[\d.,]*\s?%")


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    path = tmp_path_factory.mktemp("announce-numbers") / "exp"
    write_predictions(path, EFFECTS, networks=3, medians=MEDIANS, classes=CLASSES, levels=LEVELS_BY_NET,
                      effect_scales=EFFECT_SCALES).close()
    return path


@pytest.fixture(scope="module")
def expected(exp):
    """(metric, class) -> {"baseline": A, stage: (X, median of the stage's medians)} from the stored rows."""
    with ExperimentDir.open(exp) as e:
        rows = MetricStore(e.db).load_predictions()
    med: dict[tuple[str, str, str], dict[int, float]] = {}
    for p in rows:
        if p.quantile == 0.5:
            med.setdefault((p.metric, p.relay_class, p.stage), {})[p.network] = p.value
    out: dict[tuple[str, str], dict] = {}
    for metric, (_unit, scale) in UNITS.items():
        for cls in CLASSES:
            base = med[(metric, cls, "baseline")]
            entry = {"baseline": float(np.median(list(base.values()))) * scale}
            for stage in STAGES:
                per = med[(metric, cls, stage)]
                change = float(np.median([per[n] / base[n] - 1 for n in base]))
                entry[stage] = (change, float(np.median(list(per.values()))) * scale)
            out[(metric, cls)] = entry
    return out


def _render(exp, fmt: str) -> str:
    result = CliRunner().invoke(app, ["announce", KIST_PLAN, "--dir", str(exp), "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.stdout


def _num(text: str) -> tuple[float, float, float]:
    """A printed number and the interval it was rounded from (3 significant digits, or whole numbers
    from 1,000)."""
    value = float(text.replace(",", ""))
    if value == 0:
        return 0.0, 0.0, 0.0
    half = 0.5 if abs(value) >= 1000 else 0.5 * 10 ** (math.floor(math.log10(abs(value))) - 2)
    return value, value - half, value + half


def _pct(text: str) -> float:
    m = re.fullmatch(r"([+-]\d+\.\d) %", text)
    assert m, f"not a relative change: {text!r}"
    return float(m.group(1)) / 100


def _text_pairs(out: str) -> list[tuple[str, str, str, list[tuple[str, str, str]]]]:
    """(metric, unit, class, baseline, [(stage, value, change)]) from the text announcement."""
    pairs, metric, unit = [], None, None
    for line in out.splitlines():
        head = re.fullmatch(r"  (relay_\w+) \((.+)\):", line)
        if head:
            metric, unit = head.groups()
            continue
        row = re.fullmatch(r"    (\S.*?)\s+baseline (\S+)((?:; \S+ \S+ \([^)]*\))+)", line)
        if row:
            cls, base, rest = row.groups()
            cells = re.findall(r"; (\S+) (\S+) \(([^)]*)\)", rest)
            pairs.append((metric, unit, cls, base, cells))
    return pairs


def _markdown_pairs(out: str):
    pairs, metric, unit, stages = [], None, None, []
    for line in out.splitlines():
        if line.startswith("#"):
            metric = None  # the next section
        head = re.fullmatch(r"\*\*(relay_\w+)\*\* \((.+)\)", line)
        if head:
            metric, unit = head.groups()
            continue
        if line.startswith("| relay class | baseline |"):
            stages = [c.strip() for c in line.strip("|").split("|")[2:]]
            continue
        if metric and line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) != len(stages) + 2:
                continue
            got = [re.fullmatch(r"(\S+) \((.*)\)", c).groups() for c in cells[2:]]
            pairs.append((metric, unit, cells[0], cells[1], [(s, v, x) for s, (v, x) in zip(stages, got, strict=True)]))
    return pairs


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_every_printed_pair_adds_up(exp, expected, fmt):
    out = _render(exp, fmt)
    pairs = (_text_pairs if fmt == "text" else _markdown_pairs)(out)
    # every relay cost, every class, every stage: nothing skipped by the parser
    assert {(m, c) for m, _u, c, _b, _s in pairs} == set(expected)
    checked = 0
    for metric, unit, cls, base_text, cells in pairs:
        assert unit == UNITS[metric][0]
        want = expected[(metric, cls)]
        a, a_lo, a_hi = _num(base_text)
        assert a_lo <= want["baseline"] <= a_hi, (metric, cls, base_text, want["baseline"])
        assert [s for s, _v, _x in cells] == list(STAGES)
        for stage, value_text, change_text in cells:
            x = _pct(change_text)
            change, _stage_median = want[stage]
            # the change is the predictions' (median over networks of each network's change) ...
            assert change_text == f"{100 * change:+.1f} %", (metric, cls, stage)
            # ... and the value printed before it is the baseline times it: B / A - 1 = X to the printed digits
            _b, b_lo, b_hi = _num(value_text)
            assert b_lo / a_hi - 1 - 0.0005 <= x <= b_hi / a_lo - 1 + 0.0005, (metric, cls, stage, base_text,
                                                                              value_text, change_text)
            checked += 1
    assert checked == len(expected) * len(STAGES)
    # every relative change printed is one of the pairs checked; the other % are the unit and the worked example
    prose = re.sub(r"\s+", " ", out)
    assert len(re.findall(r"\(([+-]\d+\.\d %)\)", prose)) == checked
    rest = re.sub(r"\(([+-]\d+\.\d %)\)", "", prose)
    assert sorted(set(PCT.findall(rest))) == ["+10 %", "100 %"]
    assert "(+10 % = 1.1 times the baseline)" in rest and "100 % of one core is one core kept busy" in rest


def test_the_networks_make_the_test_meaningful(expected):
    """The median of the stages' medians is not the baseline times the change here (by more than the
    printed digits): printing it, as the announcement did, fails the test above."""
    gaps = [abs(stage_median / e["baseline"] - 1 - change)
            for (metric, _cls), e in expected.items() if metric == "relay_cpu_utilization"
            for stage, (change, stage_median) in ((s, e[s]) for s in STAGES)]
    assert max(gaps) > 0.05


def test_cpu_in_percent_of_one_core(exp, expected):
    """A relay at 0.0026 of a core (the catalogue's fraction) is announced at 0.26 % of one core."""
    out = _render(exp, "text")
    line = next(ln for ln in out.splitlines() if ln.startswith("    all ") and "0.26" in ln)
    assert line.split()[2] == "0.26;"
    assert "relay_cpu_utilization (% of one core):" in out
    assert expected[("relay_cpu_utilization", "all")]["baseline"] == pytest.approx(0.26, rel=0.02)
