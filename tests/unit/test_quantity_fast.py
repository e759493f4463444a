"""The fast quantity parse (integer arithmetic for the common forms, plus an LRU cache) changes no result.

schemas.quantity keeps its general Fraction parse as the reference; these tests compare the fast path and the
cached public functions against it, for the forms real objects carry, for near misses (signs, exponents, bare
dots, whitespace) and for arbitrary text, including the exact error raised for bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import quantity
from schemas.quantity import RawQuantity

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
RESOURCE_NAMES = ["cpu", "memory", "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory", "pods", "mid-cpu"]

digits = st.text(alphabet="0123456789", min_size=1, max_size=25)
common_text = st.builds(
    lambda whole, frac, suffix: whole + ("" if frac is None else "." + frac) + suffix,
    digits,
    st.none() | digits,
    st.sampled_from(SUFFIXES),
)
realistic_text = st.builds(
    lambda n, suffix: f"{n}{suffix}",
    st.integers(min_value=0, max_value=10**7),
    st.sampled_from(["", "m", "Ki", "Mi", "Gi", "k", "M", "G"]),
)
# Values near a nano and below one unit, where rounding and the BinarySI -> DecimalSI switch happen.
tiny_text = st.builds(
    lambda zeros, digit, suffix: f"0.{'0' * zeros}{digit}{suffix}",
    st.integers(min_value=0, max_value=14),
    digits,
    st.sampled_from(SUFFIXES),
)
# Near misses of the common grammar: the fast path must hand every one of these to the general parse.
near_miss_text = st.text(alphabet="0123456789.+-eEkKMGTPinmu \n\t", max_size=14)
any_text = common_text | realistic_text | tiny_text | near_miss_text | st.text(max_size=16)
raw_quantity = any_text | st.integers() | st.floats(allow_nan=True, allow_infinity=True)

Outcome = tuple[str, object]


def _outcome(compute: Callable[[], object]) -> Outcome:
    """The result, or the error kind and message: what a caller can observe."""
    try:
        result = compute()
    except ValueError as err:
        return (type(err).__name__, str(err))
    if isinstance(result, quantity.Quantity):
        assert type(result.value) is Fraction
        return ("quantity", (result.value.numerator, result.value.denominator, result.format))
    return ("value", result)


def _with_reference_parse(compute: Callable[[], object]) -> Outcome:
    """The outcome with the cache and the fast path replaced by the general parse alone."""
    with mock.patch.object(quantity, "_parse_source", quantity._parse_any_form):
        return _outcome(compute)


def _assert_same_as_reference(compute: Callable[[], object]) -> None:
    reference = _with_reference_parse(compute)
    assert _outcome(compute) == reference
    assert _outcome(compute) == reference  # again, now answered from the cache


@settings(max_examples=400)
@given(any_text)
def test_fast_form_agrees_with_general_parse(text: str) -> None:
    outcome = _outcome(lambda: quantity._parse_common_form(text))
    if outcome == ("value", None):
        return
    assert outcome[0] != "QuantityError" or outcome == _outcome(lambda: quantity._parse_any_form(text))
    if outcome[0] == "QuantityError":
        return
    fast = quantity._parse_common_form(text)
    assert fast is not None
    general = quantity._parse_any_form(text)
    assert fast == general
    assert (fast.quantity.value.numerator, fast.quantity.value.denominator) == (
        general.quantity.value.numerator,
        general.quantity.value.denominator,
    )
    assert fast.whole_units == quantity.int_value(general.quantity)
    assert fast.millis == quantity.milli_value(general.quantity)


@settings(max_examples=300)
@given(raw_quantity)
def test_parse_quantity_and_canonicalize_unchanged(raw: RawQuantity) -> None:
    _assert_same_as_reference(lambda: quantity.parse_quantity(raw))
    _assert_same_as_reference(lambda: quantity.canonicalize(raw))


@settings(max_examples=300)
@given(raw_quantity, st.sampled_from(RESOURCE_NAMES))
def test_amount_unchanged(raw: RawQuantity, resource_name: str) -> None:
    _assert_same_as_reference(lambda: quantity.amount(resource_name, raw))


@given(st.dictionaries(st.sampled_from(RESOURCE_NAMES), raw_quantity, max_size=4))
def test_resource_list_unchanged(raw_list: Mapping[str, RawQuantity]) -> None:
    _assert_same_as_reference(lambda: quantity.resource_list(raw_list))


@pytest.mark.parametrize("text", ["2", "100", "500m", "1500m", "4Gi", "512Mi", "5712464Ki", "1G", "128M", "2k", "0.5"])
def test_common_forms_take_the_fast_path(text: str) -> None:
    assert quantity._parse_common_form(text) is not None


@pytest.mark.parametrize("text", ["-1", "+1", "1e3", "1E3", ".5", "5.", " 1", "1\n", "1K", "Gi", "", "١"])
def test_other_forms_take_the_general_path(text: str) -> None:
    assert quantity._parse_common_form(text) is None


def test_cache_is_bounded_and_does_not_keep_errors() -> None:
    assert quantity._parse_source.cache_info().maxsize == quantity._PARSE_CACHE_SIZE
    before = quantity._parse_source.cache_info()
    for _ in range(2):
        with pytest.raises(quantity.QuantityError, match="cannot parse quantity 'not-a-quantity'"):
            quantity.parse_quantity("not-a-quantity")
    after = quantity._parse_source.cache_info()
    assert after.hits == before.hits  # the failure was parsed afresh each time, never answered from the cache


def test_int64_bound_and_sub_unit_switch_on_the_fast_path() -> None:
    assert quantity.amount("memory", "8191Pi") == 8191 * 2**50
    with pytest.raises(quantity.QuantityError, match="'8Ei' is out of range"):
        quantity.amount("memory", "8Ei")  # 2^63: Go would cap it at 2^63-1, a different amount than written
    tiny = quantity.parse_quantity("0.000000000001Ki")
    assert tiny == quantity.Quantity(Fraction(2, 10**9), quantity.DECIMAL_SI)
    assert quantity.parse_quantity("0Ki") == quantity.Quantity(Fraction(0), quantity.BINARY_SI)
