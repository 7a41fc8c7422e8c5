"""Kubernetes resource quantities ("40Gi", "500m", "1e3") as exact fractions.

Capacity accounting for consumable capacity and shared counters needs exact
arithmetic: floats would make "is there room left" flip on rounding noise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL.items()}
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


@dataclass(frozen=True, order=False)
class Quantity:
    """An exact value plus whether it was written with binary (Ki, Mi...) suffixes.

    The format only matters when the value is written back (consumedCapacity),
    where Kubernetes keeps the format of the quantity it computed from.
    """

    value: Fraction
    binary: bool = False

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, self.binary)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, self.binary)

    def ceil_int(self) -> int:
        """The value rounded up to an integer, like Quantity.Value() in Go."""
        return -((-self.value.numerator) // self.value.denominator)

    def __str__(self) -> str:
        return format_quantity(self)


def parse_quantity(text: object) -> Quantity:
    """Parse a quantity as the API server serializes it (string, or a bare number)."""
    if isinstance(text, bool):
        raise QuantityError(f"quantity must be a string, got {text!r}")
    if isinstance(text, int):
        return Quantity(Fraction(text))
    if not isinstance(text, str):
        raise QuantityError(f"quantity must be a string, got {text!r}")
    match = _QUANTITY_RE.match(text.strip())
    if not match:
        raise QuantityError(
            f"quantities must match the regular expression '{_QUANTITY_RE.pattern}': {text!r}"
        )
    number = Fraction(match.group("number"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        return Quantity(number * (1024 ** _BINARY[suffix]), binary=True)
    if suffix[:1] in ("e", "E"):
        return Quantity(number * Fraction(10) ** int(suffix[1:]))
    return Quantity(number * Fraction(10) ** _DECIMAL[suffix])


def format_quantity(quantity: Quantity) -> str:
    """Canonical text of a quantity: the largest suffix that keeps the number whole."""
    value = quantity.value
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value == 0:
        return "0"
    if quantity.binary and value.denominator == 1:
        integer = value.numerator
        power = 0
        while power < 6 and integer % 1024 == 0:
            integer //= 1024
            power += 1
        suffix = {v: k for k, v in _BINARY.items()}.get(power, "")
        return f"{sign}{integer}{suffix}"
    # Decimal: round up to nano units (as Kubernetes does), then pick the largest
    # multiple-of-three exponent that keeps the mantissa an integer.
    nanos = -((-value.numerator * 10**9) // value.denominator)
    exponent = -9
    while exponent < 18 and nanos % 1000 == 0:
        nanos //= 1000
        exponent += 3
    return f"{sign}{nanos}{_DECIMAL_SUFFIX_BY_EXPONENT[exponent]}"
