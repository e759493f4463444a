"""REST routes for NodeMetric objects in Koordinator's JSON shape (quantities as Kubernetes quantity strings).

Each object validates against Koordinator's NodeMetric CRD; what koordbus adds (staleness,
last sample time) travels in `metadata.annotations` so the object stays valid.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from schemas import koordinator
from services.nodemetric.store import NodeMetricRecord, NodeRecord

router = APIRouter(prefix="/api/v1", tags=["nodemetrics"])

STALE_ANNOTATION = "koordbus.io/stale"
LAST_SAMPLE_ANNOTATION = "koordbus.io/last-sample-time"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_nodemetric(
    record: NodeMetricRecord, node: NodeRecord | None, *, now: float, stale_after: float
) -> dict[str, Any]:
    """The NodeMetric object for one node, annotated with koordbus's liveness view."""
    obj = koordinator.nodemetric_object(record.node, record.spec, record.status)
    last_sample = node.last_seen if node is not None else record.report_time
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations[STALE_ANNOTATION] = "true" if now - last_sample > stale_after else "false"
    annotations[LAST_SAMPLE_ANNOTATION] = _rfc3339(last_sample)
    return obj


@router.get("/nodemetrics", summary="List NodeMetric objects (keyset pagination by node name)")
async def list_nodemetrics(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 500,
    after: Annotated[str | None, Query(description="continue after this node name (from metadata.continue)")] = None,
) -> dict[str, Any]:
    ctx = request.app.state.context
    records = await ctx.nodemetric_store.list(limit=limit, after=after)
    nodes = {n.node: n for n in await ctx.nodemetric_store.nodes_by_name([r.node for r in records])}
    now = ctx.clock()
    items = [
        render_nodemetric(r, nodes.get(r.node), now=now, stale_after=ctx.settings.stale_after_seconds) for r in records
    ]
    metadata: dict[str, Any] = {}
    if len(records) == limit:
        metadata["continue"] = records[-1].node
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetricList", "metadata": metadata, "items": items}


@router.get("/nodemetrics/{node}", summary="One node's NodeMetric object")
async def get_nodemetric(request: Request, node: str) -> dict[str, Any]:
    ctx = request.app.state.context
    record = await ctx.nodemetric_store.get(node)
    if record is None:
        raise HTTPException(404, f"no NodeMetric for node {node!r} (has its agent reported a full report interval?)")
    found = await ctx.nodemetric_store.nodes_by_name([node])
    return render_nodemetric(
        record, found[0] if found else None, now=ctx.clock(), stale_after=ctx.settings.stale_after_seconds
    )
