"""A CollecTor-style consensus archive polled for new consensuses: which parameter values the
authorities published and who signed them, for adoption and exposure checks.

Layout (metrics-sources.md §3.1): ``<base>/recent/relay-descriptors/consensuses/`` lists files
named ``YYYY-MM-DD-HH-MM-SS-consensus`` (the valid-after), over http(s) as CollecTor serves it
(an HTML index) or as a local directory (``<dir>/recent/relay-descriptors/consensuses`` if it
exists, else ``<dir>`` itself). Each new document is read within the consensus-archive limits
(16 MiB), its ``@type`` annotation checked and stripped, and its signatures checked exactly as
``kistexp metrics import`` checks an archive's (``consensus_archive.verified_consensus``). Names
are only ever taken from the listing as file names: a link elsewhere is never followed.
"""

from __future__ import annotations

import collections
import datetime as dt
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import httpx

from kistexp import safeio
from kistexp.dirauth.documents import KeyCertificate
from kistexp.errors import DocumentError, KistexpError
from kistexp.metrics.collectors import MiB, httpfetch
from kistexp.metrics.collectors import consensus_archive as ca
from kistexp.metrics.collectors.httpfetch import FetchLimits
from kistexp.metrics.instruments.base import one_line, summarise
from kistexp.metrics.store import ConsensusRecord

KIND = ca.KIND
LISTING = "recent/relay-descriptors/consensuses"
_NAME = re.compile(r"(\d{4})-(\d\d)-(\d\d)-(\d\d)-(\d\d)-(\d\d)-consensus")
_HREF = re.compile(rb"""href\s*=\s*["']?([^"'\s>]{1,300})""", re.I)


@attrs.frozen
class ArchiveLimits:
    timeout_s: float = 60.0  # one attempt at one document (2.4 MB) or the listing
    retries: int = 2
    backoff_s: float = 1.0
    backoff_max_s: float = 8.0
    poll_s: float = 300.0  # the whole poll: listing, every document, attempt and wait
    max_listing_bytes: int = 1 * MiB  # CollecTor lists 72 h of hourly consensuses: about 10 KB of HTML
    max_entries: int = 10_000
    max_per_poll: int = 4  # documents read per poll; more wait for the next (oldest first)
    lookback: dt.timedelta = dt.timedelta(hours=3)  # at the first poll, consensuses this old are read
    keep: dt.timedelta = dt.timedelta(days=4)  # names remembered (CollecTor keeps 72 h in recent/)
    documents: ca.Limits = ca.Limits()  # 16 MiB per document


@attrs.frozen
class ArchivedConsensus:
    """A new, verified consensus: its valid-after, params and the authorities whose signatures
    verified (v3idents, and their dir-source nicknames)."""

    valid_after: dt.datetime
    params: Mapping[str, int] = attrs.field(hash=False)
    signers: tuple[str, ...] = ()
    signer_nicknames: tuple[str, ...] = ()
    record: ConsensusRecord | None = attrs.field(default=None, hash=False)  # for MetricStore.save_consensus
    # the relays' tor versions from the consensus's "v" lines (what their descriptors say), with counts:
    # which of them run a param's value as given and which clamp it or do not read it (exposure checks)
    versions: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class ArchiveReading:
    """What one poll of an archive got: new verified consensuses (oldest first), or why not."""

    instrument: str
    kind: str
    at: dt.datetime
    consensuses: tuple[ArchivedConsensus, ...] = ()
    problem: str = ""
    pending: int = 0  # listed, new, left for the next poll by ``max_per_poll``

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def samples(self) -> tuple:
        """None: consensuses are not metric samples (so a caller treating this as a Reading stores nothing)."""
        return ()


def _valid_after(name: str) -> dt.datetime | None:
    m = _NAME.fullmatch(name)
    if not m:
        return None
    try:
        return dt.datetime(*(int(g) for g in m.groups()), tzinfo=dt.timezone.utc)
    except ValueError:  # 2024-13-40-...: a name of the right shape but no time
        return None


class ConsensusArchivePoller:
    """Polls one archive; ``poll(now)`` returns the consensuses listed since the last poll, each
    signature-checked against ``certificates`` and the ``trusted`` v3idents (today's nine by
    default), as an ArchiveReading. Never raises."""

    kind = KIND

    def __init__(self, base: str | Path, *, certificates: Sequence[KeyCertificate] = (),
                 trusted: Iterable[str] | None = None, n_authorities: int | None = None, name: str = KIND,
                 limits: ArchiveLimits = ArchiveLimits(), transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.name = name
        self.metrics: tuple[str, ...] = ()
        self.certificates = tuple(certificates)
        self.trusted = ca.trusted_identities(trusted)
        self.n_authorities = n_authorities
        self.limits = limits
        self.remote = isinstance(base, str) and base.startswith(("http://", "https://"))
        if self.remote:
            url = str(base).rstrip("/")
            self.listing: str | Path = url + "/" if url.endswith(LISTING) else f"{url}/{LISTING}/"
        else:
            root = Path(base)
            self.listing = root / LISTING if (root / LISTING).is_dir() else root
        self._transport, self._sleep = transport, sleep
        self._seen: dict[str, dt.datetime] = {}  # file name -> valid-after, done with (read, or refused for good)
        self._started = False

    def close(self) -> None:
        self._seen.clear()

    def poll(self, now: dt.datetime) -> ArchiveReading:
        try:
            got, problems, pending = self._poll(now.astimezone(dt.timezone.utc))
            problem = summarise(problems)
        except KistexpError as exc:
            got, problem, pending = [], one_line(str(exc)), 0
        except Exception as exc:  # the protocol: a poll never raises; an unforeseen failure is a named gap
            got, problem, pending = [], one_line(f"{self.listing}: unexpected {type(exc).__name__}: {exc}"), 0
        return ArchiveReading(self.name, KIND, now, tuple(got), problem, pending)

    def _poll(self, now: dt.datetime) -> tuple[list[ArchivedConsensus], list[str], int]:
        until = time.monotonic() + self.limits.poll_s
        listed = self._list(until)
        for name in [n for n, va in self._seen.items() if va < now - self.limits.keep]:
            del self._seen[name]
        if not self._started:  # the first poll reads only the recent past, not 72 h of consensuses
            self._started = True
            for name, va in listed.items():
                if va < now - self.limits.lookback:
                    self._seen[name] = va
        # Older than ``keep``: forgotten, so never new again (a local directory may hold months).
        horizon = now - self.limits.keep
        new = sorted((va, name) for name, va in listed.items() if name not in self._seen and va >= horizon)
        todo, pending = new[:self.limits.max_per_poll], len(new) - min(len(new), self.limits.max_per_poll)
        got, problems = [], []
        for va, name in todo:
            try:
                got.append(self._read(name, va, until))
                self._seen[name] = va
            except DocumentError as exc:  # a document that will never verify: reported once
                self._seen[name] = va
                problems.append(str(exc))
            except KistexpError as exc:  # a fetch that failed: tried again at the next poll
                problems.append(str(exc))
        return got, problems, pending

    def _list(self, until: float) -> dict[str, dt.datetime]:
        if self.remote:
            answer = httpfetch.get(str(self.listing), limits=self._fetch(self.limits.max_listing_bytes),
                                   transport=self._transport, until=until, sleep=self._sleep)
            names = {m.group(1).decode("ascii", "replace").rstrip("/").rsplit("/", 1)[-1]
                     for m in _HREF.finditer(answer.body)}
        else:
            listing = Path(self.listing)
            if not listing.is_dir():
                raise KistexpError(f"{listing}: not a directory (a consensus archive is a directory or a URL)")
            try:
                names = {p.name for _, p in zip(range(self.limits.max_entries + 1), listing.iterdir(), strict=False)}
            except OSError as exc:
                raise KistexpError(f"{listing}: cannot list: {exc.strerror or exc}") from None
        if len(names) > self.limits.max_entries:
            raise KistexpError(f"{self.listing}: more than {self.limits.max_entries} entries listed")
        out = {}
        for name in names:
            va = _valid_after(name)
            if va is not None:
                out[name] = va
        return out

    def _fetch(self, max_bytes: int) -> FetchLimits:
        return FetchLimits(self.limits.timeout_s, max_bytes, self.limits.retries, self.limits.backoff_s,
                           self.limits.backoff_max_s)

    def _read(self, name: str, va: dt.datetime, until: float) -> ArchivedConsensus:
        max_doc = self.limits.documents.max_document
        if self.remote:
            where = f"{self.listing}{name}"
            data = httpfetch.get(where, limits=self._fetch(max_doc), transport=self._transport, until=until,
                                 sleep=self._sleep).body
        else:
            where = str(Path(self.listing) / name)
            data = safeio.read_bounded(where, max_doc, "consensus", DocumentError)
        doc, check = ca.verified_consensus(data, where, certificates=self.certificates, trusted=self.trusted,
                                           n_authorities=self.n_authorities, limits=self.limits.documents)
        if doc.valid_after.astimezone(dt.timezone.utc) != va:
            raise DocumentError(f"{where}: the document's valid-after {doc.valid_after.isoformat()} is not the "
                                "time its name says")
        signers = sorted({s.identity for s in check.signatures if s.ok})
        nicknames = {a.v3ident: a.nickname for a in doc.authorities}
        record = ConsensusRecord(doc.valid_after, doc.flavor, doc.digest, doc.relay_count, check.total, check.valid,
                                 True, where, dict(doc.params))
        versions = collections.Counter(r.version for r in doc.routers if r.version)
        return ArchivedConsensus(va, dict(doc.params), tuple(signers), tuple(nicknames.get(s, "") for s in signers),
                                 record, tuple(sorted(versions.items())))
