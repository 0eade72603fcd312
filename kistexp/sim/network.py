"""The description of a network to simulate: nodes, channels, circuits, transfers and interval changes.

Build a :class:`Network` with ``add_node``, ``add_channel`` (optional: a circuit hop between two
nodes without a channel gets one with ``default_link``), ``add_circuit``, ``add_transfer`` /
``add_interactive`` and ``change_interval``.  A description only: it holds what the user said,
checked as it is added (``validate`` checks the rest); ``kistexp.sim.state`` compiles it into the
arrays a run works on, and ``kistexp.sim.simulation`` runs it (``run(network, RunConfig(...))``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from kistexp.errors import SimConfigError
from kistexp.sim.config import KIST_INTERVAL_MAX_MS, KIST_INTERVAL_MIN_MS, LinkConfig, NodeConfig


@attrs.frozen
class Transfer:
    """One stream on a circuit: the client sends ``request_bytes`` at ``start_s``; once the whole
    request reached the exit, the exit sends ``response_bytes`` back.  Both are sent as DATA cells
    of 498 payload bytes (at least one cell each)."""

    circuit: int
    request_bytes: int = 498
    response_bytes: int = 5 * 1024 * 1024
    start_s: float = 0.0


@attrs.frozen
class InteractiveFlow:
    """An interactive circuit: one small request/response exchange every ``period_s`` from
    ``start_s`` until ``stop_s`` (each exchange is one :class:`Transfer`)."""

    circuit: int
    start_s: float = 0.0
    stop_s: float = 10.0
    period_s: float = 0.1
    request_bytes: int = 498
    response_bytes: int = 996


def flow_starts(flow: InteractiveFlow) -> np.ndarray:
    """Start times of an interactive flow's exchanges (s)."""
    return np.arange(flow.start_s, flow.stop_s, flow.period_s, dtype=np.float64)


def _flow_arrays(flow: InteractiveFlow) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    starts = flow_starts(flow)
    n = len(starts)
    return (np.full(n, flow.circuit, np.int64), np.full(n, flow.request_bytes, np.int64),
            np.full(n, flow.response_bytes, np.int64), starts)


@attrs.frozen
class IntervalChange:
    """At ``time_s`` node ``node`` starts using ``interval_ms`` (a new consensus, §5.1); it takes
    effect at the node's next ``schedule()``."""

    time_s: float
    node: int
    interval_ms: int


class Network:
    """A mutable description of what to simulate; ids are consecutive ints from 0 per kind."""

    def __init__(self, default_link: LinkConfig | None = None) -> None:
        self.default_link = default_link if default_link is not None else LinkConfig()
        self.nodes: list[NodeConfig] = []
        self.node_names: list[str] = []
        self.channels: list[tuple[int, int, LinkConfig]] = []
        self.circuits: list[tuple[tuple[int, ...], str]] = []
        self.interval_changes: list[IntervalChange] = []
        self._chan_of: dict[tuple[int, int], int] = {}
        self._tr: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | InteractiveFlow] = []
        self._expanded: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._n_transfers = 0

    # -- building -------------------------------------------------------------------------------
    def add_node(self, config: NodeConfig, name: str | None = None) -> int:
        self.nodes.append(config)
        self.node_names.append(name if name is not None else f"{config.role}{len(self.nodes) - 1}")
        return len(self.nodes) - 1

    def add_channel(self, a: int, b: int, link: LinkConfig | None = None) -> int:
        """One TLS/TCP connection between nodes ``a`` and ``b`` (a socket in each direction)."""
        self._check_node(a, "channel")
        self._check_node(b, "channel")
        if a == b:
            raise SimConfigError(f"channel {a}-{b}: a channel joins two different nodes")
        key = (min(a, b), max(a, b))
        if key in self._chan_of:
            raise SimConfigError(f"channel {a}-{b}: the two nodes already have a channel")
        self.channels.append((a, b, link if link is not None else self.default_link))
        self._chan_of[key] = len(self.channels) - 1
        return len(self.channels) - 1

    def channel_between(self, a: int, b: int) -> int | None:
        return self._chan_of.get((min(a, b), max(a, b)))

    def directed_channel(self, src: int, dst: int) -> int:
        """The directed channel ``src`` -> ``dst`` as runs number them (``RunConfig.trace_chan``,
        ``RunConfig.run_log_chan``, ``SimResult.chan_between``): channel i's two directions are
        2 i (its first node to its second) and 2 i + 1."""
        i = self.channel_between(src, dst)
        if i is None:
            raise SimConfigError(f"no channel between nodes {src} and {dst}")
        return 2 * i if self.channels[i][0] == src else 2 * i + 1

    def add_circuit(self, path: Sequence[int], label: str = "default") -> int:
        """A circuit over ``path`` (client first, exit last); missing channels are created."""
        path = tuple(int(n) for n in path)
        if len(path) < 2:
            raise SimConfigError(f"circuit {len(self.circuits)}: path {path} needs at least two nodes")
        for n in path:
            self._check_node(n, f"circuit {len(self.circuits)}")
        for u, v in zip(path, path[1:], strict=False):
            if u == v:
                raise SimConfigError(f"circuit {len(self.circuits)}: path {path} repeats node {u} in a row")
            if self.channel_between(u, v) is None:
                self.add_channel(u, v)
        self.circuits.append((path, str(label)))
        return len(self.circuits) - 1

    def add_transfer(self, transfer: Transfer) -> int:
        self._add_transfers([transfer.circuit], [transfer.request_bytes], [transfer.response_bytes],
                            [transfer.start_s])
        return self._n_transfers - 1

    def add_transfers(self, circuit: Sequence[int], request_bytes: Sequence[int],
                      response_bytes: Sequence[int], start_s: Sequence[float]) -> range:
        """Many transfers at once (parallel sequences); returns their ids."""
        first = self._n_transfers
        self._add_transfers(circuit, request_bytes, response_bytes, start_s)
        return range(first, self._n_transfers)

    def add_interactive(self, flow: InteractiveFlow) -> range:
        """An interactive flow: one exchange (a transfer) every ``period_s``; returns their ids.

        The flow is kept as one record; its exchanges start in the compiled loop, each with
        stream records taken from a pool while it runs (``layout.N_FL``), so that a large network
        of interactive circuits does not hold a record per exchange before it runs."""
        if not (flow.period_s > 0 and math.isfinite(flow.period_s)):
            raise SimConfigError(f"interactive flow on circuit {flow.circuit}: period_s must be > 0")
        if not flow.stop_s >= flow.start_s:
            raise SimConfigError(f"interactive flow on circuit {flow.circuit}: stop_s is before start_s")
        if not (math.isfinite(flow.start_s) and flow.start_s >= 0 and math.isfinite(flow.stop_s)):
            raise SimConfigError(f"interactive flow on circuit {flow.circuit}: start_s and stop_s must be "
                                 "finite and >= 0")
        if not (isinstance(flow.circuit, (int, np.integer)) and 0 <= flow.circuit < len(self.circuits)):
            raise SimConfigError(f"interactive flow: circuit {flow.circuit!r} does not exist "
                                 f"(have {len(self.circuits)} circuits)")
        if flow.request_bytes < 0 or flow.response_bytes < 0:
            raise SimConfigError(f"interactive flow on circuit {flow.circuit}: request_bytes and "
                                 "response_bytes must be >= 0")
        n = len(flow_starts(flow))
        first = self._n_transfers
        if n:
            self._tr.append(flow)
            self._n_transfers += n
            self._expanded = None
        return range(first, self._n_transfers)

    def change_interval(self, change: IntervalChange) -> None:
        self.interval_changes.append(change)

    @property
    def n_transfers(self) -> int:
        return self._n_transfers

    # -- helpers --------------------------------------------------------------------------------
    def _check_node(self, n: int, where: str) -> None:
        if not (isinstance(n, (int, np.integer)) and 0 <= n < len(self.nodes)):
            raise SimConfigError(f"{where}: node {n!r} does not exist (have {len(self.nodes)} nodes)")

    def _add_transfers(self, circuit, request_bytes, response_bytes, start_s) -> None:
        circ = np.asarray(circuit, dtype=np.int64)
        req = np.asarray(request_bytes, dtype=np.int64)
        resp = np.asarray(response_bytes, dtype=np.int64)
        start = np.asarray(start_s, dtype=np.float64)
        if not (circ.shape == req.shape == resp.shape == start.shape and circ.ndim == 1):
            raise SimConfigError("transfers: circuit, request_bytes, response_bytes and start_s differ in length")
        if len(circ) == 0:
            return
        if circ.min() < 0 or circ.max() >= len(self.circuits):
            raise SimConfigError(f"transfer: circuit {int(circ.max())} does not exist "
                                 f"(have {len(self.circuits)} circuits)")
        if req.min() < 0 or resp.min() < 0:
            raise SimConfigError("transfer: request_bytes and response_bytes must be >= 0")
        if not np.all(np.isfinite(start)) or start.min() < 0:
            raise SimConfigError("transfer: start_s must be finite and >= 0")
        self._tr.append((circ, req, resp, start))
        self._n_transfers += len(circ)
        self._expanded = None

    def transfer_parts(self) -> list:
        """The transfers in id order: chunks of parallel arrays (circuit, request_bytes,
        response_bytes, start_s) and :class:`InteractiveFlow` records."""
        return list(self._tr)

    def transfer_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every transfer's circuit, request_bytes, response_bytes and start_s (interactive flows
        expanded into their exchanges), by transfer id."""
        if self._expanded is not None:
            return self._expanded
        if not self._tr:
            e = np.zeros(0, np.int64)
            return e, e, e, np.zeros(0, np.float64)
        n = self._n_transfers
        out = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float64))
        first = 0
        for part in self._tr:  # filled part by part: millions of exchanges are expanded once, not twice
            if isinstance(part, InteractiveFlow):
                part = _flow_arrays(part)
            k = len(part[0])
            for dst, src in zip(out, part, strict=True):
                dst[first:first + k] = src
            first += k
        self._expanded = out
        return out

    def validate(self) -> None:
        if not self.nodes:
            raise SimConfigError("network: no nodes")
        for i, n in enumerate(self.nodes):
            n.validate(f"node[{i}]")
        for i, (_, _, link) in enumerate(self.channels):
            link.validate(f"channel[{i}].link")
        for ch in self.interval_changes:
            self._check_node(ch.node, "interval change")
            if not (math.isfinite(ch.time_s) and ch.time_s >= 0):
                raise SimConfigError(f"interval change: time_s={ch.time_s!r} must be finite and >= 0")
            if (isinstance(ch.interval_ms, bool) or not isinstance(ch.interval_ms, int)
                    or not KIST_INTERVAL_MIN_MS <= ch.interval_ms <= KIST_INTERVAL_MAX_MS):
                raise SimConfigError(f"interval change: interval_ms={ch.interval_ms!r} must be in "
                                     f"[{KIST_INTERVAL_MIN_MS}, {KIST_INTERVAL_MAX_MS}]")
