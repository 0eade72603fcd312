"""`kistexp run --authorities fake` as a person or a script sees it: the event feed, --json-lines, the
exporter, notifications, and a clean end on SIGTERM and Ctrl-C (exit code, one line, the run's row closed,
the exporter's port free). Real subprocesses against fake authorities on loopback, one plan hour per 4 s."""

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.plan_helpers import short_plan
from tests.rollout.test_rollout_notify import Receiver
from tests.rollout_helpers import RELAY_CPU_CRITERION, write_predictions

pytestmark = pytest.mark.slow

PLAN = short_plan("watched", {"two": 2}, RELAY_CPU_CRITERION)


class Run:
    """``kistexp run`` in a subprocess, its stdout read line by line as it comes."""

    def __init__(self, tmp_path: Path, *extra: str, effects: dict | None = None) -> None:
        plan = tmp_path / "plan.toml"
        plan.write_text(PLAN)
        preds = tmp_path / "preds"
        write_predictions(preds, effects or {"baseline": {}, "two": {}}).close()
        self.exp = tmp_path / "exp"
        env = dict(os.environ, PYTHONPATH=str(Path.cwd()), OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kistexp", "run", str(plan), "--dir", str(self.exp), "--authorities", "fake",
             "--interval", "4", "--metrics", "predicted", "--predictions", str(preds), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, check, timeout_s: float = 90.0) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if check(line):
                return line
        self.stop()
        raise AssertionError(f"not seen in {timeout_s} s; got:\n" + "\n".join(self.seen))

    def signal(self, sig: int, timeout_s: float = 60.0) -> tuple[int, str]:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout_s)
        return rc, self.proc.stderr.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def runs(self) -> list[tuple]:
        db = sqlite3.connect(f"file:{self.exp / 'experiment.db'}?mode=ro", uri=True)
        try:
            return db.execute("SELECT id, end_us, reason FROM rollout_runs ORDER BY id").fetchall()
        finally:
            db.close()


class SlowEngine:
    """Steps at once in the caller's thread, then takes 1 s per step on the scheduler's pool threads."""

    def __init__(self) -> None:
        from kistexp.rollout.state import Status

        self.status = Status(state="MEASURING")
        self.steps = 0

    def step(self, now) -> int:
        self.steps += 1
        if self.steps > 1:
            time.sleep(1.0)
        return 0

    def next_wakeup(self, now):
        import datetime as dt

        return now + dt.timedelta(milliseconds=50)

    def clock_jump(self, now, jump_s) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_run_interrupted_while_a_step_runs_on_a_pool_thread_stops_without_deadlock():
    # the live driver's scheduler shutdown waits for the step under way, which re-arms the wakeup when it
    # ends: the step must finish and find the run done before shutdown takes the job store lock
    from kistexp.clock import RealClock
    from kistexp.rollout.drivers import LiveDriver

    engine = SlowEngine()
    driver = LiveDriver(engine, RealClock(), poll_s=0.2)
    outcome = []

    def run() -> None:
        try:
            driver.run(timeout_s=0.4)  # times out while the second step sleeps: the interrupt's path
        except TimeoutError as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive(), "the driver deadlocked in its scheduler's shutdown"
    assert outcome and engine.steps >= 2
    steps = engine.steps
    time.sleep(0.6)
    assert engine.steps == steps  # nothing steps or re-arms once the run is over


def test_sigterm_ends_the_run_cleanly_with_one_line_its_row_closed_and_its_port_free(tmp_path):
    receiver = Receiver()
    run = Run(tmp_path, "--metrics-port", "0", "--notify-url", receiver.url)
    try:
        line = run.wait_for(lambda s: s.startswith("metrics of this rollout at "), 60)
        url = line.removeprefix("metrics of this rollout at ")
        run.wait_for(lambda s: "baseline started: KISTSchedRunInterval=10" in s)
        metrics = httpx.get(url, timeout=5).text  # served while the run goes on
        assert "kistexp_rollout_up 1.0" in metrics and "kistexp_rollout_run_active 1.0" in metrics
        t = time.monotonic()
        rc, err = run.signal(signal.SIGTERM)
        assert time.monotonic() - t < 30
    finally:
        run.stop()
        receiver.close()
    assert rc == 143
    (only,) = err.strip().splitlines()
    assert only.startswith("kistexp: stopped by SIGTERM; the journal keeps the run's place: rerun `kistexp run")
    ((_, end_us, reason),) = run.runs()
    assert end_us is not None and reason == "stopped"
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=2)
    ends = [json.loads(b) for _, b in receiver.bodies if json.loads(b)["kind"] == "end"]
    assert [e["stopped_by"] for e in ends] == ["SIGTERM"]


def test_a_rollback_is_fed_as_json_lines_notified_and_reminded_then_ctrl_c_stops_it(tmp_path):
    got = tmp_path / "notified.jsonl"
    hook = f"import sys; open({str(got)!r}, 'a').write(sys.stdin.read() + chr(10))"
    # relay CPU 50 % higher in stage 1 than in the baseline: a FAIL, then a step back to the baseline
    run = Run(tmp_path, "--json-lines", "--remind-every", "1", "--notify-command",
              f"{sys.executable} -c {json.dumps(hook)}",
              effects={"baseline": {}, "two": {"relay_cpu_utilization": 0.5}})
    try:
        run.wait_for(lambda s: json.loads(s)["kind"] == "reminder", 150)
        rc, err = run.signal(signal.SIGINT)
    finally:
        run.stop()
    events = [json.loads(s) for s in run.seen]
    kinds = [e["kind"] for e in events]
    fail = next(e for e in events if e["kind"] == "look" and e["outcome"] == "fail")
    assert fail["criterion"] == "relay CPU" and fail["effect"] > 1.25
    rollback = next(e for e in events if e["kind"] == "rollback")
    assert rollback["rollback_kind"] == "step-back" and rollback["authorities_must_act"]
    pause = next(e for e in events if e["kind"] == "pause")
    assert pause["reasons"] == ["stepped-back"] and pause["resolve_with"][0].startswith("kistexp promote ")
    assert kinds.index("look") < kinds.index("rollback") < kinds.index("pause") < kinds.index("reminder")
    reminder = events[kinds.index("reminder")]
    assert reminder["text"].startswith("paused since ") and "(stepped-back)" in reminder["text"]
    assert "resolve with: kistexp promote" in reminder["text"]
    assert rc == 130
    (only,) = err.strip().splitlines()
    assert only.startswith("kistexp: stopped by Ctrl-C")
    assert all(r[1] is not None for r in run.runs())
    notified = [json.loads(line) for line in got.read_text().splitlines() if line.strip()]
    assert {"look", "rollback", "pause", "end"} <= {n["kind"] for n in notified}
    assert not any(n["kind"] == "reminder" for n in notified)
