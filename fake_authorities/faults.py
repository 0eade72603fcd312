"""Faults an operator can inject into one fake authority.

- ``down``: the DirPort refuses connections (``mode="refuse"``) or accepts and never answers
  (``mode="hang"``); the authority takes no part in voting, and the operator API cannot
  change its ConsensusParams (no process to reload: 503).
- ``slow``: every DirPort reply and every upload it makes is delayed by ``delay_s``; uploads
  that arrive after the vote cutoff are refused (dirspec-params.md §2.2).
- ``stale-vote``: it keeps serving and sending the vote it had when the fault was set; the
  others reject it for its old valid-after.
- ``refuse-sign``: it computes the consensus but does not sign it.
- ``malformed``: its vote has mis-ordered params (tor rejects the whole document, §1.1) and it
  serves a truncated consensus.
- ``wrong-key``: it signs with a signing key its certificate does not certify, so its vote and
  its signatures fail verification.
"""

from __future__ import annotations

from typing import Any

import attrs

from kistexp import jsonout

FAULT_KINDS = ("down", "slow", "stale-vote", "refuse-sign", "malformed", "wrong-key")
DOWN_MODES = ("refuse", "hang")


class FaultError(ValueError):
    """An invalid fault description (reported to the operator as HTTP 400)."""


# the operator API lists a fault with the fields its kind uses: delay_s for slow, mode for down
@jsonout.shape(omit=("delay_s", "mode"),
               derived={"delay_s": lambda f: f.delay_s if f.kind == "slow" else jsonout.OMIT,
                        "mode": lambda f: f.mode if f.kind == "down" else jsonout.OMIT})
@attrs.frozen
class Fault:
    kind: str
    delay_s: float = 0.0  # for "slow"
    mode: str = "refuse"  # for "down"

    def __attrs_post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FaultError(f"unknown fault {self.kind!r} (one of {', '.join(FAULT_KINDS)})")
        if self.kind == "slow" and not 0 < self.delay_s <= 600:
            raise FaultError(f"fault slow needs 0 < delay_s <= 600, got {self.delay_s!r}")
        if self.mode not in DOWN_MODES:
            raise FaultError(f"fault down mode must be one of {', '.join(DOWN_MODES)}, got {self.mode!r}")

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        if isinstance(data, str):
            return cls(data)
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise FaultError('a fault is {"kind": ..., "delay_s": ..., "mode": ...}')
        unknown = set(data) - {"kind", "delay_s", "mode"}
        if unknown:
            raise FaultError(f"unknown fault field(s): {', '.join(sorted(unknown))}")
        delay = data.get("delay_s", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay != delay:
            raise FaultError(f"delay_s must be a number of seconds, got {str(delay)[:40]!r}")
        mode = data.get("mode", "refuse")
        if not isinstance(mode, str):
            raise FaultError(f"fault down mode must be one of {', '.join(DOWN_MODES)}, got {str(mode)[:40]!r}")
        return cls(data["kind"], float(delay) if abs(delay) < 1e9 else 1e9, mode)
