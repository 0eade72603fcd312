"""Notifications (kistexp.rollout.notify): a command and an HTTP POST per event, bounded, failures as
warnings. Against a loopback HTTP server and small commands."""

import http.server
import json
import socket
import sys
import threading
import time

import pytest

from kistexp.rollout.notify import Notifier, NotifyError, parse_command, post, run_command

EVENT = {"kind": "pause", "text": "PAUSED (gate) at stage 1 (2ms)", "at": "2027-03-01T12:00:00Z"}


class Receiver:
    """A loopback HTTP server that records each POST and answers with the next queued status."""

    def __init__(self, statuses=()):
        self.bodies, self.statuses = [], list(statuses)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.bodies.append((self.headers.get("Content-Type"), body))
                code = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_event_is_posted_as_json(receiver):
    d = post(receiver.url, json.dumps(EVENT))
    assert d.ok
    ((ctype, body),) = receiver.bodies
    assert ctype == "application/json" and json.loads(body) == EVENT


def test_a_failing_receiver_is_retried_then_a_warning_and_a_refusal_is_not_retried():
    r = Receiver(statuses=[503, 502, 200])
    try:
        assert post(r.url, "{}", sleep=lambda _s: None).ok and len(r.bodies) == 3
        r.statuses = [503, 503, 503]
        d = post(r.url, "{}", attempts=3, sleep=lambda _s: None)
        assert not d.ok and d.problem.endswith("HTTP 503 (after 3 attempts)")
        r.bodies.clear()
        r.statuses = [404]
        d = post(r.url, "{}", sleep=lambda _s: None)
        assert not d.ok and "HTTP 404 (after 1 attempt)" in d.problem and len(r.bodies) == 1
    finally:
        r.close()


def test_an_unreachable_url_is_a_warning_in_bounded_time():
    url = f"http://127.0.0.1:{free_port()}/nobody"
    warnings = []
    n = Notifier(url=url, warn=warnings.append, attempts=2).start()
    t = time.monotonic()
    n.submit(EVENT)
    n.close(wait_s=10)
    assert time.monotonic() - t < 10
    (w,) = warnings
    assert w.startswith(f"notification not delivered: {url}: ConnectError") and "(after 2 attempts)" in w


def test_the_command_gets_the_event_on_stdin_and_in_the_environment(tmp_path):
    out = tmp_path / "got.json"
    script = ("import json, os, sys; json.dump({'stdin': json.load(sys.stdin), "
              f"'env': json.loads(os.environ['KISTEXP_EVENT'])}}, open({str(out)!r}, 'w'))")
    warnings = []
    n = Notifier(command=f"{sys.executable} -c {json.dumps(script)}", warn=warnings.append).start()
    n.submit(EVENT)
    n.close()
    assert warnings == []
    got = json.loads(out.read_text())
    assert got["stdin"] == EVENT and got["env"] == EVENT


def test_no_shell_unless_asked_for(tmp_path):
    # the words are split as a shell would, but nothing is expanded: `$HOME` reaches the command as is
    out = tmp_path / "argv.json"
    argv = parse_command(f"{sys.executable} -c 'import json,sys; json.dump(sys.argv[1:], open(\"{out}\", \"w\"))' "
                         "'$HOME' '*'")
    assert run_command(argv, "{}").ok
    assert json.loads(out.read_text()) == ["$HOME", "*"]


def test_a_hung_failing_or_missing_command_is_a_warning_never_an_error(tmp_path):
    t = time.monotonic()
    hung = run_command((sys.executable, "-c", "import time; time.sleep(60)"), "{}", timeout_s=0.5)
    assert not hung.ok and "did not finish within 0.5 s; killed" in hung.problem
    assert time.monotonic() - t < 10
    failing = run_command((sys.executable, "-c", "import sys; print('no route to pager', file=sys.stderr); "
                                                 "sys.exit(3)"), "{}")
    assert not failing.ok and failing.problem.endswith("exited 3: no route to pager")
    missing = run_command((str(tmp_path / "no-such-command"),), "{}")
    assert not missing.ok and "cannot run" in missing.problem
    # a command whose child holds its output open past the timeout does not hang the run either
    t = time.monotonic()
    orphan = run_command(("sh", "-c", "sleep 60 & sleep 60"), "{}", timeout_s=0.5)
    assert not orphan.ok and time.monotonic() - t < 10


def test_bad_options_are_refused_before_anything_runs():
    with pytest.raises(NotifyError, match="not an http"):
        Notifier(url="ftp://example.org/x")
    with pytest.raises(NotifyError, match="No closing quotation"):
        Notifier(command="notify 'unterminated")
    with pytest.raises(NotifyError, match="empty command"):
        Notifier(command="   ")


def test_close_leaves_no_thread_and_gives_up_what_cannot_be_sent_in_time(tmp_path):
    warnings = []
    n = Notifier(command=f"{sys.executable} -c 'import time; time.sleep(0.3)'", warn=warnings.append).start()
    for _ in range(20):
        n.submit(EVENT)
    t = time.monotonic()
    n.close(wait_s=0.5)
    assert time.monotonic() - t < 5
    assert not [th for th in threading.enumerate() if th.name == "kistexp-notify"]
    assert n.dropped > 0 and any(w.startswith(f"gave up {n.dropped} notification") for w in warnings)


class _Trickler:
    """A server that accepts, reads the request and answers one byte every 0.2 s without end: every socket
    operation succeeds in time, only a deadline on the whole request stops a client."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn) -> None:
        with conn:
            try:
                conn.recv(65536)
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                    if self.stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(0.2)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_a_receiver_trickling_its_answer_is_cut_at_the_total_timeout():
    server = _Trickler()
    try:
        t = time.monotonic()
        delivery = post(f"http://127.0.0.1:{server.port}/hook", '{"event": 1}', timeout_s=1.0, attempts=1)
        assert time.monotonic() - t < 4.0  # httpx's per-read timeout alone would wait for ever
        assert not delivery.ok and "Timeout" in delivery.problem
    finally:
        server.close()


def test_the_operator_api_call_is_cut_at_its_total_timeout(monkeypatch):
    from kistexp.clock import RealClock
    from kistexp.rollout import actuators

    monkeypatch.setattr(actuators, "CALL_TIMEOUT_S", 1.0)
    server = _Trickler()
    try:
        act = actuators.FakeAuthoritiesActuator(f"http://127.0.0.1:{server.port}", "token", None, RealClock())
        t = time.monotonic()
        assert act.current("moria1") is None  # an authority not answering in time has no known params
        assert time.monotonic() - t < 4.0
    finally:
        server.close()
