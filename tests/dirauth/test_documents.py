"""Parsing and signature verification against the real 2022-11-19 consensus and certificates."""

from __future__ import annotations

import datetime as dt
import hashlib
import subprocess

import pytest
from conftest import have_real_tor
from cryptography.hazmat.primitives import serialization

from kistexp.dirauth import dirformat
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
from kistexp.dirauth.documents import (
    load_key_certificates,
    load_network_status,
    parse_key_certificates,
    parse_network_status,
    require_signatures,
    verify_signatures,
)
from kistexp.dirauth.keys import public_der
from kistexp.errors import DocumentError

UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def consensus_bytes(consensus_path):
    return consensus_path.read_bytes()


@pytest.fixture(scope="module")
def consensus(consensus_bytes, consensus_path):
    return parse_network_status(consensus_bytes, str(consensus_path))


@pytest.fixture(scope="module")
def certs(certs_path):
    return load_key_certificates(certs_path)


def test_real_consensus_header(consensus):
    assert consensus.flavor == "ns"
    assert consensus.vote_status == "consensus"
    assert consensus.consensus_method == 32
    assert consensus.valid_after == dt.datetime(2022, 11, 19, 10, tzinfo=UTC)
    assert consensus.fresh_until == dt.datetime(2022, 11, 19, 11, tzinfo=UTC)
    assert consensus.valid_until == dt.datetime(2022, 11, 19, 13, tzinfo=UTC)
    assert consensus.voting_delay == (300, 300)
    assert "MiddleOnly" in consensus.known_flags
    params = consensus.params_dict
    assert params["KISTSchedRunInterval"] == 2
    assert params["CircuitPriorityHalflifeMsec"] == 30000
    assert len(consensus.params) == 33
    assert dict(consensus.bandwidth_weights)["Wgg"] == 9611


def test_real_consensus_authorities_and_signatures(consensus):
    assert [a.nickname for a in consensus.authorities][:2] == ["dannenberg", "tor26"]
    assert len(consensus.authorities) == 9
    assert consensus.authorities[0].vote_digest == "73665E5C8B2ECE6978F80DB069FFE6E3C24F65C0"
    assert len(consensus.signatures) == 8
    assert {s.algorithm for s in consensus.signatures} == {"sha1"}
    # signed part runs through the space after the first "directory-signature"
    assert consensus.signed_part.endswith(b"\ndirectory-signature ")
    assert consensus.signed_part.count(b"directory-signature") == 1


def test_real_consensus_routers(consensus):
    routers = consensus.routers
    assert consensus.relay_count == len(routers) == 6088
    first = routers[0]
    assert first.nickname == "seele"
    assert first.identity == "000A10D43011EA4928A35F610405F92B4433B4DC"
    assert (first.address, first.orport, first.dirport) == ("104.53.221.159", 9001, 0)
    assert first.flags == ("Fast", "HSDir", "Running", "Stable", "V2Dir", "Valid")
    assert first.bandwidth == 270
    assert first.version == "Tor 0.4.7.10"
    assert first.published == dt.datetime(2022, 11, 19, 3, 58, 26, tzinfo=UTC)
    assert first.exit_policy == "reject 1-65535"
    calyx = routers.by_identity("0011BD2485AD45D984EC4159C88FC066E5E3300E")
    assert calyx is not None and calyx.nickname == "CalyxInstitute14" and "Exit" in calyx.flags
    assert routers.by_identity("00" * 20) is None
    assert routers[-1].nickname == "nestor00patof"
    assert sum(1 for r in routers if r.or_addresses) == 2686
    assert routers.flag_counts()["Running"] == 6088


def test_real_consensus_verifies_with_cached_certs(consensus, certs):
    check = require_signatures(consensus, certs)
    assert (check.valid, check.total, check.needed) == (8, 8, 5)
    assert all(s.status == "valid" for s in check.signatures)


def test_real_microdesc_consensus_verifies(microdesc_consensus_path, certs):
    md = load_network_status(microdesc_consensus_path)
    assert md.flavor == "microdesc" and md.relay_count == 6088
    assert md.params_dict["KISTSchedRunInterval"] == 2
    assert {s.algorithm for s in md.signatures} == {"sha256"}
    assert md.routers[0].microdesc_digest == "38hr2IZV5m/kTlVcZmroAwmemDqYVeN+5HcTprpIa2A"
    check = verify_signatures(md, certs)
    assert (check.valid, check.total, check.needed) == (8, 8, 5)


def test_one_changed_byte_breaks_every_signature(consensus_bytes, certs):
    i = consensus_bytes.index(b"r seele ") + 2
    forged = consensus_bytes[:i] + b"S" + consensus_bytes[i + 1 :]
    doc = parse_network_status(forged, "forged-consensus")
    check = verify_signatures(doc, certs)
    assert check.valid == 0 and not check.ok
    assert {s.status for s in check.signatures} == {"bad signature"}
    with pytest.raises(DocumentError, match=r"^forged-consensus: not enough valid signatures: 0/8"):
        require_signatures(doc, certs)


def test_signature_statuses(consensus, certs):
    # today's nine authorities: old tor26, old moria1 and Faravahar of 2022 are unknown
    today = verify_signatures(consensus, certs, authorities=[a.v3ident for a in DEFAULT_AUTHORITIES])
    assert today.valid == 5 and today.ok
    assert sum(s.status == "unknown authority" for s in today.signatures) == 3
    # a trusted authority whose certificate is missing
    moria_old = "D586D18309DED4CD6D57C18FDB97EFA96D330566"
    without = [c for c in certs if c.fingerprint != moria_old]
    check = verify_signatures(consensus, without, authorities=[c.fingerprint for c in certs])
    assert [s.status for s in check.signatures if s.identity == moria_old] == ["no cert for key"]
    assert check.valid == 7
    # every certificate had expired by 2026
    late = verify_signatures(consensus, certs, at=dt.datetime(2026, 1, 1, tzinfo=UTC))
    assert late.valid == 0 and {s.status for s in late.signatures} == {"expired cert"}
    # more configured authorities need more signatures: N=17 -> 9 > 8
    assert not verify_signatures(consensus, certs, n_authorities=17).ok
    assert verify_signatures(consensus, certs, n_authorities=15).needed == 8


def test_certificates_parse_and_verify(certs):
    assert len(certs) == 9
    longclaw = next(c for c in certs if c.fingerprint == "23D15D965BC35114467363C165C4F724B64B4F66")
    assert longclaw.v3ident == hashlib.sha1(longclaw.identity_key).hexdigest().upper()
    assert longclaw.signing_key_digest == "62EA5595951196DACDCE605C53DF6FE025641864"
    assert longclaw.published == dt.datetime(2022, 9, 16, 19, 14, 12, tzinfo=UTC)
    assert longclaw.expires == dt.datetime(2023, 9, 16, 19, 14, 12, tzinfo=UTC)
    assert "\r" not in longclaw.text


@pytest.mark.parametrize("item", ["dir-key-certification\r\n", "dir-key-crosscert\r\n-----BEGIN ID"])
def test_tampered_certificate_is_rejected(certs_path, item):
    text = certs_path.read_bytes().decode()
    i = text.index(item) + len(item) + 30
    c = text[i]
    bad = text[:i] + ("A" if c != "A" else "B") + text[i + 1 :]
    pattern = r"^bad-certs: certificate [0-9A-F]{40}: dir-key-(certification|crosscert) does not verify"
    with pytest.raises(DocumentError, match=pattern):
        parse_key_certificates(bad, "bad-certs")


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _replace_line(text: bytes, prefix: bytes, new: bytes) -> bytes:
    start = text.index(b"\n" + prefix) + 1
    end = text.index(b"\n", start)
    return text[:start] + new + text[end:]


MALFORMED = {
    "truncated in routers": (lambda t: t[: t.index(b"\n", len(t) // 2) + 1], "no directory-signature"),
    "truncated in a signature": (lambda t: t[:-40], "truncated|newline"),
    "missing valid-until": (lambda t: _replace_line(t, b"valid-until", b"x-unknown 1"), "missing required valid-until"),
    "duplicated known-flags": (
        lambda t: _replace_line(t, b"voting-delay", b"voting-delay 300 300\nknown-flags Running"),
        "known-flags appears twice",
    ),
    "params out of tor order": (
        lambda t: _replace_line(t, b"params", b"params KISTSchedRunInterval=2 Foo=1"),
        "params line: Foo=1 is out of order",
    ),
    "params outside int32": (
        lambda t: _replace_line(t, b"params", b"params KISTSchedRunInterval=2147483648"),
        "outside the int32 range",
    ),
    "bad time": (lambda t: _replace_line(t, b"valid-after", b"valid-after 2022-13-19 10:00:00"), "valid-after"),
    "times out of order": (
        lambda t: _replace_line(t, b"fresh-until", b"fresh-until 2022-11-19 14:00:00"),
        "times out of order",
    ),
    "CRLF line ends": (lambda t: t.replace(b"\n", b"\r\n"), "CR line ends"),
    "unsorted routers": (
        lambda t: _replace_line(t, b"r seele AAoQ", b"r seele /woQ1DAR6kkoo19hBAX5K0QztNw FF26jNpQfRpYdz65WYv+O9pFPtY "
                                b"2022-11-19 03:58:26 104.53.221.159 9001 0"),
        "not sorted by identity",
    ),
    "bad descriptor digest": (
        lambda t: t.replace(b"FF26jNpQfRpYdz65WYv+O9pFPtY", b"FF26jNpQfRpYdz65WYv+O9pFP!Y"),
        "bad descriptor digest",
    ),
    "unknown flag": (lambda t: _replace_line(t, b"s Fast HSDir", b"s Fast Wizard"), "flag Wizard not in known-flags"),
    "not a network status": (lambda t: b"hello\n", "does not start with network-status-version"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_consensus_is_rejected_with_one_line(consensus_bytes, case):
    mutate, expected = MALFORMED[case]
    with pytest.raises(DocumentError) as exc:
        parse_network_status(mutate(consensus_bytes), "http://127.0.0.1:7000/tor/status-vote/current/consensus")
    msg = _one_line(exc)
    assert msg.startswith("http://127.0.0.1:7000/tor/status-vote/current/consensus: ")
    assert any(e in msg for e in expected.split("|")), msg


def test_oversize_document_is_refused(monkeypatch, consensus_bytes):
    monkeypatch.setattr(dirformat, "MAX_DOCUMENT_BYTES", 1_000_000)
    with pytest.raises(DocumentError, match="more than the 1000000 limit"):
        parse_network_status(consensus_bytes, "big")


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(DocumentError, match=r"nope: cannot read"):
        load_network_status(tmp_path / "nope")


@pytest.mark.realtor
@pytest.mark.skipif(not have_real_tor(), reason="needs Debian's tor-gencert")
def test_tor_gencert_certificate_verifies(tmp_path):
    subprocess.run(
        ["tor-gencert", "--create-identity-key", "--passphrase-fd", "0", "-m", "12", "-a", "127.0.0.1:7000",
         "-i", str(tmp_path / "id"), "-s", str(tmp_path / "sk"), "-c", str(tmp_path / "cert")],
        input=b"\n", capture_output=True, timeout=60, check=True, cwd=tmp_path,
    )
    (cert,) = load_key_certificates(tmp_path / "cert")  # crosscert and certification checked
    assert (cert.address, cert.dirport) == ("127.0.0.1", 7000)
    assert len(cert.identity_key) > 390  # tor-gencert makes 3072-bit identity keys
    assert 360 - 32 < (cert.expires - cert.published).days <= 366
    signing = serialization.load_pem_private_key((tmp_path / "sk").read_bytes(), None)
    assert public_der(signing) == cert.signing_key


def _with_key(cert_text: str, keyword: str, n: int, e: int) -> str:
    """``cert_text`` with the RSA key after ``keyword`` replaced by the public key (n, e)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    der = rsa.RSAPublicNumbers(e, n).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    start = cert_text.index(keyword + "\n") + len(keyword) + 1
    end = cert_text.index("-----END RSA PUBLIC KEY-----\n", start) + len("-----END RSA PUBLIC KEY-----\n")
    return cert_text[:start] + dirformat.render_block("RSA PUBLIC KEY", der) + cert_text[end:]


@pytest.mark.parametrize(("keyword", "bits", "exponent", "message"), [
    ("dir-identity-key", 32768, 65537, "DER bytes is larger than the 3072-bit limit"),
    ("dir-signing-key", 16384, 65537, "DER bytes is larger than the 3072-bit limit"),
    ("dir-signing-key", 3080, 65537, "RSA key of 3080 bits is outside the allowed 1024..3072 bits"),
    ("dir-identity-key", 512, 65537, "RSA key of 512 bits is outside the allowed 1024..3072 bits"),
    ("dir-signing-key", 2048, 3, "RSA key exponent 3 is not 65537"),
    ("dir-identity-key", 3072, 2**64 + 1, "RSA key exponent of 65 bits is not 65537"),
    ("dir-identity-key", 3072, 2**3000 + 1, "RSA key of 773 DER bytes is larger than the 3072-bit limit"),
], ids=["identity-32k", "signing-16k", "signing-3080", "identity-512", "e=3", "e=2^64+1", "huge-e"])
def test_oversized_or_odd_rsa_keys_are_refused_before_any_signature_work(
        monkeypatch, certs, keyword, bits, exponent, message):
    # The real certificates: identity keys 3072 bits, signing keys 2048 or 3072, exponent 65537.
    assert {c.identity_numbers[0].bit_length() for c in certs} == {3072}
    assert {c.signing_numbers[0].bit_length() for c in certs} == {2048, 3072}
    assert {c.identity_numbers[1] for c in certs} | {c.signing_numbers[1] for c in certs} == {65537}
    import secrets

    from kistexp.dirauth import keys as keys_mod

    def no_signature_work(*args):
        raise AssertionError("a signature was checked with an out-of-bounds key")

    monkeypatch.setattr(keys_mod, "tor_verify", no_signature_work)
    n = secrets.randbits(bits) | (1 << (bits - 1)) | 1
    bad = _with_key(certs[0].text, keyword, n, exponent)
    with pytest.raises(DocumentError, match=message) as err:
        parse_key_certificates(bad, "big-certs")
    assert str(err.value).startswith("big-certs: key certificate at line 1 " + keyword)


def test_rsa_bounds_hold_in_the_primitive_too():
    from kistexp.dirauth.keys import tor_verify

    big = (1 << 16383) | 1
    assert tor_verify(big, 65537, b"\x01" * 2048, b"\0" * 20) is False
    assert tor_verify((1 << 2047) | 1, 3, b"\x01" * 256, b"\0" * 20) is False
