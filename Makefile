# tqstore: `make test` and `make demo` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.tqstore-installed
BENCH_STAMP = $(VENV)/.tqstore-bench-installed

.PHONY: install test test-pure test-ray demo crash-test bench bench-quick clean

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

clean:
	rm -rf build *.egg-info tqstore/_native/*.so .pytest_cache .hypothesis
