"""Fake authorities: the DirPort protocol, accelerated voting with tor's rule, the operator API,
faults and the node population; the directory client against them over sockets and in-process.

One network of nine authorities (3 s "hours") serves the whole module; each test sets the
parameters it needs and clears its faults.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
import zstandard
from typer.testing import CliRunner

from fake_authorities.dirport import DirPortServer
from fake_authorities.faults import Fault, FaultError
from fake_authorities.network import FakeAuthorityNetwork, NetworkError, Timing, generate_keys
from kistexp.cli import app
from kistexp.dirauth import netstatus
from kistexp.dirauth.voting import Vote, compute_consensus_params
from kistexp.directory import DirectoryClient
from kistexp.errors import DirectoryError, DocumentError

REPO = Path(__file__).resolve().parent.parent
INTERVAL = 3
TOKEN = "test-token"
KIST = "KISTSchedRunInterval"


@pytest.fixture(scope="module")
def keys():
    return generate_keys(9, (1024, 1024))


@pytest.fixture(scope="module")
def net(keys):
    network = FakeAuthorityNetwork(count=9, interval_s=INTERVAL, port=0, keys=keys, token=TOKEN,
                                   vote_delay_s=0.4, dist_delay_s=0.4)
    network.start()
    try:
        network.wait_for_consensus(timeout_s=4 * INTERVAL)
        yield network
    finally:
        network.stop()


@pytest.fixture(autouse=True)
def no_faults_after(request):
    yield
    if "net" in request.fixturenames:
        network = request.getfixturevalue("net")
        for name in network.names:
            network.clear_fault(name)


def set_all(net: FakeAuthorityNetwork, values: dict[str, str | None]) -> None:
    for name in net.names:
        net.set_params(name, values.get(name))


def client(net: FakeAuthorityNetwork, in_process: bool = False, **kw) -> DirectoryClient:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("retries", 0)
    return DirectoryClient(net.directory_authorities(), transport=net.transport() if in_process else None, **kw)


def op(net: FakeAuthorityNetwork, method: str, path: str, body=None, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{net.operator_url}/kistexp/operator/{path}", json=body, headers=headers,
                         timeout=5)


def raw_get(port: int, path: str, headers: str = "") -> tuple[str, dict[str, str], bytes]:
    """A bare HTTP/1.0 exchange: status line, headers, body read to EOF (the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n{headers}\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    return lines[0], {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}, body


# --- voting ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_consensus_is_tors_rule_over_the_votes_and_verifies(net):
    set_all(net, {"moria1": f"{KIST}=2", "tor26": f"{KIST}=2", "dizum": f"{KIST}=2",
                  "gabelmoo": f"{KIST}=10", "dannenberg": f"{KIST}=10 cbttestfreq=5"})
    pub = net.wait_for_consensus(lambda p: dict(p.params).get("cbttestfreq") is None
                                 and dict(p.params).get(KIST) == 2
                                 and dict(p.params).get("AuthDirMaxServersPerAddr") == 2)
    for in_process in (False, True):
        with client(net, in_process) as c:
            md = c.fetch_consensus("microdesc")
            ns = c.fetch_consensus("ns")
            votes = c.fetch_votes("current")
        assert md.valid_after == ns.valid_after and md.valid_after.timestamp() >= pub.valid_after
        assert md.params == ns.params == (("AuthDirMaxServersPerAddr", 2), (KIST, 2))
        assert len(md.signatures) == 9
        held = [Vote(n, v.params) for n, v in votes.items()]
        assert compute_consensus_params(held, 9) == md.params  # 5 list KIST: 2,2,2,10,10 -> 2
        assert dict(votes["dannenberg"].params) == {"AuthDirMaxServersPerAddr": 2, KIST: 10, "cbttestfreq": 5}
        assert votes["maatuska"].params == ()  # no ConsensusParams: an empty params line
        assert sorted(a.nickname for a in md.authorities) == sorted(net.names)


@pytest.mark.slow
def test_operator_api_sets_params_for_the_next_vote(net):
    set_all(net, {"moria1": f"{KIST}=2", "tor26": f"{KIST}=2", "dizum": f"{KIST}=2"})
    r = op(net, "PUT", "authorities/maatuska/params", {"params": f"{KIST}=10"})
    assert r.status_code == 200 and r.json()["vote_params"] == f"AuthDirMaxServersPerAddr=2 {KIST}=10"
    for name in ("longclaw", "bastet", "faravahar", "gabelmoo", "dannenberg"):
        assert op(net, "PUT", f"authorities/{name}/params", {"params": [f"{KIST}=10"]}).status_code == 200
    assert op(net, "GET", "authorities/bastet/params").json()["consensus_params"] == [f"{KIST}=10"]
    # 3 x 2 and 6 x 10: the low median of nine values is the fifth smallest, 10.
    pub = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 10)
    history = op(net, "GET", "consensus").json()
    assert any(h["valid_after"] == pub.valid_after and h["params"][KIST] == 10 for h in history)
    status = op(net, "GET", "status").json()
    assert status["interval_s"] == INTERVAL and len(status["authorities"]) == 9


def test_operator_api_refuses_bad_requests(net):
    assert op(net, "GET", "status", token=None).status_code == 401
    assert op(net, "GET", "status", token="wrong").status_code == 401
    r = op(net, "PUT", "authorities/moria1/params", {"params": f"{KIST}=2 {KIST}=3"})
    assert r.status_code == 400 and "listed twice" in r.json()["error"]
    r = op(net, "PUT", "authorities/moria1/params", {"params": f"{KIST}=99999999999"})
    assert r.status_code == 400 and "int32" in r.json()["error"]
    assert op(net, "GET", "authorities/nosuch").status_code == 404
    r = op(net, "POST", "authorities/moria1/faults", {"kind": "explode"})
    assert r.status_code == 400 and "unknown fault" in r.json()["error"]
    r = op(net, "POST", "authorities/moria1/faults", {"kind": "slow", "delay_s": -1})
    assert r.status_code == 400
    with pytest.raises(FaultError):
        Fault("down", mode="sideways")


# --- the DirPort protocol (dirspec-params.md §5) --------------------------------------------


def test_dirport_urls_status_lines_and_headers(net):
    a = net.authority("moria1")
    port = a.dirport
    line, headers, body = raw_get(port, "/tor/status-vote/current/consensus-microdesc")
    assert line == "HTTP/1.0 200 OK"
    assert headers["content-encoding"] == "identity" and "content-length" not in headers
    assert headers["vary"] == "X-Or-Diff-From-Consensus" and "expires" in headers
    assert body.startswith(b"network-status-version 3 microdesc\n")
    line, headers, body = raw_get(port, "/tor/status-vote/current/consensus.z")
    assert headers["content-encoding"] == "deflate"
    assert zlib.decompress(body).startswith(b"network-status-version 3\nvote-status consensus")
    line, headers, body = raw_get(port, "/tor/no/such/thing")
    assert line == "HTTP/1.0 404 Not found" and body == b""
    assert raw_get(port, "/tor/robots.txt")[2] == b"User-agent: *\nDisallow: /\n"
    certs = net.certificates()
    _, _, body = raw_get(port, "/tor/keys/all")
    assert body.count(b"dir-key-certificate-version 3") == 9
    assert raw_get(port, "/tor/keys/authority")[2].decode() == a.keys.certificate_text
    other = certs[3]
    assert raw_get(port, f"/tor/keys/fp/{other.fingerprint.lower()}")[2].decode() == other.text
    assert raw_get(port, f"/tor/keys/sk/{other.signing_key_digest}")[2].decode() == other.text
    assert raw_get(port, f"/tor/keys/fp-sk/{other.fingerprint}-{other.signing_key_digest}")[2].decode() == other.text
    assert raw_get(port, "/tor/keys/fp/zz")[0] == "HTTP/1.0 400 Bad request"
    vote = raw_get(port, "/tor/status-vote/current/authority")[2]
    parsed = netstatus.parse_network_status(vote, "vote")
    assert parsed.is_vote and parsed.authorities[0].v3ident == a.v3ident
    assert raw_get(port, f"/tor/status-vote/current/{a.v3ident}")[2] == vote
    assert raw_get(port, f"/tor/status-vote/current/d/{parsed.digest}")[2] == vote
    peer = net.authority("tor26")
    assert netstatus.parse_network_status(
        raw_get(port, f"/tor/status-vote/current/{peer.v3ident}")[2], "v").authorities[0].nickname == "tor26"


@pytest.mark.parametrize("encoding", ["identity", "deflate", "gzip", "x-zstd", "x-tor-lzma"])
def test_each_accept_encoding_gets_that_content_encoding(net, encoding):
    port = net.authority("dizum").dirport
    _, headers, body = raw_get(port, "/tor/status-vote/current/consensus-microdesc",
                               f"Accept-Encoding: {encoding}\r\n")
    assert headers["content-encoding"] == encoding
    decode = {"identity": lambda b: b, "deflate": zlib.decompress, "gzip": gzip.decompress,
              "x-zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b),
              "x-tor-lzma": lzma.decompress}[encoding]
    assert decode(body).startswith(b"network-status-version 3 microdesc\n")


def test_not_modified_and_fingerprint_prefixes(net):
    a = net.authority("gabelmoo")
    port = a.dirport
    served = a.served_consensus("microdesc")
    path = "/tor/status-vote/current/consensus-microdesc"
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(served.valid_after + 60))
    assert raw_get(port, path, f"If-Modified-Since: {future}\r\n")[0].startswith("HTTP/1.0 304")
    past = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(served.valid_after - 60))
    assert raw_get(port, path, f"If-Modified-Since: {past}\r\n")[0] == "HTTP/1.0 200 OK"
    line, _, body = raw_get(port, path, f"X-Or-Diff-From-Consensus: {served.sha3_hex}\r\n")
    if line == "HTTP/1.0 200 OK":  # a new consensus was published in between; ask again
        served = a.served_consensus("microdesc")
        line, _, body = raw_get(port, path, f"X-Or-Diff-From-Consensus: {served.sha3_hex}\r\n")
    assert line.startswith("HTTP/1.0 304") and body == b""
    assert hashlib.sha3_256(raw_get(port, path)[2]).hexdigest() in (served.sha3_hex,
                                                                      a.served_consensus("microdesc").sha3_hex)
    prefixes = "+".join(sorted(x.v3ident[:6] for x in net.authorities.values()))
    assert raw_get(port, f"{path}/{prefixes}")[0] == "HTTP/1.0 200 OK"
    line = raw_get(port, f"{path}/AAAAAA+BBBBBB+{a.v3ident[:6]}")[0]
    assert line == "HTTP/1.0 404 Consensus not signed by sufficient number of requested authorities"


def test_stem_parses_the_fakes_with_validation(net):
    import stem
    import stem.descriptor
    import stem.descriptor.remote as remote

    a = net.authority("bastet")
    q = remote.Query("/tor/status-vote/current/consensus-microdesc", endpoints=[stem.DirPort("127.0.0.1", a.dirport)],
                     document_handler=stem.descriptor.DocumentHandler.DOCUMENT, validate=True, timeout=5)
    doc = list(q.run())[0]
    assert doc.is_consensus and len(doc.signatures) >= 5


def test_only_loopback_and_sane_options():
    with pytest.raises(NetworkError, match="127.0.0.0/8 only"):
        FakeAuthorityNetwork(count=3, host="0.0.0.0")
    with pytest.raises(ValueError, match="127.0.0.0/8 only"):
        DirPortServer(lambda r: None, "10.0.0.1", 0)
    with pytest.raises(NetworkError, match="whole number of seconds >= 2"):
        FakeAuthorityNetwork(count=3, interval_s=1)
    # 10 s = one hour: delays of 300 s scale to 0.83 s; aligned rounds (§2.2).
    t = Timing.scaled(10)
    assert round(t.vote_delay_s, 2) == 0.83 and t.n_intervals_valid == 3
    rnd = t.next_round(1000.5)
    assert rnd.valid_after == 1010 and rnd.fresh_until == 1020 and rnd.valid_until == 1040
    assert rnd.vote_at == pytest.approx(1010 - 2 * 10 / 12) and rnd.vote_cutoff == pytest.approx(1010 - 1.25)


# --- faults ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_faults_in_one_round(net):
    set_all(net, {n: f"{KIST}=5" for n in net.names})
    before = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 5)
    net.inject_fault("moria1", "down")
    net.inject_fault("tor26", "refuse-sign")
    net.inject_fault("dizum", "wrong-key")
    net.inject_fault("gabelmoo", "malformed")
    net.inject_fault("dannenberg", "stale-vote")
    for name in ("maatuska", "longclaw", "bastet", "faravahar"):
        net.set_params(name, f"{KIST}=7")
    # Votes held: tor26 (5) + four at 7; stale, malformed, wrong-key and down ones are rejected.
    pub = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 7, after=before.valid_after)
    doc = netstatus.parse_network_status(pub.served.text, "published")
    assert sorted(a.nickname for a in doc.authorities) == ["bastet", "faravahar", "longclaw", "maatuska", "tor26"]
    # Signers: not down, not refusing, not the wrong key; malformed and stale still sign.
    assert pub.signers == ("bastet", "dannenberg", "faravahar", "gabelmoo", "longclaw", "maatuska")
    with client(net) as c:
        doc = c.fetch_consensus("microdesc")  # some authority serves a good one
        assert dict(doc.params)[KIST] == 7
        with pytest.raises(DirectoryError, match=r"moria1 http://127\.0\.0\.1:\d+/tor/status-vote/current/"
                                                 r"consensus-microdesc: cannot connect"):
            c.fetch_consensus("microdesc", endpoint="moria1")
        with pytest.raises(DocumentError, match="gabelmoo http://"):
            c.fetch_consensus("microdesc", endpoint="gabelmoo")
        with pytest.raises(DocumentError, match="dizum .*vote signature does not verify"):
            c.fetch_vote("dizum", "next" if net.authority("dizum").own_votes["next"] else "current")
        assert dict(c.consensus["microdesc"].params)[KIST] == 7  # the good one is kept
    # The unreachable authority is a line in the status report, not a crash.
    args = ["authorities", "status", "--param", KIST, "--json", "--timeout", "1", "--retries", "0"]
    for a in net.directory_authorities():
        args += ["--authority", f"{a.nickname}={a.address}:{a.dirport}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {a["nickname"]: a for a in report["authorities"]}
    assert not rows["moria1"]["reachable"] and "cannot connect" in rows["moria1"]["error"]
    assert rows["maatuska"]["params"][KIST] == 7
    kist = report["params"][0]
    assert kist["name"] == KIST and kist["consensus_value"] == 7
    net.clear_fault("moria1")
    line = raw_get(net.authority("moria1").dirport, "/tor/robots.txt")[0]
    assert line == "HTTP/1.0 200 OK"


@pytest.mark.slow
def test_too_few_signatures_means_no_new_consensus(net):
    start = net.wait_for_consensus()
    for name in ("moria1", "tor26", "dizum", "gabelmoo", "dannenberg"):
        net.inject_fault(name, "refuse-sign")  # 4 signers left, 5 needed
    time.sleep(2.5 * INTERVAL)
    stuck = net.latest()
    assert stuck.valid_after <= start.valid_after + INTERVAL  # at most the round already signed
    assert any("4 signatures, 5 needed" in line for line in net.authority("maatuska").log)
    for name in net.names:
        net.clear_fault(name)
    assert net.wait_for_consensus(after=stuck.valid_after).valid_after > stuck.valid_after


def test_slow_and_hanging_authorities_are_bounded(net):
    net.inject_fault("longclaw", Fault("slow", delay_s=0.3))
    for in_process in (False, True):
        with client(net, in_process, timeout_s=2.0) as c:
            t = time.monotonic()
            c.fetch("longclaw", "/tor/robots.txt")
            assert time.monotonic() - t >= 0.3
    net.inject_fault("longclaw", Fault("down", mode="hang"))
    for in_process in (False, True):
        with client(net, in_process, timeout_s=0.5) as c:
            t = time.monotonic()
            with pytest.raises(DirectoryError, match="longclaw http://.*timed out"):
                c.fetch("longclaw", "/tor/robots.txt")
            assert time.monotonic() - t < 2.0


# --- population -------------------------------------------------------------------------------


@pytest.mark.slow
def test_population_records_adoption_in_tors_windows(net):
    set_all(net, {n: f"{KIST}=4" for n in net.names})
    r = op(net, "POST", "population", {"caches": 40, "clients": 40, "seed": 7})
    assert r.status_code == 200
    pub = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 4)
    target = net.wait_for_consensus(after=pub.valid_after)  # a consensus published after attaching
    time.sleep(2.2)  # the caches' window ends (120 s + 30 min + 60 s) x 3/3600 = 1.7 s after FU
    summary = op(net, "GET", "population?nodes=1").json()
    va = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(target.valid_after))
    entry = next(e for e in summary["adoption"] if e["valid_after"] == va)
    scale = INTERVAL / 3600
    assert entry["params"] == f"AuthDirMaxServersPerAddr=2 {KIST}=4"
    assert entry["cache"]["adopted"] == 40  # every cache fetched it from an authority
    # Caches that held the previous consensus fetch in [FU + 2 min, FU + 33 min) (scaled, + check jitter);
    # that FU is this valid-after. Clients start only 45 min after it.
    assert 120 * scale - 0.05 <= entry["cache"]["first_s"]
    assert entry["cache"]["last_s"] <= (120 + 1800 + 60) * scale + 0.3
    assert entry["client"]["adopted"] == 0 or entry["client"]["first_s"] >= 45 * 60 * scale - 0.05
    assert len(summary["nodes"]) == 80 and summary["nodes"][0]["fetches"]
    assert summary["running"].get(f"AuthDirMaxServersPerAddr=2 {KIST}=4", 0) >= 40
    net.population.stop()
    net.population = None


# --- running it --------------------------------------------------------------------------------


def _free_port_block(n: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535 and all(_free(base + i) for i in range(n + 1)):
            return base
    raise RuntimeError("no free port block")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_python_m_fake_authorities_runs_and_stops(tmp_path, keys):
    state = tmp_path / "state"
    for name, k in zip(["moria1", "tor26", "dizum"], keys, strict=False):  # reuse small keys: no keygen
        (state / name).mkdir(parents=True)
        (state / name / "authority_identity_key").write_bytes(k.identity_pem())
        (state / name / "authority_signing_key").write_bytes(k.signing_pem())
        (state / name / "authority_certificate").write_text(k.certificate_text)
    base = _free_port_block(3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "fake_authorities", "--count", "3", "--port", str(base),
                             "--interval", "2s", "--token", "T", "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert "3 fake authorities" in proc.stdout.readline()
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(f"http://127.0.0.1:{base}/kistexp/operator/status",
                          headers={"Authorization": "Bearer T"}, timeout=2)
            if r.json()["latest_consensus"] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        status = r.json()
        assert status["latest_consensus"]["signers"] == ["dizum", "moria1", "tor26"]
        assert [a["dirport"] for a in status["authorities"]] == [base + 1, base + 2, base + 3]
        assert json.loads((state / "network.json").read_text())["authorities"][0]["v3ident"] == keys[0].v3ident
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()
        proc.stderr.close()
    bad = subprocess.run([sys.executable, "-m", "fake_authorities", "--count", "3", "--host", "0.0.0.0"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "fake_authorities: error: refusing to bind '0.0.0.0': fake authorities listen on 127.0.0.0/8 only"]
