"""The chart's containers run commands our CLIs accept.

The chart spells `draplugin run` and `dra-controller run` as a command, flags
and environment variables; a renamed flag or variable would only show up as a
crash-looping pod. These tests render the chart and hand each container's
command line and environment to the real parsers and settings validation.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller import cli as controller_cli
from controller.run.command import resolve as resolve_controller_settings
from draplugin import cli as plugin_cli
from draplugin import config as plugin_config
from tests.integration.test_chart import NON_DEFAULT_VALUES, by_kind, render_chart
from tests.kube.chart import FAKE_GPU_VALUES

# What the downward API would fill in on a real node.
DOWNWARD_API = {
    "spec.nodeName": "gpu-node-1",
    "metadata.uid": "0d7c3f6e-5b1a-4c2e-9f1d-2a6b8c9e0f11",
    "metadata.name": "draplugin-kubelet-plugin-abcde",
    "metadata.namespace": "draplugin-system",
    "status.podIP": "10.0.0.7",
}

VALUE_SETS = pytest.mark.parametrize(
    "values",
    [None, NON_DEFAULT_VALUES, yaml.safe_load(FAKE_GPU_VALUES.read_text())],
    ids=["default", "non-default", "values-fake-gpus"],
)


def containers(objects: list[dict[str, Any]], program: str) -> list[Mapping[str, Any]]:
    found = [
        container
        for kind in ("DaemonSet", "Deployment")
        for obj in by_kind(objects, kind)
        for container in obj["spec"]["template"]["spec"]["containers"]
        if container.get("command", [None])[0] == program
    ]
    assert found, f"no container runs {program}"
    return found


def environment(container: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = DOWNWARD_API[field]
    return env


def parsed(parser: argparse.ArgumentParser, container: Mapping[str, Any]) -> dict[str, Any]:
    args = parser.parse_args([*container["command"][1:], *container.get("args", [])])
    return {k: v for k, v in vars(args).items() if k not in ("handler", "command")}


@VALUE_SETS
def test_plugin_container_settings_are_valid(values: dict[str, Any] | None, tmp_path: Path) -> None:
    for container in containers(render_chart(tmp_path, values), "draplugin"):
        env = environment(container)
        # The fake inventory is mounted from a ConfigMap in the pod: stand in for the mount.
        if "DRAPLUGIN_FAKE_CONFIG" in env:
            inventory = tmp_path / "fake-gpus.yaml"
            inventory.write_text(yaml.safe_dump({"gpus": [{"model": "L4", "count": 1}]}))
            env["DRAPLUGIN_FAKE_CONFIG"] = str(inventory)
        settings = plugin_config.load(parsed(plugin_cli.build_parser(), container), env)
        assert settings.node_name == DOWNWARD_API["spec.nodeName"]
        assert settings.pod_uid == DOWNWARD_API["metadata.uid"]
        # Health and metrics listen on the pod's (under host networking, the node's) address only.
        if "HEALTHCHECK_PORT" in env:  # the health listener runs only with the liveness probe
            assert settings.healthcheck_address == DOWNWARD_API["status.podIP"]
        assert settings.metrics_address == DOWNWARD_API["status.podIP"]
        assert settings.driver_name == (values or {}).get("driverName", "gpu.draplugin.dev")


@VALUE_SETS
def test_controller_container_settings_are_valid(values: dict[str, Any] | None, tmp_path: Path) -> None:
    for container in containers(render_chart(tmp_path, values), "dra-controller"):
        env = environment(container)
        options = argparse.Namespace(**parsed(controller_cli.build_parser(), container))
        settings = resolve_controller_settings(options, env)
        # Leader election: the pod's name as identity, a Lease in the release's namespace.
        assert settings["identity"] == DOWNWARD_API["metadata.name"]
        assert settings["lease_namespace"] == "draplugin-system"
        assert settings["driver_name"] == (values or {}).get("driverName", "gpu.draplugin.dev")
        assert settings["metrics_port"] == ((values or {}).get("metrics") or {}).get("port", 8080)
