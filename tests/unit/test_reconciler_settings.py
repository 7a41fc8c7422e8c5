"""`dra-controller run` settings (flags, environment mirrors, bad values) and the health endpoint."""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from controller.run.command import SettingError, add_arguments, resolve
from controller.run.metrics import ControllerMetrics, MetricsServer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    values = resolve(parse(), {})
    assert values["lease_name"] == "dra-controller"
    assert values["lease_namespace"] == "kube-system"
    assert values["metrics_port"] == 8080
    assert values["event_after_seconds"] == 60.0
    assert values["namespace"] is None
    assert values["identity"]
    assert values["leader_elect"] is True
    assert values["leader_config"].lease_duration_s == 15
    assert values["leader_config"].renew_interval_s == 5.0
    assert values["driver_name"] == "gpu.draplugin.dev"


def test_the_charts_leader_election_flags() -> None:
    values = resolve(
        parse(
            "--leader-elect",
            "--leader-election-namespace=gpu-system",
            "--leader-election-lease-duration=30s",
            "--leader-election-renew-deadline=20s",
            "--leader-election-retry-period=500ms",
        ),
        {"POD_NAME": "controller-abc"},
    )
    assert values["leader_elect"] is True
    assert values["lease_namespace"] == "gpu-system"
    assert values["identity"] == "controller-abc"
    config = values["leader_config"]
    assert (config.lease_duration_s, config.renew_deadline_s, config.retry_period_s) == (30, 20.0, 0.5)
    assert resolve(parse("--leader-elect=false"), {})["leader_elect"] is False


def test_environment_mirrors_and_flag_precedence() -> None:
    env = {
        "DRA_CONTROLLER_LEASE_NAME": "from-env",
        "DRA_CONTROLLER_METRICS_PORT": "9000",
        "DRA_CONTROLLER_IDENTITY": "env-id",
        "POD_NAMESPACE": "gpu-system",
    }
    values = resolve(parse("--metrics-port", "9100"), env)
    assert values["lease_name"] == "from-env"
    assert values["metrics_port"] == 9100  # the flag wins
    assert values["identity"] == "env-id"
    assert values["lease_namespace"] == "gpu-system"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--metrics-port", "70000"], {}, "--metrics-port='70000': must be 0"),
        ([], {"DRA_CONTROLLER_EVENT_AFTER_SECONDS": "-1"}, "DRA_CONTROLLER_EVENT_AFTER_SECONDS='-1'"),
        (["--log-format", "xml"], {}, "must be text or json"),
        (["--leader-elect=maybe"], {}, "must be true or false"),
        (["--leader-election-lease-duration=5x"], {}, "duration such as 15s"),
        (["--leader-election-renew-deadline=20s"], {}, "renew deadline < lease duration"),
        (["--driver-name", "GPU_X"], {}, "--driver-name='GPU_X': driver name 'GPU_X' must be a lowercase"),
        (["--kubernetes-version", "1.20"], {}, "Kubernetes 1.20 is not supported"),
        (["--feature-gates", "DRADeviceTaints"], {}, "expected Name=true or Name=false"),
    ],
)
def test_bad_values_name_the_setting(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError, match=message.replace("[", r"\[")):
        resolve(parse(*argv), env)


def test_healthz_and_metrics() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    metrics.leader.set(1)
    problem: list[str] = []
    server = MetricsServer(0, registry, lambda: problem[0] if problem else None, host="127.0.0.1")
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
            assert response.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            assert "dra_controller_leader 1.0" in response.read().decode()
        problem.append("thread reconcile exited")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/healthz", timeout=5)
        assert err.value.code == 503
        assert "thread reconcile exited" in err.value.read().decode()
    finally:
        server.stop()


def test_release_and_gates_are_parsed() -> None:
    values = resolve(parse("--kubernetes-version", "v1.34.4", "--feature-gates", "DRADeviceTaints=true"), {})
    assert values["kubernetes_version"] == (1, 34)
    assert values["feature_gates"] == {"DRADeviceTaints": True}
    assert resolve(parse(), {})["kubernetes_version"] is None  # read from the API server at start
