"""A steppable run: advance a network in time, hand nodes new consensus parameters, measure windows.

``Simulation(network, run_config)`` validates and builds the state (refusing, before allocating
the run-time arrays, a network too large for ``memory_limit_bytes``); ``advance_to(t_s)`` runs the
compiled event loop up to and including simulated time ``t_s``; ``apply(nodes, params)`` hands
nodes a new consensus parameter set at the current time through the schedulers' hooks (tor's
``scheduler_notify_networkstatus_changed`` and ``scheduler_t.on_new_consensus``, the EWMA
``cmux_ewma_set_options`` and the congestion-control parameters read per new circuit);
``window(t0, t1)`` measures what happened between two instants; ``result()`` is the whole run as a
:class:`SimResult`.  ``run(network, run_config)`` is ``Simulation(...).advance_to(duration)`` then
``result()``: the state lives entirely in the arrays, so a run advanced in pieces is identical to one
call.  ``warm_up`` and ``ensure_compiled`` compile the event loop (or load it from the cache) before
timed work.  The network comes described (``kistexp.sim.network``); ``kistexp.sim.state`` builds and
grows the arrays.

Consensus parameters are clamped per the node's tor version exactly as ``kistexp.params`` says
tor clamps them; a parameter absent from the set takes its default (a consensus replaces the
previous one); torrc overrides (``NodeConfig.torrc_overrides``) win over the consensus.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from kistexp import params as tor_params
from kistexp.errors import SimConfigError
from kistexp.sim import circuittrace, numbacache
from kistexp.sim import flowcontrol as fc
from kistexp.sim import layout as L
from kistexp.sim.cmux_ewma import ewma_set_options, ln_scale_factor
from kistexp.sim.config import NodeConfig, RunConfig
from kistexp.sim.engine import run_kernel, run_kernel_lean
from kistexp.sim.network import Network
from kistexp.sim.result import SimResult, hist_percentile_ns, label_hist
from kistexp.sim.scheduler import notify_networkstatus_changed, notify_new_options, select_scheduler
from kistexp.sim.state import (
    CC_PARAMS,
    build_state,
    check_memory,
    grow_cells,
    grow_events,
    grow_kq,
    grow_streams,
    seed_events,
)

KIST_RELAY_PARAM = "KISTSchedRunInterval"
KIST_CLIENT_PARAM = "KISTSchedRunIntervalClient"
HALFLIFE_PARAM = "CircuitPriorityHalflifeMsec"
#: a torrc option, handed over with the consensus for convenience (tor re-reads it on a reload:
#: ``scheduler_conf_changed`` -> ``on_new_options``); absent means unchanged
SOCK_BUF_OPTION = "KISTSockBufSizeFactor"
#: the parameters the model reads; every other name tor knows (``kistexp.params``) does not change
#: what the simulated relays do and is ignored
MODELLED_PARAMS = (KIST_RELAY_PARAM, KIST_CLIENT_PARAM, HALFLIFE_PARAM, *CC_PARAMS)

#: node series that are cumulative counters (window = difference of two snapshots)
WINDOW_COUNTERS = {
    "scheduler_runs": L.NS_RUNS,
    "socket_info_syscalls": L.NS_SYSCALLS,
    "kernel_writes": L.NS_WRITES,
    "cells_sent": L.NS_CELLS_SENT,
    "cells_received": L.NS_CELLS_RECV,
    "crypto_layers": L.NS_CRYPTO,
    "digests": L.NS_DIGESTS,
    "bytes_written": L.NS_BYTES_WRITTEN,
}
_COUNTER_NI = {L.NS_RUNS: L.NI_RUNS, L.NS_SYSCALLS: L.NI_SYSCALLS, L.NS_WRITES: L.NI_WRITES,
               L.NS_CELLS_SENT: L.NI_CELLS_SENT, L.NS_CELLS_RECV: L.NI_CELLS_RECV, L.NS_CRYPTO: L.NI_CRYPTO,
               L.NS_DIGESTS: L.NI_DIGESTS, L.NS_BYTES_WRITTEN: L.NI_BYTES_WRITTEN}
WINDOW_PEAKS = {"peak_app_bytes": (L.NS_PEAK_APP, L.NI_WPEAK_APP),
                "peak_kernel_bytes": (L.NS_PEAK_KERN, L.NI_WPEAK_KERN),
                "peak_queued_bytes": (L.NS_PEAK_TOTAL, L.NI_WPEAK_TOTAL)}
WINDOW_LEVELS = {"app_bytes": L.NS_APP_BYTES, "kernel_bytes": L.NS_KERN_BYTES}


@attrs.frozen
class AppliedConsensus:
    """What one node runs with after ``Simulation.apply``: the effective values and which of the
    handed values tor clamped."""

    node: int
    name: str
    scheduler: str
    values: dict[str, float]
    clamped: tuple[str, ...]


@attrs.frozen
class _Snapshot:
    counters: np.ndarray  # [len(WINDOW_COUNTERS), node] cumulative
    chan_bytes: np.ndarray  # [chan] cumulative wire bytes
    hist: np.ndarray  # [kind, label, bin] cumulative
    peaks: np.ndarray | None  # [len(WINDOW_PEAKS), node]: peaks since the last sample (marks only)


@attrs.frozen(eq=False)
class RunWindow:
    """Measurements of ``[t0_s, t1_s)`` of one run (frozen copies).

    Counters count the events after the snapshot at ``t0_s`` up to the one at ``t1_s``; a
    snapshot at an instant includes that instant's events.  ``node_peaks`` are the peaks of the
    sample intervals that end inside the window (and, if ``t1_s`` is not a sample time, the partial
    interval before it); ``node_levels`` are the levels at the sample times in ``[t0_s, t1_s)``.
    ``transfer_*`` are the transfers whose last byte arrived in the window.
    """

    t0_s: float
    t1_s: float
    node_names: tuple[str, ...]
    node_roles: tuple[str, ...]
    node_schedulers: tuple[str, ...]     # at the end of the window
    labels: tuple[str, ...]
    node_counters: dict[str, np.ndarray]  # name -> [node], events in the window
    node_peaks: dict[str, np.ndarray]     # name -> [node]
    node_levels: dict[str, np.ndarray]    # name -> [sample in window, node]
    chan_src: np.ndarray
    chan_dst: np.ndarray
    chan_bytes: np.ndarray                # [chan] wire bytes sent in the window
    delay_hist: np.ndarray                # [kind(app, kernel), label, bin]
    transfer_circuit: np.ndarray
    transfer_label: tuple[str, ...]
    transfer_response_bytes: np.ndarray
    transfer_start_s: np.ndarray
    transfer_ttfb_s: np.ndarray           # after start_s
    transfer_ttlb_s: np.ndarray

    @property
    def duration_s(self) -> float:
        return self.t1_s - self.t0_s

    def node_index(self, node: int | str) -> int:
        return self.node_names.index(node) if isinstance(node, str) else int(node)

    def node_counts(self, node: int | str) -> dict[str, int]:
        """The cost model's inputs (``costmodel.NodeWork`` fields) for one node in the window."""
        i = self.node_index(node)
        return {k: int(v[i]) for k, v in self.node_counters.items()}

    def channel_throughput_bytes_per_s(self, chan: int) -> float:
        return float(self.chan_bytes[chan] / self.duration_s)

    def node_bytes_per_s(self, node: int | str) -> float:
        """Wire bytes a node sent plus received per second (both directions of its channels)."""
        i = self.node_index(node)
        sel = (self.chan_src == i) | (self.chan_dst == i)
        return float(self.chan_bytes[sel].sum() / self.duration_s)

    def delay_hist_for(self, kind: str = "app", label: str | None = None) -> np.ndarray:
        return label_hist(self.delay_hist, self.labels, kind, label)

    def delay_percentile_ms(self, kind: str = "app", q: float = 50.0, label: str | None = None) -> float:
        return hist_percentile_ns(self.delay_hist_for(kind, label), q) / 1e6


class Simulation:
    """One run of ``network`` under ``run_config``, advanced step by step (see the module docstring)."""

    def __init__(self, network: Network, run_config: RunConfig | None = None) -> None:
        rc = run_config if run_config is not None else RunConfig()
        rc.validate()
        network.validate()
        self.network = network
        self.run_config = rc
        S, meta = build_state(network, rc)
        check_memory(S, rc, "the network")
        seed_events(S)
        self._S = S
        self._meta = meta
        self._end_ns = int(S.g[L.G_END])
        self._now_ns = 0
        self._wall_s = 0.0
        self._marks: dict[int, _Snapshot] = {}
        self._sample_ns = int(S.g[L.G_SAMPLE_NS])
        self._kind_names = {L.SCHED_KIST: "kist", L.SCHED_KISTLITE: "kistlite", L.SCHED_VANILLA: "vanilla"}

    # -- time ------------------------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self._now_ns / 1e9

    @property
    def duration_s(self) -> float:
        return self.run_config.duration_s

    def _time_ns(self, t_s: float, what: str) -> int:
        if isinstance(t_s, bool) or not isinstance(t_s, numbers.Real) or not math.isfinite(t_s):
            raise SimConfigError(f"{what}={t_s!r}: must be a finite number of seconds")
        return int(round(t_s * 1e9))

    def advance_to(self, t_s: float, progress: Callable[[float], None] | None = None) -> None:
        """Run every event up to and including simulated time ``t_s`` (now_s <= t_s <= duration).

        ``progress``, if given, is called about 100 times with the fraction of this step done.
        """
        t_ns = self._time_ns(t_s, "advance_to t_s")
        if t_ns < self._now_ns:
            raise SimConfigError(f"advance_to t_s={t_s!r}: the run is already at {self.now_s:g} s "
                                 "(a simulation only moves forward)")
        if t_ns > self._end_ns:
            raise SimConfigError(f"advance_to t_s={t_s!r}: beyond the run's duration_s="
                                 f"{self.run_config.duration_s!r}")
        S = self._S
        kernel = run_kernel_lean if L.is_lean(S) else run_kernel
        start = self._now_ns
        steps = 100 if progress is not None else 1
        wall0 = time.perf_counter()
        for step in range(1, steps + 1):
            S.g[L.G_END] = t_ns if step == steps else start + (t_ns - start) * step // steps
            while True:
                status = kernel(L.descriptor(S))
                if status == L.RS_GROW_CELLS:
                    S = grow_cells(S)
                elif status == L.RS_GROW_EVENTS:
                    S = grow_events(S)
                elif status == L.RS_GROW_KQ:
                    S = grow_kq(S)
                elif status == L.RS_GROW_STREAMS:
                    S = grow_streams(S)
                else:
                    break
                self._S = S
                check_memory(S, self.run_config, f"the run at t={S.g[L.G_NOW] / 1e9:.3f} s")
            if progress is not None:
                progress(step / steps)
        self._wall_s += time.perf_counter() - wall0
        self._S = S
        # every event up to t has run: the hooks of apply() act at t
        S.g[L.G_NOW] = t_ns
        self._now_ns = t_ns
        if t_ns % self._sample_ns and t_ns not in self._marks:
            self._marks[t_ns] = self._snapshot_now()

    # -- consensus parameters ----------------------------------------------------------------------
    def _node_ids(self, nodes: int | str | Iterable[int | str]) -> list[int]:
        if isinstance(nodes, (int, str)) and not isinstance(nodes, bool):
            nodes = [nodes]
        ids = []
        names = self.network.node_names
        for n in nodes:
            if isinstance(n, str):
                if n not in names:
                    raise SimConfigError(f"apply: no node named {n!r}")
                ids.append(names.index(n))
            elif isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 0 <= int(n) < len(names):
                ids.append(int(n))
            else:
                raise SimConfigError(f"apply: node {n!r} is not a node id (0..{len(names) - 1}) or name")
        return ids

    def _check_params(self, where: str, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            if key == SOCK_BUF_OPTION:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value < 0:
                    raise SimConfigError(f"{where}: {key}={value!r}: must be a number >= 0 (tor rejects "
                                         "a negative KISTSockBufSizeFactor)")
                continue
            if tor_params.get(key) is None:
                hint = tor_params.suggest(key, [*tor_params.names(), SOCK_BUF_OPTION])
                raise SimConfigError(f"{where}: {key!r} is not a consensus parameter tor knows"
                                     + (f" (did you mean {hint!r}?)" if hint else ""))
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise SimConfigError(f"{where}: {key}={value!r}: consensus values are integers")
            if not tor_params.INT32_MIN <= int(value) <= tor_params.INT32_MAX:
                raise SimConfigError(f"{where}: {key}={value!r}: out of range (consensus values are "
                                     "32-bit signed integers)")

    def _apply_where(self, ids: Sequence[int]) -> str:
        """The nodes an ``apply`` names, for its errors: every one up to three, then a count."""
        names = [f"{i} ({self.network.node_names[i]})" for i in ids[:3]]
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        return f"apply to node{'s' if len(ids) > 1 else ''} {', '.join(names)}{more}"

    def _effective(self, i: int, values: Mapping[str, float]) -> tuple[int, int, np.ndarray, list[str], dict]:
        """Interval, scheduler kind, cc values and clamped names for node ``i`` (no state change)."""
        cfg = self.network.nodes[i]
        version = cfg.version
        where = self._apply_where([i])
        clamped: list[str] = []
        eff: dict[str, float] = {}

        def value(name: str, torrc: int | None = None) -> int | None:
            if tor_params.get(name).bounds_for(version) is None:
                return None  # this tor does not read the parameter
            r = tor_params.effective_value(name, values.get(name), version, torrc)
            if r.clamped:
                clamped.append(name)
            eff[name] = r.value
            return r.value

        # §5.1: clients read KISTSchedRunIntervalClient since it exists, relays KISTSchedRunInterval
        client_since = tor_params.get(KIST_CLIENT_PARAM).current.versions.low
        name = KIST_CLIENT_PARAM if cfg.role == "client" and version >= client_since else KIST_RELAY_PARAM
        torrc = cfg.kist_interval_ms if "KISTSchedRunInterval" in cfg.torrc_overrides else None
        interval = value(name, torrc)
        if interval is None:
            interval = int(self._S.ni[L.NI_INTERVAL_MS, i])
        kind = select_scheduler(cfg.scheduler_list, interval)
        if kind < 0:
            raise SimConfigError(f"{where}: {name}={interval} disables KIST and the node's Schedulers "
                                 f"{','.join(cfg.scheduler_list)} has nothing else (tor exits)")
        halflife = None
        if "CircuitPriorityHalflife" not in cfg.torrc_overrides:
            halflife = value(HALFLIFE_PARAM)
        cc = self._S.ncc[i].copy()
        for pname, (field, _) in CC_PARAMS.items():
            v = value(pname)
            if v is not None:
                cc[field] = v
        cc[L.C_CC_ALG] = fc.cc_alg_in_use(int(cc[L.C_CC_ALG]))
        eff["cc_alg"] = int(cc[L.C_CC_ALG])
        return interval, kind, cc, clamped, {"halflife": halflife, "eff": eff}

    def apply(self, nodes: int | str | Iterable[int | str],
              params: Mapping[str, float]) -> tuple[AppliedConsensus, ...]:
        """Hand ``nodes`` (ids or names) the consensus parameter set ``params`` at ``now_s``.

        Modelled: KISTSchedRunInterval (relays; clients before 0.4.8.2), KISTSchedRunIntervalClient,
        CircuitPriorityHalflifeMsec and the congestion-control parameters of ``CC_PARAMS`` (read by
        circuits built afterwards); ``KISTSockBufSizeFactor`` (a torrc option, unchanged when
        absent).  Other parameters tor knows are ignored.  Raises :class:`SimConfigError`, before
        changing anything, for an unknown name, a value that is not a 32-bit integer, or a node
        left without a usable scheduler.
        """
        if not isinstance(params, Mapping):
            raise SimConfigError(f"apply: params must be a mapping of parameter names to values, got {params!r}")
        ids = self._node_ids(nodes)
        self._check_params(self._apply_where(ids), params)
        params = {k: float(v) if k == SOCK_BUF_OPTION else int(v) for k, v in params.items()}
        plans = [(i, *self._effective(i, params)) for i in ids]
        S = self._S
        ref = L.descriptor(S)
        out = []
        need_ts = S.ts.shape[1]
        for i, interval, kind, cc, clamped, extra in plans:
            notify_networkstatus_changed(ref, i, kind, interval)
            if extra["halflife"] is not None:
                ewma_set_options(ref, i, ln_scale_factor(extra["halflife"], self.run_config.ewma.tick_s))
            fc.fc_on_new_consensus(ref, i, cc)
            if SOCK_BUF_OPTION in params:
                notify_new_options(ref, i, float(params[SOCK_BUF_OPTION]))
                extra["eff"][SOCK_BUF_OPTION] = float(params[SOCK_BUF_OPTION])
            if S.ni[L.NI_FC, i] == fc.FC_VEGAS:
                need_ts = max(need_ts, fc.timestamp_capacity(int(cc[L.C_SENDME_INC]), int(cc[L.C_SS_MAX])))
            out.append(AppliedConsensus(i, self.network.node_names[i], self._kind_names[kind],
                                        extra["eff"], tuple(clamped)))
        if need_ts > S.ts.shape[1]:
            self._grow_timestamps(need_ts)
        return tuple(out)

    def _grow_timestamps(self, cap: int) -> None:
        """Room for more Vegas send timestamps per circuit direction (each row is a ring)."""
        S = self._S
        old = S.ts
        new = np.zeros((old.shape[0], cap), np.int64)
        n = S.di[L.DI_TS_N]
        head = S.di[L.DI_TS_HEAD]
        idx = (head[:, None] + np.arange(old.shape[1])[None, :]) % old.shape[1]
        new[:, :old.shape[1]] = np.take_along_axis(old, idx, axis=1)
        new[np.arange(old.shape[1])[None, :].repeat(old.shape[0], 0) >= n[:, None]] = 0
        S.di[L.DI_TS_HEAD] = 0
        self._S = S._replace(ts=new)
        check_memory(self._S, self.run_config, f"apply at t={self.now_s:.3f} s")

    def node_scheduler(self, node: int | str) -> str:
        """The scheduler ``node`` runs now."""
        return self._kind_names[int(self._S.ni[L.NI_SCHED, self._node_ids(node)[0]])]

    def node_interval_ms(self, node: int | str) -> int:
        """The KIST run interval ``node`` uses now (0: KIST off)."""
        return int(self._S.ni[L.NI_INTERVAL_MS, self._node_ids(node)[0]])

    # -- measurements ------------------------------------------------------------------------------
    def _snapshot_now(self) -> _Snapshot:
        S = self._S
        return _Snapshot(
            counters=np.stack([S.ni[_COUNTER_NI[f]] for f in WINDOW_COUNTERS.values()]),
            chan_bytes=S.ci[L.CI_BYTES_SENT].copy(), hist=S.hist.copy(),
            peaks=np.stack([S.ni[f] for _, f in WINDOW_PEAKS.values()]))

    def _snapshot_at(self, t_ns: int, what: str) -> _Snapshot:
        S = self._S
        if t_ns == 0:
            return _Snapshot(np.zeros((len(WINDOW_COUNTERS), S.ni.shape[1]), np.int64),
                             np.zeros(S.ci.shape[1], np.int64), np.zeros_like(S.hist), None)
        if t_ns in self._marks:
            return self._marks[t_ns]
        i = t_ns // self._sample_ns
        if t_ns % self._sample_ns == 0 and i < int(S.g[L.G_SAMPLE]):
            return _Snapshot(np.stack([S.ser_node[f, i] for f in WINDOW_COUNTERS.values()]),
                             S.ser_chan[i].copy(), S.ser_hist[i].copy(), None)
        raise SimConfigError(f"window {what}={t_ns / 1e9!r}: not a sample time (a multiple of "
                             f"sample_interval_s={self.run_config.sample_interval_s!r}) nor a time the run "
                             "was advanced to")

    def window(self, t0_s: float, t1_s: float) -> RunWindow:
        """Measurements of ``[t0_s, t1_s)``; both bounds within ``[0, now_s]``, each a sample time,
        0 or a time the run was advanced to."""
        t0 = self._time_ns(t0_s, "window t0_s")
        t1 = self._time_ns(t1_s, "window t1_s")
        if not 0 <= t0 < t1:
            raise SimConfigError(f"window [{t0_s!r}, {t1_s!r}): needs 0 <= t0_s < t1_s")
        if t1 > self._now_ns:
            raise SimConfigError(f"window [{t0_s!r}, {t1_s!r}): the run has only reached {self.now_s:g} s "
                                 f"(duration_s={self.run_config.duration_s!r})")
        a = self._snapshot_at(t0, "t0_s")
        b = self._snapshot_at(t1, "t1_s")
        S = self._S
        net = self.network
        # sample intervals ending in (t0, t1]; levels at samples in [t0, t1)
        taken = int(S.g[L.G_SAMPLE])
        times = np.arange(taken, dtype=np.int64) * self._sample_ns
        ends = (times > t0) & (times <= t1)
        at = (times >= t0) & (times < t1)
        peaks = {}
        for k, (f, _) in enumerate(WINDOW_PEAKS.values()):
            v = S.ser_node[f][:taken][ends].max(axis=0) if ends.any() else np.zeros(S.ni.shape[1], np.int64)
            if b.peaks is not None:
                v = np.maximum(v, b.peaks[k])
            peaks[list(WINDOW_PEAKS)[k]] = v
        ttlb = S.ti[L.TI_TTLB]
        done = (ttlb >= t0) & (ttlb < t1)
        start = S.ti[L.TI_START][done]
        circ = self._meta["t_circ"][done]
        labels = tuple(lbl for _, lbl in net.circuits)
        return RunWindow(
            t0_s=t0 / 1e9, t1_s=t1 / 1e9, node_names=tuple(net.node_names),
            node_roles=tuple(n.role for n in net.nodes),
            node_schedulers=tuple(self._kind_names[int(k)] for k in S.ni[L.NI_SCHED]),
            labels=tuple(self._meta["labels"]),
            node_counters={k: b.counters[j] - a.counters[j] for j, k in enumerate(WINDOW_COUNTERS)},
            node_peaks=peaks,
            node_levels={k: S.ser_node[f][:taken][at].copy() for k, f in WINDOW_LEVELS.items()},
            chan_src=self._meta["chan_nodes"][0].copy(), chan_dst=self._meta["chan_nodes"][1].copy(),
            chan_bytes=b.chan_bytes - a.chan_bytes, delay_hist=b.hist - a.hist,
            transfer_circuit=circ.copy(), transfer_label=tuple(labels[int(c)] for c in circ),
            transfer_response_bytes=self._meta["t_resp"][done].copy(),
            transfer_start_s=start / 1e9,
            transfer_ttfb_s=(S.ti[L.TI_TTFB][done] - start) / 1e9,
            transfer_ttlb_s=(ttlb[done] - start) / 1e9,
        )

    def circuit_trace(self, t0_s: float, t1_s: float) -> circuittrace.CircuitTrace:
        """What observers at the traced circuits' guards and exits saw in ``[t0_s, t1_s)``
        (``RunConfig.circuit_trace``; ``kistexp.sim.circuittrace``): both bounds multiples of the
        trace's ``block_s`` within ``[0, now_s]``."""
        t0 = self._time_ns(t0_s, "circuit_trace t0_s")
        t1 = self._time_ns(t1_s, "circuit_trace t1_s")
        lay = self._meta["trace_layout"]
        circuittrace.check_bounds(lay, t0, t1)
        if t0 < 0 or t1 > self._now_ns:
            raise SimConfigError(f"circuit_trace [{t0_s!r}, {t1_s!r}): the run has only reached {self.now_s:g} s")
        return circuittrace.extract(self._S, lay, self.network, self._meta, t0, t1)

    def _drop_run_arrays(self) -> None:
        """Free what only running needs (cell pool, kernel queues, events, streams): the one-call
        ``run()`` makes its result and discards the simulation, and on a large network these
        arrays are a third of its memory at the moment the result is made."""
        S = self._S
        self._S = S._replace(**{name: np.empty((0,) + getattr(S, name).shape[1:], getattr(S, name).dtype)
                                for name in ("cells", "free", "kq", "ctkq", "ev", "nq", "evq", "eqfree", "si",
                                             "pair_tr",
                                             "pfree")})

    def result(self) -> SimResult:
        """Everything measured so far, as the one-call ``run()`` returns it (complete once the run
        has reached its duration)."""
        return SimResult.from_state(self._S, self._meta, self.network, self.run_config, self._wall_s)


def run(network: Network, run_config: RunConfig | None = None,
        progress: Callable[[float], None] | None = None) -> SimResult:
    """Simulate ``network`` for ``run_config.duration_s``; deterministic for a given seed.

    The one-call form of :class:`Simulation`: advance to the end, return the result.
    ``progress``, if given, is called with the fraction of simulated time done (0..1) about 100
    times.  Raises :class:`SimConfigError` for invalid input (before anything runs) or when the
    state would exceed ``run_config.memory_limit_bytes``.
    """
    sim = Simulation(network, run_config)
    sim.advance_to(sim.duration_s, progress)
    sim._drop_run_arrays()
    return sim.result()


def warm_up(keep_raw_delays: bool = False) -> float:
    """Compile the event loop, or load it from the cache, on a two-node network; returns the seconds
    it took.  A run keeping raw per-cell delays (``RunConfig.cell_delays_max`` > 0) uses a second
    compiled kernel, hence the flag.  For a process that should pay the one to two minutes of a
    first compile before its measured or timed work (the benchmarks, the test workers)."""
    t0 = time.perf_counter()
    net = Network()
    client, exit_ = net.add_node(NodeConfig(role="client")), net.add_node(NodeConfig(role="exit"))
    net.add_transfers([net.add_circuit([client, exit_])], [498], [100_000], [0.0])
    run(net, RunConfig(duration_s=0.2, cell_delays_max=100 if keep_raw_delays else 0))
    return time.perf_counter() - t0


def ensure_compiled(notify: Callable[[str], None] | None = None) -> float | None:
    """Compile the simulator now if this machine has not yet (``numbacache.is_compiled``), calling
    ``notify`` with what is happening first; the seconds it took, or None when it was compiled already
    (then nothing is said and loading the cache is left to the first run)."""
    if numbacache.is_compiled():
        return None
    writable = numbacache._active is not None
    if notify is not None:
        notify("compiling the simulator, first run only (one to two minutes)" if writable else
               f"compiling the simulator (one to two minutes; no writable cache at {numbacache.cache_base()}, "
               "so every run compiles)")
    took = warm_up()
    numbacache.mark_compiled()
    return took
