"""Selectors compiled to Python, in front of the full engine (cel-expr-python).

Calling into cel-cpp costs a device view built as dicts plus the call across the binding,
per device. For the selectors controller.cel.fastgen covers, `accelerate` compiles the
expression once (per driver) into a Python function over the device JSON itself; the full
engine's program stays behind it and answers every device the function does not decide
(a CEL runtime error, whose exact message is the full engine's, or anything unusual).
Whether an expression is covered is decided once, at compile time.

$DRA_CEL_FASTPATH=off turns the compiled form off (the full engine alone runs selectors).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from controller.cel import fastgen, syntax
from controller.cel.analysis import Analysis
from controller.cel.engine import Program
from controller.cel.fastgen import Unsupported
from controller.cel.fastruntime import CelFailure, Unhandled

if TYPE_CHECKING:
    from logging import Logger

FASTPATH_ENV = "DRA_CEL_FASTPATH"
_MAX_DRIVERS = 64  # drivers are few; never grow without bound

Compiled = Callable[[Mapping[str, Any]], bool]


def enabled() -> bool:
    return os.environ.get(FASTPATH_ENV, "").strip().lower() not in ("0", "off", "false", "no")


def compile_function(tree: syntax.Node, info: Analysis, driver: str) -> Compiled:
    """The compiled selector for one driver; Unsupported when it is not covered."""
    generated = fastgen.generate(tree, info, driver)
    scope: dict[str, Any] = {**fastgen.namespace(), **generated.constants}
    exec(compile(generated.source, "<cel selector>", "exec"), scope)  # our own generated code
    function: Compiled = scope["selector"]
    return function


class FastProgram:
    """The compiled function where it decides, the full engine's program elsewhere."""

    def __init__(self, tree: syntax.Node, info: Analysis, full: Program) -> None:
        self._tree = tree
        self._info = info
        self.full = full
        self._functions: dict[str, Compiled] = {}
        self._lock = threading.Lock()

    def function(self, driver: str) -> Compiled:
        function = self._functions.get(driver)
        if function is None:
            function = compile_function(self._tree, self._info, driver)
            with self._lock:
                if len(self._functions) >= _MAX_DRIVERS:
                    self._functions.clear()
                self._functions[driver] = function
        return function

    def evaluate(self, driver: str, device: Mapping[str, Any]) -> bool:
        function = self._functions.get(driver) or self.function(driver)
        try:
            return function(device)
        except (CelFailure, Unhandled):
            return self.full.evaluate(driver, device)

    def decide(self, driver: str, device: Mapping[str, Any]) -> bool | type[CelFailure] | type[Unhandled]:
        """The compiled function's own verdict, for the differential tests: the bool, or
        which signal it raised (CelFailure: a CEL error; Unhandled: left to the full engine)."""
        try:
            return self.function(driver)(device)
        except CelFailure:
            return CelFailure
        except Unhandled:
            return Unhandled


def accelerate(expression: str, info: Analysis, full: Program) -> Program:
    """A FastProgram when the expression is covered, else `full` itself."""
    try:
        tree = syntax.parse(expression)
        # The driver only changes constants, never what is covered: any name tells.
        fastgen.generate(tree, info, "\0")
    except (Unsupported, syntax.ParseFailure, RecursionError):
        return full
    except Exception as err:  # a fault of ours must never fail a compile the engine passed
        _log().warning("CEL fast path failed to compile a selector", extra={"error": repr(err)[:200]})
        return full
    return FastProgram(tree, info, full)


def _log() -> Logger:
    """This module's logger, imported where something is logged (controller.cel.selector._log)."""
    import logging

    return logging.getLogger(__name__)
