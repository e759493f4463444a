"""REST routes over the noderesource projections: a node's batch/mid resources, their history, the colocation config.

Built into the noderesource component (services.noderesource.component) and mounted by services.api.app under
/api/v1; they read the `NodeResourceReads` it provides (a process without the noderesource store answers 503).
Values come as Kubernetes quantity strings and as our raw integers (millicores for CPU, bytes for memory) with the
calculation's explanation, so "why is batch-memory 146Gi" and "why did it drop" are answered from the API alone:
each history entry carries, per resource, the change against the decision before it. The colocation config is what
services.noderesource recorded: the config in effect, the ConfigMap error that kept an older one in effect, and each
known node's effective strategy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field

from schemas import names, quantity, vocab
from schemas.noderesource import RESOURCE_NAMES, NodeResourceComputed
from services.common.component import required
from services.common.overview import OverviewResources
from services.common.paging import rfc3339
from services.noderesource.store import DecisionRecord, LatestResources, NodeResourceStore

router = APIRouter(prefix="/api/v1")

DEFAULT_HISTORY = 20
MAX_HISTORY = 1000
HistoryLimit = Annotated[int, Query(ge=1, le=MAX_HISTORY, description="decisions to return (default 20)")]


# --- response shapes


class ResourceValue(BaseModel):
    """One batch/mid resource as it would be written on the node."""

    quantity: str | None = Field(
        description="the quantity as written on the node ('146Gi'; batch-cpu and mid-cpu count millicores, so 25 "
        "cores is '25k'); null: removed"
    )
    value: int | None = Field(description="raw amount: millicores for CPU, bytes for memory; null: removed")


class ResourceNow(ResourceValue):
    explanation: dict[str, Any] = Field(
        description="the calculated value before prepare: formula, terms, the formula with numbers, reason"
    )
    prepareSteps: list[str] = Field(description="what prepare did to the calculated value")


class NodeResources(BaseModel):
    """A node's latest batch/mid decision."""

    node: str
    computedAt: str = Field(description="RFC 3339: the time the decision was computed for")
    trigger: list[str] = Field(
        description="what made the service recompute (node, pods, nodemetric, config, resync, topology)"
    )
    outcome: str = Field(description="computed | degraded | disabled")
    degraded: bool = Field(description="NodeMetric missing or stale: batch and mid resources removed")
    disabled: bool = Field(description="co-location disabled for the node: batch and mid resources removed")
    reason: str = Field(description="why the resources were removed (degraded or disabled); empty when computed")
    resources: dict[str, ResourceNow]
    writeDue: bool = Field(description="whether this decision is written to the node (hysteresis passed)")
    writeReason: str
    lastWriteAt: str | None = Field(description="RFC 3339: the previous due write this decision was compared with")
    lastWriteResources: dict[str, ResourceValue]
    annotations: dict[str, str] = Field(description="node annotations written with the resources")
    metaDue: bool = Field(
        default=False,
        description="whether the node's annotations are written although its resources are not due (its "
        "cpu-normalization-ratio changed)",
    )
    cpuNormalization: str = Field(
        default="", description="why the node's cpu-normalization-ratio annotation is what it is, or is left alone"
    )
    nodeConfig: str = Field(description="the nodeConfigs entry whose selector matched; empty: the cluster strategy")
    warnings: list[str]
    pods: dict[str, int] = Field(description="how the calculation classified the node's pods and pod metrics")
    streamSeq: int = Field(description="KOORD_NODERESOURCE sequence of this decision")
    zones: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="NUMA-level batch resources (spec §2.7) when the node has a NodeResourceTopology: zone name → "
        "resource → {value, explanation}; empty otherwise",
    )


class ResourceChange(ResourceValue):
    previous: int | None = Field(description="the amount in the decision before this one; null: removed or unknown")
    delta: int | None = Field(description="value − previous; null when either is absent")
    changed: bool = Field(description="whether the amount differs from the decision before (false for the oldest)")


class ChangedResource(BaseModel):
    """A resource whose amount changed, with why it has its new value."""

    resource: str
    previous: int | None
    value: int | None
    delta: int | None
    explanation: dict[str, Any]
    prepareSteps: list[str]


class HistoryEntry(BaseModel):
    computedAt: str
    streamSeq: int
    trigger: list[str]
    outcome: str
    reason: str
    writeDue: bool
    writeReason: str
    resources: dict[str, ResourceChange]
    changes: list[ChangedResource] = Field(description="the resources that changed against the decision before")


class NodeResourceHistory(BaseModel):
    kind: str = "NodeResourceHistory"
    node: str
    items: list[HistoryEntry] = Field(description="newest first")
    complete: bool = Field(
        description="false when more stored decisions exist beyond `limit` (the server keeps the newest "
        "history_limit per node, so older ones may be gone either way)"
    )


class NodeStrategyView(BaseModel):
    strategy: dict[str, Any] = Field(description="the node's effective strategy (enable: cluster and node both)")
    nodeConfig: str = Field(description="the nodeConfigs entry whose selector matched; empty: the cluster strategy")
    warnings: list[str] = Field(description="node annotations or labels that were ignored, and why")


class ColocationConfigView(BaseModel):
    available: bool = Field(description="a config was loaded (nothing is decided before)")
    error: str | None = Field(description="why the ConfigMap's current content is not in effect")
    updatedAt: str | None = Field(description="RFC 3339: when the service recorded this state")
    cluster: dict[str, Any] | None = Field(description="the effective colocation-config in Koordinator's JSON")
    nodes: dict[str, NodeStrategyView] = Field(description="per node the service knows, its effective strategy")


# --- rendering (pure)


def _quantity(name: str, value: int | None) -> str | None:
    return None if value is None else quantity.format_amount(name, value)


def _plain(value: msgspec.Struct) -> dict[str, Any]:
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(value))
    return decoded


def _explanation(decision: NodeResourceComputed, name: str) -> dict[str, Any]:
    explained = decision.explanation.get(name)
    return {} if explained is None else _plain(explained)


def _names(*maps: Mapping[str, Any]) -> list[str]:
    present = {name for m in maps for name in m}
    return [name for name in RESOURCE_NAMES if name in present]


def render_resources(record: DecisionRecord) -> NodeResources:
    decision = record.decision
    resources = {
        name: ResourceNow(
            quantity=_quantity(name, decision.resources.get(name)),
            value=decision.resources.get(name),
            explanation=_explanation(decision, name),
            prepareSteps=decision.prepare_steps.get(name, []),
        )
        for name in _names(decision.resources, decision.explanation)
    }
    last_written = {
        name: ResourceValue(quantity=_quantity(name, value), value=value)
        for name, value in decision.last_write_resources.items()
    }
    return NodeResources(
        node=decision.node,
        computedAt=rfc3339(decision.computed_at),
        trigger=list(decision.trigger),
        outcome=decision.outcome,
        degraded=decision.outcome == "degraded",
        disabled=decision.outcome == "disabled",
        reason=decision.reason,
        resources=resources,
        writeDue=decision.write_due,
        writeReason=decision.write_reason,
        lastWriteAt=None if decision.last_write_at is None else rfc3339(decision.last_write_at),
        lastWriteResources=last_written,
        annotations=dict(decision.annotations),
        metaDue=decision.meta_due,
        cpuNormalization=decision.cpu_normalization,
        nodeConfig=decision.node_config,
        warnings=list(decision.warnings),
        pods=_plain(decision.pods),
        streamSeq=record.stream_seq,
        zones={
            zone: {
                name: {
                    "value": value,
                    "explanation": msgspec.to_builtins(decision.zone_explanation.get(zone, {}).get(name)),
                }
                for name, value in values.items()
            }
            for zone, values in decision.zones.items()
        },
    )


def history_entry(decision: NodeResourceComputed, previous: NodeResourceComputed | None, *, seq: int) -> HistoryEntry:
    """One decision with, per resource, its change against `previous` (None: the oldest known decision)."""
    resources: dict[str, ResourceChange] = {}
    changes: list[ChangedResource] = []
    before_all = {} if previous is None else previous.resources
    for name in _names(decision.resources, before_all):
        value, before = decision.resources.get(name), before_all.get(name)
        delta = value - before if value is not None and before is not None else None
        changed = previous is not None and value != before
        resources[name] = ResourceChange(
            quantity=_quantity(name, value), value=value, previous=before, delta=delta, changed=changed
        )
        if changed:
            changes.append(
                ChangedResource(
                    resource=name,
                    previous=before,
                    value=value,
                    delta=delta,
                    explanation=_explanation(decision, name),
                    prepareSteps=decision.prepare_steps.get(name, []),
                )
            )
    return HistoryEntry(
        computedAt=rfc3339(decision.computed_at),
        streamSeq=seq,
        trigger=list(decision.trigger),
        outcome=decision.outcome,
        reason=decision.reason,
        writeDue=decision.write_due,
        writeReason=decision.write_reason,
        resources=resources,
        changes=changes,
    )


def render_history(node: str, records: Sequence[DecisionRecord], *, limit: int) -> NodeResourceHistory:
    """`records` newest first, up to limit+1: the extra one only serves as the last entry's previous decision."""
    items = [
        history_entry(
            record.decision,
            records[index + 1].decision if index + 1 < len(records) else None,
            seq=record.stream_seq,
        )
        for index, record in enumerate(records[:limit])
    ]
    return NodeResourceHistory(node=node, items=items, complete=len(records) <= limit)


# --- routes


@dataclass(frozen=True, kw_only=True)
class NodeResourceReads:
    """What the routes read: the noderesource projections."""

    store: NodeResourceStore


def _store(request: Request) -> NodeResourceStore:
    missing = "node resources are not available: this API runs without the noderesource store"
    return required(request, NodeResourceReads, missing=missing).store


async def _latest_or_404(store: NodeResourceStore, node: str) -> DecisionRecord:
    record = await store.latest(node)
    if record is None:
        raise HTTPException(
            404, f"no batch/mid decision for node {node!r} (is the node known to noderesource and the config loaded?)"
        )
    return record


@router.get(
    "/nodes/{node}/resources",
    tags=["noderesources"],
    summary="A node's current batch/mid resources with their explanation",
    description=(
        "The latest decision of the noderesource service for the node: each batch/mid resource as a quantity and "
        "a raw amount with the formula behind it, whether the node is degraded (NodeMetric missing or stale) or "
        "co-location is disabled and why, and whether the write to the node is due (hysteresis) with the time "
        "and values of the last due write."
    ),
    response_model=NodeResources,
    responses={503: {"description": "The API runs without the noderesource store"}},
)
async def get_node_resources(request: Request, node: str) -> NodeResources:
    names.node_name(node)
    return render_resources(await _latest_or_404(_store(request), node))


@router.get(
    "/nodes/{node}/resources/history",
    tags=["noderesources"],
    summary="A node's batch/mid decisions, newest first, with what changed and why",
    description=(
        "Each decision with its trigger, outcome, resources and write_due/write_reason; per resource the change "
        "against the decision before it, and for every changed resource the explanation of its new value. The "
        "server keeps the newest decisions per node (noderesource history_limit, default 100)."
    ),
    response_model=NodeResourceHistory,
    responses={503: {"description": "The API runs without the noderesource store"}},
)
async def get_node_resource_history(
    request: Request,
    node: str,
    limit: Annotated[
        int, Query(ge=1, le=MAX_HISTORY, description="decisions to return (default 20)")
    ] = DEFAULT_HISTORY,
) -> NodeResourceHistory:
    names.node_name(node)
    store = _store(request)
    records = await store.history(node, limit=limit + 1)
    if not records:
        await _latest_or_404(store, node)  # 404 with the same message as the current resources
    return render_history(node, records, limit=limit)


@router.get(
    "/config/colocation",
    tags=["noderesources"],
    summary="The colocation config in effect, its load error and each node's effective strategy",
    description=(
        "What the noderesource service uses: `cluster` is the effective slo-controller-config colocation-config "
        "(every field, nodeConfigs merged); `error` says why the ConfigMap's current content is not in effect "
        "(the previous config stays); `nodes` gives each known node's effective strategy, the nodeConfigs entry "
        "it matched and ignored annotations or labels. Before the service recorded anything: available false."
    ),
    response_model=ColocationConfigView,
    responses={503: {"description": "The API runs without the noderesource store"}},
)
async def get_colocation_config(request: Request) -> ColocationConfigView:
    store = _store(request)
    recorded = await store.config()
    strategies = await store.node_strategies()
    nodes = {
        s.node: NodeStrategyView(strategy=s.strategy, nodeConfig=s.node_config, warnings=list(s.warnings))
        for s in strategies
    }
    if recorded is None:
        return ColocationConfigView(available=False, error=None, updatedAt=None, cluster=None, nodes=nodes)
    return ColocationConfigView(
        available=recorded.available,
        error=recorded.error,
        updatedAt=rfc3339(recorded.updated_at),
        cluster=recorded.config if recorded.available else None,
        nodes=nodes,
    )


# --- the dashboard's overview (services.common.overview): batch/mid columns


def overview_columns(resources: LatestResources) -> dict[str, Any]:
    """One node's batch/mid columns of the overview (pure): millicores and bytes, null where unknown, and when they
    were decided (the dashboard tells a batch use reported before a decision that lowered the allocatable)."""
    amounts = resources.resources
    return {
        "batchCpu": amounts.get(vocab.BATCH_CPU),
        "batchMemory": amounts.get(vocab.BATCH_MEMORY),
        "midCpu": amounts.get(vocab.MID_CPU),
        "midMemory": amounts.get(vocab.MID_MEMORY),
        "outcome": resources.outcome,
        "resourcesAt": resources.computed_at,
    }


def overview_resources(reads: NodeResourceReads) -> OverviewResources:
    """The overview's batch/mid columns of the nodes in a name range."""

    async def columns(after: str | None, through: str) -> dict[str, dict[str, Any]]:
        found = await reads.store.resources_between(after=after, through=through)
        return {r.node: overview_columns(r) for r in found}

    return OverviewResources(columns)
