# The two commands: `make demo` and `make test`. Each creates .venv when missing and installs the
# project into it first, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Prometheus and promtool: the telemetry tests run a real Prometheus (tests/prometheus.py); promtool
# checks the chart's alert rules and the dashboard's queries (tests/test_alerts.py,
# tests/test_dashboard.py). Those on PATH if there are, else the binaries out of Debian's
# `prometheus` package, unpacked into .venv/bin without installing the package (whose scripts
# would start a Prometheus server).
PROM_TOOLS := $(BIN)/prometheus $(BIN)/promtool
# Chromium: tests/test_survey_page.py renders the survey's HTML page in a real headless browser. The one on
# PATH if there is one, else Debian's package (as root, as CI runs): linked into .venv/bin either way.
CHROMIUM := $(BIN)/chromium

.PHONY: demo test test-quick fuzz e2e e2e-scale e2e-churn soak image image-test release bench lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(PROM_TOOLS): | $(BIN)/python
	@tool=$$(basename $@); found=$$(command -v $$tool 2>/dev/null); \
	if [ -n "$$found" ]; then ln -sf "$$found" $@; else \
	  echo "$$tool: unpacking it from the Debian package prometheus"; \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	  { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/$$tool $(CURDIR)/$@; fi
	@$@ --version 2>&1 | head -1

$(CHROMIUM): | $(BIN)/python
	@found=$$(command -v chromium 2>/dev/null); \
	if [ -z "$$found" ]; then \
	  echo "chromium: installing Debian's package for the survey page's browser test"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }; } && \
	  found=$$(command -v chromium); fi; \
	ln -sf "$$found" $@
	@$@ --version 2>/dev/null | head -1

install: $(STAMP) $(PROM_TOOLS) $(CHROMIUM)

demo: $(STAMP)
	$(BIN)/gpu-placement demo

test: $(STAMP) $(PROM_TOOLS) $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# For iterating: the same without the tests marked `slow` (pyproject.toml), which `make test` and CI run.
test-quick: $(STAMP) $(PROM_TOOLS) $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not slow"

# The property-based hostile-input suite at length: FUZZ_EXAMPLES requests per POST endpoint, a fresh
# random seed each run, statuses printed. `make test` runs the same suite with 30 fixed examples.
FUZZ_EXAMPLES ?= 3000
fuzz: $(STAMP)
	GPU_PLACEMENT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -s tests/test_fuzz_http.py

# A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, built once from
# Go modules into ~/.cache/gpu-placement, or taken from $$KUBEBUILDER_ASSETS) with the chart installed,
# its gpu-placement containers run from the image (built first), as a kubelet runs the chart's pod
# spec; E2E_IMAGE=0 runs them as processes from the checkout instead, to iterate quickly.
E2E_IMAGE ?= 1
export E2E_IMAGE
E2E_BUILD_IMAGE = if [ "$(E2E_IMAGE)" != 0 ]; then bash image/build.sh; fi
e2e: $(STAMP)
	bash tests/e2e/build_control_plane.sh
	@$(E2E_BUILD_IMAGE)
	$(BIN)/python -m pytest -q tests/e2e --ignore=tests/e2e/test_9_scale.py --ignore=tests/e2e/test_soak.py \
	  --ignore=tests/e2e/test_image_containers.py

# 1,000 nodes: what gpu-placement costs kube-scheduler and the API server, side by side with
# kube-scheduler's default configuration, the chart's without the extender, and a do-nothing webhook
# (tests/e2e/overhead.py), then 2,000 GPU pods through the whole path;
# prints the ratios and pods/s (about 10 minutes here).
e2e-scale: $(STAMP)
	bash tests/e2e/build_control_plane.sh
	@$(E2E_BUILD_IMAGE)
	$(BIN)/python -m pytest -q -s tests/e2e/test_9_scale.py

# A simulated GPU fleet under churn: KWOK (built once from Go modules into ~/.cache, like the control
# plane) plays the kubelets of 1,000 fake GPU nodes with Stages; the same seeded faults and GPU Jobs run
# with the stock kube-scheduler, then with gpu-placement; four lines at the end (docs/performance.md,
# "A simulated fleet under churn"). Exit status 1 when the gpu-placement run misses a goal.
e2e-churn: $(STAMP) $(PROM_TOOLS)
	bash tests/e2e/build_control_plane.sh
	bash tests/e2e/churn/build_kwok.sh
	@$(E2E_BUILD_IMAGE)
	$(BIN)/python -m tests.e2e.churn

# The image the chart deploys: gpu-placement:<version> from the Dockerfile (image/build.sh: docker, else
# podman from Debian; a Debian base made with mmdebstrap, once, when no registry answers).
image:
	bash image/build.sh

# The release's tools (cyclonedx-py for the SBOM), beside the test ones.
RELEASE_STAMP := $(VENV)/.installed-release
$(RELEASE_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,release]'
	touch $(RELEASE_STAMP)

# That image run as the chart's pod spec runs it: same answers as the source, TLS, SIGTERM, size, start;
# and a release made of it (tests/image/test_release.py).
image-test: $(RELEASE_STAMP)
	$(BIN)/python -m pytest -q -s tests/image
	bash tests/e2e/build_control_plane.sh
	E2E_IMAGE=1 $(BIN)/python -m pytest -q tests/e2e/test_image_containers.py

# What a team pushes to its own registries, from the image `make image` built, in dist/release/<version>/:
# the chart packaged (helm_python), the image as an OCI archive, its Python packages as a CycloneDX SBOM,
# SHA256SUMS (image/release.py; docs/deploy.md, Releases). SOURCE_URL=https://... names the repository
# the chart's runbook links point into (default: the git remote origin).
release: $(RELEASE_STAMP)
	$(BIN)/python image/release.py

# The service with a live view of the real control plane under a fixed request rate to the webhook and
# the extender for SOAK_S seconds, pods created and deleted all along: RSS, open files and p99 printed
# and bounded (tests/e2e/test_soak.py).
SOAK_S ?= 600
soak: $(STAMP)
	bash tests/e2e/build_control_plane.sh
	@$(E2E_BUILD_IMAGE)
	SOAK_S=$(SOAK_S) $(BIN)/python -m pytest -q -s tests/e2e/test_soak.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/extender_bench.py
	$(BIN)/python benchmarks/answer_sizes.py
	$(BIN)/python benchmarks/webhook_bench.py
	$(BIN)/python benchmarks/cache_bench.py
	$(BIN)/python benchmarks/node_writers_bench.py
	$(BIN)/python benchmarks/preempt_bench.py
	bash tests/e2e/build_control_plane.sh
	$(BIN)/python benchmarks/scheduler_bench.py

clean:
	rm -rf $(VENV) build *.egg-info
