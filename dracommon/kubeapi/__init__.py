"""The one Kubernetes API layer of both daemons, the dev cluster and the tests.

`load_api_client` (config) finds the cluster and credentials (credentials) and
builds a `RestClient` (rest: urllib3); `KubeApi` (client) sends raw-JSON
requests, lists and watches over it, or over a `kubernetes` package ApiClient
handed in; `ApiError`/`Gone` (errors) say what failed; `watch_events` (watch)
reads watch streams. The `kubernetes` package is imported only where such an
ApiClient is built (the dev cluster, tests, a kubeconfig user only it serves),
never on the daemons' own path.
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
