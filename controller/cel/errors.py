"""Errors raised by the DRA CEL environment."""

from __future__ import annotations


class CompileError(ValueError):
    """An expression was rejected before evaluation (syntax, types, size or cost).

    `line` and `column` are 1-based and point into the expression; `message` is the cause
    without the position. `str()` reads "line 1, column 12: <message>".
    """

    def __init__(self, message: str, *, line: int = 1, column: int = 1) -> None:
        self.message = message
        self.line = line
        self.column = column
        super().__init__(f"line {line}, column {column}: {message}")


class EvaluationError(RuntimeError):
    """Evaluating a selector against one device failed; the device neither matches nor not.

    Upstream treats this as an allocation error, never as "does not match".
    """

    def __init__(self, device: str, cause: str) -> None:
        self.device = device
        self.cause = cause
        super().__init__(f"device {device}: {cause}")


class EngineUnavailable(RuntimeError):
    """The requested CEL engine cannot be loaded in this process."""


class LibraryError(ValueError):
    """A library function failed at run time; the message is the CEL error text."""


# Strings and lists a library function may build at run time. The static cost estimate
# normally stops expressions long before this; the guard makes sure no input can.
MAX_RESULT_SIZE = 1_000_000


def check_size(size: int, what: str) -> None:
    if size > MAX_RESULT_SIZE:
        raise LibraryError(f"operation cancelled: actual cost limit exceeded ({what} of {size} elements)")
