# Two commands set everything up on a fresh machine:
#   make demo   - the main job (installs on first use)
#   make test   - the test suite (installs on first use)
#   make lint   - ruff (lint, and format on the paths below) and mypy (installs on first use)
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and pinned, so nothing later pulls a different (multi-GB) build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The files ruff's formatter owns so far: the modules this layout change wrote. guard/ and the
# older modules (moved ones included, so that git still follows their history) are formatted
# later, each in one mechanical commit of its own, and added here then.
FORMATTED := kernelarc_mcp/cli.py kernelarc_mcp/common.py kernelarc_mcp/__main__.py \
	kernelarc_mcp/commands/__init__.py kernelarc_mcp/commands/problems.py kernelarc_mcp/commands/judge.py \
	kernelarc_mcp/commands/serve.py kernelarc_mcp/commands/memory.py kernelarc_mcp/commands/swarm.py \
	kernelarc_mcp/serving/__init__.py kernelarc_mcp/serving/sockets.py kernelarc_mcp/serving/app.py \
	kernelarc_mcp/serving/http.py playbooks/__init__.py launcher/__init__.py benchmarks/harness.py \
	tests/helpers.py tests/test_layers.py guard/archive/servers.py tests/serving/test_server_stops.py

.PHONY: demo test lint format install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kernelarc demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check $(FORMATTED)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format $(FORMATTED)

clean:
	rm -rf $(VENV) .kernelarc .kernelarc-demo
