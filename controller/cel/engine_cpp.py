"""The cel-expr-python engine (Google's cel-cpp): full CEL syntax, type checking, fast.

Quantity and Semver cross into cel-cpp as tiny protobuf messages (`kubernetes.Quantity`,
`kubernetes.Semver`) holding a canonical text, so the type checker can tell them apart and
`==` is semantic (1Gi == 1024Mi). Library functions run in Python (controller.cel.library),
except cel-go's ext.Lists and two-variable comprehensions, which cel-cpp ships natively
(`NATIVE_EXTENSIONS`): they are typed exactly like cel-go's (`sort()` only over comparable
element types, `sortBy` a macro), which our dyn-typed Python versions cannot be.

transformMap/transformMapEntry expand to calls of `cel.@mapInsert`, which cel-expr-python
declares to the checker but does not implement at run time (and will not let a second
implementation be declared beside its own). So such a program is checked in the usual
environment and then planned, from its serialized checked form, in a runtime environment
that adds our implementation (`map_insert`) under upstream's overload ids.

Size: one engine; conversions, declarations and two-environment planning all meet in `compile`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from controller.cel.analysis import Analysis, Read
from controller.cel.device import DeviceShapeError, ViewPlan, build_view
from controller.cel.engine import EvalFailure, Program, not_bool_error
from controller.cel.errors import CompileError, LibraryError
from controller.cel.fullloops import run_loops_to_the_end
from controller.cel.library import FUNCTIONS, SCALAR_KINDS, Function, Kind, Overload
from controller.cel.netlib import CIDR, IP, URL
from controller.cel.semver import Semver
from dracommon.quantity import Quantity

from cel_expr_python import cel  # isort: skip  (optional dependency, imported last on purpose)
from cel_expr_python.ext import ext_bindings, ext_math, ext_optional  # isort: skip

if TYPE_CHECKING:
    from logging import Logger

NAME = "cel-expr-python"
_QUANTITY_TYPE = "kubernetes.Quantity"
# cel-cpp's own libraries, enabled through its environment config: ext.Lists at cel-cpp's
# newest version 2 (slice, flatten, distinct, reverse, sort, sortBy, lists.range: the same
# functions as cel-go's v3, whose increment is cost estimation only) and, in the checking
# environment only, the two-variable comprehension macros (all/exists/existsOne/
# transformList/transformMap/transformMapEntry; see `_map_runtime_environment`).
NATIVE_EXTENSIONS = 'extensions:\n  - name: "lists"\n    version: 2\n'
_TWO_VAR_EXTENSION = '  - name: "two-var-comprehensions"\n'
# Our library's Python versions of those, for engines without them (cel-python).
NATIVE_FUNCTIONS = frozenset({"slice", "flatten", "distinct", "reverse", "sort", "lists.range"})
_SEMVER_TYPE = "kubernetes.Semver"


def _message_classes() -> tuple[Any, dict[str, Any]]:
    """Library value types as one-field protobuf messages, under their upstream CEL names."""
    pool = descriptor_pool.DescriptorPool()
    classes: dict[str, Any] = {}
    for package, names in (("kubernetes", ("Quantity", "Semver", "URL")), ("net", ("IP", "CIDR"))):
        proto = descriptor_pb2.FileDescriptorProto(name=f"controller/cel/{package}.proto", package=package)
        proto.syntax = "proto3"
        for name in names:
            message = proto.message_type.add(name=name)
            message.field.add(
                name="canonical",
                number=1,
                type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
        pool.Add(proto)
        for name in names:
            full = f"{package}.{name}"
            classes[full] = message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
    return pool, classes


_POOL, _MESSAGE_CLASSES = _message_classes()
_QuantityMsg = _MESSAGE_CLASSES[_QUANTITY_TYPE]
_SemverMsg = _MESSAGE_CLASSES[_SEMVER_TYPE]
# Library value type <-> message class, for the types without a hot path of their own.
_OTHER_VALUES: dict[type, Any] = {
    IP: _MESSAGE_CLASSES["net.IP"],
    CIDR: _MESSAGE_CLASSES["net.CIDR"],
    URL: _MESSAGE_CLASSES["kubernetes.URL"],
}
_OTHER_MESSAGES: dict[Any, type[IP] | type[CIDR] | type[URL]] = {m: v for v, m in _OTHER_VALUES.items()}


@lru_cache(maxsize=4096)
def _quantity_msg(value: Quantity) -> Any:
    return _QuantityMsg(canonical=value.canonical())


@lru_cache(maxsize=4096)
def _semver_msg(value: Semver) -> Any:
    return _SemverMsg(canonical=value.canonical())


def to_python(value: Any) -> Any:
    """cel-cpp argument → library value."""
    if isinstance(value, _QuantityMsg):
        return Quantity.from_canonical(value.canonical)
    if isinstance(value, _SemverMsg):
        return Semver.from_canonical(value.canonical)
    if isinstance(value, list):
        return [to_python(item) for item in value]
    kind = _OTHER_MESSAGES.get(type(value))
    if kind is not None:
        return kind.from_canonical(value.canonical)
    return value


def to_cel(value: Any) -> Any:
    """Library value → cel-cpp value."""
    if isinstance(value, Quantity):
        return _quantity_msg(value)
    if isinstance(value, Semver):
        return _semver_msg(value)
    if isinstance(value, list):
        return [to_cel(item) for item in value]
    if isinstance(value, dict):
        return {key: to_cel(item) for key, item in value.items()}
    message = _OTHER_VALUES.get(type(value))
    if message is not None:
        return message(canonical=value.canonical())
    return value


def _cel_type(kind: Kind) -> Any:
    return {
        Kind.STRING: cel.Type.STRING,
        Kind.INT: cel.Type.INT,
        Kind.UINT: cel.Type.UINT,
        Kind.DOUBLE: cel.Type.DOUBLE,
        Kind.BOOL: cel.Type.BOOL,
        Kind.BYTES: cel.Type.BYTES,
        Kind.QUANTITY: cel.Type(_QUANTITY_TYPE),
        Kind.SEMVER: cel.Type(_SEMVER_TYPE),
        Kind.LIST: cel.Type.List(cel.Type.DYN),
        Kind.LIST_STRING: cel.Type.List(cel.Type.STRING),
        Kind.MAP_STRING_LIST: cel.Type.Map(cel.Type.STRING, cel.Type.List(cel.Type.STRING)),
        Kind.IP: cel.Type("net.IP"),
        Kind.CIDR: cel.Type("net.CIDR"),
        Kind.URL: cel.Type("kubernetes.URL"),
        Kind.ANY: cel.Type.DYN,
    }[kind]


_KIND_CHECKS: dict[Kind, Callable[[Any], bool]] = {
    Kind.STRING: lambda v: isinstance(v, str),
    Kind.INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    Kind.UINT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    Kind.DOUBLE: lambda v: isinstance(v, float),
    Kind.BOOL: lambda v: isinstance(v, bool),
    Kind.BYTES: lambda v: isinstance(v, bytes),
    Kind.QUANTITY: lambda v: isinstance(v, Quantity),
    Kind.SEMVER: lambda v: isinstance(v, Semver),
    Kind.LIST: lambda v: isinstance(v, list),
    Kind.LIST_STRING: lambda v: isinstance(v, list),
    Kind.MAP_STRING_LIST: lambda v: isinstance(v, dict),
    Kind.IP: lambda v: isinstance(v, IP),
    Kind.CIDR: lambda v: isinstance(v, CIDR),
    Kind.URL: lambda v: isinstance(v, URL),
    Kind.ANY: lambda v: True,
}


def _dispatcher(function: Function) -> Callable[..., Any]:
    """One runtime implementation per function: cel-cpp dispatches all messages alike."""
    overloads = function.overloads

    def call(*raw: Any) -> Any:
        args = [to_python(arg) for arg in raw]
        for overload in overloads:
            if len(overload.params) == len(args) and all(
                _KIND_CHECKS[kind](arg) for kind, arg in zip(overload.params, args, strict=True)
            ):
                try:
                    return to_cel(overload.impl(*args))
                except LibraryError:
                    raise
                except (ValueError, TypeError, ArithmeticError, RecursionError) as err:
                    raise LibraryError(f"{function.name}: {err}") from None
        raise LibraryError(f"no such overload: {function.name}")

    return call


def _expand(overload: Overload) -> list[tuple[str, tuple[Kind, ...]]]:
    """Concrete parameter lists: cel-cpp does not dispatch a `dyn` parameter at run time."""
    variants: list[tuple[Kind, ...]] = [()]
    for kind in overload.params:
        choices = SCALAR_KINDS if kind is Kind.ANY else (kind,)
        variants = [(*prefix, choice) for prefix in variants for choice in choices]
    if len(variants) == 1:
        return [(overload.overload_id, variants[0])]
    return [(f"{overload.overload_id}_{'_'.join(k.name.lower() for k in v)}", v) for v in variants]


def _runtime_key(params: tuple[Kind, ...], member: bool) -> tuple[object, ...]:
    message_kinds = (Kind.QUANTITY, Kind.SEMVER, Kind.IP, Kind.CIDR, Kind.URL)
    return (member, tuple("message" if k in message_kinds else k for k in params))


def _declarations() -> tuple[list[Any], dict[str, Callable[..., Any]]]:
    declarations: list[Any] = []
    impls: dict[str, Callable[..., Any]] = {}
    for function in FUNCTIONS:
        if function.name in NATIVE_FUNCTIONS:
            continue
        dispatcher = _dispatcher(function)
        registered: set[tuple[object, ...]] = set()
        overloads = []
        for overload in function.overloads:
            for overload_id, params in _expand(overload):
                overloads.append(
                    cel.Overload(
                        overload_id,
                        _cel_type(overload.result),
                        [_cel_type(k) for k in params],
                        is_member=overload.member,
                    )
                )
                key = _runtime_key(params, overload.member)
                if key not in registered:
                    registered.add(key)
                    impls[overload_id] = dispatcher
        declarations.append(cel.FunctionDecl(function.name, overloads))
    return declarations, impls


def _new_environment(native_extensions: str, extensions: list[Any]) -> Any:
    declarations, impls = _declarations()
    return cel.NewEnv(
        _POOL,
        config=cel.NewEnvConfigFromYaml(native_extensions),
        variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
        extensions=[ext_optional.ExtOptional(), ext_bindings.ExtBindings(), ext_math.ExtMath(), *extensions],
        functions=declarations,
        function_impls=impls,
    )


@lru_cache(maxsize=1)
def _environment() -> Any:
    """Where every selector is parsed and type-checked (and, mostly, run)."""
    return _new_environment(NATIVE_EXTENSIONS + _TWO_VAR_EXTENSION, [])


# Upstream's names (cel-go ext/comprehensions.go, the same in cel-cpp).
MAP_INSERT = "cel.@mapInsert"
_MAP_INSERT_KEY_VALUE = "@mapInsert_map_key_value"
_MAP_INSERT_MAP = "@mapInsert_map_map"
_MAP_MACROS = frozenset({"transformMap", "transformMapEntry"})


def _cel_key_text(key: Any) -> str:
    """A map key as Go's %v prints cel-go's value (string bare, bool lower-case)."""
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _insert(accumulator: dict[Any, Any], key: Any, value: Any) -> None:
    """types.InsertMapKeyValue: a key already present is an error, never an overwrite."""
    if key in accumulator:
        # Python's dict equates true with 1, CEL does not; a map holding both cannot reach here.
        if any(k == key and isinstance(k, bool) != isinstance(key, bool) for k in accumulator):
            raise LibraryError(f"{MAP_INSERT}: maps mixing bool and int keys are not supported")
        raise LibraryError(f"insert failed: key {_cel_key_text(key)} already exists")
    accumulator[key] = value


def map_insert(accumulator: dict[Any, Any], key: Any, value: Any) -> dict[Any, Any]:
    """cel.@mapInsert(map, key, value): the transformMap step.

    The binding hands us a fresh dict per call and wants a new one back, so a transformMap
    over n entries copies O(n^2) entries where cel-go's mutable accumulator copies none;
    the iteration limit (ITERATION_LIMIT) bounds n.
    """
    merged = dict(accumulator)
    _insert(merged, key, value)
    return merged


def map_merge(accumulator: dict[Any, Any], update: dict[Any, Any]) -> dict[Any, Any]:
    """cel.@mapInsert(map, map): the transformMapEntry step, failing on the first duplicate key."""
    merged = dict(accumulator)
    for key, value in update.items():
        _insert(merged, key, value)
    return merged


def _map_insert_extension() -> Any:
    any_map = cel.Type.Map(cel.Type.DYN, cel.Type.DYN)
    declaration = cel.FunctionDecl(
        MAP_INSERT,
        [
            cel.Overload(
                _MAP_INSERT_KEY_VALUE, any_map, [any_map, cel.Type.DYN, cel.Type.DYN], impl=map_insert
            ),
            cel.Overload(_MAP_INSERT_MAP, any_map, [any_map, any_map], impl=map_merge),
        ],
    )
    return cel.CelExtension("dra-map-insert", [declaration])


@lru_cache(maxsize=1)
def _map_runtime_environment() -> Any:
    """Runs checked transformMap/transformMapEntry programs: `_environment()` less the two-variable
    macros' declarations (which would collide with ours), plus our `cel.@mapInsert`.

    The other two-variable macros expand to plain comprehensions, so nothing else is lost.
    """
    return _new_environment(NATIVE_EXTENSIONS, [_map_insert_extension()])


# Macros that can stop their loop early, which cel-cpp gets wrong (controller.cel.fullloops).
_EARLY_EXIT_MACROS = frozenset({"all", "exists"})


def _plan(checked: Any, info: Analysis) -> Any:
    """The program to run for a checked expression: in the runtime environment that has
    `cel.@mapInsert` where it needs one (see `_map_runtime_environment`), with `all`/`exists`
    loops run to the end where there are any (see controller.cel.fullloops)."""
    maps = bool(info.calls & _MAP_MACROS)
    # Only a second loop can read the first one's stale slots (or the same loop run again,
    # nested in another); a lone loop keeps its early exit, which upstream's cost accounting
    # also gets (running it to the end could meet cel-cpp's iteration cap).
    early_exits = bool(info.calls & _EARLY_EXIT_MACROS) and info.loops >= 2
    if not maps and not early_exits:
        return checked
    serialized = checked.serialize()
    if early_exits:
        serialized = run_loops_to_the_end(serialized)
    return (_map_runtime_environment() if maps else _environment()).deserialize(serialized)


_POSITION = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")
_STATUS = re.compile(r"^[A-Z_]+: ")


def compile_error(raw: str) -> CompileError:
    match = _POSITION.search(raw)
    if match is None:
        return CompileError(_STATUS.sub("", raw.strip()))
    return CompileError(match.group(3).strip(), line=int(match.group(1)), column=int(match.group(2)))


def runtime_message(raw: str) -> str:
    """cel-cpp status text → the wording cel-go (and so the scheduler) uses."""
    text = _STATUS.sub("", raw.strip())
    key = re.match(r'Key not found in map : "?(.*?)"?$', text)
    if key:
        return f"no such key: {key.group(1)}"
    if text.startswith("No matching overloads found"):
        return "no such overload: " + text.partition(":")[2].strip()
    return text


# cel-expr-python (0.1.3) stops every evaluation after 10,000 comprehension iterations in all:
# cel-cpp's RuntimeOptions.comprehension_max_iterations default, which the binding neither
# exposes nor lets an extension change, and it has no actual-cost tracking. Upstream
# (k8s.io/dynamic-resource-allocation/cel at v0.34.4 and v0.37.2 alike) builds each program
# with cel.CostLimit(CELSelectorExpressionMaxCost = 1,000,000) and cel-go counts the cost
# afresh in every DeviceMatches call, failing it with "operation cancelled: actual cost
# limit exceeded"; each iteration costs at least one unit, so upstream runs far more
# iterations than this. An expression admitted by the API server has an *estimated* cost
# of at most 1,000,000 (we refuse the others at compile time, as it does), which bounds its
# actual cost, so upstream never stops it for cost; here it is finished by cel-python if
# that engine can run it, else it fails (`_over_budget`).
ITERATION_LIMIT = 10_000
_BUDGET = "Iteration budget exceeded"


class CppProgram:
    def __init__(
        self,
        expression: Any,
        fallback: Callable[[], Program | None] | None = None,
        reads: tuple[Read, ...] | None = None,
    ) -> None:
        self._expression = expression
        self._fallback = fallback
        # Building (and handing cel-cpp) only the entries the expression can read is most
        # of an evaluation's saving when it reads one or two of a device's attributes.
        self._reads = reads
        self._plans: dict[str, ViewPlan] = {}

    def _plan(self, driver: str) -> ViewPlan | None:
        if self._reads is None:
            return None
        plan = self._plans.get(driver)
        if plan is None:
            if len(self._plans) >= 64:  # drivers are few; never grow without bound
                self._plans.clear()
            plan = self._plans[driver] = ViewPlan(self._reads, driver)
        return plan

    def evaluate(self, driver: str, device: Mapping[str, Any]) -> bool:
        try:
            view = build_view(
                driver, device, semver=_semver_msg, quantity=_quantity_msg, plan=self._plan(driver)
            )
        except DeviceShapeError as err:
            raise EvalFailure(f"invalid device: {err}") from None
        try:
            value = self._expression.eval(data={"device": view})
        except RuntimeError as err:
            if _BUDGET not in str(err):
                raise EvalFailure(runtime_message(str(err))) from None
            return self._over_budget(driver, device)
        kind = value.type()
        if kind == cel.Type.BOOL:
            return bool(value.value())
        if kind == cel.Type.ERROR:
            text = str(value.value())
            if _BUDGET in text:
                return self._over_budget(driver, device)
            raise EvalFailure(runtime_message(text))
        raise not_bool_error(_type_name(kind))

    def _over_budget(self, driver: str, device: Mapping[str, Any]) -> bool:
        """Past cel-cpp's iteration limit but maybe within upstream's cost limit: ask cel-python.

        The compile-time estimate (at most 1,000,000, like upstream's) bounds the work, so the
        fallback finishes, though slowly (cel-python takes ~1-2 ms per iteration). Without
        one (cel-python absent, or a feature it lacks: optionals, cel.bind, lists.range, the
        two-variable macros, ...) the evaluation fails here where upstream's succeeds: the
        one remaining difference in runtime limits.
        """
        program = self._fallback() if self._fallback is not None else None
        if program is None:
            raise EvalFailure(
                f"operation cancelled: {NAME} stops after {ITERATION_LIMIT} comprehension iterations"
                " (upstream's limit is an actual cost of 1,000,000), and the cel-python engine"
                " cannot evaluate this expression"
            )
        return program.evaluate(driver, device)


def _type_name(kind: Any) -> str:
    name = str(kind.name())
    return {"INT": "int", "UINT": "uint", "DOUBLE": "double", "STRING": "string", "BYTES": "bytes"}.get(
        name, name.lower() if name.isupper() else name
    )


class CppEngine:
    name = NAME

    def compile(self, expression: str, info: Analysis) -> CppProgram:
        try:
            compiled = _environment().compile(expression)
        except RuntimeError as err:
            raise compile_error(str(err)) from None
        result = compiled.return_type()
        if result not in (cel.Type.BOOL, cel.Type.DYN):
            raise CompileError(f"must evaluate to bool or the unknown type, not {_type_name(result)}")
        if info.evident_type not in (None, "bool"):
            # `device` is a map of dyn here; upstream knows e.g. capacity values are Quantity.
            raise CompileError(f"must evaluate to bool or the unknown type, not {info.evident_type}")
        if info.domain_lookups:
            rewritten = tolerant_lookups(expression, info.domain_lookups)
            try:
                compiled = _environment().compile(rewritten)
            except RuntimeError as err:
                # Never expected; the original program is still correct for known domains.
                _log().warning("CEL rewrite for unknown domains failed", extra={"error": str(err)[:200]})
        return CppProgram(_plan(compiled, info), _fallback(expression, info), info.reads)


def tolerant_lookups(expression: str, spans: tuple[tuple[int, int, int], ...]) -> str:
    """Rewrite `device.attributes[d]` to `dyn(device.attributes[?d].orValue({}))` (`.d` likewise).

    Upstream's attribute and capacity maps answer an unknown domain with an empty map,
    while cel-cpp maps are plain: an optional lookup with an empty-map default gives the
    same answers for literal and computed domains alike, and leaves `in`/`size()` exact.
    `dyn(...)` keeps the checker from inferring a narrower type from the `{}` default.
    """
    # (offset, rank, text): at one offset (`[` of an outer lookup right before a nested
    # `device`), the lower rank must end up first, so it is inserted last.
    insertions: list[tuple[int, int, str]] = []
    for operand, start, end in spans:
        insertions += [(operand, 1, "dyn("), (start + 1, 0, "?"), (end, 2, ".orValue({}))")]
    out = expression
    # Pure insertions at original offsets, applied right to left, so nesting cannot shift them.
    for offset, _, text in sorted(insertions, reverse=True):
        out = out[:offset] + text + out[offset:]
    return out


def _fallback(expression: str, info: Analysis) -> Callable[[], Program | None]:
    """The cel-python program for the same expression, compiled on first need (or None)."""
    compiled: list[Program | None] = []

    def program() -> Program | None:
        if not compiled:
            compiled.append(_celpy_program(expression, info))
        return compiled[0]

    return program


def _celpy_program(expression: str, info: Analysis) -> Program | None:
    if info.features:
        return None
    try:
        from controller.cel.engine_celpy import CelpyEngine
    except ImportError:
        return None
    try:
        return CelpyEngine().compile(expression, info)
    except CompileError:
        return None


def _log() -> Logger:
    """This module's logger, imported where something is logged (controller.cel.selector._log)."""
    import logging

    return logging.getLogger(__name__)
