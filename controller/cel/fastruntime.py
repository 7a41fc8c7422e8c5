"""What the Python code compiled by controller.cel.fastgen calls at run time.

Two signals leave a compiled selector instead of a result:

* `CelFailure`: a CEL runtime error (no such key, integer overflow, division by zero, a
  library function's error). `&&` and `||` absorb it as CEL does; if it reaches the top,
  the device is evaluated again by the full engine, which gives the exact message.
* `Unhandled`: something outside what the compiled code is sure about (an unusual device
  shape, operand types the compiled code does not handle, an overload it cannot pick).
  Never absorbed: the whole device goes to the full engine.

So the compiled code only ever has to be right where it returns a bool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import product
from typing import Any, Final

from controller.cel.device import DeviceShapeError, ViewPlan, build_view
from controller.cel.errors import LibraryError
from controller.cel.library import FUNCTIONS, Function, Kind
from controller.cel.netlib import CIDR, IP, URL
from controller.cel.semver import Semver, SemverError
from dracommon.quantity import Quantity, QuantityError

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class CelFailure(Exception):
    """A CEL runtime error inside compiled code (absorbed by `&&`/`||` as CEL does)."""


class Unhandled(Exception):
    """The compiled code cannot decide this device; the full engine must."""


SIGNALS: Final = (CelFailure, Unhandled)
MISSING: Final = object()
EMPTY: Final[dict[str, Any]] = {}


def attribute(raw: object) -> object:
    """A resource.k8s.io/v1 attribute value in its usual one-field shape, else Unhandled.

    The shapes controller.cel.device validates (and reports) in other ways, lists included,
    are left to the full engine.
    """
    if raw.__class__ is dict and len(raw) == 1:
        for field, value in raw.items():
            if field == "string":
                if value.__class__ is str:
                    return value
            elif field == "int":
                if value.__class__ is int and INT64_MIN <= value <= INT64_MAX:
                    return value
            elif field == "bool":
                if value.__class__ is bool:
                    return value
            elif field == "version" and value.__class__ is str:
                try:
                    return Semver.parse(value)
                except SemverError:
                    raise Unhandled from None
    raise Unhandled


def capacity(raw: object) -> Quantity:
    """A capacity entry's value as a Quantity, else Unhandled."""
    if raw.__class__ is dict:
        value = raw.get("value")
        if value.__class__ is str or (value.__class__ is int and INT64_MIN <= value <= INT64_MAX):
            try:
                return Quantity.parse(str(value))
            except QuantityError:
                raise Unhandled from None
    raise Unhandled


def _same(value: object) -> object:
    return value


def view(driver: str, device: Mapping[str, Any], plan: ViewPlan) -> dict[str, Any]:
    """The `device` variable as the full engine builds it (same plan), with plain values."""
    try:
        built = build_view(driver, device, semver=_same, quantity=_same, plan=plan)
    except DeviceShapeError:
        raise Unhandled from None
    # An int past int64 fails in the full engine as its value crosses into cel-cpp.
    for entries in built["attributes"].values():
        for value in entries.values():
            values = value if value.__class__ is list else (value,)
            if any(v.__class__ is int and not INT64_MIN <= v <= INT64_MAX for v in values):
                raise Unhandled
    return built


def item(container: object, key: object) -> object:
    """`container[key]` / `container.key` on a map (string keys) or a list (int index):
    a missing key or an index out of range is CEL's error; anything else is Unhandled."""
    if container.__class__ is dict:
        if key.__class__ is not str:
            raise Unhandled
        value = container.get(key, MISSING)
        if value is MISSING:
            raise CelFailure
        return value
    if container.__class__ is list and key.__class__ is int:
        if 0 <= key < len(container):
            return container[key]
        raise CelFailure
    raise Unhandled


def pairs(container: object) -> Iterable[tuple[object, object]]:
    """What a two-variable comprehension ranges over: (index, element) or (key, value)."""
    if container.__class__ is list:
        return list(enumerate(container))
    if container.__class__ is dict:
        return list(container.items())
    raise Unhandled


def checked(value: int) -> int:
    """An int64 result, or CEL's overflow error."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    raise CelFailure


def divide(a: int, b: int) -> int:
    """CEL (Go) int64 division: truncates toward zero; by zero and MIN / -1 are errors."""
    if b == 0 or (a == INT64_MIN and b == -1):
        raise CelFailure
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def modulo(a: int, b: int) -> int:
    """CEL (Go) int64 remainder: takes the dividend's sign; by zero and MIN % -1 are errors."""
    if b == 0 or (a == INT64_MIN and b == -1):
        raise CelFailure
    remainder = abs(a) % abs(b)
    return remainder if a >= 0 else -remainder


def member(needle: object, haystack: object) -> bool:
    """CEL `in` over a list, where every element has the needle's own type (str or int):
    there Python's `in` is CEL's; mixed types (CEL's heterogeneous equality) are Unhandled."""
    kind = needle.__class__
    if haystack.__class__ is dict and kind is str:
        return needle in haystack  # the view's maps have string keys only
    if haystack.__class__ is not list or (kind is not str and kind is not int):
        raise Unhandled
    for item in haystack:
        if item.__class__ is not kind:
            raise Unhandled
    return needle in haystack


_SCALARS: frozenset[type] = frozenset({str, int, float, bool, bytes, Quantity, Semver, IP, CIDR, URL})

# Run-time kind tests for library overloads, over the values compiled code holds. UINT has
# no test: compiled code never holds a uint, so no uint overload may be picked for an int.
FUNCTIONS_BY_NAME: dict[str, Function] = {function.name: function for function in FUNCTIONS}


# A library function's errors (QuantityError and SemverError are ValueErrors), as engine_cpp's
# dispatcher counts them: each a CEL runtime error.
LIBRARY_ERRORS: Final = (LibraryError, ValueError, TypeError, ArithmeticError, RecursionError)

# The Python classes of the values compiled code holds, per library kind. UINT has none:
# compiled code never holds a uint, so no uint overload may be picked for an int.
_KIND_CLASSES: dict[Kind, tuple[type, ...]] = {
    Kind.STRING: (str,),
    Kind.INT: (int,),
    Kind.UINT: (),
    Kind.DOUBLE: (float,),
    Kind.BOOL: (bool,),
    Kind.BYTES: (bytes,),
    Kind.QUANTITY: (Quantity,),
    Kind.SEMVER: (Semver,),
    Kind.LIST: (list,),
    Kind.LIST_STRING: (list,),
    Kind.MAP_STRING_LIST: (dict,),
    Kind.IP: (IP,),
    Kind.CIDR: (CIDR,),
    Kind.URL: (URL,),
    Kind.ANY: tuple(_SCALARS),
}


def dispatch_table(function: Function) -> dict[tuple[type, ...], Callable[..., object]]:
    """engine_cpp's run-time overload choice as a table: argument classes -> implementation.

    The first overload that fits wins, as there. Arguments that fit none are not in the
    table: compiled code then raises Unhandled (the full engine reports it, or absorbs it
    where CEL does).
    """
    table: dict[tuple[type, ...], Callable[..., object]] = {}
    for overload in function.overloads:
        impl = getattr(overload.impl, "__wrapped__", overload.impl)
        for classes in product(*(_KIND_CLASSES[kind] for kind in overload.params)):
            table.setdefault(classes, impl)
    return table


def dispatcher(function: Function) -> Callable[..., object]:
    """The same choice as a function (compile-time folding): CelFailure or Unhandled."""
    table = dispatch_table(function)

    def call(*args: object) -> object:
        impl = table.get(tuple(arg.__class__ for arg in args))
        if impl is None:
            raise Unhandled
        try:
            return impl(*args)
        except LIBRARY_ERRORS:
            raise CelFailure from None

    return call


def fold(function: Function, args: Sequence[object]) -> tuple[bool, object]:
    """A call on constant arguments, done once at compile time: (True, value), or
    (False, None) when it fails or cannot be decided (then it runs, and fails, per device)."""
    try:
        return True, dispatcher(function)(*args)
    except (CelFailure, Unhandled):
        return False, None
