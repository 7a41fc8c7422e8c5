"""What one Filter call answers: the claims' allocations on the node, or why not.

The allocations of a feasible node may be built on first use (`pending`): most feasible
nodes of a Filter over many nodes are never chosen, and building `status.allocation` (results,
config copies) is most of a successful Filter call's own work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Screen.classify's answers.
FITS, CANNOT_FIT, UNKNOWN = 1, 0, -1
# kube-scheduler's words when no combination of devices fits.
CANNOT_ALLOCATE = "cannot allocate all claims"


@dataclass(frozen=True)
class Failure:
    """Why claims could not be allocated.

    `error` is True where kube-scheduler reports an error (CEL failure, a
    request it cannot handle) rather than "unschedulable" (no fitting devices).
    """

    message: str
    error: bool = False


Allocations = list[dict[str, Any]]


class AllocationOutcome:
    """One `status.allocation` per claim, in input order, or a failure for all of them.

    `pending` (only without a failure) builds the allocations when they are first read, once."""

    __slots__ = ("_allocations", "_pending", "failure", "node")

    def __init__(
        self,
        allocations: Allocations | None = None,
        failure: Failure | None = None,
        node: str | None = None,
        *,
        pending: Callable[[], Allocations] | None = None,
    ) -> None:
        assert pending is None or (failure is None and allocations is None)
        self._allocations: Allocations = allocations if allocations is not None else []
        self._pending = pending
        self.failure = failure
        self.node = node

    @property
    def allocations(self) -> Allocations:
        if self._pending is not None:
            self._allocations = self._pending()
            self._pending = None
        return self._allocations

    @property
    def ok(self) -> bool:
        return self.failure is None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AllocationOutcome):
            return NotImplemented
        return (self.allocations, self.failure, self.node) == (other.allocations, other.failure, other.node)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (
            f"AllocationOutcome(allocations={self.allocations!r}, failure={self.failure!r}, "
            f"node={self.node!r})"
        )


__all__ = ["CANNOT_ALLOCATE", "CANNOT_FIT", "FITS", "UNKNOWN", "AllocationOutcome", "Allocations", "Failure"]
