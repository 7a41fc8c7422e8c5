"""The README's main-job command: `make demo` runs `python -m devcluster.demo`.

This runs the demo once (`--once`) as a user would and checks what it prints:
that the kubelet plugin runs as a pod of the chart's DaemonSet (installed with
Helm, our image in a real containerd container) and the controller as a pod of
its Deployment, the devices the plugin pod published, the claim's allocation,
the CDI spec it wrote, and what the two containers that share one claim got,
from their own logs and from exec into them. The demo starts its own control
plane, containerd and kubelet, builds (or reuses) our image and imports it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
# Cold caches aside, the demo builds our image when an input changed (about a
# minute here) and imports it into a fresh containerd (about 20 s); `top` then waits for the
# plugin's usage samples and the demo's 20 s idle threshold (about 40 s in all).
DEMO_TIMEOUT = 600
DAEMON = re.compile(
    r"the (kubelet plugin|controller) runs as pod draplugin/(\S+) of (DaemonSet|ReplicaSet)/(\S+) "
    r"on node (\S+), image (\S+), container containerd://[0-9a-f]+"
)


def sections(output: str) -> dict[str, str]:
    """The demo's `--- title` blocks, by title (first line after the marker)."""
    found: dict[str, str] = {}
    for block in output.split("\n--- ")[1:]:
        title, _, body = block.partition("\n")
        found[title.strip()] = body
    return found


def section(found: dict[str, str], prefix: str) -> str:
    matches = [body for title, body in found.items() if title.startswith(prefix)]
    assert len(matches) == 1, f"expected one section starting {prefix!r}, got titles {list(found)}"
    return matches[0]


def leading_json(body: str) -> Any:
    """The JSON document a section starts with (text may follow it)."""
    value, _ = json.JSONDecoder().raw_decode(body.lstrip())
    return value


def top_rows(table: str) -> list[dict[str, str]]:
    """The rows of a `dra-controller top` table, by column: cells start where their header does. The
    table ends at the demo's next step (`==> ...`) or a blank line."""
    header, *rest = table.strip("\n").splitlines()
    lines = list(itertools.takewhile(lambda line: line.strip() and not line.startswith("==>"), rest))
    names = ["NODE", "DEVICE", "MODEL", "CLAIM", "PODS", "UTIL", "MEMORY", "IDLE FOR"]
    starts = [header.index(name) for name in names]
    ends = [*starts[1:], None]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)} for line in lines]


def run_demo_once(state_dir: Path, timeout_s: float, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m devcluster.demo --once`, as `make demo` runs it, with `env` added to ours."""
    return subprocess.run(
        [sys.executable, "-m", "devcluster.demo", "--once", "--state-dir", str(state_dir)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_demo_once_runs_the_chart_and_shows_allocation_cdi_spec_and_runtime_view(tmp_path: Path) -> None:
    run = run_demo_once(tmp_path / "demo", DEMO_TIMEOUT)
    assert run.returncode == 0, f"demo failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    out = run.stdout

    # The chart's daemons, in real containers of our image: the plugin a DaemonSet's pod.
    daemons = {m.group(1): m for m in DAEMON.finditer(out)}
    assert set(daemons) == {"kubelet plugin", "controller"}, out[-3000:]
    plugin = daemons["kubelet plugin"]
    pod_name, owner_kind, daemonset = plugin.group(2), plugin.group(3), plugin.group(4)
    assert owner_kind == "DaemonSet" and daemonset.endswith("-kubelet-plugin"), plugin.group(0)
    assert pod_name.startswith(f"{daemonset}-"), plugin.group(0)
    assert re.fullmatch(r"(\S+/)?localhost/draplugin:\S+", plugin.group(6)), plugin.group(0)
    assert daemons["controller"].group(3) == "ReplicaSet"
    assert f"kubectl logs -n draplugin {pod_name}" in out

    published = re.search(r"the plugin published (\d+) devices: (.+)", out)
    assert published, out[-3000:]
    assert int(published.group(1)) == len(published.group(2).split(", ")) > 0

    found = sections(out)
    allocation = leading_json(section(found, "allocation of claim demo/"))
    results = allocation["results"]
    assert results and {r["driver"] for r in results} == {DRIVER}
    allocated_devices = {r["device"] for r in results}
    assert allocated_devices <= set(published.group(2).split(", "))

    # The claim's two specs: its devices', and the device metadata mount (docs/device-metadata.md).
    specs = {
        spec["kind"]: spec
        for spec in (
            json.loads(body.strip()) for title, body in found.items() if title.startswith("CDI spec ")
        )
    }
    assert sorted(specs) == [f"{DRIVER}/gpu", f"{DRIVER}/metadata"], list(found)
    spec = specs[f"{DRIVER}/gpu"]
    spec_device_names = {d["name"] for d in spec["devices"]}
    assert all(any(name.endswith(f"-{device}") for name in spec_device_names) for device in allocated_devices)

    views = leading_json(section(found, "what the containers got"))
    assert len(views) == 2, views  # two containers share the claim
    first, second = views
    assert first["container"] != second["container"]
    (device,) = allocated_devices
    key = device.upper().replace("-", "_")
    for view in views:
        env = dict(line.split("=", 1) for line in view["log"] if "=" in line)
        assert env[f"DRAPLUGIN_DEVICE_{key}_NAME"] == device, view
        index = env[f"DRAPLUGIN_DEVICE_{key}_INDEX"]
        # The device node containerd injected from the CDI spec: the fake GPU's, 1:3 like /dev/null.
        assert any(re.match(rf"^c.* 1, +3 .*/dev/nvidia{index}$", line) for line in view["devices"]), view
    assert first["log"] == second["log"]  # one claim: the same device for both

    # `dra-controller top`: both claims with their pods as the pods start, then the claim on the GPU that
    # stays idle flagged IDLE (first: most waste) after the demo's short threshold, the other one busy.
    example_claim = next(t for t in found if t.startswith("allocation of claim demo/")).rsplit("/", 1)[1]
    for title in (
        "dra-controller top (the pods just started)",
        "dra-controller top (demo/idle-notebook idle",
    ):
        rows = {r["CLAIM"]: r for r in top_rows(section(found, title))}
        assert set(rows) == {"demo/idle-notebook", f"demo/{example_claim}"}, rows
        idle, busy = rows["demo/idle-notebook"], rows[f"demo/{example_claim}"]
        assert (idle["DEVICE"], idle["MODEL"], idle["PODS"]) == (
            "gpu-0",
            "NVIDIA H100 80GB HBM3",
            "idle-notebook",
        )
        assert idle["UTIL"] == "0%", idle
        assert busy["DEVICE"] == device and busy["PODS"] == "two-containers", busy
        assert int(busy["UTIL"].rstrip("%")) >= 5 and not busy["IDLE FOR"].endswith("IDLE"), busy
    flagged = top_rows(section(found, "dra-controller top (demo/idle-notebook idle"))
    assert flagged[0]["CLAIM"] == "demo/idle-notebook" and flagged[0]["IDLE FOR"].endswith("IDLE"), flagged

    advice = section(found, "try your own specs")
    assert "export KUBECONFIG=" in advice
    assert re.search(r"-m controller\.cli top --endpoint http://127\.0\.0\.1:\d+/metrics", advice), advice


def test_demo_without_helm_fails_at_once_with_the_build_command(tmp_path: Path) -> None:
    """Nothing starts without Helm: the demo says which command builds it instead of failing later."""
    run = run_demo_once(tmp_path / "demo", 60, DRA_HELM_BIN_DIR=str(tmp_path / "no-helm-here"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "tests/cluster/build_helm.sh" in run.stderr, run.stderr
    assert not (tmp_path / "demo").exists(), "the demo started something before finding helm missing"
