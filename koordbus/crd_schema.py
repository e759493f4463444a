"""Kubernetes *structural* schemas from msgspec's JSON schemas and from the NodeSLO field table; pure. Used by
koordbus.crds, which builds each CRD's openAPIV3Schema with them.

`struct_schema` turns the msgspec structs koordbus decodes and renders an object with (msgspec.json.
schema_components) into a structural schema (`structural`): references inlined, `X | None` written as `nullable`,
quantities as int-or-string with the API server's quantity pattern, free-form maps as `additionalProperties`,
msgspec defaults dropped (the API server would write them into stored objects); the structs named in
`open_structs` keep unknown fields instead of pruning them. The NodeSLO spec has no struct: `nodeslo_schema` builds
its schema from the field tables (services.common.sloconfig) every NodeSLO koordbus writes is checked against.
A construct with no structural form raises SchemaError naming where it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas import quantity
from services.common import gojson, sloconfig
from services.slo import render as slo_render

Json = dict[str, Any]

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


def struct_schema(struct: type[msgspec.Struct], *, open_structs: Mapping[type, str]) -> Json:
    """The structural schema of a struct and everything it holds; the structs in `open_structs` (struct → why)
    keep unknown fields."""
    (root,), defs = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}", schema_hook=_schema_hook)
    # msgspec names a struct after its class among `defs`
    open_defs = {cls.__name__: reason for cls, reason in open_structs.items() if cls.__name__ in defs}
    return structural(root, defs, open_defs=open_defs)


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


# --- NodeSLO: the spec's field tables (services.common.sloconfig) as a schema


def field_schema(kind: sloconfig.FieldKind) -> Json:
    if isinstance(kind, gojson.ValueStruct):
        kind = kind.fields
    if isinstance(kind, Mapping):
        return {"type": "object", "properties": {name: field_schema(sub) for name, sub in sorted(kind.items())}}
    if isinstance(kind, gojson.ListOf):
        return {"type": "array", "items": field_schema(kind.item)}
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
    fields: dict[str, sloconfig.FieldKind] = {key.spec_field: key.fields for key in sloconfig.STRATEGY_KEYS}
    fields[slo_render.HOST_APPLICATIONS_SPEC_FIELD] = gojson.ListOf(sloconfig.HOST_APPLICATION_FIELDS, pointers=False)
    spec = field_schema(fields)
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
