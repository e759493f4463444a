"""Reading a NodeMetric object (`slo.koordinator.sh/v1alpha1`, spec §1.2) as Koordinator's consumers see it.

schemas.koordinator writes NodeMetric; this module reads one back: the camelCase JSON (quantity strings or
integers, unknown fields ignored) decoded by `NodeMetricObject`, and `usage_snapshot` turning it into a
`NodeUsageSnapshot` of integer amounts (cpu in millicores, memory in bytes) masked to cpu and memory, which is
all the manager-side calculations read. `snapshot_from_computed` gives the same view of our own NodeMetricComputed
event. Callers: `koordbus calc batch-resource`, services.noderesource (batch
and mid, §2.4/§2.8) and later the load-aware scheduler. A quantity that does not parse fails decoding with its
JSON path. Nothing here does I/O. The snapshot structs are `gc=False` (strings, numbers and containers of those:
no reference cycles), so the service's snapshot per node stays out of the garbage collector's scans.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import msgspec

from schemas import koordinator, kube, quantity, resources
from schemas.node import NodeMetricComputed, ResourceMap

_CPU_AND_MEMORY = (resources.CPU, resources.MEMORY)


class ResourceMapJSON(msgspec.Struct, frozen=True, kw_only=True):
    """Koordinator's ResourceMap: `{"resources": {...}, "devices": [...]}`; no `resources` means no data."""

    resources: kube.RawResourceList | None = None

    def __post_init__(self) -> None:
        kube.require_quantities("resources", self.resources)


class PodMetricJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    namespace: str = ""
    name: str = ""
    pod_usage: ResourceMapJSON = ResourceMapJSON()
    priority: str = ""
    qos: str = ""


class HostApplicationMetricJSON(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    usage: ResourceMapJSON = ResourceMapJSON()
    priority: str = ""
    qos: str = ""


class ProdReclaimableMetricJSON(msgspec.Struct, frozen=True, kw_only=True):
    resource: ResourceMapJSON = ResourceMapJSON()


class AggregatedUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage percentiles over one window: `usage` maps an aggregation (avg, p50, p90, p95, p99) to a ResourceMap."""

    usage: dict[str, ResourceMapJSON] | None = None
    duration: str = ""


class NodeMetricSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """NodeMetricSpec: the collect policy koordlet (or koordbus' agent) applies."""

    metric_collect_policy: koordinator.MetricCollectPolicyJSON | None = None


class NodeMetricInfoJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`status.nodeMetric`; the NUMA usages are not read here."""

    node_usage: ResourceMapJSON = ResourceMapJSON()
    system_usage: ResourceMapJSON = ResourceMapJSON()
    aggregated_node_usages: list[AggregatedUsage] | None = None


class NodeMetricStatusJSON(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    update_time: dt.datetime | None = None
    node_metric: NodeMetricInfoJSON | None = None
    pods_metric: list[PodMetricJSON | None] | None = None
    """Go writes a nil entry as `null`; readers skip those."""
    host_application_metric: list[HostApplicationMetricJSON] | None = None
    prod_reclaimable_metric: ProdReclaimableMetricJSON | None = None


class NodeMetricObject(msgspec.Struct, frozen=True, kw_only=True):
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    spec: NodeMetricSpec = NodeMetricSpec()
    status: NodeMetricStatusJSON = NodeMetricStatusJSON()


# --- integer view


class PodUsage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One `podsMetric` entry: the pod's usage and the classes koordlet reported for it."""

    namespace: str
    name: str
    usage: resources.ResourceList
    priority: str = ""
    qos: str = ""

    @property
    def key(self) -> str:
        """`namespace/name`, as kube.pod_key."""
        return f"{self.namespace}/{self.name}"


class HostApplicationUsage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    usage: resources.ResourceList
    priority: str = ""
    qos: str = ""


class NodeUsageSnapshot(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A NodeMetric status as integers, cpu and memory only.

    `update_time` None means the status was never written (the calculations degrade). `node_usage` and
    `prod_reclaimable` are None when their ResourceMap carries no `resources` at all, which Koordinator tells
    apart from an empty or partial one.
    """

    update_time: float | None
    node_usage: resources.ResourceList | None = None
    system_usage: resources.ResourceList = {}
    pods: tuple[PodUsage, ...] = ()
    host_applications: tuple[HostApplicationUsage, ...] = ()
    prod_reclaimable: resources.ResourceList | None = None


def _cpu_and_memory(raw: Mapping[str, quantity.RawQuantity] | None) -> resources.ResourceList:
    return resources.mask(kube.resource_amounts(raw), _CPU_AND_MEMORY)


def usage_snapshot(obj: NodeMetricObject) -> NodeUsageSnapshot:
    """The integer view of a decoded NodeMetric."""
    status = obj.status
    info = status.node_metric or NodeMetricInfoJSON()
    reclaimable = status.prod_reclaimable_metric
    return NodeUsageSnapshot(
        update_time=None if status.update_time is None else kube.unix_seconds(status.update_time),
        node_usage=None if info.node_usage.resources is None else _cpu_and_memory(info.node_usage.resources),
        system_usage=_cpu_and_memory(info.system_usage.resources),
        pods=tuple(
            PodUsage(
                namespace=pod.namespace,
                name=pod.name,
                usage=_cpu_and_memory(pod.pod_usage.resources),
                priority=pod.priority,
                qos=pod.qos,
            )
            for pod in status.pods_metric or ()
            if pod is not None
        ),
        host_applications=tuple(
            HostApplicationUsage(
                name=app.name, usage=_cpu_and_memory(app.usage.resources), priority=app.priority, qos=app.qos
            )
            for app in status.host_application_metric or ()
        ),
        prod_reclaimable=(
            None
            if reclaimable is None or reclaimable.resource.resources is None
            else _cpu_and_memory(reclaimable.resource.resources)
        ),
    )


def _map_or_none(resource_map: ResourceMap) -> resources.ResourceList | None:
    """None for a map with no data (empty `resources`, as ResourceMap documents), else cpu and memory."""
    amounts = resource_map.resources
    if not amounts:
        return None
    # Runs for every pod of every NodeMetric: the two lookups, not a general mask.
    out: resources.ResourceList = {}
    if (cpu := amounts.get(resources.CPU)) is not None:
        out[resources.CPU] = cpu
    if (memory := amounts.get(resources.MEMORY)) is not None:
        out[resources.MEMORY] = memory
    return out


def snapshot_from_computed(event: NodeMetricComputed) -> NodeUsageSnapshot:
    """The integer view of a NodeMetricComputed event (amounts there are already cpu millicores and bytes).

    updateTime is the report time. Its prod reclaimable metric is None before the predictor's first round or after a
    failed one (the mid calculation then counts reclaimable as 0, and says so).
    """
    status = event.status
    return NodeUsageSnapshot(
        prod_reclaimable=None if status.prod_reclaimable is None else _map_or_none(status.prod_reclaimable),
        update_time=event.report_time,
        node_usage=_map_or_none(status.node_metric.node_usage),
        system_usage=_map_or_none(status.node_metric.system_usage) or {},
        pods=tuple(
            PodUsage(
                namespace=pod.namespace,
                name=pod.name,
                usage=_map_or_none(pod.pod_usage) or {},
                priority=pod.priority,
                qos=pod.qos,
            )
            for pod in status.pods_metric
        ),
        host_applications=tuple(
            HostApplicationUsage(name=app.name, usage=_map_or_none(app.usage) or {}, priority=app.priority, qos=app.qos)
            for app in status.host_applications
        ),
    )
