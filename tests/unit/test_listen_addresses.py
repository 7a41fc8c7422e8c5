"""Where the plugin's TCP listeners bind, and that a rolling update's two pods can share them.

Under host networking the gRPC health listener and the metrics endpoint are
ports of the node: they bind one address (the chart passes the pod's IP,
which is the node's then, where the kubelet's probes and the scrapers
connect), loopback when none is given, never every address. The old and the
new plugin pod of a rolling update (maxSurge 1) bind the same port at once:
both listeners set SO_REUSEPORT, so the new pod starts instead of failing on
"Address already in use".

Loopback has the whole 127.0.0.0/8 on Linux: a listener bound to 127.0.0.1
only is not reachable on 127.0.0.2, one bound to every address is.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from draplugin import config
from draplugin.config import ConfigError
from draplugin.kubelet.server import KubeletPluginServer
from draplugin.metrics import MetricsEndpoint, serve_metrics
from tests.unit.test_kubelet_plugin_server import FakeDriver, options

WAIT = 10.0
BASE = {"driver_name": "gpu.draplugin.dev", "node_name": "node-a", "backend": "fake"}


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    # pytest's tmp_path is long enough to push socket paths past the AF_UNIX limit.
    root = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=WAIT):
            return True
    except ConnectionRefusedError:
        return False


@contextmanager
def metrics(host: str, port: int) -> Iterator[MetricsEndpoint]:
    endpoint = serve_metrics(host, port)
    try:
        yield endpoint
    finally:
        endpoint.close()


def test_metrics_bind_loopback_only_by_default() -> None:
    with metrics(config.DEFAULT_LISTEN_ADDRESS, 0) as endpoint:
        assert reachable("127.0.0.1", endpoint.port)
        assert not reachable("127.0.0.2", endpoint.port)
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=WAIT) as answer:
            assert b"python_info" in answer.read() or answer.status == 200


def test_two_metrics_endpoints_share_a_port_as_a_rolling_updates_two_pods_do() -> None:
    with metrics("127.0.0.1", 0) as old, metrics("127.0.0.1", old.port) as new:
        assert new.port == old.port
        old.close()  # the old pod goes: the new one serves alone
        with urllib.request.urlopen(f"http://127.0.0.1:{new.port}/metrics", timeout=WAIT) as answer:
            assert answer.status == 200


def test_metrics_on_an_ipv6_address() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no ::1 on this machine")
    with metrics("::1", 0) as endpoint:
        assert reachable("::1", endpoint.port)
        assert not reachable("127.0.0.1", endpoint.port)


async def test_the_health_listener_binds_loopback_only_by_default(kubelet_root: Path) -> None:
    async with KubeletPluginServer(FakeDriver(), options(kubelet_root, healthcheck_port=0)) as server:
        port = server.healthcheck_port
        assert port
        assert reachable("127.0.0.1", port)
        assert not reachable("127.0.0.2", port), "the health listener answers on every address"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=WAIT
            )
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_the_health_listener_binds_the_address_given(kubelet_root: Path) -> None:
    given = options(kubelet_root, healthcheck_port=0, healthcheck_host="127.0.0.2")
    async with KubeletPluginServer(FakeDriver(), given) as server:
        port = server.healthcheck_port
        assert port and reachable("127.0.0.2", port)
        assert not reachable("127.0.0.1", port)


def test_listen_addresses_from_flags_and_environment() -> None:
    defaults = config.load(dict(BASE), environ={})
    assert defaults.healthcheck_address == defaults.metrics_address == "127.0.0.1"
    chosen = config.load(
        dict(BASE), environ={"HEALTHCHECK_ADDRESS": "10.0.0.7", "METRICS_ADDRESS": "fd00::7"}
    )
    assert (chosen.healthcheck_address, chosen.metrics_address) == ("10.0.0.7", "fd00::7")
    with pytest.raises(
        ConfigError, match=r"--metrics-address \(METRICS_ADDRESS\): 'node-a.local' is not an IP"
    ):
        config.load(dict(BASE, metrics_address="node-a.local"), environ={})
