"""Country of an IPv4 address from tor's own GeoIP file (Debian ``tor-geoipdb``: /usr/share/tor/geoip).

By default the copy bundled with the package (``kistexp/data/geoip.xz``, ``kistexp.population.bundled``); a
path given by the user (plain or xz-compressed) wins.

Format (tor ``src/lib/geoip/geoip.c``, population.md §4.1): ``#`` comments, then ``LOW,HIGH,CC`` lines with
IPv4 addresses as unsigned 32-bit integers, ranges **inclusive**, sorted and non-overlapping; ``??`` is
unknown. Look-up as tor does it, a binary search over the range starts (§4.2):
``i = bisect_right(lows, x) - 1``; the country is ``ccs[i]`` if ``x <= highs[i]``, else unknown.
(tornettools treats ranges as half-open and so misplaces each range's last address, §2.2.)
Every relay has an IPv4 address, so the IPv6 file is not needed here.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

import attrs
import numpy as np

from kistexp.errors import PopulationError
from kistexp.population.bundled import BUNDLED_GEOIP, bundled_label, maybe_xz, read_bundled
from kistexp.safeio import read_bounded

#: ``None`` names the bundled table (tor's own file, kistexp/data/geoip.xz).
DEFAULT_GEOIP = None
UNKNOWN = "??"
#: tor's IPv4 file is 9.5 MB (385,622 ranges); nothing larger is read or decompressed.
MAX_GEOIP_BYTES = 64 * 1024 * 1024


@attrs.frozen(eq=False)
class GeoIP:
    source: str
    lows: np.ndarray  # uint32, sorted
    highs: np.ndarray
    countries: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.countries)

    def lookup_int(self, value: int) -> str:
        i = int(np.searchsorted(self.lows, value, side="right")) - 1
        if i >= 0 and value <= int(self.highs[i]):
            return self.countries[i]
        return UNKNOWN

    def lookup(self, address: str) -> str:
        """Two-letter country code of a dotted IPv4 address (upper case), ``??`` if not listed."""
        try:
            value = int(ipaddress.IPv4Address(address))
        except ValueError:
            raise PopulationError(f"{address!r} is not an IPv4 address") from None
        return self.lookup_int(value)

    def lookup_many(self, addresses: list[str]) -> list[str]:
        values = np.array([int(ipaddress.IPv4Address(a)) for a in addresses], dtype=np.uint64)
        idx = np.searchsorted(self.lows, values, side="right") - 1
        out = []
        for v, i in zip(values.tolist(), idx.tolist(), strict=True):
            out.append(self.countries[i] if i >= 0 and v <= int(self.highs[i]) else UNKNOWN)
        return out


def parse_geoip(text: str, source: str) -> GeoIP:
    lows: list[int] = []
    highs: list[int] = []
    ccs: list[str] = []
    intern: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line or line[0] == "#":
            continue
        parts = line.split(",")
        if ":" in parts[0]:
            raise PopulationError(f"{source}: line {n}: an IPv6 range (tor's geoip6 file?); relays are placed by "
                                  "IPv4 address: give tor's IPv4 table (geoip)")
        try:
            lo, hi = int(parts[0]), int(parts[1])
            cc = parts[2].strip().upper()
        except (ValueError, IndexError):
            raise PopulationError(f"{source}: line {n}: expected LOW,HIGH,CC, got {line[:40]!r}") from None
        if len(parts) != 3 or not 0 <= lo <= hi <= 0xFFFFFFFF or not _country_code(cc):
            raise PopulationError(f"{source}: line {n}: expected LOW,HIGH,CC, got {line[:40]!r}")
        if highs and lo <= highs[-1]:
            raise PopulationError(f"{source}: line {n}: range not sorted or overlaps the previous one")
        lows.append(lo)
        highs.append(hi)
        ccs.append(intern.setdefault(cc, cc))
    if not lows:
        raise PopulationError(f"{source}: no GeoIP ranges (empty or not a tor geoip file)")
    return GeoIP(source, np.array(lows, dtype=np.uint64), np.array(highs, dtype=np.uint64), tuple(ccs))


def _country_code(cc: str) -> bool:
    return cc == UNKNOWN or (len(cc) == 2 and cc.isascii() and cc.isalpha())


def geoip_text(data: bytes, source: str) -> str:
    """A GeoIP file's bytes as text: ASCII only (a binary or other file is named, not guessed at)."""
    try:
        return data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise PopulationError(f"{source}: not a tor GeoIP file: non-ASCII byte at offset {exc.start}") from None


def load_geoip(path: str | Path | None = DEFAULT_GEOIP) -> GeoIP:
    """Load (once per process and file) tor's IPv4 GeoIP table: ``path`` (plain or xz), else the bundled copy."""
    return _load_geoip(None if path is None else str(path))


@lru_cache(maxsize=4)
def _load_geoip(path: str | None) -> GeoIP:
    if path is None:
        data = read_bundled(BUNDLED_GEOIP, MAX_GEOIP_BYTES, "GeoIP table", PopulationError)
        source = bundled_label(BUNDLED_GEOIP)
    else:
        raw = read_bounded(path, MAX_GEOIP_BYTES, "GeoIP file", PopulationError)
        data = maybe_xz(raw, MAX_GEOIP_BYTES, path, "GeoIP file", PopulationError)
        source = path
    return parse_geoip(geoip_text(data, source), source)
