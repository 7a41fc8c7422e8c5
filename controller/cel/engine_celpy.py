"""The cel-python (celpy) engine: pure Python, the portable fallback and a test oracle.

celpy lacks part of the language upstream uses (optional syntax, cel.bind, namespaced
functions, cross-type numeric comparison); expressions that need those are rejected at
compile time with a message naming what is missing. Library functions are the same
Python implementations the cel-expr-python engine calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from controller.cel.analysis import Analysis
from controller.cel.device import DeviceShapeError, build_view
from controller.cel.engine import EvalFailure, not_bool_error
from controller.cel.errors import CompileError, LibraryError
from controller.cel.library import FUNCTIONS, Function, Kind
from controller.cel.netlib import CIDR, IP, URL
from controller.cel.semver import Semver
from dracommon.quantity import Quantity

NAME = "cel-python"

# Functions celpy itself provides, plus ours: anything else is an undeclared reference.
_BUILTINS = frozenset(
    {
        "has",
        "size",
        "contains",
        "endsWith",
        "startsWith",
        "matches",
        "bool",
        "bytes",
        "double",
        "int",
        "string",
        "uint",
        "all",
        "exists",
        "exists_one",
        "map",
        "filter",
    }
)


class DomainMap(celtypes.MapType):
    """`device.attributes` / `device.capacity`: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def to_python(value: Any) -> Any:
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.BytesType):
        return bytes(value)
    if isinstance(value, list):
        return [to_python(item) for item in value]
    if isinstance(value, dict):
        return {to_python(k): to_python(v) for k, v in value.items()}
    return value


def to_cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, bytes):
        return celtypes.BytesType(value)
    if isinstance(value, list):
        return celtypes.ListType([to_cel(item) for item in value])
    if isinstance(value, dict):
        return celtypes.MapType({to_cel(k): to_cel(v) for k, v in value.items()})
    return value


def _kind_ok(kind: Kind, value: Any) -> bool:
    if kind is Kind.ANY:
        return True
    if kind in (Kind.LIST, Kind.LIST_STRING):
        return isinstance(value, list)
    if kind in (Kind.INT, Kind.UINT) and isinstance(value, bool):
        return False
    return isinstance(value, _PYTHON_TYPES[kind])


_PYTHON_TYPES: dict[Kind, type] = {
    Kind.STRING: str,
    Kind.INT: int,
    Kind.UINT: int,
    Kind.DOUBLE: float,
    Kind.BOOL: bool,
    Kind.BYTES: bytes,
    Kind.QUANTITY: Quantity,
    Kind.SEMVER: Semver,
    Kind.IP: IP,
    Kind.CIDR: CIDR,
    Kind.URL: URL,
    Kind.MAP_STRING_LIST: dict,
}


def _function(function: Function) -> Callable[..., Any]:
    def call(*raw: Any) -> Any:
        for arg in raw:
            if isinstance(arg, CELEvalError):
                return arg
        args = [to_python(arg) for arg in raw]
        for overload in function.overloads:
            if len(overload.params) == len(args) and all(
                _kind_ok(kind, arg) for kind, arg in zip(overload.params, args, strict=True)
            ):
                try:
                    return to_cel(overload.impl(*args))
                except LibraryError as err:
                    return CELEvalError(str(err), LibraryError, None)
                except (ValueError, TypeError, ArithmeticError, RecursionError) as err:
                    return CELEvalError(f"{function.name}: {err}", type(err), None)
        shown = ", ".join(type(arg).__name__ for arg in args)
        return CELEvalError(f"no such overload: {function.name}({shown})", TypeError, None)

    return call


_FUNCTIONS: dict[str, Callable[..., Any]] = {f.name: _function(f) for f in FUNCTIONS if "." not in f.name}


def _string_predicate(name: str, test: Callable[[str, str], bool]) -> Callable[..., Any]:
    # celpy's own versions reject the plain `str` its `+` operator returns.
    def call(text: Any, other: Any) -> Any:
        for arg in (text, other):
            if isinstance(arg, CELEvalError):
                return arg
        if not isinstance(text, str) or not isinstance(other, str):
            return CELEvalError(f"no such overload: {name}", TypeError, None)
        return celtypes.BoolType(test(str(text), str(other)))

    return call


_FUNCTIONS["contains"] = _string_predicate("contains", lambda a, b: b in a)
_FUNCTIONS["startsWith"] = _string_predicate("startsWith", str.startswith)
_FUNCTIONS["endsWith"] = _string_predicate("endsWith", str.endswith)


def runtime_message(error: Any) -> str:
    text = str(error.args[0]) if getattr(error, "args", None) else str(error)
    key = re.match(r"no such member in mapping: '(.*)'", text)
    if key:
        return f"no such key: {key.group(1)}"
    if text.startswith("found no matching overload"):
        return "no such overload" + (": " + text.split(" for ", 1)[1][:200] if " for " in text else "")
    return text[:500]


class CelpyProgram:
    def __init__(self, program: Any) -> None:
        self._program = program

    def evaluate(self, driver: str, device: Mapping[str, Any]) -> bool:
        try:
            view = build_view(driver, device, semver=lambda v: v, quantity=lambda q: q)
        except DeviceShapeError as err:
            raise EvalFailure(f"invalid device: {err}") from None
        activation = celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(view["driver"]),
                celtypes.StringType("attributes"): DomainMap(
                    {celtypes.StringType(k): to_cel(v) for k, v in view["attributes"].items()}
                ),
                celtypes.StringType("capacity"): DomainMap(
                    {celtypes.StringType(k): to_cel(v) for k, v in view["capacity"].items()}
                ),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                    view["allowMultipleAllocations"]
                ),
            }
        )
        try:
            result = self._program.evaluate({"device": activation})
        except CELEvalError as err:
            raise EvalFailure(runtime_message(err)) from None
        except (RecursionError, MemoryError):
            raise EvalFailure("operation cancelled: actual cost limit exceeded") from None
        if isinstance(result, celtypes.BoolType):
            return bool(result)
        if isinstance(result, CELEvalError):
            raise EvalFailure(runtime_message(result))
        raise not_bool_error(_type_name(result))


def _type_name(value: Any) -> str:
    for kind, name in (
        (celtypes.IntType, "int"),
        (celtypes.UintType, "uint"),
        (celtypes.DoubleType, "double"),
        (celtypes.StringType, "string"),
        (celtypes.BytesType, "bytes"),
        (celtypes.ListType, "list"),
        (celtypes.MapType, "map"),
        (Quantity, "kubernetes.Quantity"),
        (Semver, "kubernetes.Semver"),
        (IP, "net.IP"),
        (CIDR, "net.CIDR"),
        (URL, "kubernetes.URL"),
    ):
        if isinstance(value, kind):
            return name
    return "null_type" if value is None else type(value).__name__


class CelpyEngine:
    name = NAME

    def __init__(self) -> None:
        self._env = celpy.Environment()

    def compile(self, expression: str, info: Analysis) -> CelpyProgram:
        if info.features:
            lacking = ", ".join(sorted(info.features))
            raise CompileError(f"the {NAME} engine does not support {lacking}; use cel-expr-python")
        try:
            ast = self._env.compile(expression)
        except CELParseError as err:
            raise CompileError(
                f"Syntax error ({NAME} cannot parse the expression)",
                line=int(getattr(err, "line", None) or 1),
                column=int(getattr(err, "column", None) or 1),
            ) from None
        unknown = sorted(info.calls - _BUILTINS - set(_FUNCTIONS)) or sorted(info.free_names)
        if unknown:
            raise CompileError(f"undeclared reference to '{unknown[0]}' ({NAME} has no such function)")
        if info.evident_type not in (None, "bool"):
            raise CompileError(f"must evaluate to bool or the unknown type, not {info.evident_type}")
        return CelpyProgram(self._env.program(ast, functions=_FUNCTIONS))
