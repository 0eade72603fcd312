"""The consensus value in effect for a sample, from the consensus history and tor's
fetch timing: samples taken while a change propagates are counted for neither value."""

from __future__ import annotations

import datetime as dt

import pytest

from kistexp.dirauth.propagation import NodeClass
from kistexp.expdir import ExperimentDir
from kistexp.metrics import importer
from kistexp.metrics.in_effect import InEffect
from kistexp.metrics.store import ConsensusRecord, MetricStore

UTC = dt.timezone.utc
DAY = dt.datetime(2026, 3, 1, tzinfo=UTC)


def at(h, m=0):
    return DAY + dt.timedelta(hours=h, minutes=m)


def history(hours=range(0, 11), skip=()):
    # KISTSchedRunInterval 2 until the 04:00 consensus, 3 from 05:00 on
    return [ConsensusRecord(at(h), "ns", f"{h:040X}", 10, 9, 9, True, "x",
                            {"KISTSchedRunInterval": 2 if h < 5 else 3}) for h in hours if h not in skip]


def test_relays_and_clients_adopt_at_their_own_pace():
    relays = InEffect(history(), "KISTSchedRunInterval", NodeClass.CACHE)
    clients = InEffect(history(), "KISTSchedRunInterval", NodeClass.CLIENT)
    # caches all hold the 05:00 consensus 33 min after it is published
    assert [relays.at(at(4, 59)), relays.at(at(5, 20)), relays.at(at(5, 40))] == [2, None, 3]
    # clients take up to about 1 h 52 min
    assert [clients.at(at(5, 30)), clients.at(at(6, 50)), clients.at(at(7, 0))] == [None, None, 3]
    assert clients.at(at(4, 30)) == 2


def test_gaps_and_edges_are_unknown():
    relays = InEffect(history(skip=(8,)), "KISTSchedRunInterval", NodeClass.CACHE)
    assert relays.at(at(7, 50)) == 3
    assert relays.at(at(8, 30)) is None  # the 08:00 consensus is missing
    assert relays.at(at(9, 10)) is None  # the window reaches back into the gap
    assert relays.at(at(10, 40)) == 3
    assert relays.at(at(11, 0)) is None  # after the last known consensus
    assert relays.at(at(0, 10)) is None  # before the history is long enough to be sure


def test_absent_key_is_the_default():
    recs = [ConsensusRecord(at(h), "ns", "D" * 40, 1, 9, 9, True, "x", {}) for h in range(3)]
    assert InEffect(recs, "KISTSchedRunInterval", NodeClass.CACHE, default=2).at(at(2, 0)) == 2


def test_import_assigns_value_in_effect(tmp_path):
    exp = ExperimentDir.create(tmp_path / "exp")
    store = MetricStore(exp.db)
    report = tmp_path / "op.csv"
    rows = [(4, 40), (5, 10), (5, 50), (6, 0)]
    report.write_text("relay_fingerprint,window_start_utc,window_end_utc,cpu_pct_core_mean\n" + "".join(
        f"{'A' * 40},{at(h, m).strftime('%Y-%m-%dT%H:%M:%SZ')},{at(h, m + 5).strftime('%Y-%m-%dT%H:%M:%SZ')},50\n"
        for h, m in rows))
    opts = importer.ImportOptions(param_name="KISTSchedRunInterval")
    with pytest.raises(importer.SourceKindError, match="holds no consensuses"):
        importer.import_source(store, str(report), opts=opts)
    for c in history():
        store.save_consensus(c)
    importer.import_source(store, str(report), opts=opts)
    got = store.select("relay_cpu_utilization")
    assert [s.param_value for s in got] == [2, None, 3, 3]
    assert len(store.select("relay_cpu_utilization", param_value=2)) == 1
    assert len(store.select("relay_cpu_utilization", param_value=3)) == 2
