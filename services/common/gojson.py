"""Go's encoding/json as Koordinator's manager applies it to `slo-controller-config`: decoding into typed structs,
re-encoding with `omitempty`, and MergeCfg (marshal one struct, unmarshal it onto another). Pure.

Used by the slo-controller-config's field tables (the kinds below describe each Go type), by services.loadaware
for the annotations Koordinator reads with json.Unmarshal, and by koordbus.crds. A Go value is held as the JSON Go
would encode for it: a field Go would omit is absent (a nil pointer, a non-pointer string "", an empty map or
slice), a non-pointer struct or Quantity is always there. `decode_onto(current, document, kind)` is json.Unmarshal
of `document` into a value whose state is `current`, with Go's rules:

* object keys match field names exactly or case-insensitively; unknown keys are skipped; a key given twice is
  decoded twice, the second time onto what the first left (so objects merge, scalars take the later value);
* `null` sets a pointer, map or slice to nil and leaves a non-pointer string, struct or Quantity as it was;
* an integer field takes only an integer literal in its Go type's range (`60.0`, `6e1`, `"60"` fail), a bool only
  `true`/`false`, a string only a string, an int-or-string a string or an int32 literal;
* an array replaces the slice (Go's documented rule; see `_list`);
* a Quantity takes a string or a number (Quantity's own UnmarshalJSON: surrounding spaces trimmed), and is held as
  its whole-unit Value() rounded up, which is also what is output.

A value of the wrong type is a problem at its JSON path; like Go, decoding goes on with the rest (the field keeps
its value), and the caller decides what a problem means (Koordinator drops the whole key). koordbus adds one rule
Go does not have, as the NodeSLO CRD has it: an integer outside the field's range is a problem too, and so is a
null element in `blocks` (the CRD refuses both, so a NodeSLO holding them could not be written).
`parse` reads JSON text as Go would see it (numbers keep their literal, duplicate keys stay, lone surrogate escapes
become U+FFFD); `encode` is json.Marshal; `merge(base, patch, kind)` is Koordinator's MergeCfg.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from schemas import quantity

UNSET: Final[Any] = msgspec.UNSET
"""A field Go holds as nil or zero and would not encode."""
INLINE: Final = "\x00inline"
"""The key under which an `Inline` kind holds its embedded pointer struct (never a JSON field name)."""
_INT_LITERAL_DIGITS: Final = 25
_INT64: Final = (-(2**63), 2**63 - 1)
_MAPS: Final = ("bool-map", "string-map", "int64-map")


class ListOf(msgspec.Struct, frozen=True):
    """A Go slice of `item`; `pointers` for `[]*T` (a null element is nil), else `[]T` (a null element is left)."""

    item: Any
    pointers: bool = True


class ValueStruct(msgspec.Struct, frozen=True):
    """A non-pointer struct field: never nil, so always encoded (`{}` when zero); `null` leaves it as it was."""

    fields: Mapping[str, Any]


class Inline(msgspec.Struct, frozen=True):
    """A struct with its own `fields` and an embedded pointer struct with `inline` fields (Go `*T` inline): the
    embedded struct exists, under INLINE, once any of its keys appears, even with a null value."""

    fields: Mapping[str, Any]
    inline: Mapping[str, Any]


Kind = Any
"""An integer range `(low, high)` (an `*int64`/`*int32`); "bool" (`*bool`); "string" (a Go `string`: "" is unset);
"string-pointer" (`*string`: "" is a value); "quantity" (a non-pointer resource.Quantity); "int-or-string"
(`*intstr.IntOrString`); "bool-map" / "string-map" / "int64-map" (`map[string]bool` / `map[string]string` /
`map[string]int64`, as the load-aware scheduler's annotations hold resource percents); "empty-object" (a
pointer to a struct without fields); a mapping of field names to kinds (a pointer struct); ValueStruct; ListOf;
Inline."""


class Fractional(str):
    """A JSON number literal with a fraction or an exponent, as written (Go's integer fields refuse it)."""


class BigInteger(str):
    """An integer literal too long for any Go integer type, as written."""


class Problem(msgspec.Struct, frozen=True):
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class GoJsonError(ValueError):
    """The text is not JSON Go would accept."""


class Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in order, duplicates kept (what Go's decoder walks)."""


def parse(text: str) -> Any:
    """The JSON text as Go's decoder sees it: objects as Pairs, numbers with their literal; GoJsonError if not JSON."""
    try:
        document = json.loads(
            text, object_pairs_hook=Pairs, parse_float=Fractional, parse_int=_int_literal, parse_constant=_no_constant
        )
    except json.JSONDecodeError as err:
        raise GoJsonError(f"not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise GoJsonError("not JSON Go would read: nested too deeply") from None
    except ValueError as err:
        raise GoJsonError(f"not JSON: {err}") from None
    if _SURROGATE.search(text) or _SURROGATE_ESCAPE.search(text):
        try:
            document = _replace_surrogates(document)
        except RecursionError:
            raise GoJsonError("not JSON Go would read: nested too deeply") from None
    return document


def _int_literal(text: str) -> int | BigInteger:
    return BigInteger(text) if len(text) > _INT_LITERAL_DIGITS else int(text)


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


def _replace_surrogates(value: Any) -> Any:
    """Lone surrogates (from `\\ud800` escapes) become U+FFFD, as Go's decoder makes them."""
    if isinstance(value, str) and not isinstance(value, Fractional | BigInteger):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, Pairs):
        return Pairs((_replace_surrogates(k), _replace_surrogates(v)) for k, v in value)
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


# --- decoding


def decode_onto(current: Any, value: Any, kind: Kind, path: str, problems: list[Problem]) -> Any:
    """json.Unmarshal of the parsed `value` into a Go value now holding `current` (UNSET: zero); returns the new
    value (UNSET: nil/zero) without changing `current`. Each wrong type or range is appended to `problems`, and that
    field keeps `current`, as in Go."""
    if value is None:
        return current if _ignores_null(kind) else UNSET
    if isinstance(kind, tuple):
        return _integer(current, value, kind, path, problems)
    if isinstance(kind, Mapping | ValueStruct | Inline):
        return _struct(current, value, kind, path, problems)
    if isinstance(kind, ListOf):
        decoded = _list(value, kind, path, problems)
        return current if decoded is UNSET else decoded
    decoded = _SCALARS[kind](value)
    if isinstance(decoded, Problem):
        problems.append(Problem(path + decoded.path, decoded.reason))
        return current
    if kind in _MAPS:
        return {**(current if current is not UNSET else {}), **decoded}
    return decoded


def _ignores_null(kind: Kind) -> bool:
    return isinstance(kind, ValueStruct) or kind in ("string", "quantity")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, Fractional | BigInteger | int):
        return f"the number {_clip(str(value))}"
    if isinstance(value, str):
        return f"the string {_clip(json.dumps(value))}"
    if isinstance(value, Pairs | Mapping):
        return "an object"
    return "an array"


def _clip(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(current: Any, value: Any, kind: tuple[int, int], path: str, problems: list[Problem]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | BigInteger):
        problems.append(Problem(path, f"expected an integer, got {_type_name(value)}"))
        return current
    low, high = kind
    if isinstance(value, BigInteger) or not low <= value <= high:
        problems.append(Problem(path, f"{_clip(str(value))} is out of range [{low}, {high}]"))
        return current
    return value


def _expect(kind_name: str, test: Any) -> Any:
    def check(value: Any) -> Any:
        return value if test(value) else Problem("", f"expected {kind_name}, got {_type_name(value)}")

    return check


def _plain_string(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, Fractional | BigInteger)


def _string(value: Any) -> Any:
    checked = _expect("a string", _plain_string)(value)
    return UNSET if checked == "" else checked


def _quantity(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int):
        return Problem("", f"expected a quantity (a string or a number), got {_type_name(value)}")
    text = str(value).strip() if _plain_string(value) else str(value)
    try:
        return quantity.int_value(quantity.parse_quantity(text))
    except quantity.QuantityError as err:
        return Problem("", str(err))


def _int_or_string(value: Any) -> Any:
    if _plain_string(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int | Fractional | BigInteger):
        return Problem("", f"expected an integer or a string, got {_type_name(value)}")
    if isinstance(value, int) and -(2**31) <= value < 2**31:
        return value
    return Problem("", f"expected an int32 or a string, got {_type_name(value)}")


def _map_of(kind_name: str, test: Any, zero: Any) -> Any:
    def check(value: Any) -> Any:
        if not isinstance(value, Pairs | Mapping):
            return Problem("", f"expected an object, got {_type_name(value)}")
        out: dict[str, Any] = {}
        for key, item in _items(value):
            if item is None:
                out[key] = zero
            elif test(item):
                out[key] = item
            else:
                return Problem(f".{_key(key)}", f"expected {kind_name}, got {_type_name(item)}")
        return out

    return check


def _empty_object(value: Any) -> Any:
    return {} if isinstance(value, Pairs | Mapping) else Problem("", f"expected an object, got {_type_name(value)}")


_SCALARS: Final[Mapping[str, Any]] = {
    "bool": _expect("true or false", lambda v: isinstance(v, bool)),
    "string": _string,
    "string-pointer": _expect("a string", _plain_string),
    "quantity": _quantity,
    "int-or-string": _int_or_string,
    "bool-map": _map_of("true or false", lambda v: isinstance(v, bool), False),
    "string-map": _map_of("a string", _plain_string, ""),
    "int64-map": _map_of(
        "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1], 0
    ),
    "empty-object": _empty_object,
}


def _items(value: Pairs | Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    return value if isinstance(value, Pairs) else value.items()


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _fields_of(kind: Mapping[str, Any] | ValueStruct | Inline) -> Mapping[str, Any]:
    if isinstance(kind, ValueStruct | Inline):
        return kind.fields
    return kind


def _field(fields: Mapping[str, Any], key: str) -> str | None:
    """The field a key sets: the exact name, else one equal ignoring case (Go's rule); None for an unknown key."""
    if key in fields:
        return key
    folded = key.casefold()
    return next((name for name in fields if name.casefold() == folded), None)


def _struct(
    current: Any, value: Any, kind: Mapping[str, Any] | ValueStruct | Inline, path: str, problems: list[Problem]
) -> Any:
    if not isinstance(value, Pairs | Mapping):
        problems.append(Problem(path, f"expected an object, got {_type_name(value)}"))
        return current
    out: dict[str, Any] = dict(current) if current is not UNSET else {}
    fields = _fields_of(kind)
    for key, item in _items(value):
        where = f"{path}.{_key(key)}"
        name = _field(fields, key)
        if name is not None:
            _set(out, name, decode_onto(out.get(name, UNSET), item, fields[name], where, problems))
        elif isinstance(kind, Inline) and (name := _field(kind.inline, key)) is not None:
            embedded = dict(out.get(INLINE) or {})
            _set(embedded, name, decode_onto(embedded.get(name, UNSET), item, kind.inline[name], where, problems))
            out[INLINE] = embedded
    return out


def _set(obj: dict[str, Any], name: str, value: Any) -> None:
    if value is UNSET:
        obj.pop(name, None)
    else:
        obj[name] = value


def _list(value: Any, kind: ListOf, path: str, problems: list[Problem]) -> Any:
    """A new slice from the array: Go's documented rule (the slice is reset, then appended to). Its decoder in fact
    decodes onto the old elements within the slice's capacity, which would make MergeCfg merge `blocks` by index;
    CALC-CONTRACT.md asks for arrays that replace, and so do we."""
    if not isinstance(value, list) or isinstance(value, Pairs):
        problems.append(Problem(path, f"expected an array, got {_type_name(value)}"))
        return UNSET
    element_kind = ValueStruct(kind.item) if isinstance(kind.item, Mapping) and not kind.pointers else kind.item
    out = []
    for index, item in enumerate(value):
        where = f"{path}[{index}]"
        if item is None and kind.pointers and isinstance(kind.item, Mapping):
            problems.append(Problem(where, "expected an object, got null (the NodeSLO CRD refuses a null item)"))
            decoded = UNSET
        else:  # a null decoded into a non-pointer element leaves it zero
            decoded = decode_onto(UNSET, item, element_kind, where, problems)
        out.append(_zero(element_kind) if decoded is UNSET else decoded)
    return out


def _zero(kind: Kind) -> Any:
    if kind in ("string", "string-pointer"):
        return ""
    if kind == "quantity":
        return 0
    if isinstance(kind, Mapping | ValueStruct | Inline):
        return {}
    return None


# --- encoding and MergeCfg


def encode(value: Any, kind: Kind) -> Any:
    """json.Marshal of the Go value: fields in table order, `omitempty` ones left out when nil or empty."""
    if isinstance(kind, Mapping | ValueStruct | Inline):
        out: dict[str, Any] = {}
        for name, sub in _fields_of(kind).items():
            field = value.get(name, UNSET)
            if field is UNSET:
                if isinstance(sub, ValueStruct):
                    out[name] = encode({}, sub)
                elif sub == "quantity":
                    out[name] = 0
                continue
            if (isinstance(sub, ListOf) or sub in _MAPS) and not field:
                continue
            out[name] = encode(field, sub)
        return out
    if isinstance(kind, ListOf):
        return [encode(item, kind.item) for item in value]
    if kind in (*_MAPS, "empty-object"):
        return dict(value)
    return value


def merge(base: Any, patch: Any, kind: Kind) -> Any:
    """Koordinator's MergeCfg(base, patch): patch marshalled, then unmarshalled onto base; returns the merged value
    as Go would encode it. `patch` holds values already decoded, so nothing here can be a problem."""
    problems: list[Problem] = []
    merged = decode_onto(base, encode(patch, kind), kind, "$", problems)
    if problems:  # cannot happen: every value in patch was decoded by the same kinds
        raise AssertionError(f"MergeCfg re-decoding failed: {problems}")
    return encode(merged, kind)
