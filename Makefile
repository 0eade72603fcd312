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

demo: $(STAMP)
	$(BIN)/kistexp lint plans/kist-run-interval-2020.toml
	$(BIN)/kistexp show plans/kist-run-interval-2020.toml

lint: $(STAMP)
	$(BIN)/ruff check kistexp fake_authorities tests bench

test: $(STAMP) lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
