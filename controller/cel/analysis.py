"""Static facts about an expression: which device parts it reads, which domains it names, cost."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

_STRING_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')


@dataclass(frozen=True, slots=True)
class Analysis:
    domains: frozenset[str]
    # (field, domain, id) the expression reads; None when it cannot tell (no memoization).
    reads: frozenset[tuple[str, str, str]] | None
    cost: int


def analyze(expression: str, engine: str) -> Analysis:
    domains = frozenset(a or b for a, b in _STRING_LITERAL.findall(expression))
    return Analysis(domains=domains, reads=None, cost=0)


def memo_key(info: Analysis, driver: str, device: Mapping[str, Any]) -> Hashable | None:
    return None
