"""Tor directory documents: parse, verify, render and sign (dir-spec §3; dirspec-params.md §5-6).

Public API (the fake authorities, the directory client and ``kistexp consensus inspect`` use these):

Parsing (``kistexp.dirauth.netstatus`` / ``kistexp.dirauth.keys``)
    ``parse_network_status(data, source) -> NetworkStatus``   votes, ns and microdesc consensuses
    ``parse_key_certificates(data, source, verify=True) -> tuple[KeyCertificate, ...]``
    ``parse_detached_signatures(data, source) -> DetachedSignatures``
    ``NetworkStatus``, ``RouterStatus``, ``Routers``, ``DirSource``, ``DocumentSignature``,
    ``KeyCertificate``, ``DetachedSignatures``

Verification
    ``verify_signatures(doc, certs, n_authorities=9, at=None, authorities=None) -> SignatureCheck``
    ``require_signatures(...)``: the same, raising DocumentError unless enough signatures are valid.
    A signature counts if its authority is known, a certificate for its signing key is current at
    ``at`` (default: the document's valid-after) and the RSA signature of the signed part verifies in
    tor's form (PKCS#1 v1.5 type-1 padding, no DigestInfo; SHA-1 for 2-argument signatures, SHA-256
    for ``sha256``). Needed: ``needed_signatures(N)`` = floor(N/2)+1 distinct authorities, N =
    configured authorities. ``SignatureCheck.summary()`` is the one-line verdict.

Rendering and signing (fake authorities)
    ``AuthorityKeys.generate(...)`` / ``.from_keys`` / ``.load_pem``: keys + certificate
    (``.certificate``, ``.certificate_text``, ``.v3ident``, ``.sign_document(body, algorithm)``)
    ``render_key_certificate(identity_key, signing_key, published, expires)``
    ``AuthorityIdentity``: nickname, address, ports and contact of an authority
    ``StatusHeader`` / ``StatusHeader.hourly(valid_after, **fields)``: times, versions, flags,
    protocols and params (kept in tor's order) of a vote or consensus
    ``RouterStatus``: one router entry (input to rendering, output of parsing)
    ``render_vote(header, authority, keys, routers) -> str``
    ``dir_source_for_vote(vote) -> DirSource``: the consensus authority section for a parsed vote
    ``render_consensus_body(header, sources, routers, flavor) -> str`` (unsigned)
    ``sign_body(body, keys, flavor) -> DocumentSignature``; ``attach_signatures(body, signatures) -> str``
    ``render_consensus(header, sources, routers, signers, flavor="ns") -> str``
    ``render_detached_signatures(ns, signatures, microdesc=None, microdesc_signatures=()) -> str``
    (each consensus parsed or as its unsigned body)
    ``add_detached_signatures(consensus_text, detached, source) -> str``: merge collected signatures

Files
    ``load_network_status(path)``, ``load_key_certificates(path)``: read + parse, errors name the path
    ``inspect_file(path, certs_path=None, n_authorities=None, at=None, trusted=None) -> StatusSummary``
    (``consensus inspect``; only the ``trusted`` identities' signatures count, default today's nine)
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
from kistexp.dirauth.dirformat import MAX_DOCUMENT_BYTES, UTC, b64_nopad_encode, format_time, is_hex40
from kistexp.dirauth.keys import (
    AuthorityKeys,
    DocumentSignature,
    KeyCertificate,
    digest_of,
    parse_key_certificates,
    render_key_certificate,
    signed_part,
    tor_verify,
)
from kistexp.dirauth.netstatus import (
    DetachedSignatures,
    DirSource,
    NetworkStatus,
    Routers,
    RouterStatus,
    body_times,
    parse_detached_signatures,
    parse_network_status,
)
from kistexp.dirauth.paramsline import format_params, sort_params
from kistexp.errors import DocumentError
from kistexp.safeio import read_bounded

__all__ = [
    "AuthorityIdentity",
    "AuthorityKeys",
    "DetachedSignatures",
    "DirSource",
    "DocumentSignature",
    "KeyCertificate",
    "NetworkStatus",
    "RouterStatus",
    "Routers",
    "SignatureCheck",
    "SignatureStatus",
    "StatusHeader",
    "StatusSummary",
    "add_detached_signatures",
    "attach_signatures",
    "dir_source_for_vote",
    "inspect_file",
    "load_key_certificates",
    "load_network_status",
    "needed_signatures",
    "parse_detached_signatures",
    "parse_key_certificates",
    "parse_network_status",
    "render_consensus",
    "render_consensus_body",
    "render_detached_signatures",
    "render_key_certificate",
    "render_vote",
    "require_signatures",
    "sign_body",
    "summarize",
    "verify_signatures",
]

# --------------------------------------------------------------------------- verification

VALID = "valid"
UNKNOWN_AUTHORITY = "unknown authority"
NO_CERT = "no cert for key"
BAD_SIGNATURE = "bad signature"
EXPIRED_CERT = "expired cert"


def needed_signatures(n_authorities: int) -> int:
    """Signatures needed to accept a consensus: more than half of the configured authorities
    (dirspec-params.md §2.1)."""
    if n_authorities < 1:
        raise DocumentError(f"number of authorities must be at least 1, not {n_authorities}")
    return n_authorities // 2 + 1


@attrs.frozen
class SignatureStatus:
    """The check of one signature: ``status`` is "valid" or the reason it does not count."""

    identity: str
    signing_key_digest: str
    algorithm: str
    status: str

    @property
    def ok(self) -> bool:
        return self.status == VALID


@attrs.frozen
class SignatureCheck:
    """Outcome of ``verify_signatures``: ``valid`` distinct authorities signed correctly out of
    ``total`` signatures; ``needed`` is floor(N/2)+1."""

    valid: int
    total: int
    needed: int
    n_authorities: int
    signatures: tuple[SignatureStatus, ...]

    @property
    def ok(self) -> bool:
        return self.valid >= self.needed

    def summary(self) -> str:
        problems: dict[str, int] = {}
        for s in self.signatures:
            if not s.ok:
                problems[s.status] = problems.get(s.status, 0) + 1
        text = f"{self.valid}/{self.total} signatures valid, {self.needed} needed (N={self.n_authorities})"
        if problems:
            text += "; " + ", ".join(f"{n} {why}" for why, n in sorted(problems.items()))
        return text


def verify_signatures(
    doc: NetworkStatus,
    certs: Iterable[KeyCertificate],
    n_authorities: int = 9,
    at: dt.datetime | None = None,
    authorities: Iterable[str] | None = None,
) -> SignatureCheck:
    """Check every ``directory-signature`` of ``doc`` against the key certificates.

    ``authorities`` are the trusted v3idents; by default every identity that has a certificate in
    ``certs``. In a consensus a signer must also be one of its dir-source voters (as in tor's
    networkstatus_check_consensus_signature). A certificate counts if ``at`` (default: the
    document's valid-after, so archived documents stay checkable; pass now for live use) lies in
    its published..expires range.
    """
    needed = needed_signatures(n_authorities)
    when = at or doc.valid_after
    by_identity: dict[str, list[KeyCertificate]] = {}
    for cert in certs:
        by_identity.setdefault(cert.fingerprint, []).append(cert)
    trusted = {a.upper() for a in authorities} if authorities is not None else set(by_identity)
    if doc.is_consensus:
        trusted &= {a.v3ident for a in doc.authorities}
    statuses = []
    valid_ids: set[str] = set()
    for sig in doc.signatures:
        status = _check_one(doc, sig, trusted, by_identity, when)
        if status == VALID:
            valid_ids.add(sig.identity)
        statuses.append(SignatureStatus(sig.identity, sig.signing_key_digest, sig.algorithm, status))
    return SignatureCheck(len(valid_ids), len(doc.signatures), needed, n_authorities, tuple(statuses))


def _check_one(
    doc: NetworkStatus,
    sig: DocumentSignature,
    trusted: set[str],
    by_identity: dict[str, list[KeyCertificate]],
    when: dt.datetime,
) -> str:
    if sig.identity not in trusted:
        return UNKNOWN_AUTHORITY
    certs = by_identity.get(sig.identity, ())
    matching = [c for c in certs if c.signing_key_digest == sig.signing_key_digest]
    if not matching:
        return NO_CERT
    current = [c for c in matching if c.is_current(when)]
    if not current:
        return EXPIRED_CERT
    digest = doc.signed_digest(sig.algorithm)
    for cert in current:
        n, e = cert.signing_numbers
        if tor_verify(n, e, sig.signature, digest):
            return VALID
    return BAD_SIGNATURE


def require_signatures(
    doc: NetworkStatus,
    certs: Iterable[KeyCertificate],
    n_authorities: int = 9,
    at: dt.datetime | None = None,
    authorities: Iterable[str] | None = None,
) -> SignatureCheck:
    """``verify_signatures``, raising DocumentError naming the source unless enough are valid."""
    check = verify_signatures(doc, certs, n_authorities, at, authorities)
    if not check.ok:
        raise DocumentError(f"{doc.source}: not enough valid signatures: {check.summary()}")
    return check


# --------------------------------------------------------------------------- rendering inputs

DEFAULT_KNOWN_FLAGS = ("Authority", "Exit", "Fast", "Guard", "HSDir", "Running", "Stable", "V2Dir", "Valid")
DEFAULT_VERSIONS = ("0.4.8.12", "0.4.8.13")
DEFAULT_CLIENT_PROTOCOLS = "Cons=2 Desc=2 Link=4-5 Microdesc=2 Relay=2"
DEFAULT_REQUIRED_PROTOCOLS = "Cons=2 Desc=2 Link=4 Microdesc=2 Relay=2"
DEFAULT_ROUTER_PROTOCOLS = "Cons=1-2 Desc=1-2 Link=1-5 Microdesc=1-2 Relay=1-4"
DEFAULT_FLAG_THRESHOLDS = (
    "stable-uptime=1000 stable-mtbf=1000 fast-speed=100000 guard-wfu=98.000% guard-tk=691200 "
    "guard-bw-inc-exits=1000 guard-bw-exc-exits=1000 enough-mtbf=1 ignoring-advertised-bws=0"
)
DEFAULT_BANDWIDTH_WEIGHTS: tuple[tuple[str, int], ...] = (
    ("Wbd", 0), ("Wbe", 0), ("Wbg", 4131), ("Wbm", 10000), ("Wdb", 10000), ("Web", 10000), ("Wed", 10000),
    ("Wee", 10000), ("Weg", 10000), ("Wem", 10000), ("Wgb", 10000), ("Wgd", 0), ("Wgg", 5869), ("Wgm", 5869),
    ("Wmb", 10000), ("Wmd", 0), ("Wme", 0), ("Wmg", 4131), ("Wmm", 10000),
)


def _utc(when: dt.datetime) -> dt.datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _params(value: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return sort_params(value)


def _valid_nickname(value: str) -> bool:
    # tor's nickname rule: 1-19 ASCII letters and digits
    return 1 <= len(value) <= 19 and value.isascii() and value.isalnum()


def _check_nickname(_instance: object, _attr: object, value: str) -> None:
    if not _valid_nickname(value):
        raise DocumentError(f"authority nickname {value!r} must be 1-19 ASCII letters or digits")


@attrs.frozen
class AuthorityIdentity:
    """How an authority names itself in its vote's ``dir-source`` and ``contact`` lines."""

    nickname: str = attrs.field(validator=_check_nickname)
    address: str
    dirport: int
    orport: int
    contact: str = "kistexp rehearsal authority"
    hostname: str = ""  # defaults to the address


@attrs.frozen
class StatusHeader:
    """Header fields of a vote or consensus. ``params`` are stored in tor's order (strcmp on
    ``key=value``, dirspec-params.md §1.1) whatever order they are given in."""

    valid_after: dt.datetime = attrs.field(converter=_utc)
    fresh_until: dt.datetime = attrs.field(converter=_utc)
    valid_until: dt.datetime = attrs.field(converter=_utc)
    params: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_params)
    voting_delay: tuple[int, int] = (300, 300)
    consensus_method: int = 33  # consensus
    consensus_methods: tuple[int, ...] = (28, 29, 30, 31, 32, 33)  # votes
    published: dt.datetime | None = None  # votes; default valid-after minus 10 minutes
    known_flags: tuple[str, ...] = DEFAULT_KNOWN_FLAGS
    client_versions: tuple[str, ...] = DEFAULT_VERSIONS
    server_versions: tuple[str, ...] = DEFAULT_VERSIONS
    recommended_client_protocols: str = DEFAULT_CLIENT_PROTOCOLS
    recommended_relay_protocols: str = DEFAULT_CLIENT_PROTOCOLS
    required_client_protocols: str = DEFAULT_REQUIRED_PROTOCOLS
    required_relay_protocols: str = DEFAULT_REQUIRED_PROTOCOLS
    flag_thresholds: str = DEFAULT_FLAG_THRESHOLDS  # votes

    @classmethod
    def hourly(cls, valid_after: dt.datetime, **kwargs: object) -> StatusHeader:
        """The live network's timing: fresh for 1 h, valid for 3 h (dirspec-params.md §2.2)."""
        va = _utc(valid_after)
        return cls(va, va + dt.timedelta(hours=1), va + dt.timedelta(hours=3), **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- rendering


def _header_lines(header: StatusHeader, flavor: str, vote: bool, flags: Iterable[str]) -> list[str]:
    first = "network-status-version 3" + ("" if flavor == "ns" else f" {flavor}")
    out = [first, f"vote-status {'vote' if vote else 'consensus'}"]
    if vote:
        published = header.published or header.valid_after - dt.timedelta(minutes=10)
        out.append("consensus-methods " + " ".join(str(m) for m in header.consensus_methods))
        out.append(f"published {format_time(published)}")
    else:
        out.append(f"consensus-method {header.consensus_method}")
    out += [
        f"valid-after {format_time(header.valid_after)}",
        f"fresh-until {format_time(header.fresh_until)}",
        f"valid-until {format_time(header.valid_until)}",
        f"voting-delay {header.voting_delay[0]} {header.voting_delay[1]}",
    ]
    if header.client_versions:
        out.append("client-versions " + ",".join(header.client_versions))
    if header.server_versions:
        out.append("server-versions " + ",".join(header.server_versions))
    out.append("known-flags " + " ".join(sorted(set(header.known_flags) | set(flags))))
    if vote and header.flag_thresholds:
        out.append(f"flag-thresholds {header.flag_thresholds}")
    out += [
        f"recommended-client-protocols {header.recommended_client_protocols}",
        f"recommended-relay-protocols {header.recommended_relay_protocols}",
        f"required-client-protocols {header.required_client_protocols}",
        f"required-relay-protocols {header.required_relay_protocols}",
    ]
    # A vote always carries the line, even empty; a consensus only when a parameter survived (§1.1).
    if vote or header.params:
        out.append(f"params {format_params(header.params)}")
    return out


def _router_lines(
    routers: Iterable[RouterStatus], flavor: str, vote: bool, header: StatusHeader
) -> list[str]:
    out: list[str] = []
    default_published = format_time(header.valid_after - dt.timedelta(hours=1))
    methods = ",".join(str(m) for m in header.consensus_methods)
    for r in sorted(routers, key=lambda r: r.identity.upper()):
        if not (_valid_nickname(r.nickname) and is_hex40(r.identity)):
            raise DocumentError(f"router {r.nickname!r} {r.identity!r}: needs a tor nickname and a 40-hex identity")
        ident = bytes.fromhex(r.identity)
        when = format_time(r.published) if r.published else default_published
        if flavor == "ns":
            dg = bytes.fromhex(r.digest) if r.digest else hashlib.sha1(b"desc" + ident).digest()
            out.append(f"r {r.nickname} {b64_nopad_encode(ident)} {b64_nopad_encode(dg)} {when} "
                       f"{r.address} {r.orport} {r.dirport}")
        else:
            out.append(f"r {r.nickname} {b64_nopad_encode(ident)} {when} {r.address} {r.orport} {r.dirport}")
        out += [f"a {a}" for a in r.or_addresses]
        md = r.microdesc_digest or b64_nopad_encode(hashlib.sha256(b"md" + ident).digest())
        if flavor == "microdesc":
            out.append(f"m {md}")
        out.append("s " + " ".join(sorted(r.flags)) if r.flags else "s")
        if r.version:
            out.append(f"v {r.version}")
        out.append(f"pr {r.protocols or DEFAULT_ROUTER_PROTOCOLS}")
        w = f"w Bandwidth={r.bandwidth if r.bandwidth is not None else 0}"
        if vote and r.measured is not None:
            w += f" Measured={r.measured}"
        if r.unmeasured and not vote:
            w += " Unmeasured=1"
        out.append(w)
        if flavor == "ns":
            out.append(f"p {r.exit_policy or 'reject 1-65535'}")
        if vote:
            out.append("id ed25519 none")
            out.append(f"m {methods} sha256={md}")
    return out


def _all_flags(routers: Sequence[RouterStatus]) -> set[str]:
    flags: set[str] = set()
    for r in routers:
        flags.update(r.flags)
    return flags


def render_vote(
    header: StatusHeader,
    authority: AuthorityIdentity,
    keys: AuthorityKeys,
    routers: Sequence[RouterStatus],
) -> str:
    """A signed vote with the authority's embedded key certificate (dirspec-params.md §6.2)."""
    routers = list(routers)
    lines = _header_lines(header, "ns", True, _all_flags(routers))
    lines.append(
        f"dir-source {authority.nickname} {keys.v3ident} {authority.hostname or authority.address} "
        f"{authority.address} {authority.dirport} {authority.orport}"
    )
    lines.append(f"contact {authority.contact}")
    body = "\n".join(lines) + "\n" + keys.certificate_text
    body += "\n".join([*_router_lines(routers, "ns", True, header), "directory-footer"]) + "\n"
    return attach_signatures(body, [keys.sign_document(body, "sha1")])


def dir_source_for_vote(vote: NetworkStatus) -> DirSource:
    """The consensus authority section for a parsed vote: its dir-source/contact plus the SHA-1 of
    its signed part as ``vote-digest``."""
    if not vote.is_vote:
        raise DocumentError(f"{vote.source}: not a vote")
    src = vote.authorities[0]
    return attrs.evolve(src, vote_digest=vote.digest)


def render_consensus_body(
    header: StatusHeader,
    sources: Sequence[DirSource],
    routers: Sequence[RouterStatus],
    flavor: str = "ns",
    bandwidth_weights: Sequence[tuple[str, int]] = DEFAULT_BANDWIDTH_WEIGHTS,
) -> str:
    """The unsigned consensus: everything before the first ``directory-signature`` line.
    Authority sections are sorted by v3ident and routers by identity, as tor does."""
    if flavor not in ("ns", "microdesc"):
        raise DocumentError(f"unknown consensus flavour {flavor!r}")
    routers = list(routers)
    lines = _header_lines(header, flavor, False, _all_flags(routers))
    for s in sorted(sources, key=lambda s: s.v3ident):
        lines.append(f"dir-source {s.nickname} {s.v3ident} {s.hostname} {s.address} {s.dirport} {s.orport}")
        if not s.legacy:
            lines.append(f"contact {s.contact}")
            lines.append(f"vote-digest {s.vote_digest}")
    lines += _router_lines(routers, flavor, False, header)
    lines.append("directory-footer")
    if bandwidth_weights:
        lines.append("bandwidth-weights " + " ".join(f"{k}={v}" for k, v in sorted(bandwidth_weights)))
    return "\n".join(lines) + "\n"


def _flavor_algorithm(flavor: str) -> str:
    return "sha1" if flavor == "ns" else "sha256"


def sign_body(body: str, keys: AuthorityKeys, flavor: str = "ns") -> DocumentSignature:
    """An authority's signature on a consensus body: SHA-1 for ns, SHA-256 for microdesc."""
    return keys.sign_document(body, _flavor_algorithm(flavor))


def attach_signatures(body: str, signatures: Iterable[DocumentSignature]) -> str:
    """Body + signature blocks, sorted by authority identity as tor emits them."""
    sigs = sorted(signatures, key=lambda s: (s.identity, s.signing_key_digest))
    if not sigs:
        raise DocumentError("a network-status document needs at least one signature")
    return body + "".join(s.render() for s in sigs)


def render_consensus(
    header: StatusHeader,
    sources: Sequence[DirSource],
    routers: Sequence[RouterStatus],
    signers: Sequence[AuthorityKeys],
    flavor: str = "ns",
    bandwidth_weights: Sequence[tuple[str, int]] = DEFAULT_BANDWIDTH_WEIGHTS,
) -> str:
    """A consensus signed by every authority in ``signers`` (dirspec-params.md §6.1)."""
    body = render_consensus_body(header, sources, routers, flavor, bandwidth_weights)
    return attach_signatures(body, [sign_body(body, k, flavor) for k in signers])


def render_detached_signatures(
    ns: NetworkStatus | str,
    signatures: Sequence[DocumentSignature],
    microdesc: NetworkStatus | str | None = None,
    microdesc_signatures: Sequence[DocumentSignature] = (),
) -> str:
    """A detached-signatures document for an ns consensus and optionally its microdesc twin
    (dirspec-params.md §6.3b). Each consensus is given parsed or as its unsigned body (what
    ``render_consensus_body`` returns and an authority holds before publication); signatures
    come from ``sign_body`` on each body."""
    ns_digest, (valid_after, fresh_until, valid_until) = _detached_subject(ns, "sha1", "ns consensus")
    out = [
        f"consensus-digest {ns_digest}",
        f"valid-after {format_time(valid_after)}",
        f"fresh-until {format_time(fresh_until)}",
        f"valid-until {format_time(valid_until)}",
    ]
    text = "\n".join(out) + "\n"
    if microdesc is not None:
        md_digest, _ = _detached_subject(microdesc, "sha256", "microdesc consensus")
        text += f"additional-digest microdesc sha256 {md_digest}\n"
        for s in sorted(microdesc_signatures, key=lambda s: s.identity):
            text += s.render("additional-signature", "microdesc ")
    for s in sorted(signatures, key=lambda s: s.identity):
        text += s.render()
    return text


def _detached_subject(
    doc: NetworkStatus | str, algorithm: str, what: str
) -> tuple[str, tuple[dt.datetime, dt.datetime, dt.datetime]]:
    """(upper-hex digest of the signed part, (valid-after, fresh-until, valid-until))."""
    if isinstance(doc, NetworkStatus):
        return doc.signed_digest(algorithm).hex().upper(), (doc.valid_after, doc.fresh_until, doc.valid_until)
    return digest_of(signed_part(doc), algorithm).hex().upper(), body_times(doc, f"unsigned {what} body")


def add_detached_signatures(consensus_text: str, detached: DetachedSignatures, source: str) -> str:
    """The consensus with the detached document's signatures for its flavour added (an authority
    collecting signatures before publication). Signatures already present are kept once."""
    doc = parse_network_status(consensus_text, source)
    if doc.flavor == "ns":
        if detached.consensus_digest != doc.digest:
            raise DocumentError(f"{detached.source}: consensus-digest does not match {source}")
        new = list(detached.signatures)
    else:
        digests = {(f, a): d for f, a, d in detached.additional_digests}
        if digests.get((doc.flavor, "sha256")) != doc.signed_digest("sha256").hex().upper():
            raise DocumentError(f"{detached.source}: additional-digest does not match {source}")
        new = [s for f, s in detached.additional_signatures if f == doc.flavor]
    merged = {(s.identity, s.algorithm): s for s in doc.signatures}
    for s in new:
        merged.setdefault((s.identity, s.algorithm), s)
    return attach_signatures(doc.body, merged.values())



# --------------------------------------------------------------------------- files and summaries


def read_document_file(path: str | Path, what: str) -> bytes:
    """A directory document file's bytes: a regular file of at most MAX_DOCUMENT_BYTES (kistexp/safeio.py)."""
    return read_bounded(path, MAX_DOCUMENT_BYTES, what, DocumentError)


def load_network_status(path: str | Path) -> NetworkStatus:
    """Read and parse a vote or consensus file; errors name the path."""
    return parse_network_status(read_document_file(path, "vote or consensus"), str(path))


def load_key_certificates(path: str | Path) -> tuple[KeyCertificate, ...]:
    """Read, parse and verify a key-certificate file (e.g. tor's ``cached-certs``)."""
    return parse_key_certificates(read_document_file(path, "key certificates"), str(path))


@attrs.frozen
class StatusSummary:
    """What ``kistexp consensus inspect`` reports about one document."""

    source: str
    flavor: str
    vote_status: str
    consensus_method: int | None
    valid_after: dt.datetime
    fresh_until: dt.datetime
    valid_until: dt.datetime
    relay_count: int
    params: dict[str, int]
    authorities: int  # dir-source entries
    signature_count: int
    signatures: SignatureCheck | None  # None when no certificates were given: nothing verified
    trusted: tuple[tuple[str, str], ...] = ()  # (nickname, v3ident) whose signatures count
    other_certificates: tuple[str, ...] = ()  # v3idents in the certificate file not trusted

    @property
    def verified(self) -> bool:
        """True only when certificates were given and enough trusted authorities signed."""
        return self.signatures is not None and self.signatures.ok


def summarize(doc: NetworkStatus, check: SignatureCheck | None = None) -> StatusSummary:
    return StatusSummary(
        source=doc.source,
        flavor=doc.flavor,
        vote_status=doc.vote_status,
        consensus_method=doc.consensus_method,
        valid_after=doc.valid_after,
        fresh_until=doc.fresh_until,
        valid_until=doc.valid_until,
        relay_count=doc.relay_count,
        params=doc.params_dict,
        authorities=len(doc.authorities),
        signature_count=len(doc.signatures),
        signatures=check,
    )


def inspect_file(
    path: str | Path,
    certs_path: str | Path | None = None,
    n_authorities: int | None = None,
    at: dt.datetime | None = None,
    trusted: Sequence[tuple[str, str]] | None = None,
) -> StatusSummary:
    """Parse a document file and, with certificates, check its signatures (not raising when too few
    are valid: the summary says so and the caller decides).

    Only signatures by the ``trusted`` (nickname, v3ident) pairs count (default: today's nine
    authorities); certificates of other identities in the file are reported, never used. A file
    that holds more identities than there are trusted authorities is refused: it can only be
    padding the check with identities nobody configured. N is the number of trusted
    authorities unless ``n_authorities`` raises it (it can never lower it).
    """
    if trusted is None:
        trusted = [(a.nickname, a.v3ident) for a in DEFAULT_AUTHORITIES]
    trusted = tuple((nick, ident.upper()) for nick, ident in trusted)
    if not trusted:
        raise DocumentError("no trusted authority identities given: nothing could be verified")
    n = len(trusted) if n_authorities is None else n_authorities
    if n < len(trusted):
        raise DocumentError(f"--n-authorities {n} is fewer than the {len(trusted)} trusted authorities; "
                            "N is at least the number of configured authorities")
    doc = load_network_status(path)
    check = None
    others: tuple[str, ...] = ()
    if certs_path is not None:
        certs = load_key_certificates(certs_path)
        idents = {c.fingerprint for c in certs}
        if len(idents) > len(trusted):
            raise DocumentError(f"{certs_path}: holds certificates for {len(idents)} identities, more than the "
                                f"{len(trusted)} trusted authorities; refusing it")
        pinned = {ident for _, ident in trusted}
        others = tuple(sorted(idents - pinned))
        check = verify_signatures(doc, [c for c in certs if c.fingerprint in pinned], n, at, pinned)
    return attrs.evolve(summarize(doc, check), trusted=trusted, other_certificates=others)
