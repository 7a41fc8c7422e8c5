"""containerd that cannot work fails the fixture at once, with what it said; it never waits out a timeout."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import leftovers
from devcluster.containerd import STARTUP_TIMEOUT, Containerd, RuntimeSetupError, pids_with_args
from devcluster.leftovers import mount_points_under, processes_under
from devcluster.procs import ComponentError, ProcessGroup

pytestmark = pytest.mark.kubelet


@pytest.fixture
def runtime() -> Iterator[Containerd]:
    # Short: containerd's socket path must fit a Unix socket address.
    state = Path(tempfile.mkdtemp(prefix="dra-ctd-"))
    processes = ProcessGroup(state / "logs")
    runtime = Containerd(processes, state, state / "cdi", "faults")
    try:
        yield runtime
    finally:
        runtime.stop()
        processes.stop_all()
        leftovers.remove_leftovers(state)  # whatever a failed test left: shims, mounts, then the files


def test_a_containerd_that_exits_at_start_fails_with_its_log(
    runtime: Containerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "_config", lambda: "version = 4\nroot = [not toml\n")
    started = time.monotonic()
    with pytest.raises(ComponentError, match=r"containerd-faults exited with status [1-9].*\n.*toml"):
        runtime.start()
    assert time.monotonic() - started < STARTUP_TIMEOUT  # before the (load-stretched) start-up timeout


def test_a_containerd_without_pod_network_fails_naming_the_condition(
    runtime: Containerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "_write_cni_config", lambda: None)  # an empty CNI directory
    started = time.monotonic()
    with pytest.raises(RuntimeSetupError, match=r"NetworkReady=false \(NetworkPluginNotReady"):
        runtime.start()
    assert time.monotonic() - started < STARTUP_TIMEOUT  # before the (load-stretched) start-up timeout


def test_a_started_containerd_reports_its_version_and_holds_the_images(runtime: Containerd) -> None:
    runtime.start()
    assert runtime.version.startswith("2.")
    listed = runtime.crictl("images", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert runtime.workload is not None and runtime.workload.name in listed.stdout
    assert runtime.pause is not None and runtime.pause.name in listed.stdout


def test_pods_that_outlive_a_killed_containerd_are_removed_on_stop(runtime: Containerd) -> None:
    runtime.start()
    sandbox = runtime.dir / "sandbox.json"
    sandbox.write_text(json.dumps({
        "metadata": {"name": "left", "namespace": "default", "uid": "left-1"},
        "log_directory": str(runtime.dir / "pod-logs"),
    }))  # fmt: skip
    started = runtime.crictl("runp", str(sandbox))
    assert started.returncode == 0, started.stderr
    assert runtime.component is not None
    os.kill(runtime.component.process.pid, signal.SIGKILL)  # no chance to stop its pods
    runtime.component.process.wait()
    assert pids_with_args(["-address", str(runtime.socket)]), (
        "the sandbox's shim should have outlived containerd"
    )
    runtime.stop()
    assert pids_with_args(["-address", str(runtime.socket)]) == []
    assert list((runtime.dir / "runc" / "k8s.io").iterdir()) == []
    # The sandbox's network namespace, its /dev/shm and its rootfs were mounted by the dead containerd.
    assert mount_points_under(runtime.dir) == []
    assert processes_under(runtime.dir) == []
