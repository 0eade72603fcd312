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
