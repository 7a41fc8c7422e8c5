"""Static facts about a selector, derived from our own parse of it.

* `reads`: the (field, domain, id) parts of the device the expression can observe. If the
  expression only reads those, its result depends only on them and the driver, so results
  can be shared between devices that agree on them (identical GPUs differing only in name,
  UUID or index). `None` means "cannot tell" (e.g. `device` passed around whole), and then
  nothing is memoized. An id or domain of "*" means "all of it".
* `domains`: literal domains the expression indexes in attributes/capacity.
* `cost`: the worst-case cost estimate kube-apiserver computes (cel-go's checker estimator
  with Kubernetes' and DRA's size rules, ported in `controller.cel.cost`), compared with
  the same 1,000,000 limit.
* `problems`: compile-time rejections the engines would not make on their own but upstream
  does (unknown `device` fields, invalid regex literals).

Size: one module because every fact is computed in one walk over the same tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from controller.cel import cost as costmodel
from controller.cel import regexlib, syntax
from controller.cel.errors import CompileError
from controller.cel.syntax import Call, Ident, Index, ListLit, Literal, MapLit, Node, Select, StructLit

DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
MACROS = ("all", "exists", "exists_one", "map", "filter")
# cel-go's ext.TwoVarComprehensions (Kubernetes base environment since 1.32) and ext.Lists' sortBy.
TWO_VAR_MACROS = ("all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry")
BINDING_MACROS = (*MACROS, *TWO_VAR_MACROS[2:], "sortBy")
WILDCARD = "*"
_NAMESPACES = ("cel", "lists", "sets", "strings", "math", "optional")
# Functions whose name has a dot although their first part is also a function (`ip(...)`).
_NAMESPACED_FUNCTIONS = frozenset({"ip.isCanonical"})

Read = tuple[str, str, str]
_STRING_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')


@dataclass(frozen=True, slots=True)
class Analysis:
    domains: frozenset[str]
    reads: tuple[Read, ...] | None
    cost: int
    features: frozenset[str] = frozenset()
    # Function names called (receiver-style and global) and free identifiers other than `device`.
    calls: frozenset[str] = frozenset()
    free_names: frozenset[str] = frozenset()
    # The result type when it is evident from the syntax alone (a literal, arithmetic), else None.
    evident_type: str | None = None
    # Domain lookups `device.attributes[d]` / `device.capacity.d` (outside has()), as offsets
    # (start of `device`, start of `[d]` / `.d`, end), for engines that must rewrite them.
    domain_lookups: tuple[tuple[int, int, int], ...] = ()
    # How many comprehensions the expression expands to (macros, sortBy and cel.bind).
    loops: int = 0


def analyze(expression: str) -> Analysis:
    """Facts about the expression; CompileError for upstream-only compile rejections."""
    try:
        tree = syntax.parse(expression)
    except RecursionError:
        raise CompileError("expression nesting too deep") from None
    collector = _Reads(expression)
    try:
        collector.visit(tree, frozenset())
        cost = costmodel.estimate(tree)
    except RecursionError:
        raise CompileError("expression nesting too deep") from None
    reads = None if collector.unknown else tuple(sorted(collector.reads))
    calls = frozenset(
        node.name for node in syntax.walk(tree) if isinstance(node, Call) and node.name[0] not in "_!-@"
    )
    return Analysis(
        frozenset(collector.domains),
        reads,
        cost,
        frozenset(features(tree)),
        calls,
        frozenset(collector.free),
        evident_type(tree),
        tuple(sorted(collector.lookups)),
        sum(
            1
            for node in syntax.walk(tree)
            if isinstance(node, Call) and (node.name in BINDING_MACROS or _is_bind(node))
        ),
    )


def for_release(info: Analysis, expression: str, release: tuple[int, int]) -> Analysis:
    """`info` with the cost a kube-apiserver of `release` estimates; `analyze` prices for the
    newest release, and older ones differ only in the global `matches(s, re)`."""
    if "matches" not in info.calls or release >= costmodel.GLOBAL_MATCHES_PRICED:
        return info
    return replace(info, cost=costmodel.estimate(syntax.parse(expression), release))


def evident_type(node: Node) -> str | None:
    path = _literal_device_path(node)
    if path is not None:
        if path == ["driver"]:
            return "string"
        if path == ["allowMultipleAllocations"]:
            return "bool"
        if len(path) == 3 and path[0] == "capacity":
            return "kubernetes.Quantity"
        if 1 <= len(path) <= 2 and path[0] in ("attributes", "capacity"):
            return "map"
        return None
    if isinstance(node, Literal):
        return node.kind if node.kind != "null" else "null_type"
    if isinstance(node, ListLit):
        return "list"
    if isinstance(node, MapLit):
        return "map"
    if isinstance(node, Call) and node.name in ("_+_", "_-_", "_*_", "_/_", "_%_", "-_"):
        kinds = {evident_type(arg) for arg in node.args} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    return None


def literal_strings(expression: str) -> frozenset[str]:
    """Every quoted string in the source, a coarse stand-in for `domains` without a parse."""
    return frozenset(a or b for a, b in _STRING_LITERAL.findall(expression))


def features(tree: Node) -> set[str]:
    """Named language features an expression uses (for engines that lack some)."""
    found: set[str] = set()
    for node in syntax.walk(tree):
        if isinstance(node, Select | Index) and node.optional:
            found.add("optional field selection (.?x / [?k])")
        elif isinstance(node, ListLit | MapLit) and (
            (isinstance(node, ListLit) and node.optional_items)
            or (isinstance(node, MapLit) and node.optional_entries)
        ):
            found.add("optional list/map entries")
        elif isinstance(node, StructLit):
            found.add("message construction")
        elif isinstance(node, Call):
            qualified = _call_name(node)
            if qualified == "cel.bind":
                found.add("cel.bind")
            elif qualified.startswith("optional.") or (
                node.target is not None and node.name in ("orValue", "hasValue", "or", "optMap", "optFlatMap")
            ):
                found.add("optional values")
            elif qualified.startswith("math."):
                found.add("math extension")
            elif qualified in _NAMESPACED_FUNCTIONS or _in_namespace(qualified, ("lists", "sets", "strings")):
                found.add("namespaced functions (lists.*, sets.*, strings.*, ip.isCanonical)")
            elif node.target is not None and _is_two_var(node):
                found.add("two-variable comprehensions")
            elif node.target is not None and node.name == "sortBy":
                found.add("sortBy")
            elif node.name in ("dyn", "type", "duration", "timestamp", "bytes") and node.target is None:
                found.add(f"{node.name}()")
    return found


def _literal_device_path(node: Node) -> list[str] | None:
    steps: list[str] = []
    while isinstance(node, Select | Index):
        if isinstance(node, Select):
            steps.append(node.field)
        elif isinstance(node.index, Literal) and isinstance(node.index.value, str):
            steps.append(node.index.value)
        else:
            return None
        node = node.operand
    if isinstance(node, Ident) and node.name == "device":
        return list(reversed(steps))
    return None


def _is_two_var(node: Call) -> bool:
    """`m.all(k, v, p)`, `l.transformList(i, v, [filter,] e)`: two bound names first."""
    if node.name not in TWO_VAR_MACROS or len(node.args) < 3:
        return False
    return all(isinstance(arg, Ident) for arg in node.args[:2]) and (
        node.name.startswith("transform") or len(node.args) == 3
    )


def _in_namespace(qualified: str, namespaces: tuple[str, ...]) -> bool:
    namespace, dot, _ = qualified.partition(".")
    return bool(dot) and namespace in namespaces


def _is_bind(node: Call) -> bool:
    return (
        node.name == "bind"
        and isinstance(node.target, Ident)
        and node.target.name == "cel"
        and len(node.args) == 3
    )


def _call_name(node: Call) -> str:
    if node.target is not None and isinstance(node.target, Ident):
        return f"{node.target.name}.{node.name}"
    return node.name


class _Reads:
    def __init__(self, source: str) -> None:
        self.source = source
        self.reads: set[Read] = set()
        self.domains: set[str] = set()
        self.unknown = False
        self.free: set[str] = set()
        self.lookups: set[tuple[int, int, int]] = set()

    def error(self, node: Node, message: str) -> CompileError:
        line, column = syntax.position(self.source, node.pos)
        return CompileError(message, line=line, column=column)

    def visit(self, node: Node, scope: frozenset[str]) -> None:
        path = self.device_path(node, scope)
        if path is not None:
            self.record(node, path, scope)
            return
        if isinstance(node, Ident) and node.name not in scope and node.name != "device":
            self.free.add(node.name)
        if isinstance(node, Call):
            self.check_regex(node)
            if _is_bind(node) and isinstance(node.args[0], Ident):
                self.visit(node.args[1], scope)
                self.visit(node.args[2], scope | {node.args[0].name})
                return
            if (
                isinstance(node.target, Ident)
                and (node.target.name in _NAMESPACES or _call_name(node) in _NAMESPACED_FUNCTIONS)
                and node.target.name not in scope
            ):
                for arg in node.args:
                    self.visit(arg, scope)
                return
            if (
                node.target is not None
                and node.name in BINDING_MACROS
                and node.args
                and isinstance(node.args[0], Ident)
            ):
                self.visit(node.target, scope)
                names = node.args[:2] if _is_two_var(node) else node.args[:1]
                bound = {arg.name for arg in names if isinstance(arg, Ident)}
                for arg in node.args[1:]:
                    self.visit(arg, scope | bound)
                return
        for child in syntax.children(node):
            self.visit(child, scope)

    def device_path(self, node: Node, scope: frozenset[str]) -> list[Node | str] | None:
        """Keys from `device` down to `node` for a pure select/index chain, else None."""
        steps: list[Node | str] = []
        current = node
        chain: list[Select | Index] = []
        while isinstance(current, Select | Index):
            chain.append(current)
            if isinstance(current, Select):
                steps.append(current.field)
            elif isinstance(current.index, Literal) and isinstance(current.index.value, str):
                steps.append(current.index.value)
            else:
                steps.append(current.index)
            current = current.operand
        if isinstance(current, Call) and current.name == "has" and current.target is None:
            if len(current.args) != 1 or steps:
                return None
            before = set(self.lookups)
            path = self.device_path(current.args[0], scope)
            tested = current.args[0]
            if isinstance(tested, Select):
                self.lookups = before | {
                    span for span in self.lookups if span[1:] != (tested.pos, tested.end)
                }
            return path
        if not (isinstance(current, Ident) and current.name == "device" and "device" not in scope):
            return None
        chain.reverse()
        if len(chain) >= 2 and steps[-1] in ("attributes", "capacity") and not chain[1].optional:
            lookup = chain[1]
            self.lookups.add((current.pos, lookup.pos, lookup.end))
        return list(reversed(steps))

    def record(self, node: Node, path: list[Node | str], scope: frozenset[str]) -> None:
        for step in path:
            if isinstance(step, Node):
                self.visit(step, scope)
        if not path:
            self.unknown = True
            return
        head = path[0]
        if not isinstance(head, str):
            self.unknown = True
            return
        if head not in DEVICE_FIELDS:
            raise self.error(node, f"undefined field '{head}'")
        if head in ("driver", "allowMultipleAllocations"):
            self.reads.add((head, "", ""))
            return
        domain = path[1] if len(path) > 1 else WILDCARD
        ident = path[2] if len(path) > 2 else WILDCARD
        if not isinstance(domain, str):
            domain = WILDCARD
        elif domain != WILDCARD:
            self.domains.add(domain)
        if not isinstance(ident, str) or domain == WILDCARD:
            ident = WILDCARD
        self.reads.add((head, domain, ident))

    def check_regex(self, node: Call) -> None:
        if node.name not in ("matches", "find", "findAll"):
            return
        args = node.args if node.target is not None else node.args[1:]
        if args and isinstance(args[0], Literal) and isinstance(args[0].value, str):
            problem = regexlib.regex_error(args[0].value)
            if problem is not None:
                if node.name == "matches":
                    raise self.error(args[0], f"compilation failed: invalid matches argument ({problem})")
                raise self.error(args[0], f"compilation failed: {problem}")
