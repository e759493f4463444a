"""koordbus.crd_schema's conversion of msgspec schemas into Kubernetes structural schemas, construct by construct
(through koordbus.crds.struct_schema, which keeps the structs of its OPEN_STRUCTS open)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pytest

from koordbus import crd_schema, crds
from schemas import migration, quantity
from services.common import gojson

BOOL = {"type": "boolean"}
QUANTITY = {
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-int-or-string": True,
    "pattern": quantity.QUANTITY_PATTERN,
}


class Inner(msgspec.Struct, kw_only=True):
    """Docstrings stay out of the CRD."""

    count: int


class Sample(msgspec.Struct, kw_only=True, rename="camel"):
    name: str
    inner: Inner | None = None
    inners: list[Inner] = []
    labels: dict[str, str] = {}
    amounts: dict[str, quantity.RawQuantity] | None = None
    mode: Literal["a", "b"] = "a"
    anything: dict[str, Any] = {}
    opaque: dict[str, object] | None = None


def test_structs_are_inlined_nullable_defaults_dropped_and_maps_kept() -> None:
    schema = crds.struct_schema(Sample)
    inner = {"type": "object", "properties": {"count": {"type": "integer", "format": "int64"}}, "required": ["count"]}
    assert schema == {
        "type": "object",
        "properties": {
            "amounts": {"type": "object", "additionalProperties": QUANTITY, "nullable": True},
            "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "inner": {**inner, "nullable": True},
            "inners": {"type": "array", "items": inner},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "mode": {"enum": ["a", "b"], "type": "string"},
            "name": {"type": "string"},
            "opaque": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "nullable": True},
        },
        "required": ["name"],
    }


class Union(msgspec.Struct):
    value: str | int


class Node(msgspec.Struct):
    children: list[Node] = []


class Pair(msgspec.Struct):
    pair: tuple[int, str]


@pytest.mark.parametrize(
    ("struct", "message"),
    [
        (Union, r"\$\.value: a union of .* has no structural form"),
        (Node, r"Node contains itself"),
        (Pair, r"\$\.pair: 'prefixItems' has no structural equivalent"),
    ],
)
def test_what_a_crd_cannot_express_is_refused_with_its_place(struct: type[msgspec.Struct], message: str) -> None:
    with pytest.raises(crd_schema.SchemaError, match=message):
        crds.struct_schema(struct)


def test_an_open_struct_keeps_unknown_fields_wherever_it_appears() -> None:
    schema = crds.struct_schema(migration.PodMigrationJob)
    assert schema["properties"]["spec"]["properties"]["podRef"]["x-kubernetes-preserve-unknown-fields"] is True
    assert schema["properties"]["status"]["properties"]["podRef"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in schema["properties"]["spec"]  # the spec is fully modelled


class Loose(msgspec.Struct):
    one: Any = None
    many: list[Any] = []


def test_any_is_any_json_value_kept_whole() -> None:
    loose = crds.struct_schema(Loose)["properties"]
    assert loose["one"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert loose["many"] == {"type": "array", "items": {"x-kubernetes-preserve-unknown-fields": True}}


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ((0, 100), {"type": "integer", "format": "int64", "minimum": 0, "maximum": 100}),
        ((-(2**31), 2**31 - 1), {"type": "integer", "format": "int32"}),
        ((-(2**63), 2**63 - 1), {"type": "integer", "format": "int64"}),
        ((1, 2**63 - 1), {"type": "integer", "format": "int64", "minimum": 1}),
        ("quantity", QUANTITY),
        ("bool-map", {"type": "object", "additionalProperties": {"type": "boolean"}}),
        ("empty-object", {"type": "object"}),
        ("string-pointer", {"type": "string"}),
        ("int-or-string", {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}),
        (gojson.ValueStruct({"on": "bool"}), {"type": "object", "properties": {"on": BOOL}}),
        (
            gojson.ListOf({"name": "string"}),
            {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        ),
    ],
)
def test_nodeslo_field_kinds(kind: Any, expected: dict[str, Any]) -> None:
    assert crd_schema.field_schema(kind) == expected


def test_the_nodeslo_spec_bounds_are_the_renderers() -> None:
    spec = crd_schema.nodeslo_schema()["properties"]["spec"]
    burst = spec["properties"]["cpuBurstStrategy"]["properties"]["cpuBurstPercent"]
    assert (burst["minimum"], burst["maximum"]) == (0, 10000)
    assert spec["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["properties"]["extensions"]["x-kubernetes-preserve-unknown-fields"] is True  # plugin settings
    threshold = spec["properties"]["resourceUsedThresholdWithBE"]
    assert "x-kubernetes-preserve-unknown-fields" not in threshold  # fully modelled: unknown fields are pruned
