"""`kistexp consensus fetch` (issue 33, point 1): today's consensus through the hardened directory client,
verified against the pinned identities and written whole or not at all; no authority, a forged or a
truncated consensus is one line and leaves nothing behind."""

from __future__ import annotations

import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.consensus_fetch import default_name, fetch_consensus_file
from kistexp.dirauth.authorities import authority_set
from kistexp.directory import Endpoint
from kistexp.errors import DirectoryError, KistexpError
from kistexp.output import error_line
from kistexp.population.relays import load_population

# certificates of 2022 are current at the consensus's own time, not today: the client is told that time
AT_2022 = dt.datetime(2022, 11, 19, 10, 30, tzinfo=dt.timezone.utc).timestamp()


class DirPort:
    """A loopback DirPort answering fixed bodies: the ns consensus and, for /tor/keys/fp/..., certificates."""

    def __init__(self, consensus: bytes, certs: bytes = b"") -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.requests.append(self.path)
                if self.path == "/tor/status-vote/current/consensus":
                    body = consensus
                elif self.path.startswith("/tor/keys/fp/") and certs:
                    body = certs
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def authorities(self) -> list[Endpoint]:
        """The nine authorities of November 2022, pinned by identity, all answered by this server."""
        return [Endpoint(a.nickname, "127.0.0.1", self.port, a.v3ident) for a in authority_set("tor-0.4.7.10")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dirport_for():
    servers: list[DirPort] = []

    def make(consensus: bytes, certs: bytes = b"") -> DirPort:
        servers.append(DirPort(consensus, certs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_fetch_writes_the_verified_consensus_as_served(tmp_path, dirport_for, consensus_path, certs_path):
    served = consensus_path.read_bytes()
    port = dirport_for(served, certs_path.read_bytes())
    out, certs_out = tmp_path / "today", tmp_path / "today.certs"
    saved = fetch_consensus_file(out, authorities=port.authorities(), certs_out=certs_out, clock=lambda: AT_2022,
                                 timeout_s=10)
    assert out.read_bytes() == served
    assert saved.path == str(out) and saved.flavour == "ns" and saved.relays == 6088
    assert saved.valid_after == dt.datetime(2022, 11, 19, 10, tzinfo=dt.timezone.utc)
    assert saved.signatures == "8/8 signatures valid, 5 needed (N=9)" and saved.size_bytes == len(served)
    assert any(p.startswith("/tor/keys/fp/") for p in port.requests)  # certificates came from the authority
    # what the population commands and simulate take: the file, checked against the saved certificates
    pop = load_population(out, certs=certs_out)
    assert len(pop) == 6088
    assert sorted(p.name for p in tmp_path.iterdir()) == ["today", "today.certs"]


def test_default_name_is_the_valid_after(tmp_path, dirport_for, consensus_path, certs_path):
    port = dirport_for(consensus_path.read_bytes())
    saved = fetch_consensus_file(directory=tmp_path, authorities=port.authorities(), certs=certs_path,
                                 clock=lambda: AT_2022)
    assert Path(saved.path) == tmp_path / "consensus-2022-11-19-10-00-00"
    assert Path(saved.path).read_bytes() == consensus_path.read_bytes()
    assert default_name("microdesc", saved.valid_after) == "microdesc-consensus-2022-11-19-10-00-00"


def _forged(data: bytes) -> bytes:
    out = data.replace(b" 185.220.101.33 ", b" 185.220.101.34 ", 1)
    assert out != data
    return out


@pytest.mark.parametrize(("damage", "message"), [
    (_forged, "consensus rejected: 0/8 signatures valid, 5 needed (N=9); 8 bad signature"),
    (lambda data: data[:300_000], "truncated"),
    (lambda data: b"", "does not start with network-status-version"),  # an empty 200
])
def test_forged_or_truncated_consensus_writes_nothing(tmp_path, dirport_for, consensus_path, certs_path, damage,
                                                      message):
    port = dirport_for(damage(consensus_path.read_bytes()))
    out = tmp_path / "today"
    out.write_text("the consensus fetched yesterday\n")
    with pytest.raises(KistexpError) as err:
        fetch_consensus_file(out, authorities=port.authorities(), certs=certs_path, certs_out=tmp_path / "c",
                             clock=lambda: AT_2022)
    text = str(err.value)
    assert "\n" not in error_line(err.value) and text.startswith("no authority served a valid ns consensus")
    assert message in text, text
    assert out.read_text() == "the consensus fetched yesterday\n"  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["today"]  # no certificates, no temporary file


def test_certificates_not_current_now_are_refused(tmp_path, dirport_for, consensus_path, certs_path):
    """Without the test's clock the 2022 certificates have expired: a live fetch refuses them, as tor does."""
    port = dirport_for(consensus_path.read_bytes())
    with pytest.raises(KistexpError, match="consensus rejected"):
        fetch_consensus_file(tmp_path / "today", authorities=port.authorities(), certs=certs_path)
    assert list(tmp_path.iterdir()) == []


def test_cli_no_authority_reachable_is_one_line_and_writes_nothing(tmp_path):
    ident = authority_set("current")[0].v3ident
    ports = [free_port(), free_port()]
    args = ["consensus", "fetch", "-o", str(tmp_path / "today"), "--timeout", "2"]
    for i, port in enumerate(ports):
        args += ["--authority", f"gone{i}=127.0.0.1:{port}/{ident if i == 0 else 'A' * 40}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and isinstance(result.exception, DirectoryError)
    line = error_line(result.exception)
    assert "\n" not in line and line.startswith("kistexp: error: no authority served key certificates")
    assert f"gone0 http://127.0.0.1:{ports[0]}" in line and "cannot connect" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_fetches_from_fake_authorities_on_loopback(tmp_path):
    from fake_authorities.network import FakeAuthorityNetwork, generate_keys

    net = FakeAuthorityNetwork(count=3, interval_s=3, port=0, keys=generate_keys(3, (1024, 1024)),
                               vote_delay_s=0.75, dist_delay_s=0.75, initial_params="KISTSchedRunInterval=3")
    net.start()
    try:
        net.wait_for_consensus(timeout_s=20)
        specs = [f"{a.nickname}={a.address}:{a.dirport}/{a.v3ident}" for a in net.directory_authorities()]
        out, certs_out = tmp_path / "fetched", tmp_path / "fetched.certs"
        args = ["consensus", "fetch", "--flavour", "microdesc", "-o", str(out), "--certs-out", str(certs_out),
                "--timeout", "5", "--json"]
        for spec in specs:
            args += ["--authority", spec]
        result = CliRunner().invoke(app, args)
    finally:
        net.stop()
    assert result.exit_code == 0, result.output
    saved = json.loads(result.stdout)
    assert saved["path"] == str(out) and saved["flavour"] == "microdesc"
    assert saved["signatures"].startswith("3/3 signatures valid")
    inspect = CliRunner().invoke(app, ["consensus", "inspect", str(out), "--certs", str(certs_out), "--json",
                                       *(x for spec in specs for x in ("--v3ident", _trusted(spec)))])
    assert inspect.exit_code == 0, inspect.output
    report = json.loads(inspect.stdout)
    assert report["verified"] is True and report["params"]["KISTSchedRunInterval"] == 3


def _trusted(spec: str) -> str:
    nick, rest = spec.split("=", 1)
    return f"{nick}={rest.rsplit('/', 1)[1]}"
