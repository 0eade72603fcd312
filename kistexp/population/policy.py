"""Exit-policy summaries (the consensus ``p`` line) and testing a port against them.

Rules from dir-spec ("p" line) and tor's ``policies.c`` (population.md §1.3): a port is *found* if it lies
inside any listed port or range; ``accept``: found means accepted; ``reject``: found means rejected; not
found means the opposite. Reject-all is exactly ``reject 1-65535``.
"""

from __future__ import annotations

import attrs

from kistexp.errors import PopulationError


@attrs.frozen
class PolicySummary:
    """``accept`` or ``reject`` plus sorted, inclusive port ranges."""

    accept: bool
    ranges: tuple[tuple[int, int], ...]

    def allows(self, port: int) -> bool:
        found = any(lo <= port <= hi for lo, hi in self.ranges)
        return found if self.accept else not found

    @property
    def rejects_all(self) -> bool:
        return not self.accept and self.ranges == ((1, 65535),)

    def __str__(self) -> str:
        items = ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)
        return f"{'accept' if self.accept else 'reject'} {items}"


REJECT_ALL = PolicySummary(False, ((1, 65535),))


def parse_policy_summary(text: str, where: str = "p line") -> PolicySummary:
    """Parse a ``p`` line body such as ``accept 80,443,8000-9000``."""
    keyword, _, ports = text.strip().partition(" ")
    if keyword not in ("accept", "reject") or not ports:
        raise PopulationError(f"{where}: policy summary {text[:40]!r} is not 'accept|reject PORTLIST'")
    ranges = []
    for item in ports.split(","):
        lo_text, dash, hi_text = item.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise PopulationError(f"{where}: bad port range {item!r} in policy summary") from None
        if not 1 <= lo <= hi <= 65535:
            raise PopulationError(f"{where}: port range {item!r} outside 1-65535")
        ranges.append((lo, hi))
    return PolicySummary(keyword == "accept", tuple(sorted(ranges)))
