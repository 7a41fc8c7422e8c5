"""Kubernetes resource.Quantity semantics of controller.cel.quantity."""

from __future__ import annotations

from fractions import Fraction

import pytest

from controller.cel.quantity import (
    FORMAT_ERROR,
    INT64_MAX,
    SUFFIX_ERROR,
    Quantity,
    QuantityError,
    is_quantity,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("+5", Fraction(5)),
        ("-5", Fraction(-5)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("1.", Fraction(1)),
        ("1Ki", Fraction(1024)),
        ("1Mi", Fraction(1024**2)),
        ("80Gi", Fraction(80 * 1024**3)),
        ("1Ti", Fraction(1024**4)),
        ("1Pi", Fraction(1024**5)),
        ("1Ei", Fraction(1024**6)),
        ("1.5Gi", Fraction(3 * 1024**3, 2)),
        ("1n", Fraction(1, 10**9)),
        ("1u", Fraction(1, 10**6)),
        ("500m", Fraction(1, 2)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(10**6)),
        ("1G", Fraction(10**9)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1e-3", Fraction(1, 1000)),
        ("2.5e+2", Fraction(250)),
    ],
)
def test_parse_exact_values(text: str, value: Fraction) -> None:
    assert Quantity.parse(text).value == value


def test_sub_nano_values_round_up_not_to_zero() -> None:
    assert Quantity.parse("0.1n").value == Fraction(1, 10**9)
    assert Quantity.parse("1.0000000001").value == Fraction(1_000_000_001, 10**9)
    assert Quantity.parse("-0.1n").value == Fraction(-1, 10**9)


def test_magnitude_is_capped_at_int64_max() -> None:
    assert Quantity.parse("8Ei").value == INT64_MAX
    assert Quantity.parse("-100E").value == -INT64_MAX


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "Gi", "--1", "1 Gi", "10Zi", "1Qi", " 1"])
def test_format_errors(text: str) -> None:
    with pytest.raises(QuantityError, match="quantities must match the regular expression"):
        Quantity.parse(text)
    assert not is_quantity(text)
    assert FORMAT_ERROR.startswith("quantities must match")


@pytest.mark.parametrize("text", ["1kk", "1Ki3", "1e", "1Kii", "1e99999"])
def test_suffix_errors(text: str) -> None:
    with pytest.raises(QuantityError, match="unable to parse quantity's suffix"):
        Quantity.parse(text)
    assert SUFFIX_ERROR in "unable to parse quantity's suffix"


def test_equality_and_comparison_are_by_value() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert Quantity.parse("1k") == Quantity.parse("1000")
    assert Quantity.parse("1Gi").compare(Quantity.parse("1G")) == 1
    assert Quantity.parse("999m").compare(Quantity.parse("1")) == -1
    assert Quantity.parse("1").compare(Quantity.parse("1000m")) == 0


def test_canonical_round_trip_is_exact() -> None:
    for text in ("1.5Gi", "-3m", "7", "1n"):
        quantity = Quantity.parse(text)
        assert Quantity.from_canonical(quantity.canonical()) == quantity


def test_integer_conversions() -> None:
    assert Quantity.parse("1k").is_integer()
    assert Quantity.parse("1k").as_integer() == 1000
    assert not Quantity.parse("1.5").is_integer()
    huge = Quantity.parse("8Ei").add(Quantity.parse("8Ei"))
    assert not huge.is_integer()
    with pytest.raises(QuantityError, match="cannot convert value to integer"):
        huge.as_integer()
    with pytest.raises(QuantityError, match="cannot convert value to integer"):
        Quantity.parse("0.5").as_integer()


def test_arithmetic_is_exact_and_uncapped() -> None:
    assert Quantity.parse("1Gi").add(1).value == 1024**3 + 1
    assert Quantity.parse("1").sub(Quantity.parse("1m")).value == Fraction(999, 1000)
    assert Quantity.parse("8Ei").add(1).value == INT64_MAX + 1
    assert Quantity.parse("10").sub(11).sign() == -1
    assert Quantity.parse("0").sign() == 0


def test_approximate_float_and_text() -> None:
    assert Quantity.parse("1.5").as_approximate_float() == 1.5
    assert Quantity.parse("1Ki").as_approximate_float() == 1024.0
    assert str(Quantity.parse("1500m")) == "1.5"
    assert str(Quantity.parse("-1n")) == "-0.000000001"
