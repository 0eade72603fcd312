"""Property: any mutation of a vote, consensus, certificate or detached-signatures document gives a
parsed document or a one-line DocumentError, never another exception (issue 3, "Bad input")."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kistexp.dirauth.documents import (
    AuthorityIdentity,
    AuthorityKeys,
    RouterStatus,
    StatusHeader,
    dir_source_for_vote,
    parse_detached_signatures,
    parse_key_certificates,
    parse_network_status,
    render_consensus,
    render_detached_signatures,
    render_vote,
    sign_body,
    verify_signatures,
)
from kistexp.errors import DocumentError

UTC = dt.timezone.utc
VA = dt.datetime(2024, 1, 1, 12, tzinfo=UTC)
# small keys: only the parser is under test here
KEYS = AuthorityKeys.generate(published=dt.datetime(2024, 1, 1, tzinfo=UTC), identity_bits=1024, signing_bits=1024)
ROUTERS = [
    RouterStatus(f"r{i}", f"{i * 40:02X}" * 20, f"10.0.0.{i}", 9001, flags=("Fast", "Running", "Valid"),
                 bandwidth=i * 10, version="Tor 0.4.8.13", or_addresses=("[::1]:9001",) if i == 1 else ())
    for i in range(1, 4)
]
HEADER = StatusHeader.hourly(VA, params={"KISTSchedRunInterval": 2, "bwweightscale": 10000})
VOTE = render_vote(HEADER, AuthorityIdentity("auth0", "127.0.0.1", 7000, 7100), KEYS, ROUTERS)
_SOURCES = [dir_source_for_vote(parse_network_status(VOTE, "vote"))]
NS = render_consensus(HEADER, _SOURCES, ROUTERS, [KEYS])
MD = render_consensus(HEADER, _SOURCES, ROUTERS, [KEYS], flavor="microdesc")
_ns, _md = parse_network_status(NS, "ns"), parse_network_status(MD, "md")
DETACHED = render_detached_signatures(_ns, [sign_body(_ns.body, KEYS)], _md, [sign_body(_md.body, KEYS, "microdesc")])
CERT = KEYS.certificate_text

TOKENS = [" ", "\n", "x", "0", "-1", "=", "2147483648", "\r", "\x00", "é", "-----BEGIN SIGNATURE-----",
          "-----END SIGNATURE-----", "r", "s", "directory-signature", "directory-footer", "params", "AAAA",
          "2024-13-01 00:00:00", "dir-source", "dir-key-certificate-version 3"]


_ORIGINAL = {"vote": parse_network_status(VOTE, "vote"), "ns": _ns, "md": _md}
_CERT = parse_key_certificates(CERT, "cert")[0]


def _parse(kind: str, text: str) -> None:
    if kind == "cert":
        (cert,) = parse_key_certificates(text, "fuzz")
        # a certificate that parses (and so verified) has exactly the certified text it had
        assert cert.certified_digest == _CERT.certified_digest
    elif kind == "detached":
        parse_detached_signatures(text, "fuzz")
    else:
        doc = parse_network_status(text, "fuzz")
        for r in doc.routers:  # every stored field must also build
            assert r.identity
        check = verify_signatures(doc, [KEYS.certificate], n_authorities=1)
        if doc.body != _ORIGINAL[kind].body:
            # any edit inside the signed part breaks the signature
            assert check.valid == 0 and not check.ok, check.summary()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_documents(data):
    kind, original = data.draw(st.sampled_from(
        [("vote", VOTE), ("ns", NS), ("md", MD), ("detached", DETACHED), ("cert", CERT)]))
    # edits at character positions: cut a range, repeat a range, or insert a token
    text = original
    for _ in range(data.draw(st.integers(1, 3))):
        start = data.draw(st.integers(0, len(text)))
        end = min(len(text), start + data.draw(st.integers(0, 200)))
        edit = data.draw(st.sampled_from(["cut", "repeat", "insert", "truncate"]))
        if edit == "cut":
            text = text[:start] + text[end:]
        elif edit == "repeat":
            text = text[:end] + text[start:end] + text[end:]
        elif edit == "insert":
            text = text[:start] + data.draw(st.sampled_from(TOKENS)) + text[start:]
        else:
            text = text[:start]
    try:
        _parse(kind, text)
    except DocumentError as exc:
        assert str(exc).startswith("fuzz") and "\n" not in str(exc)


def test_fixtures_parse_unchanged():
    for kind, text in (("vote", VOTE), ("ns", NS), ("md", MD), ("detached", DETACHED), ("cert", CERT)):
        _parse(kind, text)
    for kind in ("vote", "ns", "md"):
        assert verify_signatures(_ORIGINAL[kind], [KEYS.certificate], n_authorities=1).valid == 1


_SAME_CLASS = {"digit": "0123456789", "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "lower": "abcdefghijklmnopqrstuvwxyz"}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_an_edit_inside_the_signed_part_fails_verification(data):
    # One character of the signed part replaced by another of its kind: most such documents
    # still parse (a nickname, a bandwidth, a base64 digest, a time), and none may verify.
    kind = data.draw(st.sampled_from(["vote", "ns", "md"]))
    original = {"vote": VOTE, "ns": NS, "md": MD}[kind]
    signed = len(_ORIGINAL[kind].body)
    i = data.draw(st.integers(0, signed - 1))
    char = original[i]
    pool = next((p for p in _SAME_CLASS.values() if char in p), None)
    new = data.draw(st.sampled_from((pool or "xZ9 ").replace(char, "")))
    text = original[:i] + new + original[i + 1:]
    try:
        doc = parse_network_status(text, "fuzz")
    except DocumentError as exc:
        assert "\n" not in str(exc)
        return
    assert doc.body != _ORIGINAL[kind].body
    check = verify_signatures(doc, [KEYS.certificate], n_authorities=1)
    # a bad signature, or a signer that is no longer one of its voters (an edited dir-source), or a
    # certificate not current at an edited valid-after: never "valid"
    assert check.valid == 0 and not check.ok, check.summary()
    assert {x.status for x in check.signatures} <= {"bad signature", "unknown authority", "expired cert"}


def test_non_ascii_in_a_router_line_is_one_line():
    line = next(x for x in VOTE.split("\n") if x.startswith("r r1 "))
    fields = line.split(" ")
    for k, message in ((2, "bad router identity"), (3, "bad descriptor digest")):
        bad = fields.copy()
        bad[k] = "é" + bad[k][1:]
        with pytest.raises(DocumentError, match=message) as err:
            parse_network_status(VOTE.replace(line, " ".join(bad)), "fuzz")
        assert "\n" not in str(err.value)
