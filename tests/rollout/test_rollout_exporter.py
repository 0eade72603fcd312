"""The Prometheus exporter of a rollout (kistexp.rollout.exporter), scraped over loopback and parsed with
prometheus_client's own parser."""

import socket
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kistexp.rollout.exporter import Exporter, ExporterError
from tests.rollout_helpers import FIVE_DOWN, STEP_BACK, dry_run_kist


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    path = tmp_path_factory.mktemp("rb") / "exp"
    dry_run_kist(path, [STEP_BACK])
    return path


@pytest.fixture(scope="module")
def five_down(tmp_path_factory):
    path = tmp_path_factory.mktemp("down") / "exp"
    dry_run_kist(path, [f"authority={a}:down@day4" for a in FIVE_DOWN])
    return path


def scrape(url: str) -> dict:
    r = httpx.get(url, timeout=5)
    assert r.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, metric: str, **labels) -> float:
    return samples[(metric, tuple(sorted(labels.items())))]


def scrape_exporter(exp) -> dict:
    """One scrape of an exporter started on experiment directory ``exp`` and closed after."""
    ex = Exporter(exp, 0)
    try:
        return scrape(ex.url)
    finally:
        ex.close()


def test_a_scrape_reads_state_verdicts_intents_and_consensus_from_the_journal(rolled_back):
    m = scrape_exporter(rolled_back)
    assert value(m, "kistexp_rollout_up") == 1
    assert value(m, "kistexp_rollout_state", state="PAUSED") == 1
    assert value(m, "kistexp_rollout_state", state="MEASURING") == 0
    assert value(m, "kistexp_rollout_pause_reason", reason="stepped-back") == 1
    assert value(m, "kistexp_rollout_stage", name="baseline") == 0
    # relay CPU failed in stage 1: ratio about 1.7 against the 1.25 limit (the judge's scale)
    assert value(m, "kistexp_rollout_criterion_verdict", criterion="relay CPU", outcome="fail") == 1
    assert value(m, "kistexp_rollout_criterion_effect", criterion="relay CPU") == pytest.approx(1.7, abs=0.1)
    assert value(m, "kistexp_rollout_criterion_effect_low", criterion="relay CPU") > 1.25
    assert value(m, "kistexp_rollout_criterion_limit", criterion="relay CPU") == 1.25
    assert value(m, "kistexp_rollout_intents", state="done") == 12  # six participants, there and back
    assert value(m, "kistexp_rollout_consensus_param", param="KISTSchedRunInterval") == 10
    assert value(m, "kistexp_rollout_consensus_signers") == 9
    assert value(m, "kistexp_rollout_authority_voted", authority="moria1") == 1
    assert value(m, "kistexp_rollout_rounds_without_majority_consensus") == 0
    assert value(m, "kistexp_rollout_run_active") == 0
    # its own registry: none of the process's or the global registry's metrics
    assert not any(name.startswith(("process_", "python_")) for name, _ in m)


def test_an_outage_shows_as_authorities_down_and_rounds_without_a_majority(five_down):
    m = scrape_exporter(five_down)
    assert value(m, "kistexp_rollout_authority_voted", authority="dizum") == 0
    assert value(m, "kistexp_rollout_authority_voted", authority="bastet") == 1
    # nine rounds while stage 1 waited at least; every round since day 4 where the engine records each round
    assert value(m, "kistexp_rollout_rounds_without_majority_consensus") in (9, 104)
    assert value(m, "kistexp_rollout_consensus_outages_total") == 1
    assert value(m, "kistexp_rollout_pause_reason", reason="not-in-consensus") == 1


def test_a_directory_without_a_journal_scrapes_as_down(tmp_path):
    assert scrape_exporter(tmp_path) == {("kistexp_rollout_up", ()): 0}


def test_a_port_in_use_is_one_line_and_close_frees_the_port_and_its_thread(rolled_back):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ExporterError, match=rf"--metrics-port {port}: 127.0.0.1:{port} is already in use"):
            Exporter(rolled_back, port)
    with pytest.raises(ExporterError, match="--metrics-address"):
        Exporter(rolled_back, 0, "no-such-host.invalid")
    before = set(threading.enumerate())
    ex = Exporter(rolled_back, 0)
    port = ex.port
    ex.close()
    ex.close()  # twice is harmless
    assert set(threading.enumerate()) <= before
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # free again
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
