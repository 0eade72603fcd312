"""A pre-imported parent that forks live runs for the crash test (tests/rollout/test_rollout_crash.py).

Importing numpy, scipy, the judge, httpx and the fake authorities takes a second or two of CPU; paid
for every restart it would leave the run down most of the time between kills. This process imports
them once, before any thread exists, and forks one child per run: each child is a whole
``live_run`` (its own journal connection, fake authorities, scheduler threads), killed by the test
with a real SIGKILL. Protocol, one JSON object per line on stdin/stdout:

    {"op": "run", "plan": P, "exp": E, "interval": 4, "log": L, "hook": "after_act", "hook_at": 1}
        -> {"pid": N}          (the hook, optional, makes the child SIGKILL itself at that crash point)
    {"op": "wait", "pid": N}   -> {"pid": N, "status": 0 | exit code | -signal}
    {"op": "poll", "pid": N}   -> the same without waiting; "status": null while it runs
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS thread pool to lose in a fork

import fake_authorities  # noqa: E402,F401  (imported here so each child starts warm)
import fake_authorities.network  # noqa: E402,F401
import kistexp.directory  # noqa: E402,F401
import kistexp.rollout.actuators  # noqa: E402,F401
import kistexp.rollout.drivers  # noqa: E402,F401
import kistexp.rollout.dryrun  # noqa: E402,F401
import kistexp.rollout.engine  # noqa: E402,F401
from kistexp.rollout.runs import live_run  # noqa: E402


def child(req: dict) -> None:
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == req.get("hook"):
            seen["n"] += 1
            if seen["n"] >= int(req.get("hook_at", 1)):
                print(f"kill at hook {name}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    code = 1
    try:
        st = live_run(Path(req["plan"]), Path(req["exp"]), "fake", interval_s=int(req["interval"]),
                      key_bits=(1024, 1024), timeout_s=req.get("timeout_s"), hook=hook, metrics="predicted")
        print(f"final state {st.state} {st.describe()}", flush=True)
        code = 0 if st.state == "COMPLETED" else 3
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "run":
            if threading.active_count() != 1:
                raise SystemExit("threads running in the zygote: a fork would lose them")
            pid = os.fork()
            if pid == 0:
                child(req)
            reply = {"pid": pid}
        elif req["op"] in ("wait", "poll"):
            done, status = os.waitpid(int(req["pid"]), 0 if req["op"] == "wait" else os.WNOHANG)
            reply = {"pid": req["pid"], "status": os.waitstatus_to_exitcode(status) if done else None}
        else:
            break
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
