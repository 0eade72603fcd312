"""Kernel timer ticks and what they do to KISTSchedRunInterval (population.md §3.2, kist-ewma.md §5.2).

After each KIST run tor re-arms its timer for ``interval - 1`` ms, and libevent measures that against its
coarse clock, which advances once per kernel tick J (``CLOCK_MONOTONIC_COARSE``; 4 ms at CONFIG_HZ=250).
Under a continuous backlog the run period is therefore (kist-ewma.md §5.2)::

    P = J * ceil((interval - 1) / J)        (at least one tick; interval 1: back to back)

J = 4 ms: 10 -> 12 ms, 2, 3, 4 and 5 -> 4 ms; J = 1 ms: 2 -> 1 ms, 3 -> 2 ms (real tors add up to ~1 ms of
epoll wake-up granularity, the same for every value). So on a 4 ms-tick kernel 2 and 3 ms run alike.
The pass's own work can lengthen P on a busy relay; that is the simulator's business, not this module's.
(On tickless hrtimer kernels the tick mostly sets timer slack, population.md §3.2; the coarse clock is what
libevent reads, which is why the tick shows in tor's period: measured 12.08 ms at 10 ms on HZ=250.)

Small and low-level on purpose: the plan linter uses it; it imports nothing from the simulator. How
many relays run each tick rate is the relay classes' data (``kistexp.population.classes.tick_shares``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def tick_ms(hz: int) -> float:
    return 1000.0 / hz


def effective_interval_ms(interval_ms: float, hz: int) -> float:
    """The run period of a tor asking for ``interval_ms`` on a ``hz`` kernel under backlog (see above).

    0 and 1 ms give 0: no timer, the scheduler re-runs back to back (kist-ewma.md §5.2)."""
    if interval_ms <= 1:
        return 0.0
    tick = tick_ms(hz)
    # the tolerance keeps exact multiples on one tick (4 ms on a 300 Hz kernel: 3 / 3.33 -> 1 tick)
    return max(1, math.ceil((interval_ms - 1) / tick - 1e-9)) * tick


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
