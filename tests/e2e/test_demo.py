"""The README's main-job command: `make demo` runs `python -m devcluster.demo`.

This runs the demo once (`--once`) as a user would and checks what it prints:
the plugin's published devices, the claim's allocation, the CDI spec it wrote,
and what the two containers that share one claim got, from their own logs and
from exec into them. The demo starts its own control plane, containerd and
kubelet.
"""

from __future__ import annotations

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
DEMO_TIMEOUT = 300


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


def test_demo_once_shows_allocation_cdi_spec_and_runtime_view(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "devcluster.demo", "--once", "--state-dir", str(tmp_path / "demo")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
    )
    assert run.returncode == 0, f"demo failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    out = run.stdout

    published = re.search(r"the plugin published (\d+) devices: (.+)", out)
    assert published, out[-3000:]
    assert int(published.group(1)) == len(published.group(2).split(", ")) > 0

    found = sections(out)
    allocation = leading_json(section(found, "allocation of claim demo/"))
    results = allocation["results"]
    assert results and {r["driver"] for r in results} == {DRIVER}
    allocated_devices = {r["device"] for r in results}
    assert allocated_devices <= set(published.group(2).split(", "))

    spec = json.loads(section(found, "CDI spec ").strip())
    assert spec["kind"] == f"{DRIVER}/gpu"
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

    assert "export KUBECONFIG=" in section(found, "try your own specs")
