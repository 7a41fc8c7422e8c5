"""Kubernetes API client set-up shared by the node plugin and the controller.

Each call builds its own `Configuration`, never touching the library's global
default: two clients in one process (tests, or the controller talking to two
clusters) must not leak settings into each other.

`send_raw` is the one way both daemons (and the tests) talk JSON to the API
server: plain dicts in and out, never the typed models, which drop fields a
newer server sends and would lose them on a read-modify-write.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

log = logging.getLogger(__name__)


def send_raw(
    api_client: Any,
    method: str,
    path: str,
    *,
    query: Mapping[str, str] | list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | tuple[float, float] | None = None,
) -> Any:
    """One request with the client's server and credentials; returns the unread
    response (status, `read()`, or a stream), leaving error policy to the caller."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    params = list(query.items()) if isinstance(query, Mapping) else list(query or [])
    method, url, headers, payload, _ = api_client.param_serialize(
        method=method,
        resource_path=path,
        query_params=params,
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    return api_client.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)


class KubeConfigError(RuntimeError):
    """No usable cluster credentials were found."""


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """An API client from, in order: the given kubeconfig file, the in-cluster
    service account, or the default kubeconfig ($KUBECONFIG, else ~/.kube/config).

    Naming a context skips the in-cluster step: a context only exists in a kubeconfig.
    """
    if kubeconfig:
        if not Path(kubeconfig).is_file():
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist or is not a file")
        return _from_kubeconfig(kubeconfig, context)
    if context is None:
        in_cluster = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=in_cluster)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            log.debug("not running in a cluster", extra={"reason": str(exc)})
        else:
            log.info("using in-cluster service account credentials")
            return client.ApiClient(configuration=in_cluster)
    # Read $KUBECONFIG now: the library reads it once, at import time. It may list
    # several files separated by ':'; the library merges them.
    default = os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    return _from_kubeconfig(default, context)


def _from_kubeconfig(path: str | None, context: str | None) -> client.ApiClient:
    try:
        # persist_config=False: refreshing a token must never rewrite the user's kubeconfig.
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, persist_config=False
        )
    except (ConfigException, OSError) as exc:
        where = path or "the kubeconfig"
        raise KubeConfigError(f"cannot load cluster credentials from {where}: {exc}") from exc
    log.info(
        "using kubeconfig credentials", extra={"kubeconfig": path or "default", "context": context or ""}
    )
    return api
