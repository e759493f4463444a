"""The writing half's pure decisions: what to write to Kubernetes for one decision, or that nothing needs writing.

The NodeMetric spec (§1.3) is owned by the NodeResourceComputed decisions: each one carrying a `nodemetric_spec`
makes sure the node's NodeMetric exists with that spec (`nodemetric_with_spec` to create it without status,
`nodemetric_spec_update` when an existing object's spec differs). From a NodeMetricComputed: the object to create
when it is missing (with the node's last decided spec if there is one, else the event's; status cannot be set on
create) and the object with its new status for the status subresource; a status write never touches the spec.
A Node's tombstone deletes its NodeMetric (`nodemetric_deleted` says what that did).
From a ColocationConfigStatus: the core/v1 Event on the colocation ConfigMap (`config_event`), named after its
content so that creating it twice is an AlreadyExists, not a second Event.
From a NodeResourceComputed with `write_due`: the JSON merge patch of the Node's /status that sets or removes the
batch/mid extended resources in capacity and allocatable (spec §2.5: batch-cpu/mid-cpu as plain millicore counts,
memory in bytes; amounts compared, not strings, since the server may respell a quantity), guarded by the Node's
resourceVersion, and the merge patch of its annotations. Every builder returns None when the object already holds
those values, so the shells (services.k8s.writer) make no write at all then. Also what record-only mode keeps
(`WriteRecorder`: the objects as they would be after the writes, and a bounded log), and the small bookkeeping the
shell needs with the time passed in: the per-node rate limit of NodeMetric status writes and the consecutive-failure
health. No I/O, clock or event loop here.
"""

from __future__ import annotations

import copy
import hashlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from schemas import koordinator, quantity, vocab
from schemas.node import MetricCollectPolicy, NodeMetricComputed
from schemas.noderesource import RESOURCE_NAMES, ColocationConfigStatus, NodeResourceComputed

Json = dict[str, Any]
Action = Literal["created", "updated", "deleted", "unchanged", "skipped"]

NODEMETRIC_GROUP, NODEMETRIC_VERSION = koordinator.API_VERSION.split("/")
NODEMETRIC_PLURAL: Final = "nodemetrics"
STATUS_LISTS: Final = ("capacity", "allocatable")
"""The node status resource lists Koordinator writes each extended resource to, with the same value."""
OBJECT_NODEMETRIC: Final = "nodemetric"
OBJECT_NODE: Final = "node"
OBJECT_EVENT: Final = "event"
OBJECT_TOPOLOGY: Final = "noderesourcetopology"
TOPOLOGY_GROUP, TOPOLOGY_VERSION, TOPOLOGY_PLURAL = "topology.node.k8s.io", "v1alpha1", "noderesourcetopologies"
ZONE_RESOURCES: Final = (vocab.BATCH_CPU, vocab.BATCH_MEMORY)
CREATED: Final = "created"
EVENT_REASON_INVALID: Final = "InvalidColocationConfig"
"""Reason of the Warning Event for a colocation ConfigMap whose content is rejected."""
EVENT_REASON_RECOVERED: Final = "ColocationConfigApplied"
"""Reason of the Normal Event once the ConfigMap's content is in effect again after an error."""
EVENT_COMPONENT: Final = "koordbus-noderesource"
EVENT_MESSAGE_LIMIT: Final = 1024
"""Event messages are cut to this many characters (the API server limits them; a long error stays readable)."""


@dataclass(frozen=True, kw_only=True)
class WriteResult:
    """What one write did to one object."""

    object: str
    """`nodemetric/<node>` or `node/<node>`."""
    action: Action
    changes: tuple[str, ...] = ()
    """What was changed, in words (or, when skipped, why nothing was written)."""


def write_result(kind: str, name: str, changes: list[str]) -> WriteResult:
    """The result of a write that made `changes` (none: the object already held the values)."""
    obj = f"{kind}/{name}"
    if not changes:
        return WriteResult(object=obj, action="unchanged")
    return WriteResult(object=obj, action="created" if CREATED in changes else "updated", changes=tuple(changes))


def not_due(decision: NodeResourceComputed) -> WriteResult:
    return WriteResult(object=f"{OBJECT_NODE}/{decision.node}", action="skipped", changes=("write not due",))


# --- NodeMetric


def nodemetric_with_spec(node: str, spec: MetricCollectPolicy) -> Json:
    """The NodeMetric object to create for `node` with `spec` and no status."""
    return koordinator.nodemetric_object(node, spec, None)


def nodemetric_to_create(event: NodeMetricComputed, spec: MetricCollectPolicy | None = None) -> Json:
    """The NodeMetric object to create for the event's node when a status write finds none: with `spec` (the node's
    last decided spec) when given, else the event's, and no status."""
    return nodemetric_with_spec(event.node, event.spec if spec is None else spec)


def nodemetric_spec_update(current: Json, spec: MetricCollectPolicy) -> Json | None:
    """`current` with `spec` (resourceVersion and status kept, for the update), or None when the spec is the same."""
    wanted = {"metricCollectPolicy": koordinator.collect_policy_to_json(spec)}
    if current.get("spec") == wanted:
        return None
    updated = copy.deepcopy(current)
    updated["spec"] = wanted
    return updated


def nodemetric_status_update(current: Json, event: NodeMetricComputed) -> Json | None:
    """`current` with the event's status (resourceVersion kept), or None when it already holds that status.

    A status older than the one stored is not written back over it either (a redelivery after a newer write).
    """
    wanted = koordinator.nodemetric_status_to_json(event.status, quantities=True)
    stored = current.get("status")
    if stored == wanted or _stored_update_time(stored) > int(event.status.update_time):
        return None
    updated = copy.deepcopy(current)
    updated["status"] = wanted
    return updated


def _stored_update_time(status: object) -> float:
    if not isinstance(status, dict) or not isinstance(status.get("updateTime"), str):
        return float("-inf")
    try:
        return koordinator.parse_rfc3339(status["updateTime"])
    except ValueError:
        return float("-inf")


def nodemetric_deleted(node: str, *, existed: bool) -> WriteResult:
    """The result of deleting a gone node's NodeMetric: deleted, or unchanged when there was none."""
    obj = f"{OBJECT_NODEMETRIC}/{node}"
    if not existed:
        return WriteResult(object=obj, action="unchanged")
    return WriteResult(object=obj, action="deleted", changes=("node gone",))


# --- Event


def config_event(status: ColocationConfigStatus, *, namespace: str, name: str) -> Json | None:
    """The core/v1 Event on the ConfigMap `namespace/name` for a colocation config status (`configmap_event`)."""
    return configmap_event(
        namespace=namespace,
        name=name,
        error=status.error,
        previous_error=status.previous_error,
        resource_version=status.resource_version,
        at=status.at,
        reasons=(EVENT_REASON_INVALID, EVENT_REASON_RECOVERED),
        what="the colocation config",
        component=EVENT_COMPONENT,
    )


def configmap_event(
    *,
    namespace: str,
    name: str,
    error: str | None,
    previous_error: str | None,
    resource_version: str,
    at: float,
    reasons: tuple[str, str],
    what: str,
    component: str,
) -> Json | None:
    """A core/v1 Event on the ConfigMap `namespace/name` about `what` in it: Warning with the error (reason
    `reasons[0]`), Normal on a recovery (no error, a previous one; `reasons[1]`); None when there is nothing to tell.

    The Event's name is derived from the ConfigMap, the error and the resourceVersion, so a redelivered or
    republished status (a restart) names the same Event and its creation is an AlreadyExists, not a duplicate.
    """
    if error is None and previous_error is None:
        return None
    if error is not None:
        event_type, reason, message = "Warning", reasons[0], error
    else:
        event_type, reason = "Normal", reasons[1]
        message = f"{what} is in effect again (previous error: {previous_error})"
    if len(message) > EVENT_MESSAGE_LIMIT:
        message = message[: EVENT_MESSAGE_LIMIT - 1] + "…"
    identity = "\x1f".join((namespace, name, event_type, error or "", resource_version, reason))
    digest = hashlib.blake2b(identity.encode(), digest_size=8).hexdigest()
    timestamp = koordinator.format_rfc3339(at)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{digest}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "namespace": namespace,
            "name": name,
            **({"resourceVersion": resource_version} if resource_version else {}),
        },
        "type": event_type,
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": timestamp,
        "lastTimestamp": timestamp,
        "count": 1,
    }


def event_result(event: Json, *, created: bool) -> WriteResult:
    """The result of creating `event`: created, or unchanged when an Event of that name already existed."""
    obj = f"{OBJECT_EVENT}/{event['metadata']['namespace']}/{event['metadata']['name']}"
    if not created:
        return WriteResult(object=obj, action="unchanged")
    return WriteResult(object=obj, action="created", changes=(f"{event['type']} {event['reason']}",))


# --- Node


@dataclass(frozen=True, kw_only=True)
class NodeWrite:
    """A merge patch for one Node (its /status or its metadata) and what it changes, in words."""

    patch: Json
    changes: tuple[str, ...]
    """One line per changed value: `kubernetes.io/batch-cpu 25000 → 26000`, `kubernetes.io/mid-cpu removed`."""


def _stored_amount(name: str, text: object) -> int | None:
    """The amount a stored quantity stands for; None when absent or unreadable (it is then rewritten)."""
    if not isinstance(text, str | int):
        return None
    try:
        return quantity.amount(name, str(text))
    except quantity.QuantityError:
        return None


def node_status_patch(node: Json, decision: NodeResourceComputed) -> NodeWrite | None:
    """The merge patch of the Node's /status that brings its batch/mid resources to the decision's, guarded by the
    node's resourceVersion; None when the decision is not due or both lists already hold those amounts."""
    if not decision.write_due:
        return None
    status = node.get("status") or {}
    patch_lists: dict[str, dict[str, str | None]] = {}
    changes: list[str] = []
    for list_name in STATUS_LISTS:
        stored = status.get(list_name) or {}
        entries: dict[str, str | None] = {}
        for name in RESOURCE_NAMES:
            if name not in decision.resources:
                continue
            wanted = decision.resources[name]
            present = name in stored
            if wanted is None:
                if present:
                    entries[name] = None
                    changes.append(f"{list_name} {name} removed")
                continue
            if present and _stored_amount(name, stored[name]) == wanted:
                continue
            entries[name] = quantity.format_amount(name, wanted)
            before = stored[name] if present else "absent"
            changes.append(f"{list_name} {name} {before} → {entries[name]}")
        if entries:
            patch_lists[list_name] = entries
    if not patch_lists:
        return None
    version = (node.get("metadata") or {}).get("resourceVersion", "")
    patch: Json = {"status": patch_lists}
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return NodeWrite(patch=patch, changes=tuple(changes))


def node_annotation_patch(node: Json, decision: NodeResourceComputed) -> NodeWrite | None:
    """The merge patch of the Node's metadata setting the decision's annotations; None when not due or already
    set. Annotations of other writers are left alone (a merge patch only names the keys it sets)."""
    if not decision.node_write_due or not decision.annotations:
        return None
    stored: Mapping[str, str] = (node.get("metadata") or {}).get("annotations") or {}
    changed = {key: value for key, value in sorted(decision.annotations.items()) if stored.get(key) != value}
    if not changed:
        return None
    return NodeWrite(
        patch={"metadata": {"annotations": changed}},
        changes=tuple(f"annotation {key} = {value}" for key, value in changed.items()),
    )


def apply_node_status_patch(node: Json, write: NodeWrite) -> Json:
    """The node after a /status merge patch (for record-only mode, which keeps its own copy of each node)."""
    result = copy.deepcopy(node)
    status = result.setdefault("status", {})
    for list_name, entries in write.patch.get("status", {}).items():
        target = status.setdefault(list_name, {})
        for name, value in entries.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
    return result


def apply_annotation_patch(node: Json, write: NodeWrite) -> Json:
    """The node after an annotation merge patch (for record-only mode)."""
    result = copy.deepcopy(node)
    annotations = result.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.update(write.patch.get("metadata", {}).get("annotations", {}))
    return result


# --- record-only mode


@dataclass(frozen=True, kw_only=True)
class RecordedWrite:
    """One write record-only mode would have made."""

    at: float
    object: str
    action: Action
    changes: tuple[str, ...]
    reason: str
    """Why it was due: the decision's write reason, or "NodeMetric report"."""


def topology_with_batch_zones(current: Json, zones: Mapping[str, Mapping[str, int | None]]) -> Json | None:
    """`current` (a NodeResourceTopology) with each zone's kubernetes.io/batch-cpu / batch-memory entries set to the
    decided values, capacity = allocatable = available (spec §2.7; a zone without a value gets zeros), entries kept
    sorted by name; None when the object already holds exactly that. batch-cpu is written as its millicore count."""
    updated = copy.deepcopy(current)
    for zone in updated.get("zones") or []:
        values = zones.get(zone.get("name", ""), {})
        entries = {entry.get("name"): entry for entry in zone.get("resources") or []}
        for name in ZONE_RESOURCES:
            amount = values.get(name) or 0
            text = quantity.format_amount(name, amount)
            held = entries.get(name)
            if held is not None and all(
                quantity.amount(name, held.get(field, "0")) == amount
                for field in ("capacity", "allocatable", "available")
            ):
                continue
            entries[name] = {"name": name, "capacity": text, "allocatable": text, "available": text}
        zone["resources"] = [entries[key] for key in sorted(entries, key=str)]
    return None if updated.get("zones") == current.get("zones") else updated


def topology_changes(zones: Mapping[str, Mapping[str, int | None]]) -> list[str]:
    return [
        f"zone {zone}: " + ", ".join(f"{name} {values.get(name) or 0}" for name in ZONE_RESOURCES)
        for zone, values in sorted(zones.items())
    ]


class WriteRecorder:
    """Keeps, per object (NodeMetric, Node, Event), what it would look like after the writes, and a bounded log of
    the writes themselves.

    It knows nothing of the cluster: a node starts out with no batch/mid resources and no annotations, so the
    first due decision for a node is always recorded as a write. Used by services.k8s.sinks.RecordingSink.
    """

    def __init__(self, *, keep: int) -> None:
        self.nodemetrics: dict[str, Json] = {}
        self.nodes: dict[str, Json] = {}
        self.events: dict[str, Json] = {}
        """Event name → the Event (Events are only ever created)."""
        self.topologies: dict[str, dict[str, dict[str, int | None]]] = {}
        """Node → the NUMA zone batch values that would be written on its NodeResourceTopology."""
        self.log: deque[RecordedWrite] = deque(maxlen=keep)

    def nodemetric_spec(self, node: str, spec: MetricCollectPolicy, *, reason: str, now: float) -> WriteResult:
        """The node's NodeMetric created with `spec`, or its spec brought to `spec` (status kept)."""
        current = self.nodemetrics.get(node)
        changes: list[str] = []
        if current is None:
            current = nodemetric_with_spec(node, spec)
            changes.append(CREATED)
        elif (spec_update := nodemetric_spec_update(current, spec)) is not None:
            current = spec_update
            changes.append("spec updated")
        self.nodemetrics[node] = current
        return self._record(write_result(OBJECT_NODEMETRIC, node, changes), reason=reason, now=now)

    def topology_zones(self, decision: NodeResourceComputed, *, now: float) -> WriteResult:
        """The decision's zone values written on the node's NodeResourceTopology (recorded, the object unknown)."""
        zones = {zone: dict(values) for zone, values in decision.zones.items()}
        changes = [] if self.topologies.get(decision.node) == zones else topology_changes(zones)
        self.topologies[decision.node] = zones
        return self._record(
            write_result(OBJECT_TOPOLOGY, decision.node, changes), reason=decision.write_reason, now=now
        )

    def delete_nodemetric(self, node: str, *, now: float) -> WriteResult:
        """The gone node's NodeMetric removed."""
        existed = self.nodemetrics.pop(node, None) is not None
        return self._record(nodemetric_deleted(node, existed=existed), reason="node deleted", now=now)

    def event(self, event: Json, *, now: float) -> WriteResult:
        """The Event created unless one of its name was already recorded."""
        name = event["metadata"]["name"]
        created = name not in self.events
        self.events.setdefault(name, event)
        return self._record(event_result(event, created=created), reason=event["reason"], now=now)

    def nodemetric(
        self, event: NodeMetricComputed, *, spec: MetricCollectPolicy | None = None, now: float
    ) -> WriteResult:
        """The event's status written; the object created first (with `spec`, else the event's) when missing."""
        name = event.node
        current = self.nodemetrics.get(name)
        changes: list[str] = []
        if current is None:
            current = nodemetric_to_create(event, spec)
            changes.append(CREATED)
        if (status_update := nodemetric_status_update(current, event)) is not None:
            current = status_update
            changes.append(f"status updateTime {status_update['status']['updateTime']}")
        self.nodemetrics[name] = current
        return self._record(write_result(OBJECT_NODEMETRIC, name, changes), reason="NodeMetric report", now=now)

    def node_resources(self, decision: NodeResourceComputed, *, now: float) -> WriteResult:
        name = decision.node
        if not decision.node_write_due:
            return not_due(decision)
        node = self.nodes.get(name) or {"metadata": {"name": name}, "status": {}}
        changes: list[str] = []
        if (status_write := node_status_patch(node, decision)) is not None:
            node = apply_node_status_patch(node, status_write)
            changes.extend(status_write.changes)
        if (annotation_write := node_annotation_patch(node, decision)) is not None:
            node = apply_annotation_patch(node, annotation_write)
            changes.extend(annotation_write.changes)
        self.nodes[name] = node
        return self._record(write_result(OBJECT_NODE, name, changes), reason=decision.write_reason, now=now)

    def _record(self, result: WriteResult, *, reason: str, now: float) -> WriteResult:
        if result.action != "unchanged":
            self.log.append(
                RecordedWrite(at=now, object=result.object, action=result.action, changes=result.changes, reason=reason)
            )
        return result

    def export(self) -> Json:
        """The recorded objects and the log of writes (oldest first), as JSON-ready dicts."""
        return {
            "nodemetrics": [self.nodemetrics[name] for name in sorted(self.nodemetrics)],
            "nodes": [self.nodes[name] for name in sorted(self.nodes)],
            "events": [self.events[name] for name in sorted(self.events)],
            "topologies": {node: self.topologies[node] for node in sorted(self.topologies)},
            "writes": [
                {
                    "at": entry.at,
                    "object": entry.object,
                    "action": entry.action,
                    "changes": list(entry.changes),
                    "reason": entry.reason,
                }
                for entry in self.log
            ],
        }


# --- bookkeeping for the shell


class StatusRateLimit:
    """At most one NodeMetric status write per node every `min_interval` seconds (koordlet: 0.1 QPS)."""

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self._last_write: dict[str, float] = {}

    def earliest(self, node: str, now: float) -> float:
        """When the node's next status write may go out (`now` if it may go now)."""
        last = self._last_write.get(node)
        return now if last is None else max(now, last + self.min_interval)

    def wrote(self, node: str, now: float) -> None:
        self._last_write[node] = now


class WriteHealth:
    """Unhealthy after `threshold` consecutive failed writes; healthy again after one success."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.consecutive_failures = 0
        self.last_error = ""

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    def failed(self, reason: str) -> None:
        self.consecutive_failures += 1
        self.last_error = reason

    @property
    def healthy(self) -> bool:
        return self.consecutive_failures < self.threshold
