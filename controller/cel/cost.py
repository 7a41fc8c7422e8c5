"""The worst-case compile-time cost of a DRA selector, ported from upstream's estimator.

kube-apiserver rejects a new selector whose estimated cost exceeds 1,000,000. The estimate
is cel-go's `checker.Cost` (checker/cost.go) with Kubernetes' `library.CostEstimator`
(k8s.io/apiserver/pkg/cel/library/cost.go) and DRA's size estimator
(k8s.io/dynamic-resource-allocation/cel/compile.go, `sizeEstimator.EstimateSize`), plus the
overload estimators of cel-go's ext.Lists. This module mirrors those rules for the
constructs of the DRA environment; each rule names the upstream function it mirrors.

Upstream works on the type-checked AST with macros expanded into comprehensions; we walk our
own parse, infer the few types the rules depend on (string vs list vs map vs scalar), and
apply each macro's expansion (cel-go parser/macro.go, ext/comprehensions.go, ext/lists.go
sortByMacro) in closed form. Only the maximum of upstream's (min, max) cost is tracked, since
only it is compared with the limit; sizes keep both bounds, which some rules (replace) use.

Size: hand-written because the estimator exists only in Go; one module, as it is one walk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from controller.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select, StructLit
from dracommon.kubeversion import NEWEST_KNOWN, KubernetesVersion

U64 = 2**64 - 1
Size = tuple[int, int]
UNKNOWN: Size = (0, U64)
# cel-go common/cost.go
STRING_TRAVERSAL = 0.1
REGEX_LENGTH = 0.25
LIST_CREATE = 10
MAP_CREATE = 30
STRUCT_CREATE = 40

# Types, as far as the rules need them: a name, or ("list", elem) / ("map", key, value).
Type = str | tuple["Type", ...]
DYN = "dyn"
SCALARS = frozenset({"bool", "int", "uint", "double", "duration", "timestamp"})
COMPARABLE = frozenset({"bool", "int", "uint", "double", "string", "bytes", "duration", "timestamp"})


def _add(a: int, b: int) -> int:
    return min(a + b, U64)


def _mul(a: int, b: int) -> int:
    return min(a * b, U64)


def _factor(x: int, factor: float) -> int:
    """cel-go multiplyByCostFactor: float math, ceil, saturating at 2^64-1."""
    product = math.ceil(float(x) * factor)
    return U64 if product >= 2**64 else int(product)


def _size_add(a: Size, b: Size) -> Size:
    return _add(a[0], b[0]), _add(a[1], b[1])


def _size_mul(a: Size, b: Size) -> Size:
    return _mul(a[0], b[0]), _mul(a[1], b[1])


def _union(a: Size, b: Size) -> Size:
    return min(a[0], b[0]), max(a[1], b[1])


# ------------------------------------------------------------------ DRA's declared sizes


@dataclass(frozen=True)
class _Decl:
    """An apiservercel.DeclType, reduced to what sizeEstimator.EstimateSize reads."""

    max_elements: int
    fields: tuple[tuple[str, _Decl], ...] = ()
    key: _Decl | None = None
    elem: _Decl | None = None


# resource.k8s.io/v1: DeviceAttributeMaxValueLength, DeviceMaxIDLength, DeviceMaxDomainLength,
# DriverNameMaxLength, ResourceSliceMaxAttributesAndCapacitiesPerDevice. QuantityDeclType
# declares no MaxElements (0).
_ATTRIBUTE = _Decl(64)
_ID, _DOMAIN = _Decl(32), _Decl(63)
_INNER_ATTRIBUTES = _Decl(32, key=_ID, elem=_ATTRIBUTE)
_INNER_CAPACITY = _Decl(32, key=_ID, elem=_Decl(0))
_DEVICE = _Decl(
    0,
    fields=(
        ("driver", _Decl(63)),
        ("allowMultipleAllocations", _Decl(1)),
        ("attributes", _Decl(32, key=_DOMAIN, elem=_INNER_ATTRIBUTES)),
        ("capacity", _Decl(32, key=_DOMAIN, elem=_INNER_CAPACITY)),
    ),
)


class _Path:
    """A Go []string as cel-go's coster builds paths: `append` writes into spare capacity of
    the shared array. The two iteration variables of a two-variable comprehension append
    "@keys" and then "@values" to the same range path, so when it has spare capacity the key
    variable's path reads "@values" too (checker/cost.go pushIterKey / pushIterValue); the
    estimate kube-apiserver computes depends on that, so we reproduce it."""

    __slots__ = ("array", "capacity", "length")

    def __init__(self, array: list[str], length: int, capacity: int) -> None:
        self.array, self.length, self.capacity = array, length, capacity

    @staticmethod
    def of(name: str) -> _Path:
        return _Path([name], 1, 1)  # []string{name}

    def append(self, name: str) -> _Path:
        if self.length < self.capacity:
            if len(self.array) > self.length:
                self.array[self.length] = name
            else:
                self.array.append(name)
            return _Path(self.array, self.length + 1, self.capacity)
        # growslice for 16-byte elements at these lengths: double (size classes are exact).
        capacity = max(1, self.capacity * 2)
        return _Path([*self.array[: self.length], name], self.length + 1, capacity)

    def items(self) -> tuple[str, ...]:
        return tuple(self.array[: self.length])


def _extend(path: _Path | None, name: str) -> _Path:
    """Go's append(path, name), a nil path included."""
    return path.append(name) if path is not None else _Path.of(name)


def _declared_size(go_path: _Path | None) -> Size | None:
    """Mirrors dynamic-resource-allocation/cel sizeEstimator.EstimateSize."""
    path = go_path.items() if go_path is not None else ()
    if not path or path[0] != "device":
        return None
    node = _DEVICE
    for name in path[1:]:
        if name in ("@items", "@values"):
            if node.elem is None:
                return None
            node = node.elem
        elif name == "@keys":
            if node.key is None:
                return None
            node = node.key
        else:
            found = dict(node.fields).get(name)
            if found is None:
                # Every attribute of an attribute map has the size of attributeType.
                if node.elem is _ATTRIBUTE:
                    node = _ATTRIBUTE
                    continue
                return None
            node = found
    return 0, node.max_elements


# ------------------------------------------------------------------ the walk


@dataclass(frozen=True)
class _Entry:
    """cel-go entrySizeEstimate: the key and value sizes of a list or map."""

    kind: str  # "list" or "map"
    key: Size
    val: Size

    def union(self, other: _Entry | None) -> _Entry | None:
        if other is None:
            return None
        return _Entry(self.kind, _union(self.key, other.key), _union(self.val, other.val))


@dataclass(frozen=True)
class _Info:
    cost: int
    type: Type = DYN
    size: Size | None = None  # cel-go computeSize; None: unknown
    path: _Path | None = None
    entry: _Entry | None = None
    literal: object = None  # the value of a literal int (nodeAsUintValue)

    @property
    def sized(self) -> Size:
        """cel-go sizeOrUnknown."""
        return self.size if self.size is not None else UNKNOWN


@dataclass(frozen=True)
class _Var:
    type: Type
    path: _Path | None
    size: Size | None
    entry: _Entry | None = None


Scope = dict[str, _Var]

_DEVICE_FIELDS: dict[str, Type] = {
    "driver": "string",
    "allowMultipleAllocations": "bool",
    "attributes": ("map", "string", ("map", "string", DYN)),
    "capacity": ("map", "string", ("map", "string", "quantity")),
}
_NAMESPACES = frozenset({"cel", "lists", "sets", "strings", "math", "optional", "ip"})
_BOOL_FUNCTIONS = frozenset(
    {
        "startsWith", "endsWith", "contains", "matches", "isSorted", "isQuantity", "isSemver", "isIP",
        "isCIDR", "isURL", "isGreaterThan", "isLessThan", "isInteger", "isLoopback", "isUnspecified",
        "isGlobalUnicast", "isLinkLocalUnicast", "isLinkLocalMulticast", "containsIP", "containsCIDR",
        "isCanonical", "hasValue", "has", "all", "exists", "exists_one", "existsOne", "includes",
        "intersects", "equivalent", "!_", "_&&_", "_||_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_",
        "@in", "@not_strictly_false",
    }
)  # fmt: skip
_INT_FUNCTIONS = frozenset(
    {"size", "indexOf", "lastIndexOf", "asInteger", "major", "minor", "patch", "compareTo", "sign", "family",
     "prefixLength", "int"}
)  # fmt: skip
_STRING_FUNCTIONS = frozenset(
    {"lowerAscii", "upperAscii", "trim", "replace", "substring", "charAt", "join", "format", "quote", "find",
     "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "string"}
)  # fmt: skip
_SAME_AS_TARGET = frozenset({"sort", "reverse", "distinct", "slice", "filter", "sortBy", "add", "sub"})


# The first kube-apiserver release built with cel-go >= 0.27 (1.37 has v0.29.2, 1.34-1.36 have
# v0.26.0), whose checker prices the global `matches(s, re)` like `s.matches(re)`; before it,
# the global form cost 1 (checker/cost.go functionCost, case overloads.Matches).
GLOBAL_MATCHES_PRICED: Final[KubernetesVersion] = (1, 37)


def estimate(tree: Node, release: KubernetesVersion = NEWEST_KNOWN) -> int:
    """The maximum estimated cost of the expression, as kube-apiserver of `release` computes it."""
    return _Coster(global_matches_priced=release >= GLOBAL_MATCHES_PRICED).visit(tree, {}).cost


def _items_size(listed: _Info) -> Size | None:
    """library/cost.go listElementNode: a fresh copy of the list's path plus "@items"."""
    if listed.path is None:
        return None
    return _declared_size(
        _Path.of("@items") if not listed.path.items() else _copy_with(listed.path, "@items")
    )


def _copy_with(path: _Path, name: str) -> _Path:
    items = [*path.items(), name]
    return _Path(items, len(items), len(items))


def _scalar_size(kind: Type) -> Size | None:
    """cel-go computeTypeSize: scalars have size 1."""
    return (1, 1) if kind in SCALARS else None


def _elem(kind: Type) -> Type:
    return kind[1] if isinstance(kind, tuple) and kind[0] == "list" else DYN


def _is(kind: Type, *names: str) -> bool:
    head = kind[0] if isinstance(kind, tuple) else kind
    return head in names


class _Coster:
    def __init__(self, global_matches_priced: bool) -> None:
        self.global_matches_priced = global_matches_priced

    def visit(self, node: Node, scope: Scope) -> _Info:
        if isinstance(node, Literal):
            return self.literal(node)
        if isinstance(node, Ident):
            return self.ident(node, scope)
        if isinstance(node, Select):
            return self.select(node, scope)
        if isinstance(node, Index):
            return self.index(node, scope)
        if isinstance(node, ListLit):
            return self.create_list(node, scope)
        if isinstance(node, MapLit):
            return self.create_map(node, scope)
        if isinstance(node, StructLit):
            # checker costCreateStruct
            total = STRUCT_CREATE
            for _, value in node.fields:
                total = _add(total, self.visit(value, scope).cost)
            return _Info(total, node.type_name)
        assert isinstance(node, Call)
        return self.call(node, scope)

    # ---------------------------------------------------------------- leaves

    def literal(self, node: Literal) -> _Info:
        # checker constCost and computeExprSize (strings count runes, scalars are 1).
        size = len(node.value) if isinstance(node.value, str | bytes) else 1
        literal = node.value if node.kind == "int" else None
        return _Info(0, node.kind, (size, size), literal=literal)

    def ident(self, node: Ident, scope: Scope) -> _Info:
        # checker costIdent and computeSize (declared size, scalar, then the variable's own).
        var = scope.get(node.name)
        if var is None:
            kind: Type = "device" if node.name == "device" else DYN
            path = _Path.of(node.name)
            return _Info(1, kind, _declared_size(path) or _scalar_size(kind), path)
        size = _declared_size(var.path) or _scalar_size(var.type) or var.size
        return _Info(1, var.type, size, var.path, var.entry)

    def select(self, node: Select, scope: Scope) -> _Info:
        # checker costSelect: +1 only when selecting from a map or a message.
        operand = self.visit(node.operand, scope)
        if node.optional:
            # `a.?b` is the call _?._ (default cost 1).
            return _Info(_add(operand.cost, 1), "optional")
        cost = operand.cost
        if _is(operand.type, "map", "device") or (isinstance(operand.type, str) and "." in operand.type):
            cost = _add(cost, 1)
        kind: Type = DYN
        if operand.type == "device":
            kind = _DEVICE_FIELDS.get(node.field, DYN)
        elif _is(operand.type, "map") and isinstance(operand.type, tuple):
            kind = operand.type[2]
        path = _extend(operand.path, node.field)
        return _Info(cost, kind, _declared_size(path) or _scalar_size(kind), path)

    def index(self, node: Index, scope: Scope) -> _Info:
        # checker costCall for index_list / index_map: default cost, the entry's value size.
        operand = self.visit(node.operand, scope)
        key = self.visit(node.index, scope)
        cost = _add(_add(operand.cost, key.cost), 1)
        if node.optional:
            return _Info(cost, "optional")
        if _is(operand.type, "list"):
            kind, step = _elem(operand.type), "@items"
        elif _is(operand.type, "map") and isinstance(operand.type, tuple):
            kind, step = operand.type[2], "@values"
        else:
            kind, step = DYN, "@values"
        path = _extend(operand.path, step)
        size = operand.entry.val if operand.entry is not None else None
        if size is None:
            size = _declared_size(path) or _scalar_size(kind)
        return _Info(cost, kind, size, path)

    def create_list(self, node: ListLit, scope: Scope) -> _Info:
        # checker costCreateList: base cost, entry size is the union of the items' sizes.
        total = LIST_CREATE
        item_size: Size = (U64, 0) if node.items else (0, 0)
        kinds: list[Type] = []
        for item in node.items:
            info = self.visit(item, scope)
            total = _add(total, info.cost)
            item_size = _union(item_size, info.sized)
            kinds.append(info.type)
        elem = kinds[0] if kinds and all(k == kinds[0] for k in kinds) else DYN
        count = len(node.items)
        return _Info(total, ("list", elem), (count, count), entry=_Entry("list", (1, 1), item_size))

    def create_map(self, node: MapLit, scope: Scope) -> _Info:
        # checker costCreateMap
        total = MAP_CREATE
        empty: Size = (0, 0) if not node.entries else (U64, 0)
        key_size, val_size = empty, empty
        key_type: Type = DYN
        val_type: Type = DYN
        for key, value in node.entries:
            k, v = self.visit(key, scope), self.visit(value, scope)
            total = _add(_add(total, k.cost), v.cost)
            key_size, val_size = _union(key_size, k.sized), _union(val_size, v.sized)
            key_type, val_type = k.type, v.type
        count = len(node.entries)
        kind: Type = ("map", str(key_type), val_type) if isinstance(val_type, str) else ("map", str(key_type))
        return _Info(total, kind, (count, count), entry=_Entry("map", key_size, val_size))

    # ---------------------------------------------------------------- calls

    def call(self, node: Call, scope: Scope) -> _Info:
        target = node.target
        namespaced = isinstance(target, Ident) and target.name in _NAMESPACES and target.name not in scope
        if namespaced and isinstance(target, Ident) and target.name == "cel" and node.name == "bind":
            return self.bind(node, scope)
        if target is not None and not namespaced and node.args and isinstance(node.args[0], Ident):
            comprehension = self.comprehension(node, scope)
            if comprehension is not None:
                return comprehension
        if node.name == "has" and target is None and len(node.args) == 1 and isinstance(node.args[0], Select):
            # checker costSelect for a presence test: presenceTestCost + the operand; Kubernetes'
            # base environment sets PresenceTestHasCost(false) (environment/base.go), so 0.
            operand = self.visit(node.args[0].operand, scope)
            return _Info(operand.cost, "bool", (1, 1))
        if node.name == "dyn" and target is None and len(node.args) == 1:
            # checker maybeUnwrapDynCall: 1 + the argument, sizes copied.
            arg = self.visit(node.args[0], scope)
            return replace(arg, cost=_add(arg.cost, 1), type=DYN)
        args = [self.visit(arg, scope) for arg in node.args]
        recv = self.visit(target, scope) if target is not None and not namespaced else None
        name = f"{target.name}.{node.name}" if namespaced and isinstance(target, Ident) else node.name
        arg_sum = 0
        for arg in args:
            arg_sum = _add(arg_sum, arg.cost)
        base = recv.cost if recv is not None else 0
        fn_cost, size, entry = self.function(node, name, recv, args)
        kind = self.result_type(name, recv, args)
        if size is None:
            size = _scalar_size(kind)
        return _Info(_add(base, _add(fn_cost, arg_sum)), kind, size, entry=entry)

    def result_type(self, name: str, recv: _Info | None, args: list[_Info]) -> Type:
        bare = name.rpartition(".")[2]
        if name in ("_?_:_",):
            return args[1].type if args[1].type == args[2].type else DYN
        if name in ("_+_", "_-_", "_*_", "_/_", "_%_", "-_"):
            kinds = {arg.type for arg in args} - {DYN}
            return kinds.pop() if len(kinds) == 1 else DYN
        if bare in _BOOL_FUNCTIONS:
            return "bool"
        if bare in _INT_FUNCTIONS:
            return "int"
        if bare in _STRING_FUNCTIONS:
            return "string"
        if bare in ("split", "findAll"):
            return ("list", "string")
        if name == "lists.range":
            return ("list", "int")
        if bare in ("quantity", "semver", "url", "cidr", "double", "uint", "bytes"):
            return bare
        if bare == "ip":
            return "ip"
        if bare == "masked":
            return "cidr"
        if bare == "asApproximateFloat":
            return "double"
        if bare == "getQuery":
            return ("map", "string", ("list", "string"))
        if bare in _SAME_AS_TARGET and recv is not None:
            return recv.type
        return DYN

    def function(
        self, node: Call, name: str, recv: _Info | None, args: list[_Info]
    ) -> tuple[int, Size | None, _Entry | None]:
        """(call cost without its arguments, result size, entry size), upstream's precedence:
        ext.Lists overload estimators, then Kubernetes' library.CostEstimator, then cel-go's
        checker functionCost, else the default cost of 1."""
        # --- ext.Lists v3 (ext/lists.go) --------------------------------------------------
        if recv is not None and _is(recv.type, "list", DYN):
            listed = self.ext_lists(name, recv, args)
            if listed is not None:
                return listed
        if name == "lists.range" and len(args) == 1:
            # estimateListsRange: an allocating list call of the literal size.
            n = args[0].literal if isinstance(args[0].literal, int) else U64
            n = max(n, 0)
            return _add(_add(n, 1), LIST_CREATE), (n, n), None
        if name in ("sets.contains", "sets.intersects", "sets.equivalent") and len(args) == 2:
            # ext/sets.go estimateSetsCost: |a| * |b| * factor (2 for equivalent) + 1.
            factor = 2.0 if name == "sets.equivalent" else 1.0
            return _add(_factor(_mul(args[0].sized[1], args[1].sized[1]), factor), 1), None, None
        # --- Kubernetes library.CostEstimator.EstimateCallCost -----------------------------
        kube = self.kubernetes(node, name, recv, args)
        if kube is not None:
            return kube
        # --- cel-go checker functionCost ---------------------------------------------------
        return self.builtin(node, name, recv, args)

    def ext_lists(
        self, name: str, recv: _Info, args: list[_Info]
    ) -> tuple[int, Size | None, _Entry | None] | None:
        n = recv.sized
        if name == "sort" and not args:
            return self.sort_cost(n, _elem(recv.type))
        if name == "distinct" and not args:
            # estimateListDistinct: O(n^2), factor 2; the result size is n^2 as well.
            square = _size_mul(n, n)
            return _add(_add(_factor(square[1], 2.0), 1), LIST_CREATE), square, None
        if name == "reverse" and not args and _is(recv.type, "list"):
            return _add(_add(_factor(n[1], 1.0), 1), LIST_CREATE), n, None
        if name == "slice" and len(args) == 2:
            start = args[0].literal if isinstance(args[0].literal, int) else 0
            end = args[1].literal if isinstance(args[1].literal, int) else n[1]
            length = max(end - max(start, 0), 0) if end is not None else 0
            return _add(_add(length, 1), LIST_CREATE), (length, length), None
        if name == "flatten" and len(args) <= 1:
            depth = 1
            if args:
                depth = args[0].literal if isinstance(args[0].literal, int) else U64
            return _add(_add(_factor(n[1], float(depth)), 1), LIST_CREATE), n, None
        return None

    @staticmethod
    def sort_cost(n: Size, elem: Type) -> tuple[int, Size | None, _Entry | None]:
        """ext/lists.go estimateListSortCost: O(n^2) with factor 2 (+0.1 for strings); the
        estimated result size is n^2 too."""
        # A dyn element type matches every comparable overload, the string one the dearest.
        factor = 2.0 + (STRING_TRAVERSAL if elem in ("string", "bytes", DYN) else 0.0)
        square = _size_mul(n, n)
        return _add(_add(_factor(square[1], factor), 1), LIST_CREATE), square, None

    def kubernetes(
        self, node: Call, name: str, recv: _Info | None, args: list[_Info]
    ) -> tuple[int, Size | None, _Entry | None] | None:
        """library/cost.go CostEstimator.EstimateCallCost, by function name."""
        if (
            name in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf", "includes")
            and recv is not None
        ):
            if _is(recv.type, "list"):
                # One per element, plus the traversal of string elements (listElementNode).
                el_cost = 1
                elem = _elem(recv.type)
                if elem in ("string", "bytes"):
                    item = _items_size(recv)
                    el_cost = _add(el_cost, _factor((item or UNKNOWN)[1], STRING_TRAVERSAL))
                return _mul(recv.sized[1], el_cost), None, None
            if name == "includes":
                return recv.sized[1], None, None
            return _factor(recv.sized[1], STRING_TRAVERSAL), None, None
        if name == "url" and recv is None and len(args) == 1:
            size = args[0].sized
            return _factor(size[1], STRING_TRAVERSAL), size, None
        if name in ("lowerAscii", "upperAscii", "substring", "trim") and recv is not None:
            size = recv.sized
            return _factor(size[1], STRING_TRAVERSAL), size, None
        if name == "replace" and recv is not None and len(args) >= 2:
            return self.replace_cost(recv.sized, args[0].sized, args[1].sized)
        if name == "split" and recv is not None:
            size = recv.sized
            limit = size[1]
            if len(args) > 1 and isinstance(args[1].literal, int):
                limit = args[1].literal % 2**64
            return _factor(size[1], 2 * STRING_TRAVERSAL), (0, limit), None
        if name == "join" and recv is not None:
            listed = recv.sized
            joined: Size = (0, 0)
            if _is(recv.type, "list"):
                item = _items_size(recv)
                joined = _size_mul(listed, item or UNKNOWN)
            if args:
                separators = (max(listed[0] - 1, 0), max(listed[1] - 1, 0))
                joined = _size_add(joined, _size_mul(args[0].sized, separators))
            return _factor(joined[1], STRING_TRAVERSAL), joined, None
        if name in ("find", "findAll") and recv is not None and args:
            size = recv.sized
            string_cost = _factor(_add(size[1], 1), STRING_TRAVERSAL)
            regex_cost = _factor(args[0].sized[1], REGEX_LENGTH)
            return _mul(string_cost, regex_cost), (0, size[1]), None
        if name in ("cidr", "isIP", "isCIDR") and recv is None and args:
            return _factor(args[0].sized[1], STRING_TRAVERSAL), None, None
        if name == "ip":
            if recv is not None:
                return 1, None, None  # cidr_ip: a field access
            if args:
                return _factor(args[0].sized[1], STRING_TRAVERSAL), None, None
        if name == "ip.isCanonical" and args:
            return _factor(args[0].sized[1], 2 * STRING_TRAVERSAL), None, None
        if name in (
            "masked", "prefixLength", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast",
            "isLinkLocalUnicast", "isGlobalUnicast", "sign", "asInteger", "isInteger", "asApproximateFloat",
            "isGreaterThan", "isLessThan", "compareTo", "add", "sub", "major", "minor", "patch", "getScheme",
            "getHostname", "getHost", "getPort", "getEscapedPath", "getQuery",
        ):  # fmt: skip
            return 1, None, None
        if name in ("containsIP", "containsCIDR") and recv is not None and args:
            # Two 4- or 16-byte IPs compared: ceil((16 + 16) * 0.1); CIDRs traverse once more, +1.
            cost = _factor(32, STRING_TRAVERSAL)
            if name == "containsCIDR":
                cost = _add(_add(cost, _factor(16, STRING_TRAVERSAL)), 1)
            if args[0].type == "string":
                cost = _add(cost, _factor(args[0].sized[1], STRING_TRAVERSAL))
            return cost, None, None
        if name in ("quantity", "isQuantity", "semver", "isSemver") and recv is None and args:
            return _factor(args[0].sized[1], STRING_TRAVERSAL), None, None
        if name == "_==_" and len(args) == 2 and args[0].type == args[1].type:
            if args[0].type in ("ip", "cidr", "quantity", "semver"):
                return 1, None, None
            if args[0].type == "url":
                # Upstream takes rhs' size for both sides.
                rhs = args[1].size or (1, 1)
                return _factor(rhs[1], STRING_TRAVERSAL), None, None
        return None

    @staticmethod
    def replace_cost(size: Size, old: Size, new: Size) -> tuple[int, Size | None, _Entry | None]:
        """library/cost.go EstimateCallCost "replace"."""
        if old[0] == 0:
            count_max = _add(size[1], 1) if size[1] < U64 else size[1]
            retained_max = size[1]
        elif new[1] <= old[0]:
            count_max, retained_max = 0, size[1]
        else:
            count_max, retained_max = math.ceil(size[1] / old[0]), 0
        if old[1] == 0:
            count_min = _add(size[0], 1) if size[0] < U64 else size[0]
            retained_min = size[0]
        elif old[1] <= new[0]:
            count_min, retained_min = 0, size[0]
        else:
            count_min, retained_min = math.ceil(size[0] / old[1]), 0
        result = _size_add(_size_mul((count_min, count_max), new), (retained_min, retained_max))
        return _factor(size[1], 2 * STRING_TRAVERSAL), result, None

    def builtin(
        self, node: Call, name: str, recv: _Info | None, args: list[_Info]
    ) -> tuple[int, Size | None, _Entry | None]:
        """cel-go checker functionCost's own cases; anything else costs 1."""
        if name == "format" and recv is not None:
            return _factor(recv.sized[1], STRING_TRAVERSAL), None, None
        if name == "strings.quote" and len(args) == 1:
            size = args[0].sized
            return _factor(size[1], STRING_TRAVERSAL), (size[0] + 2, _add(_mul(size[1], 2), 2)), None
        if name in ("startsWith", "endsWith") and len(args) == 1:
            return _factor(args[0].sized[1], STRING_TRAVERSAL), None, None
        if name == "@in" and len(args) == 2 and _is(args[1].type, "list", DYN):
            return args[1].sized[1], None, None
        global_matches = len(args) == 2 and recv is None and self.global_matches_priced
        if name == "matches" and ((len(args) == 1 and recv is not None) or global_matches):
            string, regex = (recv, args[0]) if recv is not None else (args[0], args[1])
            assert string is not None
            string_cost = _factor(_add(string.sized[1], 1), STRING_TRAVERSAL)
            return _mul(string_cost, _factor(regex.sized[1], REGEX_LENGTH)), None, None
        if name == "contains" and recv is not None and len(args) == 1:
            return (
                _mul(_factor(recv.sized[1], STRING_TRAVERSAL), _factor(args[0].sized[1], STRING_TRAVERSAL)),
                None,
                None,
            )
        if name in ("_&&_", "_||_"):
            # LogicalAnd / LogicalOr: the operands only, no call cost (argument costs are
            # added by the caller).
            return 0, None, None
        if name == "_?_:_" and len(args) == 3:
            # Conditional: the condition plus the costlier branch; sizes and entries united.
            size = _union(args[1].sized, args[2].sized)
            entry = args[1].entry.union(args[2].entry) if args[1].entry is not None else None
            extra = max(args[1].cost, args[2].cost) - args[1].cost - args[2].cost
            return extra, size, entry
        if name == "_+_" and len(args) == 2:
            lhs, rhs = args
            if _is(lhs.type, "list") or _is(rhs.type, "list"):
                entry = lhs.entry.union(rhs.entry) if lhs.entry is not None else None
                return 1, _size_add(lhs.sized, rhs.sized), entry
            if (
                lhs.type in ("string", "bytes")
                or rhs.type in ("string", "bytes")
                or (lhs.type == rhs.type == DYN)
            ):
                size = _size_add(lhs.sized, rhs.sized)
                return _factor(size[1], STRING_TRAVERSAL), size, None
            return 1, None, None
        if name in ("_<_", "_>_", "_<=_", "_>=_", "_==_", "_!=_") and len(args) == 2:
            lhs, rhs = args
            textual = {"string", "bytes", DYN}
            if name in ("_==_", "_!=_") or (lhs.type in textual and rhs.type in textual):
                smallest = min(lhs.sized[1], rhs.sized[1])
                return _factor(smallest, STRING_TRAVERSAL), None, None
            return 1, None, None
        return 1, None, None

    # ---------------------------------------------------------------- comprehensions

    def bind(self, node: Call, scope: Scope) -> _Info:
        """checker costBind: the empty iteration range (a list, 10), the init, the result."""
        if len(node.args) != 3 or not isinstance(node.args[0], Ident):
            return _Info(U64)
        init = self.visit(node.args[1], scope)
        inner = dict(scope)
        inner[node.args[0].name] = _Var(init.type, init.path, init.size, init.entry)
        body = self.visit(node.args[2], inner)
        return replace(body, cost=_add(_add(LIST_CREATE, init.cost), body.cost), path=None, literal=None)

    def comprehension(self, node: Call, scope: Scope) -> _Info | None:
        """checker costComprehension over each macro's expansion; None if not a macro."""
        assert node.target is not None
        name, args = node.name, node.args
        names_ok = all(isinstance(arg, Ident) for arg in args[:2])
        two = names_ok and (
            (name in ("all", "exists", "existsOne") and len(args) == 3)
            or (name in ("transformList", "transformMap", "transformMapEntry") and len(args) in (3, 4))
        )
        one = (name in ("all", "exists", "exists_one", "filter", "sortBy") and len(args) == 2) or (
            name == "map" and len(args) in (2, 3)
        )
        if not (one or two):
            return None
        if name == "sortBy":
            return self.sort_by(node, scope)
        target = self.visit(node.target, scope)
        inner = dict(scope)
        first = args[0]
        assert isinstance(first, Ident)
        entry = target.entry
        container = entry.kind if entry is not None else ("list" if _is(target.type, "list") else "map")
        key_type, val_type = self._element_types(target.type)
        base = target.path
        if two:
            second = args[1]
            assert isinstance(second, Ident)
            # pushIterKey / pushIterValue
            key_step, val_step = ("@indices", "@items") if container == "list" else ("@keys", "@values")
            inner[first.name] = _Var(
                "int" if container == "list" else key_type,
                _extend(base, key_step),
                entry.key if entry is not None else None,
            )
            inner[second.name] = _Var(
                val_type, _extend(base, val_step), entry.val if entry is not None else None
            )
            body_args = args[2:]
        else:
            # pushIterSingle: a list's items, a map's keys.
            if container == "list":
                inner[first.name] = _Var(
                    val_type, _extend(base, "@items"), entry.val if entry is not None else None
                )
            else:
                inner[first.name] = _Var(
                    key_type, _extend(base, "@keys"), entry.key if entry is not None else None
                )
            body_args = args[1:]
        bodies = [self.visit(arg, inner) for arg in body_args]
        count = target.sized[1]
        accu_list: _Entry = _Entry("list", (1, 1), (0, 0))
        if name in ("all", "exists"):
            # cond @not_strictly_false(accu) (2) or @not_strictly_false(!accu) (3); step accu && p.
            cond = 2 if name == "all" else 3
            per = _add(_add(cond, 1), bodies[0].cost)
            total = _add(_add(target.cost, 1), _mul(count, per))
            return _Info(total, "bool", (1, 1))
        if name in ("exists_one", "existsOne"):
            # step p ? accu + 1 : accu (p + 2); result accu == 1 (2).
            per = _add(bodies[0].cost, 2)
            return _Info(_add(_add(target.cost, 2), _mul(count, per)), "bool", (1, 1))
        if name in ("map", "transformList", "filter"):
            if name == "filter":
                # step p ? accu + [x] : accu
                item = inner[first.name]
                item_size = _declared_size(item.path) or _scalar_size(item.type) or item.size or UNKNOWN
                per = _add(bodies[0].cost, 12 + 1)
                result_type: Type = target.type
                val = item_size
            else:
                fn = bodies[-1]
                per = _add(12, fn.cost)
                if len(bodies) == 2:
                    per = _add(per, bodies[0].cost)
                result_type = ("list", fn.type) if isinstance(fn.type, str) else ("list", DYN)
                val = fn.sized
            total = _add(_add(_add(target.cost, LIST_CREATE), 1), _mul(count, per))
            return _Info(
                total, result_type, (count, count), entry=accu_list.union(_Entry("list", (1, 1), val))
            )
        # transformMap (mapInsert(accu, k, e): 3 + e) and transformMapEntry (mapInsert(accu, e): 2 + e).
        fn = bodies[-1]
        per = _add(3 if name == "transformMap" else 2, fn.cost)
        if len(bodies) == 2:
            per = _add(per, bodies[0].cost)
        total = _add(_add(_add(target.cost, MAP_CREATE), 1), _mul(count, per))
        # The checker's result type, which e.g. upstream's O(1) Quantity `==` needs: a map of
        # the key variable's type to the transform's (transformMap), or the produced map's.
        if name == "transformMap":
            key_kind = inner[first.name].type
            result_map: Type = ("map", key_kind if isinstance(key_kind, str) else DYN, fn.type)
        else:
            result_map = fn.type if _is(fn.type, "map") else ("map", DYN, DYN)
        return _Info(total, result_map, (count, count))

    @staticmethod
    def _element_types(kind: Type) -> tuple[Type, Type]:
        if isinstance(kind, tuple) and kind[0] == "list":
            return "int", kind[1]
        if isinstance(kind, tuple) and kind[0] == "map" and len(kind) == 3:
            return kind[1], kind[2]
        return DYN, DYN

    def sort_by(self, node: Call, scope: Scope) -> _Info:
        """ext/lists.go sortByMacro: cel.bind(@in, target, @in.@sortByAssociatedKeys(@in.map(x, key))),
        costed as costBind + the map comprehension + estimateListSortBy."""
        assert node.target is not None and isinstance(node.args[0], Ident)
        target = self.visit(node.target, scope)
        var = _Var(target.type, target.path, target.size, target.entry)
        ident_size = _declared_size(var.path) or _scalar_size(var.type) or var.size or UNKNOWN
        inner = dict(scope)
        container_entry = var.entry
        item_path = _extend(var.path, "@items")
        inner[node.args[0].name] = _Var(
            _elem(target.type), item_path, container_entry.val if container_entry is not None else None
        )
        key = self.visit(node.args[1], inner)
        count = ident_size[1]
        mapped = _add(_add(_add(1, LIST_CREATE), 1), _mul(count, _add(12, key.cost)))
        sort_cost, size, _ = self.sort_cost(ident_size, key.type)
        result = _add(_add(1, mapped), sort_cost)
        return _Info(_add(_add(LIST_CREATE, target.cost), result), target.type, size)
