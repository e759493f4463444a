# koordbus developer entry points. `make up` runs the embedded default; `make test` runs every check CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

COMPOSE_SCHEMA := $(VENV)/compose-spec.json

.PHONY: venv up test test-repeat lint typecheck unit bench clean compose-tokens compose-creds crds screenshots

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

# The suites that start real servers and processes, N times in a row (default 10), stopping at the first failure
# and never retrying: a flaky test fails here. REPEAT_SUITES narrows it (`make test-repeat N=3 REPEAT_SUITES=tests/faults`).
N ?= 10
REPEAT_SUITES ?= tests/integration tests/e2e tests/faults

test-repeat: venv
	@began=$$(date +%s); \
	for run in $$(seq 1 $(N)); do \
		echo "test-repeat: run $$run of $(N) ($(REPEAT_SUITES)) at $$(date -u +%H:%M:%S) UTC on $$(git rev-parse --short HEAD 2>/dev/null)"; \
		start=$$(date +%s); \
		$(BIN)/python -m pytest -x -q $(REPEAT_SUITES) $(PYTEST_ARGS) \
			|| { echo "test-repeat: run $$run of $(N) failed after $$(( $$(date +%s) - start )) s"; exit 1; }; \
		echo "test-repeat: run $$run of $(N) passed in $$(( $$(date +%s) - start )) s"; \
	done; \
	echo "test-repeat: $(N) runs passed in $$(( $$(date +%s) - began )) s"

# The Compose specification's JSON schema, for tests/deploy/test_compose.py (taken from the docker-compose wheel on
# PyPI; kept in the venv, never committed).
$(COMPOSE_SCHEMA): $(STAMP)
	$(BIN)/python -m pip download --quiet --no-deps --dest $(VENV)/downloads docker-compose==1.29.2
	$(BIN)/python -c "import glob, zipfile; w = glob.glob('$(VENV)/downloads/docker_compose-1.29.2-*.whl')[0]; \
	open('$@', 'wb').write(zipfile.ZipFile(w).read('compose/config/compose_spec.json'))"

# The NATS identities of docker-compose.yml (deploy/compose/nats/, not committed): a user per service and for the
# agent's node (KOORDBUS_NODE_NAME, default compose-node), and the server's users in auth.conf; kept across runs.
compose-creds: venv
	$(BIN)/koordbus creds ensure-compose deploy/compose --node "$${KOORDBUS_NODE_NAME:-compose-node}"

# An admin token for the API of docker-compose.yml (deploy/compose/api-tokens, not committed).
compose-tokens: venv
	test -f deploy/compose/api-tokens || $(BIN)/python -c "import secrets; \
	print(secrets.token_urlsafe(32), 'admin', 'compose')" > deploy/compose/api-tokens
	chmod 644 deploy/compose/api-tokens  # read by the API container's unprivileged user

# The Helm chart's CRDs, generated from koordbus' schemas (tests/deploy/test_crds.py fails while they are stale).
crds: venv
	$(BIN)/koordbus crds --out deploy/helm/koordbus/crds

# The README's screenshots of every dashboard page under the simulated cluster (docs/screenshots/sim-*.png), taken by
# the browser tests that check each page (Chromium, `koordbus up --simulate-nodes 20`); never edited by hand.
screenshots: venv
	KOORDBUS_SCREENSHOTS_DIR=docs/screenshots $(BIN)/python -m pytest -q tests/browser/test_simulated_cluster.py

bench: venv
	$(BIN)/python bench/nodemetric_ingest.py $(ARGS)

clean:
	rm -rf $(VENV) .koordbus .pytest_cache .mypy_cache .ruff_cache
