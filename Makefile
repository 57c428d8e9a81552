# The two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project into it first, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test bench lint install clean prometheus

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The telemetry tests run a real Prometheus (Debian's package: prometheus and promtool).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing Debian's prometheus package for the telemetry tests"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

demo: $(STAMP)
	$(BIN)/gpu-placement demo

test: $(STAMP) prometheus
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/extender_bench.py
	$(BIN)/python benchmarks/webhook_bench.py
	$(BIN)/python benchmarks/cache_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
