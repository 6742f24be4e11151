# tqstore: `make test` and `make demo` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.tqstore-installed
BENCH_STAMP = $(VENV)/.tqstore-bench-installed
VENV_TQ ?= .venv-tq
TQ_STAMP = $(VENV_TQ)/.tqstore-tq-installed

.PHONY: install test test-pure test-ray demo crash-test bench bench-quick bench-tq clean

# torch first, pinned to the CPU wheel on this machine (any other version pulls CUDA),
# then the package with its dev extras (builds the C extension in place).
$(STAMP): setup.py pyproject.toml tqstore/_native/_frames.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q
	TQSTORE_PURE=1 $(PY) -m pytest -q tests/test_frame.py tests/test_unit.py tests/test_store.py tests/test_segment_merge.py

# every Ray test: the port conformance suites against actors (also in `make test`), whole
# stores over actors and stores served to the cluster by tq.init({"backend": "ray"}) (slow: an
# actor per part)
test-ray: $(STAMP)
	$(PY) -m pytest -q -m ray tests/

demo: $(STAMP)
	$(PY) -m tqstore demo

crash-test: $(STAMP)
	$(PY) -m pytest -q -m "crash or slow" tests/
	$(PY) tests/crash/run_matrix.py

# the bench extra (matplotlib for the charts, tqdm)
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# every bench/bench_*.py; figures to bench/results/ (NAME.json, NAME.txt), then bench/report.py
# writes bench/results/results.md and the PNG charts
bench-quick: $(BENCH_STAMP)
	$(PY) bench/run_all.py --quick

bench: $(BENCH_STAMP)
	$(PY) bench/run_all.py

# tqstore beside TransferQueue 0.1.11 (bench/tq_side_by_side.py) in a virtualenv of its own, so
# that .venv, where the tests run, never holds TransferQueue and what it pulls in (ray[default],
# pyzmq, hydra-core, ...); TQ_BENCH_ARGS=--quick for a short run
$(TQ_STAMP): setup.py pyproject.toml tqstore/_native/_frames.c
	test -x $(VENV_TQ)/bin/python || $(PYTHON) -m venv $(VENV_TQ)
	$(VENV_TQ)/bin/pip install -q --upgrade pip setuptools wheel
	$(VENV_TQ)/bin/pip install -q torch==2.13.0
	$(VENV_TQ)/bin/pip install -q transferqueue==0.1.11
	$(VENV_TQ)/bin/pip install -q -e .
	touch $(TQ_STAMP)

bench-tq: $(TQ_STAMP)
	$(VENV_TQ)/bin/python bench/tq_side_by_side.py $(TQ_BENCH_ARGS)

clean:
	rm -rf build *.egg-info tqstore/_native/*.so .pytest_cache .hypothesis
