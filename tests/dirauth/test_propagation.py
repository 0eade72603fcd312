"""Consensus propagation to caches, clients and bridges (dirspec-params.md §3, §3.1)."""

from __future__ import annotations

import numpy as np
import pytest

from kistexp.dirauth.propagation import (
    FetchWindow,
    NodeClass,
    PropagationError,
    PropagationModel,
    consensus_slop_s,
    fetch_window,
)
from kistexp.dirauth.schedule import VotingSchedule

MIN = 60.0
HOURLY = PropagationModel()
TESTNET = PropagationModel(
    VotingSchedule.testing(interval_s=300, vote_delay_s=20, dist_delay_s=20, n_intervals_valid=3)
)


def test_slop():
    assert consensus_slop_s(3600) == 120
    assert consensus_slop_s(300) == 18
    assert consensus_slop_s(10) == 1


def test_hourly_windows_match_the_spec_table():
    assert HOURLY.window(NodeClass.CACHE) == FetchWindow(120, 1800)  # [FU+2, FU+32 min)
    assert HOURLY.window(NodeClass.AUTHORITY) == FetchWindow(120, 60)  # [FU+2, FU+3 min)
    client = HOURLY.window(NodeClass.CLIENT)  # [FU+45, FU+110.625 min)
    assert client.start_s == 45 * 60 and client.end_s == 6637
    bridge_user = HOURLY.window(NodeClass.BRIDGE_USER)  # [FU+112.6, FU+118 min)
    assert bridge_user.start_s == 6757 and bridge_user.end_s == 118 * 60


def test_testnet_windows_match_the_spec_example():
    assert TESTNET.window(NodeClass.CACHE) == FetchWindow(18, 150)  # [FU+18 s, FU+168 s)
    client = TESTNET.window(NodeClass.CLIENT)
    assert (client.start_s, client.end_s) == (225, 553)  # [FU+225 s, FU+553 s)
    assert TESTNET.jitter_s == 1.0 and HOURLY.jitter_s == 60.0


def test_crazy_fast_network_windows_stay_before_valid_until():
    for cls in NodeClass:
        w = fetch_window(cls, 10, 20)
        assert w.length_s >= 1 and 0 < w.start_s and w.end_s < 10, (cls, w)


@pytest.mark.parametrize(
    ("minutes", "share"),
    [(1.9, 0.0), (5, 0.08), (10, 0.25), (17, 0.48), (20, 0.58), (30, 0.92), (33, 1.0), (90, 1.0)],
)
def test_cache_curve(minutes, share):
    """§3.1: 0 before V+2, ~8 % at V+5, 25 % at V+10, ~50 % at V+17, ~58 % at V+20, ~92 % at V+30."""
    assert HOURLY.adoption(NodeClass.CACHE, minutes * MIN) == pytest.approx(share, abs=0.015)


@pytest.mark.parametrize(
    ("minutes", "share"),
    [(30, 0.13), (45, 0.28), (60, 0.49), (75, 0.64), (90, 0.79), (105, 0.94), (112, 1.0)],
)
def test_client_curve(minutes, share):
    """§3.1 Monte-Carlo table for clients / non-cache relays / bridges."""
    assert HOURLY.adoption(NodeClass.CLIENT, minutes * MIN) == pytest.approx(share, abs=0.02)


def test_curves_are_monotone_cdfs_and_authorities_adopt_at_valid_after():
    t = np.linspace(-600, 4 * 3600, 500)
    for cls in NodeClass:
        a = HOURLY.adoption(cls, t)
        assert np.all(np.diff(a) >= 0) and a[0] == 0.0 and a[-1] == pytest.approx(1.0), cls
    assert HOURLY.adoption(NodeClass.AUTHORITY, 0.0) == 1.0
    assert HOURLY.adoption(NodeClass.AUTHORITY, -1.0) == 0.0


def test_testnet_caches_done_within_their_window():
    assert TESTNET.adoption(NodeClass.CACHE, 17.0) == 0.0
    assert TESTNET.adoption(NodeClass.CACHE, 18 + 75 + 0.5) == pytest.approx(0.5, abs=0.01)
    assert TESTNET.adoption(NodeClass.CACHE, 169.0) == pytest.approx(1.0, abs=1e-4)
    assert TESTNET.adoption(NodeClass.CLIENT, 553 + 300 + 2) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("cls", [NodeClass.CACHE, NodeClass.CLIENT, NodeClass.BRIDGE_USER])
def test_sampler_agrees_with_the_curve(cls):
    rng = np.random.default_rng(20201015)
    times = HOURLY.sample_adoption_times(cls, 20000, rng)
    assert times.shape == (20000,) and not np.isnan(times).any()
    grid = np.linspace(0, 4 * 3600, 300)
    empirical = np.searchsorted(np.sort(times), grid, side="right") / times.size
    assert np.max(np.abs(empirical - HOURLY.adoption(cls, grid))) < 0.025


def test_ten_second_network_bridge_users_retry():
    """In the 10 s local network a bridge may have nothing newer yet: the curve comes from the
    seeded simulation and the class is done about one retry after VA + 10 s."""
    fast = PropagationModel(VotingSchedule.testing())
    assert fast.time_until(1.0, NodeClass.CACHE) == pytest.approx(7.0, abs=0.1)
    assert fast.time_until(1.0, NodeClass.CLIENT) == pytest.approx(10.0, abs=0.1)
    times = fast.sample_adoption_times(NodeClass.BRIDGE_USER, 5000, np.random.default_rng(2))
    grid = np.linspace(0, 30, 300)
    empirical = np.searchsorted(np.sort(times), grid, side="right") / times.size
    assert np.max(np.abs(empirical - fast.adoption(NodeClass.BRIDGE_USER, grid))) < 0.03
    assert 10.0 < times.max() < 12.0


def test_sampler_is_seeded():
    a = HOURLY.sample_adoption_times(NodeClass.CLIENT, 500, np.random.default_rng(7))
    b = HOURLY.sample_adoption_times(NodeClass.CLIENT, 500, np.random.default_rng(7))
    c = HOURLY.sample_adoption_times(NodeClass.CLIENT, 500, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.all(HOURLY.sample_adoption_times(NodeClass.AUTHORITY, 3, np.random.default_rng(1)) == 0)


def test_sampled_client_times_within_bounds():
    times = HOURLY.sample_adoption_times(NodeClass.CLIENT, 5000, np.random.default_rng(3))
    assert times.min() >= 2 * MIN
    assert times.max() <= 110.625 * MIN + 60  # "the upper bound is V + 110.6 min + 1 min"


def test_time_until():
    assert HOURLY.time_until(0.5, NodeClass.CACHE) == pytest.approx(17.5 * MIN, abs=20)
    assert HOURLY.time_until(1.0, NodeClass.CACHE) == pytest.approx(33 * MIN, abs=20)
    assert 59 * MIN < HOURLY.time_until(0.5, NodeClass.CLIENT) < 62 * MIN
    assert HOURLY.time_until(0.9, NodeClass.AUTHORITY) == 0.0
    mixed = HOURLY.time_until(0.5, {NodeClass.CACHE: 0.5, NodeClass.CLIENT: 0.5})
    assert HOURLY.time_until(0.5, NodeClass.CACHE) < mixed < HOURLY.time_until(0.5, NodeClass.CLIENT)
    assert HOURLY.adoption_mix({NodeClass.CACHE: 3, NodeClass.CLIENT: 1}, 40 * MIN) == pytest.approx(
        0.75 + 0.25 * HOURLY.adoption(NodeClass.CLIENT, 40 * MIN)
    )


def test_bad_input():
    with pytest.raises(PropagationError):
        HOURLY.time_until(1.5)
    with pytest.raises(PropagationError):
        HOURLY.adoption_mix({NodeClass.CACHE: 0}, 0.0)
    with pytest.raises(PropagationError):
        PropagationModel(transfer_s=-1)
    with pytest.raises(PropagationError):
        fetch_window(NodeClass.CACHE, 3600, 3600)


def test_draw_next_fetch_is_the_window_plus_check_jitter():
    # Caches on the hourly network: FU + 2 min .. FU + 2 min + 30 min + 60 s check jitter (§3).
    d = HOURLY.draw_next_fetch_s(NodeClass.CACHE, np.random.default_rng(5), 20000)
    assert d.min() >= 120 and d.max() <= 120 + 1800 + 60
    assert abs(np.median(d) - (120 + 900 + 30)) < 30
    again = HOURLY.draw_next_fetch_s(NodeClass.CACHE, np.random.default_rng(5), 20000)
    assert np.array_equal(d, again)
