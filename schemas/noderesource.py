"""NodeResourceComputed: one batch/mid decision for one node, with its explanation and whether the write is due.

Published by services.noderesource on `koord.v1.noderesource.<node>.computed` (stream KOORD_NODERESOURCE, JSON),
read by the k8s writer (which applies `resources` and `annotations` when `write_due`, and `nodemetric_spec` to the
node's NodeMetric on every decision carrying one), the API's resource history,
and services.noderesource itself at start-up (the last decision per node seeds its hysteresis). The explanation
structs (`ResourceExplanation`, `PodAccounting`) are defined here because they are part of the wire contract;
services.noderesource.core builds them. `computed_at` is the time the decision was made *for* (the triggering
event's time, or the resync tick's), so replaying the same inputs yields the same event and the same msg id.
The structs are `gc=False`: they hold only strings, numbers and containers of those, so they cannot form
reference cycles, and the service's per-node copies stay out of the garbage collector's scans.
`ColocationConfigStatus`, on the same stream, says whether the colocation ConfigMap is in effect (the k8s writer
turns it into Kubernetes Events).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from schemas import vocab
from schemas.node import MetricCollectPolicy, NodeName, UnixSeconds

RESOURCE_NAMES: Final = (vocab.BATCH_CPU, vocab.BATCH_MEMORY, vocab.MID_CPU, vocab.MID_MEMORY)

Trigger = Literal["node", "pods", "nodemetric", "config", "resync", "topology"]
"""What made the service recompute: the Node, one of its pods, its NodeMetric, the colocation config, the periodic
resync, or the node's NodeResourceTopology."""
Outcome = Literal["computed", "degraded", "disabled"]
"""computed: batch ran; degraded: NodeMetric missing or stale, batch and mid removed; disabled: colocation off."""
Amount = Annotated[int, msgspec.Meta(ge=0)]


class ResourceExplanation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One resource's value and why: the formula, its terms and the formula with the numbers filled in.

    `value` None means the resource is removed from the node; `reason` then says why.
    """

    value: int | None
    formula: str = ""
    terms: dict[str, int] = {}
    message: str = ""
    policy: str = ""
    note: str = ""
    """A caveat about the inputs (a missing metric counted as 0)."""
    reason: str = ""


class PodAccounting(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """How the batch calculation classified the pods and pod metrics it was given."""

    high_priority: int = 0
    high_priority_without_metric: int = 0
    high_priority_lse: int = 0
    low_priority_skipped: int = 0
    not_running_or_pending_skipped: int = 0
    dangling_metrics_counted: int = 0
    dangling_metrics_skipped: int = 0


class NodeResourceComputed(msgspec.Struct, frozen=True, kw_only=True, tag="noderesource.computed.v1", gc=False):
    """The batch/mid resources decided for one node, as they would be written on it."""

    node: NodeName
    computed_at: UnixSeconds
    """The time the calculation ran for (staleness of the NodeMetric is judged against it)."""
    trigger: tuple[Trigger, ...]
    """What changed since the previous decision, sorted; several when one fetched batch carried several."""
    outcome: Outcome
    reason: str = ""
    """Why the resources were removed (degraded or disabled); empty when computed."""
    resources: dict[str, Amount | None]
    """Each batch/mid resource as written to status.capacity and .allocatable after prepare (None: delete it)."""
    annotations: dict[str, str] = {}
    """Node annotations to set with the resources (originExtendedAllocatable)."""
    explanation: dict[str, ResourceExplanation] = {}
    """Per resource, the calculated value with its formula, before prepare."""
    prepare_steps: dict[str, list[str]] = {}
    """Per resource, what prepare did to the calculated value (cpu normalization, third-party allocations)."""
    pods: PodAccounting = PodAccounting()
    write_due: bool
    write_reason: str
    """The needSync outcome: first write, which resource moved past resourceDiffThreshold, updateTimeThresholdSeconds
    elapsed, or "up to date"."""
    last_write_at: UnixSeconds | None = None
    """When the previous due write was decided (the hysteresis baseline); None when there was none."""
    last_write_resources: dict[str, Amount] = {}
    """The resources of that previous due write, absent ones left out (what resourceDiffThreshold compared with)."""
    node_config: str = ""
    """The name of the nodeConfigs entry whose selector matched the node, empty for the cluster strategy."""
    warnings: tuple[str, ...] = ()
    """Node annotations or labels that were ignored, and a ConfigMap content that is not in effect."""
    smoothing: dict[str, str] = {}
    """Per resource the opt-in smoothing policy held (services.noderesource.smoothing), what it held it at, from
    which calculated value and why; empty when smoothing is off or changed nothing."""
    nodemetric_spec: MetricCollectPolicy | None = None
    """The node's NodeMetric `.spec.metricCollectPolicy` (spec §1.3): its merged colocation strategy's metric
    collect policy when that strategy is enabled, else the default spec. None when the ConfigMap is in error status
    (the NodeMetric keeps whatever spec it has), and in decisions published before this field existed. The k8s
    writer owns the NodeMetric spec from it."""
    zones: dict[str, dict[str, int | None]] = {}
    """NUMA-level batch resources (spec §2.7), present when the node has a NodeResourceTopology listing cpu or
    memory and the batch calculation ran: zone name → kubernetes.io/batch-cpu (millicore count) and
    kubernetes.io/batch-memory (bytes, rounded up from the milli-unit quantity Koordinator writes)."""
    zone_explanation: dict[str, dict[str, ResourceExplanation]] = {}
    """Per zone and resource, the formula with its numbers (as `explanation` for the node)."""
    meta_due: bool = False
    """Koordinator's needSyncMeta (§2.3 step 7.3): the node's `cpu-normalization-ratio` annotation differs from the
    one decided (services.noderesource.cpu_normalization), so the node's annotations are written even when its
    resources are not due."""
    cpu_normalization: str = ""
    """Why the node's cpu-normalization-ratio annotation is decided as it is, or left alone."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.resources) - set(RESOURCE_NAMES))
        if unknown:
            raise ValueError(f"resources: unknown resource names {unknown}")
        if self.outcome != "computed" and not self.reason:
            raise ValueError(f"outcome {self.outcome} needs a reason")
        if not self.trigger:
            raise ValueError("trigger must name at least one cause")
        if not self.write_reason:
            raise ValueError("write_reason must not be empty")

    @property
    def node_write_due(self) -> bool:
        """Whether the Node is to be written: its resources (`write_due`) or only its annotations (`meta_due`)."""
        return self.write_due or self.meta_due

    @property
    def written_amounts(self) -> dict[str, int]:
        """The resources present after this decision (absent ones left out), as the hysteresis compares them."""
        return {name: value for name, value in self.resources.items() if value is not None}


NODERESOURCE_COMPUTED_DECODER: msgspec.json.Decoder[NodeResourceComputed] = msgspec.json.Decoder(NodeResourceComputed)


class ColocationConfigStatus(msgspec.Struct, frozen=True, kw_only=True, tag="noderesource.config-status.v1"):
    """Whether the `slo-controller-config` ConfigMap's colocation-config is in effect, published by
    services.noderesource on `koord.v1.noderesource.config.status` (a last-value subject of KOORD_NODERESOURCE)
    whenever its error differs from the last status there (none there counts as no error). The k8s writer turns it
    into a Kubernetes Event on the ConfigMap: a Warning per distinct error, a Normal one on recovery."""

    error: str | None
    """Why the ConfigMap's current content is not in effect (the previous configuration is kept); None when it is."""
    previous_error: str | None = None
    """The error of the status published before this one; None when there was none. A recovery is error None with
    a previous_error."""
    resource_version: str = ""
    """The ConfigMap's resourceVersion when the error changed, empty when not known (no ConfigMap seen)."""
    at: UnixSeconds
    """The service clock's time when the change was seen."""


COLOCATION_CONFIG_STATUS_DECODER: msgspec.json.Decoder[ColocationConfigStatus] = msgspec.json.Decoder(
    ColocationConfigStatus
)
