"""A hardened client for directory authorities' DirPorts (dirspec-params.md §5).

It talks to real authorities, to a local tor network or to ``fake_authorities`` (over
sockets, or in-process through an httpx transport) and never hands back a document it
has not checked:

* every request is bounded (``kistexp.directory.transport``): connect/read timeouts plus an
  overall deadline, a maximum number of body bytes read off the wire, and a decompression
  guard (``kistexp.directory.decode``: hard cap on the decoded size and tor's ratio rule, §5.2
  encodings deflate/gzip/x-zstd/x-tor-lzma);
* a ``Content-Encoding`` that does not match the body, or one that was not offered, is
  reported as a lie, not guessed around;
* a consensus is returned only if at least floor(N/2)+1 of the configured authorities
  signed it with keys certified by their certificates (§2.1); otherwise a
  DocumentError is raised and the previously accepted consensus is kept. As in tor
  (networkstatus.c ``networkstatus_check_consensus_signature``), a certificate must be
  current *now*, not at the consensus's valid-after; the consensus itself is not refused
  for being past its valid-until, since tor keeps using one for 24 h after it
  ("reasonably live", §2.2).

``authorities_status`` asks every authority for its vote and the consensus for
``kistexp authorities status``; the report itself is ``kistexp.dirauth.tally``'s.

Errors are DirectoryError / DocumentError with one line naming the authority and URL.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpcore
import httpx

from kistexp.clock import Clock, RealClock
from kistexp.dirauth import documents
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES, DirectoryAuthority, parse_nickname, parse_v3ident
from kistexp.dirauth.documents import KeyCertificate, NetworkStatus, SignatureCheck
from kistexp.dirauth.tally import AuthoritiesStatus, HeldVote, authorities_status_of
from kistexp.directory.decode import ACCEPT_ENCODINGS, decode_body
from kistexp.directory.transport import (
    MAX_RETRIES,
    Limits,
    _DeadlineTransport,
    _Retryable,
    backoff_s,
    with_retries,
)
from kistexp.errors import DirectoryError, DocumentError, KistexpError

CONSENSUS_PATHS = {
    "ns": "/tor/status-vote/current/consensus",
    "microdesc": "/tor/status-vote/current/consensus-microdesc",
}


@attrs.frozen
class Endpoint:
    """A DirPort to talk to; ``v3ident`` is empty when only host:port is known."""

    nickname: str
    host: str
    port: int
    v3ident: str = ""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def of(cls, item: DirectoryAuthority | Endpoint | tuple[str, int] | str) -> Endpoint:
        if isinstance(item, Endpoint):
            return item
        if isinstance(item, DirectoryAuthority):
            return cls(item.nickname, item.address, item.dirport, item.v3ident.upper())
        if isinstance(item, str):
            return parse_authority_spec(item)
        host, port = item
        return cls(f"{host}:{port}", str(host), int(port))


_SPEC_RE = re.compile(
    r"(?:(?P<nick>[^=]{1,40})=)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]{1,5})"
    r"(?:/(?P<ident>[^/]*))?")


def parse_authority_spec(spec: str) -> Endpoint:
    """Parse ``NICK=HOST:PORT/V3IDENT`` as given to ``--authority``.

    The v3ident pins the authority's identity, as a DirAuthority line does; without it
    (``NICK=HOST:PORT`` or ``HOST:PORT``) the server can be asked for its vote but nothing it
    serves can be verified, and it adds no trusted identity.
    """
    m = _SPEC_RE.fullmatch(spec)
    if not m or not 0 < int(m["port"]) < 65536:
        raise DirectoryError(f"--authority {spec!r}: expected NICK=HOST:PORT/V3IDENT, e.g. "
                             "moria1=127.0.0.1:7001/F533C81CEF0BC0267857C99B2F471ADF249FA232")
    host = m["host"].strip("[]")
    nick = parse_nickname(m["nick"], f"--authority {spec!r}") if m["nick"] else f"{host}:{m['port']}"
    ident = parse_v3ident(m["ident"], f"--authority {spec!r}") if m["ident"] is not None else ""
    return Endpoint(nick, host, int(m["port"]), ident)


@attrs.frozen
class Fetched:
    """One decoded response body and how it arrived."""

    endpoint: Endpoint
    url: str
    status: int
    content_encoding: str
    wire_bytes: int
    body: bytes
    headers: dict[str, str]
    elapsed_s: float


def _sleeper(clock: Clock) -> Callable[[float], None]:
    """Waits of ``seconds`` on ``clock`` (virtual time passes at once on a VirtualClock)."""
    return lambda seconds: clock.sleep_until(clock.now() + dt.timedelta(seconds=seconds))


class DirectoryClient:
    """Fetch consensuses, votes and key certificates from a list of DirPorts.

    ``authorities``: DirectoryAuthority objects (today's nine by default), Endpoints,
    ``(host, port)`` pairs or ``NICK=HOST:PORT/V3IDENT`` strings. Trust is pinned to their
    v3idents, as tor pins its DirAuthority lines: only certificates of those identities are
    kept and only their signatures count; an authority given without one adds no identity,
    and with none at all nothing can be verified. ``n_authorities`` is the N of the signature
    rule: the number of configured authorities, which it may raise but never lower.
    ``transport`` is any httpx transport (e.g. ``fake_authorities`` in-process). Each attempt
    at a request has ``timeout_s`` in total for connect, headers and body (``deadline_s``
    overrides it). Backoff between attempts is exponential with full jitter:
    U(0, min(backoff_max_s, backoff_s * 2**attempt)). ``clock`` (a ``kistexp.clock.Clock``,
    the wall clock by default) gives the "now" certificates must be current at, the request
    deadlines and the backoff waits, so a virtual clock drives all three; a bare function of
    POSIX seconds sets only the time certificates must be current at (the wall clock keeps
    the deadlines and ``sleep`` the waits).
    """

    def __init__(
        self,
        authorities: Iterable[DirectoryAuthority | Endpoint | tuple[str, int] | str] = DEFAULT_AUTHORITIES,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 10.0,
        deadline_s: float | None = None,
        retries: int = 2,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        limits: Limits | None = None,
        accept_encodings: Sequence[str] = ACCEPT_ENCODINGS,
        n_authorities: int | None = None,
        certificates: Iterable[KeyCertificate] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Clock | Callable[[], float] | None = None,
    ) -> None:
        self.endpoints: tuple[Endpoint, ...] = tuple(Endpoint.of(a) for a in authorities)
        if not self.endpoints:
            raise DirectoryError("no directory authorities given")
        if len(self.endpoints) > MAX_AUTHORITIES:
            raise DirectoryError(f"{len(self.endpoints)} directory authorities given; at most {MAX_AUTHORITIES}")
        _check_unique(self.endpoints)
        bad = [e for e in accept_encodings if e not in ACCEPT_ENCODINGS]
        if bad:
            raise DirectoryError(f"unsupported Accept-Encoding value(s): {', '.join(bad)}")
        self.accept_encodings = tuple(accept_encodings) if "identity" in accept_encodings else (
            *accept_encodings, "identity")
        self.timeout_s = _seconds(timeout_s, "--timeout")
        self.deadline_s = _seconds(deadline_s, "deadline") if deadline_s is not None else self.timeout_s
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise DirectoryError(f"--retries {retries!r}: expected a whole number from 0 to {MAX_RETRIES}")
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.limits = limits or Limits()
        configured = len(self.endpoints)
        if n_authorities is not None and not configured <= n_authorities <= MAX_AUTHORITIES:
            raise DirectoryError(f"--n-authorities {n_authorities}: N counts the configured authorities, so it "
                                 f"must be from {configured} to {MAX_AUTHORITIES}")
        self.n_authorities = n_authorities or configured
        self._rng = rng or random.Random()
        clock = RealClock() if clock is None else clock
        if isinstance(clock, Clock):
            self._clock: Callable[[], float] = clock.timestamp
            self._monotonic: Callable[[], float] = clock.monotonic
            self._sleep = sleep or _sleeper(clock)
        else:
            self._clock, self._monotonic = clock, time.monotonic
            self._sleep = sleep or time.sleep
        self._deadlines = _DeadlineTransport(self._monotonic) if transport is None else None
        self._http = httpx.Client(
            transport=transport or self._deadlines,
            timeout=httpx.Timeout(self.timeout_s),
            follow_redirects=False,
            headers={"User-Agent": "kistexp-directory-client"},
        )
        # State kept across calls; replaced only by documents that passed every check.
        self.certificates: dict[str, KeyCertificate] = {}
        self.consensus: dict[str, NetworkStatus] = {}
        if certificates is not None:
            self._adopt_certificates(certificates)

    # -- plumbing -------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DirectoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def endpoint(self, name: str) -> Endpoint:
        for e in self.endpoints:
            if e.nickname.lower() == name.lower() or (e.v3ident and e.v3ident == name.upper()):
                return e
        raise DirectoryError(f"unknown authority {name!r} (known: {', '.join(e.nickname for e in self.endpoints)})")

    def _backoff(self, attempt: int) -> None:
        self._sleep(backoff_s(self._rng, attempt, self.backoff_s, self.backoff_max_s))

    def fetch_once(self, endpoint: Endpoint, path: str, headers: dict[str, str] | None = None) -> Fetched:
        """One GET, fully bounded; raises DirectoryError naming the authority and URL."""
        url = endpoint.base_url + path
        where = f"{endpoint.nickname} {url}"
        lim = self.limits
        req_headers = {"Accept-Encoding": ", ".join(self.accept_encodings), **(headers or {})}
        start = self._monotonic()
        deadline = start + self.deadline_s
        if self._deadlines is not None:
            self._deadlines.backend.set_deadline(deadline)
        try:
            with self._http.stream("GET", url, headers=req_headers) as resp:
                status = resp.status_code
                raw_headers = resp.headers.raw
                header_bytes = sum(len(k) + len(v) + 4 for k, v in raw_headers)
                if len(raw_headers) > lim.max_headers or header_bytes > lim.max_header_bytes:
                    raise DirectoryError(f"{where}: {len(raw_headers)} response headers of {header_bytes} bytes, "
                                         f"more than the {lim.max_headers} headers / {lim.max_header_bytes} "
                                         "bytes allowed")
                resp_headers = {k.lower(): v for k, v in resp.headers.items()}
                if status == 304:
                    return Fetched(endpoint, url, 304, "", 0, b"", resp_headers, self._monotonic() - start)
                if status != 200:
                    reason = resp.reason_phrase or ""
                    cls = _Retryable if status >= 500 else DirectoryError
                    raise cls(f"{where}: HTTP {status} {reason}".rstrip())
                declared = resp_headers.get("content-encoding", "identity").strip().lower() or "identity"
                if declared not in self.accept_encodings:
                    raise DirectoryError(f"{where}: server sent Content-Encoding {declared!r}, "
                                         f"which was not offered ({', '.join(self.accept_encodings)})")
                length = resp_headers.get("content-length")
                if length is not None and _DIGITS.fullmatch(length) and int(length) > lim.max_body_bytes:
                    raise DirectoryError(f"{where}: Content-Length {length} exceeds the "
                                         f"{lim.max_body_bytes}-byte limit")
                wire = 0

                def raw() -> Iterator[bytes]:
                    nonlocal wire
                    for chunk in resp.iter_raw():
                        wire += len(chunk)
                        if wire > lim.max_body_bytes:
                            raise DirectoryError(f"{where}: body exceeds the {lim.max_body_bytes}-byte limit")
                        if self._monotonic() > deadline:
                            raise _Retryable(f"{where}: transfer exceeded the {self.deadline_s:g} s deadline")
                        yield chunk

                body = decode_body(where, declared, raw(), max_decoded_bytes=lim.max_decoded_bytes,
                                   max_ratio=lim.max_ratio, ratio_check_after_bytes=lim.ratio_check_after_bytes)
                return Fetched(endpoint, url, status, declared, wire, body, resp_headers,
                               self._monotonic() - start)
        except KistexpError:
            raise
        except (httpx.TimeoutException, httpcore.TimeoutException):
            raise _Retryable(f"{where}: timed out: no complete answer within the "
                             f"{self.deadline_s:g} s deadline") from None
        except (httpx.ConnectError, httpcore.ConnectError) as exc:
            raise _Retryable(f"{where}: cannot connect ({_short(exc)})") from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError) as exc:
            raise _Retryable(f"{where}: connection failed mid-transfer ({_short(exc)})") from None
        except (httpx.HTTPError, httpcore.ProtocolError, httpcore.NetworkError) as exc:
            raise DirectoryError(f"{where}: {type(exc).__name__}: {_short(exc)}") from None
        finally:
            if self._deadlines is not None:
                self._deadlines.backend.set_deadline(None)

    def fetch(self, endpoint: Endpoint | str, path: str, headers: dict[str, str] | None = None) -> Fetched:
        """GET from one authority, retrying transient failures with jittered backoff."""
        ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
        return with_retries(lambda: self.fetch_once(ep, path, headers), self.retries, self._backoff)

    def _from_any(self, path: str, accept: Callable[[Fetched], Any], what: str) -> Any:
        """Try authorities in random order (as tor picks one) until ``accept`` takes a body."""
        order = list(self.endpoints)
        self._rng.shuffle(order)
        problems: list[str] = []
        for ep in order:  # like tor, move straight on to another authority
            try:
                return accept(self.fetch_once(ep, path))
            except KistexpError as exc:
                problems.append(str(exc))
        # one line a person can read: a long path (nine certificate fingerprints) is shown once, clipped
        short = path if len(path) <= _PATH_SHOWN else path[:_PATH_SHOWN - 3] + "..."
        raise DirectoryError(f"no authority served {what}: " + "; ".join(p.replace(path, short) for p in problems))

    # -- key certificates ----------------------------------------------------------

    def trusted_v3idents(self) -> frozenset[str]:
        """The pinned identities: the configured authorities' v3idents, nothing else."""
        return frozenset(e.v3ident for e in self.endpoints if e.v3ident)

    def unpinned(self) -> tuple[Endpoint, ...]:
        """Configured authorities given without a v3ident: asked, never trusted."""
        return tuple(e for e in self.endpoints if not e.v3ident)

    def _require_identities(self, what: str) -> frozenset[str]:
        trusted = self.trusted_v3idents()
        if not trusted:
            raise DocumentError(f"{what}: not verified: no authority identity (v3ident) is configured, so "
                                "nothing served can be checked; give --authority NICK=HOST:PORT/V3IDENT")
        return trusted

    def _adopt_certificates(self, certs: Iterable[KeyCertificate]) -> int:
        """Keep the certificates of pinned identities; any other is useless and dropped."""
        trusted = self.trusted_v3idents()
        n = 0
        for cert in certs:
            if cert.fingerprint in trusted:
                self.certificates[cert.fingerprint] = cert
                n += 1
        return n

    def load_certificates(self, path: str | Path) -> int:
        """Take the configured authorities' key certificates from a file (e.g. tor's cached-certs);
        certificates of other identities in it are ignored."""
        p = Path(path)
        data = documents.read_document_file(p, "key certificates")
        return self._adopt_certificates(documents.parse_key_certificates(data, str(p)))

    def fetch_certificates(self) -> int:
        """Fetch the pinned authorities' key certificates (§5.1 ``/tor/keys/fp/..``).

        Any authority may serve them, as in tor: a certificate is signed by the identity key
        whose SHA-1 is the pinned v3ident, so no server can forge another's; certificates of
        identities not asked for are dropped.
        """
        known = sorted(self._require_identities("key certificates"))
        path = "/tor/keys/fp/" + "+".join(known)

        def accept(f: Fetched) -> int:
            n = self._adopt_certificates(documents.parse_key_certificates(f.body, f"{f.endpoint.nickname} {f.url}"))
            if not n:
                raise DocumentError(f"{f.endpoint.nickname} {f.url}: no certificate of a configured authority")
            return n

        return self._from_any(path, accept, "key certificates")

    # -- documents -----------------------------------------------------------------

    def verify_consensus(self, doc: NetworkStatus, where: str) -> SignatureCheck:
        """The signature check of §2.1 with certificates checked at the current time (a
        live fetch, as tor does); DocumentError unless >= floor(N/2)+1 verify."""
        trusted = self._require_identities(where)
        if not self.certificates:
            raise DocumentError(f"{where}: no authority key certificates to check the consensus against")
        now = dt.datetime.fromtimestamp(int(self._clock()), tz=dt.timezone.utc)
        check = documents.verify_signatures(doc, list(self.certificates.values()),
                                            n_authorities=self.n_authorities, at=now, authorities=trusted)
        if not check.ok:
            raise DocumentError(f"{where}: consensus rejected: {check.summary()}")
        return check

    def fetch_consensus(self, flavour: str = "microdesc", endpoint: Endpoint | str | None = None) -> NetworkStatus:
        """A verified consensus (``ns`` or ``microdesc``); kept as ``self.consensus[flavour]``.

        Without ``endpoint`` the authorities are tried in random order. A body that does
        not parse, is older than the one held, or lacks enough valid signatures is
        rejected with a clear error and the consensus held so far is kept.
        """
        return self.fetch_consensus_document(flavour, endpoint)[0]

    def fetch_consensus_document(self, flavour: str = "microdesc",
                                 endpoint: Endpoint | str | None = None) -> tuple[NetworkStatus, Fetched]:
        """``fetch_consensus`` with the response it came in (``Fetched.body``: the document's exact bytes,
        decoded), for saving the document as served."""
        check_flavour(flavour)
        self._require_identities(f"{flavour} consensus")
        if not self.certificates:
            self.fetch_certificates()
        path = CONSENSUS_PATHS[flavour]

        def accept(f: Fetched) -> tuple[NetworkStatus, Fetched]:
            where = f"{f.endpoint.nickname} {f.url}"
            doc = documents.parse_network_status(f.body, where)
            if doc.is_vote or doc.flavor != flavour:
                raise DocumentError(f"{where}: expected a {flavour} consensus, got {_describe(doc)}")
            self.verify_consensus(doc, where)
            held = self.consensus.get(flavour)
            if held is not None and doc.valid_after < held.valid_after:
                raise DocumentError(f"{where}: consensus valid-after {doc.valid_after} is older than the "
                                    f"one held ({held.valid_after})")
            self.consensus[flavour] = doc
            return doc, f

        if endpoint is not None:
            ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
            return accept(self.fetch(ep, path))
        return self._from_any(path, accept, f"a valid {flavour} consensus")

    def fetch_vote(self, endpoint: Endpoint | str, which: str = "current") -> NetworkStatus:
        """An authority's own vote (``current`` or ``next``, §5.1), parsed and checked: its
        embedded certificate must verify, belong to that authority (when its v3ident is
        known) and certify the key that signed the vote."""
        if which not in ("current", "next"):
            raise DirectoryError(f"vote must be 'current' or 'next', not {which!r}")
        ep = endpoint if isinstance(endpoint, Endpoint) else self.endpoint(endpoint)
        f = self.fetch(ep, f"/tor/status-vote/{which}/authority")
        where = f"{ep.nickname} {f.url}"
        doc = documents.parse_network_status(f.body, where)
        if not doc.is_vote:
            raise DocumentError(f"{where}: expected a vote, got {_describe(doc)}")
        cert = doc.key_certificate
        voter = doc.authorities[0].v3ident
        if ep.v3ident and voter != ep.v3ident:
            raise DocumentError(f"{where}: vote is from {voter}, not from {ep.nickname} ({ep.v3ident})")
        try:
            cert.verify()
        except DocumentError as exc:
            raise DocumentError(f"{where}: embedded key certificate: {exc}") from None
        check = documents.verify_signatures(doc, [cert], n_authorities=1, authorities=[voter])
        if not check.ok:
            raise DocumentError(f"{where}: vote signature does not verify: {check.summary()}")
        return doc

    def fetch_votes(self, which: str = "current") -> dict[str, NetworkStatus | KistexpError]:
        """Every authority's own vote; an unreachable one maps to its DirectoryError."""
        out: dict[str, NetworkStatus | KistexpError] = {}
        for ep in self.endpoints:
            try:
                out[ep.nickname] = self.fetch_vote(ep, which)
            except KistexpError as exc:
                out[ep.nickname] = exc
        return out


#: Most authorities one client asks (one request each per question): tor sets no cap on
#: DirAuthority lines; nine are live and test networks use a few, so 64 only bounds the work.
MAX_AUTHORITIES = 64
#: Longest --timeout: a whole consensus over a slow link fits well within it.
MAX_TIMEOUT_S = 3600.0
_DIGITS = re.compile(r"[0-9]{1,20}")
#: Longest URL path an error about several authorities repeats in full.
_PATH_SHOWN = 48


def check_flavour(flavour: str) -> str:
    if flavour not in CONSENSUS_PATHS:
        raise DirectoryError(f"--flavour {flavour!r}: unknown consensus flavour (ns or microdesc)")
    return flavour


def _seconds(value: float, option: str) -> float:
    try:
        ok = math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S
    except TypeError:
        ok = False
    if not ok:
        raise DirectoryError(f"{option} {value!r}: expected seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return float(value)


def _check_unique(endpoints: Sequence[Endpoint]) -> None:
    seen: dict[str, str] = {}
    for e in endpoints:
        for key in (e.nickname.lower(), e.v3ident):
            if key and key in seen:
                raise DirectoryError(f"authority {e.nickname} repeats {seen[key]}'s "
                                     f"{'v3ident' if key == e.v3ident else 'nickname'}")
            if key:
                seen[key] = e.nickname


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]


def _describe(doc: NetworkStatus) -> str:
    return f"a {doc.flavor} {doc.vote_status}"




# --- what ``kistexp authorities status`` shows ------------------------------------------


def authorities_status(client: DirectoryClient, parameters: Sequence[str] = (),
                       flavour: str = "microdesc") -> AuthoritiesStatus:
    """Each authority's current vote for ``parameters`` (all voted ones when empty), the
    verified current consensus and tor's tally of the votes (§1.3, ``kistexp.dirauth.tally``).
    An unreachable authority or a consensus that cannot be had is reported, not raised;
    ``verified`` says whether the consensus shown passed the signature check against the
    pinned identities."""
    check_flavour(flavour)
    fetched = client.fetch_votes("current")
    held = [HeldVote(ep.nickname, ep.base_url + "/tor/status-vote/current/authority", ep.v3ident,
                     fetched[ep.nickname]) for ep in client.endpoints]
    consensus = None
    consensus_error = None
    signatures = ""
    try:
        consensus = client.fetch_consensus(flavour)
        signatures = client.verify_consensus(consensus, consensus.source).summary()
    except KistexpError as exc:
        consensus_error = str(exc)
        consensus = client.consensus.get(flavour)  # an earlier verified one, if any
    return authorities_status_of(held, client.n_authorities, flavour, consensus, signatures, consensus_error,
                                 parameters)
