"""The data a population needs by default, shipped inside the package (docs/population.md, "Bundled data").

``kistexp/data/`` holds three xz-compressed files, read with ``importlib.resources`` (so an installed wheel
works as well as a checkout) and decompressed in memory, never past a size cap:

* ``consensus-2022-11-19-10-00-00.xz``: the signed ns consensus of 2022-11-19 10:00 UTC (6,088 relays);
* ``cached-certs-2022-11-19.xz``: the authorities' key certificates of that time, so the bundled consensus is
  verified (tor 0.4.7.10's nine pinned identities) every time it is read;
* ``geoip.xz``: tor's IPv4 GeoIP table (Debian ``tor-geoipdb``, from IPFire's location database, CC BY-SA 4.0;
  its header says so and is kept).

A user-given file always wins over these. Files may be given plain or xz-compressed (``maybe_xz``).
"""

from __future__ import annotations

import hashlib
import lzma
from importlib import resources
from typing import TYPE_CHECKING

from kistexp.errors import KistexpError

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11

BUNDLED_CONSENSUS = "consensus-2022-11-19-10-00-00.xz"
BUNDLED_CERTS = "cached-certs-2022-11-19.xz"
BUNDLED_GEOIP = "geoip.xz"
#: The authorities whose signatures the bundled consensus carries (the set pinned by tor 0.4.7.10).
BUNDLED_CONSENSUS_AUTHORITIES = "tor-0.4.7.10"
BUNDLED_RELAYS = 6088

XZ_MAGIC = b"\xfd7zXZ\x00"


def bundled_file(name: str) -> Traversable:
    """The packaged file ``kistexp/data/<name>``."""
    return resources.files("kistexp").joinpath("data", name)


def bundled_label(name: str) -> str:
    """How errors and sources name a bundled file: its path inside the installed package."""
    return str(bundled_file(name))


def decompress_xz(data: bytes, limit: int, label: str, what: str, error: type[KistexpError]) -> bytes:
    """``data`` (one xz stream) decompressed, at most ``limit`` bytes; anything else is one line naming ``label``."""
    decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        out = decoder.decompress(data, max_length=limit + 1)
    except lzma.LZMAError as exc:
        raise error(f"{label}: corrupt {what}: not a valid xz stream ({exc})") from None
    if len(out) > limit:
        raise error(f"{label}: {what} decompresses to more than the {limit}-byte limit")
    if not decoder.eof:
        raise error(f"{label}: truncated {what}: the xz stream ends early")
    if decoder.unused_data:
        raise error(f"{label}: corrupt {what}: {len(decoder.unused_data)} bytes after the xz stream")
    return out


def maybe_xz(data: bytes, limit: int, label: str, what: str, error: type[KistexpError]) -> bytes:
    """A file's bytes as given, or decompressed when they are an xz stream."""
    return decompress_xz(data, limit, label, what, error) if data.startswith(XZ_MAGIC) else data


def read_bundled(name: str, limit: int, what: str, error: type[KistexpError]) -> bytes:
    """The decompressed content of a bundled file; a missing or damaged one is one line naming it."""
    label = bundled_label(name)
    try:
        data = bundled_file(name).read_bytes()
    except FileNotFoundError:
        raise error(f"{label}: bundled {what} is missing from the installed package (reinstall kistexp)") from None
    except OSError as exc:
        raise error(f"{label}: cannot read the bundled {what}: {exc.strerror or exc}") from None
    return decompress_xz(data, limit, label, what, error)


def bundled_digest(name: str, limit: int) -> str:
    """SHA-256 of a bundled file's decompressed content (the same as of the original file)."""
    return hashlib.sha256(read_bundled(name, limit, "data", KistexpError)).hexdigest()
