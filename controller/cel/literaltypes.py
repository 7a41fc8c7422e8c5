"""Upstream's homogeneous aggregate literal rule: `[1, "a"]` and `{"a": 1, "b": "x"}` do not compile.

Kubernetes builds every CEL environment with cel-go's `HomogeneousAggregateLiterals` (and
since 1.29 also its AST validator): after type checking, each list literal's elements, and
each map literal's keys and values, must all have one type, else compilation fails with
"expected type 'T' but found 'U'" at the first element that differs (lists) or at every key
and value that differs (maps). Literals inside a `format()` call are exempt. cel-cpp and
cel-python have no such rule, so we apply it ourselves.

We infer types only where they are certain from the syntax (literals, operators with a fixed
result type, the `device` fields whose declared types upstream fixes); any element whose
type is not certain is skipped, so this check can miss a mismatch but never invents one.
The names match cel-go's FormatCELType: `any` is the attribute value type (DynType).
"""

from __future__ import annotations

from controller.cel import syntax
from controller.cel.errors import CompileError
from controller.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select

_LITERAL_TYPES = {"null": "null"}
_BOOL_OPERATORS = frozenset({"_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "_&&_", "_||_", "!_", "@in"})
_ARITHMETIC = frozenset({"_+_", "_-_", "_*_", "_/_", "_%_", "-_"})
_ARITHMETIC_TYPES = frozenset({"int", "uint", "double", "string", "bytes"})
_CONVERSIONS = frozenset({"int", "uint", "double", "string", "bool", "bytes"})
# The declared types of the device's fields (k8s.io/dynamic-resource-allocation/cel).
_ATTRIBUTE = "any"
_QUANTITY = "kubernetes.Quantity"
_DEVICE_FIELD_TYPES = {
    ("driver",): "string",
    ("allowMultipleAllocations",): "bool",
    ("attributes",): f"map(string, map(string, {_ATTRIBUTE}))",
    ("attributes", "*"): f"map(string, {_ATTRIBUTE})",
    ("attributes", "*", "*"): _ATTRIBUTE,
    ("capacity",): f"map(string, map(string, {_QUANTITY}))",
    ("capacity", "*"): f"map(string, {_QUANTITY})",
    ("capacity", "*", "*"): _QUANTITY,
}
# Macros that bind names in their later arguments: inside, those names have unknown types.
_BINDING_MACROS = frozenset(
    {"all", "exists", "exists_one", "existsOne", "map", "filter", "sortBy"}
    | {"transformList", "transformMap", "transformMapEntry"}
)


def check_homogeneous_literals(expression: str) -> None:
    """CompileError, positioned like cel-go's, for the first mixed-type list or map literal."""
    _Checker(expression).visit(syntax.parse(expression), frozenset(), exempt=False)


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def mismatch(self, node: Node, expected: str, found: str) -> CompileError:
        line, column = syntax.position(self.source, node.pos)
        return CompileError(f"expected type '{expected}' but found '{found}'", line=line, column=column)

    def visit(self, node: Node, bound: frozenset[str], *, exempt: bool) -> None:
        if isinstance(node, Call):
            exempt = exempt or node.name == "format"
            names = _bound_names(node)
            if names:
                if node.target is not None:
                    self.visit(node.target, bound, exempt=exempt)
                for arg in node.args[len(names) :]:
                    self.visit(arg, bound | names, exempt=exempt)
                return
        if not exempt:
            if isinstance(node, ListLit):
                self.check_list(node, bound)
            elif isinstance(node, MapLit):
                self.check_map(node, bound)
        for child in syntax.children(node):
            self.visit(child, bound, exempt=exempt)

    def check_list(self, node: ListLit, bound: frozenset[str]) -> None:
        first: str | None = None
        for position, item in enumerate(node.items):
            found = _element_type(item, bound, optional=position in node.optional_items)
            if found is None:
                # Unknown: cel-go compares with the first element, which we cannot name; stop.
                if position == 0:
                    return
                continue
            if first is None:
                first = found
            elif found != first:
                raise self.mismatch(item, first, found)

    def check_map(self, node: MapLit, bound: frozenset[str]) -> None:
        if not node.entries:
            return
        first_key = type_of(node.entries[0][0], bound)
        first_value = _element_type(node.entries[0][1], bound, optional=0 in node.optional_entries)
        for position, (key, value) in enumerate(node.entries[1:], start=1):
            key_type = type_of(key, bound)
            if first_key is not None and key_type is not None and key_type != first_key:
                raise self.mismatch(key, first_key, key_type)
            value_type = _element_type(value, bound, optional=position in node.optional_entries)
            if first_value is not None and value_type is not None and value_type != first_value:
                raise self.mismatch(value, first_value, value_type)


def _element_type(node: Node, bound: frozenset[str], *, optional: bool) -> str | None:
    """An element's type; an optional element (`?x`) counts as the type inside the optional."""
    found = type_of(node, bound)
    if not optional:
        return found
    if found is not None and found.startswith("optional_type(") and found.endswith(")"):
        return found[len("optional_type(") : -1]
    return None


def type_of(node: Node, bound: frozenset[str]) -> str | None:
    """The node's checked type in cel-go's notation when the syntax fixes it, else None."""
    if isinstance(node, Literal):
        return _LITERAL_TYPES.get(node.kind, node.kind)
    if isinstance(node, ListLit):
        items = _common([type_of(item, bound) for item in node.items])
        return None if items is None else f"list({items})"
    if isinstance(node, MapLit):
        keys = _common([type_of(key, bound) for key, _ in node.entries])
        values = _common([type_of(value, bound) for _, value in node.entries])
        return None if keys is None or values is None else f"map({keys}, {values})"
    if isinstance(node, Select | Index):
        return _device_field_type(node, bound)
    if isinstance(node, Call):
        return _call_type(node, bound)
    return None


def _common(element_types: list[str | None]) -> str | None:
    """The one type of a literal's elements; None when empty (its type is free), mixed or unknown."""
    if not element_types or None in element_types or len(set(element_types)) != 1:
        return None
    return element_types[0]


def _call_type(node: Call, bound: frozenset[str]) -> str | None:
    if node.name in _BOOL_OPERATORS:
        return "bool"
    if node.name in _ARITHMETIC:
        kinds = {type_of(arg, bound) for arg in node.args}
        if len(kinds) == 1 and (kind := kinds.pop()) in _ARITHMETIC_TYPES:
            return kind
        return None
    if node.name == "size" and len(node.args) + (node.target is not None) == 1:
        return "int"
    if node.target is None and node.name in _CONVERSIONS and len(node.args) == 1:
        return node.name
    if (
        node.name == "of"
        and isinstance(node.target, Ident)
        and node.target.name == "optional"
        and "optional" not in bound
        and len(node.args) == 1
    ):
        inner = type_of(node.args[0], bound)
        return None if inner is None else f"optional_type({inner})"
    return None


def _device_field_type(node: Select | Index, bound: frozenset[str]) -> str | None:
    steps: list[str] = []
    current: Node = node
    while isinstance(current, Select | Index):
        if current.optional:
            return None
        steps.append(current.field if isinstance(current, Select) else "*")
        current = current.operand
    if not isinstance(current, Ident) or current.name != "device" or "device" in bound:
        return None
    steps.reverse()
    # A map is indexed by `[d]` or selected by `.d` alike; only the first step names a field.
    key = (steps[0], *("*" for _ in steps[1:]))
    return _DEVICE_FIELD_TYPES.get(key)


def _bound_names(node: Call) -> frozenset[str]:
    """The names a macro call binds (one, or two for two-variable forms), else none."""
    if node.target is None or node.name not in _BINDING_MACROS or len(node.args) < 2:
        return frozenset()
    if not isinstance(node.args[0], Ident):
        return frozenset()
    leading = [arg for arg in node.args[:2] if isinstance(arg, Ident)]
    two = len(leading) == 2 and len(node.args) >= 3
    return frozenset(arg.name for arg in (leading if two else leading[:1]))
