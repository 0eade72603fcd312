"""Property: any text fed to the loader and linter gives a plan or a PlanError, nothing else."""

import datetime as dt

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_helpers import VALID_PLAN

from kistexp.errors import PlanError
from kistexp.jsonout import to_json
from kistexp.plan import parse_plan
from kistexp.plan.lint import _Collector, check_plan
from kistexp.plan.timeline import build_timeline

NOW = dt.datetime(2029, 12, 1, tzinfo=dt.timezone.utc)
LINES = VALID_PLAN.splitlines()
TOKENS = ["-", "0", "1", "2147483648", "-1", '"x"', "[", "]", "{", "}", "=", "true", "1.5", '"unset"', "\"\"",
          "[[stages]]", "[switchback]", "nan", "inf", '"-3d"', '"0s"', "1979-05-27T07:32:00Z", "[]", "'", "\\",
          # the ends of the calendar and of Python's numbers (issue 7)
          "9999-12-31T23:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:00:00-05:00", "1" + "0" * 400,
          "9" * 4400, '"\u0661\u0664d"', '"3650d"', '"[/red]\u001b]0;x\u0007"']


def _load_and_lint(text: str) -> None:
    try:
        plan = parse_plan(text, "fuzz.toml")
    except PlanError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    check_plan(plan, _Collector(plan, text), NOW)
    to_json(build_timeline(plan))  # what `show` prints: every derived date must be computable


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_plans(data):
    lines = list(LINES)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "token", "swap", "truncate"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "token":
            line = lines[i]
            cut = data.draw(st.integers(0, len(line)))
            lines[i] = line[:cut] + data.draw(st.sampled_from(TOKENS)) + line[cut:]
        elif op == "swap":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        if not lines:
            break
    _load_and_lint("\n".join(lines))


toml_scalars = st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=20), st.booleans(),
                         st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text(text):
    _load_and_lint(text)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["name", "duration", "gate", "threshold", "min_samples", "participating", "start",
                            "cycles", "values", "metric", "tor_versions"]),
       value=toml_scalars)
def test_generated_values(key, value):
    import json

    rendered = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
    lines = [f"{key} = {rendered}" if line.split("=")[0].strip() == key else line for line in LINES]
    _load_and_lint("\n".join(lines))
