"""Relay-scheduling simulator: KIST, KISTLite and Vanilla with EWMA circuit priority, as tor runs them.

Behavioural reference: ``../shared/spec/kist-ewma.md`` (cited as §N in the modules).

Public API (stable)
-------------------
Configuration (``kistexp.sim.config``, frozen attrs; ``validate()`` raises ``SimConfigError``)::

    NodeConfig(role="relay"|"client"|"guard"|"middle"|"exit", scheduler="kist"|"kistlite"|"vanilla",
               kist_interval_ms=10 (1..100; KISTSchedRunInterval, or ...Client on a client),
               kernel_tick_ms=4.0 (CLOCK_MONOTONIC_COARSE resolution, §5.2),
               nic_rate_bytes_per_s=0.0 (0 = unlimited), sock_buf_factor=1.0 (KISTSockBufSizeFactor),
               pass_time_us=10.0 (duration of the libevent pass holding a run, §5.2's p),
               cell_cpu_us=1.56 (CPU time per received cell; a node's event loop is serial),
               cell_send_cpu_us=0.62 (CPU time per cell a scheduler run moves; lengthens §5.2's p),
               tor_version="0.4.9.11" (how apply() clamps consensus values, kistexp.params),
               schedulers=() (tor's Schedulers order; () = scheduler + the default list after it),
               flow_control=None|"vegas"|"sendme" (None = RunConfig.flow_control.kind; Vegas on a
               circuit only if both ends support it and have cc_alg != 0),
               torrc_overrides=() ("KISTSchedRunInterval", "CircuitPriorityHalflife": torrc wins))
    LinkConfig(rtt_ms=0.1, mss=1448 (LOOPBACK_MSS = 65483), initial_cwnd=10, loss_rate=0.0,
               send_buffer_bytes=0 (0 = Linux-like autotuning), send_buffer_max_bytes=4 MiB,
               rate_limited=True (≤ 16448 B per write call, §7.4))
    EwmaConfig(halflife_ms=30000, tick_s=10)
    FlowControlConfig(kind="sendme"|"vegas", circwindow=1000, circ_increment=100, stream_window=500,
               stream_increment=50, cellq_high=256, cellq_low=10, exit_read_cells=32 (an exit's read
               share per stream per pass, into the stream's inbuf), edge_write_cells=32 (an edge's
               write share toward its application; stream SENDMEs held while > 10 cells wait),
               sendme_inc=31, cwnd_init=124, ...§14)
    RunConfig(duration_s=10.0, seed=1, sample_interval_s=1.0, memory_limit_bytes=4 GiB,
              flow_control=FlowControlConfig(), ewma=EwmaConfig(), cell_delays_max=0 (raw samples),
              run_log_max=100_000 (scheduler runs logged), run_log_chan=-1 (a directed channel whose
              cells each logged run also counts), trace_chan=-1, trace_max=100_000,
              read_share=True (a read callback takes one 16,448-B share and the rest of its TLS
              record), wake_rebase=True (every read or write pass re-times an armed KIST timer,
              libevent's timeout_next))

Network (``kistexp.sim.network``)::

    net = Network(default_link=LinkConfig())
    n = net.add_node(NodeConfig(...), name=None) -> int
    ch = net.add_channel(a, b, LinkConfig(...)) -> int   # optional; circuits create missing ones
    c = net.add_circuit([client, guard, middle, exit], label="bulk") -> int
    net.directed_channel(src, dst) -> int   # the id RunConfig.trace_chan / run_log_chan take
    net.add_transfer(Transfer(circuit=c, request_bytes=498, response_bytes=5 MiB, start_s=0.0)) -> int
    net.add_transfers(circuits, request_bytes, response_bytes, start_s) -> range   # vectorised
    net.add_interactive(InteractiveFlow(circuit=c, start_s=0, stop_s=10, period_s=0.1,
                        request_bytes=498, response_bytes=996)) -> range
    net.change_interval(IntervalChange(time_s=5.0, node=n, interval_ms=2))

Running it (``kistexp.sim.simulation``; the state it runs on is built by ``kistexp.sim.state``)::

    result = run(net, RunConfig(...), progress=None) -> SimResult    # deterministic per seed
    warm_up(keep_raw_delays=False) -> seconds   # compile or load the kernel before timed work
    ensure_compiled(notify=None) -> seconds | None   # compile now if never done here, saying so first

Steppable run (``kistexp.sim.simulation``; ``run()`` is its one-call form, identical results)::

    sim = Simulation(net, RunConfig(...))      # validates; refuses a network over memory_limit_bytes
    sim.advance_to(t_s, progress=None)         # all events up to and including t_s; now_s <= t_s <= duration
    sim.now_s; sim.duration_s
    sim.apply(nodes, params: Mapping[str, int]) -> tuple[AppliedConsensus, ...]
        # a new consensus at now_s for nodes (ids or names), through the scheduler hooks
        # (scheduler.notify_networkstatus_changed -> kist/vanilla on_new_consensus,
        # cmux_ewma.ewma_set_options, flowcontrol.fc_on_new_consensus: read by circuits built later);
        # modelled: KISTSchedRunInterval, KISTSchedRunIntervalClient, CircuitPriorityHalflifeMsec,
        # cc_alg, circwindow, cc_sendme_inc, cc_cwnd_*, cc_ss_max, cc_sscap_exit, cc_vegas_*_exit,
        # cc_ewma_*; KISTSockBufSizeFactor (torrc option, float).  Absent modelled keys take tor's
        # default; clamped per node tor_version; 0 before 0.4.8.2 switches to the next scheduler.
        # AppliedConsensus(node, name, scheduler, values: dict, clamped: tuple[str, ...])
    sim.node_scheduler(node) -> str; sim.node_interval_ms(node) -> int
    sim.window(t0_s, t1_s) -> RunWindow        # [t0, t1): bounds 0, sample times or advance_to times
        RunWindow: t0_s, t1_s, duration_s, node_names, node_roles, node_schedulers, labels,
        node_counters[name][node] (scheduler_runs, socket_info_syscalls, kernel_writes, cells_sent,
        cells_received, crypto_layers, digests, bytes_written), node_counts(node) (cost-model inputs),
        node_peaks[peak_app_bytes|peak_kernel_bytes|peak_queued_bytes][node],
        node_levels[app_bytes|kernel_bytes][sample, node], chan_src, chan_dst, chan_bytes[chan],
        channel_throughput_bytes_per_s(chan), node_bytes_per_s(node), delay_hist[kind, label, bin],
        delay_percentile_ms(kind, q, label), transfer_circuit / transfer_label /
        transfer_response_bytes / transfer_start_s / transfer_ttfb_s / transfer_ttlb_s
        (transfers whose last byte arrived in the window)
    sim.result() -> SimResult
    sim.circuit_trace(t0_s, t1_s) -> CircuitTrace   # RunConfig(circuit_trace=CircuitTraceConfig(...))

Circuit trace (``kistexp.sim.circuittrace``; opt-in, nothing recorded and nothing changed without it)::

    CircuitTraceConfig(circuits=() (ids; () = all), window_ms=100.0, block_s=1.0,
                       start_s=0.0 (windows from then; cells recorded from a second before))
    CircuitTrace (frozen): t0_s, t1_s, window_s, block_s, circuits [i], labels, paths, node_names,
        guard_in[i, dir, window] (cells entering the guard: 0 from the client, 1 from the middle),
        exit_out[i, dir, window] (cells leaving the exit: 0 to the server, 1 toward the middle),
        client_in[i, window] (cells reaching the client), series(name), rebinned(name, seconds),
        rtt_count / rtt_sum_ms / rtt_sumsq_ms / rtt_min_ms [i, block] (the exit's RTT samples: a cell's
        packaging to the circuit SENDME for it, Vegas' samples or every circ_increment-th cell),
        exit_nodes[slot], circuit_exit_slot[i], gap_hist[slot, bin] (gaps between a circuit's cells
        leaving its exit), gap_bin_edges_s, exit_scheduler / exit_interval_ms / exit_tick_ms [slot],
        transfer_trace_index / transfer_start_s / transfer_ttfb_s (first byte in the window),
        client_nodes, guard_nodes, exit_node_of [i]

Metric vocabulary (``kistexp.sim.vocabulary``)::

    window_samples(window, quiet_labels=("interactive", "quiet"), delay_samples=1000,
                   model=DEFAULT_COST_MODEL) -> dict[metric name, np.ndarray]
    relay_values(window, model=DEFAULT_COST_MODEL) -> dict[metric name, dict[node name, float]]

A transfer is a stream: the request goes client -> exit, then the response exit -> client; each is
sent as DATA cells of 498 B payload.  A circuit's path starts at the client and ends at the exit;
every node on it (client included) runs its own scheduler.  Channels are numbered in the result as
directed sockets: channel ``i`` between ``a`` and ``b`` gives ``2i`` (a -> b) and ``2i + 1``
(b -> a); ``SimResult.chan_between(src, dst)`` finds one.

Result (``kistexp.sim.result.SimResult``)::

    transfer_ttfb_s / transfer_ttlb_s [transfer]    (seconds after start_s; nan = not reached)
    sample_times_s [sample]; chan_bytes_sent [sample, chan] (cumulative wire bytes)
    channel_throughput_bytes_per_s(chan) -> [sample - 1]
    node_counters[name][node], names: scheduler_runs, socket_info_syscalls, kernel_writes,
        cells_sent, cells_received, crypto_layers, digests, bytes_written,
        peak_app_bytes, peak_kernel_bytes, peak_queued_bytes, delayed_acks (ACKs the node's
        sockets sent when the delayed-ACK timer fired, Linux's TcpExt DelayedACKs; Nagle links),
        read_callbacks (reads of OR connections), stream_sendmes_held (checks that held an owed
        stream SENDME behind a full edge outbuf; FlowControlConfig.edge_write_cells > 0)
    node_counts(node) -> dict of the above (cost-model inputs); node_series[name][sample, node]
        (cumulative: scheduler_runs, socket_info_syscalls, cells_sent, kernel_writes, app_bytes,
        kernel_bytes); node_rate_per_s(series, node)
    delay_percentile_ms(kind="app"|"kernel", q=50, label=None); delay_mean_ms(kind, label)
        (per-hop time of a cell in a circuit queue / in the kernel until it left the NIC)
    run_time_s / run_node / run_cells / run_chan_cells (scheduler-run log);
        run_periods_ms(node, on_logged_chan=False); cells_per_run(node, on_logged_chan=False)
    raw_delays [5, n]: kind (0 app, 1 kernel), circuit, delay ns, time ns, sending node
        (the first cell_delays_max samples)
    trace [4, n]: time ns, outbuf, kernel unsent, kernel unacked bytes of RunConfig.trace_chan
    circuit_max_inflight_cells [circuit, dir] (max DATA cells not yet acknowledged by a SENDME);
    circuit_final_cwnd_cells, circuit_final_bdp_cells [circuit, dir] (Vegas cwnd and BDP estimate);
    chan_final_cwnd; chan_losses; cells_scheduled; events;
    queue_cap_exceeded; wall_s
    jsonout.to_json(result)   (keys carry units)

Speed: the event loop is compiled with numba (``cache=True``): the first run on a machine compiles
for one to two minutes, later processes load the cache in about a second.  The cache lives in a
directory keyed by a hash of the compiled modules' sources (``numbacache.py``), so processes
compiling and loading at once never see another version's files and nothing is deleted.  The
compiled code uses documented numba APIs only (``layout.py``: the state is one unreferenced
pointer to a descriptor of its arrays, numba's ``OpaqueModel`` with ``overload_attribute`` views,
so no function entry and no field read counts a reference; per-entity tables stored entity by
entity; cells and streams as 32-byte record arrays); kernel send queues are rings of cell ids
(an arriving flight's cells are found, and prefetched, without walking a list through the cell
pool), free cells a stack of ids, each node's scheduler event one timer slot, and each chan's
later arrivals and acks a queue behind one event in the heap.  ``bench/sim_bench.py`` measures
it (docs/simulator.md, "Speed"), ``bench/population_bench.py --speed`` on a sampled consensus at full NIC
rates, ``bench/sim_profile.py`` says where the time goes.

Model limits are documented in docs/simulator.md.
"""

from kistexp.sim.numbacache import use_keyed_cache

use_keyed_cache()

from kistexp.sim.circuittrace import CircuitTrace  # noqa: E402
from kistexp.sim.config import (  # noqa: E402
    DEFAULT_MSS,
    LOOPBACK_MSS,
    CircuitTraceConfig,
    EwmaConfig,
    FlowControlConfig,
    LinkConfig,
    NodeConfig,
    RunConfig,
)
from kistexp.sim.network import InteractiveFlow, IntervalChange, Network, Transfer  # noqa: E402
from kistexp.sim.result import SimResult  # noqa: E402
from kistexp.sim.simulation import (  # noqa: E402
    AppliedConsensus,
    RunWindow,
    Simulation,
    ensure_compiled,
    run,
    warm_up,
)

__all__ = [
    "AppliedConsensus",
    "CircuitTrace",
    "CircuitTraceConfig",
    "Simulation",
    "RunWindow",
    "DEFAULT_MSS",
    "LOOPBACK_MSS",
    "EwmaConfig",
    "FlowControlConfig",
    "InteractiveFlow",
    "IntervalChange",
    "LinkConfig",
    "Network",
    "NodeConfig",
    "RunConfig",
    "SimResult",
    "Transfer",
    "ensure_compiled",
    "run",
    "warm_up",
]
