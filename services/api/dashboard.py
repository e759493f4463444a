"""The web dashboard: its static files (served open at `/` and `/ui/`) and the one read made for it.

services.api.app mounts this. The pages are hand-written ES modules, SVG charts and CSS in
services/api/static (shipped in the wheel as package data; no build step); they call the REST routes
with the bearer token the user typed (kept in the browser's sessionStorage) and follow
`/api/v1/events/stream`. `GET /api/v1/overview/nodes` gives the cluster overview its rows: per node
the liveness, the NodeMetric's usage with its batch and mid pods' share, and the latest batch/mid
resources, in a compact shape so 5,000 nodes are a few requests, not a few hundred megabytes of
NodeMetric objects. The rows are joined by node name over one name range per page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

from schemas import names, vocab
from services.nodemetric.store import NodeRecord, UsageSummary
from services.noderesource.store import LatestResources

STATIC_DIR: Final = Path(__file__).parent / "static"
OVERVIEW_PAGE_DEFAULT: Final = 1000
OVERVIEW_PAGE_MAX: Final = 5000
"""Rows are ~300 bytes, so even the largest page is a small response."""

router = APIRouter(prefix="/api/v1", tags=["dashboard"])


def overview_row(
    node: NodeRecord,
    usage: UsageSummary | None,
    resources: LatestResources | None,
    *,
    now: float,
    stale_after: float,
) -> dict[str, Any]:
    """One node's overview row (pure): amounts in millicores and bytes, null where nothing is known."""
    amounts = resources.resources if resources is not None else {}
    return {
        "name": node.node,
        "lastSample": node.last_seen,
        "stale": now - node.last_seen > stale_after,
        "cpuCores": node.cpu_cores,
        "memoryTotal": node.memory_total,
        "pods": node.pods,
        "reportTime": usage.report_time if usage is not None else None,
        "cpuUsed": usage.cpu if usage is not None else None,
        "memoryUsed": usage.memory if usage is not None else None,
        "batchCpuUsed": usage.batch_cpu if usage is not None else None,
        "batchMemoryUsed": usage.batch_memory if usage is not None else None,
        "midCpuUsed": usage.mid_cpu if usage is not None else None,
        "midMemoryUsed": usage.mid_memory if usage is not None else None,
        "batchCpu": amounts.get(vocab.BATCH_CPU),
        "batchMemory": amounts.get(vocab.BATCH_MEMORY),
        "midCpu": amounts.get(vocab.MID_CPU),
        "midMemory": amounts.get(vocab.MID_MEMORY),
        "outcome": resources.outcome if resources is not None else None,
    }


@router.get("/overview/nodes", summary="The dashboard's node rows: liveness, usage, batch/mid (paged by name)")
async def overview_nodes(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=OVERVIEW_PAGE_MAX)] = OVERVIEW_PAGE_DEFAULT,
    after: Annotated[str | None, Query(description="continue after this node name (a page's `continue`)")] = None,
) -> dict[str, Any]:
    if after is not None:
        names.node_name(after, "after")
    ctx = request.app.state.context
    store = ctx.nodemetric_store
    if store is None:
        raise HTTPException(503, "the overview is not available: this API runs without the nodemetric database")
    rows: list[NodeRecord] = await store.nodes(limit=limit + 1, after=after)
    page, more = rows[:limit], len(rows) > limit
    usages: dict[str, UsageSummary] = {}
    resources: dict[str, LatestResources] = {}
    through = page[-1].node if page else None
    if through is not None:
        usages = {u.node: u for u in await store.usage_summaries(after=after, through=through)}
        if ctx.noderesource_store is not None:
            found = await ctx.noderesource_store.resources_between(after=after, through=through)
            resources = {r.node: r for r in found}
    now, stale_after = ctx.clock(), ctx.settings.stale_after_seconds
    return {
        "kind": "NodeOverviewList",
        "items": [
            overview_row(n, usages.get(n.node), resources.get(n.node), now=now, stale_after=stale_after) for n in page
        ],
        "continue": through if more else None,
        "staleAfterSeconds": stale_after,
        "now": now,
    }


def mount(app: FastAPI) -> None:
    """`/` answers the dashboard's page, `/ui/…` its modules and styles; both open (the data needs a token)."""
    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="ui")
