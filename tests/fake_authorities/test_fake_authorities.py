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
import random
import re
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
from conftest import have_real_tor
from typer.testing import CliRunner

from fake_authorities.dirport import DirPortServer
from fake_authorities.faults import Fault, FaultError
from fake_authorities.network import FakeAuthorityNetwork, NetworkError, generate_keys
from kistexp.cli import app
from kistexp.dirauth import netstatus
from kistexp.dirauth.schedule import AcceleratedSchedule
from kistexp.dirauth.voting import Vote, compute_consensus_params
from kistexp.directory import DirectoryClient
from kistexp.errors import DirectoryError, DocumentError

REPO = Path(__file__).resolve().parents[2]
INTERVAL = 3
TOKEN = "test-token"
KIST = "KISTSchedRunInterval"


@pytest.fixture(scope="module")
def keys():
    return generate_keys(9, (1024, 1024))


@pytest.fixture(scope="module")
def net(keys):
    network = FakeAuthorityNetwork(count=9, interval_s=INTERVAL, port=0, keys=keys, token=TOKEN,
                                   vote_delay_s=0.75, dist_delay_s=0.75)
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


def _one_rounds_documents(net: FakeAuthorityNetwork, in_process: bool, since: float):
    """Both consensus flavours and every vote of one round at or after ``since``. With 3 s rounds
    three fetches can straddle a round, and an authority that missed a round's signatures on a
    loaded machine serves its last consensus a round longer, as tor's do: ask again then."""
    seen = []
    for _ in range(6):
        with client(net, in_process) as c:
            md = c.fetch_consensus("microdesc")
            ns = c.fetch_consensus("ns")
            votes = c.fetch_votes("current")
        held = [v for v in votes.values() if not isinstance(v, Exception)]  # an unreachable one: its error
        rounds = {md.valid_after, ns.valid_after, *(v.valid_after for v in held)}
        if len(held) == len(votes) and len(rounds) == 1 and md.valid_after.timestamp() >= since:
            return md, ns, votes
        seen.append(sorted(r.isoformat() for r in rounds))
    pytest.fail(f"no fetch gave one round's documents at or after {since}: {seen}")


@pytest.mark.slow
def test_consensus_is_tors_rule_over_the_votes_and_verifies(net):
    set_all(net, {"moria1": f"{KIST}=2", "tor26": f"{KIST}=2", "dizum": f"{KIST}=2",
                  "gabelmoo": f"{KIST}=10", "dannenberg": f"{KIST}=10 cbttestfreq=5"})
    pub = net.wait_for_consensus(lambda p: dict(p.params).get("cbttestfreq") is None
                                 and dict(p.params).get(KIST) == 2
                                 and dict(p.params).get("AuthDirMaxServersPerAddr") == 2)
    for in_process in (False, True):
        md, ns, votes = _one_rounds_documents(net, in_process, pub.valid_after)
        assert md.params == ns.params == (("AuthDirMaxServersPerAddr", 2), (KIST, 2))
        # Every authority signs, but as in tor a detached signature that misses the distribution
        # window (a loaded machine) is simply absent; the client verified each one it counted.
        signers = [s.identity for s in md.signatures]
        assert len(signers) == len(set(signers)) >= 5
        assert set(signers) <= {a.v3ident for a in net.authorities.values()}
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
    # The digest is tor's digest_sha3_as_signed: SHA3-256 of the signed part.
    signed = netstatus.parse_network_status(raw_get(port, path)[2], "md").signed_part
    assert hashlib.sha3_256(signed).hexdigest() in (served.sha3_hex, a.served_consensus("microdesc").sha3_hex)
    line = raw_get(port, path, f"X-Or-Diff-From-Consensus: {'0' * 64} {served.sha3_hex}\r\n")[0]
    assert line.startswith("HTTP/1.0 304") or line == "HTTP/1.0 200 OK" and a.served_consensus("microdesc") != served
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
    q = remote.Query("/tor/status-vote/current/authority", endpoints=[stem.DirPort("127.0.0.1", a.dirport)],
                     document_handler=stem.descriptor.DocumentHandler.DOCUMENT, validate=True, timeout=5,
                     descriptor_type="network-status-vote-3 1.0")
    vote = list(q.run())[0]
    assert not vote.is_consensus and vote.directory_authorities[0].nickname == "bastet"


def test_only_loopback_and_sane_options():
    with pytest.raises(NetworkError, match="127.0.0.0/8 only"):
        FakeAuthorityNetwork(count=3, host="0.0.0.0")
    with pytest.raises(ValueError, match="127.0.0.0/8 only"):
        DirPortServer(lambda r: None, "10.0.0.1", 0)
    with pytest.raises(NetworkError, match="whole number of seconds >= 2"):
        FakeAuthorityNetwork(count=3, interval_s=1)
    # 10 s = one hour: delays of 300 s scale to 0.83 s; aligned rounds (§2.2).
    t = AcceleratedSchedule.scaled(10)
    assert round(t.vote_delay_s, 2) == 0.83 and t.n_intervals_valid == 3
    rnd = t.next_round(1000.5)
    assert rnd.valid_after == 1010 and rnd.fresh_until == 1020 and rnd.valid_until == 1040
    assert rnd.vote_at == pytest.approx(1010 - 2 * 10 / 12) and rnd.late_vote_cutoff == pytest.approx(1010 - 1.25)
    # The documents' voting-delay never goes below tor's 2 s minimum; an hourly network says 300 300.
    assert t.voting_delay_line() == (2, 2) and AcceleratedSchedule.scaled(3600).voting_delay_line() == (300, 300)
    assert AcceleratedSchedule.scaled(4, 1.5, 1.5).vote_delay_s == 1.0  # Vote + Dist > Interval/2: both Interval/4


# --- faults ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_faults_in_one_round(net):
    set_all(net, {n: f"{KIST}=5" for n in net.names})
    before = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 5)
    net.inject_fault("moria1", "down")
    net.inject_fault("dizum", "wrong-key")
    net.inject_fault("gabelmoo", "malformed")
    net.inject_fault("dannenberg", "stale-vote")
    for name in ("maatuska", "longclaw", "bastet", "faravahar"):
        net.set_params(name, f"{KIST}=7")
    # Votes held: tor26 (5) + four at 7; the down one does not vote, the stale, malformed and
    # wrong-key votes are rejected. Only voters may sign (tor rejects other signatures), so the
    # five voters sign: exactly the five needed.
    pub = net.wait_for_consensus(lambda p: dict(p.params).get(KIST) == 7, after=before.valid_after)
    voters = ["bastet", "faravahar", "longclaw", "maatuska", "tor26"]
    doc = netstatus.parse_network_status(pub.served.text, "published")
    assert sorted(a.nickname for a in doc.authorities) == voters
    assert list(pub.signers) == voters
    assert any("not among the votes held: not signing" in line for line in net.authority("dannenberg").log)
    with client(net) as c:
        doc = c.fetch_consensus("microdesc")  # some authority serves a good one
        assert dict(doc.params)[KIST] == 7
        with pytest.raises(DirectoryError, match=r"moria1 http://127\.0\.0\.1:\d+/tor/status-vote/current/"
                                                 r"consensus-microdesc: cannot connect"):
            c.fetch_consensus("microdesc", endpoint="moria1")
        with pytest.raises(DocumentError, match="gabelmoo http://"):
            c.fetch_consensus("microdesc", endpoint="gabelmoo")
        with pytest.raises(DocumentError, match="dizum .*vote signature does not verify"):
            c.fetch_vote("dizum", "current")
        assert dict(c.consensus["microdesc"].params)[KIST] == 7  # the good one is kept
    # The unreachable authority is a line in the status report, not a crash.
    args = ["authorities", "status", "--param", KIST, "--json", "--timeout", "1", "--retries", "0"]
    for a in net.directory_authorities():
        args += ["--authority", f"{a.nickname}={a.address}:{a.dirport}/{a.v3ident}"]
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
    # one whole round (vote .. VA) takes 1.6 intervals at most on an idle machine; wait for the
    # refusal to publish rather than a fixed time, so a loaded machine only makes it slower
    refused = re.compile(r"not publishing the microdesc consensus .*: [0-4] signatures, 5 needed")
    deadline = time.monotonic() + 5 * INTERVAL
    log = net.authority("maatuska").log
    while not any(refused.search(line) for line in log) and time.monotonic() < deadline:
        time.sleep(0.2)
        log = net.authority("maatuska").log
    assert any(refused.search(line) for line in log), log
    stuck = net.latest()
    assert stuck.valid_after <= start.valid_after + INTERVAL  # at most the round already signed
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
    r = op(net, "POST", "population", {"caches": 40, "clients": 40, "seed": 7})
    assert r.status_code == 200
    attached = time.time()
    target = net.wait_for_consensus(after=attached)  # a consensus published after attaching
    time.sleep(2.2)  # the caches' window ends (120 s + 30 min + 60 s) x 3/3600 = 1.7 s after FU
    summary = op(net, "GET", "population?nodes=1").json()
    va = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(target.valid_after))
    entry = next(e for e in summary["adoption"] if e["valid_after"] == va)
    scale = INTERVAL / 3600
    assert entry["params"] == " ".join(f"{k}={v}" for k, v in target.params)
    assert entry["cache"]["adopted"] == 40  # every cache fetched it from an authority
    # Caches that held the previous consensus fetch in [FU + 2 min, FU + 33 min) (scaled, + check jitter);
    # that FU is this valid-after. Clients start only 45 min after it. (A node that bootstrapped only
    # after this consensus was out, as on a loaded machine, fetches it at once: not in these windows.)
    assert entry["cache"]["last_s"] <= (120 + 1800 + 60) * scale + 0.3
    previous = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(target.valid_after - INTERVAL))
    holders = {"cache": 0, "client": 0}
    earliest = {"cache": 120 * scale - 0.05, "client": 45 * 60 * scale - 0.05}
    for node in summary["nodes"]:
        held = [f["valid_after"] for f in node["fetches"]]
        if previous in held:
            holders[node["kind"]] += 1
            if va in held:
                at = next(f["at_s"] for f in node["fetches"] if f["valid_after"] == va)
                assert at - target.valid_after >= earliest[node["kind"]], node
    # caches fetched the previous consensus from the authorities, clients from the caches
    assert holders["cache"] > 0 and holders["client"] > 0
    assert len(summary["nodes"]) == 80 and summary["nodes"][0]["fetches"]
    assert summary["running"].get(entry["params"], 0) >= 40
    net.population.stop()
    net.population = None


# --- running it --------------------------------------------------------------------------------


def _free_port_block(n: int) -> int:
    """A base port with ``n`` free ports after it, below the kernel's ephemeral range: every
    connection and every ``port=0`` listener of the tests running beside this one (the crash
    test's embedded authorities, for one) takes its ports from that range, so a block found free
    there can be taken before the process under test binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, low - n - 1)
        if all(_free(base + i) for i in range(n + 1)):
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
        line = proc.stdout.readline()  # empty only if it exited: then its one-line error says why
        assert "3 fake authorities" in line, line or proc.stderr.read()
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


def test_status_takes_the_plans_parameters(net):
    plan = REPO / "plans" / "kist-run-interval-2020.toml"
    set_all(net, {"moria1": f"{KIST}=2 cbttestfreq=5"})
    net.wait_for_consensus(lambda p: True)
    args = ["authorities", "status", "--plan", str(plan), "--json", "--timeout", "2"]
    for a in net.directory_authorities():
        args += ["--authority", f"{a.nickname}={a.address}:{a.dirport}/{a.v3ident}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [p["name"] for p in report["params"]] == [KIST]  # the plan's parameters only
    valid, total = re.match(r"(\d+)/(\d+) signatures valid, 5 needed", report["consensus"]["signatures"]).groups()
    assert report["consensus"]["error"] is None and 5 <= int(valid) == int(total)
    assert len(report["authorities"]) == 9 and all(a["reachable"] for a in report["authorities"])


def test_serve_command_refuses_other_addresses():
    result = CliRunner().invoke(app, ["authorities", "serve", "--count", "2", "--host", "192.168.1.1"])
    assert isinstance(result.exception, NetworkError)
    assert str(result.exception) == "refusing to bind '192.168.1.1': fake authorities listen on 127.0.0.0/8 only"


@pytest.mark.slow
def test_in_process_network_and_state_dir_restart(tmp_path, keys):
    """No sockets at all: the operator API and the DirPorts through the transport; a restart
    from the same state directory keeps identities and ConsensusParams."""
    state = tmp_path / "state"
    first = FakeAuthorityNetwork(count=3, interval_s=2, port=0, listen=False, token="t", state_dir=state,
                                 key_bits=(1024, 1024), vote_delay_s=0.3, dist_delay_s=0.3)
    with first:
        with httpx.Client(transport=first.transport(), base_url=first.operator_url) as http:
            r = http.put("/kistexp/operator/authorities/tor26/params", json={"params": f"{KIST}=3"},
                         headers={"Authorization": "Bearer t"})
            assert r.status_code == 200
        pub = first.wait_for_consensus(timeout_s=12)
        idents = [a.v3ident for a in first.directory_authorities()]
        with DirectoryClient(first.directory_authorities(), transport=first.transport(), retries=0) as c:
            assert c.fetch_consensus("ns").valid_after.timestamp() >= pub.valid_after
            assert dict(c.fetch_vote("tor26").params).get(KIST) in (None, 3)  # 3 from the next vote on
    second = FakeAuthorityNetwork(count=3, interval_s=2, port=0, listen=False, state_dir=state,
                                  vote_delay_s=0.3, dist_delay_s=0.3)
    with second:
        assert [a.v3ident for a in second.directory_authorities()] == idents
        assert second.authority("tor26").consensus_params == (f"{KIST}=3",)
        second.wait_for_consensus(lambda p: True, timeout_s=12)
    assert (state / "operator-token").read_text().strip() == "t"
    assert oct((state / "moria1" / "authority_identity_key").stat().st_mode & 0o777) == "0o600"


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_server_bad_input_gets_a_bodyless_error_and_keeps_serving(net):
    a = net.authority("faravahar")
    for body in (b"garbage", b"network-status-version 3\nvote-status vote\n", os.urandom(300)):
        reply = raw_request(a.dirport, b"POST /tor/post/vote HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(body), body))
        assert reply.split(b"\r\n")[0].startswith(b"HTTP/1.0 400") and reply.endswith(b"\r\n\r\n")
    reply = raw_request(a.dirport, b"POST /tor/post/vote HTTP/1.0\r\nContent-Length: 999999999999\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 400 Bad Content-Length")
    reply = raw_request(a.dirport, b"POST /tor/post/vote HTTP/1.0\r\nContent-Length: lots\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 400")
    reply = raw_request(a.dirport, b"POST /tor/post/consensus-signature HTTP/1.0\r\nContent-Length: 4\r\n\r\njunk")
    assert reply.split(b"\r\n")[0].startswith(b"HTTP/1.0 400")
    assert raw_get(a.dirport, "/tor/status-vote/current/d/not-hex")[0] == "HTTP/1.0 400 Bad request"
    assert raw_get(a.dirport, "/tor/status-vote/current/consensus/xyz")[0] == "HTTP/1.0 400 Bad request"
    assert raw_request(a.dirport, b"BREW /tor/robots.txt HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 501")
    r = httpx.put(f"{net.operator_url}/kistexp/operator/authorities/moria1/params", content=b"{not json",
                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and r.json() == {"error": "request body is not JSON"}
    assert raw_get(a.dirport, "/tor/robots.txt")[0] == "HTTP/1.0 200 OK"  # still serving


@pytest.mark.realtor
@pytest.mark.slow
@pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor")
def test_real_tor_accepts_the_fakes_consensus(tmp_path, keys):
    """Debian's tor, configured with the fakes as its DirAuthority lines, loads their microdesc
    consensus and counts every signature (a testing network needs FU - VA >= 10 s)."""
    with FakeAuthorityNetwork(count=5, interval_s=10, port=0, keys=keys[:5],
                              initial_params=f"{KIST}=3") as fakes:
        pub = fakes.wait_for_consensus(timeout_s=25)
        data = tmp_path / "tor"
        data.mkdir(mode=0o700)
        (data / "cached-microdesc-consensus").write_bytes(pub.served.text)
        (data / "cached-certs").write_text("".join(c.text for c in fakes.certificates()))
        lines = [f"DataDirectory {data}", "SocksPort 0", "DisableNetwork 1", "Log info stdout",
                 "TestingTorNetwork 1"]
        for a in fakes.directory_authorities():
            relay_fp = hashlib.sha1(a.nickname.encode()).hexdigest().upper()  # never contacted here
            lines.append(f"DirAuthority {a.nickname} orport={a.orport} no-v2 v3ident={a.v3ident} "
                         f"127.0.0.1:{a.dirport} {relay_fp}")
    torrc = tmp_path / "torrc"
    torrc.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(["tor", "-f", str(torrc)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    verdict = ""
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or "A consensus needs" in line or "Unable to parse" in line:
                verdict = line
                break
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert "A consensus needs 3 good signatures" in verdict and "This microdesc one has 5" in verdict, verdict


def test_state_dir_that_is_not_a_directory_is_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for state, message in ((a_file, "exists and is not a directory"), (a_file / "sub", "cannot create it")):
        result = CliRunner().invoke(app, ["authorities", "serve", "--count", "2", "--port", "0",
                                          "--state-dir", str(state)])
        assert isinstance(result.exception, NetworkError), result.exception
        assert str(result.exception) == f"--state-dir {state}: {message}" + (
            " (Not a directory)" if state != a_file else "")
