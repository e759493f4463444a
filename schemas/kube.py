"""The subset of Kubernetes objects koordbus reads (Node, Pod, ObjectMeta), and what Koordinator derives from a pod.

Decoded from `koordbus calc` input today and from services.k8s watch events later; read by services.noderesource
(batch/mid), and by the quota, migration and scheduler work to come. The structs follow the API's JSON
(camelCase, unknown fields ignored) and keep quantities as written; every quantity is checked while decoding, so
a bad one fails with its JSON path (`$.pods[0].spec.containers[1].resources.requests.cpu: cannot parse …`).
The helpers turn them into integer ResourceLists (schemas.resources) and classes (schemas.vocab):

* `pod_request` is Kubernetes' effective pod request (component-helpers `PodRequests`, as vendored by
  Koordinator v1.35): the sum over containers, raised to the largest init-container step, pod-level requests
  overriding cpu/memory/hugepages when set, plus overhead.
* `pod_kube_qos` is `status.qosClass`, or Kubernetes' QoS computed from the containers when the status has none.
* `pod_priority_class` / `pod_qos_class` / `pod_priority_value` are Koordinator's "WithDefault" derivations (§0).

Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

from schemas import quantity, resources, vocab

RawResourceList = dict[str, quantity.RawQuantity]
"""A ResourceList as written in an object: resource name -> quantity string (or a bare number)."""

PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"

RESTART_ALWAYS: Final = "Always"
"""An init container with this restartPolicy is a sidecar: it keeps running beside the app containers."""

_QOS_COMPUTE_RESOURCES: Final = (resources.CPU, resources.MEMORY)


def require_quantities(field: str, raw: Mapping[str, quantity.RawQuantity] | None) -> None:
    """Fail decoding on a quantity that does not parse.

    The message starts with `.field.resource` so koordbus.calc can append it to the struct's JSON path.
    """
    if raw is None:
        return
    try:
        quantity.resource_list(raw)
    except quantity.QuantityError as err:
        raise ValueError(f".{field}.{err}") from None


def resource_amounts(raw: Mapping[str, quantity.RawQuantity] | None) -> resources.ResourceList:
    """Integer amounts of a decoded (hence valid) quantity map; None is the empty list."""
    return quantity.resource_list(raw) if raw else {}


# --- metadata


class OwnerReference(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    resource_version: str = ""
    owner_references: list[OwnerReference] = []
    creation_timestamp: dt.datetime | None = None
    deletion_timestamp: dt.datetime | None = None
    deletion_grace_period_seconds: int | None = None


# --- Node


def unix_seconds(moment: dt.datetime) -> float:
    """A Kubernetes time as seconds since the epoch; one without an offset is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """None means the map is absent, which Koordinator sometimes treats differently from an empty one."""

    capacity: RawResourceList | None = None
    allocatable: RawResourceList | None = None

    def __post_init__(self) -> None:
        require_quantities("capacity", self.capacity)
        require_quantities("allocatable", self.allocatable)


class Node(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ObjectMeta = ObjectMeta()
    status: NodeStatus = NodeStatus()


def node_capacity(node: Node) -> resources.ResourceList:
    return resource_amounts(node.status.capacity)


def node_allocatable(node: Node) -> resources.ResourceList:
    return resource_amounts(node.status.allocatable)


# --- Pod


class ResourceRequirements(msgspec.Struct, frozen=True, kw_only=True):
    requests: RawResourceList | None = None
    limits: RawResourceList | None = None

    def __post_init__(self) -> None:
        require_quantities("requests", self.requests)
        require_quantities("limits", self.limits)


class Container(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str = ""
    resources: ResourceRequirements = ResourceRequirements()
    restart_policy: str | None = None
    """Only init containers carry one; "Always" makes the init container a sidecar."""


class Volume(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What the descheduler's evictability checks read of a pod volume: which kind of source it is."""

    name: str = ""
    persistent_volume_claim: dict[str, Any] | None = None
    empty_dir: dict[str, Any] | None = None
    host_path: dict[str, Any] | None = None


class PodSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_name: str = ""
    scheduler_name: str = ""
    priority: int | None = None
    priority_class_name: str = ""
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    """None when absent or null (Go writes a pod without containers as `"containers": null`)."""
    overhead: RawResourceList | None = None
    resources: ResourceRequirements | None = None
    """Pod-level resources (Kubernetes PodLevelResources)."""
    volumes: list[Volume] | None = None

    def __post_init__(self) -> None:
        require_quantities("overhead", self.overhead)


class PodCondition(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    type: str = ""
    status: str = ""
    last_transition_time: dt.datetime | None = None
    """When the condition last changed (services.loadaware dates a pod's assignment by PodScheduled)."""


class PodStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    phase: str = ""
    qos_class: str = ""
    conditions: list[PodCondition] | None = None


def pod_ready(pod: Pod) -> bool:
    """The pod's Ready condition is True."""
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


def controller_of(meta: ObjectMeta) -> OwnerReference | None:
    """The owner reference marked controller=true, if any."""
    return next((ref for ref in meta.owner_references if ref.controller), None)


class Pod(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


def pod_key(pod: Pod) -> str:
    """`namespace/name`, the key NodeMetric's podsMetric entries are matched by."""
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def is_running_or_pending(pod: Pod) -> bool:
    return pod.status.phase in (PHASE_RUNNING, PHASE_PENDING)


def _is_pod_level_resource(name: str) -> bool:
    return name in (resources.CPU, resources.MEMORY) or name.startswith("hugepages-")


def pod_request(pod: Pod) -> resources.ResourceList:
    """Kubernetes' effective request of the whole pod, every resource it names.

    Regular containers run together, so their requests add up. Init containers run one at a time before them,
    except sidecars (restartPolicy Always), which start in order and keep running: the step of init container i
    needs its own request plus every sidecar started before it, and each sidecar also adds to the running total.
    The pod needs the larger of the running total and the largest step, per resource. Pod-level requests, when
    the pod sets cpu/memory/hugepages there, replace the container figure for those resources. Overhead
    (RuntimeClass) comes on top.
    """
    total = _pod_total(pod, "requests")
    return resources.add(total, resource_amounts(pod.spec.overhead))


def pod_limit(pod: Pod) -> resources.ResourceList:
    """Kubernetes' effective pod limit (PodLimits): summed like pod_request, over limits; overhead is added only to
    the resources that have a limit (a resource without one stays unlimited)."""
    total = _pod_total(pod, "limits")
    overhead = resource_amounts(pod.spec.overhead)
    return {name: amount + overhead.get(name, 0) if amount else amount for name, amount in total.items()}


def _pod_total(pod: Pod, field: Literal["requests", "limits"]) -> resources.ResourceList:
    """pod_request's containers, init steps and pod-level override, over `requests` or `limits`, before overhead."""
    total: resources.ResourceList = {}
    for container in pod.spec.containers or ():
        total = resources.add(total, resource_amounts(getattr(container.resources, field)))
    sidecars: resources.ResourceList = {}
    largest_init_step: resources.ResourceList = {}
    for container in pod.spec.init_containers or ():
        amounts = resource_amounts(getattr(container.resources, field))
        if container.restart_policy == RESTART_ALWAYS:
            total = resources.add(total, amounts)
            sidecars = resources.add(sidecars, amounts)
            step = sidecars
        else:
            step = resources.add(amounts, sidecars)
        largest_init_step = resources.max_rl(largest_init_step, step)
    total = resources.max_rl(total, largest_init_step)
    pod_level = pod.spec.resources
    if pod_level is not None:
        for name, amount in resource_amounts(getattr(pod_level, field)).items():
            if _is_pod_level_resource(name):
                total[name] = amount
    return total


def compute_kube_qos(containers: Iterable[Container]) -> str:
    """Kubernetes' QoS class from container requests and limits (cpu and memory only, zero values ignored).

    BestEffort: no container asks for or limits cpu or memory. Guaranteed: every container limits both, and the
    summed requests equal the summed limits for each resource. Otherwise Burstable. Pod-level resources are not
    considered (the kubectl helper Koordinator calls does not read them either).
    """
    requests: resources.ResourceList = {}
    limits: resources.ResourceList = {}
    guaranteed = True
    for container in containers:
        positive_requests = _positive_qos_amounts(container.resources.requests)
        positive_limits = _positive_qos_amounts(container.resources.limits)
        requests = resources.add(requests, positive_requests)
        limits = resources.add(limits, positive_limits)
        if not all(name in positive_limits for name in _QOS_COMPUTE_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return vocab.KUBE_QOS_BESTEFFORT
    if guaranteed and requests.keys() == limits.keys() and all(limits[k] == v for k, v in requests.items()):
        return vocab.KUBE_QOS_GUARANTEED
    return vocab.KUBE_QOS_BURSTABLE


def _positive_qos_amounts(raw: Mapping[str, quantity.RawQuantity] | None) -> resources.ResourceList:
    return {k: v for k, v in resource_amounts(raw).items() if k in _QOS_COMPUTE_RESOURCES and v > 0}


def pod_kube_qos(pod: Pod) -> str:
    """`status.qosClass`, or the class Kubernetes would compute when the status does not carry one."""
    if pod.status.qos_class:
        return pod.status.qos_class
    return compute_kube_qos([*(pod.spec.containers or ()), *(pod.spec.init_containers or ())])


def pod_qos_class(pod: Pod) -> str:
    """Koordinator's QoS class (LSE, LSR, LS, BE, SYSTEM or ""): the koordinator.sh/qosClass label when it names
    a known class, else derived from the kube QoS (Guaranteed → LSR, Burstable → LS, BestEffort → BE)."""
    return vocab.qos_class_with_default(pod.metadata.labels, pod_kube_qos(pod))


def pod_priority_class(pod: Pod) -> str:
    """Koordinator's priority class (koord-prod/mid/batch/free or ""): the koordinator.sh/priority-class label,
    else the range of spec.priority, else derived from the QoS class (prod for SYSTEM/LSE/LSR/LS, batch for BE)."""
    return vocab.priority_class_with_default(pod.metadata.labels, pod.spec.priority, pod_kube_qos(pod))


# --- scheduling.koordinator.sh/resource-status

ANNOTATION_RESOURCE_STATUS: Final = "scheduling.koordinator.sh/resource-status"


class _NUMANodeResource(msgspec.Struct, frozen=True, kw_only=True):
    node: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] = 0
    """int32 in Go; absent reads as 0 there."""
    resources: dict[str, quantity.RawQuantity] | None = None

    def __post_init__(self) -> None:
        if self.resources:
            quantity.resource_list(self.resources)


class _ResourceStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    cpuset: str = ""
    numa_node_resources: list[_NUMANodeResource] | None = None


def resource_status_numa_nodes(annotations: Mapping[str, str]) -> tuple[int, ...]:
    """The NUMA node ids of the pod's `resource-status` annotation, in order (duplicates kept: Koordinator counts
    each entry when it splits the pod across them). Absent, or not JSON Go would decode into the status (a bad
    quantity, a node id that is not an int32): no allocation, (). Ids outside the node's zones are the caller's
    to ignore."""
    text = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if text is None:
        return ()
    try:
        status = msgspec.convert(json.loads(text), _ResourceStatus | None)
    except (ValueError, quantity.QuantityError):  # JSONDecodeError and msgspec.ValidationError are ValueErrors
        return ()
    if status is None or not status.numa_node_resources:
        return ()
    return tuple(entry.node for entry in status.numa_node_resources)


def resource_status_cpuset(annotations: Mapping[str, str]) -> str:
    """The cpuset the scheduler allocated the pod (its `resource-status` annotation's `cpuset`, the kernel's list
    format, unchecked); "" when absent or not JSON Go would decode into the status."""
    text = annotations.get(ANNOTATION_RESOURCE_STATUS)
    if text is None:
        return ""
    try:
        status = msgspec.convert(json.loads(text), _ResourceStatus | None)
    except (ValueError, quantity.QuantityError):
        return ""
    return "" if status is None else status.cpuset


class PodSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the batch/mid calculation reads of a pod, derived once per pod version (`summarize_pod`).

    A node's decision walks all its pods; with these the walk reads fields instead of re-deriving classes and
    re-parsing quantities, and a million of them stay small and outside the garbage collector's scans (no field
    can hold a reference cycle: strings, a bool and a str → int dict).
    """

    key: str
    """`namespace/name`, as `pod_key`."""
    node_name: str
    """spec.nodeName ("" when unscheduled)."""
    active: bool
    """Running or Pending (`is_running_or_pending`)."""
    priority_class: str
    """`pod_priority_class`."""
    qos_class: str
    """`pod_qos_class`."""
    request: resources.ResourceList
    """`pod_request`: every resource the pod requests."""
    numa_nodes: tuple[int, ...] = ()
    """`resource_status_numa_nodes`: the NUMA nodes the scheduler allocated the pod on (§2.7)."""


def summarize_pod(pod: Pod) -> PodSummary:
    return PodSummary(
        key=pod_key(pod),
        node_name=pod.spec.node_name,
        active=is_running_or_pending(pod),
        priority_class=pod_priority_class(pod),
        qos_class=pod_qos_class(pod),
        request=pod_request(pod),
        numa_nodes=resource_status_numa_nodes(pod.metadata.annotations),
    )


def pod_priority_value(pod: Pod) -> int:
    """spec.priority when set and non-zero, else the default value of the pod's priority class (0 for none)."""
    return vocab.priority_value_with_default(pod.metadata.labels, pod.spec.priority, pod_kube_qos(pod))
