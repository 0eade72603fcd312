"""The fake authorities' thin layer over kistexp's document code (kistexp.dirauth).

Everything that renders, parses, signs or verifies a document goes through here, so the
authority logic reads as tor's voting steps and the document format lives in one place.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs
from cryptography.hazmat.primitives.asymmetric import rsa

from kistexp.dirauth import dirformat, documents, netstatus, voting
from kistexp.dirauth.keys import AuthorityKeys, DocumentSignature, KeyCertificate, signed_part
from kistexp.errors import DocumentError

__all__ = ["DocumentError"]

UTC = dt.timezone.utc


def _dt(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(t), tz=UTC)


def fmt_time(t: float) -> str:
    """POSIX seconds as directory documents write times (``YYYY-MM-DD HH:MM:SS`` UTC)."""
    return dirformat.format_time(_dt(t))


def signed_digest(body: str, algorithm: str) -> bytes:
    """Digest of a body's signed part (through ``directory-signature ``, dir-spec §3.4.1)."""
    return hashlib.new(algorithm, signed_part(body)).digest()


def rogue_signing_keys(keys: AuthorityKeys) -> AuthorityKeys:
    """The same certificate with a signing key it does not certify (the "wrong key" fault)."""
    bits = keys.signing_key.key_size
    return attrs.evolve(keys, signing_key=rsa.generate_private_key(public_exponent=65537, key_size=bits))


class _Memo:
    """A small thread-safe LRU of a pure function's results by their exact input.

    Every authority of a round parses the same few documents (each vote reaches all of them,
    all of them assemble the same signed consensus) and computes the same consensus from the
    same votes: the parse or the computation is done once and its result handed to the others.
    Only a result for the identical input is reused, so nothing is assumed about what changed.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()  # outside the lock: a parse may take a while; errors are not kept
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


# A round holds one vote per authority (64 at most) and two consensus flavours.
_PARSED = _Memo(256)
_BODIES = _Memo(16)


def parse_vote(body: bytes, source: str) -> netstatus.NetworkStatus:
    """A vote, parsed once however many authorities receive these exact bytes (its ``source``
    names where it was first parsed)."""
    doc = _PARSED.get(bytes(body), lambda: netstatus.parse_network_status(body, source))
    if not doc.is_vote:
        raise DocumentError(f"{source}: not a vote")
    return doc


def voter_ident(vote: netstatus.NetworkStatus) -> str:
    ident = vote.authorities[0].v3ident
    if vote.key_certificate is None or vote.key_certificate.fingerprint != ident:
        raise DocumentError(f"{vote.source}: embedded certificate does not match dir-source {ident}")
    return ident


def check_vote_signature(vote: netstatus.NetworkStatus, cert: KeyCertificate, where: str) -> None:
    """A vote must embed its author's configured certificate and be signed by the key it
    certifies (tor's ``dirvote_add_vote``)."""
    embedded = vote.key_certificate
    if embedded is None or embedded.fingerprint != cert.fingerprint or embedded.signing_key != cert.signing_key:
        raise DocumentError(f"{where}: embedded key certificate is not the one configured for {cert.fingerprint}")
    # the same vote reaches every authority: checked once for these exact bytes and certificate
    key = ("checked", vote.signed_part, tuple((s.algorithm, s.signature) for s in vote.signatures), cert.text)
    check = _PARSED.get(key, lambda: documents.verify_signatures(vote, [cert], n_authorities=1,
                                                                authorities=[cert.fingerprint]))
    if not check.ok:
        raise DocumentError(f"{where}: signature does not verify ({check.summary()})")


@attrs.frozen
class ConsensusMeta:
    valid_after: float
    fresh_until: float
    valid_until: float
    params: tuple[tuple[str, int], ...]


def consensus_meta(text: bytes | str) -> ConsensusMeta:
    data = text.encode() if isinstance(text, str) else bytes(text)
    doc = _PARSED.get(data, lambda: netstatus.parse_network_status(data, "published consensus"))
    return ConsensusMeta(doc.valid_after.timestamp(), doc.fresh_until.timestamp(),
                         doc.valid_until.timestamp(), doc.params)


def assemble(body: str, signatures: list[DocumentSignature]) -> str:
    """A consensus body followed by its signatures, ordered by signer identity as tor does."""
    return documents.attach_signatures(body, signatures)


@attrs.frozen
class Detached:
    consensus_digest: str
    signatures: dict[str, list[DocumentSignature]]  # by flavour


def parse_detached(body: bytes, source: str) -> Detached:
    """Detached signatures, parsed once however many authorities receive these exact bytes."""
    d = _PARSED.get(("detached", bytes(body)), lambda: netstatus.parse_detached_signatures(body, source))
    sigs: dict[str, list[DocumentSignature]] = {"ns": list(d.signatures)}
    for flavour, sig in d.additional_signatures:
        sigs.setdefault(flavour, []).append(sig)
    return Detached(d.consensus_digest, sigs)


# --- rendering (kistexp.dirauth.documents) --------------------------------------------

# A few fake relays every authority votes on, so the documents look like the real thing
# (known-flags must list Running for a consensus to be computed, §2.1).
_RELAY_FLAGS = ("Fast", "Running", "Stable", "V2Dir", "Valid")


@functools.lru_cache(maxsize=8)
def fake_relays(count: int = 3) -> tuple[documents.RouterStatus, ...]:
    """The same relays every round (frozen entries, made once)."""
    out = []
    for i in range(count):
        ident = hashlib.sha1(f"kistexp fake relay {i}".encode()).hexdigest().upper()
        out.append(documents.RouterStatus(
            nickname=f"fakerelay{i}", identity=ident, address=f"127.0.1.{i + 1}", orport=9001,
            flags=(*_RELAY_FLAGS, "Guard") if i == 0 else _RELAY_FLAGS, bandwidth=1000 * (i + 1),
            version="Tor 0.4.8.13", measured=1000 * (i + 1)))
    return tuple(out)


def render_vote(keys: AuthorityKeys, *, nickname: str, address: str, dirport: int, orport: int,
                params: tuple[tuple[str, int], ...], published: float, valid_after: float,
                fresh_until: float, valid_until: float, vote_delay: int, dist_delay: int,
                malformed: bool = False) -> str:
    """This authority's signed vote (dirspec-params.md §6.2)."""
    header = documents.StatusHeader(_dt(valid_after), _dt(fresh_until), _dt(valid_until), params=params,
                                    voting_delay=(vote_delay, dist_delay), published=_dt(published))
    ident = documents.AuthorityIdentity(nickname, address, dirport, orport)
    text = documents.render_vote(header, ident, keys, list(fake_relays()))
    if malformed:
        # Mis-ordered params: tor rejects the whole vote (§1.1).
        bad = " ".join(f"{k}={v}" for k, v in reversed(params)) if len(params) > 1 else "zz=1 aa=1"
        start = text.index("\nparams") + 1
        end = text.index("\n", start)
        text = text[:start] + "params " + bad + text[end:]
    return text


def compute_consensus_bodies(votes: list[netstatus.NetworkStatus], n_authorities: int) -> dict[str, str]:
    """Unsigned ns and microdesc consensus bodies from the held votes, by tor's rules
    (params §1.3, formation and method §2.1, times: low medians).

    The bodies depend only on the votes' signed parts, taken in voter order: every authority
    holding the same votes computes them once between them."""
    votes = sorted(votes, key=lambda v: v.authorities[0].v3ident)
    key = (tuple(v.signed_part for v in votes), n_authorities)
    return dict(_BODIES.get(key, lambda: _compute_bodies(votes, n_authorities)))


def _compute_bodies(votes: list[netstatus.NetworkStatus], n_authorities: int) -> dict[str, str]:
    held = [voting.Vote(v.authorities[0].nickname, v.params, v.authorities[0].v3ident,
                        v.consensus_methods, "Running" in v.known_flags) for v in votes]
    form = voting.formation(held, n_authorities)
    if not form.can_compute:
        raise DocumentError(form.reason)

    def median_time(attr: str) -> dt.datetime:
        return _dt(voting.low_median([int(getattr(v, attr).timestamp()) for v in votes]))

    header = documents.StatusHeader(
        median_time("valid_after"), median_time("fresh_until"), median_time("valid_until"),
        params=voting.compute_consensus_params(held, n_authorities),
        voting_delay=(voting.low_median([v.voting_delay[0] for v in votes]),
                      voting.low_median([v.voting_delay[1] for v in votes])),
        consensus_method=form.consensus_method or 1,
        known_flags=tuple(sorted({f for v in votes for f in v.known_flags})),
    )
    sources = [documents.dir_source_for_vote(v) for v in votes]
    routers = _consensus_routers(votes)
    return {fl: documents.render_consensus_body(header, sources, routers, fl) for fl in ("ns", "microdesc")}


def _consensus_routers(votes: list[netstatus.NetworkStatus]) -> list[documents.RouterStatus]:
    """Routers listed by more than half of the votes, with the flags more than half of those
    listing it give (dir-spec §3.8.1, simplified: the fakes all describe the same relays)."""
    listed: dict[str, list[documents.RouterStatus]] = {}
    for v in votes:
        for r in v.routers:
            listed.setdefault(r.identity, []).append(r)
    out = []
    for entries in listed.values():
        if len(entries) * 2 <= len(votes):
            continue
        flags = sorted({f for e in entries for f in e.flags
                        if sum(f in x.flags for x in entries) * 2 > len(entries)})
        bw = voting.low_median([e.bandwidth or 0 for e in entries])
        out.append(attrs.evolve(entries[0], flags=tuple(flags), bandwidth=bw, measured=None))
    return out


def render_detached(bodies: dict[str, str], signatures: dict[str, list[DocumentSignature]]) -> str:
    """Detached signatures (§6.3b) for the pending ns + microdesc pair."""
    return documents.render_detached_signatures(bodies["ns"], signatures["ns"],
                                                bodies["microdesc"], signatures["microdesc"])


def verify_consensus(text: bytes, certs: list[KeyCertificate], n_authorities: int) -> None:
    """DocumentError unless a consensus has floor(N/2)+1 valid signatures (§2.1)."""
    documents.require_signatures(netstatus.parse_network_status(text, "consensus"), certs, n_authorities)
