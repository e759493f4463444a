"""REST routes over node QoS: a node's rendered NodeSLO (with the slo-controller-config's errors) and the recent
actuations its agent reported.

Built into the slo component (services.slo.component) and mounted by services.api.app under /api/v1; they read through
the `SloReads` it provides (a process without it answers 503). Both read the bus directly (services.slo.reader): the
NodeSLO is the node's key in the KOORD_SLO bucket, the actuations are ActuationApplied events on KOORD_NODE (kept as
long as that stream keeps agent reports, 2 hours by default).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field

from bus.errors import BusError, BusUnavailableError
from schemas import names
from services.common import paging
from services.common.component import required
from services.slo.reader import SloReader

router = APIRouter(prefix="/api/v1")

DEFAULT_ACTUATIONS = 50
MAX_ACTUATIONS = 1000
DEFAULT_WINDOW_SECONDS = 3600.0


class NodeSlo(BaseModel):
    node: str
    revision: int = Field(description="the node's key revision in the KOORD_SLO bucket (what the agent reports)")
    renderedAt: float = Field(description="unix seconds the spec was rendered")
    spec: dict[str, Any] = Field(description="the NodeSLO spec, Koordinator's field names")
    configErrors: dict[str, str] = Field(
        description="slo-controller-config keys in error: their last good value (or the default) is in this spec"
    )


class Actuations(BaseModel):
    node: str
    actuations: list[dict[str, Any]] = Field(
        description="ActuationApplied events, oldest first: loop, at, dry_run, changes (path, before, after, "
        "reason), problems, deferred, slo_revision, and seq (KOORD_NODE stream sequence)"
    )


@dataclass(frozen=True)
class SloReads:
    """Node QoS read from the bus: NodeSLOs, the config's status, actuations."""

    reader: SloReader


def _reader(request: Request) -> SloReader:
    missing = "node QoS is not available: this API runs without a bus to read it from"
    return required(request, SloReads, missing=missing).reader


@router.get(
    "/nodes/{node}/slo",
    tags=["qos"],
    summary="A node's rendered NodeSLO",
    description="The NodeSLO spec the slo service rendered for the node from slo-controller-config (defaults, "
    "cluster strategy, first matching node strategy), as its agent reads it, and the ConfigMap keys in error.",
    response_model=NodeSlo,
    responses={404: {"description": "No NodeSLO for this node"}, 503: {"description": "The bus is unreachable"}},
)
async def get_node_slo(request: Request, node: str) -> NodeSlo:
    names.node_name(node)
    reader = _reader(request)
    try:
        stored = await reader.node_slo(node)
        status = await reader.config_status()
    except BusError as e:
        raise HTTPException(503, f"cannot read the NodeSLO bucket: {e}") from None
    if stored is None:
        raise HTTPException(404, f"no NodeSLO for node {node!r} (is the node known to the slo service?)")
    return NodeSlo(
        node=node,
        revision=stored.revision,
        renderedAt=stored.value.rendered_at,
        spec=stored.value.spec,
        configErrors=status.errors if status is not None else {},
    )


@router.get(
    "/nodes/{node}/actuations",
    tags=["qos"],
    summary="What a node's agent changed recently, and why",
    description="The node agent's ActuationApplied events, oldest first: every round of a QoS loop that changed a "
    "value (or, in dry-run, would have), with each change's before/after and reason and the problems it skipped.",
    response_model=Actuations,
    responses={503: {"description": "The bus is unreachable"}},
)
async def get_node_actuations(
    request: Request,
    node: str,
    limit: Annotated[int, Query(ge=1, le=MAX_ACTUATIONS, description="newest events to return (default 50)")] = (
        DEFAULT_ACTUATIONS
    ),
    since: Annotated[
        str | None, Query(description="unix seconds or RFC 3339 (as the event routes take it); default: the last hour")
    ] = None,
) -> Actuations:
    names.node_name(node)
    try:
        given = paging.parse_since(since)
    except ValueError as e:
        raise HTTPException(400, str(e)) from None
    reader = _reader(request)
    start = given if given is not None else time.time() - DEFAULT_WINDOW_SECONDS
    try:
        stored = await reader.actuations(node, since=start, limit=limit)
    except BusUnavailableError as e:
        raise HTTPException(503, f"cannot read actuations: {e}") from None
    except BusError as e:
        raise HTTPException(503, f"cannot read actuations: {e}") from None
    return Actuations(node=node, actuations=[{**msgspec.to_builtins(s.event), "seq": s.seq} for s in stored])
