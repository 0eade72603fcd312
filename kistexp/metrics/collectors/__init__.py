"""Collectors: each turns one kind of real source into catalogue-named samples.

One module per source kind (onionperf, metricsport, process, consensus_archive,
operator_report, simulator); ``httpfetch`` is the one bounded HTTP GET those that read URLs
share. Every collector is bounded in size and time and reports bad input as one-line
problems naming the source and line or key:

- a source that cannot be read at all (truncated xz, not JSON, unknown format version)
  raises ``CorruptSource`` and contributes nothing;
- a source with some bad records keeps its good records; each bad one becomes a
  problem in ``Collected.problems`` ("FILE:LINE: what is wrong") and is not stored.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import lzma
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import attrs

from kistexp import safeio
from kistexp.errors import KistexpError
from kistexp.metrics.series import Sample

MiB = 1024 * 1024
XZ_MAGIC = b"\xfd7zXZ\x00"  # the first bytes of every .xz stream
# Sample times outside [2000-01-01, now + 1 day] are clock or parsing errors.
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


class CorruptSource(KistexpError):
    """A source that cannot be read at all: nothing of it is imported."""


class SourceTooLarge(CorruptSource):
    """A source beyond the collector's size limit."""


@attrs.frozen
class Collected:
    """What a collector got from one source: samples by metric, plus problems found in
    records that were left out."""

    kind: str
    location: str
    samples: Mapping[str, tuple[Sample, ...]] = attrs.field(hash=False)
    problems: tuple[str, ...] = ()
    sha256: str | None = None

    @property
    def n_samples(self) -> int:
        return sum(len(v) for v in self.samples.values())


def group_samples(pairs: list[tuple[str, Sample]]) -> dict[str, tuple[Sample, ...]]:
    out: dict[str, list[Sample]] = {}
    for metric, sample in pairs:
        out.setdefault(metric, []).append(sample)
    return {k: tuple(v) for k, v in out.items()}


def check_time(t: dt.datetime, where: str, now: dt.datetime) -> None:
    if not EARLIEST <= t <= now + dt.timedelta(days=1):
        raise ValueError(f"{where}: time {t.isoformat()} is outside 2000-01-01 .. now + 1 day")


def read_bounded(path: Path, *, max_compressed: int, max_raw: int, what: str = "metric source") -> tuple[bytes, str]:
    """The (decompressed) bytes of a file and the sha256 of its stored bytes.

    Only a regular file is read (``safeio.read_bounded``): ``/dev/zero`` would be read until
    memory ran out, a FIFO would block for ever and a ``/proc`` file's size says nothing of its
    content. ``.xz`` files are stream-decompressed, so a decompression bomb stops at
    ``max_raw`` instead of filling memory; a truncated or non-xz file raises CorruptSource.
    """
    try:
        info = path.stat()
    except OSError as exc:
        raise CorruptSource(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISREG(info.st_mode) and info.st_size > max_compressed:
        raise SourceTooLarge(f"{path}: {info.st_size} bytes is over the {max_compressed}-byte limit for this source")
    stored = safeio.read_bounded(path, max_compressed, what, CorruptSource)
    digest = hashlib.sha256(stored).hexdigest()
    xz = path.suffix == ".xz" or stored[:6] == XZ_MAGIC
    return decompress_bounded(stored, str(path), xz=xz, max_raw=max_raw), digest


def open_regular(path: str | os.PathLike[str], what: str, error: type[KistexpError] = CorruptSource) -> BinaryIO:
    """``path`` opened for reading if it is a regular file, else ``error`` naming what it is.

    For readers that stream a file rather than hold it (a tarball, a sample file, the first
    bytes of a file whose kind is being told): the same rule as ``safeio.read_bounded``. The
    file is opened without blocking, so a FIFO is refused instead of waiting for a writer.
    """
    fd, _info = safeio.open_regular_fd(path, what, error)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_head(path: str | os.PathLike[str], n: int, what: str, error: type[KistexpError] = CorruptSource) -> bytes:
    """The first ``n`` bytes of regular file ``path`` (``open_regular``'s rule)."""
    with open_regular(path, what, error) as fh:
        try:
            return fh.read(n)
        except OSError as exc:
            raise error(f"{os.fsdecode(path)}: cannot read {what}: {exc.strerror or exc}") from None


def is_special(path: str | os.PathLike[str]) -> str:
    """What ``path`` is if it exists and is not a regular file or a directory ("a FIFO (named
    pipe)", "a character device", ...), else "": such a path is refused by name, never opened."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return ""
    return "" if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else safeio.kind_of(mode)


def decompress_bounded(stored: bytes, where: str, *, xz: bool, max_raw: int) -> bytes:
    """``stored`` itself, or its xz decompression when ``xz``, never more than ``max_raw`` bytes.

    Shared by files (``read_bounded``) and bodies fetched over HTTP (live instruments), so a
    decompression bomb stops at ``max_raw`` whichever way it arrived; a truncated or non-xz
    body raises CorruptSource naming ``where``.
    """
    if not xz:
        if len(stored) > max_raw:
            raise SourceTooLarge(f"{where}: {len(stored)} bytes is over the {max_raw}-byte limit for this source")
        return stored
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    chunks, total = [], 0
    try:
        # feed a bounded amount of output at a time (max_length), never the whole bomb
        data = stored
        while True:
            out = dec.decompress(data, max_length=4 * MiB)
            data = b""
            total += len(out)
            if total > max_raw:
                raise SourceTooLarge(f"{where}: decompresses to over {max_raw} bytes (the limit for this source)")
            chunks.append(out)
            if dec.eof:
                break
            if dec.needs_input:
                raise CorruptSource(f"{where}: truncated xz file (compressed data ended before the end-of-stream "
                                    "marker)")
    except lzma.LZMAError as exc:
        raise CorruptSource(f"{where}: not a valid xz file: {exc}") from None
    return b"".join(chunks)
