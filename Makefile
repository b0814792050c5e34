# tierpilot: one entry point for a fresh machine (run as root, nothing installed).
#   make setup  - idempotent: Debian packages (Prometheus, promtool, PostgreSQL) and .venv
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

.PHONY: setup system demo test bench lint clean

setup: system $(STAMP)

# Debian packages the tests and demo start for real. Installed only when missing.
system:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
	   || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: prometheus postgresql"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus postgresql >/dev/null; \
	else echo ">> Debian packages present (prometheus, promtool, postgresql)"; fi

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
