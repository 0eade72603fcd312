"""The fetcher fleet: simulated relays and clients fetching the fake authorities' consensus
(dirspec-params.md §3).

Each node keeps the valid-after it holds. On accepting a consensus C it schedules its next
fetch in tor's window for its class, placed after FU(C), plus the jitter of the periodic
fetch check; windows come from ``kistexp.dirauth.propagation`` for the hourly network and
are scaled to the accelerated clock (``interval_s`` real seconds per hour). Directory caches
fetch the microdesc consensus from a random authority and accept it only if it parses and
carries enough valid signatures; clients get whatever a random cache holds. A fetch that
brings nothing newer is retried one (scaled) check period later. Every acceptance is
recorded, so the adoption of each valid-after -- and hence of its params -- can be queried.

The fleet sees the authorities only through a ``ConsensusSource`` (what a fetching node can
observe: the mirrors' served microdesc consensus and the certificates to check it), so it knows
nothing of the network's voting, operator API or faults beyond "no answer". Time comes from a
``kistexp.clock.Clock``: on the wall clock a thread makes the fetches; on a ``VirtualClock`` each
next fetch is a ``call_at``, so adoption follows simulated time with no real waiting.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from fake_authorities import docs
from kistexp.clock import Clock, RealClock, Timer, as_utc
from kistexp.dirauth.keys import KeyCertificate
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.dirauth.propagation import NodeClass, PropagationModel
from kistexp.dirauth.schedule import VotingSchedule
from kistexp.errors import KistexpError

KINDS = {"cache": NodeClass.CACHE, "client": NodeClass.CLIENT}


@functools.lru_cache(maxsize=64)
def _params_line(params: tuple[tuple[str, int], ...]) -> str:
    """A held consensus's params line (one per consensus, written at each of many nodes' fetches)."""
    return ConsensusParams(params).format()


@attrs.define
class Node:
    ident: int
    kind: str
    held_va: float | None = None
    held_params: tuple[tuple[str, int], ...] = ()
    fetches: list[tuple[float, float, str]] = attrs.field(factory=list)  # (accepted at, VA, params)
    failed: int = 0


class ConsensusSource(Protocol):
    """What the fleet needs of the authorities, and nothing more."""

    #: real seconds per voting "hour" and that as a share of 3600 s
    interval_s: float
    scale: float

    def mirror_count(self) -> int:
        """How many authorities a cache may fetch from."""

    def served_microdesc(self, index: int) -> bytes | None:
        """What authority ``index`` serves as its microdesc consensus; None if it does not answer."""

    def certificates(self) -> Sequence[KeyCertificate]:
        """The authorities' key certificates, for checking signatures."""


class FetcherFleet:
    def __init__(self, source: ConsensusSource, caches: int = 100, clients: int = 100, seed: int = 1,
                 clock: Clock | None = None) -> None:
        self.source = source
        self.clock: Clock = clock or RealClock()
        self._timer: Timer | None = None
        self.seed = seed
        self.model = PropagationModel(VotingSchedule())  # the hourly network, scaled below
        self.scale = source.scale
        self.rng = np.random.default_rng(seed)
        self.nodes = [Node(i, "cache") for i in range(caches)] + [
            Node(caches + i, "client") for i in range(clients)]
        self.caches = [n for n in self.nodes if n.kind == "cache"]
        self._heap: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checked: dict[bytes, docs.ConsensusMeta | None] = {}  # by SHA-1 of the text served
        self.started_at = 0.0

    # -- timing ----------------------------------------------------------------------

    def _check_jitter(self) -> float:
        return float(self.rng.uniform(0.0, self.model.jitter_s)) * self.scale

    def _next_fetch(self, node: Node, fresh_until: float) -> float:
        return fresh_until + float(self.model.draw_next_fetch_s(KINDS[node.kind], self.rng)[0]) * self.scale

    # -- lifecycle -------------------------------------------------------------------

    def now(self) -> float:
        return self.clock.timestamp()

    def start(self) -> FetcherFleet:
        now = self.now()
        self.started_at = now
        with self._lock:
            for node in self.nodes:  # no live consensus: fetch at once (next check)
                heapq.heappush(self._heap, (now + self._check_jitter(), node.ident))
        if getattr(self.clock, "virtual", False):
            self._arm()
        else:
            self._thread = threading.Thread(target=self._run, name="fake-fetchers", daemon=True)
            self._thread.start()
        return self

    def _arm(self) -> None:
        """On a virtual clock: wake at the next due fetch."""
        with self._lock:
            if self._stop.is_set() or not self._heap:
                return
            self._timer = self.clock.call_at(as_utc(self._heap[0][0]), self._tick)

    def _tick(self) -> None:
        self._fetch_due(self.now())
        self._arm()

    def _fetch_due(self, now: float) -> float:
        """Make every fetch due by ``now``; seconds until the next one."""
        with self._lock:
            due = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[1])
        for ident in due:
            self._fetch(self.nodes[ident], self.now())
        with self._lock:
            return (self._heap[0][0] - self.now()) if self._heap else 0.5

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self._fetch_due(self.now())
            self._stop.wait(max(0.01, min(wait, 0.25)))

    # -- fetching --------------------------------------------------------------------

    def _from_authority(self) -> tuple[float, float, tuple[tuple[str, int], ...]] | None:
        text = self.source.served_microdesc(int(self.rng.integers(self.source.mirror_count())))
        if text is None:
            return None
        key = hashlib.sha1(text).digest()  # a truncated copy must not pass as the good one
        if key not in self._checked:
            self._checked[key] = self._verify(text)
        meta = self._checked[key]
        return None if meta is None else (meta.valid_after, meta.fresh_until, meta.params)

    def _verify(self, text: bytes) -> docs.ConsensusMeta | None:
        """The consensus's times and params if it parses and carries enough valid signatures."""
        try:
            docs.verify_consensus(text, list(self.source.certificates()), self.source.mirror_count())
            return docs.consensus_meta(text)
        except KistexpError:
            return None

    def _fetch(self, node: Node, now: float) -> None:
        if node.kind == "cache":
            got = self._from_authority()
        else:
            cache = self.caches[int(self.rng.integers(len(self.caches)))]
            got = None
            if cache.held_va is not None:
                got = (cache.held_va, cache.held_va + self.source.interval_s, cache.held_params)
        with self._lock:
            if got is not None and (node.held_va is None or got[0] > node.held_va):
                va, fu, params = got
                node.held_va, node.held_params = va, params
                node.fetches.append((now, va, _params_line(params)))
                del node.fetches[:-100]
                nxt = max(self._next_fetch(node, fu), now + 0.01)
            else:
                node.failed += got is None
                nxt = now + max(self.model.jitter_s * self.scale, 0.01)
            heapq.heappush(self._heap, (nxt, node.ident))

    # -- queries ---------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        with self._lock:
            holding: dict[str, dict[str, int]] = {}
            running: dict[str, int] = {}
            adoption: dict[float, dict[str, Any]] = {}
            for node in self.nodes:
                key = "none" if node.held_va is None else docs.fmt_time(node.held_va)
                holding.setdefault(key, {"cache": 0, "client": 0})[node.kind] += 1
                params = _params_line(node.held_params) if node.held_va else "(no consensus)"
                running[params] = running.get(params, 0) + 1
                for t, va, p in node.fetches:
                    entry = adoption.setdefault(va, {"params": p, "cache": [], "client": []})
                    entry[node.kind].append(t - va)
            counts = {"cache": len(self.caches), "client": len(self.nodes) - len(self.caches)}
            return {
                "caches": counts["cache"],
                "clients": counts["client"],
                "seed": self.seed,
                "scale": self.scale,
                "holding": holding,
                "running": running,
                "adoption": [
                    {"valid_after": docs.fmt_time(va), "params": e["params"],
                     **{kind: _delays(e[kind], counts[kind], self.scale) for kind in ("cache", "client")}}
                    for va, e in sorted(adoption.items())
                ],
            }

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": n.ident, "kind": n.kind, "failed_fetches": n.failed,
                     "fetches": [{"at": docs.fmt_time(t), "at_s": t, "valid_after": docs.fmt_time(va), "params": p}
                                 for t, va, p in n.fetches]} for n in self.nodes]


def _delays(values: list[float], total: int, scale: float) -> dict[str, Any]:
    """How many nodes of a class accepted a valid-after, and when (s after it; ``hourly`` = unscaled)."""
    if not values:
        return {"adopted": 0, "of": total}
    arr = np.sort(np.asarray(values))
    q = {p: float(np.quantile(arr, p / 100)) for p in (0, 50, 100)}
    return {"adopted": int(arr.size), "of": total,
            "first_s": round(q[0], 3), "median_s": round(q[50], 3), "last_s": round(q[100], 3),
            "median_hourly_min": round(q[50] / scale / 60, 1)}
