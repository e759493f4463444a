"""What services.k8s sees in the cluster, published as state-transfer events on last-value subjects.

One subject per object (`koord.v1.k8s.<kind>.<namespace>.<name>`, stream KOORD_CLUSTER keeps one message per
subject), so a service that starts reads the current cluster state by replaying the last message of every
subject, then follows changes. A deleted object leaves a tombstone (`deleted=True`, object None) as its last value.
`resource_version` is the object's resourceVersion when seen; `observed_at` is the bridge's clock (unix seconds).

Published by services.k8s; read by services.noderesource (nodes, pods, the slo-controller-config ConfigMap, node
resource topologies), the slo, quota, loadaware and migration services, and services.webhook (ClusterColocationProfiles,
Namespaces and PriorityClasses: what a Pod's mutation at CREATE reads, ADMISSION_EVENT_DECODER).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas import topology
from schemas.node import NodeName, UnixSeconds
from schemas.scheduling import SchedulingNode, SchedulingPod

ObjectName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]


class NodeObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.node_observed.v1"):
    """A Node as listed or watched, or its tombstone."""

    name: NodeName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    node: SchedulingNode | None = None
    """With the scheduling fields (spec.unschedulable, spec.taints) the descheduler's nodeFit reads."""


class PodObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.pod_observed.v1"):
    """A Pod as listed or watched, or its tombstone. `node_name` is spec.nodeName ("" while unscheduled), kept
    on the tombstone too so a reader can drop the pod from the right node."""

    namespace: ObjectName
    name: ObjectName
    observed_at: UnixSeconds
    uid: str = ""
    node_name: str = ""
    resource_version: str = ""
    deleted: bool = False
    pod: SchedulingPod | None = None
    """With the scheduling fields (nodeSelector, required node affinity, tolerations) nodeFit reads."""


class ConfigMapObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.configmap_observed.v1"):
    """A ConfigMap the bridge watches (the slo-controller-config one), with its data, or its tombstone."""

    namespace: ObjectName
    name: ObjectName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    data: dict[str, str] = {}


MAX_CPU_BASIC_INFO = 4096
"""koordlet's cpu-basic-info annotation is a few hundred bytes; a longer one is not read."""


class NodeTopologyObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.nrt_observed.v1"):
    """A NodeResourceTopology (topology.node.k8s.io/v1alpha1, named after its node) as listed or watched, with its
    zones, or its tombstone."""

    name: NodeName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    zones: list[topology.Zone] | None = None
    cpu_basic_info: Annotated[str, msgspec.Meta(max_length=MAX_CPU_BASIC_INFO)] = ""
    """Its `node.koordinator.sh/cpu-basic-info` annotation (the node's CPU model, hyper-threading and turbo, as its
    agent reports them), for CPU normalization; empty when absent or longer than MAX_CPU_BASIC_INFO."""


class WorkloadObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.workload_observed.v1"):
    """A pod controller (apps/v1 ReplicaSet, StatefulSet, Deployment, batch/v1 Job …) with its expected replicas
    (spec.replicas; spec.parallelism for a Job), or its tombstone. Read by services.migration."""

    namespace: ObjectName
    name: ObjectName
    observed_at: UnixSeconds
    api_version: str = ""
    kind: str = ""
    uid: str = ""
    replicas: int = 0
    resource_version: str = ""
    deleted: bool = False


ClusterEvent = NodeObserved | PodObserved | ConfigMapObserved | NodeTopologyObserved
CLUSTER_EVENT_DECODER: msgspec.json.Decoder[ClusterEvent] = msgspec.json.Decoder(ClusterEvent)

PodWorkloadOrNode = PodObserved | WorkloadObserved | NodeObserved | ConfigMapObserved
POD_WORKLOAD_OR_NODE_DECODER: msgspec.json.Decoder[PodWorkloadOrNode] = msgspec.json.Decoder(PodWorkloadOrNode)
"""What services.migration reads of KOORD_CLUSTER."""


class ProfileMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The metadata of a ClusterColocationProfile the webhook reads: its name (profiles apply in name order) and
    annotations (config.koordinator.sh/skip-update-resources)."""

    name: ObjectName
    annotations: dict[str, str] = {}
    labels: dict[str, str] = {}
    """Read by no rule (§10.1): kept so a profile made through the REST API reads back as it was written."""


class ColocationProfile(msgspec.Struct, frozen=True, kw_only=True):
    """A ClusterColocationProfile (config.koordinator.sh/v1alpha1, cluster-scoped): its `spec` as written (the CRD's
    schema checked it; what each field does is services.webhook.colocation's, which refuses a value it cannot use
    when a Pod matches)."""

    metadata: ProfileMeta
    spec: dict[str, Any] = {}


class ColocationProfileObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.ccp_observed.v1"):
    """A ClusterColocationProfile as listed or watched, or its tombstone."""

    name: ObjectName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    profile: ColocationProfile | None = None


class NamespaceObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.namespace_observed.v1"):
    """A Namespace's labels (what a profile's namespaceSelector matches), or its tombstone."""

    name: ObjectName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    labels: dict[str, str] = {}


class PriorityClassObserved(msgspec.Struct, frozen=True, kw_only=True, tag="k8s.priorityclass_observed.v1"):
    """A PriorityClass (scheduling.k8s.io/v1): the priority and preemption policy a profile's priorityClassName
    gives a Pod, or its tombstone. `preemption_policy` None: the PriorityClass leaves it unset."""

    name: ObjectName
    observed_at: UnixSeconds
    resource_version: str = ""
    deleted: bool = False
    value: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] = 0
    preemption_policy: str | None = None


AdmissionEvent = ColocationProfileObserved | NamespaceObserved | PriorityClassObserved
ADMISSION_EVENT_DECODER: msgspec.json.Decoder[AdmissionEvent] = msgspec.json.Decoder(AdmissionEvent)
"""What services.webhook reads of KOORD_CLUSTER."""
