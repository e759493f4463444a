# koordbus developer entry points. `make up` runs the embedded default; `make test` runs every check CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv up test lint typecheck unit bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

up: venv
	$(BIN)/koordbus up $(ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv
	$(BIN)/python bench/nodemetric_ingest.py $(ARGS)

clean:
	rm -rf $(VENV) .koordbus .pytest_cache .mypy_cache .ruff_cache
