"""What a CEL selector reads, from its text: literal `device.attributes["d"].id` and
`device.capacity["d"]["id"]` reads, and whether each is guarded (`has(...)`,
`"id" in device.attributes["d"]`, or `.?id`).

A textual scan, not the type checker: lint only needs the literal names to say which
attribute a runtime error comes from and how to guard it; expressions that compute names
are simply not seen here (their runtime errors are still found by evaluation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_STRING = r'"([^"\\]+)"|\'([^\'\\]+)\''
_READ = re.compile(
    r"device\.(attributes|capacity)\s*\[\s*(?:" + _STRING + r")\s*\]"
    r"\s*(?:\.\??\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:" + _STRING + r")\s*\])"
)


def attribute_reads(expression: str) -> list[tuple[str, str, str]]:
    """(field, domain, id) of every literal `device.attributes["d"].id`-style read."""
    reads: list[tuple[str, str, str]] = []
    for match in _READ.finditer(expression):
        kind = match.group(1)
        domain = match.group(2) or match.group(3)
        name = match.group(4) or match.group(5) or match.group(6)
        reads.append((kind, domain, name))
    return reads


def is_guarded(expression: str, kind: str, domain: str, name: str) -> bool:
    base = rf"device\.{kind}\s*\[\s*[\"']{re.escape(domain)}[\"']\s*\]"
    patterns = (
        rf"has\(\s*{base}\s*\.\s*{re.escape(name)}\s*\)",
        rf"[\"']{re.escape(name)}[\"']\s+in\s+{base}",
        rf"{base}\s*\.\?\s*{re.escape(name)}\b",
    )
    return any(re.search(p, expression) for p in patterns)


def device_has(driver: str, device: Mapping[str, Any], kind: str, domain: str, name: str) -> bool:
    """Whether the device publishes the attribute/capacity; unqualified names are the driver's."""
    values = device.get(kind) or {}
    if f"{domain}/{name}" in values:
        return True
    return domain == driver and name in values
