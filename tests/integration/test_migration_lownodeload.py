"""Koordinator's LowNodeLoad through the migration service on a real nats-server (spec §11): the args file's
`lowNodeLoadArgs` section, NodeMetrics showing one node hot and one cold. After the anomaly detector's rounds the
service asks for the hot node's pods within the per-round eviction limit, never twice for a pod, and the arbiter
takes the requests like any other. With dryRun the round is evaluated and kept, and nothing is asked for."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from bus.jetstream import JetStreamBus
from koordbus.parts import migration_settings
from schemas import kube
from schemas.cluster import ConfigMapObserved, NodeObserved, PodObserved, WorkloadObserved
from schemas.node import (
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)
from schemas.scheduling import SchedulingNode, SchedulingPod
from services.common.metrics import new_registry
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from tests.support.events import publish_events as publish
from tests.support.migration import pod
from tests.support.waiting import eventually

NOW = 2_000_000_000.0
HOT = {"b1": 2000, "b2": 2000, "b3": 2000, "b4": 2000}
"""Millicores per pod: the hot node at 80 % of its 10 cores."""

ARGS = """
maxMigratingPerNode: 5
maxNoOfPodsToEvictPerNode: 1
deschedulingInterval: 1h
lowNodeLoadArgs:
  highThresholds: {cpu: 50}
  lowThresholds: {cpu: 20}
  anomalyCondition: {consecutiveAbnormalities: 2}
"""


def node(name: str) -> NodeObserved:
    obj = msgspec.convert(
        {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "10", "memory": "100Gi", "pods": "110"}}},
        kube.Node,
    )
    return NodeObserved(name=name, observed_at=1.0, node=obj)


def metric(name: str, pods: dict[str, int]) -> NodeMetricComputed:
    return NodeMetricComputed(
        node=name,
        report_time=NOW,
        spec=MetricCollectPolicy(),
        status=NodeMetricStatus(
            update_time=NOW,
            node_metric=NodeMetricInfo(
                node_usage=ResourceMap(resources={}),
                aggregated_node_usages=[],
                system_usage=ResourceMap(resources={"cpu": 0, "memory": 2**30}),
                aggregated_system_usages=[],
            ),
            pods_metric=[
                PodMetric(namespace="default", name=p, pod_usage=ResourceMap(resources={"cpu": c, "memory": 2**28}))
                for p, c in pods.items()
            ],
        ),
    )


async def _service(bus: JetStreamBus, tmp_path: Path, args: str) -> MigrationService:
    path = tmp_path / "args.yaml"
    path.write_text(args)
    settings: MigrationSettings = migration_settings(str(path))
    settings = MigrationSettings(
        args=settings.args, low_node_load_args=settings.low_node_load_args, startup_timeout_seconds=10
    )
    pods = [pod(n, node="hot", priority=5500) for n in HOT]
    await publish(
        bus,
        node("hot"),
        node("cold"),
        WorkloadObserved(namespace="default", name="rs", observed_at=1.0, kind="ReplicaSet", uid="rs-1", replicas=20),
        *(PodObserved(namespace="default", name=p.metadata.name, observed_at=1.0, pod=p) for p in pods),
        metric("hot", HOT),
        metric("cold", {}),
    )
    service = MigrationService(bus, settings, registry=new_registry(), clock=lambda: NOW + 5)
    await service.start()
    await eventually(lambda: set(service.node_metrics) == {"hot", "cold"} and len(service._pods) == 4)
    return service


def _high(service: MigrationService) -> object:
    args = service.low_node_load_args
    return None if args is None else args.pools[0].high


async def test_a_hot_node_is_relieved_within_its_limits(koordbus_bus: JetStreamBus, tmp_path: Path) -> None:
    service = await _service(koordbus_bus, tmp_path, ARGS)
    try:
        assert await service.deschedule() == 0  # consecutiveAbnormalities 2: the third abnormal round acts
        assert await service.deschedule() == 0
        decision = service.last_low_node_load
        assert decision is not None and decision.pools[0].classes["highNodes"] == ["hot"]
        assert decision.pools[0].abnormal_nodes == []
        assert await service.deschedule() == 1  # maxNoOfPodsToEvictPerNode: 1 per round
        await eventually(lambda: len(service.state.jobs) == 1)
        assert await service.deschedule() == 1  # b1 has its job: refused with no accounting, b2 is next
        await eventually(lambda: len(service.state.jobs) == 2)
        asked = sorted(j.spec.pod_ref.name for j in service.state.jobs.values() if j.spec.pod_ref)
        assert asked == ["b1", "b2"]
        reasons = {j.metadata.annotations["descheduler.koordinator.sh/reason"] for j in service.state.jobs.values()}
        assert reasons == {"node is overutilized, node cpu usage(80.00%)>threshold(50.00%)"}
        decision = service.last_low_node_load
        assert decision is not None and [e.pod for e in decision.evictions] == ["default/b2"]
        await service.run_round()
        await eventually(lambda: len(service.state.passed()) == 2)
    finally:
        await service.stop()


async def test_dry_run_asks_for_nothing(koordbus_bus: JetStreamBus, tmp_path: Path) -> None:
    text = ARGS.replace("consecutiveAbnormalities: 2", "consecutiveAbnormalities: 1") + "  dryRun: true\n"
    service = await _service(koordbus_bus, tmp_path, text)
    try:
        assert await service.deschedule() == 0
        decision = service.last_low_node_load
        assert decision is not None and decision.dry_run
        assert [e.pod for e in decision.evictions] == ["default/b1", "default/b2"]  # no limits in a dry run
        assert service.state.jobs == {}
    finally:
        await service.stop()


async def test_the_load_watermarks_override_the_thresholds_they_name(
    koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    text = ARGS.replace("consecutiveAbnormalities: 2", "consecutiveAbnormalities: 1")
    service = await _service(koordbus_bus, tmp_path, text)
    try:
        marks = json.dumps({"usageThresholds": {"cpu": 85}})
        await publish(
            koordbus_bus,
            ConfigMapObserved(
                namespace="koordinator-system",
                name="slo-controller-config",
                observed_at=1.0,
                data={"load-watermarks-config": marks},
            ),
        )
        await eventually(lambda: _high(service) == {"cpu": 85})
        assert await service.deschedule() == 0  # 80 % is under the scheduler's 85 %
        decision = service.last_low_node_load
        assert decision is not None and decision.pools[0].classes["highNodes"] == [] and decision.evictions == ()
        assert service.state.jobs == {}
    finally:
        await service.stop()


async def test_nodefit_reads_taints_and_tolerations_from_the_cluster_stream(
    koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    """Issue 25 point 2: the only low node is tainted NoSchedule, so no pod of the hot node fits elsewhere until the
    pods tolerate the taint (as the bridge publishes them: taints and tolerations now cross the cluster stream)."""
    text = ARGS.replace("consecutiveAbnormalities: 2", "consecutiveAbnormalities: 1")
    service = await _service(koordbus_bus, tmp_path, text)
    try:
        tainted = msgspec.convert(
            {
                "metadata": {"name": "cold"},
                "spec": {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"cpu": "10", "memory": "100Gi", "pods": "110"}},
            },
            SchedulingNode,
        )
        await publish(koordbus_bus, NodeObserved(name="cold", observed_at=2.0, resource_version="2", node=tainted))
        await eventually(lambda: "cold" in service._node_objects and _taints(service._node_objects["cold"]) == 1)
        assert await service.deschedule() == 0
        decision = service.last_low_node_load
        assert decision is not None and decision.pools[0].abnormal_nodes == ["hot"] and decision.evictions == ()
        assert decision.pools[0].outcome.startswith("no pod of the abnormal node(s) could move")
        toleration = [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]
        tolerant = [pod(n, node="hot", priority=5500, tolerations=toleration) for n in HOT]
        await publish(
            koordbus_bus,
            *(PodObserved(namespace="default", name=p.metadata.name, observed_at=2.0, pod=p) for p in tolerant),
        )
        await eventually(lambda: all(_tolerates(service._pods[f"default/{n}"]) for n in HOT))
        assert await service.deschedule() == 1  # maxNoOfPodsToEvictPerNode: 1
    finally:
        await service.stop()


def _taints(node: object) -> int:
    return len(node.spec.taints or ()) if isinstance(node, SchedulingNode) else 0


def _tolerates(p: object) -> bool:
    return isinstance(p, SchedulingPod) and bool(p.spec.tolerations)
