"""The pre-allocation annotation's key and values, read by `dra-controller run`'s reconciler
and by `dra-controller simulate`. A module of its own so that simulate (and every command's
parser, which imports each subcommand module) need not import the reconciler with asyncio,
the API client and prometheus_client."""

from __future__ import annotations

from typing import Final

from dracommon.drivername import annotation_key

ANY_NODE: Final = "any"
# `kubectl annotate ... preallocate=true` reads naturally; it means the same as "any".
ANY_NODE_SYNONYMS: Final = frozenset({ANY_NODE, "true"})


def preallocate_annotation(driver_name: str) -> str:
    """`<driver>/preallocate`: asks the controller to allocate a standalone claim now."""
    return annotation_key(driver_name, "preallocate")
