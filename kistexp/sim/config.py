"""Frozen configuration values of the simulator, validated before anything runs.

Every check raises :class:`kistexp.errors.SimConfigError` with a one-line message naming the
offending key. Defaults and bounds come from ``kist-ewma.md`` (cited as §N).
"""

from __future__ import annotations

import math
import numbers

import attrs

from kistexp.errors import SimConfigError
from kistexp.params import TorVersion
from kistexp.sim.costmodel import DEFAULT_COST_MODEL

ROLES = ("client", "guard", "middle", "exit", "relay")
SCHEDULERS = ("kist", "kistlite", "vanilla")
FLOW_CONTROL_KINDS = ("sendme", "vegas")
#: tor's ``Schedulers`` default, §3
DEFAULT_SCHEDULERS = ("kist", "kistlite", "vanilla")
#: the tor version a node runs unless told otherwise (Debian's tor here)
DEFAULT_TOR_VERSION = "0.4.9.11"
#: torrc options whose setting makes tor ignore a consensus parameter (kistexp.params'
#: ``torrc_override``): KISTSchedRunInterval (both KIST parameters, §5.1) and
#: CircuitPriorityHalflife (CircuitPriorityHalflifeMsec, §11.2)
TORRC_OVERRIDES = ("KISTSchedRunInterval", "CircuitPriorityHalflife")

#: §5.1: consensus bounds are 2..100; a torrc ``KISTSchedRunInterval 1`` is also accepted.
KIST_INTERVAL_MIN_MS = 1
KIST_INTERVAL_MAX_MS = 100

#: Linux TCP defaults (loopback mss is 65483 with the 65536-byte loopback MTU).
DEFAULT_MSS = 1448
LOOPBACK_MSS = 65483


def _fail(where: str, key: str, value: object, why: str) -> None:
    raise SimConfigError(f"{where}.{key}={value!r}: {why}")


def _finite(where: str, key: str, value: float, *, minimum: float = 0.0, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(where, key, value, "must be a number")
    if not math.isfinite(value):
        _fail(where, key, value, "must be finite")
    if strict and value <= minimum:
        _fail(where, key, value, f"must be > {minimum:g}")
    if not strict and value < minimum:
        _fail(where, key, value, f"must be >= {minimum:g}")


def _int(where: str, key: str, value: int, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(where, key, value, "must be an integer")
    if value < lo or (hi is not None and value > hi):
        _fail(where, key, value, f"must be in [{lo}, {hi if hi is not None else 'inf'}]")


@attrs.frozen
class NodeConfig:
    """One tor process.

    ``kist_interval_ms`` is the node's current ``KISTSchedRunInterval`` (``KISTSchedRunIntervalClient``
    on a client), §5.1: 2..100 from a consensus, 1 possible from torrc.  ``kernel_tick_ms`` is the
    resolution J of ``CLOCK_MONOTONIC_COARSE`` that quantises the KIST timer (§5.2; 4 ms on a
    HZ=250 kernel).  ``pass_time_us`` is the fixed part of the duration of the libevent pass that
    holds a scheduler run (the ``p`` of §5.2).
    ``cell_cpu_us`` is the CPU time the node's single event loop spends on each received cell (TLS
    read, relay crypto, handling) before the cell is queued: arriving flights are processed one
    after another.  ``cell_send_cpu_us`` is the time a scheduler run spends on each cell it moves
    (TLS write and its share of a write() call): a run's pass lasts ``pass_time_us`` plus that per
    cell, which is the ``p`` of §5.2 (it stamps ``last_run``, bounds the next run at
    ``p + interval - 1`` and occupies the event loop).  A node saturates at
    1 / (cell_cpu_us + cell_send_cpu_us) cells per second.  Both defaults are the cost model's
    per-cell figures (``CostModel.relay_cell_receive_ns``, about 1.56 us, and
    ``CostModel.cell_send_ns``, about 0.62 us).
    ``nic_rate_bytes_per_s`` = 0 means an unlimited NIC.

    ``tor_version`` decides how consensus parameters handed to the node at run time
    (``Simulation.apply``) are clamped (``kistexp.params``).  ``schedulers`` is tor's ``Schedulers``
    option (§3, priority order); empty means ``scheduler`` followed by the entries of tor's default
    list after it (``kist`` -> KIST, KISTLite, Vanilla).  ``scheduler`` is the one running at the
    start and must be the list's first entry.  ``flow_control`` is the node's congestion-control
    support ("vegas" or "sendme"; None = the run's ``FlowControlConfig.kind``): a circuit uses Vegas
    only if both its ends support it and both have ``cc_alg`` != 0.  ``torrc_overrides`` names the
    torrc options set on this node (``KISTSchedRunInterval``, ``CircuitPriorityHalflife``): the
    matching consensus parameters are then ignored, as tor does.
    """

    role: str = "relay"
    scheduler: str = "kist"
    kist_interval_ms: int = 10
    kernel_tick_ms: float = 4.0
    nic_rate_bytes_per_s: float = 0.0
    sock_buf_factor: float = 1.0
    pass_time_us: float = 10.0
    cell_cpu_us: float = DEFAULT_COST_MODEL.relay_cell_receive_ns / 1000.0
    cell_send_cpu_us: float = DEFAULT_COST_MODEL.cell_send_ns / 1000.0
    tor_version: str = DEFAULT_TOR_VERSION
    schedulers: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    flow_control: str | None = None
    torrc_overrides: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def scheduler_list(self) -> tuple[str, ...]:
        """The node's ``Schedulers`` option, in tor's priority order."""
        if self.schedulers:
            return self.schedulers
        return DEFAULT_SCHEDULERS[DEFAULT_SCHEDULERS.index(self.scheduler):]

    @property
    def version(self) -> TorVersion:
        return TorVersion.parse(self.tor_version)

    def validate(self, where: str = "node") -> None:
        if self.role not in ROLES:
            _fail(where, "role", self.role, f"unknown role (one of {', '.join(ROLES)})")
        if self.scheduler not in SCHEDULERS:
            _fail(where, "scheduler", self.scheduler, f"unknown scheduler (one of {', '.join(SCHEDULERS)})")
        _int(where, "kist_interval_ms", self.kist_interval_ms, KIST_INTERVAL_MIN_MS, KIST_INTERVAL_MAX_MS)
        _finite(where, "kernel_tick_ms", self.kernel_tick_ms, minimum=0.0, strict=True)
        if self.kernel_tick_ms > 100:
            _fail(where, "kernel_tick_ms", self.kernel_tick_ms, "must be <= 100 (HZ >= 10)")
        nic = 0.0 if self.nic_rate_bytes_per_s is None else self.nic_rate_bytes_per_s
        _finite(where, "nic_rate_bytes_per_s", nic)
        _finite(where, "sock_buf_factor", self.sock_buf_factor)
        _finite(where, "pass_time_us", self.pass_time_us, minimum=0.0, strict=True)
        _finite(where, "cell_cpu_us", self.cell_cpu_us)
        _finite(where, "cell_send_cpu_us", self.cell_send_cpu_us)
        try:
            TorVersion.parse(self.tor_version)
        except ValueError as e:
            _fail(where, "tor_version", self.tor_version, str(e))
        for s in self.schedulers:
            if s not in SCHEDULERS:
                _fail(where, "schedulers", self.schedulers, f"unknown scheduler {s!r} (one of {', '.join(SCHEDULERS)})")
        if len(set(self.schedulers)) != len(self.schedulers):
            _fail(where, "schedulers", self.schedulers, "lists a scheduler twice")
        if self.schedulers and self.schedulers[0] != self.scheduler:
            _fail(where, "schedulers", self.schedulers, f"must start with the running scheduler {self.scheduler!r}")
        if self.flow_control is not None and self.flow_control not in FLOW_CONTROL_KINDS:
            _fail(where, "flow_control", self.flow_control, "unknown flow control (sendme, vegas or None)")
        for o in self.torrc_overrides:
            if o not in TORRC_OVERRIDES:
                _fail(where, "torrc_overrides", self.torrc_overrides,
                      f"{o!r} is not a torrc option that overrides a consensus parameter "
                      f"(one of {', '.join(TORRC_OVERRIDES)})")


@attrs.frozen
class LinkConfig:
    """One TLS/TCP connection (both directions share these parameters, each has its own socket).

    ``send_buffer_bytes`` = 0 models Linux send-buffer autotuning (``tcp_sndbuf_expand``:
    about 2 * max(cwnd, 10) * mss of payload, capped at ``send_buffer_max_bytes``).
    ``rate_limited`` is true for connections tor rate-limits (every connection of a
    ``TestingTorNetwork``): each write call then moves at most 16448 B (§7.4).
    """

    rtt_ms: float = 0.1
    mss: int = DEFAULT_MSS
    initial_cwnd: int = 10
    loss_rate: float = 0.0
    send_buffer_bytes: int = 0
    send_buffer_max_bytes: int = 4 * 1024 * 1024
    rate_limited: bool = True
    nagle: bool = False
    """Linux's Nagle algorithm on both sockets (tor never sets ``TCP_NODELAY``) together with the
    receiver's delayed-ACK rules that decide how long a held segment waits (tcp.py). Lossless
    links only; off keeps the older model, which acknowledges every flight one RTT after it left."""
    receive_window_bytes: int = 65535
    """With ``nagle``: the window the receiver advertises, fixed at Linux's first window (at most
    65,535 B, ``tcp_select_initial_window`` with tcp_rmem's 131,072-byte default buffer). It
    bounds the bytes in flight, caps the sender's mss at half of it (``tcp_bound_to_half_wnd`` in
    ``tcp_sync_mss``), and the receiver sends a window update when a read frees half of it
    (``tcp_cleanup_rbuf``). Receive-buffer autotuning (``tcp_rcv_space_adjust``) is not
    modelled (docs/simulator.md, "What the model leaves out")."""
    receive_window_max_bytes: int = 0
    """With ``nagle``: 0 keeps the window fixed at ``receive_window_bytes``. Larger, the window
    clamp up to which the receiver raises its window as data arrives (``tcp_grow_window``,
    net/ipv4/tcp_input.c: by ``max(2 * advmss, 2 * len)`` per segment of at least 128 B, each
    growth granting one quick ACK). The sender's mss stays capped by the first window. Off by
    default: with it the fidelity table got worse (docs/simulator.md, "Design choices")."""
    delayed_ack_ms: float = 40.0
    """Linux's delayed-ACK timeout and the ``ato`` window that puts a socket in pingpong mode:
    ``TCP_ATO_MIN`` = ``TCP_DELACK_MIN`` = HZ/25 jiffies = 40 ms (include/net/tcp.h)."""

    def validate(self, where: str = "link") -> None:
        _finite(where, "rtt_ms", self.rtt_ms)
        _int(where, "mss", self.mss, 88, 65483)
        _int(where, "initial_cwnd", self.initial_cwnd, 1, 1000)
        _finite(where, "loss_rate", self.loss_rate)
        if self.loss_rate >= 1.0:
            _fail(where, "loss_rate", self.loss_rate, "must be < 1")
        _int(where, "send_buffer_bytes", self.send_buffer_bytes, 0)
        if self.send_buffer_bytes and self.send_buffer_bytes < 514:
            _fail(where, "send_buffer_bytes", self.send_buffer_bytes, "must be 0 (autotune) or >= 514")
        _int(where, "send_buffer_max_bytes", self.send_buffer_max_bytes, 514)
        _finite(where, "delayed_ack_ms", self.delayed_ack_ms, strict=True)
        _int(where, "receive_window_bytes", self.receive_window_bytes, 2 * 514, 2**31 - 1)
        if self.receive_window_max_bytes:
            _int(where, "receive_window_max_bytes", self.receive_window_max_bytes,
                 self.receive_window_bytes, 2**31 - 1)
        if self.nagle and self.loss_rate > 0:
            _fail(where, "nagle", self.nagle, "is modelled on lossless links only (loss_rate must be 0)")


@attrs.frozen
class EwmaConfig:
    """§11.2: ``CircuitPriorityHalflifeMsec`` (1..INT32_MAX) and ``CircuitPriorityTickSecs`` (1..600)."""

    halflife_ms: int = 30000
    tick_s: int = 10

    def validate(self, where: str = "ewma") -> None:
        _int(where, "halflife_ms", self.halflife_ms, 1, 2**31 - 1)
        _int(where, "tick_s", self.tick_s, 1, 600)

    @property
    def scale_factor(self) -> float:
        """F = 0.5 ** (T / H), §11.3."""
        return 0.5 ** (self.tick_s * 1000.0 / self.halflife_ms)


@attrs.frozen
class FlowControlConfig:
    """§13: legacy SENDME windows (``kind="sendme"``) or Vegas (``kind="vegas"``, cc_alg=2, exit path).

    Defaults are tor 0.4.8.2+'s (§14).  ``cellq_high``/``cellq_low`` are the edge read
    watermarks of §4.  ``exit_read_cells``: the cells' payload an exit reads in one read
    callback of a stream's connection to its server, tor's per-read share for exit connections
    (``connection_bucket_read_limit`` -> ``connection_bucket_get_share``, core/mainloop/
    connection.c: at most 32 * RELAY_PAYLOAD_SIZE = 15,936 bytes), into the connection's inbuf,
    from which it packages what the windows allow; the rest of the server's data waits for the
    next pass of the exit's event loop, the rest of the inbuf for the next SENDME, which packages
    it in its own pass (``circuit_resume_edge_reading_helper``, core/or/relay.c; engine.package).
    0: no share and no inbuf, everything the windows allow at once.
    """

    kind: str = "sendme"
    circwindow: int = 1000
    circ_increment: int = 100
    stream_window: int = 500
    stream_increment: int = 50
    cellq_high: int = 256
    cellq_low: int = 10
    exit_read_cells: int = 32
    edge_write_cells: int = 32
    """A DATA cell's payload waits in its edge connection's outbuf toward the application, which
    each write callback empties by at most this many cells' payload (32 on a rate-limited
    connection, ``connection_bucket_write_limit``: every connection of a relay on the live
    network, and every loopback connection of a ``TestingTorNetwork``, with
    ``CountPrivateBandwidth``), and a stream SENDME owed waits while that outbuf holds more than
    10 cells (``sendme_connection_edge_consider_sending``, core/or/sendme.c).  Fixed SENDME
    windows only: Vegas circuits send no stream SENDMEs.  0: the older model, in which a stream
    SENDME leaves the moment it is owed (docs/simulator.md, "Design choices")."""
    sendme_inc: int = 31
    cwnd_init: int = 124
    cwnd_min: int = 124
    cwnd_inc: int = 1
    cwnd_inc_pct_ss: int = 100
    cwnd_inc_rate: int = 31
    ss_max: int = 5000
    sscap: int = 600
    vegas_alpha: int = 186
    vegas_beta: int = 248
    vegas_gamma: int = 186
    vegas_delta: int = 310
    cwnd_full_gap: int = 4
    cwnd_full_minpct: int = 25
    cwnd_full_per_cwnd: int = 1
    ewma_cwnd_pct: int = 50
    ewma_max: int = 10
    ewma_ss: int = 2

    def validate(self, where: str = "flow_control") -> None:
        if self.kind not in FLOW_CONTROL_KINDS:
            _fail(where, "kind", self.kind, "unknown flow control (sendme or vegas)")
        _int(where, "circwindow", self.circwindow, 100, 1000)
        _int(where, "circ_increment", self.circ_increment, 1, self.circwindow)
        _int(where, "stream_window", self.stream_window, 1, 10000)
        _int(where, "stream_increment", self.stream_increment, 1, self.stream_window)
        _int(where, "cellq_high", self.cellq_high, 1, 1000)
        _int(where, "cellq_low", self.cellq_low, 1, 1000)
        if self.cellq_low >= self.cellq_high:
            _fail(where, "cellq_low", self.cellq_low, "must be below cellq_high")
        _int(where, "exit_read_cells", self.exit_read_cells, 0, 10000)
        _int(where, "edge_write_cells", self.edge_write_cells, 0, 10000)
        _int(where, "sendme_inc", self.sendme_inc, 1, 254)
        _int(where, "cwnd_init", self.cwnd_init, 31, 10000)
        _int(where, "cwnd_min", self.cwnd_min, 31, 1000)
        _int(where, "cwnd_inc", self.cwnd_inc, 1, 1000)
        _int(where, "cwnd_inc_pct_ss", self.cwnd_inc_pct_ss, 1, 500)
        _int(where, "cwnd_inc_rate", self.cwnd_inc_rate, 1, 250)
        _int(where, "ss_max", self.ss_max, 500, 2**31 - 1)
        _int(where, "sscap", self.sscap, 100, 2**31 - 1)
        for key in ("vegas_alpha", "vegas_beta", "vegas_gamma"):
            _int(where, key, getattr(self, key), 0, 1000)
        _int(where, "vegas_delta", self.vegas_delta, 0, 2**31 - 1)
        _int(where, "cwnd_full_gap", self.cwnd_full_gap, 0, 32767)
        _int(where, "cwnd_full_minpct", self.cwnd_full_minpct, 0, 100)
        _int(where, "cwnd_full_per_cwnd", self.cwnd_full_per_cwnd, 0, 1)
        _int(where, "ewma_cwnd_pct", self.ewma_cwnd_pct, 1, 255)
        _int(where, "ewma_max", self.ewma_max, 2, 255)
        _int(where, "ewma_ss", self.ewma_ss, 2, 255)


@attrs.frozen
class CircuitTraceConfig:
    """An opt-in trace of what an observer at each circuit's guard and exit sees
    (``Simulation.circuit_trace``, ``kistexp.sim.circuittrace``): cells per ``window_ms`` window
    entering the guard and leaving the exit (each direction) and reaching the client; the gaps
    between a circuit's cells leaving its exit, as log-spaced histograms per exit and per
    ``block_s``; the exit's RTT samples of the circuit (a cell's packaging to the circuit SENDME
    for it), per circuit and block.  ``circuits``: the circuit ids to trace, () = all.  ``start_s``:
    cells are recorded from one second before it (what is in flight then arrives after it), so a trace
    window may start at ``start_s`` or later; a run spends nothing on recording cells before (a warm-up)."""

    circuits: tuple[int, ...] = attrs.field(default=(), converter=lambda xs: tuple(
        int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else x for x in xs))
    window_ms: float = 100.0
    block_s: float = 1.0
    start_s: float = 0.0

    def validate(self, where: str = "run.circuit_trace") -> None:
        _finite(where, "window_ms", self.window_ms, minimum=1.0)
        _finite(where, "start_s", self.start_s, minimum=0.0)
        _finite(where, "block_s", self.block_s, minimum=self.window_ms / 1000.0)
        ratio = self.block_s * 1000.0 / self.window_ms
        if abs(ratio - round(ratio)) > 1e-9:
            _fail(where, "block_s", self.block_s, f"must be a whole number of windows of {self.window_ms:g} ms")
        for c in self.circuits:
            _int(where, "circuits[]", c, 0)
        if len(set(self.circuits)) != len(self.circuits):
            _fail(where, "circuits", self.circuits, "names a circuit twice")


@attrs.frozen
class RunConfig:
    """One run: simulated duration, seed, and the per-run model choices.

    ``memory_limit_bytes`` bounds the simulator's arrays; a network or a run that would need more
    stops with a :class:`SimConfigError`.  ``sample_interval_s`` is the step of the time series.
    ``cell_delays_max`` > 0 additionally keeps that many raw per-cell delay samples;
    ``run_log_max`` scheduler runs are logged with their time and cells moved, and, if
    ``run_log_chan`` >= 0, the cells each run moved onto that directed channel (what the fidelity
    harness counts on real tor's busiest channel, ``localnet.schedlog``).  ``trace_chan`` >= 0
    traces one directed channel (outbuf, kernel unsent and unacked bytes at every change, up to
    ``trace_max`` points).  ``circuit_trace`` (a :class:`CircuitTraceConfig`) records what an
    observer at circuits' guards and exits sees; None (the default) records nothing and costs
    nothing.
    """

    duration_s: float = 10.0
    seed: int = 1
    sample_interval_s: float = 1.0
    memory_limit_bytes: int = 4 * 1024**3
    flow_control: FlowControlConfig = attrs.field(factory=FlowControlConfig)
    ewma: EwmaConfig = attrs.field(factory=EwmaConfig)
    cell_delays_max: int = 0
    run_log_max: int = 100_000
    run_log_chan: int = -1
    trace_chan: int = -1
    trace_max: int = 100_000
    read_share: bool = True
    """Model tor's read share on rate-limited connections (``LinkConfig.rate_limited``): a read
    callback takes at most 16,448 B (``connection_bucket_read_limit``) and the rest of the TLS
    record that ends in, and the rest of an arriving flight waits for the event loop's next
    pass, after the scheduler run and writes this read set going.  False gives the older model in
    which a node's relay layer takes a whole flight (on loopback up to 127 cells) at once
    (docs/simulator.md, "Design choices")."""
    wake_rebase: bool = True
    """Model libevent's timeout on every wake-up of a node's event loop: while a KIST run timer
    is armed, each pass that reads or writes measures the next ``epoll_wait`` timeout from its
    own cached time, so the run lands at the phase of the loop's last wake-up before the coarse
    deadline (``event_base_loop``: ``timeout_next`` before ``clear_time_cache``), and a wake-up
    once the coarse clock has reached the deadline runs it in that pass.  False: the run's phase
    is the pass that armed the timer's (docs/simulator.md, "Design choices")."""
    circuit_trace: CircuitTraceConfig | None = None

    def validate(self, where: str = "run") -> None:
        _finite(where, "duration_s", self.duration_s, minimum=0.0, strict=True)
        _int(where, "seed", self.seed, 0, 2**63 - 1)
        _finite(where, "sample_interval_s", self.sample_interval_s, minimum=0.0, strict=True)
        if self.duration_s / self.sample_interval_s > 1_000_000:
            _fail(where, "sample_interval_s", self.sample_interval_s, "gives more than 1,000,000 samples")
        _int(where, "memory_limit_bytes", self.memory_limit_bytes, 1)
        _int(where, "cell_delays_max", self.cell_delays_max, 0, 100_000_000)
        _int(where, "run_log_max", self.run_log_max, 0, 100_000_000)
        _int(where, "run_log_chan", self.run_log_chan, -1)
        _int(where, "trace_chan", self.trace_chan, -1)
        _int(where, "trace_max", self.trace_max, 0, 100_000_000)
        for key in ("read_share", "wake_rebase"):
            if not isinstance(getattr(self, key), bool):
                _fail(where, key, getattr(self, key), "must be true or false")
        self.flow_control.validate(f"{where}.flow_control")
        self.ewma.validate(f"{where}.ewma")
        if self.circuit_trace is not None:
            if not isinstance(self.circuit_trace, CircuitTraceConfig):
                _fail(where, "circuit_trace", self.circuit_trace, "must be a CircuitTraceConfig or None")
            self.circuit_trace.validate(f"{where}.circuit_trace")
