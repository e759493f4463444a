"""Node events: what an agent reports about its node, and what nodemetric computes from it.

Published by agent/ (NodeMetricsReported, NodeStateReported) and services/nodemetric
(NodeMetricComputed); read by nodemetric, the API and every later per-node service.
Field constraints are the first line of defence: a negative or absurd sample fails decoding
and the message goes to the dead-letter subject instead of into a window.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# --- constrained scalars

NodeName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Kubernetes node name (DNS-1123 subdomain)",
    ),
]
UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800, description="seconds since the epoch")]
Cores = Annotated[float, msgspec.Meta(ge=0, le=100_000, description="CPU usage in cores")]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**53, description="bytes")]
Seconds = Annotated[int, msgspec.Meta(ge=1, le=7 * 24 * 3600)]

Sample = tuple[UnixSeconds, Cores, Bytes]
"""One collection: (time, CPU cores, memory bytes)."""
MemorySample = tuple[UnixSeconds, Bytes]


# --- reported by the agent


class PodRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the agent knows about a pod: always its UID and kube QoS (from the cgroup path), the rest when known."""

    uid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    kube_qos: str = ""
    namespace: str = ""
    name: str = ""
    priority: int | None = None
    labels: dict[str, str] = {}


class ContainerSamples(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Samples of one container of a pod."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    name: str = ""
    samples: list[Sample] = []


class PodSamples(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Samples of one pod cgroup; memory excludes page cache (spec §1.4)."""

    pod: PodRef
    samples: list[Sample] = []
    memory_with_page_cache: list[MemorySample] = []
    containers: list[ContainerSamples] = []


class NodeMetricsReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.metrics_reported.v1"
):
    """One publish interval of 1 s samples from one node, [window_start, window_end).

    `node` samples carry MemTotal−MemAvailable memory; the page-cache and hot-page variants
    are present only where the agent could collect them. `system` is node − pods − host apps.
    """

    node: NodeName
    window_start: UnixSeconds
    window_end: UnixSeconds
    sent_at: UnixSeconds
    node_samples: list[Sample] = []
    memory_with_page_cache: list[MemorySample] = []
    memory_with_hot_page: list[MemorySample] = []
    system_samples: list[Sample] = []
    pods: list[PodSamples] = []
    dropped_batches: int = 0


class NodeStateReported(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.state_reported.v1"):
    """The agent's view of its node: capacity, cgroup layout and the pods it found. Sent at start and on change."""

    node: NodeName
    at: UnixSeconds
    agent_version: str = ""
    cpu_cores: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    memory_total: Bytes = 0
    cgroup_version: int = 0
    cgroup_driver: str = ""
    pods: list[PodRef] = []


# --- computed by nodemetric


class ResourceMap(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Koordinator's ResourceMap: empty `resources` means "no data", which is not the same as zeros."""

    resources: dict[str, int] = {}


class AggregatedUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage over one duration, keyed by aggregation type (avg, p50, p90, p95, p99)."""

    duration_seconds: int
    usage: dict[str, ResourceMap]


class PodMetric(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    namespace: str
    name: str
    uid: str = ""
    pod_usage: ResourceMap
    priority: str = ""
    qos: str = ""


class NodeMetricInfo(msgspec.Struct, frozen=True, kw_only=True):
    node_usage: ResourceMap
    aggregated_node_usages: list[AggregatedUsage]
    system_usage: ResourceMap
    aggregated_system_usages: list[AggregatedUsage]


class NodeMetricStatus(msgspec.Struct, frozen=True, kw_only=True):
    """NodeMetric `.status` with integer amounts (cpu millicores, memory bytes)."""

    update_time: UnixSeconds
    node_metric: NodeMetricInfo
    pods_metric: list[PodMetric]


class MetricCollectPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """NodeMetric `.spec.metricCollectPolicy` with Koordinator's defaults (spec §1.3)."""

    aggregate_duration_seconds: int = 300
    report_interval_seconds: int = 60
    durations_seconds: tuple[int, ...] = (300, 600, 1800)
    node_memory_collect_policy: str = "usageWithoutPageCache"


class NodeMetricComputed(msgspec.Struct, frozen=True, kw_only=True, tag="nodemetric.computed.v1"):
    """One report round of one node: the NodeMetric status and the spec it was computed with."""

    node: NodeName
    report_time: UnixSeconds
    spec: MetricCollectPolicy
    status: NodeMetricStatus
    samples_in_window: int = 0


NodeEvent = NodeMetricsReported | NodeStateReported
