"""Kubernetes quantities: parsing, canonical String() form, Value()/MilliValue() and our integer amounts.

Expected values follow apimachinery's resource package; the parse and canonical-form tables restate the cases
of its quantity_test.go as data.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.quantity import (
    BINARY_SI,
    DECIMAL_EXPONENT,
    DECIMAL_SI,
    Quantity,
    QuantityError,
    QuantityFormat,
    amount,
    canonicalize,
    format_amount,
    format_integer,
    format_quantity,
    format_resource_list,
    int_value,
    milli_value,
    parse_quantity,
    resource_list,
)

FORMATS: list[QuantityFormat] = [DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT]
INT64_MAX = 2**63 - 1
KI, MI, GI, TI, PI, EI = (1024**p for p in range(1, 7))

# (input, canonical String(), MilliValue(), Value())
CASES = [
    ("500m", "500m", 500, 1),
    ("4Gi", "4Gi", 4 * GI * 1000, 4 * GI),
    ("5712464Ki", "5712464Ki", 5849563136000, 5849563136),
    ("1.5", "1500m", 1500, 2),
    ("2e3", "2e3", 2_000_000, 2000),
    ("100", "100", 100_000, 100),
    ("0.5Gi", "512Mi", 512 * MI * 1000, 512 * MI),
    ("1E", "1E", 10**21, 10**18),
    ("12n", "12n", 1, 1),
    ("3u", "3u", 1, 1),
    ("2000", "2k", 2_000_000, 2000),
    ("0", "0", 0, 0),
    ("0Gi", "0", 0, 0),
    ("-0", "0", 0, 0),
    ("-1.5", "-1500m", -1500, -2),
    ("0.1m", "100u", 1, 1),
    ("1.1e-9", "2e-9", 1, 1),
    ("1e0", "1", 1000, 1),
    ("1e1", "10", 10_000, 10),
    ("1e4", "10e3", 10_000_000, 10_000),
    ("1.5e-3", "1500e-6", 2, 1),
    ("9E", "9E", 9 * 10**21, 9 * 10**18),
    ("7Ei", "7Ei", 7 * 2**60 * 1000, 7 * 2**60),
    ("100.035Ki", "102435840m", 102435840, 102436),
    ("1023Ki", "1023Ki", 1023 * KI * 1000, 1023 * KI),
    ("-1Ki", "-1Ki", -KI * 1000, -KI),
    ("1.G", "1G", 10**12, 10**9),
    (".5", "500m", 500, 1),
    ("1.", "1", 1000, 1),
    # Non-canonical spellings come back canonical (Go's String() would echo "+1", "01Ki", "1E3" verbatim).
    ("+1", "1", 1000, 1),
    ("01Ki", "1Ki", KI * 1000, KI),
    ("1E3", "1e3", 1_000_000, 1000),
    ("1E+6", "1e6", 10**9, 10**6),
    (4000, "4k", 4_000_000, 4000),
    (7937, "7937", 7_937_000, 7937),
    (1.5, "1500m", 1500, 2),
    (1e18, "1e18", 10**21, 10**18),
    (0.0, "0", 0, 0),
]


@pytest.mark.parametrize(("text", "canonical", "milli", "value"), CASES)
def test_parse_format_and_round(text: str | int | float, canonical: str, milli: int, value: int) -> None:
    q = parse_quantity(text)
    assert format_quantity(q) == canonical
    assert canonicalize(text) == canonical
    assert milli_value(q) == milli
    assert int_value(q) == value
    # the canonical form is a fixed point
    assert canonicalize(canonical) == canonical
    assert parse_quantity(canonical).value == q.value


def _dec(mantissa: int, exponent: int) -> Fraction:
    return Fraction(mantissa) * Fraction(10) ** exponent


# apimachinery TestQuantityParse: (input, exact value, format after parsing)
GO_PARSE_TABLE: list[tuple[str, Fraction, QuantityFormat]] = [
    ("0", _dec(0, 0), DECIMAL_SI),
    ("0n", _dec(0, 0), DECIMAL_SI),
    ("0u", _dec(0, 0), DECIMAL_SI),
    ("0m", _dec(0, 0), DECIMAL_SI),
    ("0Ki", _dec(0, 0), BINARY_SI),
    ("0k", _dec(0, 0), DECIMAL_SI),
    ("0Mi", _dec(0, 0), BINARY_SI),
    ("0M", _dec(0, 0), DECIMAL_SI),
    ("0Gi", _dec(0, 0), BINARY_SI),
    ("0G", _dec(0, 0), DECIMAL_SI),
    ("0Ti", _dec(0, 0), BINARY_SI),
    ("0T", _dec(0, 0), DECIMAL_SI),
    ("1", _dec(1, 0), DECIMAL_SI),
    ("1Ki", Fraction(KI), BINARY_SI),
    ("8Ki", Fraction(8 * KI), BINARY_SI),
    ("7Mi", Fraction(7 * MI), BINARY_SI),
    ("6Gi", Fraction(6 * GI), BINARY_SI),
    ("5Ti", Fraction(5 * TI), BINARY_SI),
    ("4Pi", Fraction(4 * PI), BINARY_SI),
    ("3Ei", Fraction(3 * EI), BINARY_SI),
    ("10Ti", Fraction(10 * TI), BINARY_SI),
    ("100Ti", Fraction(100 * TI), BINARY_SI),
    ("5n", _dec(5, -9), DECIMAL_SI),
    ("4u", _dec(4, -6), DECIMAL_SI),
    ("3m", _dec(3, -3), DECIMAL_SI),
    ("9", _dec(9, 0), DECIMAL_SI),
    ("8k", _dec(8, 3), DECIMAL_SI),
    ("50k", _dec(5, 4), DECIMAL_SI),
    ("7M", _dec(7, 6), DECIMAL_SI),
    ("6G", _dec(6, 9), DECIMAL_SI),
    ("5T", _dec(5, 12), DECIMAL_SI),
    ("40T", _dec(4, 13), DECIMAL_SI),
    ("300T", _dec(3, 14), DECIMAL_SI),
    ("2P", _dec(2, 15), DECIMAL_SI),
    ("1E", _dec(1, 18), DECIMAL_SI),
    ("1E-3", _dec(1, -3), DECIMAL_EXPONENT),
    ("1e3", _dec(1, 3), DECIMAL_EXPONENT),
    ("1E6", _dec(1, 6), DECIMAL_EXPONENT),
    ("1e9", _dec(1, 9), DECIMAL_EXPONENT),
    ("1E12", _dec(1, 12), DECIMAL_EXPONENT),
    ("1e15", _dec(1, 15), DECIMAL_EXPONENT),
    ("1E18", _dec(1, 18), DECIMAL_EXPONENT),
    ("1e14", _dec(1, 14), DECIMAL_EXPONENT),
    ("1e13", _dec(1, 13), DECIMAL_EXPONENT),
    ("100.035k", _dec(100035, 0), DECIMAL_SI),
    ("0.001", _dec(1, -3), DECIMAL_SI),
    ("0.0005k", _dec(5, -1), DECIMAL_SI),
    ("0.005", _dec(5, -3), DECIMAL_SI),
    ("0.05", _dec(5, -2), DECIMAL_SI),
    ("0.5", _dec(5, -1), DECIMAL_SI),
    ("0.00050k", _dec(5, -1), DECIMAL_SI),
    ("0.00500", _dec(5, -3), DECIMAL_SI),
    ("0.05000", _dec(5, -2), DECIMAL_SI),
    ("0.50000", _dec(5, -1), DECIMAL_SI),
    ("0.5e0", _dec(5, -1), DECIMAL_EXPONENT),
    ("0.5e-1", _dec(5, -2), DECIMAL_EXPONENT),
    ("0.5e-2", _dec(5, -3), DECIMAL_EXPONENT),
    ("10.035M", _dec(10035, 3), DECIMAL_SI),
    ("1.2e3", _dec(12, 2), DECIMAL_EXPONENT),
    ("1.3E+6", _dec(13, 5), DECIMAL_EXPONENT),
    ("1.40e9", _dec(14, 8), DECIMAL_EXPONENT),
    ("1.53E12", _dec(153, 10), DECIMAL_EXPONENT),
    ("1.6e15", _dec(16, 14), DECIMAL_EXPONENT),
    ("1.7E18", _dec(17, 17), DECIMAL_EXPONENT),
    ("9.01", _dec(901, -2), DECIMAL_SI),
    ("8.1k", _dec(81, 2), DECIMAL_SI),
    ("7.123456M", _dec(7123456, 0), DECIMAL_SI),
    ("6.987654321G", _dec(6987654321, 0), DECIMAL_SI),
    ("5.444T", _dec(5444, 9), DECIMAL_SI),
    ("40.1T", _dec(401, 11), DECIMAL_SI),
    ("300.2T", _dec(3002, 11), DECIMAL_SI),
    ("2.5P", _dec(25, 14), DECIMAL_SI),
    ("1.01E", _dec(101, 16), DECIMAL_SI),
    # finer than nano rounds up
    ("3.001n", _dec(4, -9), DECIMAL_SI),
    ("1.1E-9", _dec(2, -9), DECIMAL_EXPONENT),
    ("0.0000000001", _dec(1, -9), DECIMAL_SI),
    ("0.0000000005", _dec(1, -9), DECIMAL_SI),
    ("0.00000000050", _dec(1, -9), DECIMAL_SI),
    ("0.5e-9", _dec(1, -9), DECIMAL_EXPONENT),
    ("0.9n", _dec(1, -9), DECIMAL_SI),
    ("0.00000012345", _dec(124, -9), DECIMAL_SI),
    ("0.00000012354", _dec(124, -9), DECIMAL_SI),
    ("9223372036854775807", Fraction(INT64_MAX), DECIMAL_SI),
    ("8191Pi", Fraction(8191 * 2**50), BINARY_SI),
    ("9E", _dec(9, 18), DECIMAL_SI),
    ("100.035Ki", _dec(10243584, -2), BINARY_SI),
    ("0.5Mi", Fraction(MI, 2), BINARY_SI),
    ("0.05Gi", _dec(536870912, -1), BINARY_SI),
    ("0.025Ti", _dec(274877906944, -1), BINARY_SI),
    ("0.000000000001Ki", _dec(2, -9), DECIMAL_SI),  # below one unit a binary value switches to DecimalSI
    (".001", _dec(1, -3), DECIMAL_SI),
    (".0001k", _dec(100, -3), DECIMAL_SI),
    ("1.", _dec(1, 0), DECIMAL_SI),
    ("1.G", _dec(1, 9), DECIMAL_SI),
]


@pytest.mark.parametrize(("text", "value", "fmt"), GO_PARSE_TABLE)
def test_go_parse_table_with_every_sign(text: str, value: Fraction, fmt: QuantityFormat) -> None:
    assert parse_quantity(text) == Quantity(value, fmt)
    assert parse_quantity("+" + text) == Quantity(value, fmt)
    assert parse_quantity("-" + text) == Quantity(-value, fmt)


# apimachinery TestQuantityString: (value, format, canonical, another spelling with the same canonical form)
GO_STRING_TABLE: list[tuple[Fraction, QuantityFormat, str, str]] = [
    (Fraction(GI), BINARY_SI, "1Gi", "1024Mi"),
    (Fraction(300 * MI), BINARY_SI, "300Mi", "307200Ki"),
    (Fraction(6 * KI), BINARY_SI, "6Ki", ""),
    (Fraction(1001 * GI), BINARY_SI, "1001Gi", "1025024Mi"),
    (Fraction(TI), BINARY_SI, "1Ti", "1024Gi"),
    (_dec(5, 0), BINARY_SI, "5", "5000m"),
    (_dec(500, -3), BINARY_SI, "500m", "0.5"),
    (_dec(1, 9), DECIMAL_SI, "1G", "1000M"),
    (_dec(1000, 6), DECIMAL_SI, "1G", "0.001T"),
    (_dec(1000000, 3), DECIMAL_SI, "1G", ""),
    (_dec(1000000000, 0), DECIMAL_SI, "1G", ""),
    (_dec(1, -3), DECIMAL_SI, "1m", "1000u"),
    (_dec(80, -3), DECIMAL_SI, "80m", ""),
    (_dec(1080, -3), DECIMAL_SI, "1080m", "1.08"),
    (_dec(108, -2), DECIMAL_SI, "1080m", "1080000000n"),
    (_dec(10800, -4), DECIMAL_SI, "1080m", ""),
    (_dec(300, 6), DECIMAL_SI, "300M", ""),
    (_dec(1, 12), DECIMAL_SI, "1T", ""),
    (_dec(1234567, 6), DECIMAL_SI, "1234567M", ""),
    (_dec(1234567, -3), BINARY_SI, "1234567m", ""),
    (_dec(3, 3), DECIMAL_SI, "3k", ""),
    (_dec(1025, 0), BINARY_SI, "1025", ""),
    (_dec(0, 0), DECIMAL_SI, "0", ""),
    (_dec(0, 0), BINARY_SI, "0", ""),
    (_dec(1, 9), DECIMAL_EXPONENT, "1e9", ".001e12"),
    (_dec(1, -3), DECIMAL_EXPONENT, "1e-3", "0.001e0"),
    (_dec(1, -9), DECIMAL_EXPONENT, "1e-9", "1000e-12"),
    (_dec(80, -3), DECIMAL_EXPONENT, "80e-3", ""),
    (_dec(300, 6), DECIMAL_EXPONENT, "300e6", ""),
    (_dec(1, 12), DECIMAL_EXPONENT, "1e12", ""),
    (_dec(1, 3), DECIMAL_EXPONENT, "1e3", ""),
    (_dec(3, 3), DECIMAL_EXPONENT, "3e3", ""),
    (_dec(0, 0), DECIMAL_EXPONENT, "0", "00"),
    (_dec(1, -9), DECIMAL_SI, "1n", ""),
    (_dec(80, -9), DECIMAL_SI, "80n", ""),
    (_dec(1080, -9), DECIMAL_SI, "1080n", ""),
    (_dec(108, -8), DECIMAL_SI, "1080n", ""),
    (_dec(10800, -10), DECIMAL_SI, "1080n", ""),
    (_dec(1, -6), DECIMAL_SI, "1u", ""),
    (_dec(80, -6), DECIMAL_SI, "80u", ""),
    (_dec(1080, -6), DECIMAL_SI, "1080u", ""),
]


@pytest.mark.parametrize(("value", "fmt", "canonical", "alternate"), GO_STRING_TABLE)
def test_go_canonical_string_table(value: Fraction, fmt: QuantityFormat, canonical: str, alternate: str) -> None:
    assert format_quantity(Quantity(value, fmt)) == canonical
    assert canonicalize(canonical) == canonical
    if alternate:
        assert canonicalize(alternate) == canonical
    if value:
        assert format_quantity(Quantity(-value, fmt)) == "-" + canonical  # never "-0"


# apimachinery TestQuantityParseEmit
@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
    ],
)
def test_go_parse_emit_table(text: str, canonical: str) -> None:
    assert canonicalize(text) == canonical
    assert canonicalize("-" + text) == "-" + canonical


def test_constructed_value_finer_than_nano_is_rounded_up_when_formatted() -> None:
    assert format_quantity(Quantity(Fraction(1, 3), DECIMAL_SI)) == "333333334n"
    assert format_quantity(Quantity(Fraction(-1, 3000), DECIMAL_EXPONENT)) == "-333334e-9"


def test_format_amount_examples() -> None:
    assert [format_amount("cpu", m) for m in (500, 2000, 1500, 0, 2_000_000)] == ["500m", "2", "1500m", "0", "2k"]
    # batch/mid-cpu amounts are already milli counts; 4000 is written "4k" as the API server would store it.
    assert format_amount("kubernetes.io/batch-cpu", 4000) == "4k"
    assert format_amount("kubernetes.io/mid-cpu", 7937) == "7937"
    memory = [format_amount("memory", b) for b in (5849563136, 4294967296, 1023, 1000, 0, 14327175770)]
    assert memory == ["5712464Ki", "4Gi", "1023", "1k", "0", "14327175770"]
    assert format_amount("kubernetes.io/batch-memory", 3456 * MI) == "3456Mi"


def test_amount_conventions() -> None:
    assert amount("cpu", "500m") == 500
    assert amount("cpu", "2") == 2000
    assert amount("cpu", 0.25) == 250
    assert amount("cpu", "1u") == 1  # MilliValue rounds up
    assert amount("kubernetes.io/batch-cpu", 4000) == 4000
    assert amount("kubernetes.io/batch-cpu", "4k") == 4000
    assert amount("kubernetes.io/mid-cpu", "1500m") == 2  # as written, rounded up like Value()
    assert amount("example.com/foo-cpu", "1") == 1000  # other *-cpu resources are millicores
    assert amount("memory", "4Gi") == 4 * GI
    assert amount("memory", "1.5") == 2
    assert amount("pods", 110) == 110


def test_resource_list_round_trip_and_error_names_the_key() -> None:
    raw: dict[str, str | int] = {"cpu": "98", "memory": "392Gi", "kubernetes.io/batch-cpu": 25000, "pods": "110"}
    parsed = resource_list(raw)
    assert parsed == {"cpu": 98000, "memory": 392 * GI, "kubernetes.io/batch-cpu": 25000, "pods": 110}
    assert format_resource_list(parsed) == {
        "cpu": "98",
        "memory": "392Gi",
        "kubernetes.io/batch-cpu": "25k",
        "pods": "110",
    }
    with pytest.raises(QuantityError, match=r"^memory: cannot parse quantity 'abc'$"):
        resource_list({"cpu": "1", "memory": "abc"})


BAD_TEXTS = [
    "",
    "1.2.3",
    "5Kb",
    "Gi",
    "1e",
    "--1",
    "-",
    ".",
    "m",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    "1\n",
    "1K",
    "1Ee3",
    "١",  # a non-ASCII digit
    "1e99999",
    "1" * 401,
]


@pytest.mark.parametrize("text", BAD_TEXTS)
def test_bad_text_is_rejected_naming_it(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert str(caught.value).startswith(f"cannot parse quantity {text!r}")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), True, False, None, [1], b"1"])
def test_bad_values_are_rejected(value: object) -> None:
    with pytest.raises(QuantityError, match=r"^cannot parse quantity .+: "):
        parse_quantity(value)  # type: ignore[arg-type]


@given(st.text(max_size=12))
def test_any_text_parses_or_raises_quantity_error(text: str) -> None:
    try:
        q = parse_quantity(text)
    except QuantityError:
        return
    assert canonicalize(format_quantity(q)) == format_quantity(q)


@given(n=st.integers(min_value=-INT64_MAX, max_value=INT64_MAX), fmt=st.sampled_from(FORMATS))
def test_integer_round_trip_in_every_format(n: int, fmt: QuantityFormat) -> None:
    text = format_quantity(Quantity(Fraction(n), fmt))
    parsed = parse_quantity(text)
    assert parsed.value == n
    if fmt == BINARY_SI and not text.endswith("i"):
        # Plain digits read back as DecimalSI, as in Kubernetes: "25000" bytes becomes "25k".
        assert format_quantity(parsed) == format_quantity(Quantity(Fraction(n), DECIMAL_SI))
    else:
        assert format_quantity(parsed) == text


def test_plain_binary_text_reads_back_as_decimal() -> None:
    text = format_amount("memory", 25000)
    assert text == "25000"
    assert parse_quantity(text) == Quantity(Fraction(25000), DECIMAL_SI)
    assert canonicalize(text) == "25k"


@given(n=st.integers(min_value=-INT64_MAX, max_value=INT64_MAX), fmt=st.sampled_from([DECIMAL_SI, DECIMAL_EXPONENT]))
def test_large_and_nano_decimal_round_trip(n: int, fmt: QuantityFormat) -> None:
    for value in (Fraction(n), Fraction(n, 10**9)):
        text = format_quantity(Quantity(value, fmt))
        parsed = parse_quantity(text)
        assert parsed.value == value
        assert format_quantity(parsed) == text


@given(st.integers(min_value=0, max_value=10**15))
def test_cpu_millicores_round_trip(m: int) -> None:
    assert amount("cpu", format_amount("cpu", m)) == m
    assert amount("kubernetes.io/batch-cpu", format_amount("kubernetes.io/batch-cpu", m)) == m


@given(st.integers(min_value=0, max_value=INT64_MAX))
def test_memory_bytes_round_trip(b: int) -> None:
    assert amount("memory", format_amount("memory", b)) == b


@given(
    name=st.sampled_from(
        ["cpu", "memory", "kubernetes.io/batch-cpu", "kubernetes.io/batch-memory", "kubernetes.io/mid-cpu", "pods"]
    ),
    value=st.integers(min_value=-(10**20), max_value=10**20) | st.integers(min_value=-3000, max_value=3000),
)
def test_format_amount_integer_path_matches_the_fraction_reference(name: str, value: int) -> None:
    if name.endswith(("batch-cpu", "mid-cpu")):
        reference = Quantity(Fraction(value), DECIMAL_SI)
    elif name == "cpu":
        reference = Quantity(Fraction(value, 1000), DECIMAL_SI)
    else:
        reference = Quantity(Fraction(value), BINARY_SI)
    assert format_amount(name, value) == format_quantity(reference)


@given(
    value=st.integers(min_value=-(10**20), max_value=10**20) | st.integers(min_value=-3000, max_value=3000),
    milli=st.booleans(),
    binary=st.booleans(),
)
def test_format_integer_matches_the_fraction_reference(value: int, milli: bool, binary: bool) -> None:
    if milli:
        reference = Quantity(Fraction(value, 1000), DECIMAL_SI)
    else:
        reference = Quantity(Fraction(value), BINARY_SI if binary else DECIMAL_SI)
    assert format_integer(value, milli=milli, binary=binary and not milli) == format_quantity(reference)


@pytest.mark.parametrize(
    "text",
    ["1e400", "9999999999999999999Ei", "8Ei", "9223372036854775808", "9223372036854775807.5", "-8Ei", "10E", 1e19],
)
def test_one_range_rule_values_beyond_int64_are_out_of_range_never_capped(text: str | float) -> None:
    with pytest.raises(QuantityError, match="is out of range: Kubernetes holds values up to 9223372036854775807"):
        parse_quantity(text)
    with pytest.raises(QuantityError, match=r"^memory: quantity .* is out of range"):
        resource_list({"memory": text})
