"""Consensus archives -> the history of each consensus parameter, and what each
authority voted, with every document's signatures checked.

Input: a consensus or vote file, a directory of them (CollecTor's layout or any other,
read recursively), or a CollecTor monthly tarball (``.tar``, ``.tar.xz``, ``.tar.bz2``,
``.tar.gz``) read as a stream and never extracted (metrics-sources.md §3.1, §5.3). Only
regular files are read (a FIFO, a device or a file under /proc or /sys is reported and skipped),
a directory is walked at most ``max_depth`` levels deep and ``max_files`` files wide, and a
tarball member is read only when its first bytes are a directory document. Files
are recognised by content, not name: a leading CollecTor ``@type`` annotation (§3.2) is
checked and stripped, then ``network-status-version 3`` marks a consensus or vote and
``dir-key-certificate-version 3`` a key-certificate file. Other files are skipped.

Signatures: a consensus counts only if more than half of the trusted authorities signed
it with certificates valid at its valid-after (``documents.verify_signatures``, as for
archived documents); a vote only if its own authority signed it. Documents that fail are
reported and not stored. Trust is today's nine authorities unless given otherwise.
"""

from __future__ import annotations

import datetime as dt
import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from kistexp.dirauth import documents
from kistexp.dirauth.authorities import DEFAULT_AUTHORITIES
from kistexp.dirauth.documents import KeyCertificate, NetworkStatus
from kistexp.errors import DocumentError, KistexpError
from kistexp.metrics.collectors import CorruptSource, MiB, open_regular, read_bounded, read_head
from kistexp.metrics.store import ConsensusRecord, MetricStore, VoteRecord

KIND = "consensus-archive"

_ANNOTATION = re.compile(rb"^@type ([a-z0-9-]+) (\d+)\.(\d+)$")
# CollecTor's annotation for each document kind we read, with the major version we know.
_ANNOTATED = {b"network-status-consensus-3": 1, b"network-status-microdesc-consensus-3": 1,
              b"network-status-vote-3": 1, b"dir-key-certificate-3": 1}
_TAR_SUFFIXES = (".tar", ".tar.xz", ".tar.bz2", ".tar.gz")


@attrs.frozen
class Limits:
    max_document: int = 16 * MiB
    max_member: int = 64 * MiB
    max_pending: int = 256 * MiB  # consensuses held while no certificate has been seen
    # A directory walk: CollecTor's layout is 4 levels deep, and ten years of hourly consensuses and
    # the nine authorities' votes are about 876,000 files. A deeper tree (3,000 levels made the walk
    # end in a RecursionError) or a wider one is refused before any file is read.
    max_depth: int = 32
    max_files: int = 1_000_000
    max_name: int = 1024  # characters of a tarball member's name (4,096 is PATH_MAX)


class ArchiveError(KistexpError):
    """An archive cannot be used as a whole (no certificates, unreadable tarball)."""


@attrs.frozen
class Imported:
    """What one archive contributed."""

    location: str
    consensuses: tuple[ConsensusRecord, ...]
    votes: tuple[VoteRecord, ...]
    problems: tuple[str, ...]
    skipped: int  # files that are not directory documents


@attrs.frozen
class ParamSpan:
    """A run of consecutive hourly consensuses with the same value of one parameter.
    ``value`` None means the key was absent: tor uses its default then (not 0)."""

    name: str
    flavour: str
    value: int | None
    first: dt.datetime  # valid-after of the first consensus of the run
    last: dt.datetime  # valid-after of the last one
    n_consensuses: int
    after_gap: bool  # a consensus hour is missing before this run: "unchanged" is not known


def strip_annotation(data: bytes, where: str) -> bytes:
    """Remove CollecTor's leading ``@type`` lines (not signed content, §3.2); refuse an
    annotation of a newer major version."""
    while data.startswith(b"@"):
        end = data.find(b"\n")
        line = (data if end < 0 else data[:end]).rstrip(b"\r")
        m = _ANNOTATION.match(line)
        if m and m.group(1) in _ANNOTATED and int(m.group(2)) > _ANNOTATED[m.group(1)]:
            raise DocumentError(f"{where}: {line.decode(errors='replace')} is newer than this kistexp reads")
        data = b"" if end < 0 else data[end + 1:]
    return data


def _kind(head: bytes) -> str | None:
    if head.startswith(b"network-status-version 3"):
        return "status"
    if head.startswith(b"dir-key-certificate-version 3"):
        return "certs"
    return None


def _is_certificate_file(path: Path) -> bool:
    try:
        return _kind(strip_annotation(read_head(path, 4096, "directory document"), str(path))) == "certs"
    except KistexpError:
        return False


def _walk(root: Path, limits: Limits) -> list[Path]:
    """The regular files under ``root`` (symbolic links not followed), sorted; iterative, so depth
    costs no stack, and bounded in depth and count."""
    files: list[Path] = []
    todo = [(root, 0)]
    while todo:
        folder, depth = todo.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if depth + 1 > limits.max_depth:
                            raise ArchiveError(f"{root}: directories nested more than {limits.max_depth} levels "
                                               "deep (CollecTor's layout has 4)")
                        todo.append((Path(entry.path), depth + 1))
                    elif entry.is_file(follow_symlinks=False):
                        files.append(Path(entry.path))
                        if len(files) > limits.max_files:
                            raise ArchiveError(f"{root}: more than {limits.max_files} files; import it a part at "
                                               "a time")
        except OSError as exc:
            raise ArchiveError(f"{folder}: cannot list: {exc.strerror or exc}") from None
    return sorted(files)


def _members(path: Path, limits: Limits, problems: list[str]) -> Iterator[tuple[str, bytes]]:
    """(location, bytes) of every candidate document under ``path``."""
    if path.is_dir():
        real = os.path.realpath(path)
        if any(real == root or real.startswith(root + "/") for root in ("/proc", "/sys")):
            raise ArchiveError(f"{path}: a kernel directory under /proc or /sys is not a consensus archive")
        files = _walk(path, limits)
        # certificate files first, so that every consensus can be checked as it is read
        for p in sorted(files, key=lambda p: not _is_certificate_file(p)):
            yield from _members(p, limits, problems)
        return
    if path.name.endswith(_TAR_SUFFIXES):
        yield from _tar_members(path, limits, problems)
        return
    try:
        if _kind(strip_annotation(read_head(path, 4096, "directory document"), str(path))) is None:
            yield (str(path), b"")  # not a directory document: counted as skipped
            return
    except KistexpError as exc:  # not a regular file, unreadable, an annotation of a newer version
        problems.append(str(exc))
        return
    try:
        data, _ = read_bounded(path, max_compressed=limits.max_document, max_raw=limits.max_document,
                               what="directory document")
    except CorruptSource as exc:
        problems.append(str(exc))
        return
    yield (str(path), data)


def _drain(fh) -> None:
    """Read past the rest of a tarball member, 16 MiB at a time. Left to itself, the stream skips a
    member in 10 KiB steps, each copying all the data the last xz block decompressed to: 60 MiB of
    spaces took over a minute to skip that way, under a second this way."""
    while fh.read(16 * MiB):
        pass


def _short(name: str, limit: int = 200) -> str:
    return name if len(name) <= limit else f"{name[:limit // 2]}...{name[-limit // 2:]}"


def _tar_members(path: Path, limits: Limits, problems: list[str]) -> Iterator[tuple[str, bytes]]:
    try:
        stream = open_regular(path, "tar archive", ArchiveError)
    except ArchiveError as exc:  # a FIFO named x.tar once blocked the import for ever
        problems.append(str(exc))
        return
    try:
        # "r|*": a forward-only stream, so a month's tarball is never held or extracted
        with stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            for m in tar:
                where = f"{path}:{_short(m.name)}"
                if m.isdir():
                    continue
                if not m.isfile():
                    problems.append(f"{where}: links and special files are not read")
                    continue
                fh = tar.extractfile(m)
                if fh is None:
                    continue
                if len(m.name) > limits.max_name:
                    problems.append(f"{where}: member name of {len(m.name)} characters is over the "
                                    f"{limits.max_name}-character limit; not read")
                    _drain(fh)
                    continue
                if m.name.startswith("/") or ".." in Path(m.name).parts:
                    problems.append(f"{where}: member path leaves the archive; not read")
                    _drain(fh)
                    continue
                if m.size > limits.max_member:
                    problems.append(f"{where}: {m.size} bytes is over the {limits.max_member}-byte limit; not read")
                    _drain(fh)
                    continue
                head = fh.read(4096)
                try:
                    document = _kind(strip_annotation(head, where)) is not None
                except DocumentError:
                    document = True  # read whole: the caller reports the newer annotation
                # only a directory document is held whole; anything else is read past in chunks (a
                # member of 60 MiB of spaces was held whole, then parsed)
                if document:
                    yield (where, head + fh.read())
                else:
                    _drain(fh)
                    yield (where, b"")
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
        problems.append(f"{path}: unreadable tar archive ({' '.join(str(exc).split())[:200]}); later members not read")


def trusted_identities(trusted: Iterable[str] | None = None) -> frozenset[str]:
    if trusted is None:
        return frozenset(a.v3ident.upper() for a in DEFAULT_AUTHORITIES)
    return frozenset(t.upper() for t in trusted)


def _verify(doc: NetworkStatus, certs: Sequence[KeyCertificate], trusted: frozenset[str],
            n_authorities: int) -> documents.SignatureCheck:
    # The one call into the directory code's signature check: certificates of untrusted
    # identities never count, checked at the document's valid-after (archived documents).
    pinned = [c for c in certs if c.fingerprint in trusted]
    return documents.verify_signatures(doc, pinned, n_authorities, None, trusted)


def verified_consensus(data: bytes, where: str, *, certificates: Sequence[KeyCertificate],
                       trusted: Iterable[str] | None = None, n_authorities: int | None = None,
                       limits: Limits = Limits()) -> tuple[NetworkStatus, documents.SignatureCheck]:
    """One consensus document (a CollecTor ``@type`` annotation allowed) parsed and signature-checked
    as ``read_archive`` checks each of an archive's: certificates of trusted identities only, valid
    at the consensus's valid-after, more than half of the trusted authorities. DocumentError (one
    line naming ``where``) for anything else: too large, not a consensus, not verified."""
    if len(data) > limits.max_document:
        raise DocumentError(f"{where}: {len(data)} bytes is over the {limits.max_document}-byte limit for a document")
    pins = trusted_identities(trusted)
    body = strip_annotation(data, where)
    if _kind(body[:64]) != "status":
        raise DocumentError(f"{where}: not a directory document (no network-status-version 3)")
    doc = documents.parse_network_status(body, where)
    if not doc.is_consensus:
        raise DocumentError(f"{where}: expected a consensus, got a vote")
    check = _verify(doc, certificates, pins, n_authorities or len(pins))
    if not check.ok:
        raise DocumentError(f"{where}: consensus not verified ({check.summary()})")
    return doc, check


def read_archive(path: str | Path, *, certificates: Sequence[KeyCertificate] = (), trusted: Iterable[str] | None = None,
                 n_authorities: int | None = None, limits: Limits = Limits(),
                 progress: Callable[[int, str], None] | None = None) -> Imported:
    """Parse and verify every consensus and vote under ``path``. Certificate files found
    there are used alongside ``certificates``. ``progress(n, location)`` is called after
    each file or tar member read."""
    path = Path(path)
    if not path.exists():
        raise ArchiveError(f"{path}: no such file or directory")
    pins = trusted_identities(trusted)
    n_auth = n_authorities or len(pins)
    problems: list[str] = []
    certs = list(certificates)
    consensuses: list[ConsensusRecord] = []
    votes: list[VoteRecord] = []
    # Consensuses met before any certificate (a tarball with its certs at the end) wait,
    # within a bound; everything else is checked and dropped as it streams past.
    pending: list[tuple[str, bytes]] = []
    pending_bytes = 0
    skipped = 0

    def handle(where: str, body: bytes) -> None:
        try:
            doc = documents.parse_network_status(body, where)
        except DocumentError as exc:
            problems.append(str(exc))
            return
        if doc.is_consensus:
            check = _verify(doc, certs, pins, n_auth)
            if not check.ok:
                problems.append(f"{where}: consensus not verified ({check.summary()}); not imported")
                return
            consensuses.append(ConsensusRecord(doc.valid_after, doc.flavor, doc.digest, doc.relay_count,
                                               check.total, check.valid, True, where, dict(doc.params)))
            return
        src = doc.authorities[0] if doc.authorities else None
        embedded = [doc.key_certificate] if doc.key_certificate is not None else []
        check = _verify(doc, certs + embedded, pins, 1)
        if src is None or not check.ok:
            problems.append(f"{where}: vote not verified ({check.summary()}); not imported")
            return
        votes.append(VoteRecord(doc.valid_after, src.v3ident, src.nickname, doc.digest, True, where,
                                dict(doc.params)))

    for n, (where, data) in enumerate(_members(path, limits, problems), 1):
        if progress:
            progress(n, where)
        try:
            body = strip_annotation(data, where)
        except DocumentError as exc:
            problems.append(str(exc))
            continue
        del data
        kind = _kind(body[:64])
        if kind is None:
            skipped += 1
        elif kind == "certs":
            try:
                certs.extend(documents.parse_key_certificates(body, where))
            except DocumentError as exc:
                problems.append(str(exc))
            for item in pending:
                handle(*item)
            pending.clear()
            pending_bytes = 0
        elif certs or b"\nvote-status vote" in body[:512]:
            handle(where, body)  # votes carry their own certificate
        else:
            pending.append((where, body))
            pending_bytes += len(body)
            if pending_bytes > limits.max_pending:
                raise ArchiveError(f"{where}: {len(pending)} consensuses and no authority key certificate yet "
                                   "(pass --certs FILE, e.g. tor's cached-certs)")
    if pending:
        raise ArchiveError(f"{pending[0][0]}: no authority key certificates to check its signatures "
                           "(pass --certs FILE, e.g. tor's cached-certs)")
    consensuses.sort(key=lambda c: (c.valid_after, c.flavour))
    votes.sort(key=lambda v: (v.valid_after, v.nickname))
    return Imported(str(path), tuple(consensuses), tuple(votes), tuple(problems), skipped)


def save(store: MetricStore, imported: Imported) -> None:
    for c in imported.consensuses:
        store.save_consensus(c)
    for v in imported.votes:
        store.save_vote(v)


# --- history -----------------------------------------------------------------------------

def param_history(consensuses: Sequence[ConsensusRecord], name: str, flavour: str = "ns",
                  period: dt.timedelta = dt.timedelta(hours=1)) -> list[ParamSpan]:
    """Runs of equal values of ``name`` over consensuses sorted by valid-after; a missing
    consensus (a gap longer than ``period``) starts a new run (§3.3)."""
    spans: list[ParamSpan] = []
    for c in sorted((c for c in consensuses if c.flavour == flavour), key=lambda c: c.valid_after):
        value = c.params.get(name)
        if spans:
            last = spans[-1]
            gap = c.valid_after - last.last > period
            if not gap and last.value == value:
                spans[-1] = attrs.evolve(last, last=c.valid_after, n_consensuses=last.n_consensuses + 1)
                continue
        else:
            gap = False
        spans.append(ParamSpan(name, flavour, value, c.valid_after, c.valid_after, 1, gap))
    return spans


def param_names(consensuses: Iterable[ConsensusRecord]) -> list[str]:
    return sorted({k for c in consensuses for k in c.params})


def votes_by_authority(votes: Sequence[VoteRecord], name: str) -> dict[dt.datetime, dict[str, int | None]]:
    """valid-after -> {authority nickname: the value it voted (None = not in its params)}."""
    out: dict[dt.datetime, dict[str, int | None]] = {}
    for v in votes:
        out.setdefault(v.valid_after, {})[v.nickname] = v.params.get(name)
    return out


def value_in_consensus(consensuses: Sequence[ConsensusRecord], name: str, at: dt.datetime,
                       flavour: str = "ns", default: int | None = None,
                       max_age: dt.timedelta = dt.timedelta(hours=3)) -> int | None:
    """The value of ``name`` in the latest consensus valid-after ``at`` or earlier (and at
    most ``max_age`` old, a consensus' usual valid-until), ``default`` if absent there,
    None if no consensus covers ``at``. This is what the authorities published; relays
    and clients adopt it up to a few hours later (kistexp/dirauth/propagation.py)."""
    best: ConsensusRecord | None = None
    for c in consensuses:
        if c.flavour == flavour and c.valid_after <= at and (best is None or c.valid_after > best.valid_after):
            best = c
    if best is None or at - best.valid_after > max_age:
        return None
    return best.params.get(name, default)

