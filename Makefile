# Set-up is automatic: every target that needs the virtual environment creates it first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install test lint format proto bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

# Regenerate the protobuf module from proto/datum.proto (grpcio-tools pins protoc's version).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=src/mnist2db proto/datum.proto

# Speed and memory against the naive converter and the backends' floors (issue 5); ~2 minutes.
# BENCH_ARGS="--markdown bench.md" also writes the tables as Markdown.
bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
