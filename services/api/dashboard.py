"""The web dashboard: its static files (served open at `/` and `/ui/`) and the one read made for it.

services.api.app mounts this. The pages are hand-written ES modules, SVG charts and CSS in
services/api/static (shipped in the wheel as package data; no build step); they call the REST routes
with the bearer token the user typed (kept in the browser's sessionStorage) and follow
`/api/v1/events/stream`. `GET /api/v1/overview/nodes` gives the cluster overview its rows: per node
the liveness, the NodeMetric's usage with its batch and mid pods' share, and the latest batch/mid
resources, in a compact shape so 5,000 nodes are a few requests, not a few hundred megabytes of
NodeMetric objects. The rows are joined by node name over one name range per page, from what the nodemetric and
noderesource components provide (services.common.overview).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

from schemas import names
from services.common.component import provided, required
from services.common.overview import OverviewNodes, OverviewResources

STATIC_DIR: Final = Path(__file__).parent / "static"
OVERVIEW_PAGE_DEFAULT: Final = 1000
OVERVIEW_PAGE_MAX: Final = 5000
"""Rows are ~300 bytes, so even the largest page is a small response."""

router = APIRouter(prefix="/api/v1", tags=["dashboard"])

NO_RESOURCES: Final = {
    "batchCpu": None,
    "batchMemory": None,
    "midCpu": None,
    "midMemory": None,
    "outcome": None,
    "resourcesAt": None,
}
"""A node's batch/mid columns while nothing is known of them."""


@router.get("/overview/nodes", summary="The dashboard's node rows: liveness, usage, batch/mid (paged by name)")
async def overview_nodes(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=OVERVIEW_PAGE_MAX)] = OVERVIEW_PAGE_DEFAULT,
    after: Annotated[str | None, Query(description="continue after this node name (a page's `continue`)")] = None,
) -> dict[str, Any]:
    if after is not None:
        names.node_name(after, "after")
    nodes = required(
        request, OverviewNodes, missing="the overview is not available: this API runs without the nodemetric database"
    )
    page = await nodes.page(after, limit)
    resources: Mapping[str, dict[str, Any]] = {}
    if page.through is not None and (batch := provided(request, OverviewResources)) is not None:
        resources = await batch.columns(after, page.through)
    return {
        "kind": "NodeOverviewList",
        "items": [{**row, **resources.get(row["name"], NO_RESOURCES)} for row in page.rows],
        "continue": page.through if page.more else None,
        "staleAfterSeconds": page.stale_after_seconds,
        "now": page.now,
    }


def mount(app: FastAPI) -> None:
    """`/` answers the dashboard's page, `/ui/…` its modules and styles; both open (the data needs a token)."""
    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    app.mount("/ui", StaticFiles(directory=STATIC_DIR), name="ui")
