"""The pure rules behind tests/fakes/kube_api.py: which kinds are served, what is valid, how patches apply.

No I/O but reading the CRD YAMLs from ../shared/reference/koordinator-crds (cached once per process),
so the rules can be tested without a server. `FakeKubeApi` is the only caller; tests extending the
fake add a kind to `CORE_KINDS` or `CRD_FILES`, a merge key to `STRATEGIC_MERGE_KEYS`, or a sanity
check to `validation_errors`.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs installed; tests are outside mypy's packages
import yaml

Json = dict[str, Any]

CRD_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "koordinator-crds"
CRD_FILES = (
    "slo.koordinator.sh_nodemetrics.yaml",
    "slo.koordinator.sh_nodeslos.yaml",
    "scheduling.sigs.k8s.io_elasticquotas.yaml",
    "quota.koordinator.sh_elasticquotaprofiles.yaml",
    "scheduling.koordinator.sh_podmigrationjobs.yaml",
    "scheduling.koordinator.sh_reservations.yaml",
    "config.koordinator.sh_clustercolocationprofiles.yaml",
)
TOPOLOGY_CRD = "topology.node.k8s.io_noderesourcetopologies.yaml"
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


# ── resource kinds ──────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, kw_only=True)
class ResourceKind:
    """One served resource: where it lives in the URL space and which write rules apply to it."""

    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool  # a /status subresource: main writes keep .status, /status writes change only it
    crd_file: str | None = None  # schema source; None for core kinds and CRDs we have no YAML for

    @property
    def is_custom(self) -> bool:
        return self.group != ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """How the real server names the resource in messages: `pods`, `nodemetrics.slo.koordinator.sh`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


CORE_KINDS = (
    ResourceKind(group="", version="v1", plural="nodes", kind="Node", namespaced=False, has_status=True),
    ResourceKind(group="", version="v1", plural="pods", kind="Pod", namespaced=True, has_status=True),
    ResourceKind(group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True, has_status=False),
    ResourceKind(group="", version="v1", plural="secrets", kind="Secret", namespaced=True, has_status=False),
    ResourceKind(group="", version="v1", plural="events", kind="Event", namespaced=True, has_status=False),
    ResourceKind(group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False, has_status=False),
    ResourceKind(
        group="scheduling.k8s.io",
        version="v1",
        plural="priorityclasses",
        kind="PriorityClass",
        namespaced=False,
        has_status=False,
    ),
    ResourceKind(group="apps", version="v1", plural="replicasets", kind="ReplicaSet", namespaced=True, has_status=True),
    ResourceKind(
        group="apps", version="v1", plural="statefulsets", kind="StatefulSet", namespaced=True, has_status=True
    ),
    ResourceKind(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True, has_status=True),
    # the webhook configurations `koordbus certs webhook` patches the caBundle of (cluster-scoped)
    ResourceKind(
        group="admissionregistration.k8s.io",
        version="v1",
        plural="mutatingwebhookconfigurations",
        kind="MutatingWebhookConfiguration",
        namespaced=False,
        has_status=False,
    ),
    ResourceKind(
        group="admissionregistration.k8s.io",
        version="v1",
        plural="validatingwebhookconfigurations",
        kind="ValidatingWebhookConfiguration",
        namespaced=False,
        has_status=False,
    ),
    # Cluster-scoped, no status subresource. Served as v1alpha1, the version koordlet and koordbus write (the reference
    # CRD stores v1alpha2), and checked against that version's schema.
    ResourceKind(
        group="topology.node.k8s.io",
        version="v1alpha1",
        plural="noderesourcetopologies",
        kind="NodeResourceTopology",
        namespaced=False,
        has_status=False,
        crd_file=TOPOLOGY_CRD,
    ),
)


@functools.cache
def load_crd(filename: str) -> Json:
    crd: Json = yaml.load((CRD_DIR / filename).read_text(), Loader=yaml.CSafeLoader)
    return crd


def served_version(crd: Json, name: str | None = None) -> Json:
    """The served version called `name`; without one, the storage version among the served ones (every reference
    CRD but NodeResourceTopology's serves exactly one)."""
    served = [v for v in crd["spec"]["versions"] if v.get("served")]
    if name is not None:
        return next(v for v in served if v["name"] == name)
    return next((v for v in served if v.get("storage")), served[0])


def kind_from_crd(filename: str) -> ResourceKind:
    crd = load_crd(filename)
    spec, version = crd["spec"], served_version(crd)
    return ResourceKind(
        group=spec["group"],
        version=version["name"],
        plural=spec["names"]["plural"],
        kind=spec["names"]["kind"],
        namespaced=spec["scope"] == "Namespaced",
        has_status="status" in (version.get("subresources") or {}),
        crd_file=filename,
    )


@functools.cache
def resource_kinds() -> tuple[ResourceKind, ...]:
    """Every kind the fake serves; CRD kinds take scope, version and subresources from their YAML."""
    return CORE_KINDS + tuple(kind_from_crd(name) for name in CRD_FILES)


# ── errors and validation ───────────────────────────────────────────────────────────────────────


class ApiError(Exception):
    """Answered to the client as a Kubernetes `Status` object with the same code."""

    def __init__(self, code: int, message: str, *, reason: str | None = None, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details or {}

    def status(self) -> Json:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _k8s_schema(schema: Any) -> Any:
    """Turn the Kubernetes OpenAPI dialect into plain JSON Schema, strict about undeclared fields."""
    if isinstance(schema, list):
        return [_k8s_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _k8s_schema(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _is_int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


def _is_int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or ("T" in value.upper() and datetime.fromisoformat(value).tzinfo is not None)


# The formats the reference CRDs use; jsonschema ignores a format it has no check for.
FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("int32")(_is_int32)
FORMATS.checks("int64")(_is_int64)
FORMATS.checks("date-time", raises=ValueError)(_is_date_time)


@functools.cache
def crd_validator(filename: str, version: str | None = None) -> jsonschema.Draft7Validator:
    """For the served `version` of a CRD (default: its storage version)."""
    return schema_validator(served_version(load_crd(filename), version)["schema"]["openAPIV3Schema"])


def schema_validator(openapi_schema: Json) -> jsonschema.Draft7Validator:
    """A validator for any CRD's openAPIV3Schema (koordbus' own CRDs too), with the same strictness."""
    return jsonschema.Draft7Validator(_k8s_schema(openapi_schema), format_checker=FORMATS)


def _field_path(parts: Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "<root>"


def validation_errors(kind: ResourceKind, obj: Json) -> list[tuple[str, str]]:
    """(field, message) for everything the real server would refuse; CRD schemas plus sanity checks."""
    errors: list[tuple[str, str]] = []
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [("metadata", "Required value")]
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        errors.append(("metadata.name", f"Invalid value: {name!r}: must be a DNS-1123 subdomain"))
    for map_name in ("labels", "annotations"):
        values = meta.get(map_name) or {}
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            errors.append((f"metadata.{map_name}", "Invalid value: must map strings to strings"))
    labels = meta.get("labels")
    for key, value in labels.items() if isinstance(labels, dict) else ():
        if isinstance(value, str) and (len(value) > 63 or not LABEL_VALUE.match(value)):
            errors.append((f"metadata.labels.{key}", f"Invalid value: {value!r}: not a valid label value"))
    if kind.crd_file:
        validator = crd_validator(kind.crd_file, kind.version)
        errors += [(_field_path(e.absolute_path), e.message) for e in validator.iter_errors(obj)]
    elif kind.plural == "pods":
        containers = (obj.get("spec") or {}).get("containers")
        if not containers or not all(isinstance(c, dict) and c.get("name") and c.get("image") for c in containers):
            errors.append(("spec.containers", "Required value: at least one container with a name and an image"))
    elif kind.plural == "nodes":
        for section in ("capacity", "allocatable"):
            for resource, quantity in ((obj.get("status") or {}).get(section) or {}).items():
                if not isinstance(quantity, str) or not QUANTITY.match(quantity):
                    errors.append((f"status.{section}.{resource}", f"Invalid value: {quantity!r}: not a quantity"))
    elif kind.plural == "configmaps" and not all(isinstance(v, str) for v in (obj.get("data") or {}).values()):
        errors.append(("data", "Invalid value: values must be strings"))
    elif kind.plural == "events":
        errors += _event_errors(obj)
    return errors


def _event_errors(event: Json) -> list[tuple[str, str]]:
    """The core/v1 Event rules a writer can break (the API server's legacy event validation, without eventTime):
    the involved object's namespace must be the Event's (or, when empty, the Event's is "" or "default")."""
    involved = event.get("involvedObject")
    if not isinstance(involved, dict) or not involved.get("kind") or not involved.get("name"):
        return [("involvedObject", "Required value: kind and name of the object the event is about")]
    event_namespace = (event.get("metadata") or {}).get("namespace") or ""
    involved_namespace = involved.get("namespace") or ""
    matches = event_namespace == involved_namespace if involved_namespace else event_namespace in ("", "default")
    if not matches:
        return [("involvedObject.namespace", f"Invalid value: {involved_namespace!r}: does not match event.namespace")]
    return []


def invalid(kind: ResourceKind, name: str, errors: list[tuple[str, str]]) -> ApiError:
    title = f"{kind.kind}.{kind.group}" if kind.group else kind.kind
    causes = [{"reason": "FieldValueInvalid", "field": f, "message": m} for f, m in errors]
    text = "; ".join(f"{f}: {m}" for f, m in errors)
    return ApiError(
        422,
        f'{title} "{name}" is invalid: {text}',
        details={"name": name, "group": kind.group, "kind": kind.kind, "causes": causes},
    )


# ── patches ─────────────────────────────────────────────────────────────────────────────────────

# Strategic merge patch, the part our writers use: maps merge recursively and `null` deletes a key;
# lists are replaced, except those named here, merged item by item on their merge key (an item with
# `"$patch": "delete"` removes its match), and `finalizers`, merged as a set. A map carrying
# `"$patch": "replace"` replaces instead of merging. Merge keys go by field name wherever it occurs
# (the real server knows them per Go type); not covered: $retainKeys, $setElementOrder,
# $deleteFromPrimitiveList.
STRATEGIC_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "taints": "key",
}
STRATEGIC_SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch, or with `strategic` the strategic-merge subset described above."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if strategic and patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif strategic and isinstance(value, list) and key in STRATEGIC_MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key) or [], value, STRATEGIC_MERGE_KEYS[key])
        elif strategic and isinstance(value, list) and key in STRATEGIC_SET_LISTS:
            result[key] = list(result.get(key) or []) + [v for v in value if v not in (result.get(key) or [])]
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise ApiError(422, f"strategic merge patch: list item {item!r} lacks its merge key {merge_key!r}")
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(merge_patch({}, item, strategic=True))
        else:
            result[index] = merge_patch(result[index], item, strategic=True)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"JSON pointer {path!r} must start with '/'")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(container: list[Any], token: str, *, insert: bool = False) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or int(token) > len(container) - (0 if insert else 1):
        raise ApiError(422, f"array index {token!r} out of range")
    return int(token)


def _parent(doc: Any, tokens: list[str]) -> Any:
    for token in tokens[:-1]:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_index(doc, token)]
        else:
            raise ApiError(422, f"path /{'/'.join(tokens)} does not exist")
    return doc


def _json_get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, list):
        return parent[_index(parent, last)]
    if not isinstance(parent, dict) or last not in parent:
        raise ApiError(422, f"path {path} does not exist")
    return parent[last]


def _json_add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    if isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], insert=True), value)
    elif isinstance(parent, dict):
        parent[tokens[-1]] = value
    else:
        raise ApiError(422, f"path {path}: parent is not a container")
    return doc


def _json_remove(doc: Any, path: str) -> Any:
    _json_get(doc, path)  # raises when absent
    tokens = _pointer(path)
    if not tokens:
        return None
    parent = _parent(doc, tokens)
    del parent[_index(parent, tokens[-1]) if isinstance(parent, list) else tokens[-1]]
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy and test, applied in order to a copy of `doc`."""
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a JSON array of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "path" not in op:
            raise ApiError(400, f"malformed json patch operation {op!r}")
        path, name = op["path"], op.get("op")
        if name == "add":
            doc = _json_add(doc, path, copy.deepcopy(op["value"]))
        elif name == "remove":
            doc = _json_remove(doc, path)
        elif name == "replace":
            doc = _json_add(_json_remove(doc, path), path, copy.deepcopy(op["value"]))
        elif name in ("move", "copy"):
            value = copy.deepcopy(_json_get(doc, op["from"]))
            doc = _json_add(_json_remove(doc, op["from"]) if name == "move" else doc, path, value)
        elif name == "test":
            if _json_get(doc, path) != op.get("value"):
                raise ApiError(422, f"testing value {path} failed: test failed")
        else:
            raise ApiError(400, f"unknown json patch operation {name!r}")
    return doc


# ── selectors ───────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Requirement:
    """One term of a label or field selector."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()
    on_labels: bool = True

    def matches(self, obj: Json) -> bool:
        value: str | None
        if self.on_labels:
            value = ((obj.get("metadata") or {}).get("labels") or {}).get(self.key)
        else:
            found: Any = obj
            for part in self.key.split("."):
                found = found.get(part) if isinstance(found, dict) else None
            value = "" if found is None else str(found)  # a missing field equals ""
        match self.op:
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
            case "exists":
                return value is not None
            case _:
                return value is None


def _terms(text: str) -> list[str]:
    terms: list[str] = []
    depth, current = 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t.strip() for t in [*terms, current] if t.strip()]


def parse_selector(text: str, *, on_labels: bool) -> list[Requirement]:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` for labels; `path=value`, `path!=value` for fields."""
    requirements = []
    for term in _terms(text):
        if m := re.fullmatch(r"([^\s=!(),]+)\s*(==|=|!=)\s*([^\s=!(),]*)", term):
            op = "!=" if m[2] == "!=" else "="
            requirements.append(Requirement(m[1], op, frozenset({m[3]}), on_labels))
        elif on_labels and (m := re.fullmatch(r"([^\s=!(),]+)\s+(in|notin)\s*\(([^()]*)\)", term)):
            values = frozenset(v.strip() for v in m[3].split(",") if v.strip())
            requirements.append(Requirement(m[1], m[2], values, on_labels))
        elif on_labels and (m := re.fullmatch(r"(!?)\s*([^\s=!(),]+)", term)):
            requirements.append(Requirement(m[2], "!" if m[1] else "exists", on_labels=on_labels))
        else:
            raise ApiError(400, f"unable to parse requirement {term!r} in selector {text!r}")
    return requirements
