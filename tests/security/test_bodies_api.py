"""Hostile request bodies to the REST API (issue #19, bodies): every one is refused at the door with a 4xx naming
the problem, quickly and without holding more than the body limit, never a 500.

The app is the real one (services.api.app) over a real nats-server, the quota service and SQLite
(tests.support.quota_stack), called in process through httpx's ASGI transport, which hands the app the request
body chunk by chunk as a server would, so a test can count how much of a body the app pulled.
"""

from __future__ import annotations

import logging
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from services.api.app import MAX_BODY_BYTES
from services.common import auth, bodies, db
from tests.support import api_auth
from tests.support.quota_stack import QuotaStack, quota_stack

ROUTES = [
    ("POST", "/api/v1/quotas"),
    ("POST", "/api/v1/quotas/import"),
    ("PUT", "/api/v1/quotas/team-a"),
    ("PATCH", "/api/v1/quotas/team-a"),
    ("POST", "/api/v1/quotas/team-a/namespaces"),
    ("POST", "/api/v1/quota-profiles"),
    ("PUT", "/api/v1/quota-profiles/p"),
    ("POST", "/api/v1/quotas/check"),
    ("POST", "/api/v1/quotas/what-if"),
    ("POST", "/api/v1/migrations"),
    ("POST", "/api/v1/colocation-profiles"),
    ("PUT", "/api/v1/colocation-profiles/team-a"),
    ("PATCH", "/api/v1/colocation-profiles/team-a"),
]
"""Every route that reads a body."""


def alias_bomb(levels: int) -> str:
    """The "billion laughs" in YAML: each level is a list of ten aliases of the one before."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest_asyncio.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[QuotaStack]:
    tmp = tmp_path_factory.mktemp("bodies")
    url = f"sqlite:///{tmp / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    try:
        async with quota_stack(Path(tmp), engine) as running:
            yield running
    finally:
        await engine.dispose()


def client(stack: QuotaStack, role: str = auth.ADMIN) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=stack.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=api_auth.headers(role), timeout=30)


async def test_a_yaml_alias_bomb_is_refused_at_once_without_expanding(stack: QuotaStack) -> None:
    bomb = alias_bomb(8)  # ~450 bytes that expand to 10^8 strings (the old code: 4 s, 1.7 GB, then a 500)
    assert len(bomb) < 500
    yaml = {"Content-Type": "application/yaml"}
    async with client(stack, auth.VIEWER) as api:
        assert (await api.post("/api/v1/quotas/what-if", content="delete: []\n", headers=yaml)).status_code == 200
        started = time.monotonic()
        answer = await api.post("/api/v1/quotas/what-if", content=bomb, headers=yaml)
        elapsed = time.monotonic() - started
        tracemalloc.start()
        try:
            again = await api.post("/api/v1/quotas/what-if", content=bomb, headers=yaml)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert answer.status_code == 400, answer.text
    assert "aliases (*name) are not accepted" in answer.json()["error"]
    assert elapsed < 2.0
    assert again.status_code == 400
    assert peak < 20 * 1024 * 1024


async def test_a_stored_alias_bomb_is_refused_on_patch(stack: QuotaStack) -> None:
    patch = "spec:\n  min:\n    cpu: '1'\nmetadata:\n  annotations:\n    x: y\n" + alias_bomb(4)
    async with client(stack, auth.QUOTA_ADMIN) as api:
        answer = await api.patch("/api/v1/quotas/team-a", content=patch, headers={"Content-Type": "application/yaml"})
    assert answer.status_code == 400, answer.text
    assert "aliases" in answer.json()["error"]


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system ['true']", "!!binary aGVsbG8=", "!custom 1"])
async def test_yaml_tags_beyond_json_types_are_refused(stack: QuotaStack, tag: str) -> None:
    async with client(stack) as api:
        answer = await api.post(
            "/api/v1/quotas/what-if", content=f"delete: [{tag}]\n", headers={"Content-Type": "application/yaml"}
        )
    assert answer.status_code == 400, answer.text
    assert "not valid JSON or YAML" in answer.json()["error"]


@pytest.mark.parametrize("body", ["null: 1\n1: 2\n", "delete: []\npatch: {1.5: {}}\n"])
async def test_yaml_keys_that_are_not_strings_are_a_400(stack: QuotaStack, body: str) -> None:
    async with client(stack) as api:
        answer = await api.post("/api/v1/quotas/what-if", content=body, headers={"Content-Type": "application/yaml"})
    assert answer.status_code == 400, answer.text
    assert "a key that is not a string" in answer.json()["error"]


@pytest.mark.parametrize("depth", [100, 5_000, 100_000])
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_deep_nesting_is_a_400_on_every_body_route(stack: QuotaStack, method: str, path: str, depth: int) -> None:
    body = '{"metadata": {"name": "x"}, "spec": ' + "[" * depth + "]" * depth + "}"
    async with client(stack) as api:
        answer = await api.request(method, path, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert f"nested more than {bodies.MAX_DEPTH} levels deep" in answer.json()["error"]
    if depth == 100:
        assert "at $.spec[0][0]" in answer.json()["error"]  # the JSON path where it gets too deep


@pytest.mark.parametrize("content_type", ["application/json", "application/yaml"])
async def test_deep_yaml_nesting_is_a_400(stack: QuotaStack, content_type: str) -> None:
    body = "delete: " + "[" * 5000 + "]" * 5000
    async with client(stack) as api:
        answer = await api.post("/api/v1/quotas/what-if", content=body, headers={"Content-Type": content_type})
    assert answer.status_code == 400, answer.text


@pytest.mark.parametrize("content_type", ["application/json", "application/yaml"])
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_invalid_utf8_is_a_400_on_every_body_route(
    stack: QuotaStack, method: str, path: str, content_type: str
) -> None:
    body = b'{"metadata": {"name": "caf\xe9\xff"}}'
    async with client(stack) as api:
        answer = await api.request(method, path, content=body, headers={"Content-Type": content_type})
    assert answer.status_code == 400, answer.text
    assert "not valid UTF-8" in answer.json()["error"]


class CountingBody:
    """A request body streamed in 64 KiB chunks that counts how much of it the server pulled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunk = b" " * 65536
        while self.pulled < self.total:
            self.pulled += len(chunk)
            yield chunk


@pytest.mark.parametrize(("method", "path"), [*ROUTES, ("GET", "/api/v1/quotas")])
async def test_a_declared_oversize_body_is_a_413_before_any_of_it_is_read(
    stack: QuotaStack, method: str, path: str
) -> None:
    body = CountingBody(50 * 1024 * 1024)
    async with client(stack) as api:
        answer = await api.request(
            method, path, content=body, headers={"Content-Length": str(body.total), "Content-Type": "application/json"}
        )
    assert answer.status_code == 413, answer.text
    assert f"the limit is {MAX_BODY_BYTES} bytes" in answer.json()["error"]
    assert body.pulled == 0


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_a_streamed_oversize_body_is_cut_off_at_the_limit(stack: QuotaStack, method: str, path: str) -> None:
    body = CountingBody(50 * 1024 * 1024)  # chunked: no Content-Length to refuse it by
    async with client(stack) as api:
        answer = await api.request(method, path, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413, answer.text
    assert f"larger than the limit of {MAX_BODY_BYTES} bytes" in answer.json()["error"]
    assert body.pulled <= MAX_BODY_BYTES + 65536


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_a_client_gone_before_its_body_arrived_is_not_an_error(
    stack: QuotaStack, method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that disconnects half-way through its body (seen in the soak: a PATCH cut by its timeout) raised
    starlette's ClientDisconnect out of the route, logged as an unhandled error with a traceback."""
    received: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"spec": {', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return received.pop(0) if received else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    authorization = api_auth.headers()["Authorization"].encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", authorization), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("api", 80),
    }
    with caplog.at_level(logging.INFO):
        await stack.app(scope, receive, send)  # raised ClientDisconnect before
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [400]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "went away before its request body arrived" in caplog.text


async def test_a_body_under_the_limit_that_cannot_fit_the_bus_is_a_413_not_a_500(stack: QuotaStack) -> None:
    # 704 KB of minimal pods: each becomes a whole Pod once encoded for the quota service, far over 1 MiB.
    document: dict[str, Any] = {"pods": [{"pod": {}}] * 72_000}
    async with client(stack, auth.VIEWER) as api:
        answer = await api.post("/api/v1/quotas/what-if", json=document)
    assert 700_000 < len(answer.request.content) < MAX_BODY_BYTES
    assert answer.status_code == 413, answer.text
    assert "too large for the bus once encoded" in answer.json()["error"]


@pytest.mark.parametrize(("resource", "text"), [("cpu", "1e400"), ("memory", "9999999999999999999Ei")])
async def test_a_quantity_past_int64_is_refused_naming_the_field_never_stored(
    stack: QuotaStack, resource: str, text: str
) -> None:
    quota = {
        "kind": "ElasticQuota",
        "metadata": {"name": f"huge-{resource}", "namespace": "teams"},
        "spec": {"min": {resource: "1"}, "max": {resource: text}},
    }
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [{"name": "c"}]}}
    pod["spec"]["containers"][0]["resources"] = {"requests": {resource: text}}  # type: ignore[index]
    async with client(stack) as api:
        created = await api.post("/api/v1/quotas", json=quota)
        checked = await api.post("/api/v1/quotas/check", json=pod)
        what_if = await api.post("/api/v1/quotas/what-if", json={"pods": [{"pod": pod}]})
    assert created.status_code == 422, created.text
    assert f"spec.max.{resource}" in created.text and f"quantity {text!r} is out of range" in created.text
    for answer, where in ((checked, "pod 0"), (what_if, "pods[0].pod")):
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert where in error and f"requests.{resource}: quantity {text!r} is out of range" in error


async def test_the_openapi_document_declares_each_body_with_its_real_schema(stack: QuotaStack) -> None:
    async with client(stack) as api:
        document = (await api.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    declared = {
        (method, path): document["paths"][path.replace("team-a", "{name}").replace("/p", "/{name}")][method.lower()]
        for method, path in ROUTES
    }
    for (method, path), operation in declared.items():
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        if method != "PATCH":  # a merge patch is any object
            assert schema != {"type": "object"}, (method, path)
    quota_body = declared[("POST", "/api/v1/quotas")]["requestBody"]["content"]["application/json"]["schema"]
    assert quota_body == {"$ref": "#/components/schemas/ElasticQuota"}
    spec = schemas["ElasticQuotaSpec"]["properties"]
    assert set(spec) >= {"min", "max"} and "pattern" in str(spec["min"])  # quantities with Kubernetes' syntax
    assert {"Pod", "PodMigrationJob", "ElasticQuotaProfile", "ObjectMeta"} <= set(schemas)
    for code in ("400", "413"):
        assert code in declared[("POST", "/api/v1/quotas/what-if")]["responses"]
