"""REST admin API of the elastic quota trees: ElasticQuota and ElasticQuotaProfile objects in Kubernetes shape, the
tree view, each quota's history, the admission check and what-ifs.

Built into the quota component (services.quota.component) and mounted by services.api.app under /api/v1. Reads come
from the quota projections (services.quota.store, provided as `QuotaReads`), so they work while the quota service is
down; writes, checks and what-ifs are requests to the quota service (services.quota.client, provided as
`QuotaRequests`), which validates every command against the current tree and appends it with optimistic
concurrency. Reads need the viewer role, writes quota-admin. Bodies are JSON or YAML (`Content-Type:
application/yaml`), so `kubectl get elasticquota NAME -o yaml` output can be posted as is: status, uid and the
other server-set fields are dropped; `metadata.resourceVersion` is honoured on PUT and PATCH (409 when the quota
changed since it was read; leave it out to overwrite). Errors are JSON `{"error": ...}`; a rejected command is a
422 that also lists every violation (`{"quota", "field", "rule", "message"}`), a lost race a 409, a quota service
that does not answer a 503.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from bus.errors import BusUnavailableError, PayloadTooLargeError, RemoteError
from schemas import kube, names, quota
from schemas import quota_events as ev
from schemas.quota_service import (
    CheckRequest,
    CommandReply,
    CommandRequest,
    PodBatch,
    QuotaStatusComputed,
    WhatIfRequest,
)
from services.common import auth, bodies
from services.common.component import required
from services.quota.client import QuotaClient
from services.quota.core import DEFAULT_TREE
from services.quota.store import QuotaStore

router = APIRouter(prefix="/api/v1", tags=["quotas"])

DEFAULT_HISTORY: Final = 50
LIST_API_VERSION: Final = "v1"

Writer = Annotated[auth.Identity, Depends(auth.require(auth.QUOTA_ADMIN))]

WRITE_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON/YAML or not an object"},
    409: {"description": "The object changed since it was read, already exists, or another writer won the race"},
    413: {"description": "The body is larger than 1 MiB"},
    422: {"description": "The command breaks quota rules; `violations` lists each (quota, field, rule, message)"},
    503: {"description": "The quota service does not answer"},
}


def ref(name: str) -> dict[str, str]:
    """A body type's schema in the OpenAPI document (services.api.app adds the component's body types' schemas)."""
    return {"$ref": f"#/components/schemas/{name}"}


BODY_TYPES: Final = (quota.ElasticQuota, quota.ElasticQuotaProfile, kube.Pod)
"""The Kubernetes objects bodies carry, whose JSON schemas the OpenAPI document declares (from their msgspec types)."""


def body(description: str, schema: dict[str, Any], example: Any) -> dict[str, Any]:
    """OpenAPI for a route that reads its body itself: `schema` as JSON or as YAML."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {
                "application/json": {"schema": schema, "example": example},
                "application/yaml": {"schema": schema},
            },
        }
    }


def _list_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


NAMES: Final = _list_of({"type": "string", "minLength": 1})
WHAT_IF_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "create": _list_of(ref("ElasticQuota")),
        "update": _list_of(ref("ElasticQuota")),
        "patch": {"type": "object", "additionalProperties": {"type": "object"}},
        "delete": NAMES,
        "pods": _list_of(
            {
                "type": "object",
                "properties": {
                    "pod": ref("Pod"),
                    "count": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
                    "assigned": {"type": "boolean"},
                },
                "required": ["pod"],
            }
        ),
    },
    "additionalProperties": False,
}
PODS_SCHEMA: Final = {
    "anyOf": [
        ref("Pod"),
        {"type": "object", "properties": {"items": _list_of(ref("Pod"))}, "required": ["items"]},
        {"type": "object", "properties": {"pods": _list_of(ref("Pod"))}, "required": ["pods"]},
    ]
}


EXAMPLE_QUOTA: Final = {
    "apiVersion": quota.API_VERSION,
    "kind": quota.KIND,
    "metadata": {"name": "team-a", "namespace": "teams", "labels": {quota.LABEL_PARENT: "org"}},
    "spec": {"min": {"cpu": "10", "memory": "20Gi"}, "max": {"cpu": "40", "memory": "80Gi"}},
}
EXAMPLE_POD: Final = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train-0", "namespace": "ml", "labels": {quota.LABEL_QUOTA_NAME: "team-a"}},
    "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]},
}
QUOTA_BODY: Final = body(
    "An ElasticQuota (scheduling.sigs.k8s.io/v1alpha1), as kubectl prints it", ref("ElasticQuota"), EXAMPLE_QUOTA
)
PROFILE_BODY: Final = body(
    "An ElasticQuotaProfile (quota.koordinator.sh/v1alpha1)", ref("ElasticQuotaProfile"), {"metadata": {"name": "p"}}
)


# --- plumbing


@dataclass(frozen=True)
class QuotaReads:
    """The quota projections the read routes use."""

    store: QuotaStore


@dataclass(frozen=True)
class QuotaRequests:
    """The quota service, asked over the bus by the write, check and what-if routes."""

    client: QuotaClient


def _store(request: Request) -> QuotaStore:
    missing = "quotas are not available: this API runs without the quota store"
    return required(request, QuotaReads, missing=missing).store


def _client(request: Request) -> QuotaClient:
    missing = "quota writes are not available: this API runs without a connection to the bus"
    return required(request, QuotaRequests, missing=missing).client


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


def _convert(document: Any, kind: str, target: type[Any], *, where: str = "body") -> Any:
    if not isinstance(document, dict):
        raise HTTPException(400, f"the {where} must be a {kind} object, not {type(document).__name__}")
    given = document.get("kind")
    if given not in (None, kind):
        hint = "; send the items one by one (koordbus quota apply does)" if str(given).endswith("List") else ""
        raise HTTPException(422, f"the {where} is a {given}, expected {kind}{hint}")
    try:
        return msgspec.convert(document, target, strict=False)
    except msgspec.ValidationError as e:
        raise HTTPException(422, f"the {where} is not a valid {kind}: {_where(e)}") from None


def _where(error: msgspec.ValidationError) -> str:
    message, _, path = str(error).rpartition(" - at `")
    return f"{path.rstrip('`')}: {message}" if message else str(error)


def _clean_quota(obj: quota.ElasticQuota) -> tuple[quota.ElasticQuota, str]:
    """The object as a command carries it (server-set fields dropped) and the resourceVersion it was read at."""
    meta = obj.metadata
    clean = kube.ObjectMeta(
        name=meta.name,
        namespace=meta.namespace or quota.QUOTA_NAMESPACE,
        labels=meta.labels,
        annotations=meta.annotations,
    )
    annotations = {k: v for k, v in clean.annotations.items() if k not in quota.WRITE_BACK_ANNOTATIONS}
    clean = msgspec.structs.replace(clean, annotations=annotations)
    return msgspec.structs.replace(obj, metadata=clean, status=quota.ElasticQuotaStatus()), meta.resource_version


def _clean_profile(profile: quota.ElasticQuotaProfile) -> tuple[quota.ElasticQuotaProfile, str]:
    meta = profile.metadata
    clean = kube.ObjectMeta(name=meta.name, namespace=meta.namespace, labels=meta.labels, annotations=meta.annotations)
    return msgspec.structs.replace(profile, metadata=clean, status={}), meta.resource_version


async def _run(
    request: Request, identity: auth.Identity, command: ev.QuotaCommand, *, version: str = "", dry_run: bool = False
) -> CommandReply:
    try:
        reply = await _client(request).command(
            CommandRequest(actor=identity.name, command=command, expected_resource_version=version, dry_run=dry_run)
        )
    except PayloadTooLargeError as e:
        raise HTTPException(413, f"the request is too large for the bus once encoded: {e}; send less") from None
    except BusUnavailableError as e:
        raise HTTPException(503, f"the quota service does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, f"the quota service failed: {e}") from None
    if reply.outcome in ("applied", "valid"):
        return reply
    if reply.outcome == "rejected":
        rules = {v.rule for v in reply.violations}
        status = 404 if rules == {"exists"} else 409 if rules == {"name-unique"} else 422
        body = {"error": reply.message, "violations": [msgspec.to_builtins(v) for v in reply.violations]}
        raise _Answer(JSONResponse(body, status_code=status))
    status = 409 if reply.outcome == "conflict" else 503
    raise HTTPException(status, reply.message)


class _Answer(Exception):
    """A finished error response (with more than the usual `error` field)."""

    def __init__(self, response: JSONResponse) -> None:
        self.response = response


def render(status: QuotaStatusComputed) -> dict[str, Any]:
    """A quota's object in Kubernetes shape with the computed annotations and status.used (as koord-scheduler
    writes them back)."""
    if status.object is None:
        return {"apiVersion": quota.API_VERSION, "kind": quota.KIND, "metadata": {"name": status.quota}}
    return quota.render_elastic_quota(quota.quota_spec(status.object), status.state)


def _render_object(obj: quota.ElasticQuota) -> dict[str, Any]:
    return quota.render_elastic_quota(quota.quota_spec(obj))


def figures(state: quota.QuotaState | None) -> dict[str, Any]:
    """A state's lists as quantity strings (cpu in cores/millicores, memory in bytes with binary suffixes)."""
    if state is None:
        return {}
    fields = {
        "min": state.min,
        "max": state.max,
        "scaledMin": state.scaled_min,
        "runtime": state.runtime,
        "request": state.request,
        "limitedRequest": state.limited_request,
        "used": state.used,
        "nonPreemptibleRequest": state.non_preemptible_request,
        "nonPreemptibleUsed": state.non_preemptible_used,
        "guaranteed": state.guaranteed,
        "allocated": state.allocated,
    }
    return {key: quota.format_quota_resources(rl) for key, rl in fields.items()}


# --- quotas


@router.get("/quotas", summary="Every ElasticQuota (optionally of one tree), with computed annotations")
async def list_quotas(
    request: Request,
    tree: Annotated[str | None, Query(description="only this tree ('default' for the main one)")] = None,
) -> dict[str, Any]:
    if tree is not None:
        names.tree_id(tree)
    statuses = await _store(request).quotas(tree=tree)
    return {
        "apiVersion": LIST_API_VERSION,
        "kind": "ElasticQuotaList",
        "items": [render(s) for s in statuses if s.object is not None],
    }


@router.get("/quotas/{name}", summary="One ElasticQuota with its computed annotations and status.used")
async def get_quota(request: Request, name: str) -> dict[str, Any]:
    names.object_name(name)
    status = await _store(request).quota(name)
    if status is None or status.object is None or status.deleted:
        raise HTTPException(404, f"no quota named {name!r}")
    return render(status)


@router.get("/quotas/{name}/explain", summary="Why the quota has its runtime: figures, pods and the distribution")
async def explain_quota(request: Request, name: str) -> dict[str, Any]:
    names.object_name(name)
    status = await _store(request).quota(name)
    if status is None:
        raise HTTPException(404, f"no quota named {name!r}")
    return {
        "quota": name,
        "tree": status.tree,
        "pods": status.pods,
        "attached": status.state.attached if status.state is not None else False,
        "figures": figures(status.state),
        "explanation": msgspec.to_builtins(status.explanation) if status.explanation is not None else None,
        "computedAt": status.computed_at,
        "eventsSeq": status.events_seq,
    }


@router.get("/quotas/{name}/history", summary="The quota's events, newest first")
async def quota_history(
    request: Request, name: str, limit: Annotated[int, Query(ge=1, le=1000)] = DEFAULT_HISTORY
) -> dict[str, Any]:
    names.object_name(name)
    events = await _store(request).history(name, limit=limit)
    if not events and await _store(request).quota(name) is None:
        raise HTTPException(404, f"no quota named {name!r} and no events for that name")
    return {
        "kind": "QuotaHistory",
        "quota": name,
        "items": [
            {
                "seq": e.stream_seq,
                "type": e.type,
                "actor": e.actor,
                "time": e.time,
                "commandId": e.command_id,
                "tree": e.tree,
                "object": _history_object(e.event, name),
            }
            for e in events
        ],
    }


def _history_object(event: Mapping[str, Any], name: str) -> Any:
    for obj in event.get("quotas") or ():  # an import: the row's own quota
        if isinstance(obj, dict) and (obj.get("metadata") or {}).get("name") == name:
            return obj
    return event.get("quota") or event.get("profile")


@router.post(
    "/quotas", status_code=201, summary="Create an ElasticQuota", responses=WRITE_RESPONSES, openapi_extra=QUOTA_BODY
)
async def create_quota(request: Request, identity: Writer) -> Any:
    try:
        obj, _ = _clean_quota(_convert(await _document(request), quota.KIND, quota.ElasticQuota))
        reply = await _run(request, identity, ev.CreateQuota(command_id=_command_id(request), quota=obj))
    except _Answer as answer:
        return answer.response
    assert reply.quota is not None
    return JSONResponse(_render_object(reply.quota), status_code=201)


@router.post(
    "/quotas/import",
    summary="Adopt existing ElasticQuotas as one validated batch",
    responses=WRITE_RESPONSES,
    openapi_extra=body(
        "An ElasticQuotaList, a JSON array or {items: [...]}",
        {
            "anyOf": [
                {**_list_of(ref("ElasticQuota")), "minItems": 1},
                {
                    "type": "object",
                    "properties": {"items": {**_list_of(ref("ElasticQuota")), "minItems": 1}},
                    "required": ["items"],
                },
            ]
        },
        {"items": [EXAMPLE_QUOTA]},
    ),
)
async def import_quotas(
    request: Request,
    identity: Writer,
    dry_run: Annotated[bool, Query(alias="dryRun", description="validate only; append nothing")] = False,
) -> Any:
    """Body: an ElasticQuotaList (`kubectl get elasticquota -A -o yaml`), a JSON array or `{"items": [...]}`. The
    quotas are validated together as trees (any order: parents are placed first), each created or, when a quota of
    that name exists, replaced; one invalid quota refuses the whole import and the 422 lists every violation."""
    try:
        document = await _document(request)
        items = (
            document if isinstance(document, list) else document.get("items") if isinstance(document, dict) else None
        )
        if not isinstance(items, list) or not items:
            raise HTTPException(422, "the body must be a non-empty list of ElasticQuota objects (a List's items)")
        quotas = tuple(
            _clean_quota(_convert(item, quota.KIND, quota.ElasticQuota, where=f"item {i}"))[0]
            for i, item in enumerate(items)
        )
        command = ev.ImportQuotas(command_id=_command_id(request), quotas=quotas)
        reply = await _run(request, identity, command, dry_run=dry_run)
    except _Answer as answer:
        return answer.response
    changed = [q.metadata.name for q in reply.quotas]
    return {
        "dryRun": dry_run,
        "changed": changed,
        "unchanged": sorted({q.metadata.name for q in quotas} - set(changed)),
        "seq": reply.seq,
    }


@router.put("/quotas/{name}", summary="Replace an ElasticQuota", responses=WRITE_RESPONSES, openapi_extra=QUOTA_BODY)
async def replace_quota(request: Request, name: str, identity: Writer) -> Any:
    names.object_name(name)
    try:
        obj, version = _clean_quota(_convert(await _document(request), quota.KIND, quota.ElasticQuota))
        if obj.metadata.name and obj.metadata.name != name:
            raise HTTPException(422, f"the body names quota {obj.metadata.name!r} but the path {name!r}")
        obj = msgspec.structs.replace(obj, metadata=msgspec.structs.replace(obj.metadata, name=name))
        reply = await _run(
            request, identity, ev.UpdateQuota(command_id=_command_id(request), quota=obj), version=version
        )
    except _Answer as answer:
        return answer.response
    assert reply.quota is not None
    return _render_object(reply.quota)


@router.patch(
    "/quotas/{name}",
    summary="Change an ElasticQuota with a JSON merge patch",
    responses=WRITE_RESPONSES,
    openapi_extra=body(
        "A JSON merge patch (RFC 7386) of the ElasticQuota", {"type": "object"}, {"spec": {"min": {"cpu": "12"}}}
    ),
)
async def patch_quota(request: Request, name: str, identity: Writer) -> Any:
    names.object_name(name)
    try:
        patch = await _document(request)
        if not isinstance(patch, dict):
            raise HTTPException(400, "a merge patch must be an object")
        version = str(
            ((patch.get("metadata") or {}) if isinstance(patch.get("metadata"), dict) else {}).get(
                "resourceVersion", ""
            )
            or ""
        )
        patch = _strip_server_fields(patch)
        command = ev.PatchQuota(command_id=_command_id(request), name=name, patch=patch)
        reply = await _run(request, identity, command, version=version)
    except _Answer as answer:
        return answer.response
    assert reply.quota is not None
    return _render_object(reply.quota)


def _strip_server_fields(patch: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in patch.items() if k != "status"}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in ("resourceVersion", "uid", "managedFields")}
    return out


@router.delete(
    "/quotas/{name}",
    summary="Delete an ElasticQuota (refused while it has children or pods)",
    responses=WRITE_RESPONSES,
)
async def delete_quota(
    request: Request,
    name: str,
    identity: Writer,
    resource_version: Annotated[str, Query(alias="resourceVersion", description="delete only at this version")] = "",
) -> Any:
    names.object_name(name)
    try:
        reply = await _run(
            request, identity, ev.DeleteQuota(command_id=_command_id(request), name=name), version=resource_version
        )
    except _Answer as answer:
        return answer.response
    assert reply.quota is not None
    return {"kind": "Status", "status": "Success", "details": {"name": name, "seq": reply.seq}}


@router.post(
    "/quotas/{name}/namespaces",
    summary="Attach and/or detach namespaces",
    responses=WRITE_RESPONSES,
    openapi_extra=body(
        "Namespaces to attach and to detach",
        {"type": "object", "properties": {"attach": NAMES, "detach": NAMES}, "additionalProperties": False},
        {"attach": ["ml"], "detach": []},
    ),
)
async def change_namespaces(request: Request, name: str, identity: Writer) -> Any:
    """Body `{"attach": ["ns1"], "detach": ["ns2"]}`: pods in attached namespaces resolve to this quota (§3.4)."""
    names.object_name(name)
    try:
        document = await _document(request)
        if not isinstance(document, dict) or not set(document) <= {"attach", "detach"}:
            raise HTTPException(422, 'the body must be {"attach": [namespaces], "detach": [namespaces]}')
        reply: CommandReply | None = None
        for key, make in (("attach", ev.AttachNamespaces), ("detach", ev.DetachNamespaces)):
            namespaces = document.get(key) or []
            if not isinstance(namespaces, list) or not all(isinstance(n, str) and n for n in namespaces):
                raise HTTPException(422, f"{key} must be a list of namespace names")
            if namespaces:
                command = make(command_id=f"{_command_id(request)}-{key}", name=name, namespaces=tuple(namespaces))
                reply = await _run(request, identity, command)
    except _Answer as answer:
        return answer.response
    if reply is None or reply.quota is None:
        raise HTTPException(422, "nothing to attach or detach")
    return _render_object(reply.quota)


def _command_id(request: Request) -> str:
    """The client's Idempotency-Key when it sends one (a retried request is then not applied twice)."""
    return request.headers.get("idempotency-key") or uuid.uuid4().hex


# --- trees


@router.get("/quota-trees", summary="Every quota tree with its total and problems")
async def list_trees(request: Request) -> dict[str, Any]:
    trees = await _store(request).trees()
    return {"items": [_tree_summary(t) for t in trees]}


def _tree_summary(tree: Any) -> dict[str, Any]:
    return {
        "tree": tree.tree,
        "total": quota.format_quota_resources(tree.total),
        "quotaCount": tree.quotas,
        "problems": list(tree.problems),
        "eventsSeq": tree.events_seq,
        "computedAt": tree.computed_at,
    }


@router.get("/quota-trees/{tree}", summary="A whole tree: min, max, runtime, request, used per quota")
async def get_tree(request: Request, tree: str) -> dict[str, Any]:
    names.tree_id(tree)
    store = _store(request)
    summary = await store.tree(tree)
    statuses = await store.quotas(tree=tree)
    if summary is None and not statuses:
        raise HTTPException(404, f"no quota tree named {tree!r} (the main tree is {DEFAULT_TREE!r})")
    children: dict[str, list[str]] = {}
    for status in statuses:
        if status.state is not None and status.state.parent:
            children.setdefault(status.state.parent, []).append(status.quota)
    nodes = [
        {
            "name": s.quota,
            "parent": s.state.parent if s.state is not None else "",
            "children": sorted(children.get(s.quota, [])),
            "attached": s.state.attached if s.state is not None else False,
            "pods": s.pods,
            "problems": list(s.problems),
            **figures(s.state),
        }
        for s in statuses
    ]
    out: dict[str, Any] = {"kind": "QuotaTree", "tree": tree, "quotas": nodes}
    if summary is not None:
        out.update(_tree_summary(summary))
    return out


# --- profiles


@router.get("/quota-profiles", summary="Every ElasticQuotaProfile")
async def list_profiles(request: Request) -> dict[str, Any]:
    return {
        "apiVersion": LIST_API_VERSION,
        "kind": "ElasticQuotaProfileList",
        "items": await _store(request).profiles(),
    }


@router.get("/quota-profiles/{name}", summary="One ElasticQuotaProfile")
async def get_profile(request: Request, name: str) -> dict[str, Any]:
    names.object_name(name)
    for profile in await _store(request).profiles():
        if profile.get("metadata", {}).get("name") == name:
            return dict(profile)
    raise HTTPException(404, f"no quota profile named {name!r}")


@router.post(
    "/quota-profiles",
    status_code=201,
    summary="Create an ElasticQuotaProfile",
    responses=WRITE_RESPONSES,
    openapi_extra=PROFILE_BODY,
)
async def create_profile(request: Request, identity: Writer) -> Any:
    try:
        document = await _document(request)
        profile, _ = _clean_profile(_convert(document, quota.PROFILE_KIND, quota.ElasticQuotaProfile))
        reply = await _run(request, identity, ev.CreateProfile(command_id=_command_id(request), profile=profile))
    except _Answer as answer:
        return answer.response
    assert reply.profile is not None
    return JSONResponse(quota.profile_to_json(reply.profile), status_code=201)


@router.put(
    "/quota-profiles/{name}",
    summary="Replace an ElasticQuotaProfile",
    responses=WRITE_RESPONSES,
    openapi_extra=PROFILE_BODY,
)
async def replace_profile(request: Request, name: str, identity: Writer) -> Any:
    names.object_name(name)
    try:
        document = await _document(request)
        profile, version = _clean_profile(_convert(document, quota.PROFILE_KIND, quota.ElasticQuotaProfile))
        if profile.metadata.name and profile.metadata.name != name:
            raise HTTPException(422, f"the body names profile {profile.metadata.name!r} but the path {name!r}")
        profile = msgspec.structs.replace(profile, metadata=msgspec.structs.replace(profile.metadata, name=name))
        command = ev.UpdateProfile(command_id=_command_id(request), profile=profile)
        reply = await _run(request, identity, command, version=version)
    except _Answer as answer:
        return answer.response
    assert reply.profile is not None
    return quota.profile_to_json(reply.profile)


@router.delete("/quota-profiles/{name}", summary="Delete an ElasticQuotaProfile", responses=WRITE_RESPONSES)
async def delete_profile(request: Request, name: str, identity: Writer) -> Any:
    names.object_name(name)
    try:
        reply = await _run(request, identity, ev.DeleteProfile(command_id=_command_id(request), name=name))
    except _Answer as answer:
        return answer.response
    return {"kind": "Status", "status": "Success", "details": {"name": name, "seq": reply.seq}}


# --- check and what-if


def _pods(document: Any) -> list[kube.Pod]:
    """A Pod, a PodList (`items`) or `{"pods": [...]}`."""
    if isinstance(document, dict) and isinstance(document.get("pods"), list):
        items = document["pods"]
    elif isinstance(document, dict) and isinstance(document.get("items"), list):
        items = document["items"]
    else:
        items = [document]
    return [_convert(item, "Pod", kube.Pod, where=f"pod {i}") for i, item in enumerate(items)]


@router.post(
    "/quotas/check",
    summary="Would these pods fit their quotas (§3.8)? In order, each fitting one reserved",
    openapi_extra=body("A Pod, a PodList or {pods: [...]}", PODS_SCHEMA, EXAMPLE_POD),
)
async def check_pods(
    request: Request,
    parents: Annotated[bool | None, Query(description="also check ancestors (enableCheckParentQuota)")] = None,
) -> Any:
    pods = _pods(await _document(request))
    if not pods:
        raise HTTPException(422, "no pods to check")
    try:
        reply = await _client(request).check(CheckRequest(pods=pods, enable_check_parent_quota=parents))
    except PayloadTooLargeError as e:
        raise HTTPException(413, f"the request is too large for the bus once encoded: {e}; send less") from None
    except BusUnavailableError as e:
        raise HTTPException(503, f"the quota service does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, f"the quota service failed: {e}") from None
    return {"fits": reply.fits, "verdicts": reply.verdicts}


@router.post(
    "/quotas/what-if",
    summary="How runtimes would change: hypothetical quotas, mins, pods; nothing is written",
    openapi_extra=body(
        "{create, update: [ElasticQuota], patch: {name: mergePatch}, delete: [name], pods: [{pod, count, assigned}]}",
        WHAT_IF_SCHEMA,
        {"patch": {"team-a": {"spec": {"min": {"cpu": "20"}}}}, "pods": [{"pod": EXAMPLE_POD, "count": 10}]},
    ),
)
async def what_if(request: Request) -> Any:
    """Body: `{"create": [ElasticQuota], "update": [ElasticQuota], "patch": {"name": mergePatch}, "delete": [name],
    "pods": [{"pod": Pod, "count": N, "assigned": false}]}`, every key optional."""
    document = await _document(request)
    if not isinstance(document, dict):
        raise HTTPException(400, "the body must be an object")
    unknown = set(document) - {"create", "update", "patch", "delete", "pods"}
    if unknown:
        raise HTTPException(422, f"unknown keys {sorted(unknown)}; use create, update, patch, delete, pods")
    commands: list[ev.QuotaCommand] = []
    for i, item in enumerate(_list(document, "create")):
        obj, _ = _clean_quota(_convert(item, quota.KIND, quota.ElasticQuota, where=f"create[{i}]"))
        commands.append(ev.CreateQuota(command_id=f"what-if-{len(commands)}", quota=obj))
    for i, item in enumerate(_list(document, "update")):
        obj, _ = _clean_quota(_convert(item, quota.KIND, quota.ElasticQuota, where=f"update[{i}]"))
        commands.append(ev.UpdateQuota(command_id=f"what-if-{len(commands)}", quota=obj))
    patches = document.get("patch") or {}
    if not isinstance(patches, dict) or not all(isinstance(p, dict) for p in patches.values()):
        raise HTTPException(422, "patch must map quota names to merge patches (objects)")
    for name, patch in patches.items():
        commands.append(ev.PatchQuota(command_id=f"what-if-{len(commands)}", name=name, patch=patch))
    for i, name in enumerate(_list(document, "delete")):
        if not isinstance(name, str) or not name:
            raise HTTPException(422, f"delete[{i}] must be a quota name (a non-empty string), not {name!r}")
        commands.append(ev.DeleteQuota(command_id=f"what-if-{len(commands)}", name=name))
    batches: list[PodBatch] = []
    for i, item in enumerate(_list(document, "pods")):
        if not isinstance(item, dict) or "pod" not in item:
            raise HTTPException(422, f'pods[{i}] must be {{"pod": Pod, "count": N, "assigned": bool}}')
        count = item.get("count", 1)
        if not isinstance(count, int) or not 1 <= count <= 1_000_000:
            raise HTTPException(422, f"pods[{i}].count must be an integer from 1 to 1000000")
        pod = _convert(item["pod"], "Pod", kube.Pod, where=f"pods[{i}].pod")
        batches.append(PodBatch(pod=pod, count=count, assigned=bool(item.get("assigned", False))))
    try:
        reply = await _client(request).what_if(WhatIfRequest(commands=commands, pods=batches))
    except PayloadTooLargeError as e:
        raise HTTPException(413, f"the request is too large for the bus once encoded: {e}; send less") from None
    except BusUnavailableError as e:
        raise HTTPException(503, f"the quota service does not answer: {e}") from None
    except RemoteError as e:
        raise HTTPException(502, f"the quota service failed: {e}") from None
    return {
        "changes": [
            {
                "quota": c.quota,
                "before": figures(c.before),
                "after": figures(c.after),
                "delta": _delta(c.before, c.after),
            }
            for c in reply.changes
        ],
        "violations": [msgspec.to_builtins(v) for v in reply.violations],
        "notes": reply.notes,
    }


def _list(document: Mapping[str, Any], key: str) -> list[Any]:
    value = document.get(key) or []
    if not isinstance(value, list):
        raise HTTPException(422, f"{key} must be a list")
    return value


def _delta(before: quota.QuotaState | None, after: quota.QuotaState | None) -> dict[str, dict[str, int]]:
    """Per figure (runtime, request, used), per resource: after − before in raw units (millicores, bytes)."""
    out: dict[str, dict[str, int]] = {}
    for field in ("runtime", "request", "used"):
        was: Mapping[str, int] = getattr(before, field) if before is not None else {}
        now: Mapping[str, int] = getattr(after, field) if after is not None else {}
        changed = {k: now.get(k, 0) - was.get(k, 0) for k in set(was) | set(now) if now.get(k, 0) != was.get(k, 0)}
        if changed:
            out[field] = dict(sorted(changed.items()))
    return out
