"""ConsensusParams: the params line of a vote or consensus as a value (kistexp.dirauth.paramsline).

tor's rules for the line are those of ns_parse.c ``networkstatus_parse_vote_from_string``: every
item ``key=value`` with a value ``tor_parse_long(.., INT32_MIN, INT32_MAX)`` accepts ("Bad element
'%s' in params"), items strictly increasing in strcmp order of the whole ``key=value`` strings
("params not in order"), no keyword twice ("Duplicate in parameters"). tor writes the line in that
order (dirspec-params.md §1.1).
"""

from __future__ import annotations

import random

import attrs
import pytest

from kistexp.dirauth.paramsline import (
    ConsensusParams,
    OutOfBounds,
    ParamsDiff,
    format_params,
    parse_params,
    sort_params,
)
from kistexp.errors import DocumentError


def _params_line(path) -> str:
    with open(path, encoding="ascii") as fh:
        for line in fh:
            if line.startswith("params "):
                return line.rstrip("\n")
            if line.startswith("dir-source "):
                break
    raise AssertionError(f"{path} has no params line")


# --- the real consensus ---------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["consensus_path", "microdesc_consensus_path"])
def test_real_params_line_round_trips(which, request) -> None:
    line = _params_line(request.getfixturevalue(which))
    body = line.removeprefix("params ")
    cp = ConsensusParams.parse(line)
    assert str(cp) == cp.format() == body  # exactly what the authorities wrote
    assert ConsensusParams.parse(body) == cp  # with or without the keyword
    assert len(cp) == 33
    assert cp["KISTSchedRunInterval"] == 2 and cp["cc_alg"] == 2 and cp["circ_max_cell_queue_size"] == 2000
    assert list(cp) == [item.partition("=")[0] for item in body.split()]  # iterated in tor's order
    assert cp.pairs == parse_params(body)
    # however the pairs come in, the line is tor's
    shuffled = list(cp.items())
    random.Random(7).shuffle(shuffled)
    assert ConsensusParams(shuffled).format() == body
    assert ConsensusParams(dict(shuffled)) == cp
    assert ConsensusParams.parse(repr(cp).removeprefix("ConsensusParams.parse(").removesuffix(")")[1:-1]) == cp
    assert eval(repr(cp), {"ConsensusParams": ConsensusParams}) == cp


# --- tor's order --------------------------------------------------------------------------------

@pytest.mark.parametrize(("pairs", "line"), [
    # strcmp on "key=value": '1' (0x31) < '=' (0x3d), so Foo1 comes before Foo
    ({"Foo": 2, "Foo1": 1}, "Foo1=1 Foo=2"),
    # '-' (0x2d) < '=' too: the longer real parameter name first, as in the 2022 consensus
    ({"guard-n-primary-guards": 1, "guard-n-primary-guards-to-use": 2},
     "guard-n-primary-guards-to-use=2 guard-n-primary-guards=1"),
    # '_' (0x5f) > '=': the shorter name first
    ({"cc_cwnd_inc_rate": 31, "cc_cwnd_inc": 1}, "cc_cwnd_inc=1 cc_cwnd_inc_rate=31"),
    # bytes, not case-folded: upper case before lower case
    ({"bwauthpid": 1, "UseOptimisticData": 1, "KISTSchedRunInterval": 2},
     "KISTSchedRunInterval=2 UseOptimisticData=1 bwauthpid=1"),
    ({}, ""),
])
def test_sorted_as_tor_sorts(pairs, line) -> None:
    cp = ConsensusParams(pairs)
    assert cp.format() == line == format_params(pairs)
    assert cp.pairs == sort_params(pairs)
    assert ConsensusParams.parse(line) == cp  # and tor reads back what it wrote


def test_python_key_order_is_not_tors() -> None:
    pairs = {"a": 1, "a-b": 2}
    assert " ".join(f"{k}={v}" for k, v in sorted(pairs.items())) == "a=1 a-b=2"
    assert str(ConsensusParams(pairs)) == "a-b=2 a=1"
    with pytest.raises(DocumentError, match="out of order"):
        ConsensusParams.parse("a=1 a-b=2")


# --- what tor rejects -----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "message"), [
    ("a=1 a=2", "a is listed twice"),  # "Duplicate value for %s parameter"
    ("a=x", "a has a non-integer value 'x'"),  # tor_parse_long fails: "Bad element"
    ("a=1.5", "non-integer value"),
    ("a=", "non-integer value ''"),
    ("a=0x10", "non-integer value"),
    ("a=١٢", "non-integer value"),  # ASCII digits only
    ("a=2147483648", "a=2147483648 is outside the int32 range"),  # past INT32_MAX
    ("a=-2147483649", "outside the int32 range"),  # below INT32_MIN
    ("a=" + "9" * 5000, "outside the int32 range"),  # a clear error, not int()'s digit limit
    ("a", "item 'a' is not key=value"),  # no '=': "Bad element"
    ("=1", "is not key=value"),
    ("b=1 a=1", "a=1 is out of order after b=1"),  # "params not in order"
    ("Foo=2 Foo1=1", "out of order"),
])
def test_parse_rejects_what_tor_rejects(body, message) -> None:
    with pytest.raises(DocumentError, match=message):
        ConsensusParams.parse(body, "v.txt: params line")
    with pytest.raises(DocumentError, match="^v.txt: params line: "):
        ConsensusParams.parse("params " + body, "v.txt: params line")


def test_int32_bounds_are_accepted() -> None:
    cp = ConsensusParams.parse("params a=2147483647 b=-2147483648 c=0")
    assert cp.as_dict() == {"a": 2**31 - 1, "b": -(2**31), "c": 0}


@pytest.mark.parametrize(("pairs", "message"), [
    ([("a", 1), ("a", 2)], "a is listed twice"),
    ({"a": 2**31}, "outside the int32 range"),
    ({"a": -(2**31) - 1}, "outside the int32 range"),
    ({"a": True}, "non-integer value True"),
    ({"a": "1"}, "non-integer value '1'"),
    ({"a": 1.0}, "non-integer value 1.0"),
    ({"": 1}, "bad keyword ''"),
    ({"a b": 1}, "bad keyword"),  # would split into two items
    ({"a=b": 1}, "bad keyword"),  # tor splits at the first '='
    ({"a\tb": 1}, "bad keyword"),
    ({1: 1}, "bad keyword 1"),
    ([("a",)], "is not a \\(name, value\\) pair"),
])
def test_pairs_tor_could_not_read_back_are_refused(pairs, message) -> None:
    with pytest.raises(DocumentError, match=message):
        ConsensusParams.from_pairs(pairs, "plan")


def test_a_line_is_parsed_not_iterated() -> None:
    with pytest.raises(TypeError, match="ConsensusParams.parse"):
        ConsensusParams("a=1")  # type: ignore[arg-type]


# --- the value type -------------------------------------------------------------------------------

def test_immutable_typed_mapping() -> None:
    cp = ConsensusParams({"b": 2, "a": 1})
    assert cp["a"] == 1 and cp.get("c") is None and "b" in cp and "c" not in cp and len(cp) == 2
    assert list(cp.keys()) == ["a", "b"] and list(cp.values()) == [1, 2] and list(cp.items()) == [("a", 1), ("b", 2)]
    assert cp.as_dict() == {"a": 1, "b": 2} and isinstance(cp.as_dict(), dict)
    with pytest.raises(KeyError):
        cp["c"]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cp.pairs = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        cp["a"] = 3  # type: ignore[index]
    assert ConsensusParams([("a", 1), ("b", 2)]) == cp and hash(ConsensusParams(cp)) == hash(cp)
    assert cp != {"a": 1, "b": 2}  # a value type: compare as_dict() with a dict
    assert not ConsensusParams() and ConsensusParams() == ConsensusParams.parse("params")


def test_merge_with_values_without() -> None:
    cp = ConsensusParams.parse("KISTSchedRunInterval=2 cc_alg=2")
    merged = cp.merge({"cc_alg": 1, "Foo1": 1})
    assert str(merged) == "Foo1=1 KISTSchedRunInterval=2 cc_alg=1"  # the other's value wins
    assert str(cp) == "KISTSchedRunInterval=2 cc_alg=2"  # unchanged
    assert cp.with_values({"cc_alg": 1}, Foo1=1) == merged
    assert cp.with_values(KISTSchedRunInterval=3)["KISTSchedRunInterval"] == 3
    assert cp.merge(ConsensusParams()) == cp and ConsensusParams().merge(cp) == cp
    with pytest.raises(DocumentError, match="outside the int32 range"):
        cp.with_values(cc_alg=2**31)
    with pytest.raises(DocumentError, match="listed twice"):
        cp.merge([("x", 1), ("x", 2)])
    assert str(merged.without(["Foo1", "absent"])) == "KISTSchedRunInterval=2 cc_alg=1"
    assert str(merged.without("cc_alg")) == "Foo1=1 KISTSchedRunInterval=2"  # one name, not its letters
    assert merged.without(merged) == ConsensusParams()


def test_diff() -> None:
    old = ConsensusParams.parse("KISTSchedRunInterval=2 cbttestfreq=10 cc_alg=2")
    new = ConsensusParams.parse("Foo1=1 KISTSchedRunInterval=3 cc_alg=2")
    d = old.diff(new)
    assert d == ParamsDiff(added=ConsensusParams({"Foo1": 1}), removed=ConsensusParams({"cbttestfreq": 10}),
                           changed=(("KISTSchedRunInterval", 2, 3),))
    assert d and str(d) == "added Foo1=1; removed cbttestfreq=10; changed KISTSchedRunInterval 2->3"
    assert old.merge(d.added).merge({k: v for k, _, v in d.changed}).without(d.removed) == new
    assert not old.diff(old) and str(old.diff(dict(old))) == "no change"
    back = new.diff(old)
    assert back.added == d.removed and back.removed == d.added and back.changed == (("KISTSchedRunInterval", 3, 2),)


def test_validate_against_tors_bounds() -> None:
    cp = ConsensusParams({"KISTSchedRunInterval": 1, "cc_alg": 2, "not_in_catalogue": -5})
    found = cp.validate()  # newest tor: KISTSchedRunInterval is clamped to [2, 100] (bug 40808)
    assert [(f.name, f.value, f.clamped) for f in found] == [("KISTSchedRunInterval", 1, 2)]
    assert isinstance(found[0], OutOfBounds) and "tor runs 2" in str(found[0])
    assert cp.validate("0.4.8.1") == ()  # 0..100 before 0.4.8.2
    assert ConsensusParams({"KISTSchedRunInterval": 500}).validate("0.4.7.1")[0].clamped == 100
