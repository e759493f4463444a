"""Exact Kubernetes resource quantities (`500m`, `4Gi`, `2e3`) and the integer amounts our calculations use.

This is the edge between Kubernetes' quantity strings and koordbus' integer ResourceLists (schemas.resources):
services.k8s, the `koordbus calc` input decoder and the agent parse quantities with `amount`/`resource_list`
and write them back with `format_amount`/`format_resource_list`. Parsing and canonical formatting follow
k8s.io/apimachinery/pkg/api/resource with exact fractions, never floats: values finer than a nano are
rounded away from zero, and `format_quantity` emits the canonical String() form. The one range rule, the same
for every caller (API bodies, the extender, the bridge, `calc`): a quantity's value, rounded up to a whole unit
as Kubernetes' Value() does, must fit Kubernetes' int64 (magnitude at most 2^63-1); beyond that is a
QuantityError saying "out of range" (the callers prefix the field). Go caps BinarySI values there and keeps
larger decimal ones it cannot report as an int64; koordbus refuses both rather than hold an amount other than
the one written. Other deliberate differences, all for inputs no real object carries: a sign or unit with no
digits ("Gi", "-") is an error rather than zero; mantissas and exponents are limited to 400 digits; values
beyond the largest suffix are written with that suffix (Go prints a wrong number there); and non-canonical
spellings such as "+1" or "1E3" come back canonical ("1", "1e3"), where Go's String() may echo the input text.

Speed matters here: the Kubernetes bridge parses every quantity of every pod. Parsed text is memoised in a
bounded LRU cache (real objects repeat a handful of strings), and the common unsigned forms ("500m", "4Gi",
"2", "1.5") are parsed with integer arithmetic in nano units; anything else (signs, exponents, ".5",
whitespace, errors) takes the general Fraction path, which is the reference the fast path is tested against.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Final, Literal, NamedTuple

import msgspec

from schemas import resources

QuantityFormat = Literal["DecimalSI", "BinarySI", "DecimalExponent"]
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""The API server's syntax of a quantity string: what a CRD checks an int-or-string quantity field against."""
RawQuantity = Annotated[
    str | int | float,
    msgspec.Meta(extra_json_schema={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
"""A quantity as written in an object (string or bare number); its JSON schema is Kubernetes' int-or-string
quantity, which koordbus.crds turns into the CRDs' quantity fields."""

DECIMAL_SI: QuantityFormat = "DecimalSI"
BINARY_SI: QuantityFormat = "BinarySI"
DECIMAL_EXPONENT: QuantityFormat = "DecimalExponent"

# suffix -> power of ten; the empty suffix is the plain number.
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# suffix -> power of 1024.
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIX_BY_EXPONENT = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIX_BY_POWER = {0: "", **{power: suffix for suffix, power in _BINARY_SUFFIXES.items()}}
_LARGEST_DECIMAL_EXPONENT = 18
_LARGEST_BINARY_POWER = 6

_NUMBER = re.compile(r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exponent>[+-]?[0-9]+)")
# The forms real objects carry: unsigned digits, an optional fraction, an optional SI suffix. Bounded lengths
# keep this far from the digit limit; `fullmatch` rejects a trailing newline, which `$` would let through.
_COMMON_FORM = re.compile(r"([0-9]{1,40})(?:\.([0-9]{1,40}))?(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")

_NANO = Fraction(1, 10**9)
MAX_VALUE: Final = 2**63 - 1
"""The largest magnitude of a quantity's whole-unit value (Kubernetes' int64 Value()); larger is out of range."""
_MAX_DIGITS = 400  # keeps arithmetic and str() of the result bounded for hostile input.
_NANOS_PER_UNIT = 10**9
_NANOS_PER_MILLI = 10**6
# suffix -> (nanos in one unit of it, format); every decimal exponent is >= -9, so these are whole numbers.
_NANOS_PER_SUFFIX: dict[str, tuple[int, QuantityFormat]] = {
    **{suffix: (10 ** (exponent + 9), DECIMAL_SI) for suffix, exponent in _DECIMAL_SUFFIXES.items()},
    **{suffix: (1024**power * _NANOS_PER_UNIT, BINARY_SI) for suffix, power in _BINARY_SUFFIXES.items()},
}
_PARSE_CACHE_SIZE = 4096  # distinct strings kept; a cluster's pods share far fewer.


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message names the offending text."""


@dataclass(frozen=True)
class Quantity:
    """An exact quantity: its value and the format (suffix family) it is written in."""

    value: Fraction
    format: QuantityFormat


def parse_quantity(text: RawQuantity) -> Quantity:
    """Parse a quantity string, or a bare JSON number as it appears in annotations and `calc` input."""
    return _parse_source(_source_text(text)).quantity


class _ParsedText(NamedTuple):
    """A parsed quantity with the two roundings `amount` needs, computed once per distinct string."""

    quantity: Quantity
    whole_units: int  # int_value(quantity)
    millis: int  # milli_value(quantity)


def _source_text(text: RawQuantity) -> str:
    """The text to parse: the string itself, or the JSON spelling of a bare number."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise QuantityError(f"cannot parse quantity {text!r}: expected a string or a number")
    if isinstance(text, float) and not math.isfinite(text):
        raise QuantityError(f"cannot parse quantity {text!r}: not a finite number")
    return text if isinstance(text, str) else repr(text)


@functools.lru_cache(maxsize=_PARSE_CACHE_SIZE)
def _parse_source(source: str) -> _ParsedText:
    """Memoised parse; errors are raised, not cached. Results are immutable, so sharing them is safe."""
    return _parse_common_form(source) or _parse_any_form(source)


def _parse_common_form(source: str) -> _ParsedText | None:
    """Integer-only parse of the common unsigned forms; None for anything else (the general path decides)."""
    match = _COMMON_FORM.fullmatch(source)
    if match is None:
        return None
    whole, frac, suffix = match.groups("")
    nanos_per_unit_of_suffix, fmt = _NANOS_PER_SUFFIX[suffix]
    nanos = int(whole + frac) * nanos_per_unit_of_suffix
    if frac:
        nanos = -(-nanos // 10 ** len(frac))  # round up to a whole nano, as the general path does
    whole_units = -(-nanos // _NANOS_PER_UNIT)
    if whole_units > MAX_VALUE:
        raise _out_of_range(source)
    if fmt == BINARY_SI and 0 < nanos < _NANOS_PER_UNIT:
        fmt = DECIMAL_SI
    return _ParsedText(Quantity(Fraction(nanos, _NANOS_PER_UNIT), fmt), whole_units, -(-nanos // _NANOS_PER_MILLI))


def _out_of_range(source: str) -> QuantityError:
    return QuantityError(
        f"quantity {source!r} is out of range: Kubernetes holds values up to {MAX_VALUE} (2^63-1) whole units"
    )


def _parse_any_form(source: str) -> _ParsedText:
    """The general, exact parse of any quantity text (the reference for `_parse_common_form`)."""
    quantity = _parse_exact(source)
    return _ParsedText(quantity, whole_units=int_value(quantity), millis=milli_value(quantity))


def _parse_exact(source: str) -> Quantity:
    match = _NUMBER.fullmatch(source)
    if match is None or not (match["whole"] or match["frac"]):
        raise QuantityError(f"cannot parse quantity {source!r}")
    frac = match["frac"] or ""
    digits = match["whole"] + frac
    if len(digits) > _MAX_DIGITS:
        raise QuantityError(f"cannot parse quantity {source!r}: more than {_MAX_DIGITS} digits")
    magnitude, fmt = _apply_suffix(Fraction(int(digits), 10 ** len(frac)), match["suffix"], source)
    magnitude = _round_up_to_nano(magnitude)
    if math.ceil(magnitude) > MAX_VALUE:
        raise _out_of_range(source)
    if fmt == BINARY_SI and 0 < magnitude < 1:
        fmt = DECIMAL_SI  # Kubernetes' own choice: a sub-unit binary value reads better in milli/micro/nano.
    return Quantity(-magnitude if match["sign"] == "-" else magnitude, fmt)


def _apply_suffix(number: Fraction, suffix: str, source: str) -> tuple[Fraction, QuantityFormat]:
    """Scale the unsigned number by its suffix; the suffix family decides the format."""
    if suffix in _DECIMAL_SUFFIXES:
        return number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return number * 1024 ** _BINARY_SUFFIXES[suffix], BINARY_SI
    exponent_match = _EXPONENT.fullmatch(suffix)
    if exponent_match is None:
        raise QuantityError(f"cannot parse quantity {source!r}")
    exponent_text = exponent_match["exponent"]
    if len(exponent_text.lstrip("+-").lstrip("0")) > 3 or abs(int(exponent_text)) > _MAX_DIGITS:
        raise QuantityError(f"cannot parse quantity {source!r}: exponent out of range")
    return number * Fraction(10) ** int(exponent_text), DECIMAL_EXPONENT


def _round_up_to_nano(value: Fraction) -> Fraction:
    """Round away from zero to a whole number of nano units (asking for a little must give some)."""
    return Fraction(_ceil_away_from_zero(value / _NANO), 10**9)


def _ceil_away_from_zero(value: Fraction) -> int:
    return math.ceil(value) if value >= 0 else math.floor(value)


def format_quantity(q: Quantity) -> str:
    """Kubernetes' canonical String(): the largest suffix that keeps the mantissa a whole number."""
    value = _round_up_to_nano(q.value)  # a constructed value finer than nano is rounded as parsing would
    if value == 0:
        return "0"
    if q.format == BINARY_SI and abs(value) >= 1024 and value.denominator == 1:
        return _format_binary(value.numerator)
    # Binary values below 1024 or with a fraction are written in DecimalSI, as Kubernetes does.
    return _format_decimal(value, DECIMAL_EXPONENT if q.format == DECIMAL_EXPONENT else DECIMAL_SI)


def _format_binary(value: int) -> str:
    mantissa, power = value, 0
    while mantissa % 1024 == 0 and power < _LARGEST_BINARY_POWER:
        mantissa, power = mantissa // 1024, power + 1
    return f"{mantissa}{_BINARY_SUFFIX_BY_POWER[power]}"


def _format_decimal(value: Fraction, fmt: QuantityFormat) -> str:
    return _format_decimal_parts(int(value / _NANO), -9, fmt)


def _format_decimal_parts(mantissa: int, exponent: int, fmt: QuantityFormat) -> str:
    """mantissa × 10^exponent (mantissa ≠ 0) in canonical decimal form."""
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    # Step down to a multiple of three so the exponent matches an SI suffix (1e4 is 10e3, never 0.01e6).
    mantissa, exponent = mantissa * 10 ** (exponent % 3), exponent - exponent % 3
    if fmt == DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    if exponent > _LARGEST_DECIMAL_EXPONENT:
        mantissa *= 10 ** (exponent - _LARGEST_DECIMAL_EXPONENT)
        exponent = _LARGEST_DECIMAL_EXPONENT
    return f"{mantissa}{_DECIMAL_SUFFIX_BY_EXPONENT[exponent]}"


def canonicalize(text: RawQuantity) -> str:
    """The canonical spelling of a quantity: `canonicalize("1.5") == "1500m"`."""
    return format_quantity(parse_quantity(text))


def milli_value(q: Quantity) -> int:
    """Kubernetes MilliValue(): value × 1000, rounded up (away from zero)."""
    return _ceil_away_from_zero(q.value * 1000)


def int_value(q: Quantity) -> int:
    """Kubernetes Value(): the value rounded up (away from zero) to a whole number."""
    return _ceil_away_from_zero(q.value)


def _counts_millicores_as_written(resource_name: str) -> bool:
    """Koordinator writes batch-cpu/mid-cpu as plain milli-core counts (`batch-cpu: 4000` is 4 cores)."""
    return resource_name.endswith(("batch-cpu", "mid-cpu"))


def amount(resource_name: str, value: RawQuantity) -> int:
    """Our integer amount for a quantity of `resource_name`: millicores for CPU resources, else base units."""
    parsed = _parse_source(_source_text(value))
    if _counts_millicores_as_written(resource_name) or not resources.is_milli_resource(resource_name):
        return parsed.whole_units
    return parsed.millis


def format_amount(resource_name: str, value: int) -> str:
    """The quantity string Koordinator would write for our integer `value` of `resource_name` (Go's String()).

    Compare amounts, not strings: a BinarySI value written as plain digits reads back as DecimalSI, so the
    API server stores 25000 bytes as "25k" (canonicalize gives that stored form).
    """
    if _counts_millicores_as_written(resource_name):
        return format_integer(value)
    if resources.is_milli_resource(resource_name):
        return format_integer(value, milli=True)
    return format_integer(value, binary=True)


def format_integer(value: int, *, milli: bool = False, binary: bool = False) -> str:
    """`format_quantity` of `value` (thousandths when `milli`) in DecimalSI, or BinarySI when `binary`, with integer
    arithmetic only: it runs for every resource of every decision (the Fraction path is the reference, and a
    property test holds the two equal)."""
    if value == 0:
        return "0"
    if milli:
        return _format_decimal_parts(value, -3, DECIMAL_SI)
    if binary and abs(value) >= 1024:
        return _format_binary(value)
    return _format_decimal_parts(value, 0, DECIMAL_SI)


def resource_list(obj: Mapping[str, RawQuantity]) -> resources.ResourceList:
    """Parse a Kubernetes ResourceList; an error names the resource whose quantity is bad."""
    parsed: resources.ResourceList = {}
    for name, raw in obj.items():
        try:
            parsed[name] = amount(name, raw)
        except QuantityError as err:
            raise QuantityError(f"{name}: {err}") from None
    return parsed


def format_resource_list(rl: Mapping[str, int]) -> dict[str, str]:
    """Write an integer ResourceList back as Kubernetes quantity strings."""
    return {name: format_amount(name, value) for name, value in rl.items()}
