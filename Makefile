# Two commands set everything up on a fresh machine:
#   make demo   - the main job (installs on first use)
#   make test   - the test suite (installs on first use)
#   make lint   - ruff (lint and format check) and mypy (installs on first use)
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and pinned, so nothing later pulls a different (multi-GB) build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# ruff's formatter owns every Python file (pyproject.toml's [tool.ruff]).

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
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .kernelarc .kernelarc-demo
