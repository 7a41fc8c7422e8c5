"""Kubernetes CEL regex library (`find`, `findAll`) on RE2: linear time, no backtracking."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from controller.cel.errors import LibraryError


def _options() -> Any:
    options = re2.Options()
    # RE2 would otherwise log every bad pattern to stderr; the error reaches the caller anyway.
    options.log_errors = False
    return options


_OPTIONS = _options()


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as err:
        detail = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else str(err)
        raise LibraryError(f"error parsing regexp: {detail}: `{pattern}`") from None


def regex_error(pattern: str) -> str | None:
    """The compile error for a pattern, or None when it is valid."""
    try:
        compile_regex(pattern)
    except LibraryError as err:
        return str(err)
    return None


def matches(text: str, pattern: str) -> bool:
    return compile_regex(pattern).search(text) is not None


def find(text: str, pattern: str) -> str:
    found = compile_regex(pattern).search(text)
    return "" if found is None else str(found.group(0))


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    out: list[str] = []
    for found in compile_regex(pattern).finditer(text):
        out.append(str(found.group(0)))
        if 0 < limit <= len(out):
            break
    return out
