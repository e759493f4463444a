"""The ClusterColocationProfiles of the REST API: what a profile must be for koordbus to keep it, and how a kept one
reads back. Pure.

`clean(document, name=…)` takes a ClusterColocationProfile as a client sends it (JSON or YAML; `kubectl get
clustercolocationprofile NAME -o yaml` output as is) and returns the profile koordbus keeps
(schemas.cluster.ColocationProfile: name, labels, annotations, spec) with the `metadata.resourceVersion` it names, or
raises `Invalid` naming the field. The rules are the CRD's schema (config.koordinator.sh/v1alpha1, spec §10.1:
each field's type, `qosClass` one of LSE/LSR/LS/BE/SYSTEM, `koordinatorPriority` an int32, `probability` an integer
or a string), what the webhook refuses a Pod for (services.webhook.colocation: a `probability` that does not parse,
a `patch` that does not apply or leaves no valid Pod — the profile is applied once to a sample Pod, with its
PriorityClass taken as existing), and what Kubernetes would refuse in the Pod the profile makes (label and
annotation keys, label values, the scheduler's and the PriorityClass's names), checked here so that a profile
cannot break every Pod it matches. Stricter than the CRD: a selector Kubernetes cannot build (which the webhook
counts as matching every Pod), a `probability` outside 0–100, and a field the CRD does not have (which Kubernetes
would drop without a word: a misspelt `qosclass`) are refused. Server-set fields (status, uid, creationTimestamp,
managedFields, kubectl's last-applied annotation) are dropped. A kept profile encodes to at most MAX_PROFILE_BYTES.

`render` gives a kept profile in Kubernetes shape with its resourceVersion (the profile log's stream sequence);
`patched` applies a JSON merge patch (RFC 7386) to one. Used by services.webhook.routes; the tests check the rules.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from schemas import names, selectors
from schemas.cluster import ColocationProfile, ProfileMeta
from services.common.mergepatch import merge_patch
from services.webhook import colocation

API_VERSION: Final = "config.koordinator.sh/v1alpha1"
KIND: Final = "ClusterColocationProfile"
LIST_KIND: Final = "ClusterColocationProfileList"
QOS_CLASSES: Final = ("LSE", "LSR", "LS", "BE", "SYSTEM")
INT32: Final = (-(2**31), 2**31 - 1)
MAX_PROFILE_BYTES: Final = 256 * 1024
"""The most a kept profile may take encoded (Kubernetes' own bound on an object's annotations; Koordinator's
profiles are a few hundred bytes)."""
LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"

_TOP: Final = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
_STRING_MAPS: Final = ("labels", "annotations", "labelKeysMapping", "annotationKeysMapping", "labelSuffixes")
_SELECTORS: Final = ("namespaceSelector", "selector")
_SPEC: Final = frozenset(
    {*_STRING_MAPS, *_SELECTORS, "probability", "schedulerName", "qosClass", "priorityClassName"}
    | {"koordinatorPriority", "patch"}
)
_SAMPLE_POD: Final = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sample", "namespace": "default", "labels": {"app": "sample"}},
    "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]},
}
"""What a profile is tried on: applying it must work (the webhook would refuse every Pod it matches otherwise)."""


class Invalid(ValueError):
    """A profile koordbus does not keep: `field` is its JSON path (`spec.qosClass`), `status` the HTTP answer (400
    when the body is not an object at all, 413 when it is too large, else 422)."""

    def __init__(self, field: str, message: str, *, status: int = 422) -> None:
        self.field = field
        self.message = message
        self.status = status
        super().__init__(f"{field}: {message}")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return names.shown(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return names.shown(repr(value)).strip("'")
    return _type_name(value)


def _at(field: str, key: str) -> str:
    """The JSON path of member `key` of `field` (a long or odd key shown shortened and quoted)."""
    plain = len(key) <= names.MAX_SHOWN and key.isprintable() and key.strip() == key and "." not in key
    return f"{field}.{key}" if plain else f"{field}[{names.shown(key)}]"


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(field, f"must be an object, got {_type_name(value)}")
    return value


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise Invalid(field, f"must be a string, got {_type_name(value)}")
    return value


NameRule = Callable[[str, str], str]
"""A schemas.names rule: (value, field) → value, or InvalidName."""


def _name(check: NameRule, value: str, field: str) -> None:
    try:
        check(value, field)
    except names.InvalidName as e:
        raise Invalid(field, f"{_shown(value)} {e.reason}") from None


def _string_map(value: Any, field: str) -> dict[str, str]:
    for key, item in _object(value, field).items():
        _string(item, _at(field, key))
    return value  # type: ignore[no-any-return]


def _keys(mapping: Mapping[str, str], field: str, *, values: NameRule | None = None) -> None:
    """Every key a qualified name (a label or annotation key); every value `values`' when given."""
    for key, value in mapping.items():
        _name(names.qualified_name, key, f"{field} key")
        if values is not None:
            _name(values, value, _at(field, key))


def _suffix(value: str, field: str) -> str:
    """A label suffix is appended to a label value: the characters of one, without the first/last rule."""
    if len(value) > names.MAX_LABEL or any(not (c.isascii() and (c.isalnum() or c in "-_.")) for c in value):
        raise names.InvalidName(field, value, "must be at most 63 letters, digits, '-', '_' and '.'")
    return value


def _selector(value: Any, field: str) -> dict[str, Any]:
    raw = _object(value, field)
    unknown = sorted(set(raw) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise Invalid(_at(field, unknown[0]), "unknown field (a LabelSelector has matchLabels and matchExpressions)")
    if raw.get("matchLabels") is not None:
        _string_map(raw["matchLabels"], f"{field}.matchLabels")
    try:
        selector = msgspec.convert(raw, selectors.LabelSelector)
    except msgspec.ValidationError as e:
        message, _, path = str(e).rpartition(" - at `")
        where = path.rstrip("`").removeprefix("$").lstrip(".")
        raise Invalid(f"{field}.{where}" if where else field, message or str(e)) from None
    for index, requirement in enumerate(raw.get("matchExpressions") or ()):
        if isinstance(requirement, dict) and set(requirement) - {"key", "operator", "values"}:
            extra = sorted(set(requirement) - {"key", "operator", "values"})[0]
            raise Invalid(f"{field}.matchExpressions[{index}].{extra}", "unknown field (key, operator, values)")
    problems = selectors.selector_problems(selector)
    if problems:
        raise Invalid(field, "; ".join(problems) + " (Kubernetes cannot build this selector)")
    return raw


def _probability(value: Any, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise Invalid(field, f"must be an integer or a percentage string like '50%', got {_type_name(value)}")
    if isinstance(value, str) and len(value) > len("-100%"):  # int() of a long digit string is no cheap refusal
        raise Invalid(field, f"must be a percentage from '0%' to '100%', got {_shown(value)}")
    try:
        percent = colocation.probability_percent(value)
    except colocation.ProfileError as e:
        raise Invalid(field, str(e)) from None
    if not 0 <= percent <= 100:
        raise Invalid(field, f"must be from 0 to 100 (percent), got {value!r}")


def _finite(document: Any, field: str) -> None:
    """Invalid for a number JSON cannot carry (1e400 reads as infinity, which would be stored as null)."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(field, f"has a number out of range ({value!r})")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _spec(value: Any) -> dict[str, Any]:
    spec = _object({} if value is None else value, "spec")
    unknown = sorted(set(spec) - _SPEC)
    if unknown:
        raise Invalid(_at("spec", unknown[0]), f"unknown field (the spec has {', '.join(sorted(_SPEC))})")
    for field in _STRING_MAPS:
        if spec.get(field) is not None:
            _string_map(spec[field], f"spec.{field}")
    _keys(spec.get("labels") or {}, "spec.labels", values=names.label_value)
    _keys(spec.get("annotations") or {}, "spec.annotations")
    _keys(spec.get("labelKeysMapping") or {}, "spec.labelKeysMapping", values=names.qualified_name)
    _keys(spec.get("annotationKeysMapping") or {}, "spec.annotationKeysMapping", values=names.qualified_name)
    _keys(spec.get("labelSuffixes") or {}, "spec.labelSuffixes", values=_suffix)
    for field in _SELECTORS:
        if spec.get(field) is not None:
            _selector(spec[field], f"spec.{field}")
    if spec.get("probability") is not None:
        _probability(spec["probability"], "spec.probability")
    for field in ("schedulerName", "priorityClassName"):
        if spec.get(field):  # empty: left as the Pod has it
            _name(names.object_name, _string(spec[field], f"spec.{field}"), f"spec.{field}")
        elif spec.get(field) is not None:
            _string(spec[field], f"spec.{field}")
    qos = spec.get("qosClass")
    if qos is not None and qos not in QOS_CLASSES:
        raise Invalid("spec.qosClass", f"must be one of {', '.join(QOS_CLASSES)}, got {_shown(qos)}")
    priority = spec.get("koordinatorPriority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, int) or not INT32[0] <= priority <= INT32[1]
    ):
        raise Invalid("spec.koordinatorPriority", f"must be a 32-bit integer, got {_shown(priority)}")
    if spec.get("patch") is not None:
        _finite(spec["patch"], "spec.patch")
        try:
            colocation.apply_profile(copy.deepcopy(_SAMPLE_POD), {"spec": {"patch": spec["patch"]}}, {})
        except colocation.ProfileError as e:
            raise Invalid("spec.patch", f"{e} (tried on a sample Pod)") from None
    try:
        named = spec.get("priorityClassName")
        classes = {named: colocation.PriorityClass(value=0)} if named else {}
        colocation.apply_profile(copy.deepcopy(_SAMPLE_POD), {"spec": spec}, classes)
    except colocation.ProfileError as e:
        raise Invalid("spec", f"{e} (tried on a sample Pod)") from None
    return spec


def _metadata(value: Any, name: str) -> tuple[ProfileMeta, str]:
    meta = _object({} if value is None else value, "metadata")
    given = meta.get("name")
    if given is not None and given != "" and name and given != name:
        raise Invalid("metadata.name", f"the body names profile {_shown(given)} but the path {names.shown(name)}")
    chosen = name or given
    if not chosen:
        raise Invalid("metadata.name", "required")
    _name(names.object_name, _string(chosen, "metadata.name"), "metadata.name")
    if meta.get("namespace"):
        raise Invalid("metadata.namespace", "a ClusterColocationProfile is cluster-scoped: leave the namespace out")
    labels = _string_map(meta.get("labels") or {}, "metadata.labels")
    _keys(labels, "metadata.labels", values=names.label_value)
    annotations = {
        k: v for k, v in _string_map(meta.get("annotations") or {}, "metadata.annotations").items() if k != LAST_APPLIED
    }
    _keys(annotations, "metadata.annotations")
    version = meta.get("resourceVersion") or ""
    if not isinstance(version, str | int) or isinstance(version, bool):
        raise Invalid("metadata.resourceVersion", f"must be a string, got {_type_name(version)}")
    return ProfileMeta(name=chosen, labels=dict(labels), annotations=annotations), str(version)


def clean(document: Any, *, name: str = "") -> tuple[ColocationProfile, str]:
    """The profile koordbus keeps from `document`, and the resourceVersion it names ("" when none); `name` is the
    path's (PUT, PATCH), which the body's must match. Invalid naming the field otherwise."""
    if not isinstance(document, dict):
        raise Invalid("body", f"must be a {KIND} object, got {_type_name(document)}", status=400)
    if document.get("apiVersion") not in (None, API_VERSION):
        raise Invalid("apiVersion", f"must be {API_VERSION}, got {_shown(document['apiVersion'])}")
    if document.get("kind") not in (None, KIND):
        raise Invalid("kind", f"must be {KIND}, got {_shown(document['kind'])}")
    unknown = sorted(set(document) - _TOP)
    if unknown:
        field = _at("body", unknown[0]).removeprefix("body.")
        raise Invalid(field, "unknown field (an object has apiVersion, kind, metadata and spec)")
    metadata, version = _metadata(document.get("metadata"), name)
    profile = ColocationProfile(metadata=metadata, spec=_spec(document.get("spec")))
    size = len(msgspec.json.encode(profile))
    if size > MAX_PROFILE_BYTES:
        raise Invalid("body", f"the profile is {size} bytes encoded; at most {MAX_PROFILE_BYTES}", status=413)
    return profile, version


def render(profile: ColocationProfile, *, resource_version: int) -> dict[str, Any]:
    """A kept profile as Kubernetes shows one: its resourceVersion is the profile log's stream sequence."""
    metadata: dict[str, Any] = {"name": profile.metadata.name, "resourceVersion": str(resource_version)}
    if profile.metadata.labels:
        metadata["labels"] = dict(profile.metadata.labels)
    if profile.metadata.annotations:
        metadata["annotations"] = dict(profile.metadata.annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": copy.deepcopy(profile.spec)}


def patched(profile: ColocationProfile, patch: Any) -> tuple[dict[str, Any], str]:
    """The document `patch` (a JSON merge patch) makes of `profile`, and the resourceVersion the patch names (its
    precondition, "" when none); Invalid when the patch is not an object. `clean` it next."""
    if not isinstance(patch, dict):
        raise Invalid("body", f"a merge patch must be an object, got {_type_name(patch)}", status=400)
    meta = patch.get("metadata")
    version = meta.get("resourceVersion", "") if isinstance(meta, dict) else ""
    if not isinstance(version, str | int) or isinstance(version, bool):
        raise Invalid("metadata.resourceVersion", f"must be a string, got {_type_name(version)}")
    if isinstance(meta, dict):
        patch = {**patch, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    current = render(profile, resource_version=0)
    del current["metadata"]["resourceVersion"]
    return merge_patch(current, patch), str(version or "")
