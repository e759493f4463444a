"""REST routes of the ClusterColocationProfiles koordbus holds: create, list, get, replace, merge-patch and delete, in
Kubernetes shape (issue 24 point 1).

Built into the webhook component (services.webhook.component) and mounted by services.api.app under /api/v1. A
profile written here is appended to the profile log (stream KOORD_CCP, services.webhook.client) and the webhook's
Pod mutation applies it like a profile made in the cluster; for a name both hold, the log's wins (docs/webhook.md).
Reads need the viewer role, writes admin (a profile changes every Pod it matches, cluster-wide). Bodies are JSON or
YAML (`Content-Type: application/yaml`), checked by services.webhook.profiles before anything is appended: a bad
profile is a 422 `{"error": "<field>: <why>", "field": "<field>"}`, a body that is no object or no document a 400,
one over 1 MiB (the API's cap) or whose profile encodes to more than 256 KiB a 413. `metadata.resourceVersion` (the
profile's last stream sequence) is honoured on PUT and PATCH, `?resourceVersion=` on DELETE: 409 when the profile
changed since it was read, as when a profile of that name exists (POST) or another writer won the race. `?dryRun=true`
checks and appends nothing. The bus away is a 503.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, Final, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from bus import streams
from bus.api import PublishAck
from bus.errors import BusUnavailableError, ConflictError, PayloadTooLargeError, RemoteError
from schemas import names
from schemas.cluster import ColocationProfile
from services.common import auth, bodies
from services.common.component import required
from services.webhook import profiles
from services.webhook.client import ProfileClient, StoredProfile

router = APIRouter(prefix="/api/v1", tags=["colocation profiles"])

Admin = Annotated[auth.Identity, Depends(auth.require(auth.ADMIN))]
DryRun = Annotated[bool, Query(alias="dryRun", description="check only: append nothing")]
T = TypeVar("T")

_STRINGS: Final = {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR: Final = {
    "type": "object",
    "properties": {
        "matchLabels": _STRINGS,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["key", "operator"],
            },
        },
    },
}
PROFILE_SCHEMA: Final = {
    "type": "object",
    "description": "A ClusterColocationProfile (config.koordinator.sh/v1alpha1), spec §10.1",
    "properties": {
        "apiVersion": {"type": "string", "enum": [profiles.API_VERSION]},
        "kind": {"type": "string", "enum": [profiles.KIND]},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": names.MAX_OBJECT_NAME},
                "labels": _STRINGS,
                "annotations": _STRINGS,
                "resourceVersion": {"type": "string"},
            },
        },
        "spec": {
            "type": "object",
            "properties": {
                "namespaceSelector": _SELECTOR,
                "selector": _SELECTOR,
                "probability": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string"}]},
                "labels": _STRINGS,
                "annotations": _STRINGS,
                "labelKeysMapping": _STRINGS,
                "annotationKeysMapping": _STRINGS,
                "labelSuffixes": _STRINGS,
                "schedulerName": {"type": "string"},
                "qosClass": {"type": "string", "enum": list(profiles.QOS_CLASSES)},
                "priorityClassName": {"type": "string"},
                "koordinatorPriority": {"type": "integer", "minimum": profiles.INT32[0], "maximum": profiles.INT32[1]},
                "patch": {"type": "object", "description": "a strategic merge patch of the Pod"},
            },
            "additionalProperties": False,
        },
    },
}
EXAMPLE: Final = {
    "apiVersion": profiles.API_VERSION,
    "kind": profiles.KIND,
    "metadata": {"name": "colocation-batch-jobs"},
    "spec": {
        "namespaceSelector": {"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
        "selector": {"matchExpressions": [{"key": "job-name", "operator": "Exists"}]},
        "qosClass": "BE",
        "priorityClassName": "koord-batch",
        "schedulerName": "koord-scheduler",
    },
}
WRITE_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    400: {"description": "The body is not JSON/YAML or not an object"},
    404: {"description": "No profile of that name (PUT, PATCH, DELETE)"},
    409: {"description": "The profile exists (POST), changed since it was read, or another writer won the race"},
    413: {"description": "The body is over 1 MiB or the profile encodes to more than 256 KiB"},
    422: {"description": "The profile breaks a rule; `field` names where (spec.qosClass, spec.selector …)"},
    503: {"description": "The bus does not answer"},
}


def _body(description: str, schema: dict[str, Any], example: Any) -> dict[str, Any]:
    content = {"application/json": {"schema": schema, "example": example}, "application/yaml": {"schema": schema}}
    return {"requestBody": {"required": True, "description": description, "content": content}}


PROFILE_BODY: Final = _body("A ClusterColocationProfile, as kubectl prints it", PROFILE_SCHEMA, EXAMPLE)


@dataclass(frozen=True)
class ProfileAccess:
    """The profile log, read and appended to by these routes."""

    client: ProfileClient


def _client(request: Request) -> ProfileClient:
    missing = "colocation profiles are not available: this API runs without a connection to the bus"
    return required(request, ProfileAccess, missing=missing).client


async def _bus(call: Awaitable[T]) -> T:
    try:
        return await call
    except ConflictError:
        raise HTTPException(409, "another writer changed the profile meanwhile: read it again and retry") from None
    except PayloadTooLargeError as e:
        raise HTTPException(413, f"the profile is too large for the bus once encoded: {e}") from None
    except BusUnavailableError as e:
        raise HTTPException(503, f"the bus does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, str(e)) from None


async def _document(request: Request) -> Any:
    """The body as a document; its size is capped by services.common.bodies.BodyLimit before it is read."""
    raw = await request.body()
    if not raw.strip():
        raise HTTPException(400, "the request body is empty")
    try:
        if "yaml" in request.headers.get("content-type", ""):
            return bodies.decode_yaml(raw)
        return bodies.decode_json(raw)
    except bodies.BodyError as e:
        raise HTTPException(400, str(e)) from None


class _Refused(Exception):
    def __init__(self, error: profiles.Invalid) -> None:
        self.response = JSONResponse({"error": str(error), "field": error.field}, status_code=error.status)


def _clean(document: Any, *, name: str = "") -> tuple[ColocationProfile, str]:
    try:
        return profiles.clean(document, name=name)
    except profiles.Invalid as e:
        raise _Refused(e) from None


def _command_id(request: Request) -> str:
    """The client's Idempotency-Key when it sends one (a retried request is then not applied twice)."""
    key = request.headers.get("idempotency-key", "")
    return key[:128] if key else uuid.uuid4().hex


def _precondition(name: str, version: str, seq: int) -> None:
    if version and version != str(seq):
        raise HTTPException(
            409, f"profile {name!r} changed since it was read (resourceVersion {names.shown(version)}, now {seq})"
        )


async def _existing(client: ProfileClient, name: str) -> tuple[int, StoredProfile]:
    seq, stored = await _bus(client.current(name))
    if stored is None:
        raise HTTPException(404, f"no colocation profile named {name!r}")
    return seq, stored


def _written(profile: ColocationProfile, ack: PublishAck, *, status: int = 200) -> JSONResponse:
    return JSONResponse(profiles.render(profile, resource_version=ack.seq), status_code=status)


@router.get(
    "/colocation-profiles",
    summary="Every ClusterColocationProfile koordbus holds, in name order, and which of the cluster's apply",
)
async def list_profiles(request: Request) -> dict[str, Any]:
    """`items`: koordbus's profiles. `cluster`: the names of the cluster's own profiles (as the Kubernetes bridge
    published them), `applied` by the webhook next to these or `shadowed` by one of these of the same name."""
    client = _client(request)
    stored = await _bus(client.all())
    ours = {s.profile.metadata.name for s in stored}
    theirs = await _bus(client.cluster_names())
    return {
        "apiVersion": profiles.API_VERSION,
        "kind": profiles.LIST_KIND,
        "items": [profiles.render(s.profile, resource_version=s.seq) for s in stored],
        "cluster": {
            "applied": [name for name in theirs if name not in ours],
            "shadowed": [name for name in theirs if name in ours],
        },
    }


@router.get(
    "/colocation-profiles/{name}",
    summary="One ClusterColocationProfile koordbus holds",
    responses={404: {"description": "No profile of that name"}},
)
async def get_profile(request: Request, name: str) -> dict[str, Any]:
    names.object_name(name)
    seq, stored = await _existing(_client(request), name)
    return profiles.render(stored.profile, resource_version=seq)


@router.post(
    "/colocation-profiles",
    status_code=201,
    summary="Create a ClusterColocationProfile (the webhook applies it to Pods created from then on)",
    responses=WRITE_RESPONSES,
    openapi_extra=PROFILE_BODY,
)
async def create_profile(request: Request, identity: Admin, dry_run: DryRun = False) -> Any:
    try:
        profile, _ = _clean(await _document(request))
    except _Refused as refused:
        return refused.response
    client, name = _client(request), profile.metadata.name
    seq, stored = await _bus(client.current(name))
    command_id = _command_id(request)
    if stored is not None and stored.command_id == command_id:  # a retried request (its Idempotency-Key) was stored
        return JSONResponse(profiles.render(stored.profile, resource_version=seq), status_code=201)
    if stored is not None:
        raise HTTPException(409, f"a colocation profile named {name!r} exists (replace it with PUT or PATCH)")
    if seq == 0 and await _bus(client.stored_names()) >= streams.MAX_STORED_PROFILES:
        raise HTTPException(
            422, f"koordbus holds {streams.MAX_STORED_PROFILES} profile names, deleted ones included: no new name"
        )
    if dry_run:
        return JSONResponse(profiles.render(profile, resource_version=seq))
    ack = await _bus(client.put(profile, expected_seq=seq, actor=identity.name, command_id=command_id))
    return _written(profile, ack, status=201)


@router.put(
    "/colocation-profiles/{name}",
    summary="Replace a ClusterColocationProfile",
    responses=WRITE_RESPONSES,
    openapi_extra=PROFILE_BODY,
)
async def replace_profile(request: Request, name: str, identity: Admin, dry_run: DryRun = False) -> Any:
    names.object_name(name)
    try:
        profile, version = _clean(await _document(request), name=name)
    except _Refused as refused:
        return refused.response
    client = _client(request)
    seq, _ = await _existing(client, name)
    _precondition(name, version, seq)
    if dry_run:
        return JSONResponse(profiles.render(profile, resource_version=seq))
    ack = await _bus(client.put(profile, expected_seq=seq, actor=identity.name, command_id=_command_id(request)))
    return _written(profile, ack)


@router.patch(
    "/colocation-profiles/{name}",
    summary="Change a ClusterColocationProfile with a JSON merge patch (RFC 7386)",
    responses=WRITE_RESPONSES,
    openapi_extra=_body(
        "A JSON merge patch of the profile (`null` removes a field)", {"type": "object"}, {"spec": {"probability": 50}}
    ),
)
async def patch_profile(request: Request, name: str, identity: Admin, dry_run: DryRun = False) -> Any:
    names.object_name(name)
    patch = await _document(request)
    client = _client(request)
    seq, stored = await _existing(client, name)
    try:
        try:
            document, version = profiles.patched(stored.profile, patch)
        except profiles.Invalid as e:
            raise _Refused(e) from None
        profile, _ = _clean(document, name=name)
    except _Refused as refused:
        return refused.response
    _precondition(name, version, seq)
    if dry_run:
        return JSONResponse(profiles.render(profile, resource_version=seq))
    ack = await _bus(client.put(profile, expected_seq=seq, actor=identity.name, command_id=_command_id(request)))
    return _written(profile, ack)


@router.delete(
    "/colocation-profiles/{name}",
    summary="Delete a ClusterColocationProfile (Pods created from then on no longer get it)",
    responses=WRITE_RESPONSES,
)
async def delete_profile(
    request: Request,
    name: str,
    identity: Admin,
    resource_version: Annotated[
        str, Query(alias="resourceVersion", max_length=32, description="delete only at this version")
    ] = "",
    dry_run: DryRun = False,
) -> Any:
    names.object_name(name)
    client = _client(request)
    seq, _ = await _existing(client, name)
    _precondition(name, resource_version, seq)
    if dry_run:
        return {"kind": "Status", "status": "Success", "details": {"name": name, "dryRun": True}}
    ack = await _bus(client.delete(name, expected_seq=seq, actor=identity.name, command_id=_command_id(request)))
    return {"kind": "Status", "status": "Success", "details": {"name": name, "seq": ack.seq}}
