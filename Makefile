# Two entry points on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# A target whose recipe fails or is interrupted is deleted, so the next make runs it again.
.DELETE_ON_ERROR:

DEMO_EXP := experiments/kist-run-interval-2020
DEMO_PREDICTED := $(DEMO_EXP)/.predicted

# The population's predictions take a few minutes to make (3 sampled networks at the plan's
# scale, the bundled consensus and GeoIP table); made once, reused by every later demo. The stamp
# is written last: kistexp simulate writes experiment.db whole or not at all, and a failed or
# stopped run leaves no stamp, so the next make demo simulates again.
# DEMO_SIMULATE_FLAGS=--fast predicts with the NICs scaled down (minutes faster, labelled in the report);
# the test suite's demo test uses it, a user's demo predicts at full NIC rates.
DEMO_SIMULATE_FLAGS ?=
$(DEMO_PREDICTED): plans/kist-run-interval-2020.toml | $(STAMP)
	$(BIN)/kistexp simulate plans/kist-run-interval-2020.toml --dir $(DEMO_EXP) $(DEMO_SIMULATE_FLAGS)
	touch $@

# lint, timeline, the whole plan rehearsed on the virtual clock with a relay CPU rise injected in
# stage 1 (the judge fails it and the engine steps back), then the report of that dry run.
demo: $(STAMP) $(DEMO_PREDICTED)
	$(BIN)/kistexp lint plans/kist-run-interval-2020.toml
	$(BIN)/kistexp show plans/kist-run-interval-2020.toml
	$(BIN)/kistexp dry-run plans/kist-run-interval-2020.toml --dir $(DEMO_EXP) \
		--inject stage=1:relay_cpu_utilization=+50%
	$(BIN)/kistexp report $(DEMO_EXP) -o $(DEMO_EXP)/report.html

lint: $(STAMP)
	$(BIN)/ruff check kistexp fake_authorities tests bench

test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
