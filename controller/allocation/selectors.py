"""CEL selectors for allocation: compiled once per expression, errors kept as errors.

A selector that fails to compile or to evaluate is never a non-match: the
scheduler aborts the allocation attempt, and so do we (`SelectorError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.allocation.requests import Request


class SelectorProgram(Protocol):
    def matches(self, driver: str, device: Mapping[str, Any]) -> bool: ...


Compiler = Callable[[str], SelectorProgram]


class SelectorError(Exception):
    """A CEL compile or runtime error while checking a device."""

    def __init__(self, message: str, *, compile_error: bool, step: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.compile_error = compile_error
        self.step = step  # which of the steps given to `first_non_match` failed, when known


@dataclass(frozen=True)
class SelectorStep:
    """One selector in evaluation order; `where` names it in error messages as kube-scheduler does."""

    expression: str
    where: str


def _expression(selector: Mapping[str, Any]) -> str:
    return str((selector.get("cel") or {}).get("expression", ""))


def request_steps(device_class: Mapping[str, Any], request: Request, claim: str) -> list[SelectorStep]:
    """What the allocator evaluates on a device for `request`: the class's selectors, then the
    request's own (kube-scheduler's `isSelectable`); `claim` is "namespace/name"."""
    class_name = str((device_class.get("metadata") or {}).get("name", ""))
    steps = [
        SelectorStep(_expression(s), f"class {class_name}: selector #{i}")
        for i, s in enumerate((device_class.get("spec") or {}).get("selectors") or [])
    ]
    steps.extend(
        SelectorStep(_expression(s), f"claim {claim}: selector #{i}") for i, s in enumerate(request.selectors)
    )
    return steps


def step_expressions(device_class: Mapping[str, Any], request: Request) -> tuple[str, ...]:
    """The expressions of `request_steps`, in order, without the names its error messages need."""
    class_selectors = (device_class.get("spec") or {}).get("selectors") or []
    return tuple(_expression(s) for s in [*class_selectors, *request.selectors])


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

    def fast_function(self, expression: str, driver: str) -> Callable[[Mapping[str, Any]], bool] | None:
        """The program's own function over `driver`'s devices where it offers one
        (`controller.cel.Selector.fast_function`), else None. Where it raises, `matches` tells
        what the device's verdict or error is."""
        program = self.program(expression)
        offered = getattr(program, "fast_function", None)
        if offered is None or isinstance(program, Exception):
            return None
        function: Callable[[Mapping[str, Any]], bool] | None = offered(driver)
        return function

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

    def first_non_match(
        self, steps: Sequence[SelectorStep], driver: str, device: Mapping[str, Any]
    ) -> int | None:
        """The index of the first step that does not match, None when all do. Evaluation stops
        at the first non-match, so later selectors never run on that device (and cannot fail on
        it); a compile or runtime error raises SelectorError with `step` set."""
        for index, step in enumerate(steps):
            try:
                matched = self.matches(step.expression, driver, device, step.where)
            except SelectorError as err:
                err.step = index
                raise
            if not matched:
                return index
        return None
