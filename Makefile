# The two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project into it first, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test fuzz bench lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpu-placement demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# The property-based hostile-input suite at length: FUZZ_EXAMPLES requests per POST endpoint, a fresh
# random seed each run, statuses printed. `make test` runs the same suite with 30 fixed examples.
FUZZ_EXAMPLES ?= 3000
fuzz: $(STAMP)
	GPU_PLACEMENT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -s tests/test_fuzz_http.py

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/extender_bench.py
	$(BIN)/python benchmarks/webhook_bench.py
	$(BIN)/python benchmarks/cache_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
