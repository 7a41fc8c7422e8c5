"""The device plugin guard: what counts as a device plugin on the node, and what each policy publishes."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dracommon.kubeapi import ApiError
from draplugin import config
from draplugin.devices.deviceplugin_guard import (
    DETECTED_REASON,
    GONE_REASON,
    SETTING_HINT,
    CoexistencePolicy,
    DevicePluginGuard,
    advertised_gpu_resources,
    device_plugin_sockets,
)
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.model import CounterSet, Device
from draplugin.kubelet.interface import ClaimRef
from draplugin.node import NodeDaemon, build_backend
from draplugin.slices.metrics import SliceMetrics
from tests.unit.test_node import FakeSliceApi, published, settings_for, static_factory, wait_until

DRIVER = "gpu.draplugin.dev"


class RecordedEvents:
    def __init__(self) -> None:
        self.node: list[tuple[str, str, bool]] = []

    def claim_event(self, claim: ClaimRef, reason: str, note: str, *, warning: bool = True) -> None:
        raise AssertionError("the guard posts no claim events")

    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None:
        self.node.append((reason, note, warning))


class FakeNode:
    """The Node as the API server returns it; `fail` makes reads fail like an unreachable server."""

    def __init__(self) -> None:
        self.allocatable: dict[str, str] = {"cpu": "8", "memory": "32Gi"}
        self.capacity: dict[str, str] = {"cpu": "8", "memory": "32Gi"}
        self.fail = False

    def read(self) -> dict[str, Any]:
        if self.fail:
            raise ApiError(503, "the server is currently unable to handle the request")
        return {
            "metadata": {"name": "node-1"},
            "status": {"allocatable": self.allocatable, "capacity": self.capacity},
        }


def guard_for(
    root: Path, policy: str = "refuse", node: FakeNode | None = None
) -> tuple[DevicePluginGuard, RecordedEvents]:
    events = RecordedEvents()
    guard = DevicePluginGuard(
        CoexistencePolicy.parse(policy),
        driver_name=DRIVER,
        socket_dir=root / "device-plugins",
        read_node=(node or FakeNode()).read,
        events=events,
    )
    return guard, events


def add_socket(root: Path, name: str = "nvidia-gpu.sock") -> Path:
    """A real listening unix socket, as the device plugin leaves it."""
    directory = root / "device-plugins"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.close()  # the file stays, as a socket
    return path


def fake_devices(gpus: int = 4) -> list[Device]:
    return FakeBackend("node-1", config_from_flags(gpus)).discover()


# --- the policy setting ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mode", "indexes"),
    [
        ("refuse", "refuse", set()),
        ("publish-tainted", "publish-tainted", set()),
        ("split:2, 0", "split", {0, 2}),
    ],
)
def test_policy_parses(text: str, mode: str, indexes: set[int]) -> None:
    policy = CoexistencePolicy.parse(text)
    assert (policy.mode, set(policy.indexes)) == (mode, indexes)
    assert CoexistencePolicy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("share", "is not one of refuse, publish-tainted, split:<GPU indexes>"),
        ("split", "split needs the GPU indexes"),
        ("split:", "split needs the GPU indexes"),
        ("split:0,x", "'x' is not a GPU index"),
        ("split:-1", "'-1' is not a GPU index"),
    ],
)
def test_a_bad_policy_is_a_start_error_naming_the_setting(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(config.ConfigError) as err:
        settings_for(tmp_path, device_plugin_coexistence=text)
    assert "--device-plugin-coexistence (DEVICE_PLUGIN_COEXISTENCE)" in str(err.value)
    assert problem in str(err.value)


def test_the_default_policy_is_refuse_and_the_hint_names_the_real_flag(tmp_path: Path) -> None:
    defaults = settings_for(tmp_path)
    assert defaults.device_plugin_coexistence == CoexistencePolicy("refuse")
    # The kubelet's device plugin directory does not follow its --root-dir.
    assert defaults.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    option = next(o for o in config.RUN_OPTIONS if o.dest == "device_plugin_coexistence")
    assert option.flag in SETTING_HINT and option.env in SETTING_HINT
    env = config.load({"node_name": "n", "backend": "fake"}, environ={"DEVICE_PLUGIN_COEXISTENCE": "split:1"})
    assert env.device_plugin_coexistence == CoexistencePolicy("split", frozenset({1}))


# --- detection -------------------------------------------------------------------------------------


def test_nvidia_sockets_count_and_others_do_not(tmp_path: Path) -> None:
    directory = tmp_path / "device-plugins"
    assert device_plugin_sockets(directory) == ()  # no such directory at all
    add_socket(tmp_path, "kubelet.sock")
    add_socket(tmp_path, "example.com-dongle.sock")
    (tmp_path / "device-plugins" / "kubelet_internal_checkpoint").write_text("{}")
    assert device_plugin_sockets(directory) == ()
    add_socket(tmp_path, "nvidia-gpu.sock")
    add_socket(tmp_path, "nvidia-mig-1g.10gb.sock")
    assert device_plugin_sockets(directory) == ("nvidia-gpu.sock", "nvidia-mig-1g.10gb.sock")


@pytest.mark.parametrize(
    ("allocatable", "capacity", "found"),
    [
        ({"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "4"}, ("nvidia.com/gpu=4",)),
        # After the device plugin is gone the kubelet keeps the name with a zero count.
        ({"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "0"}, ()),
        ({}, {"nvidia.com/mig-1g.10gb": "7"}, ("nvidia.com/mig-1g.10gb=7",)),
        ({"nvidia.com/gpu.shared": "16"}, {}, ("nvidia.com/gpu.shared=16",)),
        ({"example.com/gpu": "2", "nvidia.com/gpu-not": "1", "amd.com/gpu": "1"}, {}, ()),
        ({"nvidia.com/gpu": "lots"}, {}, ()),
    ],
)
def test_node_resources_that_count(
    allocatable: dict[str, str], capacity: dict[str, str], found: tuple[str, ...]
) -> None:
    node = {"status": {"allocatable": {"cpu": "4", **allocatable}, "capacity": {"cpu": "4", **capacity}}}
    assert advertised_gpu_resources(node) == found


# --- what each policy publishes ----------------------------------------------------------------------


def test_nothing_seen_publishes_everything_and_posts_nothing(tmp_path: Path) -> None:
    guard, events = guard_for(tmp_path)
    assert guard.check() is False
    devices = fake_devices()
    assert guard.apply(devices) == devices
    assert events.node == []


def test_refuse_publishes_no_gpu_while_a_socket_is_there_and_all_once_it_is_gone(tmp_path: Path) -> None:
    guard, events = guard_for(tmp_path)
    calls: list[int] = []
    guard.add_listener(lambda: calls.append(1))
    sock = add_socket(tmp_path)
    assert guard.check() is True
    assert guard.apply(fake_devices()) == []
    ((reason, note, warning),) = events.node
    assert (reason, warning) == (DETECTED_REASON, True)
    assert str(sock) in note and "policy refuse" in note and SETTING_HINT in note
    assert guard.check() is False, "the same verdict again is no change"
    assert len(events.node) == 1 and calls == [1]

    sock.unlink()
    assert guard.check() is True
    assert len(guard.apply(fake_devices())) == 4
    assert events.node[-1][0] == GONE_REASON and events.node[-1][2] is False
    assert calls == [1, 1]


def test_the_node_advertising_the_resource_is_enough_and_a_failed_read_keeps_the_verdict(
    tmp_path: Path,
) -> None:
    node = FakeNode()
    guard, events = guard_for(tmp_path, node=node)
    node.allocatable["nvidia.com/gpu"] = node.capacity["nvidia.com/gpu"] = "4"
    assert guard.check() is True
    assert "Node resource nvidia.com/gpu=4" in events.node[0][1]
    node.fail = True
    assert guard.check() is False and guard.apply(fake_devices()) == []
    node.fail = False
    node.allocatable["nvidia.com/gpu"] = node.capacity["nvidia.com/gpu"] = "0"
    assert guard.check() is True and len(guard.apply(fake_devices())) == 4


def test_publish_tainted_adds_a_noschedule_device_taint(tmp_path: Path) -> None:
    guard, events = guard_for(tmp_path, "publish-tainted")
    add_socket(tmp_path)
    guard.check()
    published_devices = guard.apply(fake_devices())
    assert len(published_devices) == 4
    for device in published_devices:
        assert [t.to_api() for t in device.taints] == [
            {"key": "gpu.draplugin.dev/device-plugin", "value": "present", "effect": "NoSchedule"}
        ]
    assert "gpu.draplugin.dev/device-plugin=present:NoSchedule" in events.node[0][1]


def test_split_publishes_only_the_listed_gpus_with_their_mig_devices_and_counters(tmp_path: Path) -> None:
    guard, events = guard_for(tmp_path, "split:1,3")
    backend = FakeBackend("node-1", config_from_flags(4, partitionable=True))
    devices, counters = backend.discover(), backend.shared_counters()
    assert any(d.kind == "mig" for d in devices) and counters
    add_socket(tmp_path)
    kept, kept_counters = guard.source(lambda: (devices, counters))()
    assert {d.index for d in kept} == {1, 3}
    assert any(d.kind == "mig" for d in kept), "MIG devices of a listed GPU stay"
    assert {s.name for s in kept_counters} == {"gpu-1-counters", "gpu-3-counters"}
    assert "publishing only GPU indexes 1,3" in events.node[0][1]


def test_the_first_publish_waits_for_a_readable_node(tmp_path: Path) -> None:
    node = FakeNode()
    node.fail = True
    guard, _ = guard_for(tmp_path, node=node)
    devices = fake_devices()
    source = guard.source(lambda: (devices, list[CounterSet]()))
    with pytest.raises(ApiError):
        source()  # the publisher retries this with backoff; nothing is published unchecked
    guard.check()  # the periodic check, with the Node still unreadable, does not count as read
    with pytest.raises(ApiError):
        source()
    node.fail = False
    node.allocatable["nvidia.com/gpu"] = "4"
    assert source() == ([], [])


# --- in the node daemon ----------------------------------------------------------------------------


async def test_the_node_daemon_withdraws_and_restores_its_slices_as_the_device_plugin_comes_and_goes(
    tmp_path: Path,
) -> None:
    root = Path("/tmp") / f"dpg-{tmp_path.name[-12:]}"  # short: socket paths have a 107-byte limit
    root.mkdir()
    api = FakeSliceApi()
    settings = settings_for(root, rediscover_interval="100ms", device_plugin_dir=str(root / "device-plugins"))
    guard, events = guard_for(root)
    assert settings.device_plugin_dir == root / "device-plugins"
    sock = add_socket(root)
    node = NodeDaemon(
        settings,
        backend=build_backend(settings),
        slice_api=api,
        driver_factory=static_factory,
        slice_metrics=SliceMetrics(CollectorRegistry()),
        guard=guard,
    )
    await node.start()
    try:
        await wait_until(lambda: api.slices != {}, "a published (empty) pool")
        await asyncio.sleep(0.3)
        assert api.devices() == []
        assert [e[0] for e in events.node] == [DETECTED_REASON]
        sock.unlink()
        await wait_until(lambda: published(api, 4), "4 devices once the device plugin is gone")
        add_socket(root)
        await wait_until(lambda: published(api, 0), "none once it is back")
        assert [e[0] for e in events.node] == [DETECTED_REASON, GONE_REASON, DETECTED_REASON]
    finally:
        api.closed.set()
        await node.stop()
        shutil.rmtree(root, ignore_errors=True)
