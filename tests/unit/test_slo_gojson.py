"""services.common.gojson: Go's encoding/json decoding, re-encoding and MergeCfg on a small field table."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from services.common import gojson
from services.common.gojson import UNSET, Inline, ListOf, ValueStruct

FIELDS: dict[str, Any] = {
    "on": "bool",
    "percent": (0, 100),
    "small": (-(2**31), 2**31 - 1),
    "policy": "string",
    "cpuPolicy": "string-pointer",
    "bandwidth": "quantity",
    "limit": "int-or-string",
    "features": "bool-map",
    "inner": {"a": (0, 10), "b": "bool"},
    "cfg": ValueStruct({"x": (0, 10)}),
    "blocks": ListOf({"name": "string", "cfg": ValueStruct({"x": (0, 10)})}),
    "names": ListOf("string", pointers=False),
    "strategy": "empty-object",
}


def decode(text: str, kind: Any = FIELDS) -> tuple[Any, list[str]]:
    problems: list[gojson.Problem] = []
    value = gojson.decode_onto(UNSET, gojson.parse(text), kind, "$", problems)
    return value, [str(p) for p in problems]


def test_keys_match_case_insensitively_unknown_ones_are_dropped_and_a_repeated_key_decodes_again() -> None:
    value, problems = decode(
        '{"ON": true, "Percent": 5, "percent": 7, "other": {"x": 1}, "INNER": {"a": 1}, "inner": {"b": true}}'
    )
    assert problems == []
    assert value == {
        "on": True,
        "percent": 7,
        "inner": {"a": 1, "b": True},
    }  # the second `inner` decodes onto the first


def test_null_clears_pointers_and_leaves_non_pointer_fields() -> None:
    value, _ = decode('{"on": true, "policy": "x", "cfg": {"x": 2}, "bandwidth": "1k"}')
    problems: list[gojson.Problem] = []
    document = gojson.parse('{"on": null, "policy": null, "cfg": null, "bandwidth": null}')
    assert gojson.decode_onto(value, document, FIELDS, "$", problems) == {
        "policy": "x",
        "cfg": {"x": 2},
        "bandwidth": 1000,
    }


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"percent": 60.0}', "$.percent: expected an integer, got the number 60.0"),
        ('{"percent": 6e1}', "$.percent: expected an integer, got the number 6e1"),
        ('{"percent": "60"}', '$.percent: expected an integer, got the string "60"'),
        ('{"percent": true}', "$.percent: expected an integer, got the boolean true"),
        ('{"percent": 101}', "$.percent: 101 is out of range [0, 100]"),
        ('{"small": 2147483648}', "$.small: 2147483648 is out of range [-2147483648, 2147483647]"),
        ('{"percent": 123456789012345678901234567890}', "$.percent: 123456789012345678901234567890 is out of range"),
        ('{"on": 1}', "$.on: expected true or false, got the number 1"),
        ('{"policy": 1}', "$.policy: expected a string, got the number 1"),
        ('{"inner": []}', "$.inner: expected an object, got an array"),
        ('{"inner": {"a": 11}}', "$.inner.a: 11 is out of range [0, 10]"),
        ('{"bandwidth": "fast"}', "$.bandwidth: cannot parse quantity 'fast'"),
        ('{"bandwidth": true}', "$.bandwidth: expected a quantity (a string or a number), got the boolean true"),
        ('{"limit": 1.5}', "$.limit: expected an int32 or a string, got the number 1.5"),
        ('{"features": {"A": 1}}', "$.features.A: expected true or false, got the number 1"),
        ('{"blocks": [null]}', "$.blocks[0]: expected an object, got null (the NodeSLO CRD refuses a null item)"),
        ('{"names": "a"}', '$.names: expected an array, got the string "a"'),
        ('{"strategy": 3}', "$.strategy: expected an object, got the number 3"),
        ('"text"', '$: expected an object, got the string "text"'),
    ],
)
def test_a_value_go_would_not_decode_is_a_problem_at_its_path(text: str, problem: str) -> None:
    _, problems = decode(text)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_decoding_goes_on_after_a_problem_and_reports_them_all() -> None:
    value, problems = decode('{"on": "yes", "percent": 5, "policy": 3}')
    assert value == {"percent": 5}
    assert [p.split(":")[0] for p in problems] == ["$.on", "$.policy"]


def test_scalars_take_go_forms() -> None:
    value, problems = decode(
        '{"policy": "", "cpuPolicy": "", "bandwidth": " 1.5 ", "limit": "50M", "features": {"a": null, "b": true},'
        ' "names": ["x", null], "strategy": {"anything": [1]}, "blocks": [], "percent": -0}'
    )
    assert problems == []
    assert value == {
        "cpuPolicy": "",  # a *string keeps "", a string does not
        "bandwidth": 2,  # Quantity trims spaces; Value() rounds up
        "limit": "50M",
        "features": {"a": False, "b": True},  # null into a bool map element is false
        "names": ["x", ""],
        "strategy": {},
        "blocks": [],
        "percent": 0,
    }
    assert gojson.decode_onto(UNSET, gojson.parse("12e3"), "quantity", "$", []) == 12000
    assert gojson.decode_onto(UNSET, gojson.parse("80"), "int-or-string", "$", []) == 80


def test_encode_omits_what_go_omits_and_always_writes_value_structs_and_quantities() -> None:
    assert gojson.encode({"features": {}, "blocks": [], "names": [], "on": False}, FIELDS) == {
        "on": False,
        "bandwidth": 0,
        "cfg": {},
    }
    assert gojson.encode({"blocks": [{"name": "sda"}]}, FIELDS)["blocks"] == [{"name": "sda", "cfg": {}}]


def test_merge_is_marshal_then_unmarshal_onto_the_base() -> None:
    base = {
        "on": True,
        "percent": 5,
        "inner": {"a": 1},
        "features": {"x": True},
        "blocks": [{"name": "a", "cfg": {"x": 1}}],
    }
    patch = {"percent": 0, "inner": {"b": False}, "features": {"y": False}, "blocks": [{"cfg": {}}]}
    merged = gojson.merge(base, patch, FIELDS)
    assert merged == {
        "on": True,
        "percent": 0,  # an explicit 0 is a value
        "bandwidth": 0,  # the patch's Quantity is always marshalled
        "inner": {"a": 1, "b": False},
        "features": {"x": True, "y": False},
        "cfg": {},
        "blocks": [{"cfg": {}}],  # arrays replace (CALC-CONTRACT.md)
    }
    assert gojson.merge(base, {}, FIELDS)["bandwidth"] == 0


def test_an_inline_pointer_struct_exists_once_any_of_its_keys_appears() -> None:
    entry = Inline({"name": "string"}, {"on": "bool"})
    assert decode('{"name": "n"}', entry)[0] == {"name": "n"}
    assert decode('{"name": "n", "ON": null}', entry)[0] == {"name": "n", gojson.INLINE: {}}
    assert decode('{"on": true, "x": 1}', entry)[0] == {gojson.INLINE: {"on": True}}


@pytest.mark.parametrize("text", ["", " ", "{", '{"a": NaN}', '{"a": Infinity}', "[1,]", "nul", '{"a" 1}'])
def test_text_go_would_not_parse_is_refused(text: str) -> None:
    with pytest.raises(gojson.GoJsonError, match="not JSON"):
        gojson.parse(text)


def test_parse_keeps_duplicates_and_literals_and_replaces_lone_surrogates() -> None:
    document = gojson.parse('{"a": 1.50, "a": "\\ud800x", "b": 10}')
    assert isinstance(document, gojson.Pairs)
    assert document == [("a", "1.50"), ("a", "\ufffdx"), ("b", 10)]
    with pytest.raises(gojson.GoJsonError, match="nested too deeply"):
        gojson.parse("[" * 100_000 + "]" * 100_000)
    for depth in (100, 500, 900, 990, 5000):  # around the interpreter's limit: a GoJsonError at worst, never a crash
        deep = "[" * depth + '"\\ud800"' + "]" * depth  # the surrogate walk recurses as deep as the parser did
        with contextlib.suppress(gojson.GoJsonError):
            gojson.parse(deep)


def test_int64_maps_take_integers_in_range_and_merge_a_repeated_key() -> None:
    problems: list[gojson.Problem] = []
    kind = {"factors": "int64-map"}
    decoded = gojson.decode_onto(
        gojson.UNSET, gojson.parse('{"factors": {"cpu": 150}, "factors": {"memory": -1}}'), kind, "$", problems
    )
    assert (decoded, problems) == ({"factors": {"cpu": 150, "memory": -1}}, [])
    for bad in ('{"factors": {"cpu": 1.5}}', '{"factors": {"cpu": "2"}}', '{"factors": {"cpu": 9223372036854775808}}'):
        problems = []
        gojson.decode_onto(gojson.UNSET, gojson.parse(bad), kind, "$", problems)
        assert [p.path for p in problems] == ["$.factors.cpu"], bad
