"""Splitting one device between its holders: exclusive, shared by pods, containers, unattributed."""

from __future__ import annotations

import pytest

from draplugin.usage.attribution import PodProcess
from draplugin.usage.holders import Holder, PodRef
from draplugin.usage.reading import DeviceReading, ProcessUsage
from draplugin.usage.split import HolderShare, split_device

GiB = 1 << 30
POD_A = PodRef("team-a", "train-a", "uid-pod-a")
POD_B = PodRef("team-a", "train-b", "uid-pod-b")


def claim(
    *pods: PodRef, devices: tuple[str, ...] = ("gpu-0",), containers: dict[str, str] | None = None
) -> Holder:
    return Holder("team-a", "train", "uid-claim", devices, pods, containers or {})


def NOWHERE(pid: int) -> PodProcess | None:
    return None


def by_pod(shares: tuple[HolderShare, ...]) -> dict[tuple[str, str], HolderShare]:
    return {(s.pod, s.container): s for s in shares}


def test_exclusive_claim_gets_the_devices_utilization_and_its_processes_memory() -> None:
    reading = DeviceReading(
        gpu_ratio=0.8, memory_used_bytes=10 * GiB, processes=(ProcessUsage(10, 0.7, 6 * GiB),)
    )
    split = split_device("gpu-0", reading, [claim(POD_A)], {10: PodProcess(POD_A.uid)}.get)
    (share,) = split.holders
    assert (share.pod, share.gpu_ratio, share.memory_bytes) == ("train-a", 0.8, 6 * GiB)
    assert split.unattributed_gpu_ratio == 0.0
    assert split.unattributed_memory_bytes == 0


def test_two_pods_of_one_claim_split_by_their_processes_samples() -> None:
    reading = DeviceReading(
        gpu_ratio=0.6,
        memory_used_bytes=9 * GiB,
        processes=(ProcessUsage(10, 0.3, 4 * GiB), ProcessUsage(20, 0.1, 2 * GiB)),
    )
    locate = {10: PodProcess(POD_A.uid), 20: PodProcess(POD_B.uid)}.get
    shares = by_pod(split_device("gpu-0", reading, [claim(POD_A, POD_B)], locate).holders)
    assert shares[("train-a", "")].gpu_ratio == pytest.approx(0.45)
    assert shares[("train-b", "")].gpu_ratio == pytest.approx(0.15)
    assert shares[("train-a", "")].memory_bytes == 4 * GiB
    assert shares[("train-b", "")].memory_bytes == 2 * GiB


def test_unmapped_processes_are_unattributed_not_dropped() -> None:
    reading = DeviceReading(
        gpu_ratio=0.5,
        memory_used_bytes=3 * GiB,
        processes=(ProcessUsage(10, 0.2, GiB), ProcessUsage(99, 0.3, 2 * GiB)),
    )
    split = split_device("gpu-0", reading, [claim(POD_A)], {10: PodProcess(POD_A.uid)}.get)
    assert split.holders[0].gpu_ratio == pytest.approx(0.2)
    assert split.unattributed_gpu_ratio == pytest.approx(0.3)
    assert split.unattributed_memory_bytes == 2 * GiB


def test_a_process_of_an_unknown_pod_is_unattributed_and_asks_for_a_refresh() -> None:
    reading = DeviceReading(gpu_ratio=0.4, processes=(ProcessUsage(10, 0.4, GiB),))
    split = split_device("gpu-0", reading, [claim(POD_A)], {10: PodProcess("uid-new-pod", "c" * 64)}.get)
    assert split.unattributed_gpu_ratio == pytest.approx(0.4)
    assert split.holders[0].gpu_ratio == 0.0
    assert split.unknown_pods == {"uid-new-pod"}


def test_known_containers_get_series_of_their_own() -> None:
    reading = DeviceReading(
        gpu_ratio=1.0, processes=(ProcessUsage(10, 0.5, GiB), ProcessUsage(11, 0.5, 3 * GiB))
    )
    holder = claim(POD_A, containers={"c1": "trainer", "c2": "sidecar"})
    locate = {10: PodProcess(POD_A.uid, "c1"), 11: PodProcess(POD_A.uid, "c2")}.get
    shares = by_pod(split_device("gpu-0", reading, [holder], locate).holders)
    assert set(shares) == {("train-a", "trainer"), ("train-a", "sidecar")}  # no catch-all series left
    assert shares[("train-a", "sidecar")].memory_bytes == 3 * GiB


def test_without_processes_an_exclusive_claim_still_gets_the_devices_figures() -> None:
    # Fake GPUs without a process file, or NVML listing nothing (nothing runs yet).
    reading = DeviceReading(gpu_ratio=0.3, memory_used_bytes=5 * GiB)
    (share,) = split_device("gpu-0", reading, [claim(POD_A)], NOWHERE).holders
    assert (share.gpu_ratio, share.memory_bytes) == (0.3, 5 * GiB)


def test_without_samples_the_device_is_split_evenly_between_holders_with_processes() -> None:
    reading = DeviceReading(
        gpu_ratio=0.4, processes=(ProcessUsage(10, None, GiB), ProcessUsage(20, None, GiB))
    )
    locate = {10: PodProcess(POD_A.uid), 20: PodProcess(POD_B.uid)}.get
    shares = split_device("gpu-0", reading, [claim(POD_A, POD_B)], locate).holders
    assert [s.gpu_ratio for s in shares] == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_claim_before_any_pod_is_reserved_has_an_empty_pod_label() -> None:
    (share,) = split_device("gpu-0", DeviceReading(gpu_ratio=0.0), [claim()], NOWHERE).holders
    assert (share.namespace, share.claim, share.pod, share.container) == ("team-a", "train", "", "")


def test_holders_of_other_devices_are_not_split_here() -> None:
    split = split_device("gpu-1", DeviceReading(gpu_ratio=0.9), [claim(POD_A)], NOWHERE)
    assert split.holders == ()
    assert split.unattributed_gpu_ratio == 0.0


def test_unknown_device_utilization_gives_unknown_shares() -> None:
    (share,) = split_device("gpu-0", DeviceReading(), [claim(POD_A)], NOWHERE).holders
    assert share.gpu_ratio is None and share.memory_bytes is None


def test_a_process_that_names_only_its_container_is_found_by_the_containers_id() -> None:
    # A kubelet without pod cgroups (cgroupsPerQOS: false): the cgroup path has no pod UID.
    holder = Holder(
        "team-a", "train", "uid-claim", ("gpu-0",), (POD_A,), {"c1": "trainer"}, {"c1": POD_A.uid}
    )
    reading = DeviceReading(gpu_ratio=0.5, processes=(ProcessUsage(10, 0.5, GiB),))
    split = split_device("gpu-0", reading, [holder], {10: PodProcess("", "c1")}.get)
    (share,) = split.holders
    assert (share.pod, share.container, share.gpu_ratio) == ("train-a", "trainer", 0.5)
    stranger = split_device("gpu-0", reading, [holder], {10: PodProcess("", "c9")}.get)
    assert stranger.unattributed_gpu_ratio == 0.5 and stranger.unknown_containers == {"c9"}
