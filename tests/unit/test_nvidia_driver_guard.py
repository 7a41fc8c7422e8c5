"""The NVIDIA-compatible mode refuses a node where NVIDIA's own DRA driver runs (draplugin.nvidiadriver).

The signs are what NVIDIA's kubelet plugin leaves on a node: its registration socket
`plugins_registry/gpu.nvidia.com-reg.sock` (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/health.go
dials that path), served here by a real listening Unix socket; and its ResourceSlices, which the
kubelet plugin helper names `<index>-<driver>-<node>-<random>` (dynamic-resource-allocation
v0.37.2 resourceslice/resourceslicecontroller.go, GenerateName plus the API server's suffix).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubeapi import ApiError
from draplugin import config, node, nvidiadriver
from draplugin.kubelet.sockets import socket_paths
from draplugin.slices.render import slice_name

NODE = "node-a"
DRIVER = "gpu.nvidia.com"


class Recorder:
    """What the guard asked and posted: the slice list's selectors and the Node Events."""

    def __init__(self, slices: list[dict[str, Any]] | Exception = ()) -> None:  # type: ignore[assignment]
        self.slices = slices
        self.selectors: list[str] = []
        self.events: list[tuple[str, str]] = []

    def list_slices(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        self.selectors.append(selector)
        if isinstance(self.slices, Exception):
            raise self.slices
        return list(self.slices), "1"

    def node_event(self, reason: str, note: str) -> None:
        self.events.append((reason, note))


def check(root: Path, recorder: Recorder) -> None:
    nvidiadriver.check(
        kubelet_root_dir=root,
        node_name=NODE,
        list_slices=recorder.list_slices,
        node_event=recorder.node_event,
    )


@pytest.fixture
def root() -> Iterator[Path]:
    """A kubelet root short enough for per-pod socket names (AF_UNIX paths: pytest's are too deep)."""
    path = Path(tempfile.mkdtemp(prefix="kubelet-"))
    (path / "plugins_registry").mkdir()
    yield path
    shutil.rmtree(path)


def serving(path: Path) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        yield server


@pytest.fixture
def nvidia_socket(root: Path) -> Iterator[Path]:
    path = root / "plugins_registry" / "gpu.nvidia.com-reg.sock"
    for _ in serving(path):
        yield path


def named(*names: str) -> list[dict[str, Any]]:
    return [{"metadata": {"name": name}, "spec": {"driver": DRIVER, "nodeName": NODE}} for name in names]


def test_nvidias_live_registration_socket_stops_the_plugin_with_a_node_event(
    root: Path, nvidia_socket: Path
) -> None:
    recorder = Recorder(named())
    with pytest.raises(nvidiadriver.NvidiaDriverPresent) as raised:
        check(root, recorder)
    ((reason, note),) = recorder.events
    assert reason == "NvidiaDraDriverPresent" and note == str(raised.value)
    assert str(nvidia_socket) in note and "--device-naming=draplugin" in note, note


def test_a_socket_file_left_behind_that_nobody_serves_is_no_sign(root: Path) -> None:
    path = root / "plugins_registry" / "gpu.nvidia.com-reg.sock"
    for _ in serving(path):
        pass
    assert path.is_socket()  # closed: connecting is refused
    recorder = Recorder(named())
    check(root, recorder)
    assert recorder.events == []


def test_our_own_per_pod_registration_socket_is_no_sign(root: Path) -> None:
    """A rolling update of ours: the old pod's socket carries its UID, not NVIDIA's fixed name."""
    ours = socket_paths(root, DRIVER, "0b5c7a1e-5d1f-4e2b-9a57-2f1c3e4d5a6b").registration
    for _ in serving(ours):
        recorder = Recorder(named(slice_name(NODE, DRIVER, 0), slice_name(NODE, DRIVER, 1)))
        check(root, recorder)
    assert recorder.events == []
    assert recorder.selectors == [f"spec.driver={DRIVER},spec.nodeName={NODE}"]


def test_slices_of_the_helper_on_this_node_stop_the_plugin(root: Path) -> None:
    recorder = Recorder(named(slice_name(NODE, DRIVER, 0), "0-gpu.nvidia.com-node-a-x7k2p"))
    with pytest.raises(nvidiadriver.NvidiaDriverPresent, match=r"0-gpu\.nvidia\.com-node-a-x7k2p"):
        check(root, recorder)
    assert [reason for reason, _ in recorder.events] == ["NvidiaDraDriverPresent"]


def test_an_api_error_alone_is_no_sign(root: Path) -> None:
    recorder = Recorder(ApiError(503, "unavailable"))
    check(root, recorder)
    assert recorder.events == [] and len(recorder.selectors) == 1


def test_with_an_api_error_the_socket_still_decides(root: Path, nvidia_socket: Path) -> None:
    with pytest.raises(nvidiadriver.NvidiaDriverPresent, match="registration socket"):
        check(root, Recorder(ApiError(503, "unavailable")))


def test_the_node_looks_only_under_nvidias_driver_name(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own driver name never asks; NVIDIA's stops `build_node` before any backend is built."""
    recorder = Recorder(named("0-gpu.nvidia.com-node-a-x7k2p"))
    ours = config.validate(config.resolve({"node_name": NODE, "backend": "fake"}, {}))
    node.refuse_beside_nvidias_driver(ours, recorder)  # type: ignore[arg-type]
    assert recorder.selectors == []

    posted: list[str] = []

    class Events:
        def __init__(self, *args: object) -> None: ...

        def node_event(self, reason: str, note: str, *, warning: bool = True) -> None:
            posted.append(reason)

        def close(self) -> None:
            posted.append("closed")

    import draplugin.events

    monkeypatch.setattr(draplugin.events, "KubeEvents", Events)
    monkeypatch.setattr("dracommon.kubeapi.load_api_client", lambda path: object())
    nvidia = config.validate(
        config.resolve(
            {"node_name": NODE, "backend": "fake", "driver_name": DRIVER, "device_naming": "nvidia",
             "kubelet_root_dir": str(root)},
            {},
        )
    )  # fmt: skip
    with pytest.raises(node.NodeUnavailable, match="NVIDIA's DRA driver runs on this node"):
        node.refuse_beside_nvidias_driver(nvidia, recorder)  # type: ignore[arg-type]
    assert posted == ["NvidiaDraDriverPresent", "closed"]
