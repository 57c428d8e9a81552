# The two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project into it first, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# promtool checks the chart's alert rules and the dashboard's queries (tests/test_alerts.py,
# tests/test_dashboard.py). The one on PATH if there is one, else the binary out of Debian's
# `prometheus` package, unpacked into .venv/bin without installing the package (whose scripts
# would start a Prometheus server).
PROMTOOL_ON_PATH ?= $(shell command -v promtool 2>/dev/null)

.PHONY: demo test bench lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(BIN)/promtool: | $(BIN)/python
	@if [ -n "$(PROMTOOL_ON_PATH)" ]; then ln -sf "$(PROMTOOL_ON_PATH)" $@; else \
	  echo "promtool: unpacking it from the Debian package prometheus"; \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	  { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool $(CURDIR)/$@; fi
	@$@ --version | head -1

install: $(STAMP) $(BIN)/promtool

demo: $(STAMP)
	$(BIN)/gpu-placement demo

test: $(STAMP) $(BIN)/promtool
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
