"""Load-aware descheduling through the migration service on a real nats-server: NodeMetrics show one node hot and
one cold; after the debounce the service asks for just enough of the hot node's cheapest pods (once each, however
many rounds see them), and the arbiter takes them like any request. A stale NodeMetric asks for nothing."""

from __future__ import annotations

import msgspec

from bus.jetstream import JetStreamBus
from schemas import kube
from schemas.cluster import NodeObserved, PodObserved, WorkloadObserved
from schemas.node import (
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)
from services.common.metrics import new_registry
from services.migration.args import MigrationArgs
from services.migration.lownodeload import LowNodeLoadArgs
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from tests.support.events import publish_events as publish
from tests.support.migration import pod
from tests.support.waiting import eventually

NOW = 2_000_000_000.0


def node(name: str) -> NodeObserved:
    obj = msgspec.convert(
        {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "100", "memory": "100Gi"}}}, kube.Node
    )
    return NodeObserved(name=name, observed_at=1.0, node=obj)


def metric(name: str, cpu_cores: int, pods: dict[str, int], *, at: float = NOW) -> NodeMetricComputed:
    return NodeMetricComputed(
        node=name,
        report_time=at,
        spec=MetricCollectPolicy(),
        status=NodeMetricStatus(
            update_time=at,
            node_metric=NodeMetricInfo(
                node_usage=ResourceMap(resources={"cpu": cpu_cores * 1000, "memory": 10 * 2**30}),
                aggregated_node_usages=[],
                system_usage=ResourceMap(resources={}),
                aggregated_system_usages=[],
            ),
            pods_metric=[
                PodMetric(namespace="default", name=p, pod_usage=ResourceMap(resources={"cpu": c * 1000}))
                for p, c in pods.items()
            ],
        ),
    )


async def test_a_hot_node_gives_up_just_enough_pods(koordbus_bus: JetStreamBus) -> None:
    hot = {"batch-1": (5500, 10), "batch-2": (5400, 10), "prod": (9500, 40)}
    pods = [pod(n, node="hot", priority=p) for n, (p, _) in hot.items()]
    await publish(
        koordbus_bus,
        node("hot"),
        node("cold"),
        WorkloadObserved(namespace="default", name="rs", observed_at=1.0, kind="ReplicaSet", uid="rs-1", replicas=10),
        *(PodObserved(namespace="default", name=p.metadata.name, observed_at=1.0, pod=p) for p in pods),
        metric("hot", 85, {n: c for n, (_, c) in hot.items()}),
        metric("cold", 10, {}),
    )
    settings = MigrationSettings(
        args=MigrationArgs(),
        low_node_load=LowNodeLoadArgs(enabled=True, anomaly_rounds=2, interval_seconds=3600),
        startup_timeout_seconds=10,
    )
    service = MigrationService(koordbus_bus, settings, registry=new_registry(), clock=lambda: NOW + 5)
    await service.start()
    try:
        await eventually(lambda: set(service.node_metrics) == {"hot", "cold"} and len(service._pods) == 3)
        assert await service.deschedule() == 0 and service.streaks == {"hot": 1}  # the debounce
        assert await service.deschedule() == 2  # 85% → under 70%: the two batch pods, cheapest first
        await eventually(lambda: len(service.state.jobs) == 2)
        assert await service.deschedule() == 0  # asked once only
        pods_asked = sorted(j.spec.pod_ref.name for j in service.state.jobs.values() if j.spec.pod_ref)
        assert pods_asked == ["batch-1", "batch-2"]
        reason = next(iter(service.state.jobs.values())).metadata.annotations["descheduler.koordinator.sh/reason"]
        assert "node hot overloaded for 2 rounds (cpu 85% > 70%)" in reason
        await service.run_round()
        await eventually(lambda: len(service.state.passed()) == 2)
        await publish(koordbus_bus, metric("hot", 90, {}, at=NOW - 600))  # stale: no part in anything
        await eventually(lambda: service.node_metrics["hot"].status.update_time == NOW - 600)
        await service.deschedule()
        assert "hot" not in service.streaks
    finally:
        await service.stop()
