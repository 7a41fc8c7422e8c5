"""PID → pod UID and container ID from /proc/<pid>/cgroup, in every shape kubelets and runtimes write."""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin.usage.attribution import PodProcess, parse_cgroup, pod_process

UID = "3f2b6a5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SYSTEMD_UID = UID.replace("-", "_")
CID = "a" * 56 + "0123beef"


@pytest.mark.parametrize(
    "content",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
        # Guaranteed QoS has no QoS level in the path
        f"0::/kubepods/pod{UID}/{CID}\n",
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        # cgroup v1: one line per controller (the first that names a pod wins)
        f"12:blkio:/\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
        # CRI-O and docker scopes
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/crio-{CID}.scope\n",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
        # read from inside a container with its own cgroup namespace
        f"0::/../../kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
    ],
)
def test_pod_and_container_from_every_cgroup_shape(content: str) -> None:
    assert parse_cgroup(content) == PodProcess(UID, CID)


def test_a_process_in_the_pod_cgroup_itself_has_no_container() -> None:
    # The pause process, or a runtime that puts the sandbox in the pod cgroup.
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == PodProcess(UID, "")


@pytest.mark.parametrize(
    "content",
    [
        "0::/system.slice/containerd.service\n",
        "0::/user.slice/user-0.slice/session-1.scope\n",
        "0::/\n",
        "0::/kubepods.slice/kubepods-burstable.slice\n",
        "",
        "garbage without colons\n",
    ],
)
def test_processes_outside_pods_have_none(content: str) -> None:
    assert parse_cgroup(content) is None


def test_pod_process_reads_the_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    (tmp_path / "17").mkdir()
    (tmp_path / "17" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    assert pod_process(tmp_path, 4242) == PodProcess(UID, CID)
    assert pod_process(tmp_path, 17) is None
    assert pod_process(tmp_path, 99999) is None  # exited between NVML's listing and our read


@pytest.mark.parametrize(
    "content",
    [
        f"4:memory:/{CID}\n0::/\n",  # cgroupfs with no pod cgroups (cgroupsPerQOS: false)
        f"4:memory:/process_api/3d41e1a75d1e9fa405113a26d823a08a/{CID}\n",  # below a parent's cgroup
        f"0::/system.slice/cri-containerd-{CID}.scope\n",
    ],
)
def test_without_pod_cgroups_the_container_id_alone_is_returned(content: str) -> None:
    assert parse_cgroup(content) == PodProcess("", CID)
