"""The load-aware extender's HTTP routes answering the requests kube-scheduler sends (ExtenderArgs with NodeNames
or whole Nodes, ExtenderBindingArgs), with the state built from events on a real nats-server."""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgspec
import pytest

from bus.jetstream import JetStreamBus
from schemas import kube
from schemas.cluster import NodeObserved, PodObserved
from services.common.metrics import new_registry
from services.loadaware.http import create_app
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, node_json, pod_json, report
from tests.support.waiting import eventually


def scheduler_pod() -> dict[str, Any]:
    """A pod as kube-scheduler serializes it into ExtenderArgs: full metadata, spec and status."""
    body = pod_json("web-7d4b9c-x2x9z", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi")
    body["apiVersion"], body["kind"] = "v1", "Pod"
    body["metadata"].update(
        {
            "generateName": "web-7d4b9c-",
            "resourceVersion": "48213",
            "creationTimestamp": "2026-11-24T03:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d4b9c",
                    "uid": "rs-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1"}],
        }
    )
    body["spec"].update(
        {
            "schedulerName": "default-scheduler",
            "priority": 0,
            "restartPolicy": "Always",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "enableServiceLinks": True,
        }
    )
    body["spec"]["containers"][0].update({"image": "nginx:1.27", "ports": [{"containerPort": 80}]})
    body["status"] = {
        "phase": "Pending",
        "qosClass": "Guaranteed",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    return body


def full_node(name: str) -> dict[str, Any]:
    body = node_json(name)
    body["apiVersion"], body["kind"] = "v1", "Node"
    body["metadata"].update({"uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}})
    body["status"].update(
        {
            "capacity": {"cpu": "32", "memory": "131072Mi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.31.2"},
        }
    )
    return body


@pytest.fixture
async def service(koordbus_bus: JetStreamBus) -> Any:
    now = time.time()
    await publish_events(
        koordbus_bus,
        *(NodeObserved(name=n, observed_at=now, node=node(n)) for n in ("cold", "warm", "hot", "stale")),
        report("cold", at=now - 5, cpu=4000, memory=16 * GI),
        report("warm", at=now - 5, cpu=12000, memory=64 * GI),
        report("hot", at=now - 5, cpu=20000, memory=64 * GI),
        report("stale", at=now - 600, cpu=0, memory=0),
    )
    registry = new_registry()
    service = LoadAwareService(koordbus_bus, LoadAwareSettings(startup_timeout_seconds=5), registry=registry)
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def client(service: LoadAwareService) -> Any:
    transport = httpx.ASGITransport(app=create_app(service, service._registry))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as http:
        yield http


NAMES = ["cold", "warm", "hot", "stale", "ghost"]


async def test_filter_with_node_names(client: httpx.AsyncClient) -> None:
    response = await client.post("/filter", json={"Pod": scheduler_pod(), "NodeNames": NAMES})
    assert response.status_code == 200
    result = response.json()
    assert result["NodeNames"] == ["cold", "warm", "ghost"]  # ghost: unknown, passes
    assert result["FailedNodes"] == {
        "hot": "node(s) cpu usage exceed threshold",  # (20000 + 3400) / 32000 = 73% > 65
        "stale": "node(s) nodeMetric expired",
    }
    assert result["Error"] == ""


async def test_filter_with_whole_nodes_hands_them_back_untouched(client: httpx.AsyncClient) -> None:
    items = [full_node(n) for n in ("cold", "hot")]
    body = {"Pod": scheduler_pod(), "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": items}}
    result = (await client.post("/filter", json=body)).json()
    assert result["Nodes"]["items"] == [items[0]]
    assert list(result["FailedNodes"]) == ["hot"]


async def test_prioritize_ranks_by_free_share_on_the_extender_scale(client: httpx.AsyncClient) -> None:
    response = await client.post("/prioritize", json={"Pod": scheduler_pod(), "NodeNames": NAMES})
    scores = {entry["Host"]: entry["Score"] for entry in response.json()}
    # cold: cpu (32000-7400)*100//32000 = 76, memory (128-21.6)/128 = 83 → 79 → 8; warm: §6.6's example, 48 → 5;
    # hot: cpu 26, memory 45 → 35 → 4 (half up)
    assert scores == {"cold": 8, "warm": 5, "hot": 4, "stale": 0, "ghost": 0}


async def test_assume_counts_a_placement_before_the_watch_sees_it(client: httpx.AsyncClient) -> None:
    body = {"Pod": scheduler_pod(), "NodeNames": ["cold"]}
    before = (await client.post("/prioritize", json=body)).json()[0]["Score"]
    binding = {
        "PodName": "web-7d4b9c-x2x9z",
        "PodNamespace": "default",
        "PodUID": "uid-default-web-7d4b9c-x2x9z",
        "Node": "cold",
    }
    assert (await client.post("/assume", json=binding)).json() == {"Error": ""}
    after = (await client.post("/prioritize", json=body)).json()[0]["Score"]
    assert after < before
    unseen = {**binding, "PodUID": "nobody"}
    assert "was not seen by filter" in (await client.post("/assume", json=unseen)).json()["Error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not ExtenderArgs: JSON is malformed"),
        (b'{"NodeNames": ["a"]}', "not ExtenderArgs: Object missing required field `Pod`"),
        (b'{"Pod": {}}', "names no candidate nodes"),
        (
            msgspec.json.encode({"Pod": pod_json("p", cpu="lots"), "NodeNames": ["a"]}),
            "$.Pod.spec.containers[0].resources",
        ),
        (msgspec.json.encode({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}), "a node without metadata.name"),
    ],
)
async def test_malformed_requests_are_400_with_a_message(client: httpx.AsyncClient, body: bytes, message: str) -> None:
    for verb in ("/filter", "/prioritize"):
        response = await client.post(verb, content=body)
        assert response.status_code == 400
        assert message in response.json()["error"]


async def test_explain_and_metrics(client: httpx.AsyncClient) -> None:
    response = await client.post("/explain", json={"pod": scheduler_pod(), "node": "warm"})
    explained = response.json()
    assert explained["filter"]["passed"] and "cpu 48%" in explained["filter"]["detail"]
    assert explained["score"]["score"] == 48 and explained["score"]["extender_score"] == 5
    await client.post("/filter", content=b"[]")
    metrics = (await client.get("/metrics")).text
    assert 'koordbus_loadaware_requests_total{outcome="bad_request",verb="filter"} 1.0' in metrics
    assert (await client.get("/readyz")).json() == {"ready": True}


async def test_the_pod_watch_counts_a_placement_once_and_forgets_it_on_deletion(
    koordbus_bus: JetStreamBus, service: LoadAwareService
) -> None:
    def on_cold(uid: str, *, deleted: bool = False) -> PodObserved:
        pod = msgspec.convert(pod_json("db-0", cpu="8", memory="8Gi", node_name="cold"), kube.Pod)
        return PodObserved(
            namespace="default",
            name="db-0",
            uid=uid,
            observed_at=time.time(),
            node_name="cold",
            deleted=deleted,
            pod=None if deleted else pod,
        )

    def assigned() -> dict[str, int]:
        load = service.state.load_of("cold")
        return dict(load.node_delta) if load is not None else {}

    await publish_events(koordbus_bus, on_cold("uid-1"))
    await eventually(lambda: assigned().get("cpu") == 6800)
    # a StatefulSet pod recreated under its name replaces the old one instead of adding to it, even when the old
    # one's tombstone was never seen; the marker, published after it on the same stream, shows it was applied
    marker = msgspec.convert(pod_json("marker", cpu="1", node_name="warm"), kube.Pod)
    seen_marker = PodObserved(
        namespace="default", name="marker", uid="m", observed_at=time.time(), node_name="warm", pod=marker
    )
    await publish_events(koordbus_bus, on_cold("uid-2"), seen_marker)
    await eventually(lambda: "default/marker" in service.state.nodes["warm"].pods)
    assert assigned()["cpu"] == 6800
    await publish_events(koordbus_bus, on_cold("uid-2", deleted=True))
    await eventually(lambda: assigned() == {})
