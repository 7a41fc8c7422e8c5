"""CEL selectors for allocation: compiled once per expression, errors kept as errors.

A selector that fails to compile or to evaluate is never a non-match: the
scheduler aborts the allocation attempt, and so do we (`SelectorError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol


class SelectorProgram(Protocol):
    def matches(self, driver: str, device: Mapping[str, Any]) -> bool: ...


Compiler = Callable[[str], SelectorProgram]


class SelectorError(Exception):
    """A CEL compile or runtime error while checking a device."""

    def __init__(self, message: str, *, compile_error: bool) -> None:
        super().__init__(message)
        self.message = message
        self.compile_error = compile_error


def default_compiler() -> Compiler:
    """The project's Kubernetes DRA CEL environment."""
    from controller import cel

    compile_selector: Compiler = cel.compile_selector
    return compile_selector


class SelectorCache:
    """Compiled programs by expression text; a compile failure is cached too."""

    def __init__(self, compiler: Compiler | None = None) -> None:
        self._compiler = compiler
        self._programs: dict[str, SelectorProgram | Exception] = {}

    def program(self, expression: str) -> SelectorProgram | Exception:
        cached = self._programs.get(expression)
        if cached is None:
            if self._compiler is None:
                self._compiler = default_compiler()
            try:
                cached = self._compiler(expression)
            except Exception as err:  # any failure to compile is a compile error of the selector
                cached = err
            self._programs[expression] = cached
        return cached

    def matches(self, expression: str, driver: str, device: Mapping[str, Any], where: str) -> bool:
        """Evaluate one selector; `where` names the class/claim selector for error messages."""
        program = self.program(expression)
        if isinstance(program, Exception):
            raise SelectorError(f"{where}: CEL compile error: {program}", compile_error=True)
        try:
            result = program.matches(driver, device)
        except Exception as err:  # a runtime error aborts allocation; it is not a non-match
            raise SelectorError(
                f"{where} on device {device.get('name', '')}: CEL runtime error: {err}", compile_error=False
            ) from err
        return bool(result)
