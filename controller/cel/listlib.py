"""Kubernetes CEL lists library and cel-go ext.Lists / ext.Sets, over plain Python values."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from controller.cel.errors import LibraryError, check_size
from controller.cel.semver import Semver
from dracommon.quantity import Quantity


def _compare(a: object, b: object) -> int:
    if isinstance(a, Quantity | Semver) and type(a) is type(b):
        return a.compare(b)  # type: ignore[arg-type]
    if isinstance(a, bool) != isinstance(b, bool) or not _comparable(a, b):
        raise LibraryError(f"no such overload: {type(a).__name__} < {type(b).__name__}")
    return int((a > b) - (a < b))  # type: ignore[operator]


def _comparable(a: object, b: object) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return True
    return type(a) is type(b) and isinstance(a, str | bytes | bool)


def _equal(a: object, b: object) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def is_sorted(items: Sequence[object]) -> bool:
    return all(_compare(items[i], items[i + 1]) <= 0 for i in range(len(items) - 1))


def sum_of(items: Sequence[object]) -> object:
    if not items:
        return 0
    total = items[0]
    for item in items[1:]:
        if isinstance(total, Quantity) or isinstance(item, bool) or not isinstance(item, int | float):
            raise LibraryError(f"no such overload: sum over {type(item).__name__}")
        total = total + item  # type: ignore[operator]
    if isinstance(total, int) and not isinstance(total, bool) and not -(2**63) <= total < 2**63:
        raise LibraryError("integer overflow")
    return total


def min_of(items: Sequence[object]) -> object:
    if not items:
        raise LibraryError("min called on empty list")
    return min(items, key=functools.cmp_to_key(_compare))


def max_of(items: Sequence[object]) -> object:
    if not items:
        raise LibraryError("max called on empty list")
    return max(items, key=functools.cmp_to_key(_compare))


def index_of(items: Sequence[object], value: object) -> int:
    return next((i for i, item in enumerate(items) if _equal(item, value)), -1)


def last_index_of(items: Sequence[object], value: object) -> int:
    return next((i for i in range(len(items) - 1, -1, -1) if _equal(items[i], value)), -1)


def slice_of(items: Sequence[object], start: int, end: int) -> list[object]:
    if start < 0 or end < 0:
        raise LibraryError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise LibraryError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
        )
    if end > len(items):
        raise LibraryError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return list(items[start:end])


def flatten(items: Sequence[object], depth: int = 1) -> list[object]:
    if depth < 0:
        raise LibraryError("level must be non-negative")
    out: list[object] = []
    for item in items:
        if isinstance(item, list) and depth > 0:
            out.extend(flatten(item, depth - 1))
        else:
            out.append(item)
        check_size(len(out), "list")
    return out


def distinct(items: Sequence[object]) -> list[object]:
    out: list[object] = []
    for item in items:
        if not any(_equal(item, seen) for seen in out):
            out.append(item)
    return out


def reverse(items: Sequence[object]) -> list[object]:
    return list(reversed(items))


def sort(items: Sequence[object]) -> list[object]:
    # ext.Lists sorts only CEL's comparable primitives: Quantity and Semver have no Compare trait.
    if any(isinstance(item, Quantity | Semver) for item in items):
        raise LibraryError("list elements must be comparable")
    return sorted(items, key=functools.cmp_to_key(_compare))


def range_of(count: int) -> list[object]:
    check_size(count, "list")
    return list(range(max(count, 0)))


def sets_contains(items: Sequence[object], other: Sequence[object]) -> bool:
    return all(any(_equal(a, b) for a in items) for b in other)


def sets_equivalent(items: Sequence[object], other: Sequence[object]) -> bool:
    return sets_contains(items, other) and sets_contains(other, items)


def sets_intersects(items: Sequence[object], other: Sequence[object]) -> bool:
    return any(_equal(a, b) for a in items for b in other)


def includes(target: object, value: object) -> bool:
    """Kubernetes library.Lists v1: a list holds the value, or a scalar equals it."""
    if isinstance(target, list):
        return any(_equal(item, value) for item in target)
    return _equal(target, value)
