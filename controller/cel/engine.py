"""What every CEL engine behind `compile_selector` provides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.cel.analysis import Analysis


class EvalFailure(Exception):
    """A CEL runtime error; the message is upstream-style text without the device name."""


class Program(Protocol):
    def evaluate(self, driver: str, device: Mapping[str, Any]) -> bool:
        """True/false for one device; raises EvalFailure on any runtime error or non-bool result."""


class Engine(Protocol):
    name: str

    def compile(self, expression: str, info: Analysis) -> Program:
        """A compiled program, or CompileError; `info` is our own analysis of the expression."""


def not_bool_error(type_name: str) -> EvalFailure:
    return EvalFailure(f"CEL result of type {type_name} could not be converted to bool")
