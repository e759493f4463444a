"""GET /api/v1/k8s/recorded-writes: in record-only mode (`koordbus up` without a kubeconfig), what the Kubernetes
writer would have written — NodeMetric objects, node status and annotations, and the log of writes.

Mounted by services.api.app; the composition root passes the recording sink's `export` as
ApiContext.recorded_writes. A process that writes to a real cluster has none and answers 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

router = APIRouter(prefix="/api/v1")


@router.get(
    "/k8s/recorded-writes",
    tags=["kubernetes"],
    summary="What would have been written to Kubernetes (record-only mode)",
    description="NodeMetric objects, nodes' batch/mid status and annotations as they would be after the writes, the "
    "Kubernetes Events that would be created (`events`, e.g. for a rejected colocation ConfigMap), and the log of "
    "writes (oldest first). Only in record-only mode: with a real cluster this answers 404.",
)
async def recorded_writes(request: Request) -> Any:
    export = request.app.state.context.recorded_writes
    if export is None:
        raise HTTPException(404, "not in record-only mode: this process writes to a real Kubernetes cluster or none")
    return export()
