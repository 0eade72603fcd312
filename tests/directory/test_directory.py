"""The directory client against small misbehaving loopback servers (issue 3, "Bad input").

Every failure must be one DirectoryError/DocumentError line naming the authority and the URL,
bounded in time and memory, and the consensus the client held before must be kept.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import lzma
import socket
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable

import attrs
import pytest
import zstandard
from conftest import free_port

from kistexp.dirauth import documents
from kistexp.dirauth.keys import AuthorityKeys
from kistexp.directory import (
    DirectoryClient,
    Endpoint,
    Limits,
    detect_compression,
    parse_authority_spec,
)
from kistexp.errors import DirectoryError, DocumentError, KistexpError

MD_PATH = "/tor/status-vote/current/consensus-microdesc"


# --- documents -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys() -> list[AuthorityKeys]:
    # Small keys: these tests are about the client, not key strength.
    published = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return [AuthorityKeys.generate(published=published, identity_bits=1024, signing_bits=1024) for _ in range(5)]


def consensus_text(keys: list[AuthorityKeys], signers: list[AuthorityKeys], hour: int = 12,
                   params: dict[str, int] | None = None) -> bytes:
    va = dt.datetime(2026, 6, 1, hour, tzinfo=dt.timezone.utc)
    header = documents.StatusHeader.hourly(va, params=params or {"KISTSchedRunInterval": 2})
    sources = [documents.DirSource(f"auth{i}", k.v3ident, "127.0.0.1", "127.0.0.1", 80, 443, "c", "A" * 40)
               for i, k in enumerate(keys)]
    return documents.render_consensus(header, sources, [], signers, flavor="microdesc").encode()


# --- a raw loopback server whose behaviour each test scripts ----------------------------


class RawServer:
    """Accepts connections on 127.0.0.1 and hands each (request head, socket) to ``behave``."""

    def __init__(self, behave: Callable[[bytes, socket.socket], None]) -> None:
        self.behave = behave
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.requests.append(head)
                self.behave(head, conn)
            except OSError:
                pass

    def endpoint(self, nick: str = "badauth") -> Endpoint:
        return Endpoint(nick, "127.0.0.1", self.port)

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()


@pytest.fixture
def server():
    made: list[RawServer] = []

    def make(behave: Callable[[bytes, socket.socket], None]) -> RawServer:
        srv = RawServer(behave)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.close()


def reply(body: bytes, encoding: str | None = "identity", status: str = "200 OK",
          extra: str = "") -> Callable[[bytes, socket.socket], None]:
    def behave(head: bytes, conn: socket.socket) -> None:
        hdr = f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\n{extra}"
        if encoding is not None:
            hdr += f"Content-Encoding: {encoding}\r\n"
        conn.sendall(hdr.encode() + b"\r\n" + body)

    return behave


# "Now" for the live certificate check: half an hour into the 12:00 consensus of consensus_text.
NOW = dt.datetime(2026, 6, 1, 12, 30, tzinfo=dt.timezone.utc).timestamp()


def client_for(endpoints: list[Endpoint], keys: list[AuthorityKeys], **kw) -> DirectoryClient:
    """A client configured with one authority per key, each pinned by its v3ident: the servers
    given play the first ones (in order); the rest are served by the first server."""
    kw.setdefault("timeout_s", 1.0)
    kw.setdefault("retries", 0)
    kw.setdefault("sleep", lambda s: None)
    kw.setdefault("clock", lambda: NOW)
    pinned = [attrs.evolve(e, v3ident=e.v3ident or k.v3ident) for e, k in zip(endpoints, keys, strict=False)]
    first = endpoints[0]
    pinned += [Endpoint(f"auth{i}", first.host, first.port, k.v3ident)
               for i, k in enumerate(keys) if i >= len(endpoints)]
    return DirectoryClient(pinned, certificates=[k.certificate for k in keys], **kw)


def one_line(exc: BaseException, *needles: str) -> str:
    text = str(exc)
    assert "\n" not in text
    for n in needles:
        assert n in text, text
    return text


# --- happy paths ---------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["identity", "deflate", "gzip", "x-zstd", "x-tor-lzma"])
def test_every_encoding_decodes_and_verifies(server, keys, encoding):
    text = consensus_text(keys, keys)
    encoders = {"identity": lambda b: b, "deflate": zlib.compress, "gzip": gzip.compress,
                "x-zstd": zstandard.ZstdCompressor().compress,
                "x-tor-lzma": lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE)}
    srv = server(reply(encoders[encoding](text), encoding))
    with client_for([srv.endpoint()], keys) as c:
        doc = c.fetch_consensus("microdesc")
    assert doc.params == (("KISTSchedRunInterval", 2),)
    assert b"Accept-Encoding: x-tor-lzma, x-zstd, deflate, gzip, identity" in srv.requests[0]


def test_authority_spec_parsing():
    assert parse_authority_spec("moria1=127.0.0.1:7001") == Endpoint("moria1", "127.0.0.1", 7001)
    assert parse_authority_spec("[::1]:80") == Endpoint("::1:80", "::1", 80)
    with pytest.raises(DirectoryError, match="expected NICK=HOST:PORT"):
        parse_authority_spec("moria1=127.0.0.1")
    with pytest.raises(DirectoryError, match="expected NICK=HOST:PORT"):
        parse_authority_spec("x=127.0.0.1:70000")


def test_detect_compression_magic():
    data = b"network-status-version 3\n" * 10
    assert detect_compression(zlib.compress(data)) == "deflate"
    assert detect_compression(gzip.compress(data)) == "gzip"
    assert detect_compression(zstandard.ZstdCompressor().compress(data)) == "x-zstd"
    assert detect_compression(lzma.compress(data, format=lzma.FORMAT_ALONE)) == "x-tor-lzma"
    assert detect_compression(data) == "identity"


# --- bad input: each keeps the previous consensus ------------------------------------------


@pytest.fixture
def holding(server, keys):
    """A client that already holds a good consensus (valid-after 12:00) from a good server."""
    good = server(reply(zlib.compress(consensus_text(keys, keys)), "deflate"))

    def make(bad: RawServer, **kw) -> DirectoryClient:
        c = client_for([good.endpoint("goodauth"), bad.endpoint()], keys, **kw)
        c.fetch_consensus("microdesc", endpoint="goodauth")
        return c

    return make


def assert_kept(c: DirectoryClient) -> None:
    held = c.consensus["microdesc"]
    assert held.valid_after == dt.datetime(2026, 6, 1, 12, tzinfo=dt.timezone.utc)
    assert held.params == (("KISTSchedRunInterval", 2),)


def test_stall_times_out_bounded(server, holding):
    stall = threading.Event()
    bad = server(lambda head, conn: stall.wait(10))
    c = holding(bad, timeout_s=0.5)
    t = time.monotonic()
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    assert time.monotonic() - t < 2.0
    one_line(err.value, "badauth", f"http://127.0.0.1:{bad.port}{MD_PATH}", "timed out")
    assert_kept(c)
    stall.set()
    c.close()


def test_trickle_hits_overall_deadline(server, holding):
    def trickle(head: bytes, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: identity\r\n\r\nnetwork-status-version 3")
        for _ in range(100):
            time.sleep(0.1)
            conn.sendall(b" ")

    bad = server(trickle)
    c = holding(bad, timeout_s=0.5, deadline_s=1.0)
    t = time.monotonic()
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    assert time.monotonic() - t < 2.5
    one_line(err.value, "badauth", MD_PATH, "deadline")
    assert_kept(c)


def test_connection_reset(server, holding):
    def reset(head: bytes, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: deflate\r\n\r\n" + zlib.compress(b"x" * 10000)[:20])
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    bad = server(reset)
    c = holding(bad)
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", MD_PATH)
    assert_kept(c)


def test_content_encoding_lies_are_named(server, holding, keys):
    text = consensus_text(keys, keys, hour=13)
    cases = [
        (reply(text, "deflate"), "Content-Encoding says deflate but the body is uncompressed text"),
        (reply(zlib.compress(text), "identity"), "Content-Encoding says identity but the body is deflate data"),
        (reply(gzip.compress(text), "deflate"), "Content-Encoding says deflate but the body is gzip data"),
        (reply(text, "br"), "server sent Content-Encoding 'br', which was not offered"),
    ]
    for behave, message in cases:
        bad = server(behave)
        c = holding(bad)
        with pytest.raises(DirectoryError) as err:
            c.fetch_consensus("microdesc", endpoint="badauth")
        one_line(err.value, "badauth", MD_PATH, message)
        assert_kept(c)


def _zlib_bomb(head: bytes, conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: deflate\r\n\r\n")
    comp = zlib.compressobj(9)
    zeros = b"\0" * (1 << 20)
    for _ in range(1024):  # 1 GiB of zeros as about 1 MB of zlib
        conn.sendall(comp.compress(zeros))
    conn.sendall(comp.flush())


def test_zlib_bomb_ratio_guard_bounded(server, holding):
    bad = server(_zlib_bomb)
    c = holding(bad)
    tracemalloc.start()
    t = time.monotonic()
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - t < 2.0
    assert peak < 8 * 1024 * 1024
    one_line(err.value, "badauth", MD_PATH, "decompression bomb", "ratio > 25")
    assert_kept(c)


def test_zlib_bomb_hard_cap_without_ratio_rule(server, holding):
    bad = server(_zlib_bomb)
    c = holding(bad, limits=Limits(max_decoded_bytes=2 * 1024 * 1024, max_ratio=10**9))
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", "decoded body exceeds the 2097152-byte limit")
    assert_kept(c)


def test_truncated_bodies(server, holding, keys):
    text = consensus_text(keys, keys, hour=13)
    z = zlib.compress(text)
    bad = server(reply(z[: len(z) // 2], "deflate"))
    c = holding(bad)
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", MD_PATH, "truncated")
    assert_kept(c)
    # Uncompressed and cut mid-signature: the document parser names it.
    bad = server(reply(text[: len(text) - 40], "identity"))
    c = holding(bad)
    with pytest.raises(DocumentError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", MD_PATH)
    assert_kept(c)


def test_oversized_bodies(server, holding):
    def endless(head: bytes, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: identity\r\n\r\n")
        for _ in range(200):
            conn.sendall(b"a" * 65536)

    bad = server(endless)
    c = holding(bad, limits=Limits(max_body_bytes=1024 * 1024))
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", MD_PATH, "body exceeds the 1048576-byte limit")
    assert_kept(c)
    bad = server(reply(b"", "identity", extra="Content-Length: 999999999\r\n"))
    c = holding(bad, limits=Limits(max_body_bytes=1024 * 1024))
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "Content-Length 999999999 exceeds")
    assert_kept(c)


def test_unsigned_forged_and_undersigned_consensus_rejected(server, holding, keys):
    newer = dict(hour=13, params={"KISTSchedRunInterval": 100})
    good_body = consensus_text(keys, keys, **newer).decode()
    unsigned = good_body[: good_body.index("directory-signature")].encode()
    rogue = [AuthorityKeys.from_keys(k.identity_key, AuthorityKeys.generate(identity_bits=1024,
                                                                            signing_bits=1024).signing_key,
                                     k.certificate.published, k.certificate.expires) for k in keys[:3]]
    forged = consensus_text(keys, rogue, **newer)  # claims real identities, uncertified signing keys
    strangers = [AuthorityKeys.generate(identity_bits=1024, signing_bits=1024) for _ in range(3)]
    cases = [
        (unsigned, DocumentError, "no directory-signature"),
        (forged, DocumentError, "consensus rejected: 0/3 signatures valid, 3 needed (N=5)"),
        (consensus_text(keys, keys[:2], **newer), DocumentError, "2/2 signatures valid, 3 needed"),
        (consensus_text(keys, strangers, **newer), DocumentError, "3 unknown authority"),
    ]
    for body, exc_type, message in cases:
        bad = server(reply(body))
        c = holding(bad)
        with pytest.raises(exc_type) as err:
            c.fetch_consensus("microdesc", endpoint="badauth")
        one_line(err.value, "badauth", MD_PATH, message)
        assert_kept(c)
    # One byte changed in a properly signed body breaks every signature.
    tampered = consensus_text(keys, keys, **newer).replace(b"KISTSchedRunInterval=100", b"KISTSchedRunInterval=101")
    c = holding(server(reply(tampered)))
    with pytest.raises(DocumentError, match="0/5 signatures valid"):
        c.fetch_consensus("microdesc", endpoint="badauth")
    assert_kept(c)



def test_live_fetch_checks_certificates_now(server, holding):
    # Certificates valid at the consensus's valid-after (12:00) but expired by the time it is
    # fetched: tor counts no signature whose certificate has expired now, so neither do we.
    published = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    expired = [AuthorityKeys.generate(published=published, lifetime=dt.timedelta(days=151, hours=13),
                                      identity_bits=1024, signing_bits=1024) for _ in range(5)]
    assert expired[0].certificate.expires == dt.datetime(2026, 6, 1, 13, tzinfo=dt.timezone.utc)
    text = consensus_text(expired, expired, hour=12)
    srv = server(reply(text))
    archived = documents.require_signatures(documents.parse_network_status(text, "archive"),
                                            [k.certificate for k in expired], n_authorities=5)
    assert archived.valid == 5  # checked at its valid-after, as for an archived document
    c = client_for([srv.endpoint()], expired, clock=lambda: NOW + 3600)  # 13:30, an hour after expiry
    with pytest.raises(DirectoryError) as info:
        c.fetch_consensus("microdesc")
    one_line(info.value, "badauth", MD_PATH, "consensus rejected: 0/5 signatures valid", "5 expired cert")
    assert "microdesc" not in c.consensus
    # With certificates still current, a consensus past its valid-until (15:00) is accepted:
    # tor keeps using one for 24 h after ("reasonably live", dirspec §2.2).
    late = holding(server(reply(b"")), clock=lambda: NOW + 20 * 3600)
    assert late.consensus["microdesc"].valid_until < dt.datetime.fromtimestamp(NOW + 20 * 3600, dt.timezone.utc)

def test_older_consensus_is_not_taken(server, holding, keys):
    c = holding(server(reply(consensus_text(keys, keys, hour=11))))
    with pytest.raises(DocumentError, match="older than the one held"):
        c.fetch_consensus("microdesc", endpoint="badauth")
    assert_kept(c)


def test_http_errors_and_retries_with_backoff(server, keys):
    srv = server(reply(b"", None, status="503 Directory busy, try again later"))
    sleeps: list[float] = []
    c = client_for([srv.endpoint()], keys, retries=2, backoff_s=0.1, sleep=sleeps.append)
    with pytest.raises(DirectoryError) as err:
        c.fetch(srv.endpoint(), MD_PATH)
    one_line(err.value, "badauth", "HTTP 503", "after 3 attempts")
    assert len(srv.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2  # full jitter
    srv404 = server(reply(b"", None, status="404 Not found"))
    with pytest.raises(DirectoryError) as err:
        c.fetch(srv404.endpoint("other"), MD_PATH)
    one_line(err.value, "other", "HTTP 404 Not found")
    assert len(srv404.requests) == 1  # a 404 is not retried


def test_unreachable_authority_named(keys):
    port = free_port()  # nothing listens there now
    c = client_for([Endpoint("gone", "127.0.0.1", port)], keys)
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc")
    one_line(err.value, "no authority served a valid microdesc consensus", f"gone http://127.0.0.1:{port}",
             "cannot connect")


def test_any_authority_falls_through_to_a_good_one(server, keys):
    bad = server(reply(b"garbage", "identity"))
    good = server(reply(consensus_text(keys, keys)))
    c = client_for([bad.endpoint("bad1"), good.endpoint("good1")], keys)
    doc = c.fetch_consensus("microdesc")
    assert doc.params == (("KISTSchedRunInterval", 2),)


def test_errors_are_kistexp_errors():
    assert issubclass(DirectoryError, KistexpError) and issubclass(DocumentError, KistexpError)
    with pytest.raises(DirectoryError, match="no directory authorities given"):
        DirectoryClient([])
    with pytest.raises(DirectoryError, match="unsupported Accept-Encoding"):
        DirectoryClient([("127.0.0.1", 1)], accept_encodings=["br"])


def test_certificates_file_is_checked(tmp_path, keys):
    path = tmp_path / "certs"
    path.write_text("".join(k.certificate_text for k in keys))
    c = DirectoryClient([Endpoint("a", "127.0.0.1", 1, keys[0].v3ident)])
    assert c.load_certificates(path) == 1  # only the configured authority's certificate is kept
    broken = tmp_path / "broken"
    broken.write_text(keys[0].certificate_text.replace("dir-key-published 2026", "dir-key-published 2025"))
    with pytest.raises(DocumentError, match=str(broken)):
        c.load_certificates(broken)


@pytest.mark.parametrize(("params_line", "message"), [
    (b"params KISTSchedRunInterval=2 AuthDirMaxServersPerAddr=8", "is out of order"),
    (b"params KISTSchedRunInterval=2 KISTSchedRunInterval=3", "listed twice"),
    (b"params KISTSchedRunInterval=2147483648", "outside the int32 range"),
    (b"params KISTSchedRunInterval=two", "non-integer value"),
])
def test_bad_params_lines_reject_the_whole_consensus(server, holding, keys, params_line, message):
    text = consensus_text(keys, keys, hour=13).replace(b"params KISTSchedRunInterval=2", params_line)
    c = holding(server(reply(zlib.compress(text), "deflate")))
    with pytest.raises(DocumentError) as err:
        c.fetch_consensus("microdesc", endpoint="badauth")
    one_line(err.value, "badauth", MD_PATH, "params line", message)
    assert_kept(c)


# --- total deadline and header caps (issue 7, item 2) ----------------------------------------


def test_status_line_then_one_byte_per_half_second_fails_within_the_timeout(server, keys):
    # httpx's timeouts bound each read; this server never lets one run out.
    def drip(head: bytes, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n")
        for _ in range(40):  # 20 s of headers, one byte at a time
            time.sleep(0.5)
            conn.sendall(b"X")

    srv = server(drip)
    c = client_for([srv.endpoint()], keys, timeout_s=2.0)
    t = time.monotonic()
    with pytest.raises(DirectoryError) as err:
        c.fetch(srv.endpoint(), MD_PATH)
    assert time.monotonic() - t < 3.0
    one_line(err.value, "badauth", MD_PATH, "timed out", "2 s deadline")


def test_connect_and_headers_share_one_deadline(server, keys):
    # The answer as a whole is late even though each piece arrives within the timeout.
    def slow_pieces(head: bytes, conn: socket.socket) -> None:
        for piece in (b"HTTP/1.0 200 OK\r\n", b"Content-Type: text/plain\r\n", b"\r\n", b"network-status"):
            time.sleep(0.4)
            conn.sendall(piece)

    srv = server(slow_pieces)
    c = client_for([srv.endpoint()], keys, timeout_s=1.0)
    t = time.monotonic()
    with pytest.raises(DirectoryError, match="1 s deadline"):
        c.fetch(srv.endpoint(), MD_PATH)
    assert time.monotonic() - t < 1.6


@pytest.mark.parametrize(("extra", "message"), [
    ("".join(f"X-Pad-{i}: {i}\r\n" for i in range(100)), "102 response headers"),
    ("X-Big: " + "a" * 20000 + "\r\n", "more than the 64 headers / 16384 bytes allowed"),
])
def test_header_count_and_size_are_capped(server, keys, extra, message):
    srv = server(reply(consensus_text(keys, keys), extra=extra))
    c = client_for([srv.endpoint()], keys)
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc")
    one_line(err.value, "badauth", MD_PATH, message)


@pytest.mark.parametrize(("kw", "message"), [
    ({"timeout_s": float("nan")}, "--timeout nan: expected seconds above 0"),
    ({"timeout_s": float("inf")}, "--timeout inf"),
    ({"timeout_s": -1.0}, "--timeout -1.0"),
    ({"timeout_s": 0.0}, "--timeout 0.0"),
    ({"retries": -1}, "--retries -1: expected a whole number from 0 to 10"),
    ({"retries": 10**6}, "--retries 1000000"),
    ({"n_authorities": 1}, "--n-authorities 1: N counts the configured authorities, so it must be from 2"),
    ({"n_authorities": 65}, "--n-authorities 65: .* must be from 2 to 64"),
])
def test_client_settings_are_validated(kw, message):
    with pytest.raises(DirectoryError, match=message.replace("(", r"\(").replace(".", r"\.").replace(r"\.*", ".*")):
        DirectoryClient(["a=127.0.0.1:1", "b=127.0.0.1:2"], **kw)
    with pytest.raises(DirectoryError, match="65 directory authorities given; at most 64"):
        DirectoryClient([f"a{i}=127.0.0.1:{i + 1}" for i in range(65)])


# --- trust pinned to authority identities (issue 7, item 1) ---------------------------------


def _two_cert_server(server, own: AuthorityKeys, extra: AuthorityKeys, keys: list[AuthorityKeys]):
    """One hostile server: it hands out its own certificate plus a second identity's, and a
    consensus signed by both that says KISTSchedRunInterval=77."""
    text = consensus_text([own, extra], [own, extra], params={"KISTSchedRunInterval": 77})

    def behave(head: bytes, conn: socket.socket) -> None:
        if b" /tor/keys/" in head:
            body = (own.certificate_text + extra.certificate_text).encode()
        elif b"consensus" in head:
            body = text
        else:
            conn.sendall(b"HTTP/1.0 404 Not found\r\n\r\n")
            return
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: identity\r\n\r\n" + body)

    return server(behave)


def test_one_server_cannot_vouch_for_a_second_identity(server, keys):
    hostile = _two_cert_server(server, keys[0], keys[1], keys)
    down = [Endpoint(f"down{i}", "127.0.0.1", free_port(), keys[i].v3ident) for i in (2, 3)]
    # Pinned: only keys[0] is a configured identity among the signers, so 1 of 3 is not enough.
    c = DirectoryClient([Endpoint("hostile", "127.0.0.1", hostile.port, keys[0].v3ident), *down],
                        retries=0, timeout_s=1.0, clock=lambda: NOW)
    with pytest.raises(DirectoryError) as err:
        c.fetch_consensus("microdesc")
    one_line(err.value, "hostile", "1/2 signatures valid, 2 needed (N=3); 1 unknown authority")
    assert set(c.certificates) == {keys[0].v3ident}  # the second identity's certificate is dropped
    # Bare HOST:PORT authorities pin nothing: no certificate is taken from them and nothing verifies
    # (this used to accept the consensus, "2/2 signatures valid, 2 needed (N=3)").
    bare = DirectoryClient([f"hostile=127.0.0.1:{hostile.port}", *(f"{e.nickname}=127.0.0.1:{e.port}" for e in down)],
                           retries=0, timeout_s=1.0, clock=lambda: NOW)
    with pytest.raises(DocumentError) as err:
        bare.fetch_consensus("microdesc")
    one_line(err.value, "not verified: no authority identity (v3ident) is configured")
    assert bare.certificates == {} and "microdesc" not in bare.consensus


def test_status_command_without_identities_says_so_and_fails(server, keys):
    from typer.testing import CliRunner

    from kistexp.cli import app

    hostile = _two_cert_server(server, keys[0], keys[1], keys)
    args = ["authorities", "status", "--param", "KISTSchedRunInterval", "--json", "--timeout", "1", "--retries", "0",
            "--authority", f"hostile=127.0.0.1:{hostile.port}"]
    args += ["--authority", f"down1=127.0.0.1:{free_port()}", "--authority", f"down2=127.0.0.1:{free_port()}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert isinstance(result.exception, DirectoryError)
    assert "not verified: no authority identity (v3ident) is configured" in str(result.exception)
    report = json.loads(result.stdout)
    assert report["verified"] is False and report["params"][0]["consensus_value"] is None
    assert [a["pinned"] for a in report["authorities"]] == [False, False, False]
    bogus = CliRunner().invoke(app, ["authorities", "status", "--flavour", "bogus"])
    assert bogus.exit_code != 0 and "--flavour 'bogus': unknown consensus flavour" in str(bogus.exception)


def test_authority_spec_with_identity():
    ident = "F533C81CEF0BC0267857C99B2F471ADF249FA232"
    assert parse_authority_spec(f"moria1=127.0.0.1:7001/{ident.lower()}") == Endpoint(
        "moria1", "127.0.0.1", 7001, ident)
    assert parse_authority_spec(f"[::1]:80/{ident}").v3ident == ident
    for bad, message in [
        (f"moria1=127.0.0.1:7001/{ident}\n", "is not a v3ident"),
        (f"moria1=127.0.0.1:7001/{ident[:-1]}", "is not a v3ident"),
        ("moria1\n=127.0.0.1:7001", "is not a tor nickname"),
        ("moria1=127.0.0.1:\u00b2", "expected NICK=HOST:PORT/V3IDENT"),
        ("moria1=127.0.0.1:7001\n", "expected NICK=HOST:PORT/V3IDENT"),
    ]:
        with pytest.raises(DirectoryError, match=message):
            parse_authority_spec(bad)
    with pytest.raises(DirectoryError, match="repeats a's v3ident"):
        DirectoryClient([f"a=127.0.0.1:1/{ident}", f"b=127.0.0.1:2/{ident}"])
    with pytest.raises(DirectoryError, match="repeats a's nickname"):
        DirectoryClient(["a=127.0.0.1:1", "A=127.0.0.1:2"])


def test_served_certificate_with_an_oversized_key_is_refused(server, keys):
    from tests.dirauth.test_documents import _with_key

    big = _with_key(keys[0].certificate_text, "dir-signing-key", (1 << 16383) | 1, 65537)
    srv = server(reply(big.encode()))
    c = DirectoryClient([Endpoint("big", "127.0.0.1", srv.port, keys[0].v3ident)], retries=0, timeout_s=1.0)
    t = time.monotonic()
    with pytest.raises(DirectoryError) as err:
        c.fetch_certificates()
    assert time.monotonic() - t < 1.0
    one_line(err.value, "big", "/tor/keys/fp/", "dir-signing-key", "larger than the 3072-bit limit")


def test_status_table_shows_hostile_vote_keys_as_text(server):
    from typer.testing import CliRunner

    from kistexp.cli import app

    # An authority pinned by its v3ident whose own vote lists a key made to attack the terminal.
    keys = AuthorityKeys.generate(identity_bits=1024, signing_bits=1024)
    evil = "\x1b]0;pwned\x07[/red]"
    va = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    header = documents.StatusHeader.hourly(va, params={evil: 1})
    vote = documents.render_vote(header, documents.AuthorityIdentity("auth0", "127.0.0.1", 80, 443), keys, [])
    source = documents.dir_source_for_vote(documents.parse_network_status(vote, "vote"))
    consensus = documents.render_consensus(header, [source], [], [keys], flavor="microdesc")

    def behave(head: bytes, conn: socket.socket) -> None:
        body = {b"/tor/status-vote/current/authority": vote, b"/tor/keys/": keys.certificate_text,
                b"/tor/status-vote/current/consensus-microdesc": consensus}
        path = head.split(b" ")[1]
        text = next((v for k, v in body.items() if path.startswith(k)), None)
        if text is None:
            conn.sendall(b"HTTP/1.0 404 Not found\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Encoding: identity\r\n\r\n" + text.encode())

    srv = server(behave)
    result = CliRunner().invoke(app, ["authorities", "status", "--timeout", "2", "--retries", "0",
                                      "--authority", f"auth0=127.0.0.1:{srv.port}/{keys.v3ident}"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "\\x1b]0;pwned\\x07[/red]" in result.stdout
    assert "1/1 signatures valid" in result.stdout


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--timeout", "nan", "--timeout nan: expected seconds above 0"),
    ("--timeout", "inf", "--timeout inf: expected seconds above 0"),
    ("--timeout", "-2", "--timeout -2.0: expected seconds above 0"),
    ("--retries", "-1", "--retries -1: expected a whole number from 0 to 10"),
])
def test_status_command_refuses_bad_timeouts_and_retries(option, value, message):
    from typer.testing import CliRunner

    from kistexp.cli import app

    result = CliRunner().invoke(app, ["authorities", "status", option, value])
    assert result.exit_code != 0 and isinstance(result.exception, DirectoryError)
    assert str(result.exception) == message + (" and at most 3600" if option == "--timeout" else "")
