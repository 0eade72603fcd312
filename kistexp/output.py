"""Shared output helpers for CLI commands: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Piped output is read by people in pagers and CI logs: do not wrap tables at 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def _default(obj: Any) -> Any:
    # datetimes and attrs objects are the common non-JSON values we emit
    import datetime as _dt

    import attrs

    if isinstance(obj, _dt.datetime):
        return obj.strftime("%Y-%m-%dT%H:%M:%SZ") if obj.tzinfo else obj.isoformat()
    if isinstance(obj, _dt.timedelta):
        return obj.total_seconds()
    if attrs.has(type(obj)):
        return attrs.asdict(obj, recurse=True)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(obj, default=_default, indent=2, sort_keys=False) + "\n")


def printable(text: str) -> str:
    """``text`` from a file or a server made safe to show: control characters (ESC, BEL, CR, LF,
    NUL, DEL, C1 and the like) as visible escapes, so nothing can retitle or redraw the terminal.
    Print it with ``markup=False`` (or in a ``rich.text.Text``) so brackets stay brackets."""
    import unicodedata

    out = []
    for ch in text:
        if unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1] if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return "".join(out)
