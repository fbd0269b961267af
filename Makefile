# The two commands of the README: `make run` (the whole stack locally) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench-quick clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/hardcap demo

lint: $(BIN)/.installed
	$(BIN)/ruff check hardcap_core tests bench $(wildcard functions)
	$(BIN)/ruff format --check hardcap_core
	$(BIN)/mypy --strict hardcap_core

test: lint
	$(BIN)/python -m pytest -q

bench-quick: $(BIN)/.installed
	PYTHONPATH=. $(BIN)/python bench/overshoot.py --quick --check

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
