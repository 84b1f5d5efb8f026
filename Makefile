# HyperWatch: two commands on a fresh machine — `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit install sysdeps clean bench

# The package declares torch as a range; development and CI pin it through constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hyperwatch demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

sysdeps:
	bash scripts/system-deps.sh

test: sysdeps lint unit

bench: $(STAMP)
	$(BIN)/python bench/trainer_throughput.py
	$(BIN)/python bench/hooks_overhead.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/dashboard.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
