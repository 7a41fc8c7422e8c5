"""The one Kubernetes API layer of both daemons, the dev cluster and the tests.

`load_api_client` (config) finds the cluster and credentials (credentials) and
builds a `RestClient` (rest: urllib3); `KubeApi` (client) sends raw-JSON
requests, lists and watches over it, or over a `kubernetes` package ApiClient
handed in; `ApiError`/`Gone` (errors) say what failed; `watch_events` (watch)
reads watch streams. The `kubernetes` package is imported only where such an
ApiClient is built (the dev cluster, tests, a kubeconfig user only it serves),
never on the daemons' own path. Each name is imported from its submodule when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dracommon.kubeapi.client import (
        APPLY_PATCH,
        JSON_TYPE,
        MERGE_PATCH,
        AsyncKubeApi,
        KubeApi,
    )
    from dracommon.kubeapi.config import KubeConfigError, context_namespace, load_api_client
    from dracommon.kubeapi.errors import ApiError, Gone, error_from_response, error_from_status
    from dracommon.kubeapi.watch import raise_for_error_event, watch_events

# Each name's submodule, imported on first use: the kubelet plugin imports `ApiError` (errors)
# before its sockets open, and the client (urllib3, ssl: ~15 ms, a few MiB) only behind them.
_SUBMODULE = {
    "APPLY_PATCH": "client",
    "JSON_TYPE": "client",
    "MERGE_PATCH": "client",
    "AsyncKubeApi": "client",
    "KubeApi": "client",
    "KubeConfigError": "config",
    "context_namespace": "config",
    "load_api_client": "config",
    "ApiError": "errors",
    "Gone": "errors",
    "error_from_response": "errors",
    "error_from_status": "errors",
    "raise_for_error_event": "watch",
    "watch_events": "watch",
}


def __getattr__(name: str) -> Any:
    submodule = _SUBMODULE.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


__all__ = [
    "APPLY_PATCH",
    "JSON_TYPE",
    "MERGE_PATCH",
    "ApiError",
    "AsyncKubeApi",
    "Gone",
    "KubeApi",
    "KubeConfigError",
    "context_namespace",
    "error_from_response",
    "error_from_status",
    "load_api_client",
    "raise_for_error_event",
    "watch_events",
]
