"""Notifications of a run: a command and/or an HTTP POST per event that needs a person (docs/watching.md).

``kistexp run ... --notify-command CMD --notify-url URL`` hands each feed event marked ``notify``
(a pause, a criterion's FAIL, a rollback, a consensus outage) and the run's end to a worker thread,
so a slow receiver never delays the run or its feed. Each delivery is bounded: the command gets
``command_timeout_s`` (then its whole process group is killed), the POST ``url_timeout_s`` per
attempt and ``attempts`` attempts. A delivery that fails is one warning line, never the run's end.

The command runs without a shell (its words split as a POSIX shell would, with ``shlex``); who wants a
shell writes ``sh -c '...'``. It gets the event as JSON on stdin and in ``KISTEXP_EVENT``.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import attrs

from kistexp.errors import KistexpError

COMMAND_TIMEOUT_S = 10.0
URL_TIMEOUT_S = 5.0
ATTEMPTS = 3
QUEUE_LIMIT = 256  # events waiting; past it the oldest waiting is dropped (with a warning)
DRAIN_S = 20.0  # at the end: how long the last notifications may take before they are given up


class NotifyError(KistexpError):
    """A notification option that cannot work (checked before the run starts)."""


def parse_command(text: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise NotifyError(f"--notify-command {text!r}: {exc}") from None
    if not argv:
        raise NotifyError("--notify-command: empty command")
    return argv


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise NotifyError(f"--notify-url {url!r}: not an http:// or https:// URL")
    return url


def _json(obj: object) -> str:
    from kistexp.output import _default

    return json.dumps(obj, default=_default, sort_keys=True)


@attrs.frozen
class Delivery:
    """What one attempt to notify gave: ``ok`` or a one-line ``problem``."""

    target: str
    ok: bool
    problem: str = ""


def run_command(argv: tuple[str, ...], payload: str, timeout_s: float = COMMAND_TIMEOUT_S) -> Delivery:
    """Run ``argv`` with the event on stdin and in KISTEXP_EVENT; at most ``timeout_s``. The command
    gets its own process group, so a hung command and whatever it started are killed together, and
    its output goes to a file rather than a pipe a left-behind child could hold open."""
    name = argv[0]
    env = dict(os.environ, KISTEXP_EVENT=payload)
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                    start_new_session=True)
        except OSError as exc:
            return Delivery(name, False, f"cannot run {name!r}: {exc.strerror or exc}")
        try:
            try:
                proc.stdin.write(payload.encode())
                proc.stdin.close()
            except OSError:
                pass  # a command that does not read stdin still has KISTEXP_EVENT
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Delivery(name, False, f"{name!r} did not finish within {timeout_s:g} s; killed")
        if code != 0:
            err.seek(0)
            lines = err.read(4096).decode("utf-8", "replace").strip().splitlines()
            last = f": {lines[-1]}" if lines else ""
            how = f"killed by signal {-code}" if code < 0 else f"exited {code}"
            return Delivery(name, False, f"{name!r} {how}{last}")
    return Delivery(name, True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def post(url: str, payload: str, timeout_s: float = URL_TIMEOUT_S, attempts: int = ATTEMPTS,
         sleep: Callable[[float], None] = time.sleep) -> Delivery:
    """POST the event as JSON; retried on a connection failure, a timeout, 429 and 5xx answers,
    after 0.5 s, 1 s, ... A 4xx answer is the receiver refusing it: not retried."""
    import httpcore
    import httpx

    from kistexp.metrics.collectors.httpfetch import DeadlineTransport

    problem = ""
    # httpx's timeout bounds each socket operation; the deadline transport bounds the whole attempt, so a
    # receiver that trickles its answer cannot hold the engine's notification past timeout_s
    transport = DeadlineTransport()
    with httpx.Client(transport=transport, timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
        for attempt in range(max(1, attempts)):
            if attempt:
                sleep(0.5 * 2 ** (attempt - 1))
            transport.backend.set_deadline(time.monotonic() + timeout_s)
            try:
                r = client.post(url, content=payload.encode(), headers={"Content-Type": "application/json"})
            except (httpx.HTTPError, httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if r.status_code < 300:
                return Delivery(url, True)
            problem = f"HTTP {r.status_code}"
            if r.status_code != 429 and r.status_code < 500:
                break
    return Delivery(url, False, f"{url}: {problem} (after {attempt + 1} attempt{'s' if attempt else ''})")


class Notifier:
    """Delivers events on a worker thread; ``close()`` waits a bounded time for what is queued."""

    def __init__(self, command: str | None = None, url: str | None = None, *,
                 warn: Callable[[str], None] = lambda _m: None, command_timeout_s: float = COMMAND_TIMEOUT_S,
                 url_timeout_s: float = URL_TIMEOUT_S, attempts: int = ATTEMPTS) -> None:
        self.argv = parse_command(command) if command is not None else None
        self.url = check_url(url) if url is not None else None
        self.warn = warn
        self.command_timeout_s, self.url_timeout_s, self.attempts = command_timeout_s, url_timeout_s, attempts
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._deadline: float | None = None  # set by close(): past it what is still queued is given up
        self.dropped = 0
        self.delivered: list[Delivery] = []  # every delivery's outcome, for the caller and tests

    @property
    def active(self) -> bool:
        return self.argv is not None or self.url is not None

    def start(self) -> Notifier:
        if self.active and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="kistexp-notify", daemon=True)
            self._thread.start()
        return self

    def submit(self, event: dict) -> None:
        if not self.active:
            return
        if self._queue.qsize() >= QUEUE_LIMIT:
            try:
                dropped = self._queue.get_nowait()
                self.warn(f"notification dropped (too many waiting): {dropped.get('text', '')}")
            except queue.Empty:
                pass
        self._queue.put(event)

    def deliver(self, event: dict) -> list[Delivery]:
        payload = _json(event)
        out = []
        if self.argv is not None:
            out.append(run_command(self.argv, payload, self.command_timeout_s))
        if self.url is not None:
            out.append(post(self.url, payload, self.url_timeout_s, self.attempts))
        for d in out:
            if not d.ok:
                self.warn(f"notification not delivered: {d.problem}")
        self.delivered.extend(out)
        return out

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                if self._deadline is not None and time.monotonic() > self._deadline:
                    self.dropped += 1
                    continue
                self.deliver(event)
            except Exception as exc:  # a receiver's oddity must not end the thread; the run goes on
                self.warn(f"notification failed: {exc}")
            finally:
                self._queue.task_done()

    def _one_delivery_s(self) -> float:
        """The longest one event can take: the command's bound, then every POST attempt and backoff."""
        command = self.command_timeout_s + 5 if self.argv is not None else 0.0
        url = self.attempts * self.url_timeout_s + 0.5 * 2 ** self.attempts if self.url is not None else 0.0
        return command + url

    def close(self, wait_s: float = DRAIN_S) -> None:
        """Deliver what is queued within ``wait_s`` (what is still waiting then is given up, in one
        warning), let the delivery under way finish within its own bounds, and stop the thread."""
        if self._thread is None:
            return
        self._deadline = time.monotonic() + wait_s
        self._queue.put(None)
        self._thread.join(wait_s + self._one_delivery_s())
        if self.dropped:
            self.warn(f"gave up {self.dropped} notification{'s' if self.dropped != 1 else ''} not sent "
                      f"within {wait_s:g} s of the end")
        self._thread = None
