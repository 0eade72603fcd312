import datetime as dt

import pytest
from plan_helpers import VALID_PLAN

from kistexp.durations import format_duration, parse_duration
from kistexp.errors import PlanError
from kistexp.plan import load_plan, parse_plan
from kistexp.plan.model import UNSET


def test_valid_plan_loads_into_frozen_objects():
    plan = parse_plan(VALID_PLAN, "p.toml")
    assert plan.name == "test-plan"
    assert plan.start == dt.datetime(2030, 1, 7, 12, tzinfo=dt.timezone.utc)
    assert [s.name for s in plan.stages] == ["two", "eight"]
    assert plan.stages[0].values == (("KISTSchedRunInterval", 2),)
    assert plan.stages[1].gate == "manual"
    assert plan.end == plan.start + dt.timedelta(days=28)
    assert len(plan.authorities.authorities) == 9
    with pytest.raises(AttributeError):
        plan.name = "other"  # frozen


@pytest.mark.parametrize("text,expected", [
    ("14d", dt.timedelta(days=14)), ("36h", dt.timedelta(hours=36)), ("90m", dt.timedelta(minutes=90)),
    ("1w2d", dt.timedelta(days=9)), ("30s", dt.timedelta(seconds=30)), ("1d 12h", dt.timedelta(hours=36)),
])
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["-3d", "0h", "3 days", "", "h", "12", "1.5d"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration_rounds_up_to_minutes():
    assert format_duration(dt.timedelta(days=14)) == "14d"
    assert format_duration(dt.timedelta(seconds=5401)) == "1h31m"


def _mutate(old, new):
    assert old in VALID_PLAN
    return VALID_PLAN.replace(old, new, 1)


@pytest.mark.parametrize("text,needle", [
    ("[experiment\nname=1", "TOML syntax error"),
    (_mutate('duration = "14d"', 'duration = "-14d"'), "stages[0].duration: duration '-14d' is negative"),
    (_mutate('duration = "14d"', "duration = 14"), "stages[0].duration: expected a string"),
    (_mutate("threshold = 0.1", 'threshold = "10%"'), "criteria[0].threshold: expected a number"),
    (_mutate('gate = "manual"', 'gate = "maybe"'), "stages[1].gate: 'maybe' is not one of auto, manual"),
    (_mutate('name = "eight"', 'name = "two"'), "stages[1].name: duplicate stage name 'two'"),
    (_mutate('"dannenberg"]', '"dannenburg"]'), "unknown authority 'dannenburg' (did you mean 'dannenberg'?)"),
    (_mutate("owner =", "ownr ="), "unknown key (did you mean 'owner'?)"),
    (_mutate("start = 2030-01-07T12:00:00Z", "start = 2030-01-07T12:00:00"), "experiment.start: give the time in UTC"),
    (_mutate("values = { KISTSchedRunInterval = 2 }", "values = { KISTSchedRunInterval = 2.5 }"),
     "stages[0].values.KISTSchedRunInterval: expected an integer"),
    (_mutate("values = { KISTSchedRunInterval = 2 }", "values = { KISTSchedRunInterval = 4294967296 }"),
     "outside the int32 range"),
    (_mutate("values = { KISTSchedRunInterval = 2 }", "values = { Other = 2 }"),
     "Other is not in experiment.parameters"),
    (_mutate('parameters = ["KISTSchedRunInterval"]', "parameters = []"), "name at least one parameter"),
    (_mutate("min_samples = 100", "min_samples = 0"), "criteria[0].min_samples: 0 is outside"),
])
def test_bad_plans_give_one_line_located_errors(text, needle):
    with pytest.raises(PlanError) as info:
        parse_plan(text, "p.toml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("p.toml")
    assert needle in message


def test_error_names_the_line():
    text = _mutate('duration = "14d"', 'duration = "-14d"')
    line = text.splitlines().index('duration = "-14d"') + 1
    with pytest.raises(PlanError, match=rf"^p.toml:{line}: stages\[0\].duration"):
        parse_plan(text, "p.toml")


def test_empty_stage_list():
    head, _, rest = VALID_PLAN.partition("[[stages]]")
    _, _, tail = rest.partition("[authorities]")
    text = "stages = []\n" + head + "[authorities]" + tail
    with pytest.raises(PlanError, match="the plan has no stages"):
        parse_plan(text, "p.toml")


def test_million_stages_rejected_quickly():
    stage = '[[stages]]\nname = "s{i}"\nduration = "1d"\nvalues = {{ KISTSchedRunInterval = 2 }}\n'
    head, _, rest = VALID_PLAN.partition("[[stages]]")
    _, _, tail = rest.partition("[authorities]")
    many = "".join(stage.format(i=i) for i in range(1000))
    with pytest.raises(PlanError, match="more than the limit"):
        parse_plan(head + many + "[authorities]" + tail, "p.toml")


def test_huge_file_rejected_before_parsing(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.write(b"# " + b"x" * (100 * 1024 * 1024) + b"\n")
    with pytest.raises(PlanError, match="larger than the 1048576-byte limit"):
        load_plan(big)


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "none.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match="not UTF-8"):
        load_plan(binary)


def test_switchback_expands_into_alternating_stages():
    head, _, rest = VALID_PLAN.partition("[[stages]]")
    _, _, tail = rest.partition("[authorities]")
    text = head.replace('kind = "staged"', 'kind = "switchback"') + (
        "[switchback]\ntreatment = { KISTSchedRunInterval = 2 }\ncontrol = { KISTSchedRunInterval = 3 }\n"
        'period = "24h"\nwashout = "2h"\ncycles = 3\n'
    ) + "[authorities]" + tail
    plan = parse_plan(text, "p.toml")
    assert [s.name for s in plan.stages] == ["treatment-1", "control-1", "treatment-2", "control-2",
                                             "treatment-3", "control-3"]
    assert plan.stages[1].values == (("KISTSchedRunInterval", 3),)
    assert plan.end - plan.start == dt.timedelta(hours=144)


def test_unset_value_and_custom_authorities():
    text = _mutate("values = { KISTSchedRunInterval = 8 }", 'values = { KISTSchedRunInterval = "unset" }')
    text = text.replace('participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]',
                        'participating = ["a1", "a2"]\n'
                        '[[authorities.custom]]\nnickname = "a1"\nv3ident = "' + "A" * 40 + '"\n'
                        'dirport = "127.0.0.1:7000"\n'
                        '[[authorities.custom]]\nnickname = "a2"\nv3ident = "' + "B" * 40 + '"\n'
                        'dirport = "127.0.0.1:7001"\n')
    plan = parse_plan(text, "p.toml")
    assert plan.stages[1].values == (("KISTSchedRunInterval", UNSET),)
    assert [a.dir_url for a in plan.authorities.authorities] == ["http://127.0.0.1:7000", "http://127.0.0.1:7001"]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("v3ident", "A" * 40 + "\n", "expected 40 hex digits"),
    ("nickname", "a1\n", "is not a tor nickname"),
])
def test_custom_authority_names_and_identities_with_a_trailing_newline_are_refused(key, value, message):
    fields = {"nickname": "a1", "v3ident": "A" * 40, key: value}
    text = VALID_PLAN.replace('participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]',
                              'participating = ["a1"]\n[[authorities.custom]]\n'
                              f'nickname = {fields["nickname"]!r}\nv3ident = {fields["v3ident"]!r}\n'
                              'dirport = "127.0.0.1:7000"\n'.replace("'", '"'))
    with pytest.raises(PlanError, match=message):
        parse_plan(text, "p.toml")
