"""Parsing of v3 network-status documents: votes, ns and microdesc consensuses, detached signatures
(dir-spec §3.4.1, §3.10; dirspec-params.md §6).

``parse_network_status(data, source)`` returns a ``NetworkStatus``. The params line is parsed with
tor's rules (``kistexp.dirauth.paramsline.parse_params``), not Stem's. Router entries are kept in
columns (one list per field) and turned into ``RouterStatus`` objects only when accessed, so the
6,088-relay consensus parses in a few tens of milliseconds. The signed part of a document runs from
its start through the space after the first ``directory-signature`` keyword.
"""

from __future__ import annotations

import binascii
import datetime as dt
import functools
import hashlib
from collections.abc import Iterator, Sequence
from typing import overload

import attrs

from kistexp.dirauth.dirformat import (
    as_text,
    b64_nopad_decode,
    b64_nopad_encode,
    is_hex40,
    parse_time,
    read_block,
)
from kistexp.dirauth.keys import DocumentSignature, KeyCertificate, parse_certificate_at
from kistexp.dirauth.paramsline import parse_params
from kistexp.errors import DocumentError

SIGNATURE_KEYWORD = "directory-signature"


@attrs.frozen
class DirSource:
    """An authority section: ``dir-source`` + ``contact`` (+ ``vote-digest`` in consensuses)."""

    nickname: str
    v3ident: str  # upper hex
    hostname: str
    address: str
    dirport: int
    orport: int
    contact: str = ""
    vote_digest: str = ""  # upper-hex SHA-1 of the vote's signed part (consensus only)
    legacy: bool = False  # "<nick>-legacy" entries carry no contact / vote-digest


@attrs.frozen
class RouterStatus:
    """One router entry of a vote or consensus (dir-spec §3.4.1 "r" ... lines).

    ``identity`` and ``digest`` are upper hex; ``microdesc_digest`` is unpadded base64 as in the
    ``m`` line. Fields a flavour does not carry are empty / None.
    """

    nickname: str
    identity: str
    address: str
    orport: int
    dirport: int = 0
    flags: tuple[str, ...] = ()
    bandwidth: int | None = None
    version: str = ""  # the "v" line without "v ", e.g. "Tor 0.4.8.13"
    published: dt.datetime | None = None
    digest: str = ""  # server descriptor digest (ns flavour and votes)
    microdesc_digest: str = ""  # microdesc flavour "m" line; in votes the sha256= of the last "m" line
    protocols: str = ""  # the "pr" line body
    exit_policy: str = ""  # the "p" line body, e.g. "reject 1-65535"
    or_addresses: tuple[str, ...] = ()  # "a" lines, e.g. "[2001:db8::1]:9001"
    unmeasured: bool = False
    measured: int | None = None  # votes only

    @property
    def fingerprint(self) -> str:
        return self.identity


class Routers(Sequence[RouterStatus]):
    """The router entries of a document, stored by column and built into RouterStatus on access."""

    __slots__ = ("_cols", "_n")

    def __init__(self, cols: dict[str, list], n: int) -> None:
        self._cols = cols
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> RouterStatus: ...

    @overload
    def __getitem__(self, index: slice) -> list[RouterStatus]: ...

    def __getitem__(self, index: int | slice) -> RouterStatus | list[RouterStatus]:
        if isinstance(index, slice):
            return [self._build(i) for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._build(index)

    def __iter__(self) -> Iterator[RouterStatus]:
        for i in range(self._n):
            yield self._build(i)

    def _build(self, i: int) -> RouterStatus:
        c = self._cols
        w = c["w"][i]
        bandwidth = unmeasured = measured = None
        if w is not None:
            bandwidth, unmeasured, measured = w
        published = c["published"][i]
        return RouterStatus(
            nickname=c["nickname"][i],
            identity=c["identity"][i].hex().upper(),
            address=c["address"][i],
            orport=c["orport"][i],
            dirport=c["dirport"][i],
            flags=c["flags"][i],
            bandwidth=bandwidth,
            version=c["version"][i],
            published=_router_time(published),
            digest=_b64_to_hex(c["digest"][i]),
            microdesc_digest=c["m"][i],
            protocols=c["pr"][i],
            exit_policy=c["p"][i],
            or_addresses=tuple(c["a"][i]),
            unmeasured=bool(unmeasured),
            measured=measured,
        )

    def by_identity(self, identity: str) -> RouterStatus | None:
        """The entry for a 40-hex identity fingerprint, or None."""
        try:
            key = bytes.fromhex(identity)
        except ValueError:
            return None
        ids = self._cols["identity"]
        # entries are sorted by identity digest (checked at parse time)
        lo, hi = 0, self._n
        while lo < hi:
            mid = (lo + hi) // 2
            if ids[mid] < key:
                lo = mid + 1
            else:
                hi = mid
        return self._build(lo) if lo < self._n and ids[lo] == key else None

    def nicknames(self) -> list[str]:
        return list(self._cols["nickname"])

    def bandwidths(self) -> list[int | None]:
        return [None if w is None else w[0] for w in self._cols["w"]]

    def flag_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for flags in self._cols["flags"]:
            for f in flags:
                counts[f] = counts.get(f, 0) + 1
        return counts


def _router_time(text: str) -> dt.datetime | None:
    return parse_time(text, "router entry") if text else None


def _b64_to_hex(text: str) -> str:
    if not text:
        return ""
    return binascii.a2b_base64(text + "=" * (-len(text) % 4)).hex().upper()


@attrs.frozen(eq=False)
class NetworkStatus:
    """A parsed vote or consensus (ns or microdesc flavour)."""

    source: str
    flavor: str  # "ns" or "microdesc"
    vote_status: str  # "vote" or "consensus"
    consensus_method: int | None  # consensus only (1 if the line is absent)
    consensus_methods: tuple[int, ...]  # votes only
    published: dt.datetime | None  # votes only
    valid_after: dt.datetime
    fresh_until: dt.datetime
    valid_until: dt.datetime
    voting_delay: tuple[int, int]
    client_versions: tuple[str, ...]
    server_versions: tuple[str, ...]
    known_flags: tuple[str, ...]
    params: tuple[tuple[str, int], ...]  # document order, tor-validated
    has_params_line: bool
    header: dict[str, str] = attrs.field(repr=False)  # every single-occurrence header line's body
    authorities: tuple[DirSource, ...] = attrs.field(repr=False)
    key_certificate: KeyCertificate | None = attrs.field(repr=False)  # votes: the embedded certificate
    routers: Routers = attrs.field(repr=False)
    bandwidth_weights: tuple[tuple[str, int], ...] = attrs.field(repr=False)
    signatures: tuple[DocumentSignature, ...] = attrs.field(repr=False)
    signed_part: bytes = attrs.field(repr=False)
    _digests: dict[str, bytes] = attrs.field(factory=dict, repr=False, alias="_digests")

    @property
    def is_vote(self) -> bool:
        return self.vote_status == "vote"

    @property
    def is_consensus(self) -> bool:
        return self.vote_status == "consensus"

    @property
    def relay_count(self) -> int:
        return len(self.routers)

    @property
    def params_dict(self) -> dict[str, int]:
        return dict(self.params)

    def signed_digest(self, algorithm: str = "sha1") -> bytes:
        """Digest of the signed part (cached): what signatures sign and vote-digest names."""
        if algorithm not in self._digests:
            try:
                self._digests[algorithm] = hashlib.new(algorithm, self.signed_part).digest()
            except ValueError:
                raise DocumentError(f"{self.source}: unknown digest algorithm {algorithm!r}") from None
        return self._digests[algorithm]

    @property
    def digest(self) -> str:
        """Upper-hex SHA-1 of the signed part (``vote-digest``, ``consensus-digest``)."""
        return self.signed_digest("sha1").hex().upper()

    @property
    def body(self) -> str:
        """The document up to (not including) its first ``directory-signature`` line."""
        return self.signed_part[: -len(SIGNATURE_KEYWORD) - 1].decode()


# Header keywords that may appear at most once (dir-spec §3.4.1); a second one rejects the document.
_SINGLE_HEADER = frozenset(
    {
        "network-status-version", "vote-status", "consensus-methods", "consensus-method", "published",
        "valid-after", "fresh-until", "valid-until", "voting-delay", "client-versions", "server-versions",
        "known-flags", "flag-thresholds", "params", "recommended-client-protocols",
        "recommended-relay-protocols", "required-client-protocols", "required-relay-protocols",
        "shared-rand-previous-value", "shared-rand-current-value", "shared-rand-participate",
        "bandwidth-file-headers", "bandwidth-file-digest",
    }
)
_REQUIRED_HEADER = ("vote-status", "valid-after", "fresh-until", "valid-until", "voting-delay", "known-flags")


def _int(text: str, where: str, lo: int = 0, hi: int = 2**31 - 1) -> int:
    if not text.isdigit() or not text.isascii():
        raise DocumentError(f"{where}: {text!r} is not a non-negative integer")
    value = int(text)
    if not lo <= value <= hi:
        raise DocumentError(f"{where}: {value} is outside [{lo}, {hi}]")
    return value


def _port(text: str, where: str) -> int:
    return _int(text, where, 0, 65535)


def _kv_ints(items: list[str], where: str) -> tuple[tuple[str, int], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out.append((key, int(value)))
        except ValueError:
            raise DocumentError(f"{where}: {item!r} is not key=integer") from None
    return tuple(out)


def parse_network_status(data: bytes | str, source: str) -> NetworkStatus:
    """Parse a vote or consensus (either flavour). Any problem tor would reject the document for
    (or a structural one) raises DocumentError with a one-line message naming ``source``."""
    raw = data if isinstance(data, bytes) else None
    text = as_text(data, source)
    if raw is None:
        raw = text.encode()
    if not text.startswith("network-status-version "):
        raise DocumentError(f"{source}: does not start with network-status-version")
    if not text.endswith("\n"):
        raise DocumentError(f"{source}: does not end with a newline (truncated?)")

    sig_at = text.find("\n" + SIGNATURE_KEYWORD + " ")
    if sig_at < 0:
        raise DocumentError(f"{source}: no {SIGNATURE_KEYWORD} line (truncated or unsigned)")
    signed_len = len(text[: sig_at + 1 + len(SIGNATURE_KEYWORD) + 1].encode()) if not text.isascii() else (
        sig_at + 1 + len(SIGNATURE_KEYWORD) + 1
    )
    footer_at = text.rfind("\ndirectory-footer\n", 0, sig_at + 1)
    routers_at = text.find("\nr ", 0, sig_at + 1)
    head_end = routers_at if routers_at >= 0 else (footer_at if footer_at >= 0 else sig_at)
    routers_end = footer_at if footer_at >= 0 else sig_at

    head_lines = text[: head_end + 1].split("\n")
    head_lines.pop()  # text before the split point ends with "\n"
    fields, authorities, cert = _parse_head(head_lines, source)

    version = fields["network-status-version"].split(" ")
    if version[0] != "3" or len(version) > 2:
        raise DocumentError(f"{source}: unsupported network-status-version {' '.join(version)!r}")
    flavor = version[1] if len(version) == 2 else "ns"
    if flavor not in ("ns", "microdesc"):
        raise DocumentError(f"{source}: unknown flavour {flavor!r}")
    vote_status = fields["vote-status"]
    if vote_status not in ("vote", "consensus"):
        raise DocumentError(f"{source}: vote-status must be vote or consensus, not {vote_status!r}")
    is_vote = vote_status == "vote"
    if is_vote and flavor != "ns":
        raise DocumentError(f"{source}: a vote cannot have the {flavor} flavour")

    consensus_method = None
    consensus_methods: tuple[int, ...] = ()
    published = None
    if is_vote:
        for kw in ("consensus-methods", "published"):
            if kw not in fields:
                raise DocumentError(f"{source}: vote without {kw} line")
        if "consensus-method" in fields:
            raise DocumentError(f"{source}: consensus-method line in a vote")
        methods = fields["consensus-methods"].split()
        consensus_methods = tuple(_int(m, f"{source}: consensus-methods") for m in methods)
        published = parse_time(fields["published"], f"{source}: published")
        if len(authorities) != 1 or cert is None:
            raise DocumentError(f"{source}: a vote needs one authority section with a key certificate")
    else:
        for kw in ("consensus-methods", "published"):
            if kw in fields:
                raise DocumentError(f"{source}: {kw} line in a consensus")
        consensus_method = _int(fields.get("consensus-method", "1"), f"{source}: consensus-method")
        if cert is not None:
            raise DocumentError(f"{source}: key certificate inside a consensus")

    valid_after, fresh_until, valid_until = _times(fields, source)
    delay = fields["voting-delay"].split(" ")
    if len(delay) != 2:
        raise DocumentError(f"{source}: voting-delay needs two numbers")
    voting_delay = (_int(delay[0], f"{source}: voting-delay"), _int(delay[1], f"{source}: voting-delay"))
    known_flags = tuple(fields["known-flags"].split())
    has_params = "params" in fields
    params = parse_params(fields.get("params", ""), f"{source}: params line")

    routers = _parse_routers(
        text, routers_at + 1 if routers_at >= 0 else routers_end + 1, routers_end + 1,
        source, flavor, is_vote, frozenset(known_flags),
    )
    footer_start = (footer_at + 1) if footer_at >= 0 else (sig_at + 1)
    weights, signatures = _parse_footer(text[footer_start:].split("\n")[:-1], source, footer_at >= 0,
                                        head_lines_count=text.count("\n", 0, footer_start))
    if consensus_method is not None and consensus_method >= 9 and footer_at < 0:
        raise DocumentError(f"{source}: consensus method {consensus_method} requires a directory-footer")
    if is_vote and weights:
        raise DocumentError(f"{source}: bandwidth-weights in a vote")

    return NetworkStatus(
        source=source,
        flavor=flavor,
        vote_status=vote_status,
        consensus_method=consensus_method,
        consensus_methods=consensus_methods,
        published=published,
        valid_after=valid_after,
        fresh_until=fresh_until,
        valid_until=valid_until,
        voting_delay=voting_delay,
        client_versions=tuple(v for v in fields.get("client-versions", "").split(",") if v),
        server_versions=tuple(v for v in fields.get("server-versions", "").split(",") if v),
        known_flags=known_flags,
        params=params,
        has_params_line=has_params,
        header=fields,
        authorities=authorities,
        key_certificate=cert,
        routers=routers,
        bandwidth_weights=weights,
        signatures=signatures,
        signed_part=raw[:signed_len],
    )


def _times(fields: dict[str, str], source: str) -> tuple[dt.datetime, dt.datetime, dt.datetime]:
    valid_after = parse_time(fields["valid-after"], f"{source}: valid-after")
    fresh_until = parse_time(fields["fresh-until"], f"{source}: fresh-until")
    valid_until = parse_time(fields["valid-until"], f"{source}: valid-until")
    if not valid_after < fresh_until <= valid_until:
        raise DocumentError(f"{source}: times out of order (need valid-after < fresh-until <= valid-until)")
    return valid_after, fresh_until, valid_until


@functools.lru_cache(maxsize=64)
def body_times(body: str, source: str) -> tuple[dt.datetime, dt.datetime, dt.datetime]:
    """valid-after, fresh-until and valid-until of an unsigned body (a document up to its first
    ``directory-signature``), read with ``parse_network_status``'s header rules (kept for the
    same body: each authority of a round renders detached signatures for the same bodies)."""
    if not body.startswith("network-status-version ") or not body.endswith("\n"):
        raise DocumentError(f"{source}: not a network-status body")
    ends = [i for i in (body.find("\nr "), body.find("\ndirectory-footer\n")) if i >= 0]
    head_end = min(ends) if ends else len(body) - 1
    fields, _, _ = _parse_head(body[: head_end + 1].split("\n")[:-1], source)
    return _times(fields, source)


def _parse_head(
    lines: list[str], source: str
) -> tuple[dict[str, str], tuple[DirSource, ...], KeyCertificate | None]:
    fields: dict[str, str] = {}
    authorities: list[DirSource] = []
    cert: KeyCertificate | None = None
    current: dict[str, str] | None = None  # the authority section being read
    sections: list[dict[str, str]] = []
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        kw, _, rest = line.partition(" ")
        where = f"{source}: line {i + 1}"
        if not kw or kw.startswith("-----"):
            raise DocumentError(f"{where}: unexpected {line[:60]!r}")
        if i == 0 and kw != "network-status-version":
            raise DocumentError(f"{where}: must be network-status-version")
        if kw == "dir-source":
            current = {"dir-source": rest, "_line": str(i + 1)}
            sections.append(current)
        elif kw == "dir-key-certificate-version":
            if current is None or cert is not None:
                raise DocumentError(f"{where}: key certificate outside an authority section")
            cert, i = parse_certificate_at(lines, i, source)
            continue
        elif current is not None:
            if kw in ("contact", "vote-digest"):
                if kw in current:
                    raise DocumentError(f"{where}: {kw} appears twice in one authority section")
                current[kw] = rest
            elif kw.startswith("shared-rand-"):
                # tor writes its shared-randomness lines after dir-source/contact in votes
                if kw in fields and kw != "shared-rand-commit":
                    raise DocumentError(f"{where}: {kw} appears twice")
                fields.setdefault(kw, rest)
            elif kw in _SINGLE_HEADER:
                raise DocumentError(f"{where}: header line {kw} after the authority section")
            # other authority-section items (legacy-dir-key, shared-rand-commit, ...) are kept unread
        elif kw in _SINGLE_HEADER:
            if kw in fields:
                raise DocumentError(f"{where}: {kw} appears twice")
            fields[kw] = rest
        i += 1
        # object blocks only follow the certificate items handled above
    for kw in ("network-status-version", *_REQUIRED_HEADER):
        if kw not in fields:
            raise DocumentError(f"{source}: missing required {kw} line")
    is_vote = fields["vote-status"] == "vote"
    for sec in sections:
        where = f"{source}: line {sec['_line']}: dir-source"
        args = sec["dir-source"].split(" ")
        if len(args) != 6:
            raise DocumentError(f"{where} needs 6 fields, has {len(args)}")
        nick, ident, host, addr, dirport, orport = args
        if not is_hex40(ident):
            raise DocumentError(f"{where}: identity {ident!r} is not 40 hex digits")
        legacy = nick.endswith("-legacy")
        if not legacy:
            if "contact" not in sec:
                raise DocumentError(f"{where} {nick} has no contact line")
            if not is_vote:
                if "vote-digest" not in sec:
                    raise DocumentError(f"{where} {nick} has no vote-digest line")
                if not is_hex40(sec["vote-digest"]):
                    raise DocumentError(f"{where} {nick}: vote-digest is not 40 hex digits")
        authorities.append(
            DirSource(nick, ident.upper(), host, addr, _port(dirport, where), _port(orport, where),
                      sec.get("contact", ""), sec.get("vote-digest", "").upper(), legacy)
        )
    if not is_vote:
        idents = [a.v3ident for a in authorities]
        if len(set(idents)) != len(idents):
            raise DocumentError(f"{source}: an authority is listed twice in dir-source lines")
    return fields, tuple(authorities), cert


def _parse_routers(
    text: str, start: int, end: int, source: str, flavor: str, is_vote: bool, known: frozenset[str]
) -> Routers:
    """Parse the router entries in text[start:end] into columns. Hot loop: avoid regexes and
    per-line object creation; flag sets and version strings are interned."""
    nickname: list[str] = []
    identity: list[bytes] = []
    digest: list[str] = []
    published: list[str] = []
    address: list[str] = []
    orport: list[int] = []
    dirport: list[int] = []
    flags: list[tuple[str, ...] | None] = []
    version: list[str] = []
    bw: list[tuple | None] = []
    mcol: list[str] = []
    prcol: list[str] = []
    pcol: list[str] = []
    acol: list[list[str]] = []
    nr = 8 if flavor == "ns" else 7  # fields on the "r" line after "r"
    flag_cache: dict[str, tuple[str, ...]] = {}
    intern: dict[str, str] = {}
    times_ok: set[str] = set()
    line_no = text.count("\n", 0, start) + 1
    lines = text[start:end].split("\n")
    lines.pop()
    count = 0
    a2b = binascii.a2b_base64
    where_at = f"{source}: line "
    for offset, line in enumerate(lines):
        c = line[:2]
        if c == "r ":
            if count and flags[-1] is None:
                raise DocumentError(f"{where_at}{line_no + offset - 1}: router {nickname[-1]} has no s line")
            parts = line.split(" ")
            if len(parts) != nr + 1:
                raise DocumentError(
                    f"{where_at}{line_no + offset}: r line has {len(parts) - 1} fields, {nr} expected"
                )
            try:
                ident = a2b(parts[2] + "=")
            except (binascii.Error, ValueError):  # ValueError: non-ASCII text
                ident = b""
            if len(ident) != 20:
                raise DocumentError(f"{where_at}{line_no + offset}: bad router identity {parts[2]!r}")
            if count and ident <= identity[-1]:
                raise DocumentError(f"{where_at}{line_no + offset}: router entries not sorted by identity")
            if nr == 8:
                dg, day, tm, ip, orp, dirp = parts[3:]
                try:
                    dg_ok = len(dg) == 27 and len(a2b(dg + "=")) == 20
                except (binascii.Error, ValueError):
                    dg_ok = False
                if not dg_ok:
                    raise DocumentError(f"{where_at}{line_no + offset}: bad descriptor digest {dg!r}")
            else:
                dg = ""
                day, tm, ip, orp, dirp = parts[3:]
            when = day + " " + tm
            if when not in times_ok:
                parse_time(when, f"{where_at}{line_no + offset}")
                times_ok.add(when)
            try:
                op = int(orp)
                dp = int(dirp)
                if not (0 <= op <= 65535 and 0 <= dp <= 65535):
                    raise ValueError
            except ValueError:
                raise DocumentError(f"{where_at}{line_no + offset}: bad ORPort/DirPort {orp} {dirp}") from None
            if ip.count(".") != 3:
                raise DocumentError(f"{where_at}{line_no + offset}: bad IPv4 address {ip!r}")
            nickname.append(parts[1])
            identity.append(ident)
            digest.append(dg)
            published.append(when)
            address.append(ip)
            orport.append(op)
            dirport.append(dp)
            flags.append(None)
            version.append("")
            bw.append(None)
            mcol.append("")
            prcol.append("")
            pcol.append("")
            acol.append([])
            count += 1
        elif not count:
            raise DocumentError(f"{where_at}{line_no + offset}: {line[:40]!r} before the first r line")
        elif c == "s " or line == "s":
            f = flag_cache.get(line)
            if f is None:
                f = tuple(line[2:].split())
                unknown = [x for x in f if x not in known]
                if unknown:
                    raise DocumentError(f"{where_at}{line_no + offset}: flag {unknown[0]} not in known-flags")
                flag_cache[line] = f
            if flags[-1] is not None:
                raise DocumentError(f"{where_at}{line_no + offset}: second s line in a router entry")
            flags[-1] = f
        elif c == "v ":
            v = line[2:]
            version[-1] = intern.setdefault(v, v)
        elif c == "pr":
            v = line[3:]
            prcol[-1] = intern.setdefault(v, v)
        elif c == "w ":
            bw[-1] = _parse_w(line, f"{where_at}{line_no + offset}")
        elif c == "p ":
            v = line[2:]
            pcol[-1] = intern.setdefault(v, v)
        elif c == "a ":
            acol[-1].append(line[2:])
        elif c == "m ":
            if flavor == "microdesc":
                mcol[-1] = line[2:]
            else:
                _, _, tail = line.rpartition("sha256=")
                mcol[-1] = tail
        elif line == "" or line.startswith("-----"):
            raise DocumentError(f"{where_at}{line_no + offset}: unexpected {line[:40]!r} in router entries")
        # other router-entry keywords (id, stats, ...) are not needed here
    if count and flags[-1] is None:
        raise DocumentError(f"{source}: router {nickname[-1]} has no s line")
    cols = {
        "nickname": nickname, "identity": identity, "digest": digest, "published": published,
        "address": address, "orport": orport, "dirport": dirport, "flags": flags, "version": version,
        "w": bw, "m": mcol, "pr": prcol, "p": pcol, "a": acol,
    }
    return Routers(cols, count)


def _parse_w(line: str, where: str) -> tuple[int | None, int, int | None]:
    bandwidth = measured = None
    unmeasured = 0
    for item in line[2:].split(" "):
        key, _, value = item.partition("=")
        try:
            if key == "Bandwidth":
                bandwidth = int(value)
            elif key == "Unmeasured":
                unmeasured = int(value)
            elif key == "Measured":
                measured = int(value)
        except ValueError:
            raise DocumentError(f"{where}: bad w item {item!r}") from None
    return bandwidth, unmeasured, measured


def _parse_footer(
    lines: list[str], source: str, has_footer: bool, head_lines_count: int
) -> tuple[tuple[tuple[str, int], ...], tuple[DocumentSignature, ...]]:
    weights: tuple[tuple[str, int], ...] = ()
    seen_weights = False
    signatures: list[DocumentSignature] = []
    i = 1 if has_footer else 0
    n = len(lines)
    while i < n:
        line = lines[i]
        where = f"{source}: line {head_lines_count + i + 1}"
        kw, _, rest = line.partition(" ")
        if kw == SIGNATURE_KEYWORD:
            args = rest.split(" ")
            if len(args) == 2:
                alg, ident, skd = "sha1", args[0], args[1]
            elif len(args) == 3:
                alg, ident, skd = args
            else:
                raise DocumentError(f"{where}: directory-signature needs 2 or 3 arguments")
            if alg not in ("sha1", "sha256"):
                raise DocumentError(f"{where}: unknown signature algorithm {alg!r}")
            if not (is_hex40(ident) and is_hex40(skd)):
                raise DocumentError(f"{where}: signature identity and key digest must be 40 hex digits")
            _, sig, i = read_block(lines, i + 1, where, ("SIGNATURE",))
            signatures.append(DocumentSignature(alg, ident.upper(), skd.upper(), sig))
            continue
        if signatures:
            raise DocumentError(f"{where}: {line[:40]!r} after the signatures")
        if kw == "bandwidth-weights":
            if seen_weights:
                raise DocumentError(f"{where}: bandwidth-weights appears twice")
            seen_weights = True
            weights = _kv_ints(rest.split(), where)
        elif kw.startswith("-----") or not kw:
            raise DocumentError(f"{where}: unexpected {line[:40]!r} in the footer")
        i += 1
    if not signatures:
        raise DocumentError(f"{source}: no {SIGNATURE_KEYWORD} (truncated or unsigned)")
    return weights, tuple(signatures)


@attrs.frozen(eq=False)
class DetachedSignatures:
    """A detached-signatures document (dir-spec §3.10; dirspec-params.md §6.3b)."""

    source: str
    consensus_digest: str  # upper-hex SHA-1 of the ns consensus signed part
    valid_after: dt.datetime
    fresh_until: dt.datetime
    valid_until: dt.datetime
    additional_digests: tuple[tuple[str, str, str], ...]  # (flavour, algorithm, upper hex)
    additional_signatures: tuple[tuple[str, DocumentSignature], ...]  # (flavour, signature)
    signatures: tuple[DocumentSignature, ...]  # ns flavour


def parse_detached_signatures(data: bytes | str, source: str) -> DetachedSignatures:
    """Parse a detached-signatures document; DocumentError naming ``source`` on any problem."""
    text = as_text(data, source)
    if not text.endswith("\n"):
        raise DocumentError(f"{source}: does not end with a newline (truncated?)")
    lines = text.split("\n")[:-1]
    fields: dict[str, str] = {}
    add_digests: list[tuple[str, str, str]] = []
    add_sigs: list[tuple[str, DocumentSignature]] = []
    sigs: list[DocumentSignature] = []
    i = 0
    while i < len(lines):
        kw, _, rest = lines[i].partition(" ")
        where = f"{source}: line {i + 1}"
        if i == 0 and kw != "consensus-digest":
            raise DocumentError(f"{where}: must start with consensus-digest")
        if kw in ("consensus-digest", "valid-after", "fresh-until", "valid-until"):
            if kw in fields:
                raise DocumentError(f"{where}: {kw} appears twice")
            fields[kw] = rest
        elif kw == "additional-digest":
            args = rest.split(" ")
            if len(args) != 3:
                raise DocumentError(f"{where}: additional-digest needs flavour, algorithm and digest")
            add_digests.append((args[0], args[1], args[2].upper()))
        elif kw in ("additional-signature", SIGNATURE_KEYWORD):
            args = rest.split(" ")
            flavor = ""
            if kw == "additional-signature":
                if len(args) != 4:
                    raise DocumentError(f"{where}: additional-signature needs 4 arguments")
                flavor, args = args[0], args[1:]
            if len(args) == 2:
                args = ["sha1", *args]
            if len(args) != 3 or args[0] not in ("sha1", "sha256") or not all(map(is_hex40, args[1:])):
                raise DocumentError(f"{where}: malformed {kw} line")
            _, sig, i = read_block(lines, i + 1, where, ("SIGNATURE",))
            entry = DocumentSignature(args[0], args[1].upper(), args[2].upper(), sig)
            if flavor:
                add_sigs.append((flavor, entry))
            else:
                sigs.append(entry)
            continue
        elif not kw or kw.startswith("-----"):
            raise DocumentError(f"{where}: unexpected {lines[i][:40]!r}")
        i += 1
    for kw in ("consensus-digest", "valid-after", "fresh-until", "valid-until"):
        if kw not in fields:
            raise DocumentError(f"{source}: missing {kw} line")
    if not is_hex40(fields["consensus-digest"]):
        raise DocumentError(f"{source}: consensus-digest is not 40 hex digits")
    return DetachedSignatures(
        source=source,
        consensus_digest=fields["consensus-digest"].upper(),
        valid_after=parse_time(fields["valid-after"], f"{source}: valid-after"),
        fresh_until=parse_time(fields["fresh-until"], f"{source}: fresh-until"),
        valid_until=parse_time(fields["valid-until"], f"{source}: valid-until"),
        additional_digests=tuple(add_digests),
        additional_signatures=tuple(add_sigs),
        signatures=tuple(sigs),
    )


def identity_b64(fingerprint: str) -> str:
    """40-hex identity -> the unpadded base64 of ``r`` lines."""
    return b64_nopad_encode(bytes.fromhex(fingerprint))


def identity_hex(b64: str, where: str = "router identity") -> str:
    """Unpadded base64 identity of an ``r`` line -> 40 upper hex."""
    return b64_nopad_decode(b64, where).hex().upper()
