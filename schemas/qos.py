"""Events of node QoS (issue 6): the rendered NodeSLO per node, the slo-controller-config's status, and what each node's
agent changed.

`NodeSloRendered` is the value of a node's key in the KOORD_SLO key-value bucket (written by services.slo, read by that
node's agent and by the bridge, which writes the NodeSLO object). `SloConfigStatus` sits on the bucket's `_config` key,
`WatermarksInEffect` on `_watermarks-<service>` keys (the load thresholds the load-aware scheduler and the descheduler
use, services.common.watermarks). `ActuationApplied` is published by an agent on `koord.v1.node.<node>.actuation` after
every round of a QoS loop that changed something, failed on something, or (in dry-run) would have changed something;
`PodEvictionRequested` on `koord.v1.node.<node>.eviction` for each pod its eviction loops pick. All JSON.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas import names

ActuationLoop = Literal[
    "be-cgroup",
    "memory-qos",
    "resctrl",
    "cpu-suppress",
    "cpu-burst",
    "memory-evict",
    "cpu-evict",
    "failsafe",
    "system-config",
]


class NodeSloRendered(msgspec.Struct, frozen=True, kw_only=True, tag="slo.node_slo.v1"):
    """A node's NodeSLO spec as services.slo rendered it (Koordinator's field names, validated by the CRD)."""

    node: str
    spec: dict[str, Any]
    rendered_at: float
    """Unix seconds of the render."""


class WatermarksInEffect(msgspec.Struct, frozen=True, kw_only=True, tag="slo.watermarks_in_effect.v1"):
    """The load watermarks a service decides with, published when it starts and whenever they change."""

    service: Literal["loadaware", "descheduler"]
    at: float
    enabled: bool = True
    """The descheduler: whether load-aware descheduling runs at all."""
    usage_thresholds: dict[str, float] = {}
    """Percent of allocatable: the scheduler's filter line, the descheduler's overloaded line."""
    prod_usage_thresholds: dict[str, float] = {}
    low_thresholds: dict[str, float] = {}
    """The descheduler's destination line."""
    stale_after_seconds: float = 180.0
    schedule_when_stale: bool = False
    avoid_eviction_loops: bool = True
    from_configmap: list[str] = []
    """The load-watermarks-config fields that set these values (the rest come from the service's own args)."""
    configmap_errors: dict[str, str] = {}
    """slo-controller-config keys in error when read by this service (their last good value is in use)."""


class SloConfigStatus(msgspec.Struct, frozen=True, kw_only=True, tag="slo.config_status.v1"):
    """The slo-controller-config keys in error: key → why its last good value (or the default) stays in effect."""

    errors: dict[str, str]
    at: float
    configmap_namespace: str = ""
    configmap_name: str = ""
    resource_version: str = ""
    """Of the ConfigMap content these errors are about."""


class Change(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One value an agent wrote (or would write, in dry-run)."""

    path: str
    """The file, relative to its configured root (cgroup or resctrl)."""
    before: str
    after: str
    reason: str
    """Why this value: the rule and the inputs, e.g. "BE pod cpu.shares = MilliCPUToShares(Σ batch-cpu requests
    2000m)"."""


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One object a loop skipped this round, and why (missing directory, read-only file, bad annotation …)."""

    target: str
    reason: str


class ActuationApplied(msgspec.Struct, frozen=True, kw_only=True, tag="node.actuation_applied.v1"):
    node: str
    loop: ActuationLoop
    at: float
    dry_run: bool
    changes: list[Change]
    problems: list[Problem] = []
    deferred: int = 0
    """Changes left for later rounds: a round moves at most the loop's bound."""
    slo_revision: int = 0
    """The bucket revision (stream sequence) of the NodeSLO in effect; 0: the agent's defaults."""


class PodEvictionRequested(msgspec.Struct, frozen=True, kw_only=True, tag="node.pod_eviction_requested.v1"):
    """A node's agent asks for a pod's eviction; the bridge executes it through the Eviction API (agents hold no
    cluster credentials). The uid is a precondition: a new pod of the same name is never evicted by mistake. It
    comes from a node, outside the control plane's trust: every field is bounded and every name checked, and the
    bridge evicts only a pod bound to the node whose subject the request came on (services.k8s.eviction_executor)."""

    node: Annotated[str, msgspec.Meta(max_length=names.MAX_OBJECT_NAME, pattern=names.SUBDOMAIN_PATTERN)]
    at: Annotated[float, msgspec.Meta(ge=0, le=4_102_444_800)]
    namespace: Annotated[str, msgspec.Meta(max_length=names.MAX_LABEL, pattern=names.NAMESPACE_PATTERN)]
    name: Annotated[str, msgspec.Meta(max_length=names.MAX_OBJECT_NAME, pattern=names.SUBDOMAIN_PATTERN)]
    uid: Annotated[str, msgspec.Meta(max_length=names.MAX_OBJECT_NAME, pattern=names.UID_PATTERN)]
    feature: Annotated[str, msgspec.Meta(max_length=64)]
    """BEMemoryEvict, MemoryEvict or BECPUEvict from an agent; CPUAllocatableEvict or MemoryAllocatableEvict from a
    simulated node (agent.simulate: batch pods past the node's batch allocatable)."""
    reason: Annotated[str, msgspec.Meta(max_length=4096)]


QOS_EVENT_DECODER: msgspec.json.Decoder[NodeSloRendered | SloConfigStatus | ActuationApplied] = msgspec.json.Decoder(
    NodeSloRendered | SloConfigStatus | ActuationApplied
)
NODE_SLO_DECODER: msgspec.json.Decoder[NodeSloRendered] = msgspec.json.Decoder(NodeSloRendered)
SLO_CONFIG_STATUS_DECODER: msgspec.json.Decoder[SloConfigStatus] = msgspec.json.Decoder(SloConfigStatus)
WATERMARKS_IN_EFFECT_DECODER: msgspec.json.Decoder[WatermarksInEffect] = msgspec.json.Decoder(WatermarksInEffect)
ACTUATION_DECODER: msgspec.json.Decoder[ActuationApplied] = msgspec.json.Decoder(ActuationApplied)
EVICTION_DECODER: msgspec.json.Decoder[PodEvictionRequested] = msgspec.json.Decoder(PodEvictionRequested)
