# koordbus developer entry points. `make up` runs the embedded default; `make test` runs every check CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

COMPOSE_SCHEMA := $(VENV)/compose-spec.json

.PHONY: venv up test lint typecheck unit bench clean compose-tokens crds

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

test: lint $(COMPOSE_SCHEMA)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Compose specification's JSON schema, for tests/deploy/test_compose.py (taken from the docker-compose wheel on
# PyPI; kept in the venv, never committed).
$(COMPOSE_SCHEMA): $(STAMP)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/downloads docker-compose==1.29.2
	$(BIN)/python -c "import glob, zipfile; w = glob.glob('$(VENV)/downloads/docker_compose-1.29.2-*.whl')[0]; \
	open('$@', 'wb').write(zipfile.ZipFile(w).read('compose/config/compose_spec.json'))"

# An admin token for the API of docker-compose.yml (deploy/compose/api-tokens, not committed).
compose-tokens: venv
	test -f deploy/compose/api-tokens || $(BIN)/python -c "import secrets; \
	print(secrets.token_urlsafe(32), 'admin', 'compose')" > deploy/compose/api-tokens
	chmod 644 deploy/compose/api-tokens  # read by the API container's unprivileged user

# The Helm chart's CRDs, generated from koordbus' schemas (tests/deploy/test_crds.py fails while they are stale).
crds: venv
	$(BIN)/koordbus crds --out deploy/helm/koordbus/crds

bench: venv
	$(BIN)/python bench/nodemetric_ingest.py $(ARGS)

clean:
	rm -rf $(VENV) .koordbus .pytest_cache .mypy_cache .ruff_cache
