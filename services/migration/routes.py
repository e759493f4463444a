"""REST routes of pod migration: the jobs with their decision trails, requests and aborts; the descheduler's rounds.

Built into the migration component (services.migration.component) and mounted by services.api.app under /api/v1.
Reads come from the migration projections (services.migration.store, provided as `MigrationReads`);
a request (`POST /api/v1/migrations`, role admin) is published as a MigrationRequested that the arbiter takes
through the same intake pre-checks as a PodMigrationJob made in the cluster — a refused one shows in the job's
trail with Koordinator's reason; an abort (`POST /api/v1/migrations/{name}/abort`, admin) as a MigrationAborted.
The body of a request is a PodMigrationJob (Kubernetes shape, JSON or YAML; the name is generated when absent) or
the short form `{"pod": {"namespace", "name"}, "mode", "ttl"}`.
`GET /api/v1/descheduler/rounds/latest` is the descheduler's newest LowNodeLoad round (schemas.descheduler: each
node's class and why, each pool's outcome, the pods it asked to move) and `GET /api/v1/descheduler/plan` one the
migration service computes now without acting on it (what `koordbus migration plan` prints).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse

from bus.errors import BusError, BusUnavailableError, RemoteError
from schemas import migration, names
from schemas.descheduler import encode_round
from services.common import auth, bodies
from services.common.component import required
from services.migration.client import MigrationClient
from services.migration.store import JobRecord, MigrationStore

router = APIRouter(prefix="/api/v1", tags=["migrations"])

MAX_BODY_BYTES: Final = 256 * 1024
Admin = Annotated[auth.Identity, Depends(auth.require(auth.ADMIN))]
PHASES: Final = ("Pending", "Running", "Succeeded", "Failed", "Aborted")


@dataclass(frozen=True)
class MigrationReads:
    """The migration projections the read routes use."""

    store: MigrationStore


@dataclass(frozen=True)
class MigrationRequests:
    """Publishes migration requests and aborts for the arbiter."""

    client: MigrationClient


def _store(request: Request) -> MigrationStore:
    missing = "migrations are not available: this API runs without the migration store"
    return required(request, MigrationReads, missing=missing).store


def _client(request: Request) -> MigrationClient:
    missing = "migration requests are not available: this API runs without a bus connection"
    return required(request, MigrationRequests, missing=missing).client


def _summary(record: JobRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "namespace": record.namespace,
        "pod": record.pod,
        "node": record.node,
        "workload": record.workload,
        "phase": record.phase,
        "arbitration": record.arbitration,
        "reason": record.reason,
        "message": record.message,
        "source": record.source,
        "actor": record.actor,
        "requestedAt": record.requested_at,
        "updatedAt": record.updated_at,
    }


@router.get("/migrations", summary="Migration jobs, newest first, filtered by phase, node, namespace or workload")
async def list_migrations(
    request: Request,
    phase: Annotated[str | None, Query(description=f"one of {', '.join(PHASES)}")] = None,
    node: str | None = None,
    namespace: str | None = None,
    workload: Annotated[str | None, Query(description="the uid of the pods' controller")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> dict[str, Any]:
    if phase is not None and phase not in PHASES:
        raise HTTPException(422, f"phase {phase!r} is not one of {', '.join(PHASES)}")
    if node is not None:
        names.node_name(node)
    if namespace is not None:
        names.namespace(namespace)
    if workload is not None:
        names.uid(workload, "workload")
    records = await _store(request).jobs(phase=phase, node=node, namespace=namespace, workload=workload, limit=limit)
    return {"kind": "MigrationList", "items": [_summary(r) for r in records]}


@router.get("/migrations/{name}", summary="One migration job with its whole decision trail")
async def get_migration(request: Request, name: str) -> dict[str, Any]:
    names.object_name(name)
    store = _store(request)
    record = await store.job(name)
    if record is None:
        raise HTTPException(404, f"no migration job named {name!r}")
    trail = await store.trail(name)
    return {
        **_summary(record),
        "job": record.job,
        "trail": [
            {
                "round": d.round,
                "outcome": d.outcome,
                "filter": d.filter,
                "reason": d.reason,
                "message": d.message,
                "time": d.time,
                "seq": d.stream_seq,
            }
            for d in trail
        ],
    }


async def _document(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise HTTPException(413, f"the request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        return bodies.decode_yaml(raw) if raw.strip() else None
    except bodies.BodyError as e:
        raise HTTPException(400, str(e)) from None


def _job_from(document: Any) -> migration.PodMigrationJob:
    if not isinstance(document, dict):
        raise HTTPException(400, "the body must be a PodMigrationJob or {pod: {namespace, name}, mode, ttl}")
    if "pod" in document:
        pod = document["pod"]
        if not isinstance(pod, dict) or not pod.get("namespace") or not pod.get("name"):
            raise HTTPException(422, "pod must name the pod: {namespace, name}")
        document = {
            "metadata": {"name": document.get("name") or ""},
            "spec": {
                "podRef": {"namespace": pod["namespace"], "name": pod["name"], "uid": pod.get("uid", "")},
                **({"mode": document["mode"]} if document.get("mode") else {}),
                **({"ttl": document["ttl"]} if document.get("ttl") else {}),
            },
        }
    elif document.get("kind") not in (None, migration.KIND):
        raise HTTPException(422, f"the body is a {document.get('kind')}, expected {migration.KIND}")
    try:
        job = msgspec.convert(document, migration.PodMigrationJob, strict=False)
    except msgspec.ValidationError as e:
        message, _, path = str(e).rpartition(" - at `")
        raise HTTPException(422, f"not a valid PodMigrationJob: {path.rstrip('`')}: {message or e}") from None
    ref = job.spec.pod_ref
    if ref is None or not ref.namespace or not ref.name:
        raise HTTPException(422, "spec.podRef must name the pod (namespace and name)")
    names.namespace(ref.namespace, "spec.podRef.namespace")
    names.object_name(ref.name, "spec.podRef.name")
    if job.metadata.name:
        names.object_name(job.metadata.name, "metadata.name")
    if job.spec.mode and job.spec.mode not in (migration.MODE_RESERVATION_FIRST, migration.MODE_EVICT_DIRECTLY):
        raise HTTPException(422, f"spec.mode {job.spec.mode!r} is not ReservationFirst or EvictDirectly")
    meta = msgspec.structs.replace(
        job.metadata, name=job.metadata.name or str(uuid.uuid4()), resource_version="", uid=""
    )
    return msgspec.structs.replace(job, metadata=meta, status=migration.PodMigrationJobStatus())


JOB_SCHEMA: Final[dict[str, Any]] = {
    "anyOf": [
        {"$ref": "#/components/schemas/PodMigrationJob"},
        {
            "type": "object",
            "properties": {
                "pod": {
                    "type": "object",
                    "properties": {
                        "namespace": {"type": "string", "minLength": 1},
                        "name": {"type": "string", "minLength": 1},
                        "uid": {"type": "string"},
                    },
                    "required": ["namespace", "name"],
                },
                "name": {"type": "string"},
                "mode": {"enum": [migration.MODE_RESERVATION_FIRST, migration.MODE_EVICT_DIRECTLY]},
                "ttl": {"type": "string"},
            },
            "required": ["pod"],
        },
    ]
}
"""A PodMigrationJob or the short form, as JSON or YAML."""
BODY_TYPES: Final = (migration.PodMigrationJob,)
"""Whose JSON schemas the OpenAPI document declares (services.api.app)."""
CONFLICT: Final[dict[int | str, dict[str, Any]]] = {409: {"description": "A job of that name exists or has ended"}}


@router.post(
    "/migrations",
    status_code=202,
    summary="Ask for a pod to be migrated (goes through arbitration)",
    responses=CONFLICT,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A PodMigrationJob (JSON or YAML) or {pod: {namespace, name}, mode, ttl}",
            "content": {"application/json": {"schema": JOB_SCHEMA}, "application/yaml": {"schema": JOB_SCHEMA}},
        }
    },
)
async def request_migration(request: Request, identity: Admin) -> Any:
    job = _job_from(await _document(request))
    if await _store(request).job(job.metadata.name) is not None:
        raise HTTPException(409, f"a migration job named {job.metadata.name!r} already exists")
    try:
        ack = await _client(request).request(job, actor=identity.name)
    except BusUnavailableError as e:
        raise HTTPException(503, f"the bus does not answer: {e}") from None
    if ack.duplicate:
        raise HTTPException(409, f"a migration job named {job.metadata.name!r} was just requested")
    body = {"name": job.metadata.name, "seq": ack.seq, "status": "requested: the arbiter decides within a round"}
    return JSONResponse(body, status_code=202)


@router.post("/migrations/{name}/abort", summary="Abort a migration job that has not finished", responses=CONFLICT)
async def abort_migration(request: Request, name: str, identity: Admin) -> Any:
    names.object_name(name)
    record = await _store(request).job(name)
    if record is None:
        raise HTTPException(404, f"no migration job named {name!r}")
    if record.phase in migration.TERMINAL_PHASES:
        raise HTTPException(409, f"migration job {name} has already ended ({record.phase}: {record.reason})")
    try:
        seq = await _client(request).abort(name, actor=identity.name)
    except BusUnavailableError as e:
        raise HTTPException(503, f"the bus does not answer: {e}") from None
    return JSONResponse({"name": name, "seq": seq, "status": "abort requested"}, status_code=202)


# --- the descheduler's rounds

NO_ROUND: Final = (
    "the descheduler has run no LowNodeLoad round yet (it runs one every deschedulingInterval when the migration "
    "args file has lowNodeLoadArgs)"
)


@router.get(
    "/descheduler/rounds/latest",
    tags=["descheduler"],
    summary="The descheduler's newest LowNodeLoad round: each node's class and why, what it asked to move",
    responses={
        404: {"description": "No round yet"},
        503: {"description": "The bus, or the descheduler's stream, is not there"},
    },
)
async def latest_descheduler_round(request: Request) -> Response:
    try:
        view = await _client(request).latest_round()
    except BusUnavailableError as e:
        raise HTTPException(503, f"the bus does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, str(e)) from None
    except BusError as e:  # the stream is made by the first migration service to start
        raise HTTPException(503, f"the descheduler's rounds cannot be read (no migration service yet?): {e}") from None
    if view is None:
        raise HTTPException(404, NO_ROUND)
    return Response(encode_round(view), media_type="application/json")


@router.get(
    "/descheduler/plan",
    tags=["descheduler"],
    summary="A LowNodeLoad round computed now over the migration service's state, nothing acted on (a dry run)",
    responses={503: {"description": "No migration service answered"}, 502: {"description": "It failed"}},
)
async def plan_descheduler_round(request: Request) -> Response:
    try:
        view = await _client(request).plan()
    except BusUnavailableError as e:
        raise HTTPException(503, f"no migration service answered the plan request: {e}") from None
    except BusError as e:
        raise HTTPException(502, f"the migration service failed to plan: {e}") from None
    return Response(encode_round(view), media_type="application/json")
