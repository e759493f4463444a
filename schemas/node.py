"""Node events: what an agent reports about its node, and what nodemetric computes from it.

Published by agent/ (NodeMetricsReported, NodeStateReported) and services/nodemetric
(NodeMetricComputed); read by nodemetric, the API and every later per-node service.
Field constraints are the first line of defence: a negative or absurd sample fails decoding
and the message goes to the dead-letter subject instead of into a window.

Wire format: the node subjects (`koord.v1.node.<node>.metrics|state`) carry msgpack, because the
float-heavy batches are the hottest input of the system (about half the bytes of JSON and cheaper to
decode); every other subject carries JSON. `encode_node_event` and `NODE_EVENT_DECODER` are the only
place that choice is made: publishers and the ingest consumer go through them.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
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


PodIndex = Annotated[int, msgspec.Meta(ge=0, description="position of a pod in the batch's `pods`")]
ContainerIndex = Annotated[int, msgspec.Meta(ge=0, description="position of a container in the batch's `containers`")]


class ContainerRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One container of a batch: the pod it belongs to (an index into `pods`), its runtime ID and name."""

    pod: PodIndex
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    name: str = ""


class PodSampleColumns(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every pod sample of a batch as parallel columns: row i is (pod[i], t[i], cpu[i], memory[i]).

    Columns instead of per-pod lists of tuples because the reader wants one array per quantity: decoding lists
    of numbers and handing them to numpy is several times cheaper than walking tuples. Rows of one pod are
    contiguous and in time order, pods in `pods` order. Memory excludes page cache (spec §1.4);
    `memory_with_page_cache` is either empty or has one value per row.
    """

    pod: list[PodIndex] = []
    t: list[UnixSeconds] = []
    cpu: list[Cores] = []
    memory: list[Bytes] = []
    memory_with_page_cache: list[Bytes] = []

    def __post_init__(self) -> None:
        _require_rows("pod_samples", self.pod, t=self.t, cpu=self.cpu, memory=self.memory)
        _require_optional_rows("pod_samples", self.pod, memory_with_page_cache=self.memory_with_page_cache)
        _require_grouped("pod_samples", self.pod, "pod")


class ContainerSampleColumns(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Every container sample of a batch as parallel columns, grouped by container like PodSampleColumns by pod."""

    container: list[ContainerIndex] = []
    t: list[UnixSeconds] = []
    cpu: list[Cores] = []
    memory: list[Bytes] = []

    def __post_init__(self) -> None:
        _require_rows("container_samples", self.container, t=self.t, cpu=self.cpu, memory=self.memory)
        _require_grouped("container_samples", self.container, "container")


def _require_rows(table: str, index: Sequence[int], **columns: Sized) -> None:
    """Every column has one entry per row of the index column."""
    wrong = [f"`{name}` has {len(col)}" for name, col in columns.items() if len(col) != len(index)]
    if wrong:
        raise ValueError(f"{table}: every column needs {len(index)} rows, one per index entry, but {', '.join(wrong)}")


def _require_optional_rows(table: str, index: Sequence[int], **columns: Sized) -> None:
    """Optional columns are either absent (empty) or complete."""
    wrong = [f"`{name}` has {len(col)}" for name, col in columns.items() if col and len(col) != len(index)]
    if wrong:
        raise ValueError(f"{table}: optional columns need 0 or {len(index)} rows, but {', '.join(wrong)}")


def _require_grouped(table: str, index: list[int], what: str) -> None:
    """Rows of one pod (container) are contiguous and in the order of the list they index: no index decreases."""
    # sorted() over an already sorted list is one linear pass in C, far cheaper than a Python loop over the rows.
    if index != sorted(index):
        row = next(i for i in range(1, len(index)) if index[i] < index[i - 1])
        raise ValueError(
            f"{table}: rows must be grouped by {what} in list order, but row {row} ({what} {index[row]}) "
            f"follows {what} {index[row - 1]}"
        )


def _require_in_range(table: str, index: Sequence[int], size: int, listed: str) -> None:
    if index and (highest := max(index)) >= size:
        raise ValueError(f"{table}: index {highest} is out of range, the batch lists {size} {listed}")


class NodeMetricsReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.metrics_reported.v1"
):
    """One publish interval of 1 s samples from one node, [window_start, window_end).

    `node` samples carry MemTotal−MemAvailable memory; the page-cache and hot-page variants
    are present only where the agent could collect them. `system` is node − pods − host apps.
    Pod and container samples are columnar (see PodSampleColumns) and point into `pods` and
    `containers` by index; an inconsistent batch fails decoding like an out-of-range sample.
    """

    node: NodeName
    window_start: UnixSeconds
    window_end: UnixSeconds
    sent_at: UnixSeconds
    node_samples: list[Sample] = []
    memory_with_page_cache: list[MemorySample] = []
    memory_with_hot_page: list[MemorySample] = []
    system_samples: list[Sample] = []
    pods: list[PodRef] = []
    pod_samples: PodSampleColumns = PodSampleColumns()
    containers: list[ContainerRef] = []
    container_samples: ContainerSampleColumns = ContainerSampleColumns()
    dropped_batches: int = 0

    def __post_init__(self) -> None:
        _require_in_range("pod_samples", self.pod_samples.pod, len(self.pods), "pods")
        container_pods = [c.pod for c in self.containers]
        _require_grouped("containers", container_pods, "pod")
        _require_in_range("containers", container_pods, len(self.pods), "pods")
        _require_in_range("container_samples", self.container_samples.container, len(self.containers), "containers")


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
    source_sent_at: UnixSeconds = 0.0
    """When the agent sent the batch that completed this report (for publish → projection latency)."""


NodeEvent = NodeMetricsReported | NodeStateReported


def encode_node_event(event: NodeEvent) -> bytes:
    """The wire form of a node-subject event (msgpack; see the module docstring)."""
    return _NODE_EVENT_ENCODER.encode(event)


_NODE_EVENT_ENCODER = msgspec.msgpack.Encoder()
NODE_EVENT_DECODER: msgspec.msgpack.Decoder[NodeEvent] = msgspec.msgpack.Decoder(NodeEvent)
"""Decodes (and validates) what `encode_node_event` wrote; raises msgspec.DecodeError/ValidationError otherwise."""
