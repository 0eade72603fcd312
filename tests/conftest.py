"""Shared fixtures: the real data under ../shared/data (read in place, never copied)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# `make test` runs two pytest workers: each searches its own port range for local tor networks,
# so two networks started at the same instant cannot both pick the first free one
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdecimal():
    os.environ.setdefault("KISTEXP_LOCALNET_BASE_PORT", str(15000 + 6000 * int(_WORKER[2:])))
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `make test`'s two workers, when the collected tests import the simulator, worker gw0
    compiles its lean kernel and gw1 the one that keeps raw delays, side by side before their first
    test. Otherwise one worker meets both in turn in its tests (one to two minutes each on a slow
    machine) while the other compiles one of them again. From numba's cache this is a second."""
    if not (_WORKER.startswith("gw") and _WORKER[2:].isdecimal()) or "kistexp.sim" not in sys.modules:
        return
    from kistexp.sim import warm_up

    warm_up(keep_raw_delays=int(_WORKER[2:]) % 2 == 1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"{SHARED_DATA} is missing: the tests read the real data from ../shared/data")
    return SHARED_DATA


@pytest.fixture(scope="session")
def consensus_path(shared_data: Path) -> Path:
    return shared_data / "consensus-2022-11-19-10-00-00"


@pytest.fixture(scope="session")
def microdesc_consensus_path(shared_data: Path) -> Path:
    return shared_data / "microdesc-consensus-2022-11-19"


@pytest.fixture(scope="session")
def certs_path(shared_data: Path) -> Path:
    return shared_data / "cached-certs"


def have_real_tor() -> bool:
    return shutil.which("tor") is not None and shutil.which("tor-gencert") is not None


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``address`` right now (the OS's pick, released)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class RawServer:
    """A loopback TCP server for hostile-server tests: it reads each accepted connection's request,
    then ``handler(server, conn)`` does whatever the server under test does (hang, drip, flood, lie),
    sending with ``server.send`` (which counts the bytes in ``sent``) and waiting on ``server.stop``."""

    def __init__(self, handler) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.handler, self.stop = handler, threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            conn.recv(65536)
            self.handler(self, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="session")
def onionperf_hk5(shared_data: Path) -> Path:
    return shared_data / "onionperf" / "2021-01-01.op-hk5.onionperf.analysis.json.xz"


@pytest.fixture(scope="session")
def onionperf_hk6a(shared_data: Path) -> Path:
    return shared_data / "onionperf" / "2021-06-01.op-hk6a.onionperf.analysis.json.xz"


@pytest.fixture(scope="session")
def tgen_analysis(shared_data: Path) -> Path:
    return shared_data / "tgen.analysis.json.xz"


@pytest.fixture(autouse=True)
def _no_terminal_width_from_the_environment(monkeypatch):
    """Output is laid out for $COLUMNS when it is set (kistexp.output): a test that checks printed text
    must not depend on the width of the terminal it was started from, or on a COLUMNS another test or
    a parent process left in the environment. Tests that want a width set it themselves."""
    if "COLUMNS" in os.environ:
        with open(os.environ.get("KISTEXP_COLUMNS_TRACE", os.devnull), "a") as trace:
            trace.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')} COLUMNS={os.environ['COLUMNS']}\n")
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
