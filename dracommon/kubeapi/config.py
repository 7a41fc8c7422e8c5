"""Which cluster and credentials: a client from a kubeconfig or the in-cluster service account.

The credentials are read here (`dracommon.kubeapi.credentials`) into a `RestClient`, without
the `kubernetes` package; a kubeconfig user only that package serves (exec credential plugins,
auth providers, passwords, proxies) gets its ApiClient instead, which `KubeApi` takes as well.
Each call builds its own client and configuration, never touching a global default: two
clients in one process (tests, or the controller talking to two clusters) must not leak
settings into each other.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dracommon.kubeapi import credentials
from dracommon.kubeapi.rest import RestClient

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


class KubeConfigError(RuntimeError):
    """No usable cluster credentials were found."""


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> RestClient | ApiClient:
    """A client (for `KubeApi`) from, in order: the given kubeconfig file, the in-cluster service
    account, or the default kubeconfig ($KUBECONFIG, else ~/.kube/config).

    Naming a context skips the in-cluster step: a context only exists in a kubeconfig.
    """
    if kubeconfig:
        if not Path(kubeconfig).is_file():
            raise KubeConfigError(f"kubeconfig {kubeconfig} does not exist or is not a file")
        return _from_kubeconfig(kubeconfig, context)
    if context is None:
        try:
            in_cluster = credentials.in_cluster()
        except credentials.CredentialsError as exc:
            log.debug("not running in a cluster", extra={"reason": str(exc)})
        else:
            log.info("using in-cluster service account credentials")
            return RestClient(in_cluster)
    default = default_kubeconfig()
    missing = [p for p in default.split(os.pathsep) if p and not Path(p).is_file()]
    if len(missing) == len([p for p in default.split(os.pathsep) if p]):
        # Said as missing, not as the library's "Invalid kube-config file" for a file never read.
        named = "$KUBECONFIG names " if os.environ.get("KUBECONFIG") else "the default kubeconfig "
        raise KubeConfigError(
            f"no kubeconfig: {named}{', '.join(missing)}, which does not exist, and this is not a pod in a "
            "cluster (name one with --kubeconfig FILE or $KUBECONFIG)"
        )
    return _from_kubeconfig(default, context)


def default_kubeconfig() -> str:
    """$KUBECONFIG, else ~/.kube/config. Read now: the library reads $KUBECONFIG once, at import
    time. It may list several files separated by ':'; the library merges them."""
    return os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


# Where a pod's service account token mounts its namespace (kubectl reads it in a pod too).
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str | None:
    """The namespace kubectl would use without -n, from the credentials `load_api_client` picks
    (in the same order): the kubeconfig context's (the current one, or `context`), or in a pod
    the pod's own; None when none is named."""
    if not kubeconfig and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or None
        except OSError:
            pass  # not a pod after all: the kubeconfig's, as load_api_client falls back
    try:
        contexts, current = credentials.contexts(kubeconfig or default_kubeconfig())
    except credentials.CredentialsError:
        return None
    chosen: dict[str, Any] = contexts.get(context or current or "") or {}
    namespace = chosen.get("namespace")
    return str(namespace) if namespace else None


def _from_kubeconfig(path: str, context: str | None) -> RestClient | ApiClient:
    try:
        client: RestClient | ApiClient = RestClient(credentials.from_kubeconfig(path, context))
    except credentials.CredentialsError as exc:
        raise KubeConfigError(f"cannot load cluster credentials from {path}: {exc}") from exc
    except credentials.NeedsKubernetesClient:
        client = _library_client(path, context)
    log.info("using kubeconfig credentials", extra={"kubeconfig": path, "context": context or ""})
    return client


def _library_client(path: str, context: str | None) -> ApiClient:
    """The kubernetes package's own loader, for what `credentials` does not read."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        # persist_config=False: refreshing a token must never rewrite the user's kubeconfig.
        api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, persist_config=False
        )
    except (ConfigException, OSError) as exc:
        raise KubeConfigError(f"cannot load cluster credentials from {path}: {exc}") from exc
    return api
