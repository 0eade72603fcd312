"""Decoding a DirPort response body (dirspec-params.md §5.2), bounded in memory and size.

A body is checked against the ``Content-Encoding`` it was declared with (a mismatch is reported as a
lie, not guessed around), then decompressed in steps of at most 64 KiB under a hard cap on the decoded
size and tor's compression-bomb ratio rule (src/lib/compress/compress.c). Encodings: what tor clients
offer, deflate/gzip/x-zstd/x-tor-lzma and identity. No HTTP here: the bytes come from the client.
"""

from __future__ import annotations

import io
import lzma
import zlib
from collections.abc import Iterator
from typing import Any

from kistexp.errors import DirectoryError

#: What tor clients offer, best first (§5: lzma > zstd > deflate > gzip > identity).
ACCEPT_ENCODINGS: tuple[str, ...] = ("x-tor-lzma", "x-zstd", "deflate", "gzip", "identity")

#: tor's compression-bomb rule (src/lib/compress/compress.c): once 64 KiB have been
#: produced, more than 25 output bytes per input byte is a bomb.
BOMB_CHECK_AFTER_BYTES = 64 * 1024
BOMB_MAX_RATIO = 25

#: Largest decoded piece produced per step, so memory stays bounded whatever the input.
_DECODE_STEP = 64 * 1024


def detect_compression(head: bytes) -> str:
    """The encoding a body's first bytes show, as tor's ``detect_compression_method``."""
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
        return "deflate"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "x-zstd"
    if head[:3] == b"\x5d\x00\x00" or head[:6] == b"\xfd7zXZ\x00":
        return "x-tor-lzma"
    return "identity"


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (for zstandard's stream reader)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _decode_stream(encoding: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Decoded pieces of at most _DECODE_STEP bytes each; raises ValueError on bad data."""
    if encoding == "identity":
        yield from chunks
        return
    if encoding == "x-zstd":
        import zstandard  # loaded when a server sends zstd, not on every import of the client

        reader = zstandard.ZstdDecompressor().stream_reader(_ChunkReader(chunks), read_size=16384)
        try:
            while piece := reader.read(_DECODE_STEP):
                yield piece
        except zstandard.ZstdError as exc:
            raise ValueError(f"bad zstd data ({exc})") from None
        return
    if encoding == "x-tor-lzma":
        dec: Any = lzma.LZMADecompressor(format=lzma.FORMAT_AUTO)
        errors: tuple[type[Exception], ...] = (lzma.LZMAError, EOFError)
    else:
        dec = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
        errors = (zlib.error,)
    try:
        for chunk in chunks:
            data = chunk
            while data:
                if dec.eof:
                    raise ValueError("data after the end of the compressed stream")
                piece = dec.decompress(data, _DECODE_STEP)
                yield piece
                if encoding != "x-tor-lzma" and dec.unused_data:
                    raise ValueError("data after the end of the compressed stream")
                data = dec.unconsumed_tail if encoding != "x-tor-lzma" else b""
                # lzma keeps unconsumed input inside; drain it with empty calls.
                while encoding == "x-tor-lzma" and not dec.eof and not dec.needs_input:
                    yield dec.decompress(b"", _DECODE_STEP)
        if not dec.eof:
            raise ValueError("compressed stream is truncated")
    except errors as exc:
        raise ValueError(f"bad {encoding} data ({exc})") from None


def decode_body(where: str, declared: str, raw: Iterator[bytes], *, max_decoded_bytes: int, max_ratio: int,
                ratio_check_after_bytes: int) -> bytes:
    """The body ``raw`` yields, decoded from ``declared``; DirectoryError (naming ``where``) when the
    first bytes show another encoding, the data is bad, or the decompression guard trips: more than
    ``max_decoded_bytes`` decoded, or more than ``max_ratio`` decoded bytes per byte read once
    ``ratio_check_after_bytes`` have been decoded."""
    # Peek at the first bytes to catch a Content-Encoding that lies about the body.
    head = b""
    for chunk in raw:
        head += chunk
        if len(head) >= 6:
            break
    if not head:
        return b""
    actual = detect_compression(head)
    if actual != declared:
        body_kind = "uncompressed text" if actual == "identity" else f"{actual} data"
        raise DirectoryError(f"{where}: Content-Encoding says {declared} but the body is {body_kind}")
    wire_in = 0

    def counted() -> Iterator[bytes]:
        nonlocal wire_in
        wire_in += len(head)
        yield head
        for chunk in raw:
            wire_in += len(chunk)
            yield chunk

    out = bytearray()
    try:
        for piece in _decode_stream(declared, counted()):
            out += piece
            if len(out) > max_decoded_bytes:
                raise DirectoryError(f"{where}: decoded body exceeds the {max_decoded_bytes}-byte "
                                     "limit (decompression bomb?)")
            if (declared != "identity" and len(out) >= ratio_check_after_bytes
                    and len(out) > max_ratio * max(wire_in, 1)):
                raise DirectoryError(f"{where}: decompression bomb: {wire_in} {declared} bytes "
                                     f"expand to more than {len(out)} (ratio > {max_ratio})")
    except ValueError as exc:
        raise DirectoryError(f"{where}: cannot decode {declared} body: {exc}") from None
    return bytes(out)
