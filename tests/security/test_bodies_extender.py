"""Hostile request bodies to the load-aware extender (issue #19, bodies): quantities past Kubernetes' int64 and
invalid UTF-8 are a 400 naming the problem, a body over the limit a 413 before it is read, never a 500. The
extender's real app (services.loadaware.http) over the service with its state from a real nats-server."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from bus.jetstream import JetStreamBus
from schemas.cluster import NodeObserved
from services.common.metrics import new_registry
from services.loadaware.http import MAX_BODY_BYTES, create_app
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from tests.integration.test_loadaware_http import full_node, scheduler_pod
from tests.security.test_bodies_api import CountingBody
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, report

VERBS = ["/filter", "/prioritize"]


@pytest_asyncio.fixture
async def extender(koordbus_bus: JetStreamBus) -> AsyncIterator[httpx.AsyncClient]:
    now = time.time()
    await publish_events(
        koordbus_bus,
        NodeObserved(name="cold", observed_at=now, node=node("cold")),
        report("cold", at=now - 5, cpu=4000, memory=16 * GI),
    )
    registry = new_registry()
    service = LoadAwareService(koordbus_bus, LoadAwareSettings(startup_timeout_seconds=5), registry=registry)
    await service.start()
    try:
        transport = httpx.ASGITransport(app=create_app(service, registry), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://extender", timeout=30) as http:
            yield http
    finally:
        await service.stop()


def asking(cpu: Any, *, whole_nodes: bool = False) -> dict[str, Any]:
    pod = scheduler_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    if whole_nodes:
        return {"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": [full_node("cold")]}}
    return {"Pod": pod, "NodeNames": ["cold"]}


@pytest.mark.parametrize("whole_nodes", [False, True])
@pytest.mark.parametrize("cpu", ["1e400", "9999999999999999999Ei", "8Ei", "9223372036854775808"])
@pytest.mark.parametrize("verb", VERBS)
async def test_a_quantity_past_int64_is_a_400_naming_it(
    extender: httpx.AsyncClient, verb: str, cpu: str, whole_nodes: bool
) -> None:
    answer = await extender.post(verb, json=asking(cpu, whole_nodes=whole_nodes))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert f"cpu: quantity {cpu!r} is out of range" in error and "requests" in error


@pytest.mark.parametrize("verb", VERBS)
async def test_the_largest_quantity_kubernetes_holds_is_answered(extender: httpx.AsyncClient, verb: str) -> None:
    answer = await extender.post(verb, json=asking("9223372036854775807"))  # 1000x that in millicores
    assert answer.status_code == 200, answer.text
    if verb == "/filter":
        assert answer.json()["FailedNodes"] == {"cold": "node(s) cpu usage exceed threshold"}


@pytest.mark.parametrize("verb", [*VERBS, "/assume", "/bind", "/explain"])
async def test_invalid_utf8_is_a_400(extender: httpx.AsyncClient, verb: str) -> None:
    bad = b'"caf\xe9\xff"'
    if verb in ("/assume", "/bind"):
        body = b'{"PodName": ' + bad + b', "PodNamespace": "default", "PodUID": "u", "Node": "cold"}'
    elif verb == "/explain":
        body = b'{"pod": {"metadata": {"name": ' + bad + b'}}, "node": "cold"}'
    else:
        body = b'{"Pod": {"metadata": {"name": ' + bad + b'}}, "NodeNames": []}'
    answer = await extender.post(verb, content=body)
    assert answer.status_code == 400, answer.text
    assert "utf-8" in answer.json()["error"].lower()


@pytest.mark.parametrize("verb", [*VERBS, "/explain"])
async def test_deep_nesting_is_a_400(extender: httpx.AsyncClient, verb: str) -> None:
    deep_pod = '{"Pod": ' + '{"x": ' * 100_000 + "1" + "}" * 100_000 + "}"
    deep_extra = '{"Pod": ' + json.dumps(scheduler_pod()) + ', "NodeNames": [], "x": ' + "[" * 100_000 + "}"
    for body in (deep_pod, deep_extra):
        answer = await extender.post(verb, content=body.encode())
        assert answer.status_code == 400, answer.text


@pytest.mark.parametrize("verb", [*VERBS, "/assume", "/bind", "/explain"])
async def test_an_oversize_body_is_a_413_before_it_is_read(extender: httpx.AsyncClient, verb: str) -> None:
    declared = CountingBody(100 * 1024 * 1024)
    answer = await extender.post(verb, content=declared, headers={"Content-Length": str(declared.total)})
    assert answer.status_code == 413, answer.text
    assert f"the limit is {MAX_BODY_BYTES} bytes" in answer.json()["error"]
    assert declared.pulled == 0
    streamed = CountingBody(100 * 1024 * 1024)  # chunked: cut off at the limit
    answer = await extender.post(verb, content=streamed)
    assert answer.status_code == 413, answer.text
    assert streamed.pulled <= MAX_BODY_BYTES + 65536
