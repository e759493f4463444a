"""Issue #19 point 5 over HTTP, with the state built from events on a real nats-server: a placement reported to
/assume that no pod watch confirms stops counting after the extender's TTL (LoadAwareSettings.assumed_ttl_seconds),
one the watch confirms keeps counting, and /assume and /bind to a node the extender does not know are refused in
kube-scheduler's ExtenderBindingResult shape (no Binding is asked for)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from bus.jetstream import JetStreamBus
from schemas.cluster import NodeObserved, PodObserved
from services.common.metrics import new_registry
from services.loadaware.http import create_app
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, pod, pod_json, report
from tests.support.waiting import eventually

TTL = 1.0


@pytest.fixture
async def service(koordbus_bus: JetStreamBus) -> Any:
    now = time.time()
    await publish_events(
        koordbus_bus,
        NodeObserved(name="cold", observed_at=now, node=node("cold")),
        report("cold", at=now - 5, cpu=4000, memory=16 * GI),
    )
    settings = LoadAwareSettings(startup_timeout_seconds=5, assumed_ttl_seconds=TTL, bind_timeout_seconds=1)
    service = LoadAwareService(koordbus_bus, settings, registry=new_registry())
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def client(service: LoadAwareService) -> Any:
    transport = httpx.ASGITransport(app=create_app(service, service._registry))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as http:
        yield http


def binding(name: str, node_name: str = "cold") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-default-{name}", "Node": node_name}


async def score(client: httpx.AsyncClient, name: str = "probe") -> int:
    body = {"Pod": pod_json(name, cpu="4", memory="8Gi"), "NodeNames": ["cold"]}
    return int((await client.post("/prioritize", json=body)).json()[0]["Score"])


async def test_an_unconfirmed_assumed_placement_expires_and_a_confirmed_one_stays(
    client: httpx.AsyncClient, service: LoadAwareService, koordbus_bus: JetStreamBus
) -> None:
    free = await score(client)
    for name in ("ghost-a", "ghost-b", "real"):
        await score(client, name)  # the extender learns the pod from a prioritize request, as from kube-scheduler
        assert (await client.post("/assume", json=binding(name))).json() == {"Error": ""}
    loaded = await score(client)
    assert loaded < free
    # the watch shows `real` on cold; the two placements nobody made are never confirmed
    bound = pod("real", cpu="4", memory="8Gi", node_name="cold")
    confirmed = PodObserved(
        namespace="default", name="real", uid="uid-default-real", observed_at=time.time(), node_name="cold", pod=bound
    )
    await publish_events(koordbus_bus, confirmed)
    started = time.monotonic()

    async def only_the_confirmed_one_counts() -> bool:
        await score(client)  # each verb forgets the placements past their TTL
        return set(service.state.nodes["cold"].pods) == {"default/real"}

    await eventually(only_the_confirmed_one_counts)
    assert time.monotonic() - started >= TTL / 2  # not forgotten at once: they counted until the TTL ran out
    explained = (await client.post("/explain", json={"pod": pod_json("probe", cpu="4"), "node": "cold"})).json()
    assert explained["assigned_pods"] == 1
    assert await score(client) > loaded


async def test_assume_and_bind_to_an_unknown_node_are_refused(
    client: httpx.AsyncClient, service: LoadAwareService
) -> None:
    await score(client, "web")
    for verb in ("/assume", "/bind"):
        response = await client.post(verb, json=binding("web", "nowhere"))
        assert response.status_code == 200 and response.json() == {"Error": "node nowhere is unknown"}, verb
    assert service.state.pod_node("default/web") is None and "nowhere" not in service.state.nodes
    metrics = (await client.get("/metrics")).text
    assert 'koordbus_loadaware_binds_total{outcome="refused"} 1.0' in metrics
