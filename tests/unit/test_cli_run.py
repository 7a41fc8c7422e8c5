"""`draplugin run`: flags, environment mirrors, validation, and serving until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from draplugin import cli, config
from draplugin.config import ConfigError
from draplugin.kubelet.interface import ClaimRef
from draplugin.kubelet.sockets import socket_paths
from tests.kubelet_client import FakeKubelet, StaticDriver

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT = 10.0

# `run` configures the root logger (tests/unit/conftest.py puts it back after each test).
pytestmark = pytest.mark.usefixtures("restore_root_logger")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own KUBECONFIG, NODE_NAME, ... must not leak into these tests."""
    for option in config.RUN_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv(cli.DRIVER_FACTORY_ENV, raising=False)


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))  # short: socket paths have a 107-byte limit
    yield root
    shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- settings ---------------------------------------------------------------------------------


def test_defaults_apply_when_only_the_node_name_is_given() -> None:
    settings = config.load({"node_name": "node-1"}, environ={})
    assert settings.driver_name == "gpu.draplugin.dev"
    assert settings.kubelet_root_dir == Path("/var/lib/kubelet")
    assert settings.state_dir == Path("/var/lib/draplugin")
    assert settings.cdi_root == Path("/var/run/cdi")
    assert settings.backend == "nvml"
    assert settings.kubeconfig is None
    assert (settings.log_format, settings.log_level) == ("text", "info")
    assert settings.metrics_port == 8080
    assert settings.pod_uid is None and settings.healthcheck_port is None


def test_environment_fills_in_and_flags_win(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    environ = {
        "DRIVER_NAME": "env.example.com",
        "NODE_NAME": "env-node",
        "BACKEND": "fake",
        "KUBECONFIG": str(kubeconfig),
        "LOG_FORMAT": "json",
        "METRICS_PORT": "9000",
        "POD_UID": "",  # empty means unset (a downward-API field may be empty)
        "HEALTHCHECK_PORT": "51515",
    }
    settings = config.load({"node_name": "flag-node", "metrics_port": "0"}, environ)
    assert settings.node_name == "flag-node"
    assert settings.metrics_port == 0
    assert settings.driver_name == "env.example.com"
    assert settings.backend == "fake"
    assert settings.kubeconfig == kubeconfig
    assert settings.log_format == "json"
    assert settings.pod_uid is None
    assert settings.healthcheck_port == 51515


def test_every_flag_has_a_distinct_environment_mirror() -> None:
    flags = [o.flag for o in config.RUN_OPTIONS]
    envs = [o.env for o in config.RUN_OPTIONS]
    assert len(set(flags)) == len(flags) and len(set(envs)) == len(envs)
    assert {
        "--driver-name",
        "--node-name",
        "--kubelet-root-dir",
        "--state-dir",
        "--cdi-root",
        "--backend",
        "--kubeconfig",
        "--log-format",
        "--metrics-port",
        "--pod-uid",
        "--healthcheck-port",
    } <= set(flags)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--node-name (NODE_NAME) is required"),
        (["--node-name", "Node_1"], "--node-name (NODE_NAME): 'Node_1' is not a DNS subdomain"),
        (
            ["--driver-name", "GPU.example.com"],
            "--driver-name (DRIVER_NAME): driver name 'GPU.example.com' must be a lowercase DNS subdomain",
        ),
        (["--driver-name", "a" * 64], "must be a lowercase DNS subdomain of at most 63 characters"),
        (["--kubelet-root-dir", "var/lib"], "--kubelet-root-dir (KUBELET_ROOT_DIR): 'var/lib' must"),
        (["--state-dir", "relative"], "--state-dir (STATE_DIR): 'relative' must be an absolute path"),
        (["--cdi-root", "cdi"], "--cdi-root (CDI_ROOT): 'cdi' must be an absolute path"),
        (["--backend", "cuda"], "--backend (BACKEND): 'cuda' is not one of nvml, fake"),
        (["--log-format", "xml"], "--log-format (LOG_FORMAT): 'xml' is not one of text, json"),
        (["--log-level", "trace"], "--log-level (LOG_LEVEL): 'trace' is not one of"),
        (["--metrics-port", "http"], "--metrics-port (METRICS_PORT): 'http' is not a port number"),
        (["--metrics-port", "70000"], "--metrics-port (METRICS_PORT): 70000 is outside 0-65535"),
        (["--healthcheck-port", "-1"], "--healthcheck-port (HEALTHCHECK_PORT): -1 is outside 0-65535"),
        (["--pod-uid", "../x"], "--pod-uid (POD_UID): '../x' is not a valid pod UID"),
        (["--kubeconfig", "/nonexistent/kc"], "--kubeconfig (KUBECONFIG): /nonexistent/kc is not a readable"),
    ],
)
def test_bad_settings_exit_2_with_a_specific_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [] if any(a == "--node-name" for a in args) or not args else ["--node-name", "node-1"]
    assert cli.main(["run", *base, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draplugin run: error: ")
    assert message in err


def test_bad_environment_value_is_reported_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-1")
    monkeypatch.setenv("METRICS_PORT", "eighty")
    assert cli.main(["run"]) == 2
    assert "METRICS_PORT" in capsys.readouterr().err


def test_a_file_where_a_directory_belongs_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        config.load({"node_name": "n", "state_dir": str(tmp_path / "state")}, environ={})


def test_unknown_flag_and_missing_subcommand_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--no-such-flag"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("tests.kubelet_client", "must look like module:function"),
        ("tests.no_such_module:factory", "cannot be loaded"),
        ("tests.kubelet_client:no_such_factory", "cannot be loaded"),
        ("tests.kubelet_client:KUBELET_SUPPORTED", "is not callable"),
    ],
)
def test_run_exits_1_when_the_driver_cannot_be_built(
    factory: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(cli.DRIVER_FACTORY_ENV, factory)
    assert cli.main(["run", "--node-name", "node-1", "--metrics-port", "0"]) == 1
    err = capsys.readouterr().err
    assert 'msg="cannot build the driver"' in err
    assert message in err


def test_subcommands_register_in_one_table() -> None:
    seen: list[str] = []

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--x")

    def handler(args: argparse.Namespace) -> int:
        seen.append(args.x)
        return 7

    command = cli.Subcommand("probe-test", "test only", add_arguments, handler)
    cli.register_subcommand(command)
    try:
        assert cli.main(["probe-test", "--x", "y"]) == 7
        assert seen == ["y"]
        with pytest.raises(ValueError, match="already registered"):
            cli.register_subcommand(cli.Subcommand("probe-test", "other", add_arguments, handler))
    finally:
        cli.COMMAND_LINE.unregister("probe-test")


# --- serving ----------------------------------------------------------------------------------


async def test_serve_registers_exposes_metrics_and_cleans_up(kubelet_root: Path) -> None:
    port = free_port()
    settings = config.load(
        {"node_name": "node-1", "kubelet_root_dir": str(kubelet_root), "metrics_port": str(port)}, environ={}
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(cli.serve(settings, StaticDriver(), stop))
    async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
        async with asyncio.timeout(WAIT):
            plugin = await kubelet.register_plugin()
        devices = await plugin.prepare([ClaimRef("default", "uid-1", "claim-1")])
        assert devices["uid-1"][0].cdi_device_ids == ("gpu.draplugin.dev/gpu=uid-1-gpu-0",)
    metrics = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT).read().decode()
    )
    assert 'draplugin_kubelet_registration_notifications_total{registered="true"}' in metrics
    assert "draplugin_kubelet_request_seconds" in metrics
    stop.set()
    async with asyncio.timeout(WAIT):
        assert await serving == 0
    paths = socket_paths(kubelet_root, "gpu.draplugin.dev")
    assert not paths.registration.exists() and not paths.dra.exists()


def test_sigterm_stops_the_daemon_and_removes_its_sockets(kubelet_root: Path) -> None:
    env = {
        **os.environ,
        cli.DRIVER_FACTORY_ENV: "tests.kubelet_client:static_driver_factory",
        "NODE_NAME": "node-1",
        "LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "draplugin.cli", "run"),
            *("--kubelet-root-dir", str(kubelet_root), "--metrics-port", "0", "--pod-uid", "1234-abcd"),
        ],
        cwd=REPO_ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    paths = socket_paths(kubelet_root, "gpu.draplugin.dev", "1234-abcd")
    try:
        deadline = time.monotonic() + WAIT
        while not paths.registration.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "registration socket never appeared"
            time.sleep(0.05)

        async def register_and_prepare() -> None:
            async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
                async with asyncio.timeout(WAIT):
                    plugin = await kubelet.register_plugin()
                assert await plugin.prepare([ClaimRef("default", "uid-1", "claim-1")])

        asyncio.run(register_and_prepare())
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert not paths.registration.exists() and not paths.dra.exists()
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    messages = [line["msg"] for line in lines]
    assert "kubelet registered the plugin" in messages
    assert "shutting down" in messages and messages[-1] == "stopped"
