"""The one Kubernetes API layer of both daemons, the dev cluster and the tests.

`load_api_client` (config) finds the cluster and credentials; `KubeApi`
(client) sends raw-JSON requests, lists and watches; `ApiError`/`Gone`
(errors) say what failed; `watch_events` (watch) reads watch streams. The
`kubernetes` package is imported only when a client is built or used, so
code that merely names these types (offline commands) stays quick to start.
"""

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
