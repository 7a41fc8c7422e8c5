"""`make cluster` stopped the way terminals and supervisors stop it leaves nothing behind.

`python -m devcluster.localcluster --no-chart` (the control plane, containerd and a kubelet) runs a
pod, so containerd has a shim, a sandbox and a container with their mounts below the state
directory. Then Ctrl-C, a second Ctrl-C while it stops, and SIGKILL: the supervisor's answer to a
stop that takes too long. Afterwards no process and no mount points into the state directory, the
image store and the control plane's data are gone, and the logs are still there.

The run lives in a private temp directory (TMPDIR), so no other run on the machine is involved.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import leftovers, rundir
from devcluster.binaries import REPO_ROOT
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi, load_api_client

pytestmark = pytest.mark.kubelet

START_TIMEOUT = 600.0  # a control plane and a kubelet node on a loaded machine
STOP_TIMEOUT = 180.0
LEFT_BYTES = 16 * 1024 * 1024  # logs only; an image store alone is hundreds of MB


class Run:
    """The localcluster process, its output collected line by line."""

    def __init__(self, tmp: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devcluster.localcluster", "--no-chart"],
            cwd=REPO_ROOT,
            env={**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # like a terminal's foreground job: signals go to it alone
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def said(self, pattern: str) -> re.Match[str] | None:
        if self.process.poll() is not None and not re.search(pattern, self.output()):
            raise AssertionError(f"localcluster exited ({self.process.returncode}):\n{self.output()[-4000:]}")
        return re.search(pattern, self.output())


@pytest.fixture
def tmp() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="dra-stop-"))
    try:
        yield base
    finally:
        leftovers.remove_leftovers(base)


def run_a_pod(kubeconfig: str, image: str) -> None:
    api_client = load_api_client(kubeconfig)
    try:
        api = KubeApi(api_client)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"]}],
            },
        }  # fmt: skip
        # The namespace's default ServiceAccount comes from a controller, shortly after start.
        wait_for("the pod created", lambda: api.create("/api/v1/namespaces/default/pods", pod), 120)
        wait_for(
            "the pod running",
            lambda: api.get("/api/v1/namespaces/default/pods/sleeper")["status"].get("phase") == "Running",
            START_TIMEOUT,
        )
    finally:
        api_client.close()


def test_ctrl_c_then_ctrl_c_then_sigkill_leaves_no_process_mount_or_data(tmp: Path) -> None:
    run = Run(tmp)
    try:
        wait_for("the cluster up", lambda: run.said(r"# Ctrl-C stops the cluster"), START_TIMEOUT, 0.5)
        logs = Path(wait_for("the logs line", lambda: run.said(r"# logs: (\S+)"), 10).group(1))
        state_dir = logs.parents[1]
        kubeconfig = wait_for("the kubeconfig", lambda: run.said(r"export KUBECONFIG=(\S+)"), 10).group(1)
        image = wait_for("the image", lambda: run.said(r"pods run image (\S+)"), 10).group(1)
        run_a_pod(kubeconfig, image)
        shims = leftovers.processes_under(state_dir)
        assert any("containerd-shim" in h.command for h in shims), [h.command for h in shims]
        assert leftovers.mount_points_under(state_dir)

        run.process.send_signal(signal.SIGINT)
        wait_for("the stop to begin", lambda: run.said(r"SIGINT:? stopping"), 60, 0.02)

        def impatient_ctrl_c() -> bool:
            """Ctrl-C again until the clean-up says it goes on: on a quiet machine it can be over
            within a second, before one more Ctrl-C sent once after the first line would land."""
            if "already stopping" in run.output() or run.process.poll() is not None:
                return True
            run.process.send_signal(signal.SIGINT)
            return False

        wait_for("the second Ctrl-C during the clean-up", impatient_ctrl_c, STOP_TIMEOUT, 0.05)

        def kubelet_stopped() -> bool:
            running = [h.command for h in leftovers.processes_under(state_dir)]
            return run.process.poll() is not None or not any("/kubelet " in c for c in running)

        wait_for("the clean-up under way (the kubelet stopped)", kubelet_stopped, STOP_TIMEOUT, 0.1)
        run.process.kill()  # the supervisor's grace period is over
        run.process.wait()
    finally:
        if run.process.poll() is None:
            run.process.kill()

    def left_behind() -> list[str]:
        marker = rundir.read_marker(state_dir)
        unfinished = [] if marker is not None and marker.finished else [f"{state_dir} not cleaned"]
        return unfinished + leftovers.still_in_use([state_dir])

    try:
        wait_for("the run's processes and mounts gone", lambda: not left_behind(), STOP_TIMEOUT, 0.5)
    except AssertionError as err:
        raise AssertionError(
            f"{err}; left behind: {left_behind()}\n"
            f"localcluster and its watchdog said:\n{run.output()[-4000:]}"
        ) from None
    left = sum(p.stat().st_size for p in state_dir.rglob("*") if p.is_file() and not p.is_symlink())
    assert left < LEFT_BYTES, sorted(str(p.relative_to(state_dir)) for p in state_dir.rglob("*"))[:50]
    assert not (state_dir / "node" / "containerd").exists()
    assert not (state_dir / "control-plane" / "etcd").exists()
    assert (logs / "kube-apiserver.log").stat().st_size > 0, sorted(logs.iterdir())
    assert "already stopping, the clean-up continues" in run.output(), run.output()[-3000:]
