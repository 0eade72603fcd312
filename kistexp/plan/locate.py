"""Find the line of a key path ("stages[1].duration") in TOML source text.

tomli gives no positions, so error messages re-scan the source: table headers, arrays
of tables, dotted keys and one level of inline tables are tracked; anything else falls
back to the nearest enclosing key that was found.
"""

from __future__ import annotations

import re

_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?\Z")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_.\"' -]+?)\s*=\s*(.*)$")
_INLINE_KEY_RE = re.compile(r"([A-Za-z0-9_-]+)\s*=")


def _split_key(key: str) -> list[str]:
    return [part.strip().strip("\"'") for part in key.split(".")]


def index_lines(source: str) -> dict[str, int]:
    """Map every key path found to its 1-based line number."""
    found: dict[str, int] = {}
    array_counts: dict[str, int] = {}
    prefix: list[str] = []
    in_multiline: str | None = None
    for lineno, line in enumerate(source.splitlines(), start=1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        header = _HEADER_RE.match(line)
        if header and not _KEY_RE.match(line):
            parts = _split_key(header.group(2))
            if header.group(1) == "[[":
                # a new element of an array of tables: its parents resolve to their current elements
                resolved = _resolve(parts[:-1], array_counts)
                base = ".".join([*resolved, parts[-1]])
                array_counts[base] = array_counts.get(base, -1) + 1
                resolved.append(f"{parts[-1]}[{array_counts[base]}]")
            else:
                resolved = _resolve(parts, array_counts)
            prefix = resolved
            found.setdefault(".".join(prefix), lineno)
            continue
        keyline = _KEY_RE.match(line)
        if not keyline or line.lstrip().startswith("#"):
            continue
        path = ".".join(prefix + _split_key(keyline.group(1)))
        found.setdefault(path, lineno)
        rest = keyline.group(2)
        for quote in ('"""', "'''"):
            if rest.count(quote) == 1:
                in_multiline = quote
        if rest.lstrip().startswith("{"):
            for inner in _INLINE_KEY_RE.findall(rest):
                found.setdefault(f"{path}.{inner}", lineno)
    return found


def _resolve(parts: list[str], array_counts: dict[str, int]) -> list[str]:
    """Give array-of-table components their current index ([stages.values] -> stages[2].values)."""
    resolved: list[str] = []
    for part in parts:
        base = ".".join([*resolved, part])
        if base in array_counts:
            resolved.append(f"{part}[{array_counts[base]}]")
        else:
            resolved.append(part)
    return resolved


def line_of(index: dict[str, int], path: str) -> int | None:
    """Line of ``path`` or of its nearest ancestor that was found."""
    candidate = path
    while candidate:
        if candidate in index:
            return index[candidate]
        if "." in candidate or "[" in candidate:
            cut = max(candidate.rfind("."), candidate.rfind("["))
            candidate = candidate[:cut]
        else:
            break
    return None
