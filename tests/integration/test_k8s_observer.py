"""services.k8s observing half against the fake API server (tests/fakes/kube_api.py) and a real nats-server.

What is checked is what a reader of KOORD_CLUSTER sees: the last message on each object's subject, and how many
messages the stream holds (one per subject).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas import cluster, kube
from services.common.metrics import new_registry, render
from services.k8s.client import KubeConfigError, api_client
from services.k8s.observer import (
    ADMISSION_KINDS,
    KIND_CONFIGMAP,
    KIND_NODE,
    KIND_POD,
    KIND_PRIORITY_CLASS,
    KIND_PROFILE,
    KIND_TOPOLOGY,
    ClusterObserver,
)
from services.k8s.settings import K8sSettings
from tests.fakes.kube_api import FakeKubeApi

SETTINGS = K8sSettings(watch_timeout_seconds=30, backoff_initial_seconds=0.05, backoff_max_seconds=0.5)
CM_NAMESPACE, CM_NAME = SETTINGS.configmap_namespace, SETTINGS.configmap_name


def node(name: str, *, cpu: str = "8", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"capacity": {"cpu": cpu, "memory": "32Gi"}, "allocatable": {"cpu": cpu, "memory": "30Gi"}},
    }


def pod(namespace: str, name: str, *, node_name: str, cpu: str = "500m") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }


def configmap(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "data": data}


async def last_event(bus: JetStreamBus, subject: str) -> cluster.ClusterEvent | None:
    delivery = await bus.last_on_subject(streams.KOORD_CLUSTER, subject)
    return None if delivery is None else cluster.CLUSTER_EVENT_DECODER.decode(delivery.data)


async def eventually(check: Callable[[], Any], *, timeout: float = 10.0) -> None:
    """Wait until the async `check` returns truthy."""
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)


async def node_event(bus: JetStreamBus, name: str) -> cluster.NodeObserved | None:
    event = await last_event(bus, subjects.cluster_node(name))
    assert event is None or isinstance(event, cluster.NodeObserved)
    return event


async def pod_event(bus: JetStreamBus, namespace: str, name: str) -> cluster.PodObserved | None:
    event = await last_event(bus, subjects.cluster_pod(namespace, name))
    assert event is None or isinstance(event, cluster.PodObserved)
    return event


async def configmap_event(bus: JetStreamBus, namespace: str, name: str) -> cluster.ConfigMapObserved | None:
    event = await last_event(bus, subjects.cluster_configmap(namespace, name))
    assert event is None or isinstance(event, cluster.ConfigMapObserved)
    return event


async def all_watching(kube_api: FakeKubeApi, observer: ClusterObserver) -> None:
    """Wait until every reflector has listed and its watch is open on the server. The observer is ready once the
    required kinds have listed; an optional kind whose first list comes after a test dropped the watches or expired
    the history would neither resume nor relist, and the test would wait for it in vain."""

    async def watching() -> bool:
        listed = all(reflector.listed.is_set() for reflector in observer.reflectors.values())
        return listed and len(kube_api._watches) >= len(observer.reflectors)

    await eventually(watching)


async def stream_count(bus: JetStreamBus) -> int:
    count, _ = await bus.stream_info(streams.KOORD_CLUSTER)
    return count


def stored(kube_api: FakeKubeApi, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = kube_api.get(kind, name, namespace)
    assert found is not None
    return found


def seed(kube_api: FakeKubeApi) -> None:
    kube_api.put("nodes", node("node-a"))
    kube_api.put("nodes", node("node-b.example"))
    kube_api.put("pods", pod("team-1", "web-0", node_name="node-a"))
    kube_api.put("pods", pod("team-2", "batch-0", node_name="node-b.example"))
    kube_api.put("configmaps", configmap(CM_NAMESPACE, CM_NAME, {"colocation-config": '{"enable": true}'}))
    kube_api.put("configmaps", configmap(CM_NAMESPACE, "other-config", {"x": "1"}))
    kube_api.put("configmaps", configmap("default", CM_NAME, {"x": "2"}))


@pytest_asyncio.fixture
async def start_observer(
    koordbus_bus: JetStreamBus, kube_client: ApiClient, kube_api: FakeKubeApi
) -> AsyncIterator[Callable[[], Any]]:
    started: list[ClusterObserver] = []

    async def start() -> ClusterObserver:
        observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
        await observer.start()
        started.append(observer)
        async with asyncio.timeout(10):
            await observer.ready.wait()
        await all_watching(kube_api, observer)
        return observer

    yield start
    for observer in started:
        await observer.stop()


async def test_initial_list_publishes_one_event_per_object(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    observer: ClusterObserver = await start_observer()

    assert await stream_count(koordbus_bus) == 5  # 2 nodes, 2 pods, the one ConfigMap
    node_b = await node_event(koordbus_bus, "node-b.example")
    assert node_b is not None and node_b.node is not None and not node_b.deleted
    assert kube.node_allocatable(node_b.node)["cpu"] == 8000
    assert node_b.resource_version == stored(kube_api, "nodes", "node-b.example")["metadata"]["resourceVersion"]
    web = await pod_event(koordbus_bus, "team-1", "web-0")
    assert web is not None and web.pod is not None
    assert (web.node_name, web.uid) == ("node-a", stored(kube_api, "pods", "web-0", "team-1")["metadata"]["uid"])
    assert kube.pod_request(web.pod)["cpu"] == 500
    config = await configmap_event(koordbus_bus, CM_NAMESPACE, CM_NAME)
    assert config is not None and config.data == {"colocation-config": '{"enable": true}'}
    assert {k: v for k, v in observer.stats.observed.items() if v} == {KIND_NODE: 2, KIND_POD: 2, KIND_CONFIGMAP: 1}
    assert observer.registry is not None
    text = render(observer.registry).decode()
    assert 'koordbus_k8s_objects_observed_total{kind="pod"} 2.0' in text
    assert "koordbus_k8s_ready 1.0" in text


async def test_updates_and_deletes_arrive(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    await start_observer()

    updated = kube_api.put("nodes", node("node-a", cpu="16"))
    kube_api.remove("pods", "web-0", "team-1")
    kube_api.put("pods", pod("team-1", "web-1", node_name="node-b.example"))

    async def applied() -> bool:
        event = await node_event(koordbus_bus, "node-a")
        tombstone = await pod_event(koordbus_bus, "team-1", "web-0")
        added = await pod_event(koordbus_bus, "team-1", "web-1")
        return bool(
            event
            and event.resource_version == updated["metadata"]["resourceVersion"]
            and tombstone
            and tombstone.deleted
            and added
        )

    await eventually(applied)
    event = await node_event(koordbus_bus, "node-a")
    assert event is not None and event.node is not None and kube.node_capacity(event.node)["cpu"] == 16000
    tombstone = await pod_event(koordbus_bus, "team-1", "web-0")
    assert tombstone is not None and tombstone.pod is None and tombstone.node_name == "node-a" and tombstone.uid
    assert await stream_count(koordbus_bus) == 6


@pytest.mark.parametrize("abrupt", [False, True])
async def test_dropped_watches_resume_without_losing_or_duplicating(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any], abrupt: bool
) -> None:
    seed(kube_api)
    observer: ClusterObserver = await start_observer()

    # Drop only once both watches are open: a drop before a reflector connects restarts nothing.
    async def watching() -> bool:
        return kube_api.open_watches("nodes") >= 1 and kube_api.open_watches("pods") >= 1

    await eventually(watching)

    kube_api.drop_watches(abrupt=abrupt)
    # Made before the reflectors reconnect: they must come from the resumed watch (history), not a relist.
    kube_api.put("nodes", node("node-a", cpu="4"))
    kube_api.remove("pods", "batch-0", "team-2")
    last = kube_api.put("nodes", node("node-a", cpu="6"))

    async def resumed() -> bool:
        event = await node_event(koordbus_bus, "node-a")
        return bool(event and event.resource_version == last["metadata"]["resourceVersion"])

    await eventually(resumed)
    await eventually(lambda: observer.wait_published(0.1))
    kube_api.put("nodes", node("node-c"))  # the resumed watch keeps flowing
    await eventually(lambda: node_event(koordbus_bus, "node-c"))
    assert observer.stats.observed[KIND_NODE] == 2 + 2 + 1
    assert observer.stats.observed[KIND_POD] == 2 + 1
    assert observer.reflectors[KIND_NODE].stats.relists == 0
    assert observer.reflectors[KIND_NODE].stats.watch_restarts >= 1
    tombstone = await pod_event(koordbus_bus, "team-2", "batch-0")
    assert tombstone is not None and tombstone.deleted and tombstone.node_name == "node-b.example"


@pytest.mark.parametrize("late_kind", ["", "/apis/apps/v1/replicasets"])
async def test_expired_history_relists_with_tombstones(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any], late_kind: str
) -> None:
    """`late_kind`: an optional kind whose list and watch answer late, after the observer is ready (which waits
    for the required kinds only), as a loaded machine made happen."""
    seed(kube_api)
    if late_kind:
        kube_api.degrade(late_kind, latency_seconds=1.0)
    observer: ClusterObserver = await start_observer()
    kube_api.recover()

    kube_api.drop_watches()
    kube_api.remove("pods", "web-0", "team-1")
    kube_api.remove("nodes", "node-b.example")
    changed = kube_api.put("nodes", node("node-a", cpu="12"))
    kube_api.remove("configmaps", CM_NAME, CM_NAMESPACE)
    kube_api.expire_history()  # the reflectors resume from a resourceVersion the server forgot: 410

    async def relisted() -> bool:
        return all(r.stats.relists == 1 for r in observer.reflectors.values()) and await observer.wait_published(0.1)

    await eventually(relisted)
    listed_at = str(kube_api._resource_version)
    web = await pod_event(koordbus_bus, "team-1", "web-0")
    assert web is not None and web.deleted and web.node_name == "node-a" and web.resource_version == listed_at
    node_b = await node_event(koordbus_bus, "node-b.example")
    assert node_b is not None and node_b.deleted and node_b.node is None
    node_a = await node_event(koordbus_bus, "node-a")
    assert node_a is not None and node_a.resource_version == changed["metadata"]["resourceVersion"]
    config = await configmap_event(koordbus_bus, CM_NAMESPACE, CM_NAME)
    assert config is not None and config.deleted and config.data == {}
    # Unchanged objects are not published again by the relist.
    observed = {k: v for k, v in observer.stats.observed.items() if v}
    assert observed == {KIND_NODE: 2 + 2, KIND_POD: 2 + 1, KIND_CONFIGMAP: 1 + 1}
    assert await stream_count(koordbus_bus) == 5


async def test_unparsable_quantity_is_skipped_and_counted(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    kube_api.put("nodes", node("good-1"))
    kube_api.put("nodes", node("bad", cpu="lots"))
    kube_api.put("nodes", node("good-2"))
    observer: ClusterObserver = await start_observer()

    assert await node_event(koordbus_bus, "bad") is None
    assert await node_event(koordbus_bus, "good-2") is not None
    assert observer.stats.decode_failures[KIND_NODE] == 1
    kube_api.put("nodes", node("bad", cpu="still-lots"))
    kube_api.put("nodes", node("good-1", cpu="2"))
    kube_api.put("pods", {"metadata": {"name": "no-namespace"}, "spec": {"nodeName": "good-1"}})

    async def flowed() -> bool:
        event = await node_event(koordbus_bus, "good-1")
        return bool(event and event.node and kube.node_capacity(event.node)["cpu"] == 2000)

    await eventually(flowed)
    assert observer.stats.decode_failures[KIND_NODE] == 2
    assert await node_event(koordbus_bus, "bad") is None
    assert observer.registry is not None
    text = render(observer.registry).decode()
    assert 'koordbus_k8s_decode_failures_total{kind="node"} 2.0' in text
    # A bad node that is then fixed flows again; deleting it leaves a tombstone.
    kube_api.put("nodes", node("bad", cpu="3"))
    await eventually(lambda: node_event(koordbus_bus, "bad"))
    kube_api.remove("nodes", "bad")

    async def deleted() -> bool:
        event = await node_event(koordbus_bus, "bad")
        return bool(event and event.deleted)

    await eventually(deleted)


async def test_only_the_configured_configmap_is_observed(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    observer: ClusterObserver = await start_observer()

    kube_api.put("configmaps", configmap(CM_NAMESPACE, "other-config", {"x": "changed"}))
    kube_api.put("configmaps", configmap(CM_NAMESPACE, CM_NAME, {"colocation-config": '{"enable": false}'}))

    async def updated() -> bool:
        event = await configmap_event(koordbus_bus, CM_NAMESPACE, CM_NAME)
        return bool(event and event.data == {"colocation-config": '{"enable": false}'})

    await eventually(updated)
    kube_api.remove("configmaps", CM_NAME, CM_NAMESPACE)

    async def deleted() -> bool:
        event = await configmap_event(koordbus_bus, CM_NAMESPACE, CM_NAME)
        return bool(event and event.deleted)

    await eventually(deleted)
    assert await configmap_event(koordbus_bus, CM_NAMESPACE, "other-config") is None
    assert await configmap_event(koordbus_bus, "default", CM_NAME) is None
    assert observer.stats.observed[KIND_CONFIGMAP] == 3


async def test_restart_publishes_nothing_new_for_unchanged_objects(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    first: ClusterObserver = await start_observer()
    await first.stop()
    count, last_seq = await koordbus_bus.stream_info(streams.KOORD_CLUSTER)

    second: ClusterObserver = await start_observer()
    assert second.stats.published == 5
    assert second.stats.duplicates == 5
    assert await koordbus_bus.stream_info(streams.KOORD_CLUSTER) == (count, last_seq)


async def test_list_and_watch_failures_are_retried(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    kube_api.fail_next("list", "pods", status=500, times=2)
    observer: ClusterObserver = await start_observer()
    assert observer.reflectors[KIND_POD].stats.watch_errors == 2

    kube_api.fail_next("watch", "nodes", status=503, times=1)
    kube_api.drop_watches()
    kube_api.put("nodes", node("node-z"))
    await eventually(lambda: node_event(koordbus_bus, "node-z"))
    assert observer.reflectors[KIND_NODE].stats.watch_errors == 1
    assert observer.reflectors[KIND_NODE].stats.relists == 0


async def test_bookmarks_move_the_resume_point(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    seed(kube_api)
    observer: ClusterObserver = await start_observer()
    kube_api.put("pods", pod("team-3", "x", node_name="node-a"))  # moves the global resourceVersion on
    await eventually(lambda: pod_event(koordbus_bus, "team-3", "x"))
    kube_api.bookmark()
    expected = str(kube_api._resource_version)

    async def bookmarked() -> bool:
        return observer.reflectors[KIND_NODE].state.resource_version == expected

    await eventually(bookmarked)
    kube_api.drop_watches()
    kube_api.expire_history()  # nodes resume from the bookmark, which is still resumable
    kube_api.put("nodes", node("node-y"))
    await eventually(lambda: node_event(koordbus_bus, "node-y"))
    assert observer.reflectors[KIND_NODE].stats.relists == 0


async def test_api_client_from_kubeconfig(kube_api: FakeKubeApi, tmp_path: Path) -> None:
    kube_api.put("nodes", node("node-a"))
    settings = K8sSettings(kubeconfig=str(kube_api.kubeconfig(tmp_path / "config")))
    async with await api_client(settings) as client:
        response = await client.call_api("/api/v1/nodes", "GET", _preload_content=False)
        body = msgspec.json.decode(await response.read())
    assert [item["metadata"]["name"] for item in body["items"]] == ["node-a"]


async def test_api_client_without_any_config_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeConfigError, match="does not exist"):
        await api_client(K8sSettings(kubeconfig=str(tmp_path / "missing")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="not running in a cluster"):
        await api_client(K8sSettings())


def topology_object(name: str, zones: list[tuple[str, str, str]]) -> dict[str, Any]:
    """A NodeResourceTopology with one zone per (zone name, cpu, memory) allocatable."""
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "topologyPolicies": ["None"],
        "zones": [
            {
                "name": zone,
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": cpu, "allocatable": cpu, "available": cpu},
                    {"name": "memory", "capacity": memory, "allocatable": memory, "available": memory},
                ],
            }
            for zone, cpu, memory in zones
        ],
    }


async def test_node_resource_topologies_are_published_with_their_zones(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    kube_api.put("nodes", node("node-a"))
    nrt = topology_object("node-a", [("node-0", "4", "8Gi"), ("node-1", "4", "8Gi")])
    basic_info = '{"cpuModel":"Intel(R) Xeon(R) Gold 6348 CPU @ 2.60GHz","hyperThreadEnabled":true}'
    nrt["metadata"]["annotations"] = {"node.koordinator.sh/cpu-basic-info": basic_info}
    kube_api.put("noderesourcetopologies", nrt)
    observer: ClusterObserver = await start_observer()
    event = await last_event(koordbus_bus, subjects.cluster_topology("node-a"))
    assert isinstance(event, cluster.NodeTopologyObserved) and not event.deleted
    assert [zone.name for zone in event.zones or []] == ["node-0", "node-1"]
    assert event.cpu_basic_info == basic_info  # what CPU normalization keys on (services.noderesource)
    assert observer.stats.observed[KIND_TOPOLOGY] == 1
    kube_api.remove("noderesourcetopologies", "node-a")

    async def tombstone() -> bool:
        gone = await last_event(koordbus_bus, subjects.cluster_topology("node-a"))
        return isinstance(gone, cluster.NodeTopologyObserved) and gone.deleted

    await eventually(tombstone)


async def test_a_cluster_without_the_topology_crd_still_becomes_ready(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, kube_client: ApiClient
) -> None:
    kube_api.put("nodes", node("node-a"))
    kube_api.fail_next("list", "noderesourcetopologies", status=404, times=1000)
    observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
    await observer.start()
    try:
        async with asyncio.timeout(10):
            await observer.ready.wait()
        assert await node_event(koordbus_bus, "node-a") is not None
        assert not observer.reflectors[KIND_TOPOLOGY].listed.is_set()
    finally:
        await observer.stop()


def colocation_profile(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "config.koordinator.sh/v1alpha1",
        "kind": "ClusterColocationProfile",
        "metadata": {"name": name, "annotations": {"config.koordinator.sh/skip-update-resources": ""}},
        "spec": spec,
    }


async def test_what_the_webhook_reads_is_published_profiles_namespaces_and_priority_classes(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    batch = colocation_profile(
        "batch", selector={"matchLabels": {"app": "spark"}}, qosClass="BE", priorityClassName="koord-batch"
    )
    kube_api.put("clustercolocationprofiles", batch)
    kube_api.put("namespaces", {"metadata": {"name": "jobs", "labels": {"team": "data"}}})
    kube_api.put("priorityclasses", {"metadata": {"name": "koord-batch"}, "value": 5999})
    kube_api.put("priorityclasses", {"metadata": {"name": "koord-prod"}, "value": 9000, "preemptionPolicy": "Never"})
    observer: ClusterObserver = await start_observer()

    event = await last_event_of(koordbus_bus, subjects.cluster_profile("batch"))
    assert isinstance(event, cluster.ColocationProfileObserved) and event.profile is not None
    assert event.profile.spec == batch["spec"]
    assert event.profile.metadata.annotations == {"config.koordinator.sh/skip-update-resources": ""}
    namespace = await last_event_of(koordbus_bus, subjects.cluster_namespace("jobs"))
    assert isinstance(namespace, cluster.NamespaceObserved) and namespace.labels == {"team": "data"}
    classes = [
        await last_event_of(koordbus_bus, subjects.cluster_priority_class(n)) for n in ("koord-batch", "koord-prod")
    ]
    assert [(c.value, c.preemption_policy) for c in classes if isinstance(c, cluster.PriorityClassObserved)] == [
        (5999, None),
        (9000, "Never"),
    ]
    assert observer.stats.observed[KIND_PROFILE] == 1 and observer.stats.observed[KIND_PRIORITY_CLASS] == 2

    kube_api.put("namespaces", {"metadata": {"name": "jobs", "labels": {"team": "web"}}})
    kube_api.remove("clustercolocationprofiles", "batch")

    async def changed() -> bool:
        seen = await last_event_of(koordbus_bus, subjects.cluster_namespace("jobs"))
        gone = await last_event_of(koordbus_bus, subjects.cluster_profile("batch"))
        return (
            isinstance(seen, cluster.NamespaceObserved)
            and seen.labels == {"team": "web"}
            and isinstance(gone, cluster.ColocationProfileObserved)
            and gone.deleted
            and gone.profile is None
        )

    await eventually(changed)


async def last_event_of(bus: JetStreamBus, subject: str) -> cluster.AdmissionEvent | None:
    delivery = await bus.last_on_subject(streams.KOORD_CLUSTER, subject)
    return None if delivery is None else cluster.ADMISSION_EVENT_DECODER.decode(delivery.data)


async def test_a_cluster_without_the_profile_crd_or_the_rights_to_list_namespaces_still_becomes_ready(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, kube_client: ApiClient
) -> None:
    kube_api.put("nodes", node("node-a"))
    kube_api.fail_next("list", "clustercolocationprofiles", status=404, times=1000)
    kube_api.fail_next("list", "namespaces", status=403, times=1000)
    kube_api.fail_next("list", "priorityclasses", status=403, times=1000)
    observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
    await observer.start()
    try:
        async with asyncio.timeout(10):
            await observer.ready.wait()
        assert await node_event(koordbus_bus, "node-a") is not None
        assert not any(observer.reflectors[kind].listed.is_set() for kind in ADMISSION_KINDS)
    finally:
        await observer.stop()
