"""The load-aware extender's bind verb end to end: kube-scheduler's ExtenderBindingArgs over HTTP, the placement
counted at once, the Binding created by the bridge's responder (request/reply on a real nats-server) in the fake
API server through kubernetes-asyncio, and the placement taken back when the binding fails or nobody answers."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from bus import subjects
from bus.jetstream import JetStreamBus
from schemas.cluster import NodeObserved
from services.common.metrics import new_registry
from services.k8s.binder import BindResponder, KubeBinder, RecordingBinder
from services.loadaware.http import create_app
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_loadaware_http import scheduler_pod
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, report

POD = "web-7d4b9c-x2x9z"
KEY = f"default/{POD}"
UID = f"uid-default-{POD}"
BINDING = {"PodName": POD, "PodNamespace": "default", "PodUID": UID, "Node": "cold"}
CANDIDATES = {"Pod": scheduler_pod(), "NodeNames": ["cold"]}


@pytest.fixture
async def service(koordbus_bus: JetStreamBus) -> AsyncIterator[LoadAwareService]:
    now = time.time()
    await publish_events(
        koordbus_bus,
        *(NodeObserved(name=n, observed_at=now, node=node(n)) for n in ("cold", "warm")),
        report("cold", at=now - 5, cpu=4000, memory=16 * GI),
        report("warm", at=now - 5, cpu=12000, memory=64 * GI),
    )
    settings = LoadAwareSettings(startup_timeout_seconds=5, bind_timeout_seconds=5)
    service = LoadAwareService(koordbus_bus, settings, registry=new_registry())
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def client(service: LoadAwareService) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(service, service._registry))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as http:
        yield http


@pytest.fixture
async def bridge(koordbus_nats_url: str, kube_client: ApiClient) -> AsyncIterator[CollectorRegistry]:
    """The bridge's bind responder on its own NATS connection, as `koordbus service k8s` runs it; its registry."""
    bus = await JetStreamBus.connect(koordbus_nats_url, name="k8s")
    registry = new_registry()
    responder = BindResponder(bus, KubeBinder(kube_client), registry=registry)
    await responder.start()
    yield registry
    await responder.stop()
    await bus.close()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def assigned(service: LoadAwareService, node_name: str = "cold") -> list[str]:
    entry = service.state.nodes.get(node_name)
    return sorted(entry.pods) if entry is not None else []


async def score(client: httpx.AsyncClient) -> int:
    return int((await client.post("/prioritize", json=CANDIDATES)).json()[0]["Score"])


async def test_bind_creates_the_binding_and_counts_the_pod_at_once(
    client: httpx.AsyncClient, service: LoadAwareService, kube_api: FakeKubeApi, bridge: CollectorRegistry
) -> None:
    kube_api.put("Pod", scheduler_pod())
    before = await score(client)
    assert (await client.post("/bind", json=BINDING)).json() == {"Error": ""}
    bound = kube_api.get("Pod", POD, "default")
    assert bound is not None and bound["spec"]["nodeName"] == "cold"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][-1].items()
    # counted before the watch could have published the bound pod: the next prioritize already sees it
    assert assigned(service) == [KEY]
    assert await score(client) < before
    assert sample(service._registry, "koordbus_loadaware_binds_total", outcome="bound") == 1
    assert sample(bridge, "koordbus_k8s_writes_total", object="binding", outcome="bound") == 1


async def test_a_pod_gone_from_the_api_is_not_bound_and_not_counted(
    client: httpx.AsyncClient, service: LoadAwareService, kube_api: FakeKubeApi, bridge: CollectorRegistry
) -> None:
    before = await score(client)  # carries the pod (the extender knows its requests); the API has no such pod
    error = (await client.post("/bind", json=BINDING)).json()["Error"]
    assert f"bind {KEY} to cold: HTTP 404" in error and "not found" in error
    assert assigned(service) == []
    assert await score(client) == before
    assert sample(service._registry, "koordbus_loadaware_binds_total", outcome="rejected") == 1
    assert sample(bridge, "koordbus_k8s_writes_total", object="binding", outcome="gone") == 1


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({"metadata": {"uid": "uid-of-a-new-pod"}}, "Precondition failed: UID in precondition: " + UID),
        ({"spec": {"nodeName": "warm"}}, 'already assigned to node "warm"'),
    ],
    ids=["recreated", "already-bound"],
)
async def test_a_conflict_is_the_error_and_the_placement_is_taken_back(
    client: httpx.AsyncClient,
    service: LoadAwareService,
    kube_api: FakeKubeApi,
    bridge: CollectorRegistry,
    stored: dict[str, Any],
    message: str,
) -> None:
    pod = scheduler_pod()
    for part, fields in stored.items():
        pod[part].update(fields)
    kube_api.put("Pod", pod)
    await score(client)
    error = (await client.post("/bind", json=BINDING)).json()["Error"]
    assert "HTTP 409" in error and message in error
    assert kube_api.get("Pod", POD, "default")["spec"].get("nodeName") == stored.get("spec", {}).get("nodeName")
    assert assigned(service) == []
    assert sample(bridge, "koordbus_k8s_writes_total", object="binding", outcome="conflict") == 1


async def test_a_pod_no_filter_request_carried_is_still_bound(
    client: httpx.AsyncClient, service: LoadAwareService, kube_api: FakeKubeApi, bridge: CollectorRegistry
) -> None:
    kube_api.put("Pod", scheduler_pod())
    assert (await client.post("/bind", json=BINDING)).json() == {"Error": ""}
    assert kube_api.get("Pod", POD, "default")["spec"]["nodeName"] == "cold"
    assert assigned(service) == []  # its requests are unknown: the watch counts it when it publishes the pod


async def test_without_a_cluster_the_binding_is_recorded_and_the_pod_counted(
    client: httpx.AsyncClient, service: LoadAwareService, koordbus_nats_url: str
) -> None:
    """`koordbus up` without a kubeconfig: the bridge's record-only binder answers, keeping the Binding it would
    have created for /api/v1/k8s/recorded-writes, so kube-scheduler's bind (or curl's) succeeds as in a cluster."""
    bus = await JetStreamBus.connect(koordbus_nats_url, name="k8s-record-only")
    registry = new_registry()
    binder = RecordingBinder(clock=lambda: 1234.5)
    responder = BindResponder(bus, binder, registry=registry)
    await responder.start()
    try:
        before = await score(client)
        assert (await client.post("/bind", json=BINDING)).json() == {"Error": ""}
        assert assigned(service) == [KEY] and await score(client) < before
        assert binder.export() == [
            {
                "at": 1234.5,
                "binding": {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": POD, "namespace": "default", "uid": UID},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "cold"},
                },
            }
        ]
        assert sample(registry, "koordbus_k8s_writes_total", object="binding", outcome="bound") == 1
    finally:
        await responder.stop()
        await bus.close()


async def test_without_an_answer_the_bind_fails_after_the_timeout_and_is_taken_back(
    client: httpx.AsyncClient, service: LoadAwareService, koordbus_nats_url: str
) -> None:
    service.settings = dataclasses.replace(service.settings, bind_timeout_seconds=0.5)
    before = await score(client)
    # nobody serves the subject: an error at once
    error = (await client.post("/bind", json=BINDING)).json()["Error"]
    assert "nobody serves this subject" in error and assigned(service) == []
    # a bridge that takes the request and never answers: the error after the timeout
    bus = await JetStreamBus.connect(koordbus_nats_url, name="stuck-k8s")
    release, taken = asyncio.Event(), asyncio.Event()

    async def stuck(data: bytes) -> bytes:
        taken.set()
        await release.wait()
        return b"{}"

    responder = await bus.serve(subjects.K8S_RPC_BIND, stuck, queue="k8s-bind")
    try:
        started = time.monotonic()
        bind = asyncio.create_task(client.post("/bind", json=BINDING))
        await asyncio.wait_for(taken.wait(), timeout=5)
        assert assigned(service) == [KEY]  # counted while the bridge works on it
        assert await score(client) < before
        error = (await bind).json()["Error"]
        assert 0.5 <= time.monotonic() - started < 3
        assert "no answer within 0.5 s" in error
        assert assigned(service) == [] and await score(client) == before
        assert sample(service._registry, "koordbus_loadaware_binds_total", outcome="unavailable") == 2
    finally:
        release.set()
        await responder.stop()
        await bus.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not ExtenderBindingArgs: JSON is malformed"),
        (b'{"PodName": "p", "PodNamespace": "default", "PodUID": "u"}', "missing required field `Node`"),
        (b"[]", "not ExtenderBindingArgs: Expected `object`"),
    ],
)
async def test_a_malformed_bind_is_a_400(
    client: httpx.AsyncClient, service: LoadAwareService, body: bytes, message: str
) -> None:
    response = await client.post("/bind", content=body)
    assert response.status_code == 400 and message in response.json()["error"]
    assert sample(service._registry, "koordbus_loadaware_requests_total", verb="bind", outcome="bad_request") == 1
