"""docker-compose.yml against the Compose specification's JSON schema (no Docker engine runs here), and what it
must hold: NATS with JetStream, PostgreSQL, the migration before the services, every service, one agent that only
plans, the API on localhost only, and the Kubernetes bridge only with the `cluster` profile. NATS is not anonymous:
every process connects as its own user from the files `make compose-creds` writes, and the committed server
configuration, run by a real nats-server with those files, refuses an anonymous client, lets each service in, and
holds the agent to its own node's subjects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bus import auth, streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import find_binary
from koordbus import cli, natsauth

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(os.environ.get("KOORDBUS_COMPOSE_SCHEMA", ROOT / ".venv" / "compose-spec.json"))
SERVICES = {"nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api"}
NATS_CREDS = "/etc/koordbus/nats/creds.json"
NODE = "compose-node"


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
    assert "jetstream {" in (ROOT / "deploy" / "compose" / "nats.conf").read_text()  # services["nats"]'s config
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


def test_nats_lets_in_only_its_users_and_each_process_has_its_own(compose: dict[str, Any]) -> None:
    services = compose["services"]
    nats = services["nats"]
    assert nats["command"] == ["--config", "/etc/nats/nats.conf"]
    assert {
        "./deploy/compose/nats.conf:/etc/nats/nats.conf:ro",
        "./deploy/compose/nats/auth.conf:/etc/nats/auth.conf:ro",
    } <= set(nats["volumes"])
    config = (ROOT / "deploy" / "compose" / "nats.conf").read_text()
    assert 'include "auth.conf"' in config and "jetstream" in config
    assert "no_auth_user" not in config and "authorization" not in config  # the users come from auth.conf only
    assert set(natsauth.COMPOSE_SERVICE_USERS) == SERVICES
    mounted = {}
    for name in (*SERVICES, "agent"):
        service = services[name]
        assert service["environment"]["KOORDBUS_NATS_CREDS"] == NATS_CREDS, name
        (source,) = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == NATS_CREDS]
        assert f"{source}:{NATS_CREDS}:ro" in service["volumes"]
        mounted[name] = source
    expected = {n: f"./deploy/compose/nats/{auth.compose_creds_file(n)}" for n in SERVICES}
    assert mounted == expected | {"agent": f"./deploy/compose/nats/{auth.compose_creds_file(auth.COMPOSE_AGENT)}"}
    assert f"${{KOORDBUS_NODE_NAME:-{NODE}}}" in services["agent"]["command"]  # the node `make compose-creds` names


@pytest.fixture
def compose_nats(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The committed nats.conf run by a real nats-server next to the auth.conf `koordbus creds ensure-compose`
    writes (its ports, address and store moved to this test's): (URL, the identities' directory)."""
    assert cli.main(["creds", "ensure-compose", str(tmp_path), "--node", NODE]) == 0
    where = tmp_path / natsauth.COMPOSE_NATS_DIR
    committed = (ROOT / "deploy" / "compose" / "nats.conf").read_text()
    assert "store_dir: /data\n" in committed
    (where / "nats.conf").write_text(committed.replace("store_dir: /data", f"store_dir: {json.dumps(str(tmp_path))}"))
    port = free_port()
    command = [str(find_binary()), "-c", str(where / "nats.conf"), "-p", str(port), "-m", str(free_port()),
               "-a", "127.0.0.1", "-l", str(tmp_path / "nats.log")]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert server.poll() is None and time.monotonic() < deadline, f"nats-server did not start: {command}"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}", where
    finally:
        server.terminate()
        server.wait(timeout=10)


async def test_the_compose_nats_refuses_strangers_and_holds_the_agent_to_its_node(
    compose_nats: tuple[str, Path],
) -> None:
    url, where = compose_nats
    assert await _reply(url, {}, "PING") == "-ERR 'Authorization Violation'"
    service = auth.read_creds((where / "nodemetric.creds.json").read_text(), source="nodemetric")
    bus = await JetStreamBus.connect(url, name="compose-service", user=service[0], password=service[1])
    try:
        await bus.ensure_streams(streams.all_streams())  # a service may do everything, streams included
    finally:
        await bus.close()
    agent_user, agent_password = auth.read_creds((where / "agent.creds.json").read_text(), source="agent")
    assert agent_user == auth.node_user_name(NODE)
    agent = await JetStreamBus.connect(url, name="compose-agent", user=agent_user, password=agent_password)
    try:
        ack = await agent.publish(subjects.node_metrics(NODE), b"{}", msg_id="compose-agent-1")  # its own node: stored
        assert ack.stream == streams.KOORD_NODE
    finally:
        await agent.close()
    other = subjects.node_metrics("another-node")
    refused = await _reply(url, {"user": agent_user, "pass": agent_password}, f"PUB {other} 2\r\n{{}}\r\nPING")
    assert refused.startswith(f"-ERR 'Permissions Violation for Publish to \"{other}\"'"), refused


async def _reply(url: str, credentials: dict[str, str], then: str) -> str:
    """nats-server's first answer after a client's CONNECT (with `credentials`) and `then`, in NATS's protocol."""
    host, port = url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        assert (await reader.readline()).startswith(b"INFO ")
        connect = json.dumps({"verbose": False, "pedantic": False, "protocol": 1, **credentials})
        writer.write(f"CONNECT {connect}\r\n{then}\r\n".encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), timeout=10)).decode().strip()
    finally:
        writer.close()
        await writer.wait_closed()


def test_compose_creds_keep_their_passwords_and_a_new_node_gets_a_new_agent(tmp_path: Path) -> None:
    assert cli.main(["creds", "ensure-compose", str(tmp_path)]) == 0
    where = tmp_path / natsauth.COMPOSE_NATS_DIR
    before = {p.name: p.read_text() for p in where.iterdir()}
    assert cli.main(["creds", "ensure-compose", str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in where.iterdir()} == before
    assert cli.main(["creds", "ensure-compose", str(tmp_path), "--node", "node-b"]) == 0
    after = {p.name: p.read_text() for p in where.iterdir()}
    assert {n for n in after if after[n] != before[n]} == {"agent.creds.json", "auth.conf"}
    assert auth.read_creds(after["agent.creds.json"], source="agent")[0] == auth.node_user_name("node-b")
    assert oct(where.stat().st_mode & 0o777) == "0o700"
    assert {oct(p.stat().st_mode & 0o777) for p in where.iterdir()} == {"0o644"}
    with pytest.raises(SystemExit, match="--node: invalid node 'Bad/Node'"):
        cli.main(["creds", "ensure-compose", str(tmp_path), "--node", "Bad/Node"])
