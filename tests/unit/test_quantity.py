"""dracommon.quantity against apimachinery's own test tables (pkg/api/resource/quantity_test.go,
v0.37.2) and behaviour checked with the Go implementation (the rows marked "observed")."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from dracommon.quantity import (
    FORMAT_ERROR,
    INT64_MAX,
    INTEGER_ERROR,
    NUMERIC_ERROR,
    SUFFIX_ERROR,
    Format,
    Quantity,
    QuantityError,
    is_quantity,
)

BIN, DEC, EXP = Format.BINARY_SI, Format.DECIMAL_SI, Format.DECIMAL_EXPONENT


def big(unscaled: int, scale: int, fmt: Format) -> Quantity:
    """Upstream's decQuantity(unscaled, scale, format) test helper: an inf.Dec quantity."""
    return Quantity(unscaled, scale, fmt, big=True)


# TestQuantityParse: input -> (value, format).
PARSE = [
    ("0", Fraction(0), DEC),
    ("0n", Fraction(0), DEC),
    ("0Ki", Fraction(0), BIN),
    ("0T", Fraction(0), DEC),
    ("1", Fraction(1), DEC),
    ("1Ki", Fraction(1024), BIN),
    ("8Ki", Fraction(8 * 1024), BIN),
    ("7Mi", Fraction(7 * 1024**2), BIN),
    ("6Gi", Fraction(6 * 1024**3), BIN),
    ("5Ti", Fraction(5 * 1024**4), BIN),
    ("4Pi", Fraction(4 * 1024**5), BIN),
    ("3Ei", Fraction(3 * 1024**6), BIN),
    ("100Ti", Fraction(100 * 1024**4), BIN),
    ("5n", Fraction(5, 10**9), DEC),
    ("4u", Fraction(4, 10**6), DEC),
    ("3m", Fraction(3, 1000), DEC),
    ("50k", Fraction(50_000), DEC),
    ("300T", Fraction(300 * 10**12), DEC),
    ("1E", Fraction(10**18), DEC),
    ("1E-3", Fraction(1, 1000), EXP),
    ("1e3", Fraction(1000), EXP),
    ("1E18", Fraction(10**18), EXP),
    ("100.035k", Fraction(100_035), DEC),
    ("0.0005k", Fraction(1, 2), DEC),
    ("0.50000", Fraction(1, 2), DEC),
    ("0.5e-2", Fraction(5, 1000), EXP),
    ("1.3E+6", Fraction(1_300_000), EXP),
    ("1.7E18", Fraction(17 * 10**17), EXP),
    ("7.123456M", Fraction(7_123_456), DEC),
    ("1.01E", Fraction(101 * 10**16), DEC),
    # Finer than a nano rounds up, never down to zero.
    ("3.001n", Fraction(4, 10**9), DEC),
    ("1.1E-9", Fraction(2, 10**9), EXP),
    ("0.0000000001", Fraction(1, 10**9), DEC),
    ("0.00000012345", Fraction(124, 10**9), DEC),
    # Binary SI is capped at 2^63-1.
    ("9Ei", Fraction(INT64_MAX), BIN),
    ("9223372036854775807Ki", Fraction(INT64_MAX), BIN),
    ("12E", Fraction(12 * 10**18), DEC),
    ("100.035Ki", Fraction(10243584, 100), BIN),
    ("0.5Mi", Fraction(1024**2 // 2), BIN),
    ("0.025Ti", Fraction(274877906944, 10), BIN),
    ("0.000000000001Ki", Fraction(2, 10**9), DEC),  # rounds up, and below 1 leaves binary SI
    (".001", Fraction(1, 1000), DEC),
    ("1.", Fraction(1), DEC),
    ("1.G", Fraction(10**9), DEC),
    # Observed: decimal and exponent forms are not capped; a bare sign or point is zero.
    ("1e100", Fraction(10**100), EXP),
    ("100E", Fraction(100 * 10**18), DEC),
    (".", Fraction(0), DEC),
    ("-", Fraction(0), DEC),
]


@pytest.mark.parametrize(("text", "value", "fmt"), PARSE)
def test_parse_value_and_format(text: str, value: Fraction, fmt: Format) -> None:
    for sign, prefix in ((1, ""), (1, "+"), (-1, "-")):
        if prefix and text == "-":
            continue  # a second sign is not a quantity
        quantity = Quantity.parse(prefix + text)
        assert quantity.as_fraction() == sign * value, prefix + text
        assert quantity.format is fmt, prefix + text


# Upstream's invalid inputs, with the error each gets (observed from ParseQuantity).
INVALID = [
    ("", FORMAT_ERROR),
    ("1.1.M", FORMAT_ERROR),
    ("1+1.0M", FORMAT_ERROR),
    ("0.1mi", SUFFIX_ERROR),
    ("0.1am", FORMAT_ERROR),
    ("aoeu", FORMAT_ERROR),
    ("Non-Numeric", FORMAT_ERROR),
    (".5i", SUFFIX_ERROR),
    ("1i", SUFFIX_ERROR),
    ("-3.01i", SUFFIX_ERROR),
    ("-3.01e-", SUFFIX_ERROR),
    (" 1", FORMAT_ERROR),
    ("1 ", FORMAT_ERROR),
    ("10Mo", FORMAT_ERROR),  # apiserver's CEL tests: fails the "regular expression"
    ("10Mm", SUFFIX_ERROR),  # ... and passes it, failing the suffix
    ("10Zi", FORMAT_ERROR),
    ("1kk", SUFFIX_ERROR),
    ("1Gi5", SUFFIX_ERROR),
    ("1e", SUFFIX_ERROR),
    ("1e9223372036854775808", SUFFIX_ERROR),  # the exponent must fit int64
    ("\uff11", FORMAT_ERROR),  # only ASCII digits (a fullwidth one is not)
    (".Ei", NUMERIC_ERROR),  # the big-form path needs at least one digit
]


@pytest.mark.parametrize(("text", "message"), INVALID)
def test_invalid_quantities(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as raised:
        Quantity.parse(text)
    assert str(raised.value) == message
    assert not is_quantity(text)


def test_format_error_quotes_upstreams_expression() -> None:
    assert FORMAT_ERROR == (
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )


# TestQuantityParseEmit, TestQuantityString's alternates, and observed canonical strings.
CANONICAL = [
    ("0", "0"),
    ("1Ki", "1Ki"),
    ("1024Mi", "1Gi"),
    ("307200Ki", "300Mi"),
    ("1025024Mi", "1001Gi"),
    ("1024Gi", "1Ti"),
    ("5000m", "5"),
    ("0.5", "500m"),
    ("1000M", "1G"),
    ("0.001T", "1G"),
    ("1000u", "1m"),
    ("1.08", "1080m"),
    ("1080000000n", "1080m"),
    (".001e12", "1e9"),
    ("0.001e0", "1e-3"),
    ("1000e-12", "1e-9"),
    ("00", "0"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    (".000000000001Ki", "2n"),
    ("1.5Gi", "1536Mi"),
    ("0.1", "100m"),
    ("1000", "1k"),
    ("1.5", "1500m"),
    ("-1.5Gi", "-1536Mi"),
    ("0.5Ki", "512"),  # binary below 1024 is written in decimal SI
    ("1.5Ki", "1536"),
    ("8Ei", "9223372036854775807"),
    ("1e100", "10e99"),  # exponents are multiples of three
    ("0.1n", "1n"),
    ("-0.1n", "-1n"),
    ("1e-10", "1e-9"),
    # Upstream reuses the parsed text when its quick test says it is canonical.
    ("1e3", "1e3"),
    ("100m", "100m"),
    ("+1", "+1"),
    ("01Ki", "01Ki"),
    ("1.500", "1.500"),
    # ... and drops an exponent that has no decimal-SI suffix.
    ("1000E", "1"),
]


@pytest.mark.parametrize(("text", "expected"), CANONICAL)
def test_canonical_string(text: str, expected: str) -> None:
    assert str(Quantity.parse(text)) == expected


# TestQuantityString: internal value -> String().
STRING = [
    (big(1024**3, 0, BIN), "1Gi"),
    (big(6 * 1024, 0, BIN), "6Ki"),
    (big(5, 0, BIN), "5"),
    (big(500, -3, BIN), "500m"),
    (big(1000, 6, DEC), "1G"),
    (big(1_000_000_000, 0, DEC), "1G"),
    (big(108, -2, DEC), "1080m"),
    (big(10800, -4, DEC), "1080m"),
    (big(1234567, -3, BIN), "1234567m"),
    (big(1025, 0, BIN), "1025"),
    (big(0, 0, BIN), "0"),
    (big(300, 6, EXP), "300e6"),
    (big(80, -3, EXP), "80e-3"),
    (big(10800, -10, DEC), "1080n"),
    (big(1080, -6, DEC), "1080u"),
]


@pytest.mark.parametrize(("quantity", "expected"), STRING)
def test_string_of_internal_values(quantity: Quantity, expected: str) -> None:
    assert str(quantity) == expected
    if not quantity.is_zero():
        negated = Quantity(-quantity.unscaled, quantity.scale, quantity.format, big=True)
        assert str(negated) == "-" + expected


# TestQuantityCmp, the apiserver CEL library's comparisons, and cross-format ones.
CMP = [
    ("0", "0", 0),
    ("100m", "50m", 1),
    ("50m", "100m", -1),
    ("10000T", "100Gi", 1),
    ("200M", "0.2G", 0),
    ("50M", "50Mi", -1),
    ("50Mi", "50M", 1),
    ("1Gi", "1024Mi", 0),
    ("1e3", "1k", 0),
    ("-1", "1n", -1),
    ("1e100", "9Ei", 1),
    ("-1e100", "-9Ei", -1),
    ("1.5Gi", "1536Mi", 0),
]


@pytest.mark.parametrize(("left", "right", "expected"), CMP)
def test_compare(left: str, right: str, expected: int) -> None:
    a, b = Quantity.parse(left), Quantity.parse(right)
    assert a.compare(b) == expected
    assert b.compare(a) == -expected
    assert (a == b) is (expected == 0)
    assert (a < b) is (expected < 0)
    if expected == 0:
        assert hash(a) == hash(b)


def test_compare_with_huge_exponents_does_not_expand_them() -> None:
    assert Quantity.parse("1e999999999").compare(Quantity.parse("1")) == 1
    assert Quantity.parse("1e-999999999").compare(Quantity.parse("1n")) == 0  # rounded up to 1n


# The apiserver CEL library's tests (pkg/cel/library/quantity_test.go) plus forms they imply.
def test_integer_conversion_follows_the_int64_form() -> None:
    assert Quantity.parse("50k").as_integer() == 50_000
    assert Quantity.parse("50").is_integer()
    assert not Quantity.parse("9999999999999999999999999999999999999G").is_integer()
    assert Quantity.parse("1Ti").as_integer() == 1024**4
    # Observed: the big form never converts, even for whole numbers.
    for text in ("1Pi", "8Ei", "1.5Gi", "1000000000000000000000"):
        assert not Quantity.parse(text).is_integer(), text
    # Nor does an int64-form value with a negative scale.
    assert not Quantity.parse("1000m").is_integer()
    with pytest.raises(QuantityError, match=INTEGER_ERROR):
        Quantity.parse("1.5").as_integer()


def test_arithmetic_chains_from_the_cel_library_tests() -> None:
    fifty_k = Quantity.parse("50k")
    assert fifty_k.add(Quantity.parse("20")) == Quantity.parse("50.02k")
    assert fifty_k.sub(20) == Quantity.parse("49980")
    assert fifty_k.add(20).sub(Quantity.parse("100k")).as_integer() == -49980
    assert fifty_k.add(20).sub(Quantity.parse("100k")).sub(-50000).as_integer() == 20
    huge = Quantity.parse("9999999999999999999999999999999999999")
    assert huge.add(Quantity.parse("1")).compare(huge.add(Quantity.parse("2"))) == -1
    assert huge.add(1).as_fraction() == 10**37  # exact, no cap


def test_add_and_sub_keep_the_suffix_of_the_non_zero_side() -> None:
    # TestQuantityAddZeroPreservesSuffix / TestQuantitySubZeroPreservesSuffix.
    zero = Quantity.parse("0")
    for text in ("100m", "1Gi"):
        value = Quantity.parse(text)
        assert str(value.add(zero)) == text
        assert str(zero.add(value)) == text
        assert str(value.sub(zero)) == text
        assert str(zero.sub(value)) == "-" + text


def test_overflowing_int64_arithmetic_moves_to_the_exact_big_form() -> None:
    total = Quantity.parse("8Ei").add(Quantity.parse("8Ei"))
    assert total.as_fraction() == 2 * INT64_MAX
    assert str(total) == "18446744073709551614"
    assert not total.is_integer()
    four = Quantity.parse("4Ei")
    assert str(four + four) == "8Ei"  # 2^63: past int64, exact, still binary SI
    assert str(Quantity.parse("1Gi") - Quantity.parse("512Mi")) == "512Mi"
    assert str(Quantity.parse("1Gi").add(1)) == "1073741825"


APPROXIMATE_FLOAT = [
    # TestQuantityAsApproximateFloat64 (Go's float arithmetic, bit for bit).
    (big(0, 0, BIN), 0.0),
    (big(7 * 1024 * 1024, 4, DEC), float(7 * 1024 * 1024 * 10000)),
    (big(7 * 1024 * 1024, -1, DEC), (7 * 1024 * 1024) * 1e-1),
    (big(7 * 1024 * 1024, -8, EXP), (7 * 1024 * 1024) / 1e8),
    (big(INT64_MAX, 0, BIN), float(INT64_MAX)),
    (big(12, 18, DEC), 1.2e19),
    (big(12, 500, DEC), math.inf),
    (big(-12, 500, DEC), -math.inf),
    (Quantity.parse("50.703k"), 50703.0),
    (Quantity.parse("1.5"), 1.5),
]


@pytest.mark.parametrize(("quantity", "expected"), APPROXIMATE_FLOAT)
def test_approximate_float(quantity: Quantity, expected: float) -> None:
    assert quantity.as_approximate_float() == expected


# TestScaledValue-style: Value() / MilliValue() round up, away from zero.
VALUES = [
    ("1.5", 2, 1500),
    ("-1.5", -2, -1500),
    ("1m", 1, 1),
    ("1n", 1, 1),
    ("1Gi", 1024**3, 1024**4 * 1000 // 1024),
    ("1.5Gi", 1610612736, 1610612736000),
]


@pytest.mark.parametrize(("text", "value", "milli"), VALUES)
def test_value_and_milli_value(text: str, value: int, milli: int) -> None:
    quantity = Quantity.parse(text)
    assert quantity.value() == value
    assert quantity.milli_value() == milli


def test_quantities_from_api_json() -> None:
    assert Quantity.from_json(" 40Gi ") == Quantity.parse("40Gi")  # UnmarshalJSON trims spaces
    assert Quantity.from_json(1024) == Quantity.parse("1Ki")
    for bad in (True, None, 1.5, ["1"]):
        with pytest.raises(QuantityError, match="must be a string"):
            Quantity.from_json(bad)


def test_from_int_is_new_quantity() -> None:
    assert str(Quantity.from_int(9 * 1024**3, BIN)) == "9Gi"
    assert str(Quantity.from_int(1000, EXP)) == "1e3"
    with pytest.raises(QuantityError):
        Quantity.from_int(2**63)


def test_engine_identity_is_by_value() -> None:
    """cel-cpp compares quantity messages by their text: equal values need equal text."""
    assert Quantity.parse("1Gi").canonical() == Quantity.parse("1024Mi").canonical()
    assert Quantity.parse("500m").canonical() == Quantity.parse("0.5").canonical()
    assert Quantity.parse("1G").canonical() != Quantity.parse("1Gi").canonical()
    for text in ("1.5Gi", "-3m", "7", "1n", "8Ei", "1e100", "0"):
        quantity = Quantity.parse(text)
        assert Quantity.from_canonical(quantity.canonical()) == quantity
    # Re-read as upstream would read the value's digits: 2^63-1 needs the big form.
    assert not Quantity.from_canonical(Quantity.parse("8Ei").canonical()).is_integer()
    assert Quantity.from_canonical(Quantity.parse("80Gi").canonical()).as_integer() == 80 * 1024**3


def test_hostile_sizes_are_refused_not_computed() -> None:
    with pytest.raises(QuantityError, match="too large"):
        Quantity.parse("1e999999999").add(Quantity.parse("1"))
    assert str(Quantity.parse("1e999999999")) == "1e999999999"  # cheap: stays symbolic
