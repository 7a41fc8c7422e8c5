"""Where `top` reads usage from, and reading it: the node plugins' Prometheus endpoints.

In a cluster, the chart's kubelet plugin pods are found by label, and each pod's /metrics
is read through the API server's pod proxy (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/
metrics`), so `top` needs only what kubectl needs: credentials, and `get` on `pods/proxy`.
The port is the container's `metrics` port, else its METRICS_PORT variable (a plugin on the
host network declares no ports), else the chart's default. Plugins that run outside the
cluster, or that the API server cannot proxy to (it refuses loopback pod addresses, as in
the local dev cluster), are scraped at URLs given with `--endpoint`; `--metrics-file` reads
a saved scrape.

Endpoints are read in parallel; one that fails gives a `ScrapeFailure` that names it and
why, never an exception, so the others are still shown.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from dracommon.kubeapi import ApiError, KubeApi

DEFAULT_SELECTOR: Final = "app.kubernetes.io/component=kubelet-plugin"
DEFAULT_METRICS_PORT: Final = 8080  # the chart's metrics.port and the plugin's --metrics-port default
METRICS_PATH: Final = "/metrics"
METRICS_FLAG: Final = "--metrics-port"
PLUGIN_CONTAINER: Final = "plugin"  # the container of the chart's DaemonSet that runs `draplugin run`
SCRAPE_TIMEOUT_S: Final = 10.0
MAX_BODY_BYTES: Final = 64 << 20  # far above any plugin's exposition; stops an endpoint that never ends
MAX_PARALLEL: Final = 16


class EndpointError(Exception):
    """An endpoint could not be read; the message says why."""


class Endpoint(Protocol):
    """One place that serves a plugin's /metrics."""

    @property
    def name(self) -> str: ...

    def fetch(self) -> str: ...


@dataclass(frozen=True, slots=True)
class UrlEndpoint:
    """A /metrics URL scraped directly (`--endpoint`)."""

    url: str
    timeout_s: float = SCRAPE_TIMEOUT_S

    @property
    def name(self) -> str:
        return self.url

    def fetch(self) -> str:
        # Imported here: urllib.request (http.client, ssl, email) is ~20 ms of every command's
        # start-up, since the CLI parser imports this module for top's defaults.
        import urllib.error
        import urllib.request

        # text/plain: prometheus_client then answers in the text format its parser reads.
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body: bytes = response.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as err:
            raise EndpointError(f"HTTP {err.code} {err.reason}") from err
        except urllib.error.URLError as err:
            raise EndpointError(f"cannot connect: {err.reason}") from err
        except (OSError, ValueError) as err:  # a reset connection, a timeout, a malformed answer
            raise EndpointError(str(err) or type(err).__name__) from err
        return _decoded(body)


@dataclass(frozen=True, slots=True)
class FileEndpoint:
    """A plugin's /metrics saved to a file (`--metrics-file`; e.g. `curl -s URL > node-a.prom`):
    for looking at a scrape later, or from a machine that cannot reach the plugin."""

    path: Path

    @property
    def name(self) -> str:
        return str(self.path)

    def fetch(self) -> str:
        try:
            with self.path.open("rb") as saved:
                return _decoded(saved.read(MAX_BODY_BYTES + 1))
        except OSError as err:
            raise EndpointError(f"cannot read the file: {err.strerror or err}") from err


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """A plugin pod's /metrics, read through the API server's pod proxy."""

    api: KubeApi
    namespace: str
    pod: str
    node: str
    port: int
    timeout_s: float = SCRAPE_TIMEOUT_S

    @property
    def name(self) -> str:
        return f"pod {self.namespace}/{self.pod} (node {self.node or '?'}, port {self.port})"

    @property
    def proxy_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}:{self.port}/proxy{METRICS_PATH}"

    def fetch(self) -> str:
        try:
            body = self.api.get_bytes(self.proxy_path, timeout=self.timeout_s)
        except ApiError as err:
            raise EndpointError(f"through the API server's pod proxy: {err}") from err
        return _decoded(body)


def _decoded(body: bytes) -> str:
    if len(body) > MAX_BODY_BYTES:
        raise EndpointError(f"answer is larger than {MAX_BODY_BYTES >> 20} MiB: not a plugin's /metrics")
    return body.decode("utf-8", errors="replace")


def endpoint_url(text: str) -> str:
    """An `--endpoint` value as a URL: http(s) only; no path means /metrics. ValueError otherwise."""
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8080/metrics)")
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError as err:
        raise ValueError(f"{text!r}: {err}") from None
    if parts.path in ("", "/"):
        parts = parts._replace(path=METRICS_PATH)
    return urllib.parse.urlunsplit(parts)


def metrics_port(pod: Mapping[str, Any], default: int = DEFAULT_METRICS_PORT) -> int | None:
    """The plugin container's metrics port, as the plugin picks it: a `--metrics-port` flag (it wins
    over the variable), else the declared `metrics` port, else METRICS_PORT, else `default`. None
    when the plugin serves none (port 0)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    plugin = next(
        (c for c in containers if c.get("name") == PLUGIN_CONTAINER), containers[0] if containers else {}
    )
    words = [str(w) for w in (plugin.get("command") or []) + (plugin.get("args") or [])]
    for i, word in enumerate(words):
        if word.startswith(f"{METRICS_FLAG}="):
            return _port_number(word.partition("=")[2], default)
        if word == METRICS_FLAG and i + 1 < len(words):
            return _port_number(words[i + 1], default)
    for port in plugin.get("ports") or []:
        if port.get("name") == "metrics" and isinstance(port.get("containerPort"), int):
            return int(port["containerPort"])
    for env in plugin.get("env") or []:
        if env.get("name") == "METRICS_PORT" and isinstance(env.get("value"), str):
            return _port_number(env["value"], default)
    return default


def _port_number(text: str, default: int) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return default  # not a number the plugin would start with: try the usual port
    return value if value > 0 else None


@dataclass(frozen=True, slots=True)
class Discovery:
    """The plugin pods found: an endpoint for each one that serves metrics, and a note for each
    one skipped (not running, or serving no metrics)."""

    endpoints: list[PodEndpoint]
    skipped: list[str]


def discover_plugin_pods(
    api: KubeApi,
    *,
    selector: str = DEFAULT_SELECTOR,
    namespace: str | None = None,
    node: str | None = None,
    default_port: int = DEFAULT_METRICS_PORT,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> Discovery:
    """The running kubelet plugin pods (all namespaces unless `namespace`), on `node` if given.
    Raises ApiError when the pods cannot be listed."""
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    query = {"labelSelector": selector}
    if node:
        query["fieldSelector"] = f"spec.nodeName={node}"
    pods, _ = api.list(path, query=query)
    endpoints: list[PodEndpoint] = []
    skipped: list[str] = []
    for pod in sorted(pods, key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"])):
        meta = pod["metadata"]
        ref = f"pod {meta.get('namespace', '')}/{meta['name']}"
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Running" or meta.get("deletionTimestamp"):
            skipped.append(
                f"{ref}: {phase or 'no phase'}{', terminating' if meta.get('deletionTimestamp') else ''}"
            )
            continue
        port = metrics_port(pod, default_port)
        if port is None:
            skipped.append(f"{ref}: serves no metrics (METRICS_PORT 0; the chart's metrics.port)")
            continue
        node_name = (pod.get("spec") or {}).get("nodeName", "")
        endpoints.append(
            PodEndpoint(api, meta.get("namespace", ""), meta["name"], node_name, port, timeout_s)
        )
    return Discovery(endpoints, skipped)


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    endpoint: str
    text: str


@dataclass(frozen=True, slots=True)
class ScrapeFailure:
    endpoint: str
    error: str


def scrape_all(endpoints: Sequence[Endpoint]) -> list[ScrapeResult | ScrapeFailure]:
    """Each endpoint's text, or why it could not be read, in the order given."""
    if not endpoints:
        return []

    def one(endpoint: Endpoint) -> ScrapeResult | ScrapeFailure:
        try:
            return ScrapeResult(endpoint.name, endpoint.fetch())
        except EndpointError as err:
            return ScrapeFailure(endpoint.name, str(err))

    with ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL, len(endpoints)), thread_name_prefix="top-scrape"
    ) as pool:
        return list(pool.map(one, endpoints))


def url_endpoints(urls: Iterable[str], timeout_s: float = SCRAPE_TIMEOUT_S) -> list[UrlEndpoint]:
    return [UrlEndpoint(url, timeout_s) for url in urls]
