"""`dra-controller top`: exposition text to claimed-device rows, waste order, filters, the table, and
the command against endpoints on loopback (canned text served by a real HTTP server, one that is down,
one that is not Prometheus text)."""

# ruff: noqa: E501 (the canned exposition lines are as long as a plugin writes them)

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import main
from controller.top import sources
from controller.top.snapshot import ClaimedDevice, ExpositionError, read_exposition
from controller.top.table import by_waste, format_bytes, format_duration, render, select

GiB = 1 << 30

# What a plugin on node-a serves: a busy claim shared by two pods on gpu-0, an idle claim on gpu-1, an
# unclaimed gpu-2, and metrics `top` does not read.
NODE_A = f"""\
# HELP draplugin_device_gpu_utilization_ratio SM busy fraction.
# TYPE draplugin_device_gpu_utilization_ratio gauge
draplugin_device_gpu_utilization_ratio{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3"}} 0.5
draplugin_device_gpu_utilization_ratio{{node="node-a",device="gpu-1",uuid="GPU-1",model="NVIDIA A100-SXM4-40GB"}} 0.01
draplugin_device_gpu_utilization_ratio{{node="node-a",device="gpu-2",uuid="GPU-2",model="NVIDIA A100-SXM4-40GB"}} 0.9
# TYPE draplugin_device_memory_used_bytes gauge
draplugin_device_memory_used_bytes{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3"}} {30 * GiB}
draplugin_device_memory_used_bytes{{node="node-a",device="gpu-1",uuid="GPU-1",model="NVIDIA A100-SXM4-40GB"}} {GiB}
# TYPE draplugin_device_memory_total_bytes gauge
draplugin_device_memory_total_bytes{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3"}} {80 * GiB}
draplugin_device_memory_total_bytes{{node="node-a",device="gpu-1",uuid="GPU-1",model="NVIDIA A100-SXM4-40GB"}} {40 * GiB}
draplugin_device_memory_total_bytes{{node="node-a",device="gpu-2",uuid="GPU-2",model="NVIDIA A100-SXM4-40GB"}} {40 * GiB}
# TYPE draplugin_claim_gpu_utilization_ratio gauge
draplugin_claim_gpu_utilization_ratio{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3",namespace="team-a",claim="train",pod="train-0",container="main"}} 0.3
draplugin_claim_gpu_utilization_ratio{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3",namespace="team-a",claim="train",pod="train-1",container="main"}} 0.2
draplugin_claim_gpu_utilization_ratio{{node="node-a",device="gpu-1",uuid="GPU-1",model="NVIDIA A100-SXM4-40GB",namespace="team-b",claim="notebook",pod="nb",container="lab"}} 0.01
# TYPE draplugin_claim_memory_used_bytes gauge
draplugin_claim_memory_used_bytes{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3",namespace="team-a",claim="train",pod="train-0",container="main"}} {20 * GiB}
draplugin_claim_memory_used_bytes{{node="node-a",device="gpu-0",uuid="GPU-0",model="NVIDIA H100 80GB HBM3",namespace="team-a",claim="train",pod="train-1",container="main"}} {10 * GiB}
draplugin_claim_memory_used_bytes{{node="node-a",device="gpu-1",uuid="GPU-1",model="NVIDIA A100-SXM4-40GB",namespace="team-b",claim="notebook",pod="nb",container="lab"}} {GiB}
# TYPE draplugin_claim_idle_seconds gauge
draplugin_claim_idle_seconds{{node="node-a",namespace="team-a",claim="train"}} 0
draplugin_claim_idle_seconds{{node="node-a",namespace="team-b",claim="notebook"}} 2700
# TYPE draplugin_claim_idle gauge
draplugin_claim_idle{{node="node-a",namespace="team-a",claim="train"}} 0
draplugin_claim_idle{{node="node-a",namespace="team-b",claim="notebook"}} 1
# TYPE draplugin_claim_operations_total counter
draplugin_claim_operations_total{{operation="prepare",result="success"}} 4
"""

# node-b: one claim that is quiet but not yet past the idle duration, with no pod reserved yet.
NODE_B = f"""\
# TYPE draplugin_device_gpu_utilization_ratio gauge
draplugin_device_gpu_utilization_ratio{{node="node-b",device="gpu-0",uuid="GPU-B0",model="NVIDIA L4"}} 0.02
# TYPE draplugin_device_memory_total_bytes gauge
draplugin_device_memory_total_bytes{{node="node-b",device="gpu-0",uuid="GPU-B0",model="NVIDIA L4"}} {24 * GiB}
# TYPE draplugin_claim_gpu_utilization_ratio gauge
draplugin_claim_gpu_utilization_ratio{{node="node-b",device="gpu-0",uuid="GPU-B0",model="NVIDIA L4",namespace="team-a",claim="quiet",pod="",container=""}} 0.02
# TYPE draplugin_claim_idle_seconds gauge
draplugin_claim_idle_seconds{{node="node-b",namespace="team-a",claim="quiet"}} 120
# TYPE draplugin_claim_idle gauge
draplugin_claim_idle{{node="node-b",namespace="team-a",claim="quiet"}} 0
"""


def rows_of(*texts: str) -> list[ClaimedDevice]:
    return [row for text in texts for row in read_exposition(text, "test").rows]


def test_rows_sum_a_claims_holders_per_device_and_carry_device_memory_and_idle_time() -> None:
    usage = read_exposition(NODE_A, "node-a-endpoint")
    assert usage.sampled_devices == 3
    rows = {(r.node, r.device): r for r in usage.rows}
    assert set(rows) == {("node-a", "gpu-0"), ("node-a", "gpu-1")}, "the unclaimed gpu-2 gets no row"
    train = rows[("node-a", "gpu-0")]
    assert (train.namespace, train.claim, train.pods) == ("team-a", "train", ("train-0", "train-1"))
    assert train.utilization == pytest.approx(0.5)
    assert (train.memory_used_bytes, train.memory_total_bytes) == (30 * GiB, 80 * GiB)
    assert (train.idle_seconds, train.idle, train.model, train.uuid) == (
        0,
        False,
        "NVIDIA H100 80GB HBM3",
        "GPU-0",
    )
    assert train.source == "node-a-endpoint"
    notebook = rows[("node-a", "gpu-1")]
    assert (notebook.claim, notebook.idle, notebook.idle_seconds) == ("notebook", True, 2700)


def test_holder_series_never_make_a_claim_busier_than_its_device() -> None:
    doubled = NODE_B.replace('pod="",container=""} 0.02', 'pod="a",container=""} 0.02').replace(
        "# TYPE draplugin_claim_idle_seconds",
        'draplugin_claim_gpu_utilization_ratio{node="node-b",device="gpu-0",uuid="GPU-B0",model="NVIDIA L4",'
        'namespace="team-a",claim="quiet",pod="b",container=""} 0.02\n# TYPE draplugin_claim_idle_seconds',
    )
    (row,) = rows_of(doubled)
    assert row.pods == ("a", "b")
    assert row.utilization == pytest.approx(0.02)  # 0.04 summed, bounded by the device's 0.02


def test_a_claim_without_pods_and_a_device_without_memory_reading_show_as_unknown() -> None:
    (row,) = rows_of(NODE_B)
    assert row.pods == ()
    assert row.memory_used_bytes is None
    table = render([row])
    assert "<none>" in table and "?/24Gi" in table


def test_waste_order_idle_claims_first_then_longest_idle_then_lowest_utilization_then_most_memory() -> None:
    rows = rows_of(NODE_A, NODE_B)
    assert [r.claim for r in by_waste(rows)] == ["notebook", "quiet", "train"]
    same_idle = [
        ClaimedDevice("n", "gpu-0", "ns", "small-busy", utilization=0.4, memory_total_bytes=10 * GiB),
        ClaimedDevice("n", "gpu-1", "ns", "big-busy", utilization=0.4, memory_total_bytes=80 * GiB),
        ClaimedDevice("n", "gpu-2", "ns", "lazy", utilization=0.1, memory_total_bytes=10 * GiB),
        ClaimedDevice("n", "gpu-3", "ns", "unsampled", utilization=None, memory_total_bytes=80 * GiB),
    ]
    assert [r.claim for r in by_waste(same_idle)] == ["lazy", "big-busy", "small-busy", "unsampled"]


def test_filters_by_claim_namespace_node_and_idle_flag() -> None:
    rows = rows_of(NODE_A, NODE_B)
    assert {r.claim for r in select(rows, namespace="team-a")} == {"train", "quiet"}
    assert {r.claim for r in select(rows, node="node-b")} == {"quiet"}
    assert {r.claim for r in select(rows, idle_only=True)} == {"notebook"}
    assert select(rows, namespace="team-b", node="node-b") == []


def test_table_has_kubectl_style_columns_and_flags_the_idle_claim() -> None:
    lines = render(by_waste(rows_of(NODE_A))).splitlines()
    assert lines[0].split() == ["NODE", "DEVICE", "MODEL", "CLAIM", "PODS", "UTIL", "MEMORY", "IDLE", "FOR"]
    assert lines[1].split() == [
        "node-a", "gpu-1", "NVIDIA", "A100-SXM4-40GB", "team-b/notebook", "nb", "1%", "1Gi/40Gi", "45m", "IDLE",
    ]  # fmt: skip
    assert lines[2].split() == [
        "node-a", "gpu-0", "NVIDIA", "H100", "80GB", "HBM3", "team-a/train", "train-0,train-1", "50%", "30Gi/80Gi",
        "-",
    ]  # fmt: skip
    # Columns line up: every cell of a column starts where its header does.
    start = lines[0].index("CLAIM")
    assert all(line[start:].startswith("team-") for line in lines[1:])


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "?"), (0, "0"), (512, "512"), (1536, "1.5Ki"), (80 * GiB, "80Gi"), (int(1.25 * GiB), "1.2Gi")],
)
def test_format_bytes(value: float | None, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "-"), (12, "12s"), (90, "1m30s"), (2700, "45m"), (7500, "2h5m"), (90000, "1d1h")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["<html><body>404</body></html>", 'draplugin_claim_idle{node="a} 1'])
def test_text_that_is_not_prometheus_exposition_is_refused_with_the_parser_reason(text: str) -> None:
    with pytest.raises(ExpositionError, match="not Prometheus text exposition"):
        read_exposition(text)


# --- the command against loopback endpoints ------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    body: bytes = b""


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[_Server] = []

    def start(body: str) -> str:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.body = body.encode()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_top_reads_every_endpoint_and_lists_one_that_is_down_without_hiding_the_rest(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = serve(NODE_A), serve(NODE_B)
    down = f"http://127.0.0.1:{closed_port()}/metrics"
    code = main(["top", "--endpoint", a, "--endpoint", f"{b}/metrics", "--endpoint", down, "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 1
    data = json.loads(out)
    assert [(d["node"], d["claim"]) for d in data["devices"]] == [
        ("node-a", "notebook"),
        ("node-b", "quiet"),
        ("node-a", "train"),
    ]
    assert data["devices"][0]["source"] == f"{a}/metrics"
    assert data["devices"][2]["gpuUtilizationRatio"] == pytest.approx(0.5)
    (error,) = data["errors"]
    assert error["endpoint"] == down and "cannot connect" in error["error"]
    assert f"error: cannot read {down}: cannot connect" in err


def test_top_table_and_yaml_with_filters(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = serve(NODE_A), serve(NODE_B)
    assert main(["top", "--endpoint", a, "--endpoint", b, "--idle"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[0].startswith("NODE") and len(out.splitlines()) == 2 and "team-b/notebook" in out
    assert (
        main(["top", "--endpoint", a, "--endpoint", b, "-n", "team-a", "--node", "node-b", "-o", "yaml"]) == 0
    )
    data = yaml.safe_load(capsys.readouterr().out)
    assert [d["claim"] for d in data["devices"]] == ["quiet"] and data["errors"] == []
    assert main(["top", "--endpoint", a, "-n", "nowhere"]) == 0
    assert capsys.readouterr().out.strip() == "No claimed devices found."


def test_top_reports_an_endpoint_that_is_not_a_plugin_and_one_that_samples_nothing(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    html, quiet = (
        serve("<html>hello</html>"),
        serve("# TYPE draplugin_prepared_claims gauge\ndraplugin_prepared_claims 0\n"),
    )
    assert main(["top", "--endpoint", html, "--endpoint", quiet]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == "No claimed devices found."
    assert f"error: cannot read {html}/metrics: not Prometheus text exposition" in err
    assert f"note: {quiet}/metrics exports no device usage" in err


def test_an_endpoint_answering_an_http_error_is_named_with_its_status(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    base = serve(NODE_A)
    assert main(["top", "--endpoint", f"{base}/not-metrics", "-o", "json"]) == 1
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["error"].startswith("HTTP 404")


@pytest.mark.parametrize(
    "url", ["ftp://host/metrics", "127.0.0.1:8080", "http://host:port/metrics", "http:///x"]
)
def test_a_bad_endpoint_url_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["top", "--endpoint", url])
    assert exit_info.value.code == 2
    assert "--endpoint" in capsys.readouterr().err


def test_endpoint_urls_without_a_path_get_metrics() -> None:
    assert sources.endpoint_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/metrics"
    assert sources.endpoint_url("https://h:1/custom") == "https://h:1/custom"


# --- finding the plugin pods ------------------------------------------------------------------------------


def plugin_pod(name: str, *, node: str = "n1", phase: str = "Running", **container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpu-system"},
        "spec": {"nodeName": node, "containers": [{"name": "plugin", **container}]},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("container", "port"),
    [
        (
            {
                "ports": [
                    {"name": "healthcheck", "containerPort": 51515},
                    {"name": "metrics", "containerPort": 9400},
                ]
            },
            9400,
        ),
        ({"env": [{"name": "METRICS_PORT", "value": "9401"}]}, 9401),  # host network: no ports declared
        ({"env": [{"name": "METRICS_PORT", "value": "0"}]}, None),
        # A flag wins over the variable in the plugin, so here too (the dev cluster's releases).
        (
            {
                "args": ["--log-format=text", "--metrics-port=9402"],
                "env": [{"name": "METRICS_PORT", "value": "0"}],
            },
            9402,
        ),
        ({"args": ["--metrics-port", "0"], "ports": [{"name": "metrics", "containerPort": 9400}]}, None),
        ({}, sources.DEFAULT_METRICS_PORT),
    ],
)
def test_metrics_port_of_a_plugin_pod(container: dict[str, Any], port: int | None) -> None:
    assert sources.metrics_port(plugin_pod("p", **container)) == port


class _ListingApi:
    """KubeApi's list and get_bytes, answering from a fixed set of pods and per-path bodies."""

    def __init__(self, pods: list[dict[str, Any]], bodies: dict[str, bytes]) -> None:
        self.pods = pods
        self.bodies = bodies
        self.listed: list[tuple[str, dict[str, str]]] = []

    def list(self, path: str, *, query: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
        self.listed.append((path, query))
        return self.pods, "1"

    def get_bytes(self, path: str, query: Any = None, *, timeout: Any = None) -> bytes:
        from dracommon.kubeapi import ApiError

        if path not in self.bodies:
            raise ApiError(
                503, "error trying to reach service: dial tcp 10.0.0.9:8080: connect: connection refused"
            )
        return self.bodies[path]


def test_discovery_lists_plugin_pods_by_label_and_reads_them_through_the_pod_proxy() -> None:
    pods = [
        plugin_pod("plugin-b", node="n2", ports=[{"name": "metrics", "containerPort": 8080}]),
        plugin_pod("plugin-a", ports=[{"name": "metrics", "containerPort": 8080}]),
        plugin_pod("plugin-c", phase="Pending"),
        plugin_pod("plugin-d", env=[{"name": "METRICS_PORT", "value": "0"}]),
    ]
    api = _ListingApi(
        pods, {"/api/v1/namespaces/gpu-system/pods/plugin-a:8080/proxy/metrics": NODE_A.encode()}
    )
    found = sources.discover_plugin_pods(api, node="n1")  # type: ignore[arg-type]
    assert api.listed == [
        ("/api/v1/pods", {"labelSelector": sources.DEFAULT_SELECTOR, "fieldSelector": "spec.nodeName=n1"})
    ]
    assert [e.pod for e in found.endpoints] == ["plugin-a", "plugin-b"]
    assert found.skipped == [
        "pod gpu-system/plugin-c: Pending",
        "pod gpu-system/plugin-d: serves no metrics (METRICS_PORT 0; the chart's metrics.port)",
    ]
    first, second = sources.scrape_all(found.endpoints)
    assert isinstance(first, sources.ScrapeResult) and first.text == NODE_A
    assert isinstance(second, sources.ScrapeFailure)
    assert second.endpoint == "pod gpu-system/plugin-b (node n2, port 8080)"
    assert "through the API server's pod proxy: HTTP 503: error trying to reach service" in second.error


def test_plugin_namespace_narrows_the_listing() -> None:
    api = _ListingApi([], {})
    sources.discover_plugin_pods(api, namespace="gpu-system", selector="app=x")  # type: ignore[arg-type]
    assert api.listed == [("/api/v1/namespaces/gpu-system/pods", {"labelSelector": "app=x"})]


def test_saved_scrapes_are_read_from_files_and_a_missing_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "node-b.prom"
    saved.write_text(NODE_B)
    missing = tmp_path / "gone.prom"
    assert main(["top", "--metrics-file", str(saved), "--metrics-file", str(missing), "-o", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(d["claim"], d["source"]) for d in data["devices"]] == [("quiet", str(saved))]
    assert data["errors"] == [
        {"endpoint": str(missing), "error": "cannot read the file: No such file or directory"}
    ]
