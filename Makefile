# The two Quickstart commands: `make compare` (the main job) and `make test`.
# Both create .venv and install everything on first use (CPU torch 2.13.0 first; GPU users
# install CUDA torch the usual way before `pip install -e .`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

.PHONY: install compare test lint golden bench
install: $(BIN)/.installed

compare: $(BIN)/.installed
	$(BIN)/llmpack compare

test: $(BIN)/.installed
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .

golden: $(BIN)/.installed
	LLMPACK_REGEN_GOLDEN=1 $(BIN)/python -m pytest -q -k golden

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/import_time.py
	$(BIN)/python benchmarks/overhead.py
