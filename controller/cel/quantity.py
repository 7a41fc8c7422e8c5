"""Kubernetes `resource.Quantity` semantics: parsing, exact arithmetic, comparison.

Values are kept as exact fractions. Parsing follows apimachinery's `ParseQuantity`:
decimal numbers with an optional binary-SI (Ki..Ei), decimal-SI (n, u, m, k, M, G, T, P, E)
or exponent (e3, E-2) suffix; non-zero values are rounded *up* (away from zero) to the
nearest nano so that asking for "some" never becomes "none"; magnitudes above int64 max
are capped. Arithmetic after parsing is exact and uncapped, as upstream's inf.Dec path is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# The message upstream returns for anything that does not look like a quantity.
FORMAT_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
SUFFIX_ERROR = "unable to parse quantity's suffix"

_NUMBER = re.compile(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)$", re.ASCII)
_EXPONENT = re.compile(r"^[eE]([+-]?[0-9]+)$", re.ASCII)
# An exponent this large cannot be a real resource amount; refusing it keeps a hostile
# literal like "1e999999999" from allocating a gigantic integer.
_MAX_EXPONENT = 1000

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NANO = Fraction(1, 10**9)


class QuantityError(ValueError):
    """A string is not a valid Kubernetes quantity."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact Kubernetes quantity. Equality and ordering are by value (1Gi == 1024Mi)."""

    value: Fraction

    @staticmethod
    def parse(text: str) -> Quantity:
        return _parse_cached(text)

    @staticmethod
    def from_int(number: int) -> Quantity:
        return Quantity(Fraction(number))

    # Canonical text: unique per value, used as the identity of a quantity inside engines.
    def canonical(self) -> str:
        return f"{self.value.numerator}/{self.value.denominator}"

    @staticmethod
    def from_canonical(text: str) -> Quantity:
        return _from_canonical_cached(text)

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """True when the value is a whole number that fits int64 (upstream `AsInt64` succeeds)."""
        return self.value.denominator == 1 and INT64_MIN <= self.value.numerator <= INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError("cannot convert value to integer")
        return self.value.numerator

    def as_approximate_float(self) -> float:
        try:
            return float(self.value)
        except OverflowError:
            return math.copysign(math.inf, self.value)

    def add(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value + delta)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value - delta)

    def __str__(self) -> str:
        return format_decimal(self.value)


def format_decimal(value: Fraction) -> str:
    """Plain decimal text of a value whose denominator only has factors 2 and 5."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    digits = 0
    while (magnitude * 10**digits).denominator != 1 and digits < 40:
        digits += 1
    scaled = magnitude * 10**digits
    whole = scaled.numerator // scaled.denominator
    text = str(whole).rjust(digits + 1, "0")
    return f"{sign}{text[:-digits]}.{text[-digits:]}"


def is_quantity(text: str) -> bool:
    try:
        _parse_cached(text)
    except QuantityError:
        return False
    return True


@lru_cache(maxsize=4096)
def _from_canonical_cached(text: str) -> Quantity:
    numerator, _, denominator = text.partition("/")
    return Quantity(Fraction(int(numerator), int(denominator or "1")))


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    return Quantity(_parse(text))


def _parse(text: str) -> Fraction:
    if not text:
        raise QuantityError(FORMAT_ERROR)
    match = _NUMBER.match(text)
    if match is None:
        raise QuantityError(FORMAT_ERROR)
    sign, whole, fraction, suffix = match.group(1), match.group(2), match.group(3), match.group(4)
    if not whole and not fraction:
        raise QuantityError(FORMAT_ERROR)
    number = Fraction(int(whole or "0"))
    if fraction:
        number += Fraction(int(fraction), 10 ** len(fraction))
    number *= _suffix_multiplier(suffix)
    if number != 0:
        # Round the magnitude up to a whole number of nanos (inf.RoundUp on the absolute value).
        number = Fraction(math.ceil(number / _NANO)) * _NANO
    number = min(number, Fraction(INT64_MAX))
    return -number if sign == "-" else number


def _suffix_multiplier(suffix: str) -> Fraction:
    if suffix in _BINARY:
        return Fraction(2 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return Fraction(10) ** _DECIMAL[suffix]
    exponent = _EXPONENT.match(suffix)
    if exponent is not None:
        power = int(exponent.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(SUFFIX_ERROR)
        return Fraction(10) ** power
    if re.fullmatch(r"[eEinumkKMGTP]*[-+]?[0-9]*", suffix):
        raise QuantityError(SUFFIX_ERROR)
    raise QuantityError(FORMAT_ERROR)
