"""Builders of realistic events for tests that need one without running an agent or the service."""

from __future__ import annotations

from typing import Any

import msgspec

from bus import subjects
from bus.api import Bus
from schemas.cluster import ConfigMapObserved, NodeObserved, PodObserved, WorkloadObserved
from schemas.node import (
    AggregatedUsage,
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricComputedRecord,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)


def usage(cpu_milli: int, memory: int) -> ResourceMap:
    return ResourceMap(resources={"cpu": cpu_milli, "memory": memory})


def nodemetric_computed(
    node: str, report_time: float, *, cpu_milli: int = 1500, samples: int = 300
) -> NodeMetricComputed:
    """One report: 6 GiB node memory, a 5-minute aggregate, system usage and one BE pod."""
    node_usage = usage(cpu_milli, 6 << 30)
    return NodeMetricComputed(
        node=node,
        report_time=report_time,
        spec=MetricCollectPolicy(),
        status=NodeMetricStatus(
            update_time=report_time,
            node_metric=NodeMetricInfo(
                node_usage=node_usage,
                aggregated_node_usages=[
                    AggregatedUsage(duration_seconds=300, usage={"avg": node_usage, "p95": usage(cpu_milli, 7 << 30)})
                ],
                system_usage=usage(200, 1 << 30),
                aggregated_system_usages=[AggregatedUsage(duration_seconds=300, usage={"avg": usage(200, 1 << 30)})],
            ),
            pods_metric=[
                PodMetric(
                    namespace="default",
                    name="batch-0",
                    uid="3f1e2d3c-0000-4000-8000-000000000001",
                    pod_usage=usage(500, 300 << 20),
                    priority="koord-batch",
                    qos="BE",
                )
            ],
        ),
        samples_in_window=samples,
    )


def nodemetric_record(
    node: str, report_time: float, *, cpu_milli: int = 1500, samples: int = 300
) -> NodeMetricComputedRecord:
    """`nodemetric_computed` as the projector decodes it from the stream (status kept as JSON)."""
    return NodeMetricComputedRecord.of(nodemetric_computed(node, report_time, cpu_milli=cpu_milli, samples=samples))


async def publish_events(bus: Bus, *events: Any) -> None:
    """Publish cluster and nodemetric events on their subjects, as the bridge and the nodemetric service do.

    The message id is the subject and the content, so publishing the same event twice is deduplicated."""
    for event in events:
        match event:
            case NodeObserved():
                subject = subjects.cluster_node(event.name)
            case PodObserved():
                subject = subjects.cluster_pod(event.namespace, event.name)
            case ConfigMapObserved():
                subject = subjects.cluster_configmap(event.namespace, event.name)
            case WorkloadObserved():
                subject = subjects.cluster_workload(event.namespace, event.name)
            case NodeMetricComputed():
                subject = subjects.nodemetric_computed(event.node)
            case _:
                raise TypeError(f"no subject for {type(event).__name__}")
        data = msgspec.json.encode(event)
        await bus.publish(subject, data, msg_id=f"{subject}:{hash(data)}")
