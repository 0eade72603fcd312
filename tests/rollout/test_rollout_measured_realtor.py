"""A real rollback on real tor, judged on measurements (issue 32 point 5; docs/rollouts.md "A real
rollback on real tor").

One private network of 3 directory authorities, 4 relays, 2 exits and 2 measurement clients
(Debian's tor on 127.0.0.1, 10 s voting rounds, one plan hour per round). The measurement clients
download 50 KiB, 1 MiB and 5 MiB through fresh 3-hop circuits all the time; the run judges their
1 MiB times to last byte, as OnionPerf would report them. Nothing is predicted: the experiment has
no predictions at all.

- A harmful stage, ``KISTSchedRunInterval=100`` (real tor's per-channel ceiling at 100 ms is a small
  fraction of the one at 10 ms), fails on the measured times; the engine steps back through the
  authorities' votes, the consensus carries 10 again, and the times measured after the clients and
  relays took it up are back within the criterion's bound of the baseline.
- A harmless stage (10 -> 5 ms) completes without a rollback.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import pytest
from conftest import have_real_tor

from kistexp.localnet import LocalNetwork, NetworkSpec
from kistexp.localnet.network import free_base_port
from kistexp.rollout.runs import live_run, queue_command
from tests.plan_helpers import VALID_PLAN

pytestmark = [
    pytest.mark.realtor,
    pytest.mark.slow,
    pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor and tor-gencert"),
    pytest.mark.timeout(480),
]

KIST = "KISTSchedRunInterval"
AUTHORITIES = ("auth000", "auth001", "auth002")
THRESHOLD = 0.5  # the 1 MiB time to last byte may rise at most 50 %


def plan_text(name: str, baseline_h: int, stages: tuple[tuple[str, int, int], ...]) -> str:
    custom = "".join(f'[[authorities.custom]]\nnickname = "{n}"\nv3ident = "{i:040X}"\n'
                     f'dirport = "127.0.0.1:{9 + i}"\n\n' for i, n in enumerate(AUTHORITIES, start=1))
    head, _, _ = VALID_PLAN.partition("[[stages]]")
    body = "".join(f'[[stages]]\nname = "{s}"\nduration = "{h}h"\nvalues = {{ {KIST} = {v} }}\n\n'
                   for s, h, v in stages)
    participating = ", ".join(f'"{n}"' for n in AUTHORITIES)
    return (head.replace('name = "test-plan"', f'name = "{name}"').replace('"7d"', f'"{baseline_h}h"')
            + body + f"[authorities]\nparticipating = [{participating}]\n\n" + custom
            + f"""[[criteria]]
name = "1 MiB download"
metric = "client_ttlb_1mib_s"
statistic = "median"
comparison = "relative-increase"
threshold = {THRESHOLD}
min_samples = 10
on_fail = "step-back"
""")


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    root = tmp_path_factory.mktemp("measured") / "net"
    spec = NetworkSpec(authorities=3, relays=4, exits=2, clients=2, base_port=free_base_port(11),
                       consensus_params=(((KIST, 10),),) * 3)
    net = LocalNetwork.create(root, spec)
    try:
        net.start()
        net.wait_bootstrapped(timeout_s=120)
        yield net
    finally:
        net.stop()


def _ro(exp: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{exp / 'experiment.db'}?mode=ro", uri=True, timeout=5)


def _decisions(exp: Path) -> list[str]:
    try:
        conn = _ro(exp)
        try:
            return [r[0] for r in conn.execute("SELECT decision FROM rollout_decisions ORDER BY id")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def _start(plan: Path, exp: Path, net: LocalNetwork | None, timeout_s: float) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["status"] = live_run(plan, exp, "local", localnet=None if net is None else net.root,
                                     metrics="measured", measure_period_s=1.0, timeout_s=timeout_s)
        except BaseException as exc:  # reported by the test thread
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


def _ttlb(exp: Path) -> list[tuple[float, float, int | None]]:
    """(time, 1 MiB TTLB, KISTSchedRunInterval of the consensus the client held) of every sample."""
    conn = _ro(exp)
    try:
        held = {r[0]: json.loads(r[1]) for r in conn.execute(
            "SELECT valid_after_us, params FROM rollout_consensus_seen WHERE params != 'null'")}
        rows = conn.execute("SELECT x.t_us, x.value, s.labels FROM samples x JOIN series s ON s.id = x.series_id "
                            "WHERE s.metric = 'client_ttlb_1mib_s' ORDER BY x.t_us").fetchall()
    finally:
        conn.close()
    out = []
    for t_us, value, labels in rows:
        va = json.loads(labels).get("valid_after")
        out.append((t_us / 1e6, value, va))
    return out, held


def test_a_harmful_stage_is_rolled_back_on_real_measurements(network, tmp_path):
    plan = tmp_path / "harmful.toml"
    plan.write_text(plan_text("localnet-harmful", 4, (("hundred", 6, 100), ("five", 4, 5))))
    exp = tmp_path / "exp"
    t0 = time.monotonic()
    thread, out = _start(plan, exp, network, timeout_s=330)
    # the run steps back on its own; then it keeps measuring while paused: four plan hours of that
    while "stepped-back" not in _decisions(exp):
        assert thread.is_alive(), out
        assert time.monotonic() - t0 < 260, _decisions(exp)
        time.sleep(1)
    stepped_back = time.time()
    time.sleep(45)
    queue_command(exp, "abort", {}, __import__("datetime").datetime.now(__import__("datetime").timezone.utc))
    thread.join(60)
    assert not thread.is_alive() and "error" not in out, out
    assert out["status"].state == "ABORTED"

    conn = _ro(exp)
    try:
        fail = conn.execute("SELECT effect, ci_low, ci_high, stage, detail FROM rollout_verdicts "
                            "WHERE outcome = 'fail' ORDER BY id LIMIT 1").fetchone()
        origins = {r[0] for r in conn.execute("SELECT DISTINCT origin FROM rollout_metric_batches")}
        predictions = conn.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]
        consensus = [json.loads(r[0]) for r in conn.execute(
            "SELECT params FROM rollout_consensus_seen WHERE params != 'null' ORDER BY valid_after_us")]
        kinds = [r[0] for r in conn.execute("SELECT kind FROM rollout_transitions ORDER BY seq")]
        exposure = conn.execute("SELECT COUNT(*), SUM(short) FROM rollout_exposure").fetchone()
    finally:
        conn.close()
    assert fail is not None and fail[3] == 1, "the 100 ms stage was not failed on the measurements"
    effect, lo = fail[0], fail[1]
    assert lo > 1 + THRESHOLD and effect > 1 + THRESHOLD  # the whole interval past the bound
    assert origins == {"measured"} and predictions == 0  # nothing predicted anywhere
    assert kinds[:2] == ["stage", "rollback"]
    assert consensus[-1][KIST] == 10  # the authorities' votes carried the old value back
    assert 100 in [c.get(KIST) for c in consensus]
    assert exposure[0] > 0  # exposure checked at the looks

    samples, _ = _ttlb(exp)
    plan_start = samples[0][0]
    baseline = [v for t, v, _ in samples if t < plan_start + 35]
    after = [v for t, v, _ in samples if t > stepped_back + 5]
    during = [v for t, v, va in samples if plan_start + 40 < t < stepped_back - 15]
    assert len(baseline) >= 10 and len(after) >= 10, (len(baseline), len(after))
    ratio_after = statistics.median(after) / statistics.median(baseline)
    assert ratio_after < 1 + THRESHOLD, ratio_after  # back within the criterion's bound
    print(f"measured 1 MiB TTLB: baseline median {statistics.median(baseline):.3f} s (n={len(baseline)}), "
          f"at 100 ms effect {effect:.2f} [{lo:.2f}, {fail[2]:.2f}], after the rollback "
          f"{statistics.median(after):.3f} s (n={len(after)}, x{ratio_after:.2f}); stage window n={len(during)}; "
          f"{time.monotonic() - t0:.0f} s")


def test_a_harmless_stage_completes_on_real_measurements(tmp_path):
    """Without --localnet the run makes its own measured network (authorities, relays, exits and
    measurement clients) in EXP/localnet, and stops every tor of it when it ends."""
    plan = tmp_path / "harmless.toml"
    plan.write_text(plan_text("localnet-harmless", 3, (("five", 5, 5),)))
    exp = tmp_path / "exp"
    t0 = time.monotonic()
    thread, out = _start(plan, exp, None, timeout_s=300)
    thread.join(320)
    assert not thread.is_alive() and "error" not in out, (out, _decisions(exp))
    assert out["status"].state == "COMPLETED", _decisions(exp)
    decisions = _decisions(exp)
    assert not any(d.startswith("rollback") for d in decisions)
    conn = _ro(exp)
    try:
        passed = conn.execute("SELECT COUNT(*) FROM rollout_verdicts WHERE outcome = 'pass'").fetchone()[0]
        origins = {r[0] for r in conn.execute("SELECT DISTINCT origin FROM rollout_metric_batches")}
    finally:
        conn.close()
    assert passed >= 1 and origins == {"measured"}
    own = LocalNetwork.load(exp / "localnet")
    assert len(own.by_role("client")) == 2 and len(own.by_role("exit")) == 2
    assert not any(own.is_running(n) for n in own.nodes)  # the run's own network is stopped with it
    print(f"harmless stage completed in {time.monotonic() - t0:.0f} s: {', '.join(decisions)}")
