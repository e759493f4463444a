"""REST routes over the nodemetric projections: NodeMetric objects and the node liveness view.

Built into the nodemetric component (services.nodemetric.component) and mounted by services.api.app under /api/v1;
they read the `NodeMetricReads` the component provides (a process without the nodemetric database answers 503).
NodeMetric objects are in Koordinator's JSON shape (quantities as Kubernetes quantity strings) and validate against
its CRD; what koordbus adds (staleness, last sample time) travels in `metadata.annotations` so the object stays
valid. `/nodes` is the operator's view: which nodes report, since when, and which went quiet. Lists use keyset
pagination by node name (services.common.paging).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field

from bus.errors import BusUnavailableError, RemoteError
from schemas import koordinator, names
from services.common.component import RouteSettings, required
from services.common.overview import NodePage, OverviewNodes
from services.common.paging import After, Limit, page_size, rfc3339, split_page
from services.nodemetric.client import PredictionClient
from services.nodemetric.store import NodeMetricRecord, NodeMetricStore, NodeRecord, UsageSummary

router = APIRouter(prefix="/api/v1")

STALE_ANNOTATION = "koordbus.io/stale"
LAST_SAMPLE_ANNOTATION = "koordbus.io/last-sample-time"


@dataclass(frozen=True, kw_only=True)
class NodeMetricReads:
    """What the routes read: the projections, and the page size and staleness rules."""

    store: NodeMetricStore
    settings: RouteSettings = field(default_factory=RouteSettings)


def reads(request: Request) -> NodeMetricReads:
    return required(
        request,
        NodeMetricReads,
        missing="NodeMetrics are not available: this process runs without the nodemetric database",
    )


def is_stale(last_sample: float, *, now: float, stale_after: float) -> bool:
    return now - last_sample > stale_after


# --- NodeMetric objects


def render_nodemetric(
    record: NodeMetricRecord, node: NodeRecord | None, *, now: float, stale_after: float
) -> dict[str, Any]:
    """The NodeMetric object for one node, annotated with koordbus's liveness view."""
    obj = koordinator.nodemetric_object(record.node, record.spec, record.status)
    last_sample = node.last_seen if node is not None else record.report_time
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[STALE_ANNOTATION] = "true" if is_stale(last_sample, now=now, stale_after=stale_after) else "false"
    annotations[LAST_SAMPLE_ANNOTATION] = rfc3339(last_sample)
    return obj


@router.get("/nodemetrics", tags=["nodemetrics"], summary="List NodeMetric objects (keyset pagination by node name)")
async def list_nodemetrics(request: Request, limit: Limit = None, after: After = None) -> dict[str, Any]:
    ctx = reads(request)
    limit = page_size(limit, ctx.settings.page_limit_max)
    if after is not None:
        names.node_name(after, "after")
    rows = await ctx.store.list(limit=limit + 1, after=after)
    records, token = split_page(rows, limit=limit, name=lambda r: r.node)
    nodes = {n.node: n for n in await ctx.store.nodes_by_name([r.node for r in records])}
    now, stale_after = ctx.settings.clock(), ctx.settings.stale_after_seconds
    items = [render_nodemetric(r, nodes.get(r.node), now=now, stale_after=stale_after) for r in records]
    metadata = {"continue": token} if token else {}
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetricList", "metadata": metadata, "items": items}


@router.get("/nodemetrics/{node}", tags=["nodemetrics"], summary="One node's NodeMetric object")
async def get_nodemetric(request: Request, node: str) -> dict[str, Any]:
    names.node_name(node)
    ctx = reads(request)
    record = await ctx.store.get(node)
    if record is None:
        raise HTTPException(404, f"no NodeMetric for node {node!r} (has its agent reported a full report interval?)")
    found = await ctx.store.nodes_by_name([node])
    return render_nodemetric(
        record, found[0] if found else None, now=ctx.settings.clock(), stale_after=ctx.settings.stale_after_seconds
    )


# --- node liveness


class NodeLiveness(BaseModel):
    """What a node's agent has told us about it, and whether it is still talking."""

    name: str
    firstSampleTime: str = Field(description="RFC 3339: the oldest event time heard from the node")
    lastSampleTime: str = Field(description="RFC 3339: the newest event time heard (batch window end or state)")
    secondsSinceLastSample: float
    stale: bool = Field(description="no sample for longer than the server's stale_after_seconds")
    cgroupVersion: int = Field(description="1 or 2; 0 until the agent sent its state")
    cgroupDriver: str
    cpuCores: float
    memoryTotalBytes: int
    pods: int = Field(
        description="the pods in the node's latest NodeMetric (podsMetric: those its agent measured in the report's "
        "window, as the node page's usage charts); before its first NodeMetric, the pods its agent's state report named"
    )
    agentVersion: str
    droppedBatches: int = Field(description="batches the agent dropped while the bus was away")


class ListMeta(BaseModel):
    continue_: str | None = Field(default=None, alias="continue", description="pass as `after` for the next page")


class NodeLivenessList(BaseModel):
    kind: str = "NodeLivenessList"
    metadata: ListMeta
    items: list[NodeLiveness]


def pods_on(node: NodeRecord, usage: UsageSummary | None) -> int:
    """The node's pods as its latest NodeMetric names them (the same report as its usage); before its first
    NodeMetric, as its agent's state report named them."""
    return usage.pods if usage is not None else node.pods


def node_liveness(node: NodeRecord, usage: UsageSummary | None, *, now: float, stale_after: float) -> NodeLiveness:
    return NodeLiveness(
        name=node.node,
        firstSampleTime=rfc3339(node.first_seen),
        lastSampleTime=rfc3339(node.last_seen),
        secondsSinceLastSample=round(max(now - node.last_seen, 0.0), 3),
        stale=is_stale(node.last_seen, now=now, stale_after=stale_after),
        cgroupVersion=node.cgroup_version,
        cgroupDriver=node.cgroup_driver,
        cpuCores=node.cpu_cores,
        memoryTotalBytes=node.memory_total,
        pods=pods_on(node, usage),
        agentVersion=node.agent_version,
        droppedBatches=node.dropped_batches,
    )


@router.get(
    "/nodes",
    tags=["nodes"],
    summary="Node liveness: first and last sample, stale flag, cgroup layout and capacity (paginated by name)",
    response_model=NodeLivenessList,
    response_model_exclude_none=True,
)
async def list_nodes(
    request: Request,
    limit: Limit = None,
    after: After = None,
    stale: Annotated[bool | None, Query(description="only stale (true) or only fresh (false) nodes")] = None,
) -> NodeLivenessList:
    ctx = reads(request)
    limit = page_size(limit, ctx.settings.page_limit_max)
    if after is not None:
        names.node_name(after, "after")
    rows = await ctx.store.nodes(limit=limit + 1, after=after)
    # Filtering after the page is cut keeps the token on the last *scanned* name, so no node is skipped.
    page, token = split_page(rows, limit=limit, name=lambda n: n.node)
    now, stale_after = ctx.settings.clock(), ctx.settings.stale_after_seconds
    usages = {u.node: u for u in await ctx.store.usage_summaries_of(n.node for n in page)}
    items = [node_liveness(n, usages.get(n.node), now=now, stale_after=stale_after) for n in page]
    if stale is not None:
        items = [item for item in items if item.stale == stale]
    return NodeLivenessList(metadata=ListMeta.model_validate({"continue": token}), items=items)


@router.get("/nodes/{node}", tags=["nodes"], summary="One node's liveness", response_model=NodeLiveness)
async def get_node(request: Request, node: str) -> NodeLiveness:
    names.node_name(node)
    ctx = reads(request)
    found = await ctx.store.nodes_by_name([node])
    if not found:
        raise HTTPException(404, f"node {node!r} has never reported (no metrics batch or state from its agent)")
    usage = next(iter(await ctx.store.usage_summaries_of([node])), None)
    return node_liveness(found[0], usage, now=ctx.settings.clock(), stale_after=ctx.settings.stale_after_seconds)


# --- the prod predictor (spec §1.7), as the replica owning the node holds it


@dataclass(frozen=True)
class PredictionQueries:
    """Asks the nodemetric replicas over the bus."""

    client: PredictionClient


@router.get(
    "/nodes/{node}/prediction",
    tags=["nodes"],
    summary="A node's prod predictor: its models' percentiles and the newest prediction, explained",
    description="Every model the node's prod predictor trains (each pod's, each priority class's, the system's and "
    "the node's) with its p60, p90, p95, p98 and max (cpu millicores, memory bytes) and when it last trained, and "
    "the newest report's prodReclaimable and prodPeak with the predictors' explanation: which pods were predicted, "
    "which cold-started or had no model, and what allocatable the result was capped by.",
    responses={
        404: {"description": "The replica owning the node holds no models for it (no training round yet)"},
        503: {"description": "No nodemetric replica answered for the node's partition"},
        502: {"description": "The replica failed while answering"},
    },
)
async def get_prediction(request: Request, node: str) -> Response:
    names.node_name(node)
    missing = "predictions are not available: this API runs without a bus to ask the nodemetric service on"
    client = required(request, PredictionQueries, missing=missing).client
    try:
        view = await client.prediction(node)
    except BusUnavailableError as e:
        raise HTTPException(503, f"no nodemetric replica answers for node {node!r}: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, f"the nodemetric replica failed: {e}") from None
    if view is None:
        raise HTTPException(404, f"no prediction models for node {node!r} (its agent has sent no training round yet)")
    return Response(msgspec.json.encode(view), media_type="application/json")


# --- the dashboard's overview (services.common.overview): liveness and usage columns


def overview_columns(node: NodeRecord, usage: UsageSummary | None, *, now: float, stale_after: float) -> dict[str, Any]:
    """One node's liveness and usage columns of the overview (pure): millicores and bytes, null where unknown."""
    return {
        "name": node.node,
        "lastSample": node.last_seen,
        "stale": now - node.last_seen > stale_after,
        "cpuCores": node.cpu_cores,
        "memoryTotal": node.memory_total,
        "pods": pods_on(node, usage),
        "reportTime": usage.report_time if usage is not None else None,
        "cpuUsed": usage.cpu if usage is not None else None,
        "memoryUsed": usage.memory if usage is not None else None,
        "batchCpuUsed": usage.batch_cpu if usage is not None else None,
        "batchMemoryUsed": usage.batch_memory if usage is not None else None,
        "midCpuUsed": usage.mid_cpu if usage is not None else None,
        "midMemoryUsed": usage.mid_memory if usage is not None else None,
    }


def overview_nodes(reads: NodeMetricReads) -> OverviewNodes:
    """A page of the overview's node columns: the nodes by name, then their usage over the page's name range."""

    async def page(after: str | None, limit: int) -> NodePage:
        rows = await reads.store.nodes(limit=limit + 1, after=after)
        nodes, more = rows[:limit], len(rows) > limit
        through = nodes[-1].node if nodes else None
        usages: dict[str, UsageSummary] = {}
        if through is not None:
            usages = {u.node: u for u in await reads.store.usage_summaries(after=after, through=through)}
        now, stale_after = reads.settings.clock(), reads.settings.stale_after_seconds
        columns = [overview_columns(n, usages.get(n.node), now=now, stale_after=stale_after) for n in nodes]
        return NodePage(rows=columns, through=through, more=more, now=now, stale_after_seconds=stale_after)

    return OverviewNodes(page)
