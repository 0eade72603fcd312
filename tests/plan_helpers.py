"""A valid plan as TOML text, for tests that change one thing at a time."""

VALID_PLAN = """\
[experiment]
name = "test-plan"
kind = "staged"
owner = "network-team"
contact = "ops@example.org"
description = "test"
start = 2030-01-07T12:00:00Z
tor_versions = ">=0.4.8.2"
parameters = ["KISTSchedRunInterval"]

[baseline]
duration = "7d"
values = { KISTSchedRunInterval = 10 }

[[stages]]
name = "two"
duration = "14d"
values = { KISTSchedRunInterval = 2 }

[[stages]]
name = "eight"
duration = "14d"
gate = "manual"
values = { KISTSchedRunInterval = 8 }

[authorities]
participating = ["moria1", "tor26", "dizum", "gabelmoo", "dannenberg"]

[[criteria]]
metric = "client_ttlb_1mib_s"
statistic = "median"
comparison = "relative-increase"
threshold = 0.1
min_samples = 100
on_fail = "step-back"
"""


def short_plan(name: str, stages: dict[str, int], criteria: str) -> str:
    """VALID_PLAN renamed, with a 2 h baseline, 3 h ``stages`` (name -> KISTSchedRunInterval) and
    ``criteria`` in place of its own criterion."""
    head, _, rest = VALID_PLAN.partition("[[stages]]")
    authorities = "[authorities]" + rest.partition("[authorities]")[2].partition("[[criteria]]")[0]
    body = "".join(f'[[stages]]\nname = "{stage}"\nduration = "3h"\nvalues = {{ KISTSchedRunInterval = {v} }}\n\n'
                   for stage, v in stages.items())
    return (head.replace('name = "test-plan"', f'name = "{name}"', 1).replace('duration = "7d"', 'duration = "2h"', 1)
            + body + authorities + criteria.lstrip("\n"))
