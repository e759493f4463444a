"""GET /api/v1/k8s/recorded-writes: in record-only mode (`koordbus up` without a kubeconfig), what the Kubernetes
writer would have written — NodeMetric objects, node status and annotations, and the log of writes.

Built into the bridge's component (services.k8s.component) and mounted by services.api.app; it reads the
`RecordedWrites` the component provides (the recording sink's export). A process that writes to a real cluster has
none and answers 404.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from services.common.component import provided

router = APIRouter(prefix="/api/v1")


@dataclass(frozen=True)
class RecordedWrites:
    """What the Kubernetes writer would have written, as JSON (the recording sink's export)."""

    export: Callable[[], Any]


@router.get(
    "/k8s/recorded-writes",
    tags=["kubernetes"],
    summary="What would have been written to Kubernetes (record-only mode)",
    description="NodeMetric objects, nodes' batch/mid status and annotations as they would be after the writes, the "
    "Kubernetes Events that would be created (`events`, e.g. for a rejected colocation ConfigMap), and the log of "
    "writes (oldest first); the mirrors' objects and writes under `quotas`, `nodeslos` and `noderesourcetopologies`, "
    "the agents' evictions under `evictions`, and the Bindings the load-aware extender's bind verb asked for under "
    "`bindings`. Only in record-only mode: with a real cluster this answers 404.",
)
async def recorded_writes(request: Request) -> Any:
    recorded = provided(request, RecordedWrites)
    if recorded is None:
        raise HTTPException(404, "not in record-only mode: this process writes to a real Kubernetes cluster or none")
    return recorded.export()
