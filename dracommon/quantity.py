"""Kubernetes resource quantities ("40Gi", "500m", "1e3"), as `k8s.io/apimachinery` has them.

One implementation for the whole project: the CEL `quantity` library, the allocator's
capacity accounting and the opaque config's memory limits all use it, so a value means the
same everywhere and the same as in kube-apiserver and kube-scheduler.

Upstream is reproduced fact for fact, quirks included, because users see its results
(canonical strings in claim status, CEL verdicts):

* Parsing is apimachinery's scanner (not a regular expression, despite the error text): an
  optional sign, digits with an optional decimal point, then a suffix: binary SI (Ki..Ei),
  decimal SI (n u m "" k M G T P E) or a decimal exponent (e3, E-2).
* A parsed quantity lives in one of upstream's two forms, and the form is observable:
  "int64 form" (an int64 times a power of ten; the fast path for values of at most 18
  digits and no finer than nano) or "big form" (upstream's inf.Dec: everything else, rounded
  *up*, away from zero, to a whole number of nanos). `isInteger()` / `asInteger()` succeed
  only for the int64 form with a non-negative scale, so "1Pi", "1.5Gi" and "1000m" are not
  integers for CEL although their values are whole numbers.
* Only binary-SI quantities are capped at 2^63-1 when parsed; "1e100" stays exact.
* The canonical string keeps the parsed text when upstream does ("1e3", "100m", "+1"),
  otherwise picks the largest suffix of the quantity's format that keeps the number whole:
  "1.5Gi" -> "1536Mi", "0.1" -> "100m", "1000" -> "1k". A binary-SI value that is not a
  whole number, or is below 1024 in magnitude, is written in decimal SI.
* Arithmetic is exact; upstream's int64 fast paths (including the format rules of Add/Sub)
  are reproduced because the form they leave behind is observable as above.

Not reproduced: scales within reach of Go's int32 limit (exponents near ±2^31), where
upstream's own scale arithmetic overflows. Deliberate limit: where upstream would build an
integer with thousands of digits (a hostile "1e999999999" added to "1", or 25 significant
digits with an exponent of a billion) we raise `QuantityError` instead of spending minutes
and gigabytes; upstream never finishes there.

Size: one module because parsing, canonical form and arithmetic share one internal
representation, as upstream's package does.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache, total_ordering
from typing import Final

INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)

# Upstream's error texts, word for word: CEL surfaces them to users.
_SPLIT_RE_TEXT: Final = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_ERROR: Final = f"quantities must match the regular expression '{_SPLIT_RE_TEXT}'"
NUMERIC_ERROR: Final = "unable to parse numeric part of quantity"
SUFFIX_ERROR: Final = "unable to parse quantity's suffix"
INTEGER_ERROR: Final = "cannot convert value to integer"
TOO_LARGE_ERROR: Final = "quantity is too large to compute with exactly"

_NANO: Final = -9
# Upstream keeps at most 18 decimal digits in its int64 fast path (maxInt64Factors).
_MAX_INT64_DIGITS: Final = 18
# The most decimal places we materialize when rescaling (see the module docstring).
_MAX_RESCALE_DIGITS: Final = 4096


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or an operation upstream cannot do with it either."""


class Format(enum.StrEnum):
    """How a quantity is written back; parsing remembers the suffix family it saw."""

    DECIMAL_EXPONENT = "DecimalExponent"  # 12e6
    BINARY_SI = "BinarySI"  # 12Mi
    DECIMAL_SI = "DecimalSI"  # 12M


_DECIMAL_SUFFIXES: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXPONENT: Final = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# Binary canonical form counts factors of 1024: 1 -> Ki ... 6 -> Ei (0 and >6 have no suffix).
_BINARY_BY_POWER: Final = {exponent // 10: suffix for suffix, exponent in _BINARY_SUFFIXES.items()}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_SIGNED_DIGITS: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _int32(value: int) -> int:
    """Wrap like Go's int32 arithmetic (upstream keeps exponents and scales in int32)."""
    return (value + 2**31) % 2**32 - 2**31


def _int64(value: int) -> int:
    """Wrap like Go's int64 arithmetic."""
    return (value + 2**63) % 2**64 - 2**63


def _fits_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def _is_digit(char: str) -> bool:
    return "0" <= char <= "9"


def _pow10(exponent: int) -> int:
    if exponent > _MAX_RESCALE_DIGITS:
        raise QuantityError(TOO_LARGE_ERROR)
    return int(10**exponent)


def _strip_factors(value: int, base: int) -> tuple[int, int]:
    """`value` without trailing factors of `base`, and how many were removed (0 stays 0)."""
    times = 0
    while value != 0 and value % base == 0:
        value //= base
        times += 1
    return value, times


def _digits(value: int) -> int:
    return len(str(abs(value)))


@total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """A quantity: `unscaled * 10**scale`, plus what upstream remembers about it.

    `big` is True for upstream's inf.Dec form, `text` is the parsed string when upstream
    reuses it as the canonical form. Equality, ordering and hashing are by value
    (1Gi == 1024Mi), as `Quantity.Cmp` / `Equal` are.
    """

    unscaled: int
    scale: int
    format: Format = Format.DECIMAL_SI
    big: bool = False
    text: str = ""

    # ----- construction -------------------------------------------------------------------

    @staticmethod
    def parse(text: str) -> Quantity:
        """`resource.ParseQuantity`; raises QuantityError with upstream's message."""
        return _parse_cached(text)

    @staticmethod
    def from_int(value: int, fmt: Format = Format.DECIMAL_SI) -> Quantity:
        """`resource.NewQuantity(value, fmt)`; `value` must fit int64 as in Go."""
        if not _fits_int64(value):
            raise QuantityError(f"{value} does not fit in int64")
        return Quantity(value, 0, fmt)

    @staticmethod
    def from_json(value: object) -> Quantity:
        """A quantity as it arrives in API JSON: a string (surrounding spaces allowed, as
        upstream's UnmarshalJSON trims them) or a bare integer."""
        if isinstance(value, str):
            return _parse_cached(value.strip())
        if isinstance(value, int) and not isinstance(value, bool):
            return _parse_cached(str(value))
        raise QuantityError(f"a quantity must be a string such as '4Gi', got {type(value).__name__}")

    # ----- identity inside CEL engines ----------------------------------------------------

    def canonical(self) -> str:
        """A text unique per value, for engines that compare values by their text (cel-cpp
        compares messages field by field). Only the value survives the round trip."""
        unscaled, scale = self._normalized()
        return f"{unscaled}e{scale}"

    @staticmethod
    def from_canonical(text: str) -> Quantity:
        """The quantity for `canonical()` text, re-read as a decimal-SI quantity of that value:
        in int64 form wherever upstream's parser could hold the value so (at most 18 digits,
        no finer than nano), else big. Format and parsed text are not carried."""
        return _from_canonical_cached(text)

    # ----- comparison ---------------------------------------------------------------------

    def compare(self, other: Quantity) -> int:
        """`Cmp`: -1, 0 or 1. Exact, without materializing huge powers of ten."""
        mine, theirs = self.sign(), other.sign()
        if mine != theirs or mine == 0:
            return (mine > theirs) - (mine < theirs)
        # Same sign, both non-zero: the position of the leading digit decides unless equal.
        lead_self = _digits(self.unscaled) + self.scale
        lead_other = _digits(other.unscaled) + other.scale
        if lead_self != lead_other:
            return mine if lead_self > lead_other else -mine
        common = min(self.scale, other.scale)  # bounded by the digit counts here
        left = self.unscaled * _pow10(self.scale - common)
        right = other.unscaled * _pow10(other.scale - common)
        return int(left > right) - int(left < right)

    def compare_int(self, value: int) -> int:
        """`CmpInt64`."""
        return self.compare(Quantity(value, 0))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: Quantity) -> bool:
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash(self._normalized())

    def _normalized(self) -> tuple[int, int]:
        if self.unscaled == 0:
            return 0, 0
        unscaled, times = _strip_factors(self.unscaled, 10)
        return unscaled, self.scale + times

    # ----- accessors ----------------------------------------------------------------------

    def sign(self) -> int:
        return (self.unscaled > 0) - (self.unscaled < 0)

    def is_zero(self) -> bool:
        return self.unscaled == 0

    def as_fraction(self) -> Fraction:
        """The exact value (for tests and exact arithmetic; may be huge)."""
        if self.scale >= 0:
            return Fraction(self.unscaled * _pow10(self.scale))
        return Fraction(self.unscaled, _pow10(-self.scale))

    def as_int64(self) -> int | None:
        """`AsInt64`: the value when upstream converts it without loss, else None. Only the
        int64 form with a non-negative scale converts (the big form never does)."""
        if self.big or self.scale < 0:
            return None
        value, exact = _positive_scale(self.unscaled, self.scale)
        return value if exact else None

    def is_integer(self) -> bool:
        """CEL `isInteger()`."""
        return self.as_int64() is not None

    def as_integer(self) -> int:
        """CEL `asInteger()`."""
        value = self.as_int64()
        if value is None:
            raise QuantityError(INTEGER_ERROR)
        return value

    def as_approximate_float(self) -> float:
        """`AsApproximateFloat64`, with Go's float arithmetic (±Inf outside float range)."""
        try:
            base = float(self.unscaled)
        except OverflowError:
            base = math.inf if self.unscaled > 0 else -math.inf
        if self.scale == 0:
            return base
        return base * _go_pow10(self.scale)

    def value(self) -> int:
        """`Value()`: rounded up (away from zero) to an integer, with Go's int64 behaviour."""
        return self.scaled_value(0)

    def milli_value(self) -> int:
        """`MilliValue()`: ceil(value * 1000), with Go's int64 behaviour."""
        return self.scaled_value(-3)

    def scaled_value(self, scale: int) -> int:
        """`ScaledValue(scale)`: the value in units of 10**scale, rounded up.

        Reproduces upstream, overflow included (an int64-form value too large for int64
        gives 0, a big-form one wraps), since the allocator's step arithmetic uses it."""
        if not self.big:
            if self.scale < scale:
                return _negative_scale(self.unscaled, scale - self.scale)[0]
            return _positive_scale(self.unscaled, self.scale - scale)[0]
        return _big_scaled_value(self.unscaled, self.scale, scale)

    # ----- arithmetic ---------------------------------------------------------------------

    def add(self, other: Quantity | int) -> Quantity:
        """`Add` on a copy (CEL `add`); an int is `NewQuantity(n, DecimalExponent)` as in CEL."""
        addend = _operand(other)
        fmt = self.format
        if not self.big and not addend.big:
            if self.unscaled == 0:
                fmt = addend.format
            result = _int64_add(self.unscaled, self.scale, addend.unscaled, addend.scale)
            if result is not None:
                return Quantity(result[0], result[1], fmt)
        elif self.is_zero():
            fmt = addend.format
        return _big_sum(self, addend.unscaled, addend.scale, fmt)

    def sub(self, other: Quantity | int) -> Quantity:
        """`Sub` on a copy (CEL `sub`); an int is `NewQuantity(n, DecimalExponent)` as in CEL."""
        subtrahend = _operand(other)
        fmt = subtrahend.format if self.is_zero() else self.format
        if not self.big and not subtrahend.big:
            # Upstream negates in int64, so the most negative int64 stays itself here.
            negated = _int64(-subtrahend.unscaled)
            result = _int64_add(self.unscaled, self.scale, negated, subtrahend.scale)
            if result is not None:
                return Quantity(result[0], result[1], fmt)
        return _big_sum(self, -subtrahend.unscaled, subtrahend.scale, fmt)

    def __add__(self, other: Quantity | int) -> Quantity:
        return self.add(other)

    def __sub__(self, other: Quantity | int) -> Quantity:
        return self.sub(other)

    # ----- text ---------------------------------------------------------------------------

    def __str__(self) -> str:
        """`String()`: the canonical form (see the module docstring)."""
        if self.text:
            return self.text
        if self.unscaled == 0:
            return "0"
        fmt = self.format
        if fmt is Format.BINARY_SI:
            # Below 1024 in magnitude, or not a whole number: written in decimal SI.
            if (self.compare_int(-1024) > 0 and self.compare_int(1024) < 0) or not self._whole():
                fmt = Format.DECIMAL_SI
            else:
                return _binary_text(self._whole_value())
        number, exponent = _canonical_decimal(self.unscaled, self.scale)
        if fmt is Format.DECIMAL_EXPONENT:
            return number if exponent == 0 else f"{number}e{exponent}"
        # An exponent without a decimal-SI suffix (beyond E) is dropped, as upstream does.
        return number + _DECIMAL_BY_EXPONENT.get(exponent, "")

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r}, {self.format.value}{', big' if self.big else ''})"

    def _whole(self) -> bool:
        if self.scale >= 0:
            return True
        return self.unscaled % _pow10(-self.scale) == 0

    def _whole_value(self) -> int:
        if self.scale >= 0:
            return self.unscaled * _pow10(self.scale)
        return self.unscaled // _pow10(-self.scale)


def parse_quantity(text: str) -> Quantity:
    """`resource.ParseQuantity`."""
    return _parse_cached(text)


def is_quantity(text: str) -> bool:
    """CEL `isQuantity()`: whether upstream parses the text."""
    try:
        _parse_cached(text)
    except QuantityError:
        return False
    return True


# ----- parsing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Scanned:
    negative: bool
    number: str  # the numeric part as written, sign included (what inf.Dec would read)
    whole: str  # integer digits without leading zeros ("0" when none)
    fraction: str  # digits after the decimal point
    suffix: str


def _scan(text: str) -> _Scanned:
    """Upstream's `parseQuantityString`: split sign, number and suffix; the suffix is only
    checked for its character classes here."""
    end = len(text)
    pos = 0
    negative = False
    if text[:1] in ("+", "-"):
        negative = text[0] == "-"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos == end:
        return _Scanned(negative, "0", "0", "", "")
    start = pos
    while pos < end and _is_digit(text[pos]):
        pos += 1
    if pos == end:
        return _Scanned(negative, text, text[start:], "", "")
    whole = text[start:pos] or "0"
    fraction = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and _is_digit(text[pos]):
            pos += 1
        fraction = text[start:pos]
        if pos == end:
            return _Scanned(negative, text, whole, fraction, "")
    number = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in ("+", "-"):
        pos += 1
    while pos < end and _is_digit(text[pos]):
        pos += 1
    if pos < end:
        raise QuantityError(FORMAT_ERROR)
    return _Scanned(negative, number, whole, fraction, text[suffix_start:])


def _interpret(suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and _SIGNED_DIGITS.fullmatch(suffix[1:]):
        exponent = int(suffix[1:])
        if _fits_int64(exponent):
            return 10, _int32(exponent), Format.DECIMAL_EXPONENT
    raise QuantityError(SUFFIX_ERROR)


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    if not text:
        raise QuantityError(FORMAT_ERROR)
    if text == "0":
        return Quantity(0, 0, Format.DECIMAL_SI, text="0")
    scanned = _scan(text)
    base, exponent, fmt = _interpret(scanned.suffix)
    fast = _parse_int64_form(text, scanned, exponent, fmt)
    if fast is not None:
        return fast
    return _parse_big_form(scanned, base, exponent, fmt)


def _parse_int64_form(text: str, scanned: _Scanned, exponent: int, fmt: Format) -> Quantity | None:
    """Upstream's fast path, or None where it falls back to the big form."""
    whole, fraction = scanned.whole, scanned.fraction
    mantissa = 1
    if fmt is Format.BINARY_SI:
        if fraction:
            return None
        mantissa = 1 << exponent
        # Upstream's estimate of the decimal digits a binary suffix adds (exponent * 0.3).
        precision = 15 - len(whole) - exponent * 3 // 10 - 1
        scale = 0
    else:
        precision = _MAX_INT64_DIGITS - len(whole) - len(fraction)
        scale = exponent
    if precision < 0:
        return None
    scale = _int32(scale - len(fraction))
    if scale < _NANO:
        return None
    digits = whole + fraction
    number = int(digits)
    result = number * mantissa
    if not _fits_int64(result):
        return None
    if scanned.negative:
        result = -result
    # Upstream keeps the parsed text as the canonical form when it already is canonical by
    # its (approximate) test; the text then comes back verbatim, "+1" and "01Ki" included.
    if fmt is Format.BINARY_SI:
        keep = number & 7 != 0
    else:
        keep = scale % 3 == 0 and not digits.endswith("000") and digits[0] != "0"
    return Quantity(result, scale, fmt, text=text if keep else "")


def _parse_big_form(scanned: _Scanned, base: int, exponent: int, fmt: Format) -> Quantity:
    unscaled, inf_scale = _read_decimal(scanned.number)
    if base == 10:
        inf_scale = _int32(inf_scale + _int32(-exponent))
    else:
        unscaled <<= exponent
    negative = unscaled < 0
    unscaled = abs(unscaled)
    if unscaled != 0:
        # Round up to whole nanos so that asking for "some" never becomes "none".
        unscaled, inf_scale = _round_up_to_nano(unscaled, inf_scale), -_NANO
    if fmt is Format.BINARY_SI:
        if unscaled > INT64_MAX * 10**-_NANO:  # only non-zero values get here, at nano scale
            unscaled, inf_scale = INT64_MAX, 0
        elif 0 < unscaled < 10**-_NANO:
            fmt = Format.DECIMAL_SI
    # Go negates the int32 scale when reading the value back, wrapping at -2**31.
    return Quantity(-unscaled if negative else unscaled, _int32(-inf_scale), fmt, big=True)


def _read_decimal(number: str) -> tuple[int, int]:
    """inf.Dec's SetString: (unscaled, digits after the point); needs at least one digit."""
    sign = ""
    if number[:1] in ("+", "-"):
        sign, number = number[0], number[1:]
    whole, _, fraction = number.partition(".")
    if not whole and not fraction:
        raise QuantityError(NUMERIC_ERROR)
    return int(sign + (whole + fraction or "0")), len(fraction)


def _round_up_to_nano(unscaled: int, inf_scale: int) -> int:
    """A positive `unscaled * 10**-inf_scale` as a whole number of nanos, rounded up."""
    shift = -_NANO - inf_scale
    if shift >= 0:
        return unscaled * _pow10(shift)
    if -shift > _digits(unscaled):
        return 1  # far below a nano: the smallest non-zero amount
    quotient, remainder = divmod(unscaled, _pow10(-shift))
    return quotient + int(remainder != 0)


@lru_cache(maxsize=4096)
def _from_canonical_cached(text: str) -> Quantity:
    mantissa, _, exponent = text.partition("e")
    unscaled, scale = int(mantissa), int(exponent or "0")
    if unscaled == 0:
        return Quantity(0, 0)
    if _digits(unscaled) <= _MAX_INT64_DIGITS and scale >= _NANO:
        return Quantity(unscaled, scale)
    if scale < _NANO:
        raise QuantityError(f"{text!r} is finer than a nano, which no quantity is")
    return Quantity(unscaled * _pow10(scale - _NANO), _NANO, big=True)


# ----- arithmetic helpers ------------------------------------------------------------------


def _operand(other: Quantity | int) -> Quantity:
    if isinstance(other, Quantity):
        return other
    return Quantity.from_int(other, Format.DECIMAL_EXPONENT)


def _int64_add(a: int, a_scale: int, b: int, b_scale: int) -> tuple[int, int] | None:
    """Upstream's int64 addition: (value, scale), or None when it would overflow."""
    if b == 0:
        return a, a_scale
    if a == 0:
        return b, b_scale
    scale = min(a_scale, b_scale)
    left, left_exact = _positive_scale(a, a_scale - scale)
    right, right_exact = _positive_scale(b, b_scale - scale)
    total = left + right
    if not (left_exact and right_exact and _fits_int64(total)):
        return None
    return total, scale


def _positive_scale(value: int, places: int) -> tuple[int, bool]:
    """Upstream's positiveScaleInt64: `value * 10**places` in int64, and whether it fit.

    On overflow upstream hands back what it has, which `ScaledValue` returns as is: the
    wrapped product for the single-multiplication cases, else 0."""
    if places == 0 or value == 0:
        return value, True
    if value == 1 and places in (1, 2, 3, 6, 9):
        return 10**places, True
    if places in (1, 2, 3, 6, 9):
        if value == INT64_MIN:
            return 0, False
        product = value * 10**places
        return _int64(product), _fits_int64(product)
    if places > 19:
        return 0, False  # |value| >= 1, so it overflows within 19 steps of the loop
    product = value * 10**places
    return (product, True) if _fits_int64(product) else (0, False)


def _big_sum(a: Quantity, b: int, b_scale: int, fmt: Format) -> Quantity:
    """inf.Dec addition: exact, at the finer of the two scales."""
    scale = min(a.scale, b_scale)
    total = a.unscaled * _pow10(a.scale - scale) + b * _pow10(b_scale - scale)
    return Quantity(total, scale, fmt, big=True)


def _negative_scale(value: int, places: int) -> tuple[int, bool]:
    """Upstream's negativeScaleInt64: `value / 10**places` rounded away from zero, exactness."""
    if places == 0:
        return value, True
    magnitude = abs(value)
    if places > _digits(magnitude):
        quotient, remainder = 0, magnitude
    else:
        quotient, remainder = divmod(magnitude, 10**places)
    if remainder:
        quotient += 1
    return (quotient if value >= 0 else -quotient), remainder == 0


def _big_scaled_value(unscaled: int, scale: int, new_scale: int) -> int:
    """Upstream's scaledValue for the big form, int64 wrap-around and all."""
    dif = new_scale - scale  # upstream's inf-scale difference
    if dif == 0:
        return _int64(unscaled)
    if dif < 0:
        factor = 10**-dif if -dif <= 18 else INT64_MIN  # Go's int64(float64 out of range)
        return _int64(_int64(unscaled) * factor)
    if unscaled < INT64_MAX and dif < 19:
        low = _int64(unscaled)
        divisor = 10**dif
        quotient = abs(low) // divisor * (1 if low >= 0 else -1)  # Go truncates
        return _int64(quotient + (low - quotient * divisor != 0))
    if dif > _digits(unscaled) + 1:
        quotient, remainder = (0 if unscaled >= 0 else -1), unscaled != 0
    else:
        quotient, rest = divmod(unscaled, 10**dif)  # floor division, as big.Int's DivMod
        remainder = rest != 0
    return _int64(_int64(quotient) + remainder)


# ----- canonical text ----------------------------------------------------------------------


def _canonical_decimal(unscaled: int, scale: int) -> tuple[str, int]:
    """Digits and an exponent that is a multiple of three, with no trailing zeros beyond it."""
    mantissa, times = _strip_factors(unscaled, 10)
    exponent = scale + times
    below = exponent % 3  # steps down to the multiple of three at or below
    return str(mantissa * 10**below), exponent - below


def _binary_text(value: int) -> str:
    mantissa, times = _strip_factors(value, 1024)
    return f"{mantissa}{_BINARY_BY_POWER.get(times, '')}"


_POW10_TABLE: Final = tuple(float(f"1e{n}") for n in range(32))
_POW10_POSITIVE_32: Final = tuple(float(f"1e{32 * n}") for n in range(10))
_POW10_NEGATIVE_32: Final = tuple(float(f"1e-{32 * n}") for n in range(11))


def _go_pow10(exponent: int) -> float:
    """Go's math.Pow10, table for table, so float results match upstream bit for bit."""
    if 0 <= exponent <= 308:
        return _POW10_POSITIVE_32[exponent // 32] * _POW10_TABLE[exponent % 32]
    if -323 <= exponent <= 0:
        return _POW10_NEGATIVE_32[-exponent // 32] / _POW10_TABLE[-exponent % 32]
    return math.inf if exponent > 0 else 0.0
