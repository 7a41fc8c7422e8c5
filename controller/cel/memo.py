"""Memo keys: everything a selector can observe about one device, as a hashable value.

Built from the static `reads` of an expression (see analysis.py) and the driver, once per
(selector, driver); computing a key is then a handful of dict lookups, so identical GPUs
that differ only in name, UUID or index share one evaluation.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from controller.cel.analysis import WILDCARD, Read
from controller.cel.device import split_name

_SCALARS = (str, int, bool, float)


class KeyPlan:
    def __init__(self, reads: tuple[Read, ...], driver: str) -> None:
        self.driver = driver
        self.reads_allow_multiple = any(field == "allowMultipleAllocations" for field, _, _ in reads)
        # (field, names): attribute/capacity entries read by name, qualified and (for the
        # driver's own domain) unqualified, since both spellings land in the same place.
        self.exact: list[tuple[str, tuple[str, ...]]] = []
        exact: dict[str, list[str]] = {}
        self.domains: list[tuple[str, str]] = []  # (field, domain) read as a whole
        self.whole: list[str] = []  # fields read entirely
        for field, domain, ident in reads:
            if field not in ("attributes", "capacity"):
                continue
            if domain == WILDCARD:
                self.whole.append(field)
            elif ident == WILDCARD:
                self.domains.append((field, domain))
            else:
                names = (f"{domain}/{ident}", ident) if domain == driver else (f"{domain}/{ident}",)
                exact.setdefault(field, []).extend(names)
        self.exact = [(field, tuple(names)) for field, names in exact.items()]

    def key(self, device: Mapping[str, Any]) -> Hashable | None:
        parts: list[Hashable] = [self.driver]
        if self.reads_allow_multiple:
            parts.append(_freeze(device.get("allowMultipleAllocations")))
        for field, names in self.exact:
            table = device.get(field)
            if table is None:
                parts.append(None)
            elif type(table) is dict:
                for name in names:
                    parts.append(_freeze(table.get(name)))
            else:
                return None
        for field, domain in self.domains:
            table = device.get(field) or {}
            if not isinstance(table, Mapping):
                return None
            entries = ((n, _freeze(v)) for n, v in table.items() if split_name(n, self.driver)[0] == domain)
            parts.append(tuple(sorted(entries)))
        for field in self.whole:
            parts.append(_freeze(device.get(field)))
        return tuple(parts)


def _freeze(value: object) -> Hashable:
    # Fast path for the API's one-entry value objects: {"string": "H100"}, {"value": "80Gi"}.
    # The Python type is part of the key so that e.g. {"int": 1} and {"int": True} differ.
    if type(value) is dict and len(value) == 1:
        ((name, inner),) = value.items()
        if type(inner) in _SCALARS:
            return (name, inner, type(inner).__name__)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("list", *(_freeze(v) for v in value))
    if value is None or type(value) in _SCALARS:
        return (type(value).__name__, value)
    return repr(value)
