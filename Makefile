# tqstore: `make test` and `make demo` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
STAMP   = $(VENV)/.tqstore-installed

.PHONY: install test test-pure demo crash-test bench bench-quick clean

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
	TQSTORE_PURE=1 $(PY) -m pytest -q tests/test_frame.py tests/test_unit.py tests/test_store.py

demo: $(STAMP)
	$(PY) -m tqstore demo

crash-test: $(STAMP)
	$(PY) -m pytest -q -m "crash or slow" tests/
	$(PY) tests/crash/run_matrix.py

bench-quick: $(STAMP)
	$(PY) bench/bench_engine.py --quick
	$(PY) bench/bench_dataplane.py --quick
	$(PY) bench/bench_checkpoint.py --quick
	$(PY) bench/bench_dump.py --quick

bench: $(STAMP)
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_dataplane.py
	$(PY) bench/bench_checkpoint.py
	$(PY) bench/bench_dump.py

clean:
	rm -rf build *.egg-info tqstore/_native/*.so .pytest_cache .hypothesis
