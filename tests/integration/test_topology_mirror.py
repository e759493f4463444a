"""The topology mirror on a real nats-server against the fake Kubernetes API server (which checks every write against
the NodeResourceTopology v1alpha1 schema): an agent's report published on its subject becomes the node's object, a
changed report updates it, the noderesource writer's batch entries (services.k8s.sinks.write_topology_zones) survive
our updates and ours theirs, a restart re-applies each node's latest report, and a report that cannot be written is
dead-lettered while the consumer goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import msgspec
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import HEADER_DLQ_CONSUMER, HEADER_DLQ_REASON, ConsumerSpec, Delivery
from bus.jetstream import JetStreamBus
from schemas import vocab
from schemas.node_topology import KubeletCpuManager, NodeTopologyReported, encode_topology
from schemas.noderesource import NodeResourceComputed
from services.common.metrics import new_registry
from services.k8s.settings import K8sSettings
from services.k8s.sinks import KubeSink
from services.k8s.topology_mirror import CONSUMER, SERVICE, KubeTopologySink, TopologyMirror
from services.k8s.topology_writes import desired_topology
from tests.fakes.kube_api import FakeKubeApi
from tests.support.waiting import eventually
from tests.unit.test_k8s_topology_writes import report

K8S = replace(K8sSettings(), quota_write_interval_seconds=0.0, backoff_initial_seconds=0.05)
NODE = "node-a"
GiB = 1024**3


class _Collect:
    def __init__(self) -> None:
        self.received: list[Delivery] = []

    async def handle(self, delivery: Delivery) -> None:
        self.received.append(delivery)

    async def flush(self) -> None:
        return None


def new_mirror(bus: JetStreamBus, client: ApiClient, registry: CollectorRegistry | None = None) -> TopologyMirror:
    return TopologyMirror(bus, KubeTopologySink(client), settings=K8S, registry=registry or new_registry())


@pytest_asyncio.fixture
async def mirror(koordbus_bus: JetStreamBus, kube_client: ApiClient) -> AsyncIterator[TopologyMirror]:
    started = new_mirror(koordbus_bus, kube_client)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def publish(bus: JetStreamBus, node: str, data: bytes, msg_id: str) -> None:
    await bus.publish(subjects.node_topology(node), data, msg_id=msg_id)


def zone_entries(obj: dict[str, Any] | None) -> list[dict[str, dict[str, str]]]:
    """Per zone, its resources entries by name."""
    return [{entry["name"]: entry for entry in zone["resources"]} for zone in (obj or {}).get("zones") or []]


def holds(kube_api: FakeKubeApi, expected: NodeTopologyReported) -> bool:
    """Whether the node's object holds the report's zones resources and annotations (others' entries aside)."""
    obj = kube_api.get("noderesourcetopologies", expected.node)
    if obj is None:
        return False
    desired = desired_topology(expected)
    annotations = obj["metadata"].get("annotations") or {}
    ours = [
        {name: entries[name] for name in entries if not name.startswith("kubernetes.io/")}
        for entries in zone_entries(obj)
    ]
    return ours == zone_entries(desired) and all(
        annotations.get(k) == v for k, v in desired["metadata"]["annotations"].items()
    )


def batch_decision(zones: dict[str, dict[str, int | None]]) -> NodeResourceComputed:
    return NodeResourceComputed(
        node=NODE,
        computed_at=1.0,
        trigger=("topology",),
        outcome="computed",
        resources={},
        annotations={},
        explanation={},
        write_due=True,
        write_reason="first write",
        zones=zones,
    )


async def test_reports_become_the_nodes_topology_and_batch_entries_survive(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient, mirror: TopologyMirror
) -> None:
    first = report(2)
    await publish(koordbus_bus, NODE, encode_topology(first), "topology-1")
    await eventually(lambda: holds(kube_api, first))
    created = kube_api.get("noderesourcetopologies", NODE)
    assert created is not None
    assert created["topologyPolicies"] == ["None"]
    assert created["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordbus"}
    assert [zone["name"] for zone in created["zones"]] == ["node-0", "node-1"]

    # the noderesource writer sets its batch entries through its own sink, then the agent's report changes
    batch = {"node-0": {vocab.BATCH_CPU: 6_900, vocab.BATCH_MEMORY: 3 * GiB}, "node-1": {vocab.BATCH_CPU: 1_500}}
    written = await KubeSink(kube_client).write_topology_zones(batch_decision(batch))
    assert written.action == "updated"
    kube_api.put(  # another owner's label and annotation on the object
        "noderesourcetopologies",
        {
            **(current := kube_api.get("noderesourcetopologies", NODE) or {}),
            "metadata": {
                **current["metadata"],
                "labels": {**current["metadata"]["labels"], "team": "infra"},
                "annotations": {**current["metadata"]["annotations"], "example.com/note": "kept"},
            },
        },
    )
    changed = report(2, cpus_per_node=6, kubelet=KubeletCpuManager(policy="static", reserved_cpus="0"))
    await publish(koordbus_bus, NODE, encode_topology(changed), "topology-2")
    await eventually(lambda: holds(kube_api, changed))
    updated = kube_api.get("noderesourcetopologies", NODE)
    assert updated is not None
    node0, node1 = zone_entries(updated)
    assert node0["cpu"]["allocatable"] == "6"
    assert node0[vocab.BATCH_CPU]["allocatable"] == "6900" and node0[vocab.BATCH_MEMORY]["allocatable"] == "3Gi"
    assert node1[vocab.BATCH_CPU]["allocatable"] == "1500" and node1[vocab.BATCH_MEMORY]["allocatable"] == "0"
    assert updated["metadata"]["labels"]["team"] == "infra"
    assert updated["metadata"]["annotations"]["example.com/note"] == "kept"
    assert updated["metadata"]["annotations"]["kubelet.koordinator.sh/cpu-manager-policy"] == (
        '{"policy":"static","reservedCPUs":"0"}'
    )

    # and our entries survive the next batch write
    again = await KubeSink(kube_client).write_topology_zones(batch_decision({"node-0": {vocab.BATCH_CPU: 500}}))
    assert again.action == "updated"
    assert holds(kube_api, changed)

    # a node that loses a NUMA node loses its zone
    shrunk = report(1, cpus_per_node=6)
    await publish(koordbus_bus, NODE, encode_topology(shrunk), "topology-3")
    await eventually(lambda: holds(kube_api, shrunk))
    assert await mirror.wait_idle(10)
    assert mirror.healthy() and await mirror.readiness() is None


async def test_a_restart_reapplies_each_nodes_latest_report(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    first = new_mirror(koordbus_bus, kube_client)
    await first.start()
    try:
        await publish(koordbus_bus, NODE, encode_topology(report(1)), "a-1")
        await publish(koordbus_bus, NODE, encode_topology(report(2)), "a-2")
        await publish(koordbus_bus, "node-b", encode_topology(msgspec.structs.replace(report(1), node="node-b")), "b-1")
        await eventually(lambda: holds(kube_api, report(2)) and kube_api.get("noderesourcetopologies", "node-b"))
    finally:
        await first.stop()
    kube_api.remove("noderesourcetopologies", NODE)  # deleted while the bridge was down
    second = new_mirror(koordbus_bus, kube_client)
    await second.start()
    try:
        await eventually(lambda: holds(kube_api, report(2)))
        assert await second.wait_idle(10)
    finally:
        await second.stop()


async def test_what_cannot_be_written_is_dead_lettered_and_the_consumer_goes_on(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, mirror: TopologyMirror
) -> None:
    dead_letters = _Collect()
    reader = koordbus_bus.consume(
        ConsumerSpec(
            durable="test-topology-dlq",
            stream=streams.KOORD_DLQ,
            filter_subjects=(subjects.dlq(SERVICE),),
            service="test-topology-dlq",
        ),
        dead_letters,
    )
    poison = {
        b"\xc1 not msgpack": "DecodeError",
        msgspec.msgpack.encode({"type": "node.topology_reported.v1", "node": "Not A Node!", "at": 1.0}): "at `$.node`",
        encode_topology(msgspec.structs.replace(report(1), node="node-b")): "names node 'node-b', its subject 'node-a'",
        encode_topology(report(1, kubelet=KubeletCpuManager(policy="static", reserved_cpus="9-1"))): "bad cpu range",
    }
    try:
        # both consumers exist before the first message (the mirror's would otherwise start at the last one)
        assert await mirror.wait_idle(10) and await reader.wait_idle(10)
        for k, data in enumerate(poison):
            await publish(koordbus_bus, NODE, data, f"poison-{k}")
        valid = report(2)
        await publish(koordbus_bus, NODE, encode_topology(valid), "valid")
        await eventually(lambda: holds(kube_api, valid) and len(dead_letters.received) >= len(poison))
    finally:
        await reader.stop()
    assert kube_api.get("noderesourcetopologies", "node-b") is None
    by_payload = {letter.data: letter for letter in dead_letters.received}
    assert set(by_payload) == set(poison)
    for data, reason in poison.items():
        assert reason in by_payload[data].headers[HEADER_DLQ_REASON], by_payload[data].headers[HEADER_DLQ_REASON]
        assert by_payload[data].headers[HEADER_DLQ_CONSUMER] == CONSUMER
    assert mirror.healthy()


async def test_a_cluster_without_the_crd_is_skipped_and_the_bridge_stays_ready(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    nodes = [f"node-{k}" for k in range(K8S.unhealthy_after_write_failures + 1)]
    for verb in ("get", "create"):  # what a server without the CRD answers
        kube_api.fail_next(verb, "noderesourcetopologies", status=404, times=len(nodes))
    registry = new_registry()
    mirror = new_mirror(koordbus_bus, kube_client, registry)
    await mirror.start()
    try:
        for node in nodes:
            await publish(koordbus_bus, node, encode_topology(msgspec.structs.replace(report(1), node=node)), node)

        def skipped() -> float:
            return registry.get_sample_value("koordbus_k8s_topology_writes_total", {"action": "skipped"}) or 0.0

        await eventually(lambda: skipped() == len(nodes))
        assert mirror.healthy() and await mirror.readiness() is None
        assert kube_api.objects("noderesourcetopologies") == []
    finally:
        await mirror.stop()


async def test_a_replace_answered_404_or_409_is_read_again_at_once(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    registry = new_registry()
    mirror = new_mirror(koordbus_bus, kube_client, registry)
    await mirror.start()
    try:
        await publish(koordbus_bus, NODE, encode_topology(report(1)), "first")
        await eventually(lambda: holds(kube_api, report(1)))
        kube_api.fail_next("update", "noderesourcetopologies", status=404, times=1)
        kube_api.fail_next("update", "noderesourcetopologies", status=409, times=1)
        await publish(koordbus_bus, NODE, encode_topology(report(2)), "second")
        await eventually(lambda: holds(kube_api, report(2)))
        assert mirror.healthy()
        # both answers were read again within the one write: none failed
        assert not registry.get_sample_value("koordbus_k8s_topology_writes_total", {"action": "failed"})
    finally:
        await mirror.stop()
