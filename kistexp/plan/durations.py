"""Plans' durations: the parser lives in ``kistexp.durations`` (below plan and fake_authorities alike)."""

from kistexp.durations import format_duration, parse_duration

__all__ = ["format_duration", "parse_duration"]
