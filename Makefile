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

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# The main job: fetch a dataset (verified) and write both databases, as Caffe's
# get_mnist.sh + create_mnist.sh. make mnist DATASET=fashion-mnist BACKEND=leveldb MIRROR=URL
# (MIRROR: a URL or directory tried first; several separated by spaces; MNIST2DB_MIRROR works too).
DATASET ?= mnist
BACKEND ?= lmdb
MIRROR ?=

.PHONY: mnist
mnist: $(STAMP)
	$(BIN)/mnist2db fetch --dataset $(DATASET) $(foreach m,$(MIRROR),--mirror $(m))
	$(BIN)/mnist2db create --dataset $(DATASET) --backend $(BACKEND) --overwrite
