"""The migration REST routes end to end: API → KOORD_MIGRATION on a real nats-server → the arbiter service →
projections in SQLite and PostgreSQL → list (filters), one job with its decision trail, abort; roles and bad input."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import cli, http_serve
from schemas.cluster import PodObserved, WorkloadObserved
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.migration import component as migration_component
from services.migration.client import MigrationClient
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from services.migration.store import MigrationStore
from tests.support import api_auth
from tests.support.migration import pod
from tests.support.waiting import eventually

POD_YAML = """\
apiVersion: scheduling.koordinator.sh/v1alpha1
kind: PodMigrationJob
metadata:
  name: move-web-1
spec:
  mode: EvictDirectly
  podRef: {namespace: default, name: web-1}
"""


@pytest_asyncio.fixture
async def app(tmp_path: Path, migrated_engine: AsyncEngine) -> AsyncIterator[FastAPI]:
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
    await server.start()
    bus = await JetStreamBus.connect(server.url, name="migration-api")
    await bus.ensure_streams(streams.all_streams())
    workload = WorkloadObserved(
        namespace="default", name="web", observed_at=1.0, kind="ReplicaSet", uid="rs-1", replicas=10
    )
    await bus.publish(subjects.cluster_workload("default", "web"), msgspec.json.encode(workload), msg_id="rs")
    for index in range(10):
        p = pod(f"web-{index}", node=f"n{index % 2}")
        seen = PodObserved(namespace="default", name=p.metadata.name, observed_at=1.0, pod=p)
        await bus.publish(
            subjects.cluster_pod("default", p.metadata.name), msgspec.json.encode(seen), msg_id=f"p{index}"
        )
    store = MigrationStore(migrated_engine)
    service = MigrationService(bus, MigrationSettings(startup_timeout_seconds=10), registry=new_registry(), store=store)
    await service.start()
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(migration_component.routes_over(store, MigrationClient(bus)),),
    )
    try:
        yield create_app(context)
    finally:
        await service.stop()
        await bus.close()
        await server.stop()


@pytest_asyncio.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=api_auth.headers(auth.ADMIN), timeout=30
    ) as client:
        yield client


def until(api: httpx.AsyncClient, path: str, check: Callable[[Any], bool]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        answer = await api.get(path)
        return answer.status_code == 200 and check(answer.json())

    return probe


async def test_request_arbitrate_list_trail_and_abort(api: httpx.AsyncClient) -> None:
    short = await api.post("/api/v1/migrations", json={"pod": {"namespace": "default", "name": "web-0"}})
    assert short.status_code == 202, short.text
    first = short.json()["name"]
    uuid.UUID(first)  # a generated name
    yaml_body = await api.post("/api/v1/migrations", content=POD_YAML, headers={"Content-Type": "application/yaml"})
    assert yaml_body.status_code == 202 and yaml_body.json()["name"] == "move-web-1"
    again = await api.post("/api/v1/migrations", content=POD_YAML, headers={"Content-Type": "application/yaml"})
    assert again.status_code == 409
    duplicate_pod = await api.post(
        "/api/v1/migrations", json={"name": "dup", "pod": {"namespace": "default", "name": "web-0"}}
    )
    assert duplicate_pod.status_code == 202  # refused by the arbiter's intake, with the reason in the trail
    await eventually(until(api, "/api/v1/migrations/dup", lambda j: j["arbitration"] == "rejected"), timeout=15)
    dup = (await api.get("/api/v1/migrations/dup")).json()
    assert dup["phase"] == "Failed" and dup["reason"] == "ForbiddenMigratePod"
    assert "already has an active migration job" in dup["trail"][0]["message"]

    await eventually(until(api, f"/api/v1/migrations/{first}", lambda j: j["arbitration"] == "passed"), timeout=15)
    got = (await api.get(f"/api/v1/migrations/{first}")).json()
    assert got["node"] == "n0" and got["workload"] == "rs-1" and got["trail"][-1]["outcome"] == "passed"
    assert got["job"]["spec"]["podRef"] == {"namespace": "default", "name": "web-0"}
    listed = (await api.get("/api/v1/migrations", params={"node": "n0"})).json()["items"]
    assert {i["name"] for i in listed} == {first, "dup"}
    assert [i["name"] for i in (await api.get("/api/v1/migrations", params={"phase": "Failed"})).json()["items"]] == [
        "dup"
    ]
    assert (await api.get("/api/v1/migrations", params={"phase": "Done"})).status_code == 422

    aborted = await api.post("/api/v1/migrations/move-web-1/abort")
    assert aborted.status_code == 202
    await eventually(until(api, "/api/v1/migrations/move-web-1", lambda j: j["phase"] == "Aborted"), timeout=15)
    assert (await api.post("/api/v1/migrations/move-web-1/abort")).status_code == 409
    assert (await api.post("/api/v1/migrations/nope/abort")).status_code == 404


async def test_roles_and_bad_input(api: httpx.AsyncClient) -> None:
    viewer = api_auth.headers(auth.VIEWER)
    refused = await api.post("/api/v1/migrations", json={"pod": {"namespace": "d", "name": "p"}}, headers=viewer)
    assert refused.status_code == 403 and "role admin needed" in refused.json()["error"]
    assert (await api.get("/api/v1/migrations", headers=viewer)).status_code == 200
    cases = [
        (b"[1]", 400, "must be a PodMigrationJob"),
        (b"{not: [valid", 400, "not valid JSON or YAML"),
        (b'{"pod": {"name": "x"}}', 422, "pod must name the pod"),
        (b'{"kind": "Pod"}', 422, "expected PodMigrationJob"),
        (b'{"spec": {"podRef": {"name": "x"}}}', 422, "spec.podRef must name the pod"),
        (b'{"spec": {"mode": "Teleport", "podRef": {"namespace": "d", "name": "x"}}}', 422, "Teleport"),
        (b'{"spec": {"ttl": 5, "podRef": {"namespace": "d", "name": "x"}}}', 422, "$.spec.ttl"),
    ]
    for body, status, fragment in cases:
        answer = await api.post("/api/v1/migrations", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == status, (body, answer.text)
        assert fragment in answer.json()["error"], (body, answer.json())
    assert (await api.get("/api/v1/migrations/ghost")).status_code == 404


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_migration_cli(app: FastAPI, capsys: pytest.CaptureFixture[str]) -> None:
    async with contextlib.AsyncExitStack() as exits:
        port = free_port()
        await http_serve.serve_http(exits, app, host="127.0.0.1", port=port)
        base = f"http://127.0.0.1:{port}"

        async def koordbus(*args: str, role: str = auth.ADMIN) -> tuple[int, str, str]:
            argv = ["migration", "--api", base, "--token", api_auth.TOKENS[role], *args]
            code = await asyncio.to_thread(cli.main, argv)
            out, err = capsys.readouterr()
            return code, out, err

        code, out, _ = await koordbus("request", "default/web-3", "--name", "m1", "--mode", "EvictDirectly")
        assert code == 0 and out.strip() == "podmigrationjob/m1 requested (the arbiter decides within a round)"
        code, _, err = await koordbus("request", "web-3")
        assert code == 2 and "NAMESPACE/NAME" in err

        async def passed() -> bool:
            code, out, _ = await koordbus("get", "m1")
            return code == 0 and "arbitration passed" in out

        await eventually(passed, timeout=15)
        code, out, _ = await koordbus("get", "m1")
        assert out.splitlines()[1].split() == ["ROUND", "OUTCOME", "FILTER", "WHY"] and " passed " in out
        code, out, _ = await koordbus("list", "--node", "n1")
        assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "POD", "NODE"] and "m1" in out
        code, out, _ = await koordbus("list", "-o", "json")
        assert code == 0 and '"kind": "MigrationList"' in out
        code, _, err = await koordbus("abort", "m1", role=auth.VIEWER)
        assert code == 2 and "role admin needed" in err
        code, out, _ = await koordbus("abort", "m1")
        assert code == 0 and "abort requested" in out
        code, _, err = await koordbus("get", "ghost")
        assert code == 1 and "no migration job named 'ghost'" in err
