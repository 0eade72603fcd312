"""What-if solver (dirspec-params.md §1.3, §1.4, §2.1) and `kistexp authorities whatif`."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kistexp.cli import app
from kistexp.dirauth.voting import Vote, VotingError, compute_consensus_params
from kistexp.dirauth.whatif import (
    consensus_if_only,
    parse_target,
    parse_vote_option,
    rollback_possible,
    solve_target,
    whatif_report,
)
from kistexp.errors import KistexpError
from kistexp.jsonout import to_json

K = "KISTSchedRunInterval"
NINE = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg", "maatuska", "longclaw", "bastet", "faravahar"]


def kist_votes(values: list[int | None]) -> list[Vote]:
    return [Vote(name, {} if v is None else {K: v}) for name, v in zip(NINE, values, strict=False)]


def test_the_issue_example_in_words():
    votes = kist_votes([2, 2, 2, 2, 10, 10, 10, 10, 10])
    res = solve_target(votes, 9, K, 2)
    assert res.explanation == (
        "9 of 9 list it: 4 at 2, 5 at 10; the low median is 10; one more authority at <= 2 makes it 2"
    )
    assert res.current == 10 and res.result == 2 and res.possible and res.bound == "<="
    assert [(c.before, c.after) for c in res.changes] == [(10, 2)]


def test_all_nine_listing_need_five_each_way():
    """§1.4 rule of thumb: with all nine listing, both directions need 5 authorities."""
    down = solve_target(kist_votes([10] * 9), 9, K, 2)
    assert len(down.changes) == 5 and down.result == 2
    up = solve_target(kist_votes([2] * 9), 9, K, 10)
    # all five at exactly 10: five at 11 would make it 11
    assert len(up.changes) == 5 and up.result == 10 and up.bound == "="


def test_silent_authorities_start_listing_to_reach_the_threshold():
    res = solve_target(kist_votes([2, 2, None, None, None, None, None, None, None]), 9, K, 2)
    assert res.current is None and len(res.changes) == 1 and res.changes[0].before is None
    assert res.bound == "any"  # the third listing authority may list anything
    assert "one more authority listing it" in res.explanation
    # unnamed configured authorities are silent too
    res = solve_target(kist_votes([2, 2]), 9, K, 2)
    assert res.changes[0].authority == "another authority #1"


def test_removal_and_rollback_with_unreachable_authorities():
    votes = kist_votes([2, 2, 2, 2, None, None, None, None, None])
    gone = solve_target(votes, 9, K, None)
    assert len(gone.changes) == 2 and gone.result is None and all(c.after is None for c in gone.changes)
    assert "two authorities must stop listing it" in gone.explanation
    assert rollback_possible(votes, 9, K, None, unreachable=["moria1", "tor26"])
    assert not rollback_possible(votes, 9, K, None, unreachable=["moria1", "tor26", "dizum"])
    # back to 10 needs 3 listing >= 10 out of 5 listers, or converting: here 2 of 4 plus 1 silent...
    back = solve_target(votes, 9, K, 10, frozen=["moria1", "tor26"])
    assert back.possible and back.result == 10
    locked = solve_target(kist_votes([2] * 9), 9, K, 10, frozen=NINE[:5])
    assert not locked.possible and "unchangeable" in locked.explanation and locked.result == 2


def test_absent_votes_change_the_outcome():
    votes = kist_votes([2, 2, 2, 10, 10, 10, 10, None, None])
    assert solve_target(votes, 9, K, 10).current == 10
    fewer = solve_target(votes, 9, K, 10, absent=["gabelmoo"])  # one 10 fewer: {2,2,2,10,10,10} -> 2
    assert fewer.current == 2 and len(fewer.changes) == 1


def test_consensus_if_only_some_votes_arrive():
    """real-tor.md exp 3 and exp 4: threshold uses configured N; > N/2 votes to compute."""
    votes = [
        Vote("auth0", {K: 2, "pfour": 1, "pthree": 30, "ptwo": 5}),
        Vote("auth1", {K: 2, "pfour": 2, "pthree": 10, "ptwo": 7}),
        Vote("auth2", {K: 1, "pfour": 3, "pthree": 20}),
        Vote("auth3", {K: 1, "pfour": 4, "pone": 9}),
        Vote("auth4"),
    ]
    three = consensus_if_only(votes, 5, ["auth0", "auth1", "auth2"])
    assert three.formation.can_compute and dict(three.params) == {K: 2, "pfour": 2, "pthree": 20}
    two = consensus_if_only(votes, 5, ["auth0", "auth1"])
    assert not two.formation.can_compute and two.params is None
    with pytest.raises(VotingError, match="unknown authority"):
        consensus_if_only(votes, 5, ["nobody"])


# --- minimality against brute force --------------------------------------------------


def _brute_force_min(votes: list[Vote], n: int, key: str, target: int | None, frozen: set[str]) -> int | None:
    """Fewest changes by trying every subset; only a value's side of the target matters."""
    extra = [Vote(f"another authority #{i + 1}") for i in range(n - len(votes))]
    everyone = votes + extra
    changeable = [i for i, v in enumerate(everyone) if v.authority not in frozen]
    states: list[int | None] = [None] if target is None else [None, target - 1, target, target + 1]
    for size in range(len(changeable) + 1):
        for subset in itertools.combinations(changeable, size):
            for choice in itertools.product(states, repeat=size):
                trial = list(everyone)
                for i, new in zip(subset, choice, strict=True):
                    trial[i] = Vote(trial[i].authority, {} if new is None else {key: new})
                if dict(compute_consensus_params(trial, n)).get(key) == target:
                    return size
    return None


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 6),
    data=st.data(),
)
def test_solver_is_minimal(n, data):
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=0, max_size=n))
    votes = [Vote(f"a{i}", {} if v is None else {"k": v}) for i, v in enumerate(values)]
    target = data.draw(st.one_of(st.none(), st.integers(0, 5)))
    names = [v.authority for v in votes]
    frozen = set(data.draw(st.lists(st.sampled_from(names), unique=True))) if names else set()
    res = solve_target(votes, n, "k", target, frozen=frozen)
    expected = _brute_force_min(votes, n, "k", target, frozen)
    if expected is None:
        assert not res.possible
        return
    assert res.possible and len(res.changes) == expected
    assert res.result == target
    assert not {c.authority for c in res.changes} & frozen
    # applying the changes really gives the target
    after = {c.authority: c.after for c in res.changes}
    trial = votes + [Vote(f"another authority #{i + 1}") for i in range(n - len(votes))]
    trial = [
        Vote(v.authority, {} if after[v.authority] is None else {"k": after[v.authority]})
        if v.authority in after
        else v
        for v in trial
    ]
    assert dict(compute_consensus_params(trial, n)).get("k") == target


# --- parsing the command-line forms --------------------------------------------------


def test_parse_vote_option():
    opt = parse_vote_option("moria1=b=2 a=1")
    assert opt.vote.params == (("a", 1), ("b", 2)) and opt.dropped_because == ""
    assert parse_vote_option("tor26=").vote.params == ()
    dropped = parse_vote_option("dizum=a=1 a=2")
    assert dropped.vote is None and "listed twice" in dropped.dropped_because
    assert parse_vote_option("dizum=a=2147483648").vote is None
    for bad in ("noequals", "=a=1", "x=a", "x=a=b", "x=a=1.5"):
        with pytest.raises(VotingError):
            parse_vote_option(bad)


def test_parse_target():
    assert parse_target("K=2") == ("K", 2)
    assert parse_target("K=") == ("K", None) == parse_target("K=absent")
    for bad in ("K", "K=two", "=2", "K=9999999999"):
        with pytest.raises(VotingError):
            parse_target(bad)


def test_report_validation():
    with pytest.raises(VotingError, match="given twice"):
        whatif_report(["a=k=1", "a=k=2"], 3)
    with pytest.raises(VotingError, match="--n-authorities is 1"):
        whatif_report(["a=k=1", "b=k=2"], 1)
    with pytest.raises(VotingError, match="unknown authority zz"):
        whatif_report(["a=k=1"], 3, unreachable=["zz"])


# --- CLI -----------------------------------------------------------------------------

runner = CliRunner()


def _vote_args(values: list[int]) -> list[str]:
    pairs = zip(NINE, values, strict=False)
    return [arg for name, v in pairs for arg in ("--vote", f"{name}={K}={v} cc_alg=2")]


def test_cli_human_output():
    args = ["authorities", "whatif", "--n-authorities", "9", *_vote_args([2, 2, 2, 2, 10, 10, 10, 10, 10])]
    result = runner.invoke(app, [*args, "--target", f"{K}=2"])
    assert result.exit_code == 0, result.output
    assert f"consensus params: {K}=10 cc_alg=2" in result.output
    assert "one more authority at <= 2 makes it 2" in result.output
    assert "change bastet: 10 -> 2" in result.output


def test_cli_json_and_silent_authorities():
    args = ["authorities", "whatif", "--n-authorities", "9", "--vote", f"moria1={K}=2", "--vote", "tor26=",
            "--target", f"{K}=2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["consensus_params"] == {} and doc["votes_held"] == 9 and doc["inclusion_threshold"] == 3
    assert doc["tally"][0]["listed"] == {"moria1": 2} and not doc["tally"][0]["included"]
    assert doc["target"]["possible"] and len(doc["target"]["changes"]) == 2


def test_cli_duplicate_key_drops_the_vote_with_a_warning():
    args = ["authorities", "whatif", "--n-authorities", "3", "--vote", f"a={K}=2", "--vote", f"b={K}=2",
            "--vote", f"c={K}=3 {K}=4", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert "warning:" in result.stderr and "tor drops c's vote" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["consensus_params"] == {K: 2} and doc["votes_held"] == 2
    assert doc["dropped_votes"][0]["authority"] == "c"


@pytest.mark.parametrize(
    "extra",
    [
        ["--n-authorities", "1", "--vote", "a=k=1", "--vote", "b=k=1"],
        ["--n-authorities", "3", "--vote", "a=k"],
        ["--n-authorities", "3", "--vote", "a=k=1", "--target", "k=x"],
    ],
)
def test_cli_bad_input_is_one_line_error(extra, monkeypatch, capsys):
    result = runner.invoke(app, ["authorities", "whatif", *extra])
    assert result.exit_code == 1 and isinstance(result.exception, KistexpError)
    from kistexp import cli

    monkeypatch.setattr("sys.argv", ["kistexp", "authorities", "whatif", *extra])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("kistexp: error: ") and err.count("\n") == 1


def test_large_electorate_is_direct():
    votes = [Vote(f"a{i}", {"k": 10}) for i in range(101)]
    res = solve_target(votes, 101, "k", 2)
    assert len(res.changes) == 51 and res.result == 2
    res = solve_target(votes[:40], 101, "k", None)
    assert len(res.changes) == 38  # down to 2 listing, below the threshold of 3


def test_tally_words_for_a_key_nobody_lists():
    res = solve_target(kist_votes([None] * 9), 9, K, 2)
    assert res.explanation.startswith(f"no authority lists {K} (0 of 9); it is absent from the consensus")
    assert len(res.changes) == 3 and res.bound == "="  # three at 1 would make it 1
    # generators are fine for the name lists
    assert solve_target(kist_votes([2] * 3), 9, K, None, frozen=(n for n in NINE[:1])).possible


# --- bounds, names and hostile text (issue 7) ----------------------------------------------


def test_huge_n_is_answered_without_an_object_per_silent_authority():
    import time
    import tracemalloc

    from kistexp.dirauth.whatif import MAX_N_AUTHORITIES

    assert MAX_N_AUTHORITIES == 2**31 - 1  # tor's int count of DirAuthority lines
    tracemalloc.start()
    t = time.monotonic()
    for n in (10**9, MAX_N_AUTHORITIES):
        rep = whatif_report([f"moria1={K}=5", f"tor26={K}=5"], n, target=f"{K}=7", unreachable=["moria1"])
        assert rep.n_silent == n - 2 and rep.formation.n_votes == n
        assert rep.target.possible and rep.target.result == 7
        # tor26 moved and one recruit: 5, 7, 7 -> low median 7
        assert [c.authority for c in rep.target.changes] == ["tor26", "another authority #1"]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - t < 1.0 and peak < 2 * 1024 * 1024
    for bad in (0, -1, MAX_N_AUTHORITIES + 1, 10**400):
        with pytest.raises(VotingError, match="--n-authorities .*expected 1 to 2147483647"):
            whatif_report([], bad)


def test_cli_rejects_n_beyond_tors_int_and_giant_numbers():
    for n in ("2147483648", "1" + "0" * 400, "1" * 5000):
        result = runner.invoke(app, ["authorities", "whatif", "--n-authorities", n])
        assert result.exit_code != 0
        assert result.exception is None or isinstance(result.exception, (KistexpError, SystemExit))


def test_authority_names_are_case_insensitive():
    rep = whatif_report([f"Moria1={K}=5", f"tor26={K}=5", f"dizum={K}=5"], 9, target=f"{K}=7",
                        unreachable=["MORIA1"], absent=["DIZUM"])
    assert "Moria1" not in {c.authority for c in rep.target.changes}
    assert rep.formation.n_votes == 8
    with pytest.raises(VotingError, match="--vote MORIA1 is given twice"):
        whatif_report([f"moria1={K}=5", f"MORIA1={K}=6"], 9)


def test_cli_prints_hostile_names_and_keys_as_text():
    evil = "\x1b]0;pwned\x07[/red]"
    result = runner.invoke(app, ["authorities", "whatif", "--n-authorities", "3",
                                 "--vote", f"{evil}=[bold]x=1", "--vote", "b=[bold]x=1", "--vote", "c=[bold]x=1",
                                 "--target", "[bold]x=2"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b]0;pwned\\x07[/red]" in result.output and "[bold]x=1" in result.output


@settings(max_examples=150, deadline=2000)
@given(
    n=st.integers(min_value=-5, max_value=2**40),
    votes=st.lists(st.tuples(st.text(min_size=0, max_size=8), st.text(max_size=30)), max_size=12),
    target=st.one_of(st.none(), st.text(max_size=20)),
    unreachable=st.lists(st.text(max_size=8), max_size=3),
)
def test_whatif_arguments_give_a_result_or_one_line_error(n, votes, target, unreachable):
    specs = [f"{name}={body}" for name, body in votes]
    try:
        rep = whatif_report(specs, n, target, unreachable)
    except KistexpError as exc:
        assert "\n" not in str(exc)
        return
    json.dumps(to_json(rep), default=str)
    assert 1 <= rep.n_authorities <= 2**31 - 1
