"""Which CEL libraries a Kubernetes release accepts in a new DRA selector.

Upstream's base CEL environment (k8s.io/apiserver/pkg/cel/environment, base.go)
adds each library at a release. The API server validates a new or changed
expression in the environment of its *minimum compatibility version*, one
minor release behind itself, so that a rollback by one release still reads
every stored object. A library introduced in 1.N is therefore accepted by
kube-apiserver 1.(N+1) and later; older servers report the function as an
"undeclared reference".

Only libraries introduced at or after the oldest supported release's
environment (1.33) need a row here; everything older is always present.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from controller.cel import syntax
from controller.cel.errors import CompileError
from dracommon.kubeversion import NEWEST_KNOWN, KubernetesVersion, VersionError, parse_kubernetes_version

VERSION_ENV: Final = "DRA_KUBERNETES_VERSION"

# Library -> the release whose base environment introduced it.
# Older rows, always present: ext.TwoVarComprehensions (two-variable all/exists/existsOne,
# transformList/transformMap/transformMapEntry) joined in 1.32, Kubernetes semver in 1.33.
LIBRARY_INTRODUCED: Final[Mapping[str, KubernetesVersion]] = {
    # ext.Lists (version 3): slice, flatten, distinct, reverse, sort, sortBy, lists.range.
    "ext.Lists": (1, 34),
    # Kubernetes library.Lists version 1 adds `includes`. (DRA's own environment also adds
    # `includes` from 1.36, but only with the alpha DRAListTypeAttributes feature gate,
    # off by default through 1.37.)
    "library.Lists.v1": (1, 37),
}

# Functions of our environment that belong to a gated library. Namespaced
# functions are keyed by their full name.
FUNCTION_LIBRARY: Final[Mapping[str, str]] = {
    "slice": "ext.Lists",
    "flatten": "ext.Lists",
    "distinct": "ext.Lists",
    "reverse": "ext.Lists",
    "sort": "ext.Lists",
    "lists.range": "ext.Lists",
    "sortBy": "ext.Lists",
    "includes": "library.Lists.v1",
}
GATED_NAMES: Final = frozenset(name.rpartition(".")[2] for name in FUNCTION_LIBRARY)


def default_version() -> KubernetesVersion:
    """$DRA_KUBERNETES_VERSION, else the newest release whose environment we know."""
    raw = os.environ.get(VERSION_ENV, "").strip()
    if not raw:
        return NEWEST_KNOWN
    try:
        return parse_kubernetes_version(raw)
    except VersionError as err:
        raise CompileError(f"${VERSION_ENV}: {err}") from None


def environment_version(server: KubernetesVersion) -> KubernetesVersion:
    """The environment a server of that release checks new expressions in (n-1)."""
    return (server[0], server[1] - 1)


def library_available(library: str, server: KubernetesVersion) -> bool:
    introduced = LIBRARY_INTRODUCED.get(library)
    return introduced is None or introduced <= environment_version(server)


def unavailable_libraries(server: KubernetesVersion) -> frozenset[str]:
    return frozenset(lib for lib in LIBRARY_INTRODUCED if not library_available(lib, server))


def check_available(expression: str, calls: frozenset[str], server: KubernetesVersion) -> None:
    """CompileError, worded like upstream's checker, for the first call the release lacks."""
    missing = unavailable_libraries(server)
    if not missing or not (calls & GATED_NAMES):
        return
    tree = syntax.parse(expression)
    found: list[tuple[int, str]] = []
    for node in syntax.walk(tree):
        if not isinstance(node, syntax.Call) or node.name not in GATED_NAMES:
            continue
        target = node.target
        if isinstance(target, syntax.Ident) and f"{target.name}.{node.name}" in FUNCTION_LIBRARY:
            # `lists.range(3)`: upstream cannot resolve the namespace itself first.
            if FUNCTION_LIBRARY[f"{target.name}.{node.name}"] in missing:
                found.append((target.pos, target.name))
        elif target is not None and FUNCTION_LIBRARY.get(node.name) in missing:
            # Upstream points at the call's opening parenthesis.
            found.append((expression.find("(", node.pos + len(node.name)), node.name))
    if not found:
        return
    offset, name = min(found)
    line, column = syntax.position(expression, offset)
    raise CompileError(f"undeclared reference to '{name}' (in container '')", line=line, column=column)
