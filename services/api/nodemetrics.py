"""REST routes over the nodemetric projections: NodeMetric objects and the node liveness view.

Mounted by services.api.app under /api/v1. NodeMetric objects are in Koordinator's JSON shape
(quantities as Kubernetes quantity strings) and validate against its CRD; what koordbus adds
(staleness, last sample time) travels in `metadata.annotations` so the object stays valid.
`/nodes` is the operator's view: which nodes report, since when, and which went quiet. Lists use
keyset pagination by node name: pass `metadata.continue` of one page as `after` for the next;
the last page has no `continue`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field

from schemas import koordinator, names
from services.nodemetric.store import NodeMetricRecord, NodeMetricStore, NodeRecord

router = APIRouter(prefix="/api/v1")

STALE_ANNOTATION = "koordbus.io/stale"
LAST_SAMPLE_ANNOTATION = "koordbus.io/last-sample-time"

_Row = TypeVar("_Row")

DEFAULT_PAGE = 500
Limit = Annotated[
    int | None, Query(ge=1, description="page size: default 500, at most the server's page_limit_max (1000)")
]
After = Annotated[str | None, Query(description="continue after this node name (a page's metadata.continue)")]


def nodemetric_store(ctx: Any) -> NodeMetricStore:
    """The context's NodeMetric store; a process serving the API without one answers 503."""
    store: NodeMetricStore | None = ctx.nodemetric_store
    if store is None:
        raise HTTPException(503, "NodeMetrics are not available: this process runs without the nodemetric database")
    return store


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_stale(last_sample: float, *, now: float, stale_after: float) -> bool:
    return now - last_sample > stale_after


def split_page(rows: Sequence[_Row], *, limit: int, name: Callable[[_Row], str]) -> tuple[list[_Row], str | None]:
    """(this page, continue token) from up to limit+1 rows: the extra row only says another page exists."""
    if len(rows) > limit:
        return list(rows[:limit]), name(rows[limit - 1])
    return list(rows), None


def page_size(limit: int | None, maximum: int) -> int:
    """The requested page size, or the default capped by the server's maximum."""
    if limit is None:
        return min(DEFAULT_PAGE, maximum)
    if limit > maximum:
        raise HTTPException(422, f"invalid query parameter 'limit' (got {limit}): must be at most {maximum}")
    return limit


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
    ctx = request.app.state.context
    limit = page_size(limit, ctx.settings.page_limit_max)
    if after is not None:
        names.node_name(after, "after")
    rows = await nodemetric_store(ctx).list(limit=limit + 1, after=after)
    records, token = split_page(rows, limit=limit, name=lambda r: r.node)
    nodes = {n.node: n for n in await nodemetric_store(ctx).nodes_by_name([r.node for r in records])}
    now, stale_after = ctx.clock(), ctx.settings.stale_after_seconds
    items = [render_nodemetric(r, nodes.get(r.node), now=now, stale_after=stale_after) for r in records]
    metadata = {"continue": token} if token else {}
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetricList", "metadata": metadata, "items": items}


@router.get("/nodemetrics/{node}", tags=["nodemetrics"], summary="One node's NodeMetric object")
async def get_nodemetric(request: Request, node: str) -> dict[str, Any]:
    names.node_name(node)
    ctx = request.app.state.context
    record = await nodemetric_store(ctx).get(node)
    if record is None:
        raise HTTPException(404, f"no NodeMetric for node {node!r} (has its agent reported a full report interval?)")
    found = await nodemetric_store(ctx).nodes_by_name([node])
    return render_nodemetric(
        record, found[0] if found else None, now=ctx.clock(), stale_after=ctx.settings.stale_after_seconds
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
    pods: int
    agentVersion: str
    droppedBatches: int = Field(description="batches the agent dropped while the bus was away")


class ListMeta(BaseModel):
    continue_: str | None = Field(default=None, alias="continue", description="pass as `after` for the next page")


class NodeLivenessList(BaseModel):
    kind: str = "NodeLivenessList"
    metadata: ListMeta
    items: list[NodeLiveness]


def node_liveness(node: NodeRecord, *, now: float, stale_after: float) -> NodeLiveness:
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
        pods=node.pods,
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
    ctx = request.app.state.context
    limit = page_size(limit, ctx.settings.page_limit_max)
    if after is not None:
        names.node_name(after, "after")
    rows = await nodemetric_store(ctx).nodes(limit=limit + 1, after=after)
    # Filtering after the page is cut keeps the token on the last *scanned* name, so no node is skipped.
    page, token = split_page(rows, limit=limit, name=lambda n: n.node)
    now, stale_after = ctx.clock(), ctx.settings.stale_after_seconds
    items = [node_liveness(n, now=now, stale_after=stale_after) for n in page]
    if stale is not None:
        items = [item for item in items if item.stale == stale]
    return NodeLivenessList(metadata=ListMeta.model_validate({"continue": token}), items=items)


@router.get("/nodes/{node}", tags=["nodes"], summary="One node's liveness", response_model=NodeLiveness)
async def get_node(request: Request, node: str) -> NodeLiveness:
    names.node_name(node)
    ctx = request.app.state.context
    found = await nodemetric_store(ctx).nodes_by_name([node])
    if not found:
        raise HTTPException(404, f"node {node!r} has never reported (no metrics batch or state from its agent)")
    return node_liveness(found[0], now=ctx.clock(), stale_after=ctx.settings.stale_after_seconds)
