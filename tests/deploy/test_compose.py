"""docker-compose.yml against the Compose specification's JSON schema (no Docker engine runs here), and what it
must hold: NATS with JetStream, PostgreSQL, the migration before the services, every service, one agent that only
plans, the API on localhost only, and the Kubernetes bridge only with the `cluster` profile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(os.environ.get("KOORDBUS_COMPOSE_SCHEMA", ROOT / ".venv" / "compose-spec.json"))
SERVICES = {"nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return document


def test_the_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    if not SCHEMA.exists():
        pytest.skip(f"SKIPPED LOUDLY: no Compose schema at {SCHEMA}; `make test` fetches it (make {SCHEMA})")
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_every_process_is_there_and_wired(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert SERVICES | {"nats", "postgres", "migrate", "agent"} <= set(services)
    assert "--jetstream" in services["nats"]["command"]
    for name in SERVICES:
        service = services[name]
        assert service["image"] == "koordbus:dev" and service["command"][0] in ("service", "api")
        assert service["environment"]["KOORDBUS_NATS_URL"] == "nats://nats:4222"
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["quota"]["environment"]["KOORDBUS_INSTANCE"] == "quota-0"
    assert services["k8s"]["profiles"] == ["cluster"]  # nothing written to a cluster unless asked for


def test_the_agent_only_plans_and_the_api_listens_on_localhost(compose: dict[str, Any]) -> None:
    agent = compose["services"]["agent"]
    assert agent["command"][:2] == ["agent", "--dry-run"]
    assert all(volume.endswith(":ro") for volume in agent["volumes"] if volume.startswith("/"))
    api = compose["services"]["api"]
    assert api["ports"] == ["127.0.0.1:8080:8080"]
    assert "--api-tokens-file" in api["command"] and "--no-auth" not in api["command"]


def test_the_image_holds_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = ["schemas", "bus", "services", "agent", "koordbus", "migrations"]
    assert all(f'"{p}*"' in pyproject for p in packages)
    assert all(f"COPY {p} ./{p}" in dockerfile for p in packages)
    assert 'ENTRYPOINT ["koordbus"]' in dockerfile
