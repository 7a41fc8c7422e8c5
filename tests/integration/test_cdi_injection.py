"""Our CDI specs and NVIDIA's, injected by the reference CDI library where the host's /dev is not
the driver root's.

The GPU Operator's driver container (and NVIDIA's `--dev-root`) keeps the GPUs' device nodes in
the driver root's `dev/`, and a MIG device this plugin made has its access node in no host `/dev`
at all. Here the driver root is NVIDIA's real 550.163.01 files (`tests/nvidia_roots.py`) with
`dev/nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia0`, `nvidia1` as real character devices
and the NVML double's GPUs, GPU 1 in MIG mode. Our spec is rendered by the plugin's own code for a
claim holding GPU 0 and a MIG device of GPU 1; NVIDIA's by `nvidia-ctk cdi generate --dev-root`.
`cdicheck` (the CDI library, `tags.cncf.io/container-device-interface`) injects each into an
empty OCI spec inside a mount namespace whose `/dev` is a fresh tmpfs: empty but for `/dev/null`,
or with a `/dev/nvidia0` whose numbers are wrong, so a node taken from the host `/dev` would show.
The numbers in the resulting OCI spec must be the driver root's nodes', and for the MIG access
nodes the ones our spec writes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import nvidia_roots as nr
from tests.integration import test_cluster_cdicheck as reference

pytestmark = pytest.mark.cluster

# The reference tests' fixture (the built cdicheck binary, failing when missing), found here by name.
cdicheck = reference.cdicheck

OUR_KIND = "gpu.draplugin.dev/gpu"
OUR_CLAIM = "00000000-0000-0000-0000-000000000000"  # the made-up claim of `draplugin cdi-spec`
# Numbers no NVIDIA node has: a node the library took from the host /dev would carry them.
WRONG = (nr.NVIDIA_MAJOR, 99)
HOST_DEVS = {"empty": {}, "wrong-nvidia0": {"nvidia0": WRONG}}


@dataclass
class Setup:
    root: nr.NvidiaRoot
    ours: dict[str, Any]  # our spec
    nvidia: dict[str, Any]  # NVIDIA's spec
    mig: str  # our MIG device's CDI name


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1): the driver root's dev nodes and a private /dev")
    library, reason = nr.nvml_for_roots()
    if library is None:
        pytest.fail(reason, pytrace=False)
    base = tmp_path_factory.mktemp("inject")
    root = nr.build_flat_root(base / "root", nvml=library, gpus=2)
    assert {"dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia0", "dev/nvidia1"} <= {
        str(p) for p in root.device_nodes
    }
    mig = {"index": 1, "migMode": 1, "migDevices": [{"giProfileId": 0, "start": 0}]}
    config = nr.write_nvml_double_config(root, base / "mig.json", gpus=2, procRoot=str(base / "proc"))
    doc = json.loads(config.read_text())
    doc["gpus"] = [mig]  # the double's per-GPU overrides (`gpus` is the helper's count)
    config.write_text(json.dumps(doc))
    listed = nr.plugin_spec(root, config, proc_root=base / "proc")
    names = [d["name"].removeprefix(f"{OUR_CLAIM}-") for d in listed["devices"]]
    mig_name = next(n for n in names if "-mig-" in n)
    ours = nr.plugin_spec(root, config, proc_root=base / "proc", devices=("gpu-0", mig_name))
    # NVIDIA's generator reads MIG's minors from the host's /proc, which has none: whole GPUs only.
    whole = nr.write_nvml_double_config(root, base / "whole.json", gpus=2)
    nvidia = nr.generate_nvidia_spec(root, nvml_config=whole)
    nvidia.pop("x-nvidia-ctk-log", None)
    return Setup(root, ours, nvidia, f"{OUR_KIND}={OUR_CLAIM}-{mig_name}")


def inject(
    cdicheck: Path, tmp_path: Path, spec: dict[str, Any], host_dev: dict[str, tuple[int, int]], *devices: str
) -> subprocess.CompletedProcess[str]:
    """cdicheck in a mount namespace whose /dev holds /dev/null and `host_dev` only."""
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir(exist_ok=True)
    (cdi_dir / "spec.json").write_text(json.dumps(spec))
    made = [f"mknod -m 666 /dev/{name} c {major} {minor}" for name, (major, minor) in host_dev.items()]
    argv = [str(cdicheck), "--cdi-dir", str(cdi_dir)]
    for device in devices:
        argv += ["--device", device]
    script = " && ".join(
        [
            "mount -t tmpfs -o mode=755 isolated-dev /dev",
            "mknod -m 666 /dev/null c 1 3",
            *made,
            "ls -A /dev >&2",
            "exec " + shlex.join(argv),
        ]
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def rdev(path: Path) -> tuple[int, int]:
    number = os.stat(path).st_rdev
    return os.major(number), os.minor(number)


def nodes_of(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return {n["path"]: n for n in report["edits"]["deviceNodes"]}


@pytest.mark.parametrize("host_dev", list(HOST_DEVS))
def test_our_spec_injects_with_the_driver_roots_nodes_and_the_mig_numbers(
    cdicheck: Path, tmp_path: Path, setup: Setup, host_dev: str
) -> None:
    result = inject(
        cdicheck, tmp_path, setup.ours, HOST_DEVS[host_dev], f"{OUR_KIND}={OUR_CLAIM}-gpu-0", setup.mig
    )
    assert "nvidiactl" not in result.stderr  # the namespace's /dev, as listed in it
    nodes = nodes_of(result)
    dev = setup.root.path / "dev"
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1"):
        node = nodes[f"/dev/{name}"]
        assert node["type"] == "c"
        assert (node["major"], node["minor"]) == rdev(dev / name), name
    assert (nodes["/dev/nvidia0"]["major"], nodes["/dev/nvidia0"]["minor"]) == (nr.NVIDIA_MAJOR, 0)
    # The MIG device's access nodes exist nowhere: the numbers are the spec's (the double's
    # /proc/devices nvidia-caps major, the access files' minors and mode).
    written = {
        n["path"]: n
        for d in setup.ours["devices"]
        if f"{OUR_KIND}={d['name']}" == setup.mig
        for n in d["containerEdits"]["deviceNodes"]
        if "nvidia-caps" in n["path"]
    }
    assert len(written) == 2
    for path, node in written.items():
        assert not os.path.lexists(node["hostPath"])
        got = nodes[path]
        assert (got["type"], got["major"], got["minor"]) == ("c", node["major"], node["minor"])
        assert got["fileMode"] == node["fileMode"] == 0o444
    assert not any("nvidia-modeset" in p for p in nodes)


@pytest.mark.parametrize("host_dev", list(HOST_DEVS))
def test_nvidias_spec_injects_with_the_driver_roots_nodes(
    cdicheck: Path, tmp_path: Path, setup: Setup, host_dev: str
) -> None:
    result = inject(cdicheck, tmp_path, setup.nvidia, HOST_DEVS[host_dev], "nvidia.com/gpu=0")
    nodes = nodes_of(result)
    dev = setup.root.path / "dev"
    for name in ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0"):
        assert (nodes[f"/dev/{name}"]["major"], nodes[f"/dev/{name}"]["minor"]) == rdev(dev / name), name
    assert "/dev/nvidia1" not in nodes
    hooks = json.loads(result.stdout)["edits"]["hooks"]
    assert {"createContainer", "createRuntime"} <= set(hooks)


def test_a_node_without_host_path_is_looked_up_in_the_namespaces_dev(
    cdicheck: Path, tmp_path: Path, setup: Setup
) -> None:
    """The control: the library does stat the /dev the test gives it, so the cases above prove
    where the numbers come from."""
    spec = json.loads(json.dumps(setup.ours))
    gpu = next(d for d in spec["devices"] if d["name"].endswith("-gpu-0"))
    for node in gpu["containerEdits"]["deviceNodes"]:
        node.pop("hostPath", None)
    missing = inject(cdicheck, tmp_path, spec, {}, f"{OUR_KIND}={OUR_CLAIM}-gpu-0")
    assert missing.returncode == 1
    assert 'failed to stat CDI host device "/dev/nvidia0"' in missing.stderr
    wrong = nodes_of(inject(cdicheck, tmp_path, spec, {"nvidia0": WRONG}, f"{OUR_KIND}={OUR_CLAIM}-gpu-0"))
    assert (wrong["/dev/nvidia0"]["major"], wrong["/dev/nvidia0"]["minor"]) == WRONG
