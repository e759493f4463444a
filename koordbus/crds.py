"""`koordbus crds`: the CustomResourceDefinitions of the Koordinator kinds koordbus reads and writes, generated from
koordbus' own schemas.

The Helm chart ships the output in deploy/helm/koordbus/crds/ (tests/deploy/test_crds.py fails when the checked-in
files differ from a fresh run). Each schema comes from the msgspec structs koordbus decodes and renders these
objects with (msgspec.json.schema_components), turned into a Kubernetes *structural* schema: references inlined,
`X | None` written as `nullable`, quantities as int-or-string with the API server's quantity pattern, free-form maps
as `additionalProperties`, msgspec defaults dropped (the API server would write them into stored objects). The
NodeSLO spec has no struct: its schema comes from the field table services.slo.render checks every NodeSLO it
writes against. Where Koordinator's object carries fields our structs do not model, the struct that leaves them out
is listed in `OPEN_STRUCTS` with the reason, and its object keeps unknown fields instead of pruning them. Group,
version, names, scope and the status subresource are Koordinator's (its CRDs are what clusters already run), so an
object valid for Koordinator's CRD stays valid for ours. Rendering is pure; `run` writes the files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import yaml

from schemas import migration, nodemetric_json, quantity, quota
from services.slo import gojson
from services.slo import render as slo_render

Json = dict[str, Any]

# --- NodeMetric as koordbus writes and reads it: the reader's structs, plus what only the writer
# (schemas.koordinator.nodemetric_status_to_json) puts in.


NodeMetricSpec = nodemetric_json.NodeMetricSpec
AggregatedUsage = nodemetric_json.AggregatedUsage


class NodeMetricInfo(nodemetric_json.NodeMetricInfoJSON, frozen=True, kw_only=True, rename="camel"):
    """The node's and the system's usage, latest and aggregated."""

    aggregated_system_usages: list[AggregatedUsage] | None = None


class NodeMetricStatus(nodemetric_json.NodeMetricStatusJSON, frozen=True, kw_only=True, rename="camel"):
    """NodeMetricStatus: what koordlet (or koordbus' nodemetric service through the bridge) last reported."""

    node_metric: NodeMetricInfo | None = None
    # Readers skip a `null` entry (Go's nil); the object's schema admits none.
    pods_metric: list[nodemetric_json.PodMetricJSON] | None = None  # type: ignore[assignment]


class NodeMetric(msgspec.Struct, frozen=True, kw_only=True):
    """NodeMetric: one node's resource usage, reported for the schedulers and the batch/mid calculation."""

    metadata: dict[str, Any] = {}
    spec: NodeMetricSpec | None = None
    status: NodeMetricStatus | None = None


OPEN_STRUCTS: Final[Mapping[type, str]] = {
    # Each struct here leaves out fields Koordinator's object has; its object keeps unknown fields (the declared
    # ones are still checked), so a cluster's existing objects are neither refused nor pruned.
    nodemetric_json.ResourceMapJSON: "Koordinator's ResourceMap also lists devices (GPU, RDMA), which koordbus "
    "neither reads nor writes.",
    NodeMetricInfo: "koordlet also reports numaUsages, which koordbus does not read.",
    NodeMetricStatus: "koordlet also reports prodPeakMetric, which koordbus does not read.",
    nodemetric_json.PodMetricJSON: "koordlet's pod entries carry extensions, open in Koordinator's schema too.",
    migration.ObjectReference: "A Kubernetes ObjectReference also has fieldPath and resourceVersion, which the "
    "migration service ignores.",
    migration.PodMigrationJobStatus: "Koordinator's migration controller also records preempted pods and their "
    "reservations, which koordbus does not do.",
}

_KUBERNETES_KEYWORDS: Final = frozenset(
    {
        "type",
        "format",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    }
)
"""JSON Schema keywords a structural schema takes as msgspec writes them."""
_DROPPED: Final = frozenset({"title", "description", "default"})
"""msgspec's `title` repeats the struct name and its `description` is the struct's docstring, written for koordbus'
developers (each kind gets a description of its own); a `default` would be written into stored objects by the API
server."""
_PRESERVE: Final = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING: Final = "x-kubernetes-int-or-string"


class SchemaError(ValueError):
    """A schema has no structural equivalent; names the place and the construct."""


def _open_names(defs: Mapping[str, Json]) -> dict[str, str]:
    """OPEN_STRUCTS by the names msgspec gave them among `defs` (it names a struct after its class)."""
    return {cls.__name__: reason for cls, reason in OPEN_STRUCTS.items() if cls.__name__ in defs}


def struct_schema(struct: type[msgspec.Struct]) -> Json:
    """The structural schema of a struct and everything it holds."""
    (root,), defs = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}", schema_hook=_schema_hook)
    return structural(root, defs, open_defs=_open_names(defs))


def _schema_hook(cls: type) -> Json:
    if cls is object:  # `dict[str, object]`: any JSON value
        return {_PRESERVE: True}
    raise NotImplementedError


def structural(
    node: Json,
    defs: Mapping[str, Json],
    *,
    open_defs: Mapping[str, str],
    where: str = "$",
    inside: tuple[str, ...] = (),
) -> Json:
    """msgspec's JSON schema `node` as a Kubernetes structural schema (see the module docstring); `where` is its
    JSON path, `inside` the structs being inlined around it."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in inside:
            raise SchemaError(f"{where}: {name} contains itself; a CRD schema cannot be recursive")
        out = structural(defs[name], defs, open_defs=open_defs, where=where, inside=(*inside, name))
        if name in open_defs:
            out[_PRESERVE] = True
        return out
    if node.get(_INT_OR_STRING):
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], _INT_OR_STRING: True}
        if "pattern" in node:
            out["pattern"] = node["pattern"]
        return out
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        if len(options) != 1 or len(node["anyOf"]) != 2:
            raise SchemaError(f"{where}: a union of {node['anyOf']} has no structural form (only `X | None` has)")
        out = structural(options[0], defs, open_defs=open_defs, where=where, inside=inside)
        out["nullable"] = True
        return out
    out = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {
                name: structural(sub, defs, open_defs=open_defs, where=f"{where}.{name}", inside=inside)
                for name, sub in sorted(value.items())
            }
        elif key in ("items", "additionalProperties"):
            out[key] = structural(value, defs, open_defs=open_defs, where=f"{where}[]", inside=inside)
        elif key == "required":
            if value:
                out[key] = sorted(value)
        elif key in _KUBERNETES_KEYWORDS or key == _PRESERVE:
            out[key] = value
        else:
            raise SchemaError(f"{where}: {key!r} has no structural equivalent")
    if "enum" in out and "type" not in out:  # a Literal: msgspec lists the values only
        kinds = {type(v) for v in out["enum"]}
        if kinds not in ({str}, {int}):
            raise SchemaError(f"{where}: an enum of {sorted(map(str, kinds))} values has no structural type")
        out["type"] = "string" if kinds == {str} else "integer"
    if out.get("type") == "array" and "items" not in out:
        out["items"] = {_PRESERVE: True}  # `list[Any]`
    if out.get("type") == "integer":
        out.setdefault("format", "int64")  # what the API server stores: JSON integers are int64 in Go
    if out.get("type") == "object" and out.get("additionalProperties") == {_PRESERVE: True}:
        del out["additionalProperties"]  # a map of anything: an open object
        out[_PRESERVE] = True
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out[_PRESERVE] = True  # `dict[str, Any]`: open by declaration
    if "type" not in out and not out.get(_PRESERVE):
        out[_PRESERVE] = True  # `Any`
    return out


# --- NodeSLO: the spec's field table (services.slo.render) as a schema


def _field_schema(kind: slo_render.FieldKind) -> Json:
    if isinstance(kind, gojson.ValueStruct):
        kind = kind.fields
    if isinstance(kind, Mapping):
        return {"type": "object", "properties": {name: _field_schema(sub) for name, sub in sorted(kind.items())}}
    if isinstance(kind, gojson.ListOf):
        return {"type": "array", "items": _field_schema(kind.item)}
    if isinstance(kind, tuple):
        low, high = kind
        if kind == (-(2**31), 2**31 - 1):
            return {"type": "integer", "format": "int32"}
        out: Json = {"type": "integer", "format": "int64"}
        if low > -(2**63):
            out["minimum"] = low
        if high < 2**63 - 1:
            out["maximum"] = high
        return out
    match kind:
        case "bool":
            return {"type": "boolean"}
        case "string" | "string-pointer":
            return {"type": "string"}
        case "quantity":
            return structural(msgspec.json.schema(quantity.RawQuantity), {}, open_defs={})
        case "int-or-string":
            return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
        case "bool-map":
            return {"type": "object", "additionalProperties": {"type": "boolean"}}
        case "string-map":
            return {"type": "object", "additionalProperties": {"type": "string"}}
        case "empty-object":
            return {"type": "object"}  # a Go struct without fields: whatever is in it is pruned
    raise SchemaError(f"unknown NodeSLO field kind {kind!r}")


def nodeslo_schema() -> Json:
    fields: dict[str, slo_render.FieldKind] = {key.spec_field: key.fields for key in slo_render.STRATEGY_KEYS}
    fields[slo_render.HOST_APPLICATIONS_SPEC_FIELD] = gojson.ListOf(slo_render.HOST_APPLICATION_FIELDS, pointers=False)
    spec = _field_schema(fields)
    # Koordinator's NodeSLO spec also has `extensions` (plugin settings, open in its schema too): koordbus renders
    # it empty, as Koordinator does without extenders, and keeps whatever others put there.
    spec["properties"][slo_render.EXTENSIONS_SPEC_FIELD] = {"type": "object", _PRESERVE: True}
    spec[_PRESERVE] = True
    return {
        "type": "object",
        "properties": {
            "metadata": {"type": "object"},
            "spec": spec,
            # koordbus writes no NodeSLO status; Koordinator's is an empty object too (everything in it is pruned).
            "status": {"type": "object"},
        },
    }


# --- the kinds


@dataclass(frozen=True, kw_only=True)
class CustomResource:
    """One kind: its API names (Koordinator's) and where its schema comes from."""

    group: str
    version: str
    kind: str
    plural: str
    description: str
    scope: Literal["Cluster", "Namespaced"]
    status_subresource: bool
    schema: Callable[[], Json]
    short_names: tuple[str, ...] = ()
    annotations: Mapping[str, str] | None = None

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def filename(self) -> str:
        return f"{self.group}_{self.plural}.yaml"


def _from_struct(struct: type[msgspec.Struct]) -> Callable[[], Json]:
    return lambda: struct_schema(struct)


RESOURCES: Final = (
    CustomResource(
        group="slo.koordinator.sh",
        version="v1alpha1",
        kind="NodeMetric",
        plural="nodemetrics",
        description=(
            "One node's resource usage (latest and aggregated, per pod and for the system), written by koordlet "
            "or by koordbus' nodemetric service through its Kubernetes bridge; read by the schedulers and the "
            "batch/mid calculation."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=_from_struct(NodeMetric),
    ),
    CustomResource(
        group="slo.koordinator.sh",
        version="v1alpha1",
        kind="NodeSLO",
        plural="nodeslos",
        description=(
            "The QoS strategies of one node (thresholds, resource QoS per class, CPU burst, system settings, host"
            " applications), rendered from slo-controller-config and applied by the node's agent."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=nodeslo_schema,
    ),
    CustomResource(
        group="scheduling.sigs.k8s.io",
        version="v1alpha1",
        kind="ElasticQuota",
        plural="elasticquotas",
        description=(
            "A node of an elastic quota tree: guaranteed (min) and limit (max) resources, the runtime share "
            "koord-scheduler computes in its annotations, and the resources in use."
        ),
        scope="Namespaced",
        status_subresource=False,
        schema=_from_struct(quota.ElasticQuota),
        # A group under k8s.io is protected: the API server refuses its CRD without this annotation. The API is
        # scheduler-plugins', approved there; Koordinator's CRD carries the same.
        annotations={"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/scheduler-plugins/pull/52"},
    ),
    CustomResource(
        group="quota.koordinator.sh",
        version="v1alpha1",
        kind="ElasticQuotaProfile",
        plural="elasticquotaprofiles",
        description=(
            "Generates an ElasticQuota whose min and max are the resources of the nodes its selector picks "
            "(scaled by resourceRatio)."
        ),
        scope="Namespaced",
        status_subresource=False,
        schema=_from_struct(quota.ElasticQuotaProfile),
        short_names=("eqp",),
    ),
    CustomResource(
        group="scheduling.koordinator.sh",
        version="v1alpha1",
        kind="PodMigrationJob",
        plural="podmigrationjobs",
        description=(
            "A request to move one pod off its node (evict directly, or reserve room elsewhere first), admitted "
            "by the migration arbiter and executed by the migration controller."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=_from_struct(migration.PodMigrationJob),
        short_names=("pmj",),
    ),
)
"""Reservation (scheduling.koordinator.sh) is not here: koordbus creates one for a ReservationFirst migration but
models none of it (the body is a pod template), and only koord-scheduler, which brings its CRD, acts on it."""


def openapi_schema(resource: CustomResource) -> Json:
    """The version's openAPIV3Schema: apiVersion and kind as strings, metadata left to the API server."""
    schema = resource.schema()
    properties = dict(schema.get("properties", {}))
    properties.pop("apiVersion", None)
    properties.pop("kind", None)
    properties["metadata"] = {"type": "object"}  # the API server validates ObjectMeta itself
    top: Json = {"description": resource.description, "type": "object"}
    top["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, **properties}
    top["properties"] = dict(sorted(top["properties"].items()))
    return top


def crd(resource: CustomResource) -> Json:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    metadata: Json = {"name": resource.name}
    if resource.annotations:
        metadata["annotations"] = dict(resource.annotations)
    names: Json = {
        "kind": resource.kind,
        "listKind": f"{resource.kind}List",
        "plural": resource.plural,
        "singular": resource.kind.lower(),
    }
    if resource.short_names:
        names["shortNames"] = list(resource.short_names)
    version: Json = {
        "name": resource.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema(resource)},
    }
    if resource.status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {"group": resource.group, "names": names, "scope": resource.scope, "versions": [version]},
    }


COMMAND: Final = "koordbus crds --out deploy/helm/koordbus/crds"
HEADER: Final = f"# Generated by `{COMMAND}` from koordbus' own schemas (koordbus/crds.py): do not edit.\n"


def render(resource: CustomResource) -> str:
    return HEADER + yaml.safe_dump(crd(resource), sort_keys=False, width=120, allow_unicode=True)


def render_all() -> dict[str, str]:
    """File name → YAML text, every kind."""
    return {resource.filename: render(resource) for resource in RESOURCES}


# --- the command


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "crds",
        help="write the CRDs of the Koordinator kinds koordbus uses",
        description="Generate the CustomResourceDefinitions of the Koordinator kinds koordbus reads and writes "
        "(" + ", ".join(r.kind for r in RESOURCES) + ") from koordbus' own schemas. Names, scope and "
        "subresources are Koordinator's, so the CRDs can stand in for Koordinator's on a cluster without it.",
        epilog=f"The Helm chart ships them: after changing a schema, run `{COMMAND}` and commit the result "
        "(tests/deploy/test_crds.py fails until you do).",
    )
    p.add_argument(
        "--out", metavar="DIR", help="write one <group>_<plural>.yaml per kind into DIR (default: all to stdout)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="with --out: write nothing, exit 1 and name the files that differ from a fresh generation",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    files = render_all()
    if args.out is None:
        if args.check:
            sys.stderr.write("koordbus crds: --check needs --out DIR\n")
            return 2
        sys.stdout.write("---\n".join(files.values()))
        return 0
    out = Path(args.out)
    if args.check:
        stale = [name for name, text in files.items() if not _same(out / name, text)]
        for name in stale:
            sys.stderr.write(f"koordbus crds: {out / name} is out of date; run `{COMMAND}`\n")
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return 0


def _same(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except OSError:
        return False
