"""Authority keys, key certificates and tor's RSA signature form
(dir-spec §3.1; dirspec-params.md §6.3, §6.4).

tor signs a digest with the raw RSA private-key operation on the PKCS#1 v1.5 type-1 padded digest,
*without* the ASN.1 DigestInfo prefix a standard PKCS#1 signature carries, so the high-level
``cryptography`` sign/verify calls do not apply. Both directions here use the RSA numbers directly,
with GMP's modular exponentiation (gmpy2): ten times Python's ``pow`` at these sizes, which is what
lets a dry run's embedded authorities sign and check every document of a seven-week plan in seconds.

- ``tor_sign(private_key, digest)`` / ``tor_verify(n, e, signature, digest)``: the primitive.
- ``KeyCertificate``: a parsed ``dir-key-certificate-version 3`` document; ``verify()`` checks the
  identity fingerprint, the cross-certificate (signing key over the identity digest) and the
  certification (identity key over the SHA-1 of the certificate up to ``dir-key-certification\\n``).
- ``parse_key_certificates(data, source)``: one or more concatenated certificates (``/tor/keys/all``,
  ``cached-certs``; CRLF line ends accepted here only).
- ``AuthorityKeys``: an authority's identity + signing private keys and its certificate;
  ``AuthorityKeys.generate()`` makes a fresh set, ``sign_document(body, algorithm)`` signs a
  network-status body.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib

import attrs
import gmpy2
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kistexp.asciinum import ascii_port
from kistexp.clock import Clock, RealClock
from kistexp.dirauth.dirformat import (
    as_text,
    format_time,
    is_hex40,
    parse_time,
    read_block,
    render_block,
)
from kistexp.errors import DocumentError

SIGNATURE_ALGORITHMS = ("sha1", "sha256")

#: Bounds on every RSA key a certificate may hold, checked when it is parsed, before any
#: signature work (a 16,384-bit key costs seconds per check, a 32,768-bit one far more).
#: The live authorities' identity keys are 3072 bits and their signing keys 2048 or 3072
#: (tor-gencert's defaults), so 3072 is the ceiling; 1024 is the floor tor itself uses for
#: relay keys (crypto_rsa.h PK_BYTES), which small test networks use too.
MIN_RSA_BITS = 1024
MAX_RSA_BITS = 3072
#: tor generates and accepts only this public exponent (crypto_rsa.h TOR_RSA_EXPONENT,
#: crypto_pk_public_exponent_ok).
RSA_EXPONENT = 65537
_HASHES = {"sha1": hashlib.sha1, "sha256": hashlib.sha256}


def digest_of(data: bytes, algorithm: str) -> bytes:
    """The digest tor signs for a document flavour: SHA-1 (ns, votes, certs) or SHA-256."""
    try:
        return _HASHES[algorithm](data).digest()
    except KeyError:
        raise DocumentError(f"unknown signature digest algorithm {algorithm!r}") from None


def signed_part(body: str) -> bytes:
    """What a network-status signature covers: the body (the document up to its first
    ``directory-signature`` line) plus ``directory-signature `` (dir-spec §3.4.1)."""
    return (body + "directory-signature ").encode()


def _padded(digest: bytes, modulus_bytes: int) -> int:
    # PKCS#1 v1.5 type-1 block: 00 01 FF..FF 00 <digest>, no DigestInfo (tor's crypto_pk_private_sign).
    pad = modulus_bytes - 3 - len(digest)
    if pad < 8:
        raise DocumentError(
            f"RSA key of {modulus_bytes * 8} bits is too small for a {len(digest)}-byte digest"
        )
    return int.from_bytes(b"\x00\x01" + b"\xff" * pad + b"\x00" + digest, "big")


def tor_sign(private_key: rsa.RSAPrivateKey, digest: bytes) -> bytes:
    """RSA private-key operation on the type-1 padded ``digest`` (CRT), as tor signs documents."""
    nums = private_key.private_numbers()
    n = nums.public_numbers.n
    k = (n.bit_length() + 7) // 8
    m = _padded(digest, k)
    m1 = int(gmpy2.powmod(m, nums.dmp1, nums.p))
    m2 = int(gmpy2.powmod(m, nums.dmq1, nums.q))
    h = (nums.iqmp * (m1 - m2)) % nums.p
    return (m2 + h * nums.q).to_bytes(k, "big")


@functools.lru_cache(maxsize=1024)
def tor_verify(n: int, e: int, signature: bytes, digest: bytes) -> bool:
    """True if ``signature`` is tor's signature of ``digest`` under the public key (n, e).

    A key outside the bounds (MIN_RSA_BITS..MAX_RSA_BITS, exponent RSA_EXPONENT) never
    verifies, so no caller can be made to do unbounded work. The answer for the same four
    values is kept (a pure function): every authority of a round checks the same signatures."""
    if e != RSA_EXPONENT or not MIN_RSA_BITS <= n.bit_length() <= MAX_RSA_BITS:
        return False
    s = int.from_bytes(signature, "big")
    if not signature or s >= n:
        return False
    k = (n.bit_length() + 7) // 8
    try:
        return int(gmpy2.powmod(s, e, n)) == _padded(digest, k)
    except DocumentError:
        return False


def public_der(key: rsa.RSAPublicKey | rsa.RSAPrivateKey) -> bytes:
    """DER PKCS#1 RSAPublicKey, the form tor hashes for key digests."""
    if isinstance(key, rsa.RSAPrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)


def key_digest(der: bytes) -> str:
    """Upper-hex SHA-1 of a DER PKCS#1 public key: v3ident for identity keys, sk-digest for signing keys."""
    return hashlib.sha1(der).hexdigest().upper()


def _public_numbers(der: bytes, where: str) -> tuple[int, int]:
    numbers = _decoded_numbers(der)
    if numbers is None:
        raise DocumentError(f"{where}: RSA PUBLIC KEY block is not a DER RSA public key")
    if not numbers:
        raise DocumentError(f"{where}: key is not an RSA key")
    return numbers  # type: ignore[return-value]


@functools.lru_cache(maxsize=256)
def _decoded_numbers(der: bytes) -> tuple[int, int] | tuple[()] | None:
    """(n, e) of a DER public key; () if not RSA, None if not a key. Kept per key: every
    signature check of a document asks again for the same few authorities' keys."""
    try:
        key = serialization.load_der_public_key(der)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, rsa.RSAPublicKey):
        return ()
    nums = key.public_numbers()
    return nums.n, nums.e


def check_rsa_key(der: bytes, where: str) -> tuple[int, int]:
    """The key's (n, e) if it is within the bounds tor's authorities use; DocumentError if not.

    The DER length is checked first, so an oversized key is refused without being decoded."""
    if len(der) > MAX_RSA_BITS // 8 + 64:  # modulus bytes + room for the ASN.1 framing and exponent
        raise DocumentError(f"{where}: RSA key of {len(der)} DER bytes is larger than the "
                            f"{MAX_RSA_BITS}-bit limit")
    n, e = _public_numbers(der, where)
    if not MIN_RSA_BITS <= n.bit_length() <= MAX_RSA_BITS:
        raise DocumentError(f"{where}: RSA key of {n.bit_length()} bits is outside the allowed "
                            f"{MIN_RSA_BITS}..{MAX_RSA_BITS} bits")
    if e != RSA_EXPONENT:
        raise DocumentError(f"{where}: RSA key exponent {e if e < 10**12 else 'of ' + str(e.bit_length()) + ' bits'}"
                            f" is not {RSA_EXPONENT}")
    return n, e


@attrs.frozen
class DocumentSignature:
    """One ``directory-signature`` (or detached ``additional-signature``) entry.

    ``algorithm`` is ``sha1`` (the 2-argument form of ns consensuses and votes) or ``sha256``.
    """

    algorithm: str
    identity: str  # signer's v3ident, upper hex
    signing_key_digest: str  # upper hex SHA-1 of the signing key
    signature: bytes = attrs.field(repr=False)

    def render(self, keyword: str = "directory-signature", prefix: str = "") -> str:
        """The signature line and its SIGNATURE block. The sha1 form omits the algorithm
        (tor writes ``directory-signature ID SK`` for ns consensuses and votes)."""
        alg = "" if self.algorithm == "sha1" and keyword == "directory-signature" else f"{self.algorithm} "
        return (
            f"{keyword} {prefix}{alg}{self.identity} {self.signing_key_digest}\n"
            + render_block("SIGNATURE", self.signature)
        )


@attrs.frozen(eq=False)
class KeyCertificate:
    """A parsed authority key certificate (dir-spec §3.1; dirspec-params.md §6.3)."""

    fingerprint: str  # v3ident: upper-hex SHA-1 of the DER identity key
    published: dt.datetime
    expires: dt.datetime
    identity_key: bytes = attrs.field(repr=False)  # DER PKCS#1
    signing_key: bytes = attrs.field(repr=False)  # DER PKCS#1
    crosscert: bytes = attrs.field(repr=False)
    certification: bytes = attrs.field(repr=False)
    certified_digest: bytes = attrs.field(repr=False)  # SHA-1 of the text through "dir-key-certification\n"
    text: str = attrs.field(repr=False)  # the certificate, LF line ends
    address: str | None = None
    dirport: int | None = None
    source: str = ""

    @property
    def v3ident(self) -> str:
        return self.fingerprint

    @property
    def signing_key_digest(self) -> str:
        return key_digest(self.signing_key)

    @property
    def identity_numbers(self) -> tuple[int, int]:
        return _public_numbers(self.identity_key, self.source or "key certificate")

    @property
    def signing_numbers(self) -> tuple[int, int]:
        return _public_numbers(self.signing_key, self.source or "key certificate")

    def is_current(self, when: dt.datetime) -> bool:
        """True if ``when`` lies in [published, expires]."""
        return self.published <= when <= self.expires

    def verify(self) -> None:
        """Check the fingerprint, the cross-certificate and the certification; DocumentError if not."""
        where = f"{self.source or 'key certificate'}: certificate {self.fingerprint}"
        if key_digest(self.identity_key) != self.fingerprint:
            raise DocumentError(f"{where}: fingerprint is not the SHA-1 of its identity key")
        n, e = self.signing_numbers
        if not tor_verify(n, e, self.crosscert, bytes.fromhex(self.fingerprint)):
            raise DocumentError(f"{where}: dir-key-crosscert does not verify with the signing key")
        n, e = self.identity_numbers
        if not tor_verify(n, e, self.certification, self.certified_digest):
            raise DocumentError(f"{where}: dir-key-certification does not verify with the identity key")
        if self.expires <= self.published:
            raise DocumentError(f"{where}: dir-key-expires is not after dir-key-published")


_CERT_FIRST = "dir-key-certificate-version"
_CERT_SINGLE = (
    "dir-key-certificate-version",
    "dir-address",
    "fingerprint",
    "dir-key-published",
    "dir-key-expires",
    "dir-identity-key",
    "dir-signing-key",
    "dir-key-crosscert",
    "dir-key-certification",
)
_CERT_REQUIRED = tuple(k for k in _CERT_SINGLE if k != "dir-address")


def parse_certificate_at(lines: list[str], start: int, source: str) -> tuple[KeyCertificate, int]:
    """Parse one certificate starting at ``lines[start]`` (its first line); returns it and the
    index of the line after its last block. Used for cert files and the cert embedded in votes."""
    where = f"{source}: key certificate at line {start + 1}"
    first = lines[start].split(" ")
    if first[0] != _CERT_FIRST:
        raise DocumentError(f"{where}: must start with {_CERT_FIRST}")
    if first[1:] != ["3"]:
        raise DocumentError(f"{where}: unsupported {' '.join(first)!r} (only version 3)")
    seen: dict[str, list[str]] = {}
    blocks: dict[str, bytes] = {}
    i = start
    n = len(lines)
    end = None
    while i < n:
        line = lines[i]
        parts = line.split(" ")
        kw = parts[0]
        if i > start and kw == _CERT_FIRST:
            break
        if kw.startswith("-----"):
            raise DocumentError(f"{where}: unexpected object block at line {i + 1}")
        if kw in seen and kw in _CERT_SINGLE:
            raise DocumentError(f"{where}: {kw} appears twice")
        seen[kw] = parts[1:]
        i += 1
        if kw in ("dir-identity-key", "dir-signing-key"):
            _, blocks[kw], i = read_block(lines, i, f"{where} {kw}", ("RSA PUBLIC KEY",))
        elif kw == "dir-key-crosscert":
            _, blocks[kw], i = read_block(lines, i, f"{where} {kw}", ("ID SIGNATURE", "SIGNATURE"))
        elif kw == "dir-key-certification":
            certified = "\n".join(lines[start:i]) + "\n"
            _, blocks[kw], i = read_block(lines, i, f"{where} {kw}", ("SIGNATURE",))
            end = i
            break
    missing = [k for k in _CERT_REQUIRED if k not in seen]
    if missing:
        hint = " (truncated?)" if end is None else ""
        raise DocumentError(f"{where}: missing {', '.join(missing)}{hint}")
    for kw in ("dir-identity-key", "dir-signing-key"):
        check_rsa_key(blocks[kw], f"{where} {kw}")
    fp = seen["fingerprint"]
    if len(fp) != 1 or not is_hex40(fp[0]):
        raise DocumentError(f"{where}: fingerprint must be 40 hex digits")
    address = dirport = None
    if "dir-address" in seen:
        addr = seen["dir-address"]
        host, sep, port = (addr[0] if len(addr) == 1 else "").rpartition(":")
        if not sep or ascii_port(port) is None:
            raise DocumentError(f"{where}: dir-address must be IP:port")
        address, dirport = host, int(port)
    cert = KeyCertificate(
        fingerprint=fp[0].upper(),
        published=parse_time(" ".join(seen["dir-key-published"]), f"{where} dir-key-published"),
        expires=parse_time(" ".join(seen["dir-key-expires"]), f"{where} dir-key-expires"),
        identity_key=blocks["dir-identity-key"],
        signing_key=blocks["dir-signing-key"],
        crosscert=blocks["dir-key-crosscert"],
        certification=blocks["dir-key-certification"],
        certified_digest=hashlib.sha1(certified.encode()).digest(),
        text="\n".join(lines[start:end]) + "\n",
        address=address,
        dirport=dirport,
        source=source,
    )
    return cert, end  # type: ignore[return-value]


def parse_key_certificates(data: bytes | str, source: str, verify: bool = True) -> tuple[KeyCertificate, ...]:
    """Parse concatenated key certificates (``/tor/keys/...`` bodies, tor's ``cached-certs``).

    CRLF line ends are accepted (``cached-certs`` copies often carry them); the signatures cover the
    LF form. With ``verify`` each certificate's crosscert and certification are checked and a bad
    one raises DocumentError naming ``source``.
    """
    text = as_text(data, source, allow_crlf=True)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    certs: list[KeyCertificate] = []
    i = 0
    while i < len(lines):
        if lines[i] == "":
            i += 1
            continue
        if not lines[i].startswith(_CERT_FIRST + " "):
            raise DocumentError(f"{source}: line {i + 1}: expected {_CERT_FIRST}, found {lines[i][:60]!r}")
        cert, i = parse_certificate_at(lines, i, source)
        if verify:
            cert.verify()
        certs.append(cert)
    if not certs:
        raise DocumentError(f"{source}: no key certificate found")
    return tuple(certs)


def render_key_certificate(
    identity_key: rsa.RSAPrivateKey,
    signing_key: rsa.RSAPrivateKey,
    published: dt.datetime,
    expires: dt.datetime,
    address: str | None = None,
    dirport: int | None = None,
) -> str:
    """A key certificate text with a valid crosscert and certification (dirspec-params.md §6.3)."""
    identity_der = public_der(identity_key)
    fingerprint = key_digest(identity_der)
    head = f"{_CERT_FIRST} 3\n"
    if address is not None and dirport is not None:
        head += f"dir-address {address}:{dirport}\n"
    head += (
        f"fingerprint {fingerprint}\n"
        f"dir-key-published {format_time(published)}\n"
        f"dir-key-expires {format_time(expires)}\n"
        "dir-identity-key\n"
        + render_block("RSA PUBLIC KEY", identity_der)
        + "dir-signing-key\n"
        + render_block("RSA PUBLIC KEY", public_der(signing_key))
        + "dir-key-crosscert\n"
        + render_block("ID SIGNATURE", tor_sign(signing_key, bytes.fromhex(fingerprint)))
        + "dir-key-certification\n"
    )
    return head + render_block("SIGNATURE", tor_sign(identity_key, hashlib.sha1(head.encode()).digest()))


def _generate_rsa(bits: int) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


@attrs.frozen(eq=False)
class AuthorityKeys:
    """An authority's identity and signing private keys with the certificate binding them."""

    identity_key: rsa.RSAPrivateKey = attrs.field(repr=False)
    signing_key: rsa.RSAPrivateKey = attrs.field(repr=False)
    certificate: KeyCertificate

    @classmethod
    def from_keys(
        cls,
        identity_key: rsa.RSAPrivateKey,
        signing_key: rsa.RSAPrivateKey,
        published: dt.datetime,
        expires: dt.datetime,
        address: str | None = None,
        dirport: int | None = None,
    ) -> AuthorityKeys:
        """Certify ``signing_key`` with ``identity_key`` for [published, expires]."""
        text = render_key_certificate(identity_key, signing_key, published, expires, address, dirport)
        (cert,) = parse_key_certificates(text, "generated key certificate", verify=False)
        return cls(identity_key, signing_key, cert)

    @classmethod
    def generate(
        cls,
        published: dt.datetime | None = None,
        lifetime: dt.timedelta = dt.timedelta(days=365),
        address: str | None = None,
        dirport: int | None = None,
        identity_bits: int = 3072,
        signing_bits: int = 2048,
        clock: Clock | None = None,
    ) -> AuthorityKeys:
        """Fresh keys (identity 3072 bits as tor-gencert makes them, signing 2048) and certificate.

        ``published`` defaults to the clock's now (a virtual clock's in a dry run, so the
        certificate is current at the simulated time), truncated to the second.
        """
        if published is None:
            published = (clock or RealClock()).now().replace(microsecond=0)
        return cls.from_keys(
            _generate_rsa(identity_bits), _generate_rsa(signing_bits), published, published + lifetime,
            address, dirport,
        )

    @classmethod
    def load_pem(
        cls,
        identity_pem: bytes,
        signing_pem: bytes,
        certificate: str,
        source: str = "authority keys",
    ) -> AuthorityKeys:
        """Keys saved with ``identity_pem()``/``signing_pem()`` plus the certificate text."""
        try:
            ident = serialization.load_pem_private_key(identity_pem, password=None)
            sign = serialization.load_pem_private_key(signing_pem, password=None)
        except (ValueError, TypeError):
            raise DocumentError(f"{source}: not an unencrypted PEM private key") from None
        if not isinstance(ident, rsa.RSAPrivateKey) or not isinstance(sign, rsa.RSAPrivateKey):
            raise DocumentError(f"{source}: keys must be RSA")
        (cert,) = parse_key_certificates(certificate, source)
        if key_digest(public_der(ident)) != cert.fingerprint or public_der(sign) != cert.signing_key:
            raise DocumentError(f"{source}: certificate does not belong to these keys")
        return cls(ident, sign, cert)

    def identity_pem(self) -> bytes:
        return _pem(self.identity_key)

    def signing_pem(self) -> bytes:
        return _pem(self.signing_key)

    @property
    def v3ident(self) -> str:
        return self.certificate.fingerprint

    @property
    def signing_key_digest(self) -> str:
        return self.certificate.signing_key_digest

    @property
    def certificate_text(self) -> str:
        return self.certificate.text

    def sign_digest(self, digest: bytes) -> bytes:
        """Sign a raw digest with the signing key (tor's form)."""
        return tor_sign(self.signing_key, digest)

    def sign_document(self, body: str, algorithm: str = "sha1") -> DocumentSignature:
        """Sign a network-status body: ``body`` is the document up to, not including, its first
        ``directory-signature`` line; the signed part adds ``directory-signature `` (dir-spec §3.4.1)."""
        digest = digest_of(signed_part(body), algorithm)
        return DocumentSignature(algorithm, self.v3ident, self.signing_key_digest, self.sign_digest(digest))


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )

