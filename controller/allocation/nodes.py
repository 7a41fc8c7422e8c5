"""Nodes and core/v1 NodeSelector matching, as the scheduler evaluates them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class NodeSelectorError(ValueError):
    """A NodeSelector the scheduler would refuse to parse."""


@dataclass(frozen=True)
class Node:
    """The part of a Node that allocation looks at."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Node:
        meta = obj.get("metadata") or {}
        return cls(name=str(meta.get("name", "")), labels=dict(meta.get("labels") or {}))


def _requirement_matches(requirement: Mapping[str, Any], values_by_key: Mapping[str, str]) -> bool:
    key = requirement.get("key", "")
    operator = requirement.get("operator", "")
    values = list(requirement.get("values") or [])
    present = key in values_by_key
    actual = values_by_key.get(key, "")
    if operator == "In":
        return present and actual in values
    if operator == "NotIn":
        return not present or actual not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            raise NodeSelectorError(f"operator {operator} needs exactly one value, got {values}")
        if not present:
            return False
        try:
            left, right = int(actual), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    raise NodeSelectorError(f"{operator!r} is not a valid node selector operator")


def term_matches(term: Mapping[str, Any], node: Node) -> bool:
    """All requirements of one term must hold; an empty term matches nothing."""
    expressions = list(term.get("matchExpressions") or [])
    fields = list(term.get("matchFields") or [])
    if not expressions and not fields:
        return False
    for requirement in fields:
        if requirement.get("key") != "metadata.name":
            raise NodeSelectorError(f"field selector key {requirement.get('key')!r} is not supported")
    field_values = {"metadata.name": node.name}
    return all(_requirement_matches(r, node.labels) for r in expressions) and all(
        _requirement_matches(r, field_values) for r in fields
    )


def selector_matches(selector: Mapping[str, Any], node: Node | None) -> bool:
    """Terms are ORed. A missing node (no node context) matches no selector."""
    if node is None:
        return False
    return any(term_matches(term, node) for term in selector.get("nodeSelectorTerms") or [])


def node_matches(
    node: Node | None, node_name: str, all_nodes: bool, selector: Mapping[str, Any] | None
) -> bool:
    """Whether a slice (or a device with per-device node selection) is usable on the node."""
    if node_name:
        return node is not None and node.name == node_name
    if all_nodes:
        return True
    if selector is not None:
        return selector_matches(selector, node)
    return False
