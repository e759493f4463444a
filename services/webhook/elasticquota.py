"""An ElasticQuota change made in the cluster (kubectl, GitOps, Helm) as a quota command: the pure half of the
validating webhook POST /validate-elasticquotas (issue 24 point 2).

koordbus's quota log is the source of truth and the bridge's quota mirror writes it to the cluster, so a change made
in the cluster must reach the log or the mirror undoes it. `plan(request, mirror_users=)` reads an AdmissionReview
of `scheduling.sigs.k8s.io` `elasticquotas` and answers either at once (`Answer`) or with the command to ask the
quota service for (`Ask`), exactly the commands of the REST API (services.quota.routes), decided by the same
§3.9 rules and cycle check, appended by the user who made the change (actor `kubernetes/<userInfo.username>`):

* CREATE → `CreateQuota` of the object as the REST API takes it (status, uid, resourceVersion and koord-scheduler's
  write-back annotations dropped, and kubectl apply's last-applied-configuration: NOT_QUOTA_STATE); the quota
  service applies the §3.9 defaults, which the mirror then writes back.
* UPDATE → `PatchQuota` with the JSON merge patch (RFC 7386) from the old object to the new one, over what the
  quota model reads: `spec` (min, max), labels (parent, is-parent, tree-id, allow-lent-resource …) and
  annotations (shared-weight, namespaces, koordbus's own …), NOT_QUOTA_STATE left out. The user's change is
  applied to the log's object, not the cluster's copy of it, so a change the log holds and the mirror has not
  written yet is kept. An update that changes none of these (status.used or the write-back annotations, as
  koord-scheduler writes them; finalizers, managedFields) asks nothing and is allowed.
* DELETE → `DeleteQuota`.
* A write by one of `mirror_users` (the bridge's identity, as kube-apiserver authenticated it: a kubectl user cannot
  claim another user's name without the right to impersonate it) is the mirror writing the log's own state: it is
  allowed without a second command. So are subresources, CONNECT and other resources (the webhook configuration
  does not send them).
* `dryRun` (kubectl --dry-run=server) asks for a dry run: validated, nothing appended.

`answer(request, ask, reply)` turns the quota service's reply into the AdmissionResponse: applied (or valid, on a
dry run) → allowed; rejected → refused with every violation in the message and as `status.details.causes` (the
rule as its reason, and the field; code 422 like the REST API's answer, 409 for a name that exists); a quota the
log does not hold (an UPDATE or DELETE of an ElasticQuota made before koordbus, never imported) → allowed with a
warning: koordbus does not manage it, and the mirror never writes it. `unavailable`, `conflict` and `failed` are
the refusals when the quota service cannot decide (503, 409, 500/413). Every answer carries a `decision` for the
metrics. Used by services.webhook.service (QuotaValidation, the I/O half); docs/webhook.md says why failurePolicy
is Fail.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from schemas import kube, quota
from schemas import quota_events as ev
from schemas.quota_service import CommandReply, CommandRequest
from services.webhook.admission import AdmissionRequest, AdmissionResponse, StatusCause, StatusDetails
from services.webhook.admission import allowed as _allowed
from services.webhook.admission import refused as _refused

GROUP: Final = quota.API_VERSION.split("/")[0]
RESOURCE: Final = "elasticquotas"
ACTOR_PREFIX: Final = "kubernetes/"
"""An event appended for a change made in the cluster names its author `kubernetes/<userInfo.username>`."""
COMMAND_PREFIX: Final = "admission-"
"""The command id is `admission-<request uid>`: kube-apiserver resending the same review appends nothing twice."""

Decision = Literal[
    "ignored", "mirror", "unchanged", "invalid", "recorded", "validated", "unmanaged", "refused", "unavailable"
]
"""How an ElasticQuota review was decided (koordbus_webhook_quota_decisions_total): ignored (not an ElasticQuota
itself, or CONNECT), mirror (the mirror's own write), unchanged (nothing the quota log holds changed), invalid (an
object that does not decode), recorded (a command appended), validated (a dry run that passed), unmanaged (a quota
the log does not hold), refused (rules broken, a lost race), unavailable (the quota service did not decide)."""


@dataclass(frozen=True)
class Answer:
    """A review answered: what kube-apiserver gets, and how it was decided."""

    response: AdmissionResponse
    decision: Decision


@dataclass(frozen=True)
class Ask:
    """A review the quota service decides: the command to send, and the object it is about."""

    request: CommandRequest
    shown: str
    """`namespace/name` of the ElasticQuota, for messages."""


def _is_quota(request: AdmissionRequest) -> bool:
    resource = request.resource
    return (resource.group, resource.resource, request.sub_resource) == (GROUP, RESOURCE, "")


def _object(raw: Any, where: str) -> quota.ElasticQuota | str:
    """The ElasticQuota in `raw`, or why it does not decode (naming the field)."""
    if not isinstance(raw, dict):
        return f"{where}: expected an ElasticQuota object, got {type(raw).__name__}"
    try:
        return msgspec.convert(raw, quota.ElasticQuota, strict=False)
    except msgspec.ValidationError as err:
        message, _, path = str(err).rpartition(" - at `")
        field = path.rstrip("`").removeprefix("$") if message else ""
        return f"{where}{field}: {message or err}"


LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
NOT_QUOTA_STATE: Final = frozenset({*quota.WRITE_BACK_ANNOTATIONS, LAST_APPLIED})
"""Annotations that are not the quota's: koord-scheduler's write-back figures (the mirror writes them from the
computed state) and kubectl apply's record of the applied manifest (its bookkeeping of the cluster object: left out
of the log, the mirror keeps it as the cluster holds it, since it keeps every annotation it does not own)."""


def _annotations(obj: quota.ElasticQuota) -> dict[str, str]:
    return {k: v for k, v in obj.metadata.annotations.items() if k not in NOT_QUOTA_STATE}


def command_object(obj: quota.ElasticQuota, namespace: str) -> quota.ElasticQuota:
    """The object as a command carries it, as the REST API cleans it: name, namespace, labels, annotations but
    NOT_QUOTA_STATE, spec; no status, uid or resourceVersion (the log's resourceVersion is its own)."""
    meta = kube.ObjectMeta(
        name=obj.metadata.name,
        namespace=obj.metadata.namespace or namespace or quota.QUOTA_NAMESPACE,
        labels=dict(obj.metadata.labels),
        annotations=_annotations(obj),
    )
    return quota.ElasticQuota(metadata=meta, spec=obj.spec)


def quota_view(obj: quota.ElasticQuota) -> dict[str, Any]:
    """What the quota log holds of an object and an UPDATE may change: labels, annotations (but NOT_QUOTA_STATE),
    spec."""
    return {
        "metadata": {"labels": dict(obj.metadata.labels), "annotations": _annotations(obj)},
        "spec": msgspec.to_builtins(obj.spec),
    }


def merge_diff(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new` (both JSON objects): changed members, `null` for a
    removed one; {} when they are equal. Lists and scalars are replaced whole."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = (
                merge_diff(old[key], value) if isinstance(old[key], dict) and isinstance(value, dict) else value
            )
    patch.update((key, None) for key in old if key not in new)
    return patch


def _user(request: AdmissionRequest) -> str:
    return request.user_info.username or "system:anonymous"


def plan(request: AdmissionRequest, *, mirror_users: Set[str]) -> Answer | Ask:
    """The answer to `request` when it needs no command, else the command to ask for (see the module docstring)."""
    if not _is_quota(request) or request.operation == "CONNECT":
        return Answer(_allowed(request), "ignored")
    if request.user_info.username in mirror_users:
        return Answer(_allowed(request), "mirror")
    namespace = request.namespace
    command: ev.QuotaCommand
    if request.operation == "DELETE":
        old = _object(request.old_object, "request.oldObject") if request.old_object is not None else None
        name = request.name or (old.metadata.name if isinstance(old, quota.ElasticQuota) else "")
        if not name:
            return _invalid(request, "request.name: the ElasticQuota to delete is not named")
        command = ev.DeleteQuota(command_id=COMMAND_PREFIX + request.uid, name=name)
    else:
        new = _object(request.object, "request.object")
        if isinstance(new, str):
            return _invalid(request, new)
        name = new.metadata.name or request.name
        new = msgspec.structs.replace(new, metadata=msgspec.structs.replace(new.metadata, name=name))
        if request.operation == "CREATE":
            command = ev.CreateQuota(command_id=COMMAND_PREFIX + request.uid, quota=command_object(new, namespace))
        else:
            old = _object(request.old_object, "request.oldObject")
            if isinstance(old, str):
                return _invalid(request, old)
            patch = merge_diff(quota_view(old), quota_view(new))
            if not patch:
                return Answer(_allowed(request), "unchanged")
            command = ev.PatchQuota(command_id=COMMAND_PREFIX + request.uid, name=name, patch=patch)
    asked = CommandRequest(actor=ACTOR_PREFIX + _user(request), command=command, dry_run=request.dry_run)
    return Ask(asked, f"{namespace}/{name}" if namespace else name)


def _invalid(request: AdmissionRequest, message: str) -> Answer:
    return Answer(_refused(request, code=400, message=message, reason="BadRequest"), "invalid")


def answer(request: AdmissionRequest, ask: Ask, reply: CommandReply) -> Answer:
    """The quota service's reply to `ask` as the AdmissionResponse (see the module docstring)."""
    match reply.outcome:
        case "applied":
            return Answer(_allowed(request), "recorded")
        case "valid":
            return Answer(_allowed(request), "validated")
        case "conflict":
            return conflict(request, ask, reply.message)
        case "unavailable":
            return unavailable(request, ask, reply.message)
    rules = {v.rule for v in reply.violations}
    if rules == {"exists"} and request.operation in ("UPDATE", "DELETE"):
        warning = (
            f"ElasticQuota {ask.shown} is not in koordbus's quota log: koordbus does not manage it (nor check it, "
            "nor write it); `koordbus quota import` adopts the cluster's quotas"
        )
        return Answer(_allowed(request, warnings=(warning,)), "unmanaged")
    count = len(reply.violations)
    if not count:  # a rejection always names its violations; keep its message if one ever does not
        return Answer(_refused(request, code=422, message=reply.message, reason="Invalid"), "refused")
    exists = rules == {"name-unique"}
    message = (
        f"ElasticQuota {ask.shown}: {count} violation{'s' if count > 1 else ''} of the quota rules (checked by "
        f"koordbus's quota service against tree {reply.tree or '?'}; nothing was recorded): "
        + "; ".join(v.message for v in reply.violations)
    )
    causes = tuple(StatusCause(reason=v.rule, message=v.message, field=v.field) for v in reply.violations)
    details = StatusDetails(name=ask.shown.rpartition("/")[2], kind=RESOURCE, causes=causes)
    code, reason = (409, "AlreadyExists") if exists else (422, "Invalid")
    return Answer(_refused(request, code=code, message=message, reason=reason, details=details), "refused")


def unavailable(request: AdmissionRequest, ask: Ask, why: str) -> Answer:
    """The quota service did not decide (not running, too slow, still reading the log): the change is refused, so
    the cluster never holds a quota change the log does not (the mirror would undo it)."""
    message = (
        f"ElasticQuota {ask.shown}: the quota service cannot check this change now ({why}); ElasticQuota changes "
        "are refused until it answers, so the quota log stays the source of truth: try again shortly. If it timed "
        f"out, the change may still have been recorded: GET /api/v1/quotas/{ask.shown.rpartition('/')[2]}/history "
        "shows it, and the mirror then writes it to the cluster"
    )
    return Answer(_refused(request, code=503, message=message, reason="ServiceUnavailable"), "unavailable")


def conflict(request: AdmissionRequest, ask: Ask, why: str) -> Answer:
    """Another writer kept winning the race on the quota's tree."""
    message = f"ElasticQuota {ask.shown}: {why}"
    return Answer(_refused(request, code=409, message=message, reason="Conflict"), "refused")


def failed(request: AdmissionRequest, ask: Ask, *, code: int, why: str) -> Answer:
    """The quota service failed while answering (500), or the command is too large for the bus (413)."""
    reason = "RequestEntityTooLarge" if code == 413 else "InternalError"
    message = f"ElasticQuota {ask.shown}: the quota service could not decide this change: {why}"
    return Answer(_refused(request, code=code, message=message, reason=reason), "unavailable")
