"""The fake authorities' thin layer over kistexp's document code (kistexp.dirauth).

Everything that renders, parses, signs or verifies a document goes through here, so the
authority logic reads as tor's voting steps and the document format lives in one place.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import attrs
from cryptography.hazmat.primitives.asymmetric import rsa

from kistexp.dirauth import netstatus
from kistexp.dirauth.keys import AuthorityKeys, KeyCertificate, tor_verify
from kistexp.errors import DocumentError

__all__ = ["DocumentError"]

UTC = dt.timezone.utc


def _documents() -> Any:
    from kistexp.dirauth import documents

    return documents


def _dt(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(t), tz=UTC)


def signed_digest(body: str, algorithm: str, raw: bool = False) -> Any:
    """Digest of a body's signed part (through ``directory-signature ``, dir-spec §3.4.1)."""
    d = hashlib.new(algorithm, (body + "directory-signature ").encode()).digest()
    return d if raw else d.hex().upper()


def rogue_signing_keys(keys: AuthorityKeys) -> AuthorityKeys:
    """The same certificate with a signing key it does not certify (the "wrong key" fault)."""
    bits = keys.signing_key.key_size
    return attrs.evolve(keys, signing_key=rsa.generate_private_key(public_exponent=65537, key_size=bits))


def parse_vote(body: bytes, source: str) -> netstatus.NetworkStatus:
    doc = netstatus.parse_network_status(body, source)
    if not doc.is_vote:
        raise DocumentError(f"{source}: not a vote")
    return doc


def voter_ident(vote: netstatus.NetworkStatus) -> str:
    ident = vote.authorities[0].v3ident
    if vote.key_certificate is None or vote.key_certificate.fingerprint != ident:
        raise DocumentError(f"{vote.source}: embedded certificate does not match dir-source {ident}")
    return ident


def check_vote_signature(vote: netstatus.NetworkStatus, cert: KeyCertificate, where: str) -> None:
    """A vote must be signed by its author's certified signing key (tor's dirvote_add_vote)."""
    embedded = vote.key_certificate
    if embedded is None or embedded.fingerprint != cert.fingerprint or embedded.signing_key != cert.signing_key:
        raise DocumentError(f"{where}: embedded key certificate is not the one configured for {cert.fingerprint}")
    signer = cert
    for sig in vote.signatures:
        if sig.identity == signer.fingerprint and sig.signing_key_digest == signer.signing_key_digest:
            if tor_verify(*signer.signing_numbers, sig.signature, vote.signed_digest(sig.algorithm)):
                return
    raise DocumentError(f"{where}: signature does not verify")


def vote_digest(vote: netstatus.NetworkStatus) -> str:
    return vote.digest


def valid_after(doc: netstatus.NetworkStatus) -> float:
    return doc.valid_after.timestamp()


@attrs.frozen
class ConsensusMeta:
    valid_after: float
    fresh_until: float
    valid_until: float
    params: tuple[tuple[str, int], ...]


def consensus_meta(text: bytes | str) -> ConsensusMeta:
    doc = netstatus.parse_network_status(text, "published consensus")
    return ConsensusMeta(doc.valid_after.timestamp(), doc.fresh_until.timestamp(),
                         doc.valid_until.timestamp(), doc.params)


def assemble(body: str, signatures: list[Any]) -> str:
    """A consensus body followed by its signatures, ordered by signer identity as tor does."""
    return body + "".join(s.render() for s in sorted(signatures, key=lambda s: s.identity))


@attrs.frozen
class Detached:
    consensus_digest: str
    signatures: dict[str, list[Any]]  # flavour -> DocumentSignature list


def parse_detached(body: bytes, source: str) -> Detached:
    d = netstatus.parse_detached_signatures(body, source)
    sigs: dict[str, list[Any]] = {"ns": list(d.signatures)}
    for flavour, sig in d.additional_signatures:
        sigs.setdefault(flavour, []).append(sig)
    return Detached(d.consensus_digest, sigs)


# --- rendering (kistexp.dirauth.documents) --------------------------------------------


def render_vote(keys: AuthorityKeys, certificate: KeyCertificate, *, nickname: str, address: str,
                dirport: int, orport: int, params: tuple[tuple[str, int], ...], published: float,
                valid_after: float, fresh_until: float, valid_until: float, vote_delay: int,
                dist_delay: int, malformed: bool = False) -> str:
    """This authority's signed vote (dirspec-params.md §6.2)."""
    if malformed:
        # Reversed params are mis-ordered: tor rejects the whole vote (§1.1).
        params = tuple(reversed(params)) if len(params) > 1 else (("zz", 1), ("aa", 1))
    return _documents().render_vote(
        keys=keys, nickname=nickname, address=address, dirport=dirport, orport=orport,
        params=params, published=_dt(published), valid_after=_dt(valid_after),
        fresh_until=_dt(fresh_until), valid_until=_dt(valid_until),
        voting_delay=(vote_delay, dist_delay), validate=not malformed,
    )


def compute_consensus_bodies(votes: list[netstatus.NetworkStatus], n_authorities: int) -> dict[str, str]:
    """Unsigned bodies of both flavours computed from the held votes (tor's rules, §1.3, §2.1)."""
    documents = _documents()
    return {fl: documents.render_consensus(votes, n_authorities=n_authorities, flavor=fl, signatures=())
            for fl in ("ns", "microdesc")}


def render_detached(ns_body: str, md_body: str, signatures: dict[str, list[Any]]) -> str:
    return _documents().render_detached_signatures(ns_body, md_body, signatures)
