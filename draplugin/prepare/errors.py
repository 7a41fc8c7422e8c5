"""`PlanError`, the one error type of prepare, in a module of its own.

Apart from planning (`draplugin.prepare.plan`) so that the sharing mechanisms
(MPS, time-slice, MIG) import without it; none of them imports pydantic (only
validating an opaque config does, `draplugin.prepare.claimconfig`): `make
gpu-check` runs them on a GPU machine with only the system python3 and
nvidia-ml-py.
"""

from __future__ import annotations


class PlanError(Exception):
    """The claim cannot be prepared as allocated. `reason` is a CamelCase word for Events and metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
