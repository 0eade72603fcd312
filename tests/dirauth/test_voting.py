"""tor's params rule and consensus-formation thresholds (dirspec-params.md §1–§2.1, §4; real-tor.md)."""

from __future__ import annotations

import pytest

from kistexp.dirauth.paramsline import format_params
from kistexp.dirauth.voting import (
    ParamBounds,
    Vote,
    VoteRejected,
    VotingError,
    compute_consensus_params,
    consensus_method,
    effective_value,
    formation,
    low_median,
    own_vote_params,
    param_bounds,
    param_inclusion_threshold,
    parse_tor_version,
    signatures_needed,
    tally_params,
    votes_needed_to_compute,
)
from kistexp.errors import KistexpError
from kistexp.params import TorVersion

# tor's src/test/test_dir.c test_dir_param_voting vectors (§1.3)
V1 = {"ab": 90, "abcd": 20, "cw": 50, "x-yz": -99}
V2 = {"ab": 27, "cw": 5, "x-yz": 88}
V3 = {"abcd": 20, "c": 60, "cw": 500, "x-yz": -9, "zzzzz": 101}
V4 = {"ab": 900, "abcd": 200, "c": 1, "cw": 51, "x-yz": 100}


@pytest.mark.parametrize(
    ("votes", "n_values", "expected"),
    [
        ([V1], [2], ""),
        ([V1], [1], "ab=90 abcd=20 cw=50 x-yz=-99"),
        ([V1, V2], [2, 3], "ab=27 cw=5 x-yz=-99"),
        ([V1, V2], [6], ""),
        ([V1, V2, V3], [3], "ab=27 abcd=20 cw=50 x-yz=-9"),
        ([V1, V2, V3], [5, 9], "cw=50 x-yz=-9"),
        ([V1, V2, V3, V4], [4, 5, 6, 10], "ab=90 abcd=20 cw=50 x-yz=-9"),
    ],
)
def test_tor_unit_test_vectors(votes, n_values, expected):
    for n in n_values:
        assert format_params(compute_consensus_params(votes, n)) == expected, n


@pytest.mark.parametrize(
    ("n", "threshold"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (9, 3), (10, 3), (30, 3)]
)
def test_inclusion_threshold(n, threshold):
    assert param_inclusion_threshold(n) == threshold


def _kist(values: list[int], n_authorities: int = 9) -> int | None:
    votes = [Vote(f"auth{i}", {"KISTSchedRunInterval": v}) for i, v in enumerate(values)]
    votes += [Vote(f"silent{i}") for i in range(n_authorities - len(values))]
    return dict(compute_consensus_params(votes, n_authorities)).get("KISTSchedRunInterval")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([2, 2], None),
        ([2, 2, 2], 2),
        ([2, 2, 2, 2], 2),
        ([2] * 5, 2),
        ([10, 2, 2], 2),
        ([10, 10, 2], 10),
        ([10, 10, 2, 2], 2),
        ([10, 10, 10, 2, 2], 10),
        ([10, 10, 2, 2, 2], 2),
        ([10] * 5 + [2] * 4, 10),
        ([10] * 4 + [2] * 5, 2),
        ([2, 3, 10], 3),
        ([0, 0, 0], 0),
    ],
)
def test_kist_scenarios_nine_authorities(values, expected):
    """dirspec-params.md §1.4, N = 9, all nine votes held."""
    assert _kist(values) == expected


def test_kist_absent_and_zero_as_relays_read_them():
    """§1.4 first and last rows: what relays of each version then run."""
    absent = compute_consensus_params([{"KISTSchedRunInterval": 2}] * 2, 9)
    assert absent == ()
    assert effective_value(absent, "KISTSchedRunInterval", "0.4.9.11") == 2
    assert effective_value(absent, "KISTSchedRunInterval", "0.4.8.1-alpha") == 10
    zero = compute_consensus_params([{"KISTSchedRunInterval": 0}] * 3, 9)
    assert zero == (("KISTSchedRunInterval", 0),)
    assert effective_value(zero, "KISTSchedRunInterval", "0.4.8.2-alpha") == 2
    assert effective_value(zero, "KISTSchedRunInterval", "0.4.7.16") == 0


def test_low_median_is_lower_middle_including_negatives():
    assert low_median([1, 2]) == 1
    assert low_median([-5, -1]) == -5
    assert low_median([4, 1, 3, 2]) == 2
    assert low_median([7]) == 7
    with pytest.raises(VotingError):
        low_median([])


def test_output_in_tor_strcmp_order_with_prefix_keys():
    votes = [{"Foo": 2, "Foo1": 1}] * 3
    assert format_params(compute_consensus_params(votes, 3)) == "Foo1=1 Foo=2"


def test_silent_and_empty_votes_do_not_count():
    votes = [Vote("a", {"k": 5}), Vote("b", {"k": 7}), Vote("c"), Vote("d", {})]
    assert compute_consensus_params(votes, 4) == ()  # 2 < 3
    assert compute_consensus_params(votes[:2], 3) == (("k", 5),)  # 2 > floor(3/2)


# --- real tor 0.4.9.11 on loopback (real-tor.md "Params results"); every authority had
# AuthDirMaxServersPerAddr 0, so each non-empty vote also lists AuthDirMaxServersPerAddr=0.


def _real_vote(name: str, params: str) -> Vote:
    return Vote(name, own_vote_params(params, auth_dir_max_servers_per_addr=0))


EXP1 = {
    "auth0": "KISTSchedRunInterval=2 pfour=1 pthree=30 ptwo=5",
    "auth1": "KISTSchedRunInterval=2 pfour=2 pthree=10 ptwo=7",
    "auth2": "KISTSchedRunInterval=10 pfour=3 pthree=20",
    "auth3": "pfour=4 pone=9",
    "auth4": "",
}
EXP2 = dict(
    EXP1, auth2="KISTSchedRunInterval=1 pfour=3 pthree=20", auth3="KISTSchedRunInterval=1 pfour=4 pone=9"
)
EXP5 = {
    "auth0": "KISTSchedRunInterval=10 pone=1 ptwo=4",
    "auth1": "KISTSchedRunInterval=2 ptwo=6",
    "auth2": "",
}
RESULT_1_3 = "AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=2 pfour=2 pthree=20"


@pytest.mark.parametrize(
    ("config", "n_authorities", "running", "expected"),
    [
        (EXP1, 5, None, RESULT_1_3),
        (EXP2, 5, None, "AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=1 pfour=2 pthree=20"),
        (EXP2, 5, ["auth0", "auth1", "auth2"], RESULT_1_3),
        (EXP5, 3, None, "AuthDirMaxServersPerAddr=0 KISTSchedRunInterval=2 ptwo=4"),
    ],
    ids=["exp1", "exp2", "exp3", "exp5"],
)
def test_real_tor_results(config, n_authorities, running, expected):
    votes = [_real_vote(name, p) for name, p in config.items() if running is None or name in running]
    assert formation(votes, n_authorities).can_compute
    assert format_params(compute_consensus_params(votes, n_authorities)) == expected


def test_real_tor_exp4_two_of_five_votes_make_no_consensus():
    votes = [_real_vote(n, EXP2[n]) for n in ("auth0", "auth1")]
    form = formation(votes, 5)
    assert not form.can_compute and form.votes_needed == 3
    assert "not enough votes" in form.reason and "2 of 5" in form.reason


def test_tally_reports_who_lists_what_and_why():
    votes = [_real_vote(name, p) for name, p in EXP1.items()]
    tallies = {t.key: t for t in tally_params(votes, 5)}
    ptwo = tallies["ptwo"]
    assert ptwo.listed == (("auth0", 5), ("auth1", 7))
    assert set(ptwo.silent) == {"auth2", "auth3", "auth4"}
    assert not ptwo.included and ptwo.threshold == 3
    assert ptwo.reason.startswith("left out: 2 of 5")
    pfour = tallies["pfour"]
    assert pfour.values == (1, 2, 3, 4) and pfour.median == 2 and pfour.included
    assert "low median of [1, 2, 3, 4] is 2" in pfour.reason


# --- an authority's own params (§1.2)


def test_own_vote_appends_auth_dir_max_and_sorts():
    assert own_vote_params(["cc_alg=2 KISTSchedRunInterval=2", "bwweightscale=10000"]) == (
        ("AuthDirMaxServersPerAddr", 2),
        ("KISTSchedRunInterval", 2),
        ("bwweightscale", 10000),
        ("cc_alg", 2),
    )
    assert own_vote_params("KISTSchedRunInterval=3", auth_dir_max_servers_per_addr=8)[0] == (
        "AuthDirMaxServersPerAddr",
        8,
    )
    assert own_vote_params(None) == ()
    assert own_vote_params(["", "  "]) == ()


@pytest.mark.parametrize(
    "config",
    ["a=1 a=2", "a=1 a=1", "AuthDirMaxServersPerAddr=3", "a=2147483648", "a", "a=x", "=3"],
)
def test_own_vote_that_tor_cannot_store(config):
    with pytest.raises(VoteRejected, match="does not vote"):
        own_vote_params(config)


def test_vote_rejects_duplicates_and_int32():
    with pytest.raises(VoteRejected):
        Vote("a", [("k", 1), ("k", 2)])
    with pytest.raises(VoteRejected):
        Vote("a", {"k": -(2**31) - 1})
    assert Vote("a", {"k": -(2**31)}).value("k") == -(2**31)
    assert Vote("a", {"k": 1}).value("other") is None


# --- formation (§2.1)


def test_formation_thresholds_for_nine():
    assert votes_needed_to_compute(9) == 5
    assert signatures_needed(9) == 5
    assert signatures_needed(5) == 3 and signatures_needed(4) == 3 and signatures_needed(1) == 1
    five = [Vote(f"a{i}") for i in range(5)]
    assert formation(five, 9).can_compute
    assert not formation(five[:4], 9).can_compute
    no_running = [Vote(f"a{i}", lists_running=False) for i in range(9)]
    form = formation(no_running, 9)
    assert not form.can_compute and "Running" in form.reason


def test_consensus_method_needs_more_than_two_thirds():
    full = tuple(range(28, 34))
    old = tuple(range(28, 33))
    assert consensus_method([Vote(f"a{i}", consensus_methods=full if i < 7 else old) for i in range(9)]) == 33
    assert consensus_method([Vote(f"a{i}", consensus_methods=full if i < 6 else old) for i in range(9)]) == 32
    # a method nobody here supports: the computing authority falls back to its own highest
    assert consensus_method([Vote(f"a{i}", consensus_methods=(40,)) for i in range(3)]) == 33
    assert formation([Vote("a")], 1).consensus_method == 33


def test_bad_inputs_are_kistexp_errors():
    with pytest.raises(VotingError, match="configured authorities"):
        compute_consensus_params([{"a": 1}] * 3, 2)
    with pytest.raises(VotingError, match="two votes from authority x"):
        compute_consensus_params([Vote("x"), Vote("x")], 3)
    with pytest.raises(KistexpError):
        param_inclusion_threshold(0)


# --- relay side (§4)


@pytest.mark.parametrize(
    ("params", "version", "torrc", "server", "expected"),
    [
        ({"KISTSchedRunInterval": 10}, "0.4.9.11", None, True, 10),
        ({"KISTSchedRunInterval": 1}, "0.4.9.11", None, True, 2),  # "too small ... raising to 2"
        ({"KISTSchedRunInterval": 1000}, "0.4.9.11", None, True, 100),
        ({"KISTSchedRunInterval": 1}, "0.4.9.11", 1, True, 1),  # torrc wins, unclamped
        ({"KISTSchedRunInterval": 10}, "0.4.9.11", 0, True, 10),  # torrc 0 = use the consensus
        ({"KISTSchedRunInterval": 10}, "0.4.9.11", None, False, 2),  # clients read ...Client
        ({"KISTSchedRunInterval": 10, "KISTSchedRunIntervalClient": 10}, "0.4.9.11", None, False, 10),
        ({"KISTSchedRunInterval": 10}, "0.4.8.1-alpha", None, False, 10),  # one key for all before 0.4.8.2
        ({}, "0.4.8.1-alpha", None, True, 10),
        ({}, "Tor 0.4.8.13", None, True, 2),
        (None, "0.3.2.1-alpha", None, True, 10),
    ],
)
def test_effective_value(params, version, torrc, server, expected):
    assert effective_value(params, "KISTSchedRunInterval", version, torrc, server) == expected


def test_effective_value_errors():
    with pytest.raises(VotingError, match="maximum 100"):
        effective_value({}, "KISTSchedRunInterval", "0.4.9.11", torrc_value=101)
    with pytest.raises(VotingError, match="does not exist"):
        effective_value({}, "KISTSchedRunInterval", "0.3.1.9")
    with pytest.raises(VotingError, match="KISTSchedRunIntervalClient does not exist"):
        effective_value({}, "KISTSchedRunIntervalClient", "0.4.7.1", is_server=False)
    with pytest.raises(VotingError, match="did you mean KISTSchedRunInterval"):
        effective_value({}, "kistschedruninterval", "0.4.9.11")
    with pytest.raises(VotingError, match="no bounds known for consensus parameter nosuch"):
        effective_value({}, "nosuch", "0.4.9.11")
    with pytest.raises(VotingError, match="not like"):
        parse_tor_version("latest")


def test_param_bounds_and_versions():
    assert parse_tor_version("0.4.8.2-alpha") == TorVersion(0, 4, 8, 2)
    assert parse_tor_version("Tor 0.4.9.11 (git-abc)") == TorVersion(0, 4, 9, 11)
    assert param_bounds("KISTSchedRunInterval", "0.4.9.1-alpha", is_server=False) == ParamBounds(
        "KISTSchedRunIntervalClient", 2, 2, 100
    )
    assert param_bounds("KISTSchedRunInterval", "0.4.6.10") == ParamBounds("KISTSchedRunInterval", 10, 0, 100)


def test_other_catalogue_parameters_are_clamped_too():
    assert effective_value({"circwindow": 50}, "circwindow", "0.4.9.11") == 100
    assert effective_value({"circwindow": 5000}, "circwindow", "0.4.9.11") == 1000
    assert effective_value(None, "circwindow", "0.4.9.11") == 1000
    # circwindow has no torrc override: the consensus value stands
    assert effective_value({"circwindow": 500}, "circwindow", "0.4.9.11", torrc_value=700) == 500
