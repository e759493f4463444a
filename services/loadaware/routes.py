"""`GET /api/v1/scheduler/nodes/{node}/state`: one node as the load-aware extender sees it now, to replay later.

The extender (services.loadaware) keeps its state in memory; this route asks it over the bus
(services.loadaware.client) and returns its answer unchanged: the document `koordbus calc loadaware` reads (now,
args, node, nodeMetric, assignedPods, and nodeQoS when node QoS caps the node's pods; services.loadaware.snapshot)
without the incoming pod. Saved to a file, `koordbus scheduler explain --offline -f state.json POD` replays it and
prints the explanation the extender would have given for POD at that moment. Role viewer. Built into the loadaware
component (services.loadaware.component) and mounted by services.api.app; it asks through the `SchedulerQueries` the
component provides. (The extender's own verbs are served by services.loadaware.http on the extender's port.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from bus.errors import BusUnavailableError, RemoteError
from schemas import names
from services.common.component import required
from services.loadaware.client import LoadAwareClient

router = APIRouter(prefix="/api/v1")


class NodeState(BaseModel):
    """One node's load-aware extender state (CALC-CONTRACT `loadaware` input, without `pod`)."""

    model_config = ConfigDict(extra="allow")

    now: str = Field(description="when the state was taken (RFC 3339)")
    args: dict[str, Any] = Field(description="the extender's LoadAwareSchedulingArgs in effect (Koordinator's names)")
    node: dict[str, Any] = Field(description="the Node as the extender reads it: name, allocatable, annotation")
    nodeMetric: dict[str, Any] | None = Field(description="the NodeMetric the extender holds (null: none)")
    assignedPods: list[dict[str, Any]] = Field(description="the pods counted on the node: {pod, assignedAt}")


@dataclass(frozen=True)
class SchedulerQueries:
    """Asks the load-aware extender over the bus."""

    client: LoadAwareClient


def _client(request: Request) -> LoadAwareClient:
    missing = "the scheduler state is not available: this API runs without a bus to ask it on"
    return required(request, SchedulerQueries, missing=missing).client


@router.get(
    "/scheduler/nodes/{node}/state",
    tags=["scheduler"],
    summary="A node's load-aware extender state, to replay a decision offline",
    description="What the load-aware extender holds for the node right now — its args, the node's allocatable and "
    "usage-thresholds annotation, the NodeMetric and the pods counted on it with their assign times — as the input "
    "of `koordbus calc loadaware` (add a `pod`) or `koordbus scheduler explain --offline -f FILE POD`.",
    response_model=NodeState,
    response_model_exclude_unset=True,
    responses={
        404: {"description": "The extender knows no Node and no NodeMetric of this name"},
        503: {"description": "No load-aware extender answered"},
        502: {"description": "The extender failed while answering"},
    },
)
async def get_node_state(request: Request, node: str) -> dict[str, Any]:
    names.node_name(node)
    try:
        state = await _client(request).node_state(node)
    except BusUnavailableError as e:
        raise HTTPException(503, f"the load-aware extender does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, f"the load-aware extender failed: {e}") from None
    if state is None:
        raise HTTPException(404, f"node {node!r} is unknown to the load-aware extender (no Node, no NodeMetric)")
    return state
