# The two commands of the README: `make run` (the whole stack locally) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The SAM CLI, for the tests that lint the template and build the Lambda artifact: a venv of its
# own, because it pins older pydantic and boto3 than the project; inside $(VENV) by default, so
# git ignores it and `make clean` removes it.
SAM_VENV ?= $(VENV)/sam-cli

.PHONY: run test test-fast lint bench-quick clean

# pytest-xdist workers: each starts its own Valkey servers and moto on free ports (session
# fixtures). A file's tests run on one worker, in order (--dist loadfile): a module fixture (a
# SAM build, a wheel) is made once, and a module's seeded mock hands out its plans in the order
# a serial run does. 2 on this 2-core machine: 16 minutes serial, 12 in two.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

$(SAM_VENV)/.installed: infra/requirements-tools.txt
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SAM_VENV)/bin/python -m pip install --quiet -r infra/requirements-tools.txt
	touch $@

# The real clients the tests run (Claude Code, Codex CLI, the Vercel AI SDK), pinned by the lock.
CLIENTS := tests/clients/node_modules/.installed
$(CLIENTS): tests/clients/package-lock.json
	npm ci --prefix tests/clients --no-audit --no-fund
	touch $@

run: $(BIN)/.installed
	$(BIN)/hardcap demo

lint: $(BIN)/.installed
	$(BIN)/ruff check hardcap_core tests bench $(wildcard functions)
	$(BIN)/ruff format --check hardcap_core
	$(BIN)/mypy --strict hardcap_core

# sam goes at the end of PATH, so `python3` stays the project's; HARDCAP_REQUIRE_SAM=1 makes a
# test that cannot find sam fail instead of skipping; HARDCAP_REQUIRE_CLIENTS=1 the same for a
# real client missing from tests/clients/node_modules.
test: lint $(SAM_VENV)/.installed $(CLIENTS)
	PATH="$$PATH:$(abspath $(SAM_VENV))/bin" HARDCAP_REQUIRE_SAM=1 HARDCAP_REQUIRE_CLIENTS=1 $(PYTEST)

# The unit and functional tiers (and the benchmarks' own tests): the loop before a commit.
test-fast: lint
	PATH="$$PATH:$(abspath $(SAM_VENV))/bin" $(PYTEST) tests/unit tests/functional bench/tests

bench-quick: $(BIN)/.installed
	$(BIN)/python -m bench overshoot --quick --check

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/clients/node_modules
