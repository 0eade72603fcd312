"""Kernel timer ticks and what they do to KISTSchedRunInterval (population.md §3.2, spec §5.2).

tor schedules the KIST run with a libevent timer; the kernel wakes the process on its tick, so the run
interval a relay actually gets is the requested one rounded **up** to a whole number of ticks (at least
one): on a 4 ms-tick kernel (CONFIG_HZ=250) 2 ms and 3 ms both run every 4 ms. (On tickless hrtimer
kernels the tick mostly sets timer slack, §3.2: the quantisation is this model's assumption, reported as a
per-class parameter.)

Small and low-level on purpose: the plan linter uses it; it imports nothing from the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path


def tick_ms(hz: int) -> float:
    return 1000.0 / hz


def effective_interval_ms(interval_ms: float, hz: int) -> float:
    """The interval a tor asking for ``interval_ms`` runs at on a ``hz`` kernel (0 stays 0: no timer)."""
    if interval_ms <= 0:
        return 0.0
    tick = tick_ms(hz)
    # a tiny tolerance: 3 ms on a 300 Hz kernel (3.33 ms tick) is one tick, 10 ms on 100 Hz is one tick
    return max(1, math.ceil(interval_ms / tick - 1e-9)) * tick


def tick_shares(path: str | Path | None = None) -> dict[int, float]:
    """Share of relays per tick rate, OS shares times per-OS HZ shares of the relay-class TOML."""
    from kistexp.population.classes import load_class_shares  # the TOML loader; no simulator import

    shares = load_class_shares(path)
    out: dict[int, float] = {}
    for os_name, os_share in shares.os:
        for hz, share in shares.hz[os_name]:
            out[hz] = out.get(hz, 0.0) + os_share * share
    return dict(sorted(out.items()))


def alike_share(a_ms: float, b_ms: float, shares: Mapping[int, float]) -> float:
    """Share of relays whose kernels run ``a_ms`` and ``b_ms`` at the same effective interval."""
    return sum(s for hz, s in shares.items() if effective_interval_ms(a_ms, hz) == effective_interval_ms(b_ms, hz))


def first_distinct(value_ms: int, hz: int, upper: int = 100) -> int | None:
    """The smallest integer interval above ``value_ms`` that a ``hz`` kernel runs differently."""
    base = effective_interval_ms(value_ms, hz)
    for v in range(int(value_ms) + 1, upper + 1):
        if effective_interval_ms(v, hz) != base:
            return v
    return None
