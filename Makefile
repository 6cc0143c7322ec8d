# make setup | test | demo | bench | lint   (idempotent: re-running is fast once set up)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jigsaw-installed
NATIVE := $(wildcard native/*.pyx native/*.pxd)

.PHONY: setup test demo bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py $(NATIVE)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,models]'
	$(PY) -c "import jigsaw._core" 2>/dev/null || $(PY) setup.py -q build_ext --inplace
	$(PY) -c "import jigsaw._core"
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check src tests bench profiles

# pytest-xdist workers: the suite is mostly CPU-bound; one worker more than the CI's 2 cores covers
# the waits on servers, sockets and sleeps;
# the second pass serves the ring/batching/dispatch paths again on the pure-Python fallbacks
# (tests/conftest.py's --fallback-pass drops what would repeat the first pass); tests marked serial
# (a daemon start removes every dead daemon's leftovers host-wide; a latency SLO measured on the
# emulated node) run alone at the end
TEST_WORKERS ?= 3
PYTEST := $(VENV)/bin/pytest -q -p no:cacheprovider
PARALLEL := $(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not serial"

test: setup lint
	$(PARALLEL)
	JIGSAW_NO_EXTENSIONS=1 $(PARALLEL) --fallback-pass tests/runtime tests/dataplane
	$(PYTEST) -m serial

demo: setup
	$(PY) -m jigsaw.demo

bench: setup
	$(PY) bench/planner_speed.py
	$(PY) bench/capacity.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/jigsaw/*.so native/*.c
