"""Which cluster and credentials: an ApiClient from a kubeconfig or the in-cluster service account.

Each call builds its own `Configuration`, never touching the library's global
default: two clients in one process (tests, or the controller talking to two
clusters) must not leak settings into each other.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


class KubeConfigError(RuntimeError):
    """No usable cluster credentials were found."""


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """A `kubernetes.client.ApiClient` from, in order: the given kubeconfig file, the in-cluster
    service account, or the default kubeconfig ($KUBECONFIG, else ~/.kube/config).

    Naming a context skips the in-cluster step: a context only exists in a kubeconfig.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

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


def _from_kubeconfig(path: str | None, context: str | None) -> ApiClient:
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        # persist_config=False: refreshing a token must never rewrite the user's kubeconfig.
        api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, persist_config=False
        )
    except (ConfigException, OSError) as exc:
        where = path or "the kubeconfig"
        raise KubeConfigError(f"cannot load cluster credentials from {where}: {exc}") from exc
    log.info(
        "using kubeconfig credentials", extra={"kubeconfig": path or "default", "context": context or ""}
    )
    return api
