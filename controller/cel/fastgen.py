"""Python source for one DRA device selector: our AST (controller.cel.syntax) -> one function.

The function takes a resource.k8s.io/v1 device (JSON as dicts) and returns the selector's
bool, reading the device's attributes and capacities straight from it: no `device` view is
built. It is specialised for one driver (the driver's domain also answers to unqualified
attribute names). It either returns the exact bool the full engine (cel-expr-python)
returns, or raises `CelFailure` (a CEL runtime error) or `Unhandled` (see
controller.cel.fastruntime), after which the caller asks the full engine.

What is covered (else `Unsupported` at compile time, and the full engine runs everything):
literals (int, double, string, bool), `device.driver`, `device.allowMultipleAllocations`,
`device.attributes[d].id` / `[d][id]` and `device.capacity[d].id` with literal d and id,
`has()` of those, `&&`, `||` (with CEL's error absorption), `!`, `?:`, `==`, `!=`, `<`, `<=`,
`>`, `>=`, `in` a literal list of strings or ints, int `+ - * / %` and unary `-` (int64
overflow, division by zero), string `+`, `size`, `startsWith`, `endsWith`, `contains`,
`matches` with a literal pattern, `dyn`, `cel.bind`, and every function of controller.cel.library
that the full engine also runs in Python (quantity, semver, strings, regex, lists, IP/CIDR,
URL). Not covered: comprehensions (so there is no run-time cost to count), optionals, uint,
bytes, null, list and map values other than the `in` list, and whole-domain reads.

Like build_view with a read plan, the function first validates every entry the expression
can read, before evaluating anything: a malformed entry fails the device even where `||`
would never look at it, as it does in the full engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.cel import fastruntime as rt
from controller.cel.analysis import DEVICE_FIELDS, WILDCARD, Analysis
from controller.cel.device import ViewPlan
from controller.cel.engine_cpp import NATIVE_FUNCTIONS
from controller.cel.errors import LibraryError
from controller.cel.library import Function
from controller.cel.regexlib import compile_regex
from controller.cel.semver import Semver
from controller.cel.syntax import Call, Ident, Index, ListLit, Literal, Node, Select
from dracommon.quantity import Quantity


class Unsupported(Exception):
    """The expression uses something the compiled form does not cover."""


# Static kinds the generator tracks (None: only known at run time).
STR, INT, BOOL, DOUBLE, QUANTITY, LIST, MAP = "str", "int", "bool", "float", "quantity", "list", "map"
_PY_CLASS = {STR: "str", INT: "int", BOOL: "bool", DOUBLE: "float"}
_EQUALITY_CLASSES = "_EQ"  # str, int, bool, float: == agrees with CEL's on these
_ORDER_CLASSES = "_ORD"  # str, int, float
_RELATIONS = {"_==_": "==", "_!=_": "!=", "_<_": "<", "_<=_": "<=", "_>_": ">", "_>=_": ">="}
_NOT_CONSTANT = object()
_MACROS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter"})
# Comprehension iterations per evaluation past which the device goes to the full engine.
# cel-expr-python changes course after engine_cpp.ITERATION_LIMIT (10,000; it hands over to
# cel-python, or fails where that cannot run the expression). Our loops never exit early, so
# they run at least as many iterations as that engine does: below this, it never got there.
ITERATIONS = 9_000
_COMPARISONS = {"compareTo": "", "isGreaterThan": " > 0", "isLessThan": " < 0"}
_MAX_LOCALS = 200  # far below CPython's limits; a bigger expression stays on the full engine


@dataclass(frozen=True, slots=True)
class Value:
    """A generated expression (a local, a literal or a constant's name) and what is known of it."""

    code: str
    kind: str | None
    constant: object = _NOT_CONSTANT


@dataclass(frozen=True, slots=True)
class Binding:
    """A cel.bind name: its expression, and the names in scope where it was bound."""

    node: Node
    scope: dict[str, Binding | Value]


@dataclass(frozen=True, slots=True)
class Generated:
    source: str
    constants: dict[str, object]


def generate(tree: Node, info: Analysis, driver: str) -> Generated:
    """Source of `def selector(device)`; Unsupported when the expression is not covered."""
    if info.reads is None:
        raise Unsupported("reads unknown")
    comprehensions = info.loops > _binds(tree)
    whole = any(WILDCARD in (domain, ident) for _field, domain, ident in info.reads)
    return _Generator(info.reads, driver, whole_view=whole, loops=comprehensions).function(tree)


def _binds(tree: Node) -> int:
    from controller.cel import syntax

    return sum(1 for node in syntax.walk(tree) if isinstance(node, Call) and _is_bind(node, {}))


def _is_bind(node: Call, scope: Mapping[str, object]) -> bool:
    return (
        node.name == "bind"
        and isinstance(node.target, Ident)
        and node.target.name == "cel"
        and "cel" not in scope
        and len(node.args) == 3
        and isinstance(node.args[0], Ident)
    )


class _Generator:
    def __init__(
        self, reads: tuple[tuple[str, str, str], ...], driver: str, *, whole_view: bool, loops: bool
    ) -> None:
        self.driver = driver
        self.reads = reads
        # With a whole-domain read, the device view is built (build_view, with the read plan
        # the full engine uses) and read as maps; otherwise entries come from the JSON itself.
        self.whole_view = whole_view
        self.loops = loops
        self.lines: list[str] = []
        self.depth = 1
        self.count = 0
        self.constants: dict[str, object] = {}
        self.read_vars: dict[tuple[str, str, str], str] = {}
        self.scope: dict[str, Binding | Value] = {}

    # ------------------------------------------------------------------ plumbing

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def temp(self) -> str:
        self.count += 1
        if self.count > _MAX_LOCALS:
            raise Unsupported("expression too large")
        return f"t{self.count}"

    def constant(self, value: object, kind: str | None) -> Value:
        if isinstance(value, bool):
            return Value(repr(value), BOOL, value)
        if isinstance(value, int) and rt.INT64_MIN <= value <= rt.INT64_MAX:
            return Value(repr(value), INT, value)
        if isinstance(value, str):
            return Value(repr(value), STR, value)
        name = f"k{len(self.constants)}"
        self.constants[name] = value
        return Value(name, kind, value)

    def function(self, tree: Node) -> Generated:
        self.prologue()
        result = self.boolean(self.emit(tree))
        self.line(f"return {result}")
        header = (
            "def selector(device, _E=CelFailure, _F=Unhandled, _M=MISSING, _attr=attribute, _cap=capacity):"
        )
        return Generated("\n".join([header, *self.lines]), self.constants)

    def prologue(self) -> None:
        """Every entry the expression can read, validated up front (as build_view does)."""
        if self.loops:
            self.line("n = 0")  # comprehension iterations so far
        if self.whole_view:
            plan = self.constant(ViewPlan(self.reads, self.driver), None)
            self.line(f"V = view({self.driver!r}, device, {plan.code})")
            return
        self.line("if device.__class__ is not dict: raise _F")
        for name, table in (("A", "attributes"), ("C", "capacity")):
            self.line(f"{name} = device.get({table!r})")
            self.line(f"if {name} is None: {name} = EMPTY")
            self.line(f"elif {name}.__class__ is not dict: raise _F")
        for read in self.reads:
            field, domain, ident = read
            var = self.read_vars[read] = f"r{len(self.read_vars)}"
            if field == "allowMultipleAllocations":
                self.line(f"{var} = bool(device.get('allowMultipleAllocations', False))")
                continue
            if field not in ("attributes", "capacity"):
                continue
            table = "A" if field == "attributes" else "C"
            self.line(f"{var} = {table}.get({f'{domain}/{ident}'!r}, _M)")
            if domain == self.driver:
                # The unqualified spelling; with both present, the full engine decides which counts.
                self.line(f"if {var} is _M: {var} = {table}.get({ident!r}, _M)")
                self.line(f"elif {ident!r} in {table}: raise _F")
            if field == "capacity":
                self.line(f"if {var} is not _M: {var} = _cap({var})")
                continue
            # The usual string attribute without a call; every other shape through `attribute`.
            self.line(f"if {var} is not _M:")
            usual = f"{var}.__class__ is dict and len({var}) == 1 and {var}.get('string').__class__ is str"
            self.line(f"    if {usual}:")
            self.line(f"        {var} = {var}['string']")
            self.line(f"    else: {var} = _attr({var})")

    def boolean(self, value: Value) -> str:
        if value.kind != BOOL:
            self.line(f"if {value.code}.__class__ is not bool: raise _F")
        return value.code

    def require(self, value: Value, kind: str) -> None:
        if value.kind != kind:
            self.line(f"if {value.code}.__class__ is not {_PY_CLASS[kind]}: raise _F")

    def assign(self, code: str, kind: str | None) -> Value:
        var = self.temp()
        self.line(f"{var} = {code}")
        return Value(var, kind)

    # ------------------------------------------------------------------ nodes

    def emit(self, node: Node) -> Value:
        if isinstance(node, Literal):
            if node.kind in ("int", "string", "bool"):
                return self.constant(node.value, None)
            if node.kind == "double":
                return self.constant(node.value, DOUBLE)
            raise Unsupported(f"{node.kind} literal")
        if isinstance(node, Ident):
            bound = self.scope.get(node.name)
            if bound is not None:
                return self.bound_value(bound)
            if node.name == "device" and self.whole_view:
                return Value("V", MAP)
            raise Unsupported(f"identifier {node.name}")
        if isinstance(node, Select | Index):
            if self.whole_view or not _from_device(node, self.scope):
                return self.selection(node)
            return self.device_read(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, ListLit):
            return self.list_value(node)
        raise Unsupported(type(node).__name__)

    def bound_value(self, bound: Binding | Value) -> Value:
        if isinstance(bound, Value):
            return bound  # a comprehension variable
        outer, self.scope = self.scope, bound.scope
        try:
            return self.emit(bound.node)
        finally:
            self.scope = outer

    def selection(self, node: Select | Index) -> Value:
        """`x.f` and `x[i]` on a value: a map's key (missing: CEL's error) or a list's element."""
        if node.optional:
            raise Unsupported("optional selection")
        operand = self.emit(node.operand)
        key = self.constant(node.field, STR) if isinstance(node, Select) else self.emit(node.index)
        out = self.temp()
        if _is_domain_table(node.operand, self.scope):
            # device.attributes[d] / device.capacity[d]: an unknown domain is an empty map.
            self.require(key, STR)
            self.line(f"{out} = {operand.code}.get({key.code}, EMPTY)")
            return Value(out, MAP)
        self.line(f"{out} = item({operand.code}, {key.code})")
        return Value(out, None)

    def device_path(self, node: Node) -> list[str]:
        steps: list[str] = []
        while isinstance(node, Select | Index):
            if node.optional:
                raise Unsupported("optional selection")
            if isinstance(node, Select):
                steps.append(node.field)
            elif isinstance(node.index, Literal) and node.index.kind == "string":
                steps.append(str(node.index.value))
            else:
                raise Unsupported("computed index")
            node = node.operand
        if not (isinstance(node, Ident) and node.name == "device" and "device" not in self.scope):
            raise Unsupported("selection outside the device")
        steps.reverse()
        if not steps or steps[0] not in DEVICE_FIELDS:
            raise Unsupported("device field")
        return steps

    def read_var(self, steps: list[str]) -> tuple[str, str]:
        field = steps[0]
        if field in ("attributes", "capacity") and len(steps) == 3:
            read = (field, steps[1], steps[2])
        elif field == "allowMultipleAllocations" and len(steps) == 1:
            read = (field, "", "")
        else:
            raise Unsupported("device path")
        var = self.read_vars.get(read)
        if var is None:
            raise Unsupported("a read the analysis did not see")
        return field, var

    def device_read(self, node: Node) -> Value:
        steps = self.device_path(node)
        if steps == ["driver"]:
            return self.constant(self.driver, None)
        field, var = self.read_var(steps)
        if field == "allowMultipleAllocations":
            return Value(var, BOOL)
        self.line(f"if {var} is _M: raise _E")  # CEL's "no such key"
        return Value(var, QUANTITY if field == "capacity" else None)

    def call(self, node: Call) -> Value:
        name, args, target = node.name, node.args, node.target
        if name in ("_&&_", "_||_"):
            return self.logical(node, name == "_&&_")
        if name == "!_":
            return self.assign(f"not {self.boolean(self.emit(args[0]))}", BOOL)
        if name == "_?_:_":
            return self.conditional(node)
        if name in _RELATIONS:
            return self.relation(_RELATIONS[name], self.emit(args[0]), self.emit(args[1]))
        if name == "@in":
            return self.membership(args[0], args[1])
        if name in ("_+_", "_-_", "_*_", "_/_", "_%_"):
            return self.arithmetic(name[1], self.emit(args[0]), self.emit(args[1]))
        if name == "-_":
            value = self.emit(args[0])
            self.require(value, INT)
            self.line(f"if {value.code} == {rt.INT64_MIN}: raise _E")
            return self.assign(f"-{value.code}", INT)
        if name == "has" and target is None and len(args) == 1:
            return self.presence(args[0])
        if _is_bind(node, self.scope):
            return self.bind(node)
        if target is not None and name in _MACROS and args and isinstance(args[0], Ident):
            return self.comprehension(node)
        return self.function_call(node)

    def comprehension(self, node: Call) -> Value:
        """all / exists / exists_one / map / filter, with one variable or (all, exists,
        existsOne) two; `all`/`exists` absorb an element's error where another element
        decides, as cel-go's loop does; every iteration counts against ITERATIONS."""
        name, args = node.name, node.args
        assert node.target is not None
        two = len(args) == 3 and isinstance(args[1], Ident) and name in ("all", "exists", "existsOne")
        one = name in ("all", "exists", "exists_one", "filter") and len(args) == 2
        if not (two or one or (name == "map" and len(args) in (2, 3))):
            raise Unsupported(f"macro {name} with {len(args)} arguments")
        names = [arg.name for arg in args[: 2 if two else 1] if isinstance(arg, Ident)]
        body = args[2 if two else 1 :]
        target = self.emit(node.target)
        if two:
            items = self.assign(f"pairs({target.code})", None)
        else:
            self.line(
                f"if {target.code}.__class__ is not list and {target.code}.__class__ is not dict: raise _F"
            )
            items = target
        variables = [self.temp() for _ in names]
        out, failed = self.temp(), self.temp()
        kind = {"all": BOOL, "exists": BOOL, "exists_one": BOOL, "existsOne": BOOL}.get(name, LIST)
        start = {"all": "True", "exists": "False"}.get(name, "0" if kind == BOOL else "[]")
        self.line(f"{out} = {start}")
        if name in ("all", "exists"):
            self.line(f"{failed} = False")
        self.line(f"for {', '.join(variables)} in {items.code}:")
        self.depth += 1
        self.line("n += 1")
        self.line(f"if n > {ITERATIONS}: raise _F")
        saved = {n: self.scope.get(n) for n in names}
        for cel_name, var in zip(names, variables, strict=True):
            self.scope[cel_name] = Value(var, None)
        try:
            self.loop_body(name, body, out, failed, variables[-1])
        finally:
            for cel_name, previous in saved.items():
                if previous is None:
                    self.scope.pop(cel_name, None)
                else:
                    self.scope[cel_name] = previous
        self.depth -= 1
        if name in ("all", "exists"):
            undecided = "True" if name == "all" else "False"
            self.line(f"if {out} is {undecided} and {failed}: raise _E")
        if kind == BOOL and name not in ("all", "exists"):
            return self.assign(f"{out} == 1", BOOL)
        return Value(out, kind)

    def loop_body(self, name: str, body: tuple[Node, ...], out: str, failed: str, element: str) -> None:
        if name in ("all", "exists"):
            decisive = "False" if name == "all" else "True"
            predicate = self.temp()
            self.line("try:")
            self.depth += 1
            self.line(f"{predicate} = {self.boolean(self.emit(body[0]))}")
            self.depth -= 1
            self.line("except _E:")
            self.line(f"    {failed} = True")
            self.line("    continue")
            # No early exit: every element counts as an iteration, as in cel-expr-python's
            # longest run (see ITERATIONS).
            self.line(f"if {predicate} is {decisive}: {out} = {decisive}")
        elif name in ("exists_one", "existsOne"):
            self.line(f"if {self.boolean(self.emit(body[0]))}: {out} += 1")
        elif name == "filter":
            self.line(f"if {self.boolean(self.emit(body[0]))}: {out}.append({element})")
        elif len(body) == 2:  # map(x, predicate, transform)
            self.line(f"if {self.boolean(self.emit(body[0]))}:")
            self.depth += 1
            self.line(f"{out}.append({self.emit(body[1]).code})")
            self.depth -= 1
        else:
            self.line(f"{out}.append({self.emit(body[0]).code})")

    def logical(self, node: Call, conjunction: bool) -> Value:
        """CEL's commutative `&&`/`||`: a decisive side wins over an error on the other side."""
        decisive, other = ("False", "True") if conjunction else ("True", "False")
        out, left, right = self.temp(), self.temp(), self.temp()
        self.guarded(node.args[0], left)
        self.line(f"if {left} is {decisive}: {out} = {decisive}")
        self.line("else:")
        self.depth += 1
        self.guarded(node.args[1], right)
        self.line(f"if {right} is {decisive}: {out} = {decisive}")
        self.line(f"elif {left} is None or {right} is None: raise _E")
        self.line(f"else: {out} = {other}")
        self.depth -= 1
        return Value(out, BOOL)

    def guarded(self, side: Node, var: str) -> None:
        """`var` = the side's bool, or None where it is a CEL error."""
        self.line("try:")
        self.depth += 1
        self.line(f"{var} = {self.boolean(self.emit(side))}")
        self.depth -= 1
        self.line("except _E:")
        self.line(f"    {var} = None")

    def conditional(self, node: Call) -> Value:
        condition = self.boolean(self.emit(node.args[0]))
        out = self.temp()
        kinds = []
        for keyword, branch in (("if", node.args[1]), ("else", node.args[2])):
            self.line(f"{keyword} {condition}:" if keyword == "if" else "else:")
            self.depth += 1
            value = self.emit(branch)
            kinds.append(value.kind)
            self.line(f"{out} = {value.code}")
            self.depth -= 1
        return Value(out, kinds[0] if kinds[0] == kinds[1] else None)

    def relation(self, op: str, left: Value, right: Value) -> Value:
        classes = _EQUALITY_CLASSES if op in ("==", "!=") else _ORDER_CLASSES
        allowed = (STR, INT, BOOL, DOUBLE) if op in ("==", "!=") else (STR, INT, DOUBLE)
        known = left.kind if left.kind in allowed else right.kind if right.kind in allowed else None
        if known is not None:
            self.require(left, known)
            self.require(right, known)
        else:
            self.line(
                f"if {left.code}.__class__ is not {right.code}.__class__"
                f" or {left.code}.__class__ not in {classes}: raise _F"
            )
        return self.assign(f"{left.code} {op} {right.code}", BOOL)

    def membership(self, needle: Node, haystack: Node) -> Value:
        value = self.emit(needle)
        items = haystack.items if isinstance(haystack, ListLit) and not haystack.optional_items else ()
        if items and all(isinstance(i, Literal) and i.kind == "string" for i in items):
            kind: str | None = STR
        elif items and all(isinstance(i, Literal) and i.kind == "int" for i in items):
            kind = INT
        else:
            kind = None
        if kind is not None:
            self.require(value, kind)
            members = self.constant(frozenset(i.value for i in items if isinstance(i, Literal)), None)
            return self.assign(f"{value.code} in {members.code}", BOOL)
        return self.assign(f"member({value.code}, {self.emit(haystack).code})", BOOL)

    def list_value(self, node: ListLit) -> Value:
        if node.optional_items:
            raise Unsupported("optional list items")
        values = [self.emit(item) for item in node.items]
        if all(value.constant is not _NOT_CONSTANT for value in values):
            return self.constant([value.constant for value in values], LIST)
        return self.assign(f"[{', '.join(value.code for value in values)}]", LIST)

    def arithmetic(self, op: str, left: Value, right: Value) -> Value:
        if op == "+" and STR in (left.kind, right.kind):
            self.require(left, STR)
            self.require(right, STR)
            return self.assign(f"{left.code} + {right.code}", STR)
        if op == "+" and INT not in (left.kind, right.kind):
            out = self.temp()
            self.line(f"if {left.code}.__class__ is str and {right.code}.__class__ is str:")
            self.line(f"    {out} = {left.code} + {right.code}")
            self.line(f"elif {left.code}.__class__ is int and {right.code}.__class__ is int:")
            self.line(f"    {out} = {left.code} + {right.code}")
            self.line(f"    if not {rt.INT64_MIN} <= {out} <= {rt.INT64_MAX}: raise _E")
            self.line("else: raise _F")
            return Value(out, None)
        self.require(left, INT)
        self.require(right, INT)
        if op in "/%":
            helper = "divide" if op == "/" else "modulo"
            return self.assign(f"{helper}({left.code}, {right.code})", INT)
        result = self.assign(f"{left.code} {op} {right.code}", INT)
        self.line(f"if not {rt.INT64_MIN} <= {result.code} <= {rt.INT64_MAX}: raise _E")
        return result

    def presence(self, tested: Node) -> Value:
        if not isinstance(tested, Select):
            raise Unsupported("has() of something other than a field selection")
        if tested.optional:
            raise Unsupported("optional selection")
        if self.whole_view or not _from_device(tested, self.scope):
            operand = self.emit(tested.operand)
            self.line(f"if {operand.code}.__class__ is not dict: raise _F")
            return self.assign(f"{tested.field!r} in {operand.code}", BOOL)
        field, var = self.read_var(self.device_path(tested))
        if field == "allowMultipleAllocations":
            return self.constant(True, None)
        return self.assign(f"{var} is not _M", BOOL)

    def bind(self, node: Call) -> Value:
        """cel.bind is lazy in the full engine: an error in the bound value counts only where
        the name is used. So the value is computed at each use (it is pure: the same value)."""
        name = node.args[0]
        assert isinstance(name, Ident)
        saved = self.scope.get(name.name)
        self.scope[name.name] = Binding(node.args[1], dict(self.scope))
        try:
            return self.emit(node.args[2])
        finally:
            if saved is None:
                del self.scope[name.name]
            else:
                self.scope[name.name] = saved

    def function_call(self, node: Call) -> Value:
        name, target, args = node.name, node.target, list(node.args)
        if isinstance(target, Ident) and target.name not in self.scope and target.name != "device":
            qualified = f"{target.name}.{name}"
            if qualified in rt.FUNCTIONS_BY_NAME:
                name, target = qualified, None
        if target is not None:
            args = [target, *args]
        if name == "matches" and len(args) == 2:
            return self.regex_match(args[0], args[1])
        values = [self.emit(arg) for arg in args]
        if name == "dyn" and target is None and len(values) == 1:
            return Value(values[0].code, None, values[0].constant)  # only the checker's business
        if name == "size" and len(values) == 1:
            if values[0].kind not in (STR, LIST):
                code = values[0].code
                self.line(f"if {code}.__class__ is not str and {code}.__class__ is not list: raise _F")
            return self.assign(f"len({values[0].code})", INT)
        if name in ("startsWith", "endsWith", "contains") and target is not None and len(values) == 2:
            self.require(values[0], STR)
            self.require(values[1], STR)
            method = {"startsWith": "startswith", "endsWith": "endswith", "contains": "__contains__"}[name]
            return self.assign(f"{values[0].code}.{method}({values[1].code})", BOOL)
        function = rt.FUNCTIONS_BY_NAME.get(name)
        if function is None or name in NATIVE_FUNCTIONS:
            raise Unsupported(f"function {name}")
        results = {overload.result.value for overload in function.overloads}
        kind = {"string": STR, "int": INT, "bool": BOOL}.get(results.pop()) if len(results) == 1 else None
        if all(value.constant is not _NOT_CONSTANT for value in values):
            done, result = rt.fold(function, [value.constant for value in values])
            if done:
                return self.constant(result, kind)
        if name in _COMPARISONS and target is not None and len(values) == 2:
            return self.comparison(function, name, values, kind)
        if name in ("major", "minor", "patch") and target is not None and len(values) == 1:
            out = self.temp()
            self.line(f"if {_class_of(values[0].code)} is Semver: {out} = {values[0].code}.{name}")
            self.line("else:")
            self.depth += 1
            self.line(f"{out} = {self.library_call(function, values, kind).code}")
            self.depth -= 1
            return Value(out, kind)
        return self.library_call(function, values, kind)

    def comparison(self, function: Function, name: str, values: list[Value], kind: str | None) -> Value:
        """Quantity and Semver compareTo/isGreaterThan/isLessThan straight to `compare`:
        what the library's overloads call for two values of one of those classes."""
        left, right = values[0].code, values[1].code
        out = self.temp()
        self.line(f"if {_class_of(left)} is {_class_of(right)} and {_class_of(left)} in _CMP:")
        self.line(f"    {out} = {left}.compare({right}){_COMPARISONS[name]}")
        self.line("else:")
        self.depth += 1
        self.line(f"{out} = {self.library_call(function, values, kind).code}")
        self.depth -= 1
        return Value(out, kind)

    def library_call(self, function: Function, values: list[Value], kind: str | None) -> Value:
        """The overload by the arguments' classes (engine_cpp's choice), then the call."""
        table = self.constant(rt.dispatch_table(function), None)
        arguments = ", ".join(value.code for value in values)
        classes = "".join(f"{_class_of(value.code)}, " for value in values)
        impl, out = self.temp(), self.temp()
        self.line(f"{impl} = {table.code}.get(({classes}))")
        self.line(f"if {impl} is None: raise _F")
        self.line("try:")
        self.line(f"    {out} = {impl}({arguments})")
        self.line("except LIBRARY_ERRORS:")
        self.line("    raise _E from None")
        return Value(out, kind)

    def regex_match(self, text: Node, pattern: Node) -> Value:
        if not (isinstance(pattern, Literal) and pattern.kind == "string"):
            raise Unsupported("matches() with a computed pattern")
        try:
            regex = compile_regex(str(pattern.value))
        except LibraryError:
            raise Unsupported("invalid pattern") from None
        value = self.emit(text)
        self.require(value, STR)
        search = self.constant(regex.search, None)
        return self.assign(f"{search.code}({value.code}) is not None", BOOL)


def _from_device(node: Node, scope: Mapping[str, object]) -> bool:
    """Whether a select/index chain starts at the `device` variable."""
    while isinstance(node, Select | Index):
        node = node.operand
    return isinstance(node, Ident) and node.name == "device" and "device" not in scope


def _is_domain_table(node: Node, scope: Mapping[str, object]) -> bool:
    """`device.attributes` / `device.capacity` themselves."""
    return (
        isinstance(node, Select)
        and not node.optional
        and node.field in ("attributes", "capacity")
        and isinstance(node.operand, Ident)
        and node.operand.name == "device"
        and "device" not in scope
    )


def _class_of(code: str) -> str:
    """`code.__class__`, with a number literal in parentheses (`6.__class__` does not parse)."""
    return f"({code}).__class__" if code[0] in "-0123456789" else f"{code}.__class__"


def namespace() -> dict[str, Any]:
    """The globals compiled selectors run with."""
    return {
        "CelFailure": rt.CelFailure,
        "Unhandled": rt.Unhandled,
        "MISSING": rt.MISSING,
        "EMPTY": rt.EMPTY,
        "attribute": rt.attribute,
        "capacity": rt.capacity,
        "divide": rt.divide,
        "modulo": rt.modulo,
        "member": rt.member,
        "LIBRARY_ERRORS": rt.LIBRARY_ERRORS,
        "view": rt.view,
        "item": rt.item,
        "pairs": rt.pairs,
        "_EQ": frozenset({str, int, bool, float}),
        "_ORD": frozenset({str, int, float}),
        "_CMP": frozenset({Quantity, Semver}),
        "Semver": Semver,
    }
