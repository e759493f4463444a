"""Builders of realistic events for tests that need one without running an agent or the service."""

from __future__ import annotations

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
