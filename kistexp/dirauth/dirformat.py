"""Low-level text format shared by directory documents (dir-spec §1.2-1.3; dirspec-params.md §6).

Times are ``YYYY-MM-DD HH:MM:SS`` in UTC, objects are ``-----BEGIN <TYPE>-----`` blocks of base64
lines (<= 64 chars), lines end in LF. These helpers are used by the certificate, network-status and
rendering code; they raise DocumentError with the caller's ``where`` prefix so messages name the
source.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt

from kistexp.errors import DocumentError

UTC = dt.timezone.utc

# Documents larger than this are refused before parsing (a full ns consensus is ~2.4 MB today).
MAX_DOCUMENT_BYTES = 32 * 1024 * 1024


def parse_time(text: str, where: str) -> dt.datetime:
    """``YYYY-MM-DD HH:MM:SS`` -> aware UTC datetime; DocumentError naming ``where`` otherwise."""
    # Slicing beats strptime by ~10x and the format is fixed-width.
    if (
        len(text) != 19
        or text[4] != "-"
        or text[7] != "-"
        or text[10] != " "
        or text[13] != ":"
        or text[16] != ":"
    ):
        raise DocumentError(f"{where}: bad time {text!r} (expected YYYY-MM-DD HH:MM:SS)")
    try:
        parts = (text[0:4], text[5:7], text[8:10], text[11:13], text[14:16], text[17:19])
        if not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(text)
        y, mo, d, h, mi, s = (int(p) for p in parts)
        return dt.datetime(y, mo, d, h, mi, s, tzinfo=UTC)
    except ValueError:
        raise DocumentError(f"{where}: bad time {text!r}") from None


def format_time(when: dt.datetime) -> str:
    """Aware (or naive UTC) datetime -> ``YYYY-MM-DD HH:MM:SS`` in UTC."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def render_block(kind: str, data: bytes) -> str:
    """An object block, base64 in 64-character lines, ending with a newline."""
    b64 = base64.b64encode(data).decode("ascii")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return f"-----BEGIN {kind}-----\n" + "\n".join(lines) + f"\n-----END {kind}-----\n"


def decode_block_lines(lines: list[str], where: str) -> bytes:
    """Decode the base64 body lines of an object block."""
    try:
        return base64.b64decode("".join(lines), validate=True)
    except (binascii.Error, ValueError):
        raise DocumentError(f"{where}: object block is not valid base64") from None


def read_block(lines: list[str], start: int, where: str, kinds: tuple[str, ...]) -> tuple[str, bytes, int]:
    """Read the object block starting at ``lines[start]``.

    Returns (type, decoded bytes, index of the line after the END line). ``kinds`` lists the
    accepted block types.
    """
    if start >= len(lines):
        raise DocumentError(f"{where}: truncated, object block expected")
    first = lines[start]
    if not (first.startswith("-----BEGIN ") and first.endswith("-----")):
        raise DocumentError(f"{where}: expected -----BEGIN {kinds[0]}-----, found {first[:60]!r}")
    kind = first[11:-5]
    if kind not in kinds:
        raise DocumentError(f"{where}: object type {kind!r} where {' or '.join(kinds)} was expected")
    end_line = f"-----END {kind}-----"
    i = start + 1
    n = len(lines)
    while i < n and lines[i] != end_line:
        if lines[i].startswith("-----"):
            raise DocumentError(f"{where}: object block {kind} is not closed by {end_line}")
        i += 1
    if i >= n:
        raise DocumentError(f"{where}: truncated inside a {kind} object block")
    return kind, decode_block_lines(lines[start + 1 : i], where), i + 1


def b64_nopad_decode(text: str, where: str) -> bytes:
    """Decode dir-spec's unpadded base64 (router identities and digests)."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise DocumentError(f"{where}: {text!r} is not base64") from None


def b64_nopad_encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def is_hex40(text: str) -> bool:
    """40 hexadecimal digits (a v3ident or SHA-1 key digest)."""
    if len(text) != 40:
        return False
    try:
        int(text, 16)
    except ValueError:
        return False
    return text.isascii() and text.isalnum()


def as_text(data: bytes | str, source: str, allow_crlf: bool = False) -> str:
    """Bytes or str -> str, refusing oversize, non-ASCII-decodable and (unless allowed) CRLF input."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentError(
            f"{source}: document is {len(data)} bytes, more than the {MAX_DOCUMENT_BYTES} limit"
        )
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    else:
        text = data
    if "\r" in text:
        if not allow_crlf:
            raise DocumentError(f"{source}: CR line ends; directory documents use LF only")
        text = text.replace("\r\n", "\n")
        if "\r" in text:
            raise DocumentError(f"{source}: stray CR character")
    if "\x00" in text:
        raise DocumentError(f"{source}: NUL byte in document")
    return text
