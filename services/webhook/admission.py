"""AdmissionReview v1 in, AdmissionReview v1 out: the webhook's two handlers, pure.

kube-apiserver POSTs an `admission.k8s.io/v1` AdmissionReview whose `request` names the object (`kind`,
`resource`, `subResource`, `namespace`, `name`), the `operation` and the object (`object`, and `oldObject` at
UPDATE); the answer is an AdmissionReview whose `response` carries the request's `uid`, `allowed`, and either a
base64 RFC 6902 `patch` (`patchType: JSONPatch`) or, on refusal, a `status` with `code` and `message` (kube-apiserver
shows it as `admission webhook "…" denied the request: <message>`).

`review_request(document)` reads the request; a document that is not an AdmissionReview v1 (another apiVersion or
kind, no request, a field of the wrong type) is a BadReview naming the field, which the HTTP shell answers with a
400 (kube-apiserver then applies the webhook's failurePolicy). Everything past that is an answer, never an error:

* `mutate_pod` (spec §10.2): a Pod at CREATE (not a subresource) gets the matching ClusterColocationProfiles and the
  batch/mid resource translation (services.webhook.colocation.mutate_pod); the patch is the diff between the Pod
  as sent and as mutated (services.webhook.jsonpatch). What Koordinator refuses (an invalid probability, an unknown
  PriorityClass, a patch that cannot be applied) and a Pod that does not decode (an unparsable quantity) are
  `allowed: false` with the reason, code 400. Any other resource or operation is allowed unchanged.
* `validate_configmap` (spec §7.1): the `slo-controller-config` ConfigMap at CREATE or UPDATE is refused, code
  403 like Koordinator's validating webhook, when a key it brings is bad (services.webhook.configmap): every
  problem in the message as `data.<key>: <JSON path>: <reason>`, and each in `status.details.causes` with its field.
  Other ConfigMaps and operations are allowed.

Each handler is a function (request, what it reads) → AdmissionResponse; the routes that serve them are a table
(services.webhook.service.WebhookService.routes). The ElasticQuota validation, which asks the quota service, reads
the request's `userInfo` and answers with `warnings` too: services.webhook.elasticquota.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from services.webhook import colocation, configmap, jsonpatch
from services.webhook.state import AdmissionView

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
OPERATIONS: Final = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 this webhook can answer; the message names the field."""


class GroupVersionKind(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    resource: str = ""


class UserInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Who made the request, as kube-apiserver authenticated them (a kubectl user, a ServiceAccount …)."""

    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The fields of an AdmissionRequest the handlers read (the rest, options, requestKind …, are ignored)."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: str
    sub_resource: str = ""
    name: str = ""
    namespace: str = ""
    object: Any = None
    old_object: Any = None
    dry_run: bool = False
    user_info: UserInfo = UserInfo()


class _Review(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    request: AdmissionRequest | None = None


class StatusCause(msgspec.Struct, frozen=True, kw_only=True):
    reason: str
    message: str
    field: str


class StatusDetails(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str = ""
    kind: str = ""
    causes: tuple[StatusCause, ...] = ()


class Status(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A metav1.Status, as a refusal's `status`."""

    code: int
    message: str
    reason: str = ""
    details: StatusDetails | None = None


class AdmissionResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    uid: str
    allowed: bool
    patch_type: str | None = None
    patch: str | None = None
    """base64 of the JSON Patch's JSON text."""
    status: Status | None = None
    warnings: tuple[str, ...] = ()
    """Shown by kubectl as `Warning: …` lines, whether the request is allowed or not."""


class AdmissionReviewOut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = API_VERSION
    kind: str = KIND
    response: AdmissionResponse


def review_request(document: Any) -> AdmissionRequest:
    """The request of an AdmissionReview v1 (an already decoded JSON document); BadReview naming the field."""
    if not isinstance(document, dict):
        raise BadReview(f"the body is not an AdmissionReview: expected a JSON object, got {_json_type(document)}")
    if document.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"apiVersion: expected {API_VERSION!r}, got {document.get('apiVersion')!r} (this webhook answers "
            "AdmissionReview v1 only: admissionReviewVersions: [v1])"
        )
    if document.get("kind") != KIND:
        raise BadReview(f"kind: expected {KIND!r}, got {document.get('kind')!r}")
    try:
        request = msgspec.convert(document, _Review).request
    except msgspec.ValidationError as err:
        path, reason = configmap.problem_of(str(err))
        raise BadReview(f"{path.removeprefix('$.') or 'the review'}: {reason}") from None
    if request is None:
        raise BadReview("request: missing (an AdmissionReview from kube-apiserver carries one)")
    if not request.uid:
        raise BadReview("request.uid: missing or empty (the response must carry it back)")
    if request.operation not in OPERATIONS:
        raise BadReview(f"request.operation: expected one of {', '.join(OPERATIONS)}, got {request.operation!r}")
    return request


def allowed(
    request: AdmissionRequest, patch: list[jsonpatch.Operation] | None = None, *, warnings: tuple[str, ...] = ()
) -> AdmissionResponse:
    if not patch:
        return AdmissionResponse(uid=request.uid, allowed=True, warnings=warnings)
    encoded = base64.b64encode(msgspec.json.encode(patch)).decode("ascii")
    return AdmissionResponse(uid=request.uid, allowed=True, patch_type="JSONPatch", patch=encoded, warnings=warnings)


def refused(
    request: AdmissionRequest, *, code: int, message: str, reason: str = "", details: StatusDetails | None = None
) -> AdmissionResponse:
    status = Status(code=code, message=message, reason=reason, details=details)
    return AdmissionResponse(uid=request.uid, allowed=False, status=status)


def encode_review(response: AdmissionResponse) -> bytes:
    return msgspec.json.encode(AdmissionReviewOut(response=response))


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _is(request: AdmissionRequest, resource: str) -> bool:
    """A core-group `resource` (pods, configmaps) itself, not a subresource of it."""
    return (request.resource.group, request.resource.resource, request.sub_resource) == ("", resource, "")


# --- Pods: ClusterColocationProfile mutation


def mutate_pod(
    request: AdmissionRequest, view: AdmissionView, *, skip_mutating_resources: bool, draw: Callable[[], int]
) -> AdmissionResponse:
    """§10.2–10.4 for a Pod at CREATE (see the module docstring); `draw` is the probability draw (0–99)."""
    if not _is(request, "pods") or request.operation != "CREATE":
        return allowed(request)
    pod = request.object
    if not isinstance(pod, dict):
        return refused(request, code=400, message=f"request.object: expected a Pod, got {_json_type(pod)}")
    metadata = pod.get("metadata")
    namespace = (metadata.get("namespace") if isinstance(metadata, dict) else None) or request.namespace
    try:
        mutated, _ = colocation.mutate_pod(
            pod,
            view.profiles,
            namespace_labels=view.namespace_labels(namespace),
            priority_classes=view.priority_classes,
            skip_mutating_resources=skip_mutating_resources,
            draw=draw,
        )
    except colocation.ProfileError as err:
        return refused(request, code=400, message=f"ClusterColocationProfile: {err}", reason="BadRequest")
    except ValueError as err:  # the Pod does not decode (a bad quantity, a wrong type)
        return refused(request, code=400, message=f"request.object: {err}", reason="BadRequest")
    return allowed(request, jsonpatch.diff(pod, mutated))


# --- ConfigMaps: slo-controller-config validation


def _data(obj: Any, where: str) -> Mapping[str, str] | str:
    """The ConfigMap's data, or why it cannot be read."""
    if not isinstance(obj, dict):
        return f"{where}: expected a ConfigMap, got {_json_type(obj)}"
    data = obj.get("data")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return f"{where}.data: expected a map of strings"
    return data


def validate_configmap(
    request: AdmissionRequest, *, target: tuple[str, str], validators: Mapping[str, configmap.KeyValidator]
) -> AdmissionResponse:
    """The `target` (namespace, name) ConfigMap's keys checked at CREATE and UPDATE (see the module docstring)."""
    if not _is(request, "configmaps") or request.operation not in ("CREATE", "UPDATE"):
        return allowed(request)
    obj = request.object
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    metadata = metadata if isinstance(metadata, dict) else {}
    namespace = request.namespace or metadata.get("namespace") or ""
    name = request.name or metadata.get("name") or ""
    if (namespace, name) != target:
        return allowed(request)
    new = _data(obj, "request.object")
    if isinstance(new, str):
        return refused(request, code=400, message=new, reason="BadRequest")
    old: Mapping[str, str] | None = None
    if request.operation == "UPDATE":
        before = _data(request.old_object, "request.oldObject")
        if isinstance(before, str):
            return refused(request, code=400, message=before, reason="BadRequest")
        old = before
    found = configmap.problems(new, old, validators)
    if not found:
        return allowed(request)
    keys = sorted({problem.key for problem in found})
    message = (
        f"{namespace}/{name}: {len(found)} problem{'s' if len(found) > 1 else ''} in "
        f"{', '.join(keys)} (the services would keep the key's last good value): "
        + "; ".join(str(problem) for problem in found)
    )
    causes = tuple(StatusCause(reason="FieldValueInvalid", message=str(p), field=p.field) for p in found)
    details = StatusDetails(name=name, kind="configmaps", causes=causes)
    return refused(request, code=403, message=message, reason="Forbidden", details=details)
