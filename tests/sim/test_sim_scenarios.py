"""The simulator's scenario registry (kistexp.sim.scenarios): what each builder puts on the
network, and that a misspelt argument fails instead of being dropped."""

from __future__ import annotations

import numpy as np
import pytest

from kistexp.errors import SimConfigError
from kistexp.fidelity import FIDELITY_SCENARIOS
from kistexp.sim import scenarios
from kistexp.sim.scenarios import PathScenario


def test_registry_names_and_unknown_name() -> None:
    assert set(scenarios.REGISTRY) == {"circuit", "ceiling-path"}
    with pytest.raises(SimConfigError, match="unknown scenario 'ceiling'"):
        scenarios.get("ceiling")


def test_a_renamed_argument_fails_loudly() -> None:
    with pytest.raises(TypeError, match="client_interval"):
        PathScenario(client_interval=10)  # the field is client_interval_ms
    with pytest.raises(TypeError):
        PathScenario("kist")  # keyword-only: no positional guessing


def test_every_fidelity_scenario_builds_in_the_registry() -> None:
    """Each real-tor scenario's twin exists and gets the circuits, streams, intervals and flow
    control that real tor runs."""
    for spec in FIDELITY_SCENARIOS.values():
        s = PathScenario(scheduler="kist", interval_ms=2, client_interval_ms=spec.client_interval_ms,
                         circuits=spec.circuits, streams=spec.streams, cc_alg=spec.cc_alg,
                         transfer_bytes=8_000_000)
        built = scenarios.get(spec.sim).build(s)
        net = built.network
        assert len(net.circuits) == spec.circuits
        assert net.n_transfers == spec.circuits * spec.streams
        _circ, _req, resp, _start = net.transfer_arrays()
        assert np.all(resp == 8_000_000 // (spec.circuits * spec.streams))
        assert built.payload_bytes == int(resp.sum())
        client, guard, middle, exit_ = net.nodes
        assert client.role == "client" and client.kist_interval_ms == (spec.client_interval_ms or 2)
        assert guard.kist_interval_ms == middle.kist_interval_ms == exit_.kist_interval_ms == 2
        assert built.run_config.flow_control.kind == ("sendme" if spec.cc_alg == 0 else "vegas")
        # one channel per hop, whatever the number of circuits
        assert len(net.channels) == 3


@pytest.mark.parametrize("kwargs, words", [
    (dict(streams=0), "streams=0"),
    (dict(circuits=10_001), "circuits=10001"),
    (dict(cc_alg=1), "cc_alg=1 must be 0"),
    (dict(circuits=4, streams=2, transfer_bytes=7), "transfer_bytes=7 must be an integer >= 8"),
    (dict(interval_ms=0), "kist_interval_ms"),
])
def test_bad_scenarios(kwargs, words) -> None:
    with pytest.raises(SimConfigError, match=words):
        scenarios.build_path(PathScenario(**kwargs))


def test_circuit_scenario_refuses_several_circuits() -> None:
    with pytest.raises(SimConfigError, match="uses one circuit"):
        scenarios.get("circuit").build(PathScenario(circuits=2))


def test_nagle_needs_a_lossless_link() -> None:
    from kistexp.sim.config import LinkConfig

    with pytest.raises(SimConfigError, match="nagle.*lossless"):
        LinkConfig(nagle=True, loss_rate=0.001).validate()
    LinkConfig(nagle=True).validate()
    assert scenarios.build_path(PathScenario(nagle=True)).network.default_link.nagle


@pytest.mark.slow
def test_nagle_and_delayed_acks_at_kist_10ms_stay_deterministic() -> None:
    """Real tor on loopback moved 3.3 MB/s through one circuit at 10 ms with Nagle on and 4.6 MB/s
    with TCP_NODELAY forced (docs/fidelity.md, "Pitfalls": Nagle). The model holds sub-MSS tails until
    the peer's ACK
    as Linux does, but since the exit packages its inbufs at a SENDME and reads its servers in the
    next pass (2026-12-03) the held tails cost KIST at 10 ms nothing on the measured 10 us
    loopback (3.45 against 3.46 MB/s over seeds 1-8; 7 % before): docs/simulator.md lists it under
    "Known gaps". Nagle must not make the model faster, and a seed gives one figure."""
    def figure(nagle: bool, seed: int) -> float:
        s = PathScenario(scheduler="kist", interval_ms=10, transfer_bytes=20_000_000, nagle=nagle, seed=seed)
        return scenarios.run_scenario("circuit", s)[0].throughput_mbytes_per_s

    held = [figure(True, seed) for seed in range(1, 5)]
    free = [figure(False, seed) for seed in range(1, 5)]
    assert np.mean(held) < 1.03 * np.mean(free)
    assert figure(True, 1) == held[0]  # same seed, same figure


def test_path_scenarios_default_to_the_measured_loopback_with_nagle() -> None:
    """tor never sets TCP_NODELAY, ss -ti measured a 3-13 µs minimum RTT on tor's loopback
    connections and a window of about 800 KB on the busy ones: the fidelity scenarios use all
    three unless told otherwise (and so Linux's full 65,483-byte mss, which a 65,535-byte window
    would halve)."""
    link = scenarios.build_path(PathScenario()).network.default_link
    assert link.nagle and link.rtt_ms == pytest.approx(0.01)
    assert link.receive_window_bytes == 800_000 and link.mss == 65_483


@pytest.mark.slow
def test_the_client_at_10ms_is_slower_than_at_2ms() -> None:
    """The client's scheduler paces its SENDMEs, and with the client at 10 ms real tor moved 7.10
    MB/s against 8.22 with every node at 2 ms under KIST, 5.18 against 6.69 under KISTLite
    (kistexp/data/fidelity-history.csv, run 2026-12-02T06:10Z). The model used to predict more
    throughput with the
    client at 10 ms: its receivers acknowledged every short segment at once (rcv_mss counted in
    other bytes than the data it is compared with) and its 65,535-byte window halved the mss, so
    Nagle held almost nothing, and SENDMEs waiting at the client were all the client's interval
    could cost."""
    def mean(scheduler: str, client_ms: int) -> float:
        return float(np.mean([scenarios.run_scenario("circuit", PathScenario(
            scheduler=scheduler, interval_ms=2, client_interval_ms=client_ms, seed=seed,
            transfer_bytes=20_000_000))[0].throughput_mbytes_per_s for seed in range(1, 9)]))

    # seeds 1-8 (2026-12-03): KIST 9.07 against 9.59 MB/s, KISTLite 5.82 against 6.39 (real tor on the
    # fourth to sixth machines, runs 2026-12-02T12:54Z to 2026-12-03T05:57Z of
    # kistexp/data/fidelity-history.csv: 0-26 % less under KIST, 13-16 % under KISTLite)
    assert mean("kist", 10) < 0.98 * mean("kist", 2)
    assert mean("kistlite", 10) < 0.94 * mean("kistlite", 2)


@pytest.mark.slow
def test_crossing_segments_do_not_stall_vanilla() -> None:
    """A pure ACK never overtakes the data its segment released (tcp_rcv_established sends that
    data, carrying the ACK, before tcp_ack_snd_check). When the model sent the pure ACK first, the
    peer's Nagle-held tail and the receiver's next SENDMEs crossed, each end held its next segment
    behind its own unacknowledged one, and every hop waited for the 40 ms delayed-ACK timer: one
    Vanilla circuit crawled at about 2 MB/s with the measured window, where real tor moves 41-53
    (CPU-bound; kistexp/data/fidelity-history.csv, run 2026-12-02T06:10Z). Only the first Vegas
    window, below one full frame, still meets
    the timer, a few times per receiver."""
    figures, res = scenarios.run_scenario("circuit", PathScenario(
        scheduler="vanilla", interval_ms=2, transfer_bytes=20_000_000))
    assert figures.throughput_mbytes_per_s > 40.0
    assert res.node_counters["delayed_acks"].max() <= 6


@pytest.mark.slow
def test_vanilla_is_not_held_by_nagle_on_a_10us_loopback() -> None:
    """Real tor's Vanilla moved 27.1 MB/s through one circuit with Nagle on and 31.7 with
    TCP_NODELAY forced, the same within its noise, both bound by the machine's two cores
    (docs/fidelity.md, "Pitfalls": Nagle). With the measured 10 µs round trip the model's Vanilla
    under Nagle stays
    well above what those cores allow (95 MB/s; 221 without Nagle): a relay's reply usually carries
    its ACK before the peer writes again. With a 100 µs round trip both ends of a channel often sent
    a small segment before seeing the other's, each held its next one for the other's ACK, and only
    the 40 ms delayed-ACK timer broke the tie: 17.7 MB/s, half of real tor."""
    def figure(rtt_ms: float, read_share: bool = True) -> float:
        s = PathScenario(scheduler="vanilla", interval_ms=2, transfer_bytes=20_000_000, nagle=True,
                         rtt_ms=rtt_ms, read_share=read_share)
        return scenarios.run_scenario("circuit", s)[0].throughput_mbytes_per_s

    assert figure(0.01) > 40.0
    # the tie needs whole flights read at once: with tor's read share (the default) a relay
    # answers within the flight and the 100 us loopback moves 60 MB/s; without it, 3.7
    fast, slow = figure(0.01, read_share=False), figure(0.1, read_share=False)
    assert fast > 40.0
    assert fast > 3 * slow
    assert figure(0.1) > 40.0


@pytest.mark.slow
def test_nagle_costs_kistlite_at_2ms_a_bounded_share() -> None:
    """Real tor's KISTLite at 2 ms moved 6.96 MB/s with Nagle on and 6.69 with TCP_NODELAY forced
    (docs/fidelity.md, "Pitfalls": Nagle): its 64 cells a run in two 16,448-byte writes are hardly
    held. In the model
    this needs one send() per TLS record (tor flushes 4 KiB outbuf chunks one SSL_write each), so
    that the second short segment draws the receiver's ACK (ICSK_ACK_PUSHED2); with one segment
    per write the second write waited for the next SENDME and the figure halved. Over seeds 1-8 the
    model's figure with Nagle is 6.39 MB/s, and Nagle costs it 14 % against the model without it
    (10 % before the exit's inbufs, 2026-12-03; docs/simulator.md, "Known gaps")."""
    def figure(nagle: bool) -> float:
        return float(np.mean([scenarios.run_scenario("circuit", PathScenario(
            scheduler="kistlite", interval_ms=2, transfer_bytes=20_000_000, nagle=nagle,
            seed=seed))[0].throughput_mbytes_per_s for seed in range(1, 9)]))

    held = figure(True)
    assert held > 0.8 * figure(False)
    assert held == pytest.approx(6.96, rel=0.1)


def test_a_growing_receive_window_acknowledges_the_first_segment_at_once() -> None:
    """tcp_grow_window (net/ipv4/tcp_input.c) raises the receiver's window on every segment while
    it is below its clamp and grants one quick ACK each time (``icsk_ack.quick |= 1``), sent at once
    outside pingpong mode. A 60 KB Vanilla download over the loopback path with a 131,072-byte
    window: fixed, each hop's first segment (one TLS record, below a full frame) waits for the
    40 ms delayed-ACK timer while Nagle holds the rest behind it, and the first Vegas window (124
    cells, below one full frame) meets that three times, so the download takes three timers (real
    tor's captured transfers pause so only in their first 200 ms); growing toward 400,000 B, each
    segment is acknowledged one round trip after it left and the download ends within a
    millisecond."""
    delayed_acks = {}

    def elapsed_ms(clamp: int) -> float:
        # without the read share: its first 40-cell read leaves a short segment that meets the
        # delayed-ACK timer once even with a growing window (40.3 ms), hiding the difference
        s = PathScenario(scheduler="vanilla", interval_ms=2, transfer_bytes=60_000, read_share=False,
                         receive_window_bytes=131_072, receive_window_max_bytes=clamp)
        figures, res = scenarios.run_scenario("circuit", s)
        assert figures.finished
        assert res.node_names == ("client", "guard", "middle", "exit")
        delayed_acks[clamp] = res.node_counters["delayed_acks"]
        return figures.elapsed_s * 1e3

    fixed, growing = elapsed_ms(0), elapsed_ms(400_000)
    assert 120.0 <= fixed < 121.0
    assert growing < 1.0
    assert elapsed_ms(400_000) == growing  # deterministic
    # the timer fired more often at each receiver of the download's data (middle from the exit,
    # guard from the middle, client from the guard): the `delayed_acks` counter, Linux's
    # TcpExt DelayedACKs, counts those firings
    assert (delayed_acks[0] - delayed_acks[400_000]).tolist() == [3, 3, 2, 0]


def test_receive_window_clamp_below_the_first_window_is_refused() -> None:
    from kistexp.sim.config import LinkConfig

    with pytest.raises(SimConfigError, match="receive_window_max_bytes"):
        LinkConfig(nagle=True, receive_window_bytes=131_072, receive_window_max_bytes=65_535).validate()
    with pytest.raises(SimConfigError, match="receive_window_max_bytes"):
        LinkConfig(nagle=True, receive_window_max_bytes=2**32).validate()
    LinkConfig(nagle=True, receive_window_bytes=131_072, receive_window_max_bytes=131_072).validate()


def test_seeds_sample_the_start_phase_within_the_kernel_tick() -> None:
    """A real download starts at an arbitrary time relative to the 4 ms jiffies tick, and the
    nodes' timer phases follow from when its first cells arrive: the seeds spread the downloads'
    start over the tick (seed 1 on the tick itself), evenly for any number of seeds."""
    phases = [scenarios.start_phase_ms(seed, 4.0) for seed in range(1, 9)]
    assert phases[0] == 0.0
    assert all(0.0 <= p < 4.0 for p in phases)
    gaps = np.diff(sorted(phases))
    assert gaps.min() > 0.3 and gaps.max() < 0.9  # no two seeds start close together
    built = scenarios.build_path(PathScenario(seed=2, circuits=2, streams=2))
    starts = built.network.transfer_arrays()[3]
    assert len(starts) == 4 and np.allclose(starts, phases[1] / 1000.0)


def test_the_start_phase_moves_kist_at_2ms() -> None:
    """With no other source of variation the start phase sets the nodes' relative wake-up phases
    for the whole transfer: one circuit under KIST at 2 ms moves a different figure per seed
    (7.6-10.9 MB/s over the tick; docs/simulator.md, "Design choices"), each the same when repeated."""
    def figure(seed: int) -> float:
        s = PathScenario(scheduler="kist", interval_ms=2, transfer_bytes=8_000_000, seed=seed)
        return scenarios.run_scenario("circuit", s)[0].throughput_mbytes_per_s

    one, two = figure(1), figure(2)
    assert one != pytest.approx(two, rel=0.02)
    assert figure(2) == two


def test_the_middle_relay_is_measured_on_its_busy_channel_as_real_tor_is() -> None:
    """The harness counts real tor's cells per run and run period on the middle relay's busiest
    channel only (localnet.schedlog): the path scenarios log the middle's runs toward the guard,
    which carry every DATA cell of the download and nothing else, while its runs toward the exit
    carry only SENDMEs."""
    from kistexp.localnet import schedlog
    from kistexp.sim import result as sim_result
    from kistexp.sim.simulation import run

    s = PathScenario(scheduler="kist", interval_ms=2, cc_alg=0, transfer_bytes=1_000_000, seed=1)
    built = scenarios.build_circuit(s)
    res = run(built.network, built.run_config)
    middle, guard = built.topology.relays[1], built.topology.relays[0]
    assert built.run_config.run_log_chan == res.chan_between(middle, guard)
    on_chan = res.cells_per_run(middle, on_logged_chan=True)
    every = res.cells_per_run(middle)
    assert int(on_chan.sum()) == -(-1_000_000 // 498)  # every DATA cell, once
    assert (on_chan <= every).all() and (every > on_chan).any()  # some runs carry SENDMEs too
    # SENDME-only runs (toward the exit) are not runs of the busy channel
    assert ((every > 0) & (on_chan == 0)).any()
    fig = scenarios.path_figures(res, built)
    assert fig.cells_per_run_median == float(np.median(on_chan[on_chan > 0]))
    periods = res.run_periods_ms(middle, on_logged_chan=True)
    assert len(periods) and (periods <= sim_result.MAX_BUSY_GAP_MS).all()
    assert fig.run_period_ms == float(np.median(periods))
    assert sim_result.MAX_BUSY_GAP_MS == schedlog.MAX_BUSY_GAP_MS


def test_a_logged_channel_outside_the_network_is_refused() -> None:
    import attrs

    from kistexp.sim.simulation import run

    built = scenarios.build_circuit(PathScenario(transfer_bytes=100_000))
    with pytest.raises(SimConfigError, match="run_log_chan=99"):
        run(built.network, attrs.evolve(built.run_config, run_log_chan=99))


def test_a_wake_up_of_the_loop_moves_the_next_runs_phase_out_of_lockstep() -> None:
    """libevent measures each epoll_wait timeout from the pass that calls it (``timeout_next``
    before ``clear_time_cache``), so a KIST run lands at the phase of the loop's last wake-up
    before the coarse deadline, not at the phase of the pass that armed it. Without that rule the
    three relays of one circuit at 10 ms can fall into a lockstep in which each run moves a whole
    window hop after hop (seed 14 did before 2026-12-03: 8.6 MB/s, the middle moving 264 cells a
    run); real tor, whose
    loops wake for every read and write, stays at 2.4-3.2 MB/s (circuit/kist/10ms in every run since
    2026-12-01 of kistexp/data/fidelity-history.csv). Since the exit
    reads its server in the pass after a SENDME's (2026-12-03) the lockstep is rarer: seed 25, 5.3
    MB/s and 187 cells a run, against 3.1 MB/s and 67 with the rule."""
    def figures(rebase: bool):
        return scenarios.run_scenario("circuit", PathScenario(
            scheduler="kist", interval_ms=10, transfer_bytes=20_000_000, seed=25, wake_rebase=rebase))[0]

    lockstep, rebased = figures(False), figures(True)
    assert lockstep.throughput_mbytes_per_s > 5.0 and lockstep.cells_per_run_median > 150
    assert rebased.throughput_mbytes_per_s < 4.5 and rebased.cells_per_run_median < 100


@pytest.mark.slow
def test_four_streams_of_one_circuit_move_at_least_what_one_stream_moves_under_kistlite() -> None:
    """Real tor moved 6.97 against 6.71, 7.00 against 6.49 and 6.79 against 6.74 MB/s with 4
    streams on one circuit against one stream, KISTLite at 2 ms (kistexp/data/fidelity-history.csv,
    runs 2026-12-03T00:23Z, 2026-12-03T05:57Z and 2026-12-02T17:12Z). An exit reads each stream's
    server by bucket shares into the stream's inbuf,
    packages from the inbufs at once when a SENDME opens the window, and reads again only in the
    event loop's next pass, after a scheduler run due in this one: with four inbufs the cells a
    SENDME lets out are there for that run. Without the inbufs the model had 4 streams 4 % below
    one (seeds 1-40)."""
    def mean(streams: int) -> float:
        return float(np.mean([scenarios.run_scenario("circuit", PathScenario(
            scheduler="kistlite", interval_ms=2, streams=streams, seed=seed,
            transfer_bytes=20_000_000))[0].throughput_mbytes_per_s for seed in range(1, 21)]))

    assert mean(4) >= mean(1)
