"""ElasticQuota and ElasticQuotaProfile as Kubernetes writes them, the parsed integer view, and the write-back.

Read by `koordbus calc quota-runtime`, by services.quota (runtime tree, validation, the event-sourced service) and
by the REST API and the Kubernetes sync to come. `ElasticQuota` / `ElasticQuotaProfile` follow the API's JSON
(camelCase, unknown fields ignored, quantities kept as written) so `kubectl get elasticquota -o json` decodes as
is. `quota_spec` turns an ElasticQuota into `QuotaSpec`, the integer view the calculations use (spec §3.2:
parent defaults to the root, allow-lent-resource is true unless "false", shared-weight defaults to max); a bad
quantity or malformed annotation JSON raises `QuotaFormatError` naming the quota, the field and the problem.
`render_elastic_quota` writes a QuotaSpec plus its computed `QuotaState` back as an ElasticQuota object with the
annotations koord-scheduler writes (runtime, request, child-request, …) and `status.used`; the result validates
against scheduling.sigs.k8s.io_elasticquotas.yaml. `QuotaState` and the runtime explanation structs are the
values services.quota computes and events carry. Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from schemas import kube, quantity, resources
from schemas.selectors import LabelSelector

API_VERSION: Final = "scheduling.sigs.k8s.io/v1alpha1"
KIND: Final = "ElasticQuota"
PROFILE_API_VERSION: Final = "quota.koordinator.sh/v1alpha1"
PROFILE_KIND: Final = "ElasticQuotaProfile"

ROOT_QUOTA: Final = "koordinator-root-quota"
SYSTEM_QUOTA: Final = "koordinator-system-quota"
DEFAULT_QUOTA: Final = "koordinator-default-quota"
QUOTA_NAMESPACE: Final = "koordinator-system"
"""Where koord-scheduler creates the root, system and default quotas (`quotaGroupNamespace`)."""
SPECIAL_QUOTAS: Final = frozenset({ROOT_QUOTA, SYSTEM_QUOTA, DEFAULT_QUOTA})

_MAX_INT64: Final = 2**63 - 1
DEFAULT_GROUP_MAX: Final[Mapping[str, int]] = {
    resources.CPU: (_MAX_INT64 // 5) * 1000,
    resources.MEMORY: _MAX_INT64 // 5,
}
"""`defaultQuotaGroupMax` / `systemQuotaGroupMax` defaults: MaxInt64/5 cores and MaxInt64/5 bytes."""

PREFIX: Final = "quota.scheduling.koordinator.sh"
LABEL_PARENT: Final = f"{PREFIX}/parent"
LABEL_IS_PARENT: Final = f"{PREFIX}/is-parent"
LABEL_ALLOW_LENT_RESOURCE: Final = f"{PREFIX}/allow-lent-resource"
LABEL_IS_ROOT: Final = f"{PREFIX}/is-root"
LABEL_TREE_ID: Final = f"{PREFIX}/tree-id"
LABEL_IGNORE_DEFAULT_TREE: Final = f"{PREFIX}/ignore-default-tree"
LABEL_PREEMPTIBLE: Final = f"{PREFIX}/preemptible"
"""On a pod: "false" makes it non-preemptible."""
LABEL_ALLOW_FORCE_UPDATE: Final = f"{PREFIX}/allow-force-update"
LABEL_QUOTA_NAME: Final = f"{PREFIX}/name"
"""On a pod: the quota it belongs to."""
LABEL_PROFILE: Final = f"{PREFIX}/profile"
ANNOTATION_SHARED_WEIGHT: Final = f"{PREFIX}/shared-weight"
ANNOTATION_RUNTIME: Final = f"{PREFIX}/runtime"
ANNOTATION_REQUEST: Final = f"{PREFIX}/request"
ANNOTATION_CHILD_REQUEST: Final = f"{PREFIX}/child-request"
ANNOTATION_GUARANTEED: Final = f"{PREFIX}/guaranteed"
ANNOTATION_ALLOCATED: Final = f"{PREFIX}/allocated"
ANNOTATION_NON_PREEMPTIBLE_REQUEST: Final = f"{PREFIX}/non-preemptible-request"
ANNOTATION_NON_PREEMPTIBLE_USED: Final = f"{PREFIX}/non-preemptible-used"
ANNOTATION_TOTAL_RESOURCE: Final = f"{PREFIX}/total-resource"
ANNOTATION_UNSCHEDULABLE_RESOURCE: Final = f"{PREFIX}/unschedulable-resource"
ANNOTATION_NAMESPACES: Final = f"{PREFIX}/namespaces"
ANNOTATION_RESOURCE_KEYS: Final = f"{PREFIX}/resource-keys"
ANNOTATION_MAX_STRICT_CHECK_RESOURCE_KEYS: Final = f"{PREFIX}/max-strict-check-resource-keys"
ANNOTATION_ADMISSION: Final = f"{PREFIX}/admission"

WRITE_BACK_ANNOTATIONS: Final = (
    ANNOTATION_RUNTIME,
    ANNOTATION_REQUEST,
    ANNOTATION_CHILD_REQUEST,
    ANNOTATION_GUARANTEED,
    ANNOTATION_ALLOCATED,
    ANNOTATION_NON_PREEMPTIBLE_REQUEST,
    ANNOTATION_NON_PREEMPTIBLE_USED,
)
"""The annotations koord-scheduler's status worker writes on every quota (§3.8)."""


class QuotaFormatError(ValueError):
    """A quota object that cannot be read: names the quota, the field and the problem."""

    def __init__(self, quota: str, field: str, problem: str) -> None:
        super().__init__(f"quota {quota}: {field}: {problem}")
        self.quota = quota
        self.field = field
        self.problem = problem


# --- Kubernetes objects


class ElasticQuotaSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    min: kube.RawResourceList | None = None
    max: kube.RawResourceList | None = None


class ElasticQuotaStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    used: kube.RawResourceList | None = None


class ElasticQuota(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """scheduling.sigs.k8s.io/v1alpha1 ElasticQuota; quantities are checked by `quota_spec`, not while decoding."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    spec: ElasticQuotaSpec = ElasticQuotaSpec()
    status: ElasticQuotaStatus = ElasticQuotaStatus()


class ElasticQuotaProfileSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    quota_name: str
    node_selector: LabelSelector
    quota_labels: dict[str, str] | None = None
    resource_ratio: str | None = None
    """A decimal string ("0.9"); applied when 0 < ratio ≤ 1 (§3.10)."""


class ElasticQuotaProfile(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """quota.koordinator.sh/v1alpha1 ElasticQuotaProfile."""

    api_version: str = PROFILE_API_VERSION
    kind: str = PROFILE_KIND
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    spec: ElasticQuotaProfileSpec
    status: dict[str, Any] = {}


def profile_to_json(profile: ElasticQuotaProfile) -> dict[str, Any]:
    """The profile as a Kubernetes object (CRD-valid: empty optional fields are left out)."""
    return {
        "apiVersion": profile.api_version,
        "kind": profile.kind,
        "metadata": _metadata_json(profile.metadata, profile.metadata.labels, profile.metadata.annotations),
        "spec": msgspec.json.decode(msgspec.json.encode(profile.spec)),
        **({"status": profile.status} if profile.status else {}),
    }


# --- the parsed view


class QuotaSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the calculations read of one ElasticQuota, amounts as integers (cpu millicores, memory bytes)."""

    name: str
    namespace: str = ""
    parent: str = ROOT_QUOTA
    """The parent label; empty or missing means the root (except for the root itself, whose parent is "")."""
    is_parent: bool = False
    is_root: bool = False
    """Label is-root="true": the root of its own tree (multi-tree / profile generated)."""
    tree_id: str = ""
    allow_lent_resource: bool = True
    allow_force_update: bool = False
    ignore_default_tree: bool = False
    min: resources.ResourceList = {}
    max: resources.ResourceList = {}
    shared_weight: resources.ResourceList = {}
    """The shared-weight annotation, or `max` when it is missing, unreadable as zero, or all zero."""
    namespaces: tuple[str, ...] | None = None
    """The namespaces annotation; None when absent or empty."""
    total_resource: resources.ResourceList | None = None
    unschedulable_resource: resources.ResourceList | None = None
    max_strict_check_resource_keys: tuple[str, ...] | None = None
    used: resources.ResourceList = {}
    """status.used as last written."""
    profile: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    """All labels and annotations as written, so rendering keeps what we do not interpret."""
    uid: str = ""
    resource_version: str = ""


def quota_spec(obj: ElasticQuota) -> QuotaSpec:
    """The integer view of one ElasticQuota; raises QuotaFormatError for a bad quantity or annotation."""
    meta = obj.metadata
    name = meta.name
    who = f"{meta.namespace}/{name}" if meta.namespace else name
    if not name:
        raise QuotaFormatError(who or "<unnamed>", "metadata.name", "is required")
    labels, annotations = meta.labels, meta.annotations
    parent = labels.get(LABEL_PARENT, "")
    if not parent and name != ROOT_QUOTA:
        parent = ROOT_QUOTA
    max_rl = _quantities(who, "spec.max", obj.spec.max)
    return QuotaSpec(
        name=name,
        namespace=meta.namespace,
        parent=parent,
        is_parent=labels.get(LABEL_IS_PARENT) == "true",
        is_root=labels.get(LABEL_IS_ROOT) == "true",
        tree_id=labels.get(LABEL_TREE_ID, ""),
        allow_lent_resource=labels.get(LABEL_ALLOW_LENT_RESOURCE) != "false",
        allow_force_update=labels.get(LABEL_ALLOW_FORCE_UPDATE) == "true",
        ignore_default_tree=labels.get(LABEL_IGNORE_DEFAULT_TREE) == "true",
        min=_quantities(who, "spec.min", obj.spec.min),
        max=max_rl,
        shared_weight=_shared_weight(who, annotations, max_rl),
        namespaces=_string_list(who, annotations, ANNOTATION_NAMESPACES),
        total_resource=_annotation_resources(who, annotations, ANNOTATION_TOTAL_RESOURCE),
        unschedulable_resource=_annotation_resources(who, annotations, ANNOTATION_UNSCHEDULABLE_RESOURCE),
        max_strict_check_resource_keys=_string_list(who, annotations, ANNOTATION_MAX_STRICT_CHECK_RESOURCE_KEYS),
        used=_quantities(who, "status.used", obj.status.used),
        profile=labels.get(LABEL_PROFILE, ""),
        labels=dict(labels),
        annotations=dict(annotations),
        uid=meta.uid,
        resource_version=meta.resource_version,
    )


def decode_elastic_quota(document: bytes | str | Mapping[str, Any]) -> QuotaSpec:
    """An ElasticQuota from JSON text or a decoded mapping (YAML loaded by the caller), parsed to a QuotaSpec."""
    try:
        if isinstance(document, bytes | str):
            obj = msgspec.json.decode(document, type=ElasticQuota)
        else:
            obj = msgspec.convert(document, ElasticQuota, strict=False)
    except msgspec.ValidationError as err:
        message, _, where = str(err).rpartition(" - at `")
        field = where.rstrip("`").removeprefix("$.") if message else "$"
        raise QuotaFormatError(_loose_name(document), field, message or str(err)) from None
    except msgspec.DecodeError as err:
        raise QuotaFormatError(_loose_name(document), "$", f"not a JSON object ({err})") from None
    return quota_spec(obj)


def _loose_name(document: bytes | str | Mapping[str, Any]) -> str:
    try:
        mapping = json.loads(document) if isinstance(document, bytes | str) else document
        name = mapping.get("metadata", {}).get("name")
    except (ValueError, AttributeError, TypeError):
        return "<unreadable>"
    return name if isinstance(name, str) and name else "<unnamed>"


def _quantities(who: str, field: str, raw: Mapping[str, quantity.RawQuantity] | None) -> resources.ResourceList:
    out: resources.ResourceList = {}
    for name, value in (raw or {}).items():
        try:
            out[name] = quantity.amount(name, value)
        except quantity.QuantityError as err:
            raise QuotaFormatError(who, f"{field}.{name}", str(err)) from None
    return out


def _annotation_json(who: str, annotations: Mapping[str, str], key: str) -> Any:
    text = annotations.get(key, "")
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as err:
        raise QuotaFormatError(who, f"metadata.annotations[{key}]", f"not valid JSON ({err})") from None


def _annotation_resources(who: str, annotations: Mapping[str, str], key: str) -> resources.ResourceList | None:
    value = _annotation_json(who, annotations, key)
    if value is None:
        return None
    field = f"metadata.annotations[{key}]"
    if not isinstance(value, dict) or not all(
        isinstance(v, str | int | float) and not isinstance(v, bool) for v in value.values()
    ):
        raise QuotaFormatError(who, field, 'expected a JSON object of quantities such as {"cpu": "4"}')
    return _quantities(who, field, value)


def _shared_weight(who: str, annotations: Mapping[str, str], max_rl: resources.ResourceList) -> resources.ResourceList:
    weight = _annotation_resources(who, annotations, ANNOTATION_SHARED_WEIGHT)
    if not weight or not any(weight.values()):
        return dict(max_rl)
    return weight


def _string_list(who: str, annotations: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    value = _annotation_json(who, annotations, key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise QuotaFormatError(who, f"metadata.annotations[{key}]", 'expected a JSON list of strings such as ["a"]')
    return tuple(value)


# --- computed state and its explanation


class QuotaState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel", gc=False):
    """One quota's computed figures (spec §3.5); every list is integers, an absent key is zero."""

    name: str
    parent: str = ""
    attached: bool = True
    """False when the quota hangs off an unknown parent or a cycle: it gets no runtime."""
    runtime: resources.ResourceList = {}
    """Masked to the keys of max (the root's is the tree total)."""
    request: resources.ResourceList = {}
    """childRequest, raised to min when allow-lent-resource is false."""
    child_request: resources.ResourceList = {}
    """Own pods' request plus Σ children's limited requests."""
    limited_request: resources.ResourceList = {}
    """min(request, max) per key: what the parent sees."""
    used: resources.ResourceList = {}
    non_preemptible_request: resources.ResourceList = {}
    non_preemptible_used: resources.ResourceList = {}
    min: resources.ResourceList = {}
    scaled_min: resources.ResourceList = {}
    """The min the parent's distribution used (scaled down when the parent's total is below Σ children's min)."""
    max: resources.ResourceList = {}
    shared_weight: resources.ResourceList = {}
    guaranteed: resources.ResourceList = {}
    allocated: resources.ResourceList = {}


Start = Literal["adjustable", "lent", "kept-min"]
"""How a child starts a distribution: adjustable (request above its min, starts at min and competes), lent
(request ≤ min and lending allowed: gets its request), kept-min (request ≤ min, lending not allowed: keeps min)."""


class RoundShare(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """One water-filling round as one child saw it."""

    pool: int
    weight_sum: int
    weight: int
    share: int
    """floor(weight × pool / weightSum), plus 1 if it won a largest-remainder unit."""
    remainder_unit: bool
    runtime: int
    """After the round, capped at the request."""
    capped: bool
    """True when the share reached the request; the excess went back to the pool."""


class ResourceRuntimeExplanation(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """Why one child got its runtime for one resource from its parent's distribution."""

    resource: str
    runtime: int
    parent_total: int
    request: int
    """The limited request the parent saw."""
    min: int
    """The (scaled) min the parent used; `guarantee` overrides it when larger."""
    guarantee: int
    weight: int
    start: Start
    start_runtime: int
    pool: int
    """What was left after every child's start: total − Σ start runtimes."""
    adjustable: list[str]
    """Every sibling (and this quota) that competed for the pool."""
    rounds: list[RoundShare]
    message: str


class QuotaRuntimeExplanation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    quota: str
    parent: str = ""
    note: str = ""
    """Set for the root, the system/default quotas and detached quotas, whose runtime is not distributed."""
    min_scaled: list[str] = []
    """Resources where the parent's total was below Σ children's min, so min was scaled."""
    resources: dict[str, ResourceRuntimeExplanation] = {}


# --- rendering back to Kubernetes


def format_quota_amount(resource_name: str, value: int) -> str:
    """A quantity as koord-scheduler writes it: cpu in millicores (DecimalSI), memory BinarySI, others DecimalSI."""
    if resources.is_milli_resource(resource_name) and not resource_name.endswith(("batch-cpu", "mid-cpu")):
        return quantity.format_integer(value, milli=True)
    return quantity.format_integer(value, binary=resource_name == resources.MEMORY)


def format_quota_resources(rl: Mapping[str, int]) -> dict[str, str]:
    return {name: format_quota_amount(name, value) for name, value in sorted(rl.items())}


def resource_annotation(rl: Mapping[str, int]) -> str:
    """A ResourceList annotation value as Go's json.Marshal writes it: sorted keys, no spaces."""
    return json.dumps(format_quota_resources(rl), separators=(",", ":"))


def render_elastic_quota(spec: QuotaSpec, state: QuotaState | None = None) -> dict[str, Any]:
    """The ElasticQuota object for a spec, with the state's write-back annotations and status.used when given.

    Labels and annotations as written are kept; shared-weight is written when the object had none (as the
    mutating webhook does), and the parent label for every quota but the root.
    """
    labels = dict(spec.labels)
    if spec.name != ROOT_QUOTA and spec.parent:
        labels[LABEL_PARENT] = spec.parent
    annotations = dict(spec.annotations)
    annotations.setdefault(ANNOTATION_SHARED_WEIGHT, resource_annotation(spec.shared_weight))
    status: dict[str, Any] = {}
    if state is not None:
        written = {
            ANNOTATION_RUNTIME: state.runtime,
            ANNOTATION_REQUEST: state.request,
            ANNOTATION_CHILD_REQUEST: state.child_request,
            ANNOTATION_GUARANTEED: state.guaranteed,
            ANNOTATION_ALLOCATED: state.allocated,
            ANNOTATION_NON_PREEMPTIBLE_REQUEST: state.non_preemptible_request,
            ANNOTATION_NON_PREEMPTIBLE_USED: state.non_preemptible_used,
        }
        for key, rl in written.items():
            annotations[key] = resource_annotation(rl)
        status["used"] = format_quota_resources(state.used)
    elif spec.used:
        status["used"] = format_quota_resources(spec.used)
    meta = kube.ObjectMeta(
        name=spec.name, namespace=spec.namespace, uid=spec.uid, resource_version=spec.resource_version
    )
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata_json(meta, labels, annotations),
        "spec": {"min": format_quota_resources(spec.min), "max": format_quota_resources(spec.max)},
    }
    if status:
        obj["status"] = status
    return obj


def _metadata_json(meta: kube.ObjectMeta, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": meta.name}
    if meta.namespace:
        out["namespace"] = meta.namespace
    if meta.uid:
        out["uid"] = meta.uid
    if meta.resource_version:
        out["resourceVersion"] = meta.resource_version
    if labels:
        out["labels"] = dict(sorted(labels.items()))
    if annotations:
        out["annotations"] = dict(sorted(annotations.items()))
    return out
