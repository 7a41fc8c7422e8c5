"""The usage part of `make demo`: a GPU that stays idle, a claim that holds it, and `dra-controller top`.

The fake GPUs' utilization moves on its own (draplugin.devices.fakeusage: a wave per GPU
index and the wall clock); the demo marks its one H100 `usage: idle` and makes a claim for
exactly that GPU, so after the demo's short idle threshold (DEMO_USAGE: 2s samples, under 5%
for 20s; the chart's defaults are for real clusters) the plugin flags that claim idle while
the example's claim stays busy. `top` runs as a user runs it, `dra-controller top --endpoint
URL`: the plugin is on the host network of a node whose address is loopback, which the API
server's pod proxy refuses to reach.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from devcluster.binaries import REPO_ROOT
from devcluster.chart import FAKE_GPU_VALUES
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME

IDLE_GPU_MODEL = "H100-80GB-HBM3"  # the fake model key of values-fake-gpus.yaml's one H100
IDLE_GPU_PRODUCT = "NVIDIA H100 80GB HBM3"  # its productName attribute
IDLE_CLAIM = "idle-notebook"
DEMO_USAGE: dict[str, Any] = {"sampleInterval": "2s", "idleThresholdPercent": 5, "idleAfter": "20s"}
IDLE_AFTER_S = 20.0
TOP_TIMEOUT_S = 30.0


class DemoUsageError(RuntimeError):
    """`top` did not show what the demo set up; the message has top's own output."""


def demo_values() -> dict[str, Any]:
    """Chart values over the fake-GPU ones: short usage settings, and the H100 stays idle."""
    fake = copy.deepcopy(yaml.safe_load(FAKE_GPU_VALUES.read_text())["kubeletPlugin"]["fakeGpus"])
    entries = [e for e in fake["gpus"] if e.get("model") == IDLE_GPU_MODEL]
    if len(entries) != 1 or entries[0].get("count", 1) != 1:
        raise DemoUsageError(f"{FAKE_GPU_VALUES} must list exactly one {IDLE_GPU_MODEL} for the idle claim")
    entries[0]["usage"] = "idle"
    return {"usage": DEMO_USAGE, "kubeletPlugin": {"fakeGpus": fake}}


def idle_claim_objects(node_name: str, image: str) -> list[dict[str, Any]]:
    """A claim for the idle H100, and a pod that holds it and does nothing (a forgotten notebook)."""
    selector = f'device.attributes["{DEFAULT_DRIVER_NAME}"].productName == "{IDLE_GPU_PRODUCT}"'
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": IDLE_CLAIM},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DEFAULT_DRIVER_NAME,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": IDLE_CLAIM},
        "spec": {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node_name},
            "containers": [
                {
                    "name": "lab",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": IDLE_CLAIM}],
        },
    }
    return [claim, pod]


def top_command(endpoint: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "controller.cli", "top", "--endpoint", endpoint, *extra]


def run_top(endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        top_command(endpoint, *extra),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TOP_TIMEOUT_S,
        check=False,
    )


def wait_for_top(endpoint: str, what: str, ready: Any, timeout_s: float) -> str:
    """`top`'s table once its JSON satisfies `ready(devices)`; DemoUsageError with top's output if never."""
    last: list[subprocess.CompletedProcess[str]] = []

    def probe() -> bool:
        run = run_top(endpoint, "-o", "json")
        last[:] = [run]
        if run.returncode != 0:
            return False
        return bool(ready(json.loads(run.stdout)["devices"]))

    try:
        wait_for(what, probe, timeout_s, interval=1.0)
    except AssertionError:
        shown = f"\n{last[0].stdout[-2000:]}{last[0].stderr[-2000:]}" if last else ""
        raise DemoUsageError(
            f"`{' '.join(top_command(endpoint))}` did not show {what} within {timeout_s:.0f}s{shown}"
        ) from None
    table = run_top(endpoint)
    return table.stdout.rstrip()


def claims_with_pods(namespace: str, claims: Sequence[str]) -> Any:
    """A `ready` test: every claim listed, with a pod and a utilization reading."""

    def ready(devices: list[dict[str, Any]]) -> bool:
        shown = {d["claim"] for d in devices if d["namespace"] == namespace and d["pods"]}
        sampled = all(d["gpuUtilizationRatio"] is not None for d in devices)
        return set(claims) <= shown and sampled

    return ready


def idle_flagged(namespace: str, claim: str) -> Any:
    def ready(devices: list[dict[str, Any]]) -> bool:
        return any(d["namespace"] == namespace and d["claim"] == claim and d["idle"] for d in devices)

    return ready
