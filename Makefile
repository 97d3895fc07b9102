# Set-up is automatic: every target that needs the virtual environment creates it first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two stamps: what the package runs on (make install, make mnist), and the test tools on top
# of it (pytest, hypothesis, ruff, mypy: make test, make lint), so `make mnist` installs only
# what it runs.
RUNTIME_STAMP := $(VENV)/.runtime-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: install install-test test test-floor test-dali lint format proto bench clean

install: $(RUNTIME_STAMP)

install-test: $(STAMP)

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# The suite again with every dependency at its declared floor (constraints/floor.txt), in
# its own environment: what a pinned Caffe stack (protobuf 3.20, numpy 1.23) runs. CI runs it.
# The stack is installed first without OpenCV's wheel (Caffe links OpenCV's C++ library, so
# a Caffe stack seldom has the wheel): mnist2db's own pick of OpenCV must keep every pin.
FLOOR_VENV ?= .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed-stamp
CHECK_PINS = $(FLOOR_VENV)/bin/python -c "import sys, importlib.metadata as m; \
	pins = [l.split('==') for l in open(sys.argv[1]) if '==' in l]; \
	bad = [f'{n} {m.version(n)} (floor {v.strip()})' for n, v in pins if m.version(n) != v.strip()]; \
	sys.exit('not at the floor: ' + ', '.join(bad) if bad else 0)"

$(FLOOR_STAMP): pyproject.toml constraints/floor.txt
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	grep -v '^opencv' constraints/floor.txt > $(FLOOR_VENV)/caffe-stack.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(FLOOR_VENV)/caffe-stack.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(CHECK_PINS) $(FLOOR_VENV)/caffe-stack.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r constraints/floor.txt
	touch $(FLOOR_VENV)/.runtime-stamp $(FLOOR_STAMP)

# The pinned stack first, then mnist2db into it, unconstrained: pip must keep every pin.
test-floor: $(FLOOR_STAMP)
	$(CHECK_PINS) constraints/floor.txt
	$(FLOOR_VENV)/bin/python -m pytest

# NVIDIA DALI as a client (tests/test_dali.py: fn.readers.caffe on our LMDBs, raw and PNG,
# every record compared), in its own environment: DALI is ~1.1 GB and runs here on the CPU
# (device_id=None). The main suite skips these tests; CI runs this target.
DALI_VENV ?= .venv-dali
DALI_STAMP := $(DALI_VENV)/.installed-stamp

$(DALI_STAMP): pyproject.toml
	test -x $(DALI_VENV)/bin/python || $(PYTHON) -m venv $(DALI_VENV)
	$(DALI_VENV)/bin/python -m pip install --quiet --disable-pip-version-check nvidia-dali-cuda120 -e '.[test]'
	touch $(DALI_STAMP)

# DALI must import here: a skip would pass without testing anything.
test-dali: $(DALI_STAMP)
	$(DALI_VENV)/bin/python -c "import nvidia.dali"
	$(DALI_VENV)/bin/python -m pytest tests/test_dali.py

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

# No generated code: the message classes are built at run time (mnist2db.formats.datum.message). This checks
# that they equal what protoc makes of proto/datum.proto (needs protoc: protobuf-compiler).
proto: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_proto.py

# Speed and memory against the naive converter, the backends' floors, Caffe's tools where
# built, and DALI where installed. BENCH_ARGS="--markdown bench.md" also writes the tables
# as Markdown. The bench extra adds scikit-image: its photographs are the photo set.
BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(DALI_VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# The main job: fetch a dataset (verified) and write both databases, as Caffe's
# get_mnist.sh + create_mnist.sh. make mnist DATASET=fashion-mnist BACKEND=leveldb MIRROR=URL
# (MIRROR: a URL or directory tried first; several separated by spaces; MNIST2DB_MIRROR works too).
DATASET ?= mnist
BACKEND ?= lmdb
MIRROR ?=

.PHONY: mnist
mnist: $(RUNTIME_STAMP)
	$(BIN)/mnist2db fetch --dataset $(DATASET) $(foreach m,$(MIRROR),--mirror $(m))
	$(BIN)/mnist2db create --dataset $(DATASET) --backend $(BACKEND) --overwrite

# The command reference, docs/cli.md, from every command's --help (tests/cli/test_cli_reference.py
# fails when it is stale).
.PHONY: docs
docs: $(RUNTIME_STAMP)
	$(BIN)/python scripts/cli_reference.py
