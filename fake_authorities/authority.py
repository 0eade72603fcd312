"""One fake v3 directory authority: its configuration, votes, pending and published consensuses.

The voting steps follow dirspec-params.md §2.2 (``dirvote_act``); the network driver
(``fake_authorities.network``) calls them at the scheduled instants and carries the uploads
over HTTP. Every method is thread-safe (the DirPort serves from other threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fake_authorities import docs
from fake_authorities.dirport import ServedConsensus
from fake_authorities.faults import Fault
from kistexp.dirauth.keys import AuthorityKeys, DocumentSignature, KeyCertificate, tor_verify
from kistexp.dirauth.netstatus import NetworkStatus
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.voting import VoteRejected, own_vote_params, signatures_needed
from kistexp.errors import KistexpError
from kistexp.jsonout import to_json

SIG_ALGORITHM = {"ns": "sha1", "microdesc": "sha256"}


@attrs.frozen
class HeldVote:
    """A vote an authority holds, with the parsed form the consensus is computed from."""

    voter: str  # v3ident
    text: bytes
    digest: str  # SHA-1 hex of the signed part (vote-digest, /d/ URLs)
    valid_after: float
    parsed: NetworkStatus


@attrs.frozen
class Published:
    """One published consensus (history entry and what the DirPort serves)."""

    flavour: str
    valid_after: float
    params: tuple[tuple[str, int], ...]
    signers: tuple[str, ...]  # nicknames
    served: ServedConsensus


class _Pending:
    """A computed consensus of one flavour and the good signatures collected for it."""

    def __init__(self, body: str) -> None:
        self.body = body
        # The ns digest names the consensus in detached signatures (consensus-digest).
        self.digest = docs.signed_digest(body, "sha1").hex().upper()
        self.signatures: dict[str, DocumentSignature] = {}  # by signer v3ident
        self._digests: dict[str, bytes] = {}

    def signed_digest(self, algorithm: str) -> bytes:
        """The digest signatures of this body cover (computed once: every upload is checked against it)."""
        if algorithm not in self._digests:
            self._digests[algorithm] = docs.signed_digest(self.body, algorithm)
        return self._digests[algorithm]


class FakeAuthority:
    """Authority state; ``network`` gives it the directory of its peers and the clock."""

    def __init__(self, nickname: str, keys: AuthorityKeys, address: str, dirport: int, orport: int,
                 peers: Callable[[], dict[str, KeyCertificate]], n_authorities: int,
                 now: Callable[[], float] = time.time) -> None:
        self.nickname = nickname
        self.keys = keys
        self.address = address
        self.dirport = dirport
        self.orport = orport
        self.n_authorities = n_authorities
        self._peers = peers  # v3ident -> certificate of every configured authority
        self._now = now
        self._lock = threading.RLock()
        self.consensus_params: tuple[str, ...] = ()  # torrc ConsensusParams lines
        self.faults: dict[str, Fault] = {}
        self._wrong_keys: AuthorityKeys | None = None
        self._stale_vote: bytes | None = None
        self.round_va: float | None = None
        self.vote_cutoff: float = 0.0
        self.own_votes: dict[str, bytes | None] = {"current": None, "next": None}
        self.held: dict[str, dict[str, HeldVote]] = {"current": {}, "next": {}}
        self.pending: dict[str, _Pending] = {}
        self.published: dict[str, Published] = {}
        self.history: list[Published] = []
        self.log: list[str] = []  # recent notices (why a vote or signature was refused, ...)

    # -- configuration ---------------------------------------------------------------

    @property
    def v3ident(self) -> str:
        return self.keys.v3ident

    def now(self) -> float:
        return self._now()

    def set_consensus_params(self, lines: Iterable[str]) -> tuple[tuple[str, int], ...]:
        """Replace ConsensusParams (torrc edit + SIGHUP); used from the next vote (§1.2).

        Raises VoteRejected for a value tor could not vote with, so the operator hears at once.
        """
        lines = tuple(line for line in lines if line.strip())
        params = own_vote_params(list(lines))
        with self._lock:
            self.consensus_params = lines
            self.note(f"ConsensusParams set to {' '.join(lines) or '(none)'}; applies from the next vote")
        return params

    def vote_params(self) -> tuple[tuple[str, int], ...]:
        return own_vote_params(list(self.consensus_params))

    def has(self, kind: str) -> bool:
        return kind in self.faults

    def set_fault(self, fault: Fault) -> None:
        with self._lock:
            self.faults[fault.kind] = fault
            if fault.kind == "stale-vote":
                self._stale_vote = self.own_votes["next"] or self.own_votes["current"]
            if fault.kind == "wrong-key" and self._wrong_keys is None:
                self._wrong_keys = docs.rogue_signing_keys(self.keys)

    def clear_fault(self, kind: str | None = None) -> None:
        with self._lock:
            for k in [kind] if kind else list(self.faults):
                self.faults.pop(k, None)
            if "stale-vote" not in self.faults:
                self._stale_vote = None

    def _signing_keys(self) -> AuthorityKeys:
        return self._wrong_keys if self.has("wrong-key") and self._wrong_keys else self.keys

    def note(self, text: str) -> None:
        """Keep a short log line (shown by the operator status) of what happened and why."""
        self.log.append(f"{time.strftime('%H:%M:%S', time.gmtime(self._now()))} {text}")
        del self.log[:-50]

    # -- voting round (§2.2) ---------------------------------------------------------

    def begin_round(self, va: float, cutoff: float) -> None:
        with self._lock:
            self.round_va = va
            self.vote_cutoff = cutoff
            self.held["next"] = {}
            self.pending = {}
            self.own_votes["next"] = None

    def make_vote(self, va: float, fu: float, vu: float, vote_delay: int, dist_delay: int) -> bytes | None:
        """Build and hold this authority's own vote; None when it does not vote this round."""
        if self.has("down"):
            return None
        with self._lock:
            if self.has("stale-vote") and self._stale_vote is not None:
                vote = self._stale_vote
            else:
                try:
                    params = self.vote_params()
                except VoteRejected as exc:
                    self.note(f"Couldn't store my own vote: {exc}")
                    return None
                text = docs.render_vote(
                    self._signing_keys(), nickname=self.nickname,
                    address=self.address, dirport=self.dirport, orport=self.orport, params=params,
                    published=self._now(), valid_after=va, fresh_until=fu, valid_until=vu,
                    vote_delay=vote_delay, dist_delay=dist_delay, malformed=self.has("malformed"),
                )
                vote = text.encode()
            self.own_votes["next"] = vote
            if not self.has("malformed") and not self.has("wrong-key"):
                self.receive_vote(vote, fetched=True)
            return vote

    def receive_vote(self, body: bytes, fetched: bool = False) -> tuple[int, str]:
        """Handle POST /tor/post/vote (and votes it fetched itself, which skip the upload
        deadline): the checks of tor's ``dirvote_add_vote``."""
        with self._lock:
            if self.has("down"):
                return 503, "Directory busy, try again later"
            if self.round_va is None:
                return 400, "Not voting right now"
            if not fetched and self._now() > self.vote_cutoff:
                return 400, "Vote arrived after the vote-fetching deadline"
            try:
                held = self._parse_vote(body)
            except KistexpError as exc:
                self.note(f"rejected vote: {exc}")
                return 400, "Couldn't parse vote"
            if held.valid_after != self.round_va:
                self.note(f"rejected vote from {held.voter}: valid-after is not the upcoming one")
                return 400, "Vote has the wrong valid-after time"
            self.held["next"][held.voter] = held
            return 200, "Vote stored"

    def _parse_vote(self, body: bytes) -> HeldVote:
        parsed = docs.parse_vote(body, f"vote posted to {self.nickname}")
        voter = docs.voter_ident(parsed)
        cert = self._peers().get(voter)
        if cert is None:
            raise docs.DocumentError(f"vote from unknown authority {voter}")
        docs.check_vote_signature(parsed, cert, f"vote from {voter}")
        return HeldVote(voter, body, parsed.digest, parsed.valid_after.timestamp(), parsed)

    def missing_voters(self) -> list[str]:
        with self._lock:
            return [ident for ident in self._peers() if ident not in self.held["next"]]

    def compute_consensus(self) -> bytes | None:
        """At VA - Dist: compute both flavours from the held votes and sign (§2.1, §2.2).

        Returns the detached signatures to upload, or None (too few votes, down, refusing).
        """
        if self.has("down"):
            return None
        with self._lock:
            votes = [h.parsed for h in self.held["next"].values()]
            try:
                bodies = docs.compute_consensus_bodies(votes, self.n_authorities)
            except KistexpError as exc:
                self.note(f"no consensus this round: {exc}")
                return None
            self.pending = {fl: _Pending(body) for fl, body in bodies.items()}
            if self.has("refuse-sign"):
                return None
            if self.v3ident not in self.held["next"]:
                # tor cannot parse a consensus signed by an authority that is not one of its
                # voters ("ID on signature ... does not match any declared directory source").
                self.note("my own vote is not among the votes held: not signing")
                return None
            keys = self._signing_keys()
            # one signature per flavour, kept and uploaded (tor's PKCS#1 v1.5 signature of a
            # body is deterministic: signing it again would give the same bytes)
            own = {fl: keys.sign_document(pend.body, SIG_ALGORITHM[fl]) for fl, pend in self.pending.items()}
            if keys is self.keys:
                for fl, sig in own.items():
                    self.pending[fl].signatures[self.v3ident] = sig
            return docs.render_detached({fl: p.body for fl, p in self.pending.items()},
                                        {fl: [sig] for fl, sig in own.items()}).encode()

    def needs_signatures(self) -> bool:
        """At VA - Dist/2: whether to fetch signatures from the others: only while a pending
        consensus lacks the signature of some configured authority (tor's
        ``dirvote_fetch_missing_signatures``: nothing to fetch once it is "signed by everybody",
        ``networkstatus_check_consensus_signature`` == 1)."""
        with self._lock:
            return any(len(p.signatures) < self.n_authorities for p in self.pending.values())

    def pending_detached_signatures(self) -> bytes | None:
        with self._lock:
            if not self.pending or self.has("down"):
                return None
            sigs = {fl: list(p.signatures.values()) for fl, p in self.pending.items()}
            if not all(sigs.values()):
                return None
            return docs.render_detached({fl: p.body for fl, p in self.pending.items()}, sigs).encode()

    def receive_signatures(self, body: bytes) -> tuple[int, str]:
        """Handle POST /tor/post/consensus-signature: keep signatures that verify (§2.2)."""
        with self._lock:
            if self.has("down"):
                return 503, "Directory busy, try again later"
            if not self.pending:
                return 400, "No pending consensus"
            try:
                detached = docs.parse_detached(body, f"signatures posted to {self.nickname}")
            except KistexpError as exc:
                self.note(f"rejected signatures: {exc}")
                return 400, "Couldn't parse signatures"
            if detached.consensus_digest != self.pending["ns"].digest:
                return 400, "Signatures are for a different consensus"
            added = 0
            for fl, sigs in detached.signatures.items():
                pend = self.pending.get(fl)
                if pend is None:
                    continue
                digest = pend.signed_digest(SIG_ALGORITHM[fl])
                for sig in sigs:
                    if sig.identity not in self.held["next"]:
                        continue  # only the consensus's own voters may sign it
                    if sig.identity in pend.signatures:
                        continue  # already a good one from this voter: tor skips it unchecked
                        # (networkstatus_add_detached_signatures)
                    cert = self._peers().get(sig.identity)
                    if cert is None or sig.signing_key_digest != cert.signing_key_digest:
                        continue
                    if tor_verify(*cert.signing_numbers, sig.signature, digest):
                        added += sig.identity not in pend.signatures
                        pend.signatures[sig.identity] = sig
            return 200, f"{added} signature(s) added"

    def publish(self, va: float, peer_names: dict[str, str]) -> bool:
        """At VA: publish each flavour that has >= floor(N/2)+1 good signatures (§2.1)."""
        with self._lock:
            self.held["current"] = self.held["next"]
            self.own_votes["current"] = self.own_votes["next"]
            self.held["next"] = {}
            self.own_votes["next"] = None
            self.round_va = None
            needed = signatures_needed(self.n_authorities)
            done = False
            for fl, pend in self.pending.items():
                if len(pend.signatures) < needed:
                    self.note(f"not publishing the {fl} consensus for {docs.fmt_time(va)}: "
                               f"{len(pend.signatures)} signatures, {needed} needed")
                    continue
                text = docs.assemble(pend.body, list(pend.signatures.values())).encode()
                meta = docs.consensus_meta(text)
                served = ServedConsensus(
                    text=text, valid_after=meta.valid_after, fresh_until=meta.fresh_until,
                    valid_until=meta.valid_until,
                    sha3_hex=docs.signed_digest(pend.body, "sha3_256").hex(),
                    signer_v3idents=tuple(sorted(pend.signatures)),
                )
                pub = Published(fl, meta.valid_after, meta.params,
                                tuple(sorted(peer_names.get(i, i) for i in pend.signatures)), served)
                self.published[fl] = pub
                self.history.append(pub)
                del self.history[:-200]
                done = True
            self.pending = {}
            return done

    # -- DirPort view ------------------------------------------------------------------

    def served_consensus(self, flavour: str) -> ServedConsensus | None:
        with self._lock:
            pub = self.published.get(flavour)
            if pub is None:
                return None
            if self.has("malformed"):
                text = pub.served.text
                return attrs.evolve(pub.served, text=text[: len(text) // 2])
            return pub.served

    def pending_consensus(self, flavour: str) -> bytes | None:
        """The consensus being signed, with the signatures collected so far (VA-Dist .. VA)."""
        with self._lock:
            pend = self.pending.get(flavour)
            if pend is None or not pend.signatures:
                return None
            return docs.assemble(pend.body, list(pend.signatures.values())).encode()

    def own_vote(self, which: str) -> bytes | None:
        with self._lock:
            if self.has("stale-vote") and self._stale_vote is not None:
                return self._stale_vote
            return self.own_votes.get(which)

    def votes_by_ident(self, which: str, idents: Iterable[str]) -> list[bytes]:
        with self._lock:
            held = self.held.get(which, {})
            return [held[i].text for i in idents if i in held]

    def votes_by_digest(self, digests: Iterable[str]) -> list[bytes]:
        with self._lock:
            all_votes = list(self.held["next"].values()) + list(self.held["current"].values())
            wanted = {d.upper() for d in digests}
            return [h.text for h in all_votes if h.digest.upper() in wanted]

    def key_certificates(self, selector: str, values: list[str]) -> list[bytes]:
        peers = self._peers()
        if selector == "authority":
            return [self.keys.certificate.text.encode()]
        if selector == "all":
            return [c.text.encode() for c in peers.values()]
        out = []
        for cert in peers.values():
            if selector == "fp" and cert.fingerprint in values:
                out.append(cert.text.encode())
            elif selector == "sk" and cert.signing_key_digest in values:
                out.append(cert.text.encode())
            elif selector == "fp-sk" and f"{cert.fingerprint}-{cert.signing_key_digest}" in values:
                out.append(cert.text.encode())
        return out

    def status(self) -> dict[str, Any]:
        with self._lock:
            try:
                vote_params = ConsensusParams(self.vote_params()).format()
            except VoteRejected as exc:
                vote_params = f"(invalid: {exc})"
            return {
                "nickname": self.nickname,
                "v3ident": self.v3ident,
                "dirport": self.dirport,
                "consensus_params": list(self.consensus_params),
                "vote_params": vote_params,
                "faults": to_json(list(self.faults.values())),
                "votes_held_next": len(self.held["next"]),
                "votes_held_current": len(self.held["current"]),
                "published": {
                    fl: {"valid_after": docs.fmt_time(p.valid_after),
                         "params": ConsensusParams(p.params).format(),
                         "signers": list(p.signers)}
                    for fl, p in self.published.items()
                },
                "log": self.log[-10:],
            }
