"""One device's utilization and memory split between its holders (claim, pod, container).

Processes are attributed first (PID → pod UID → a claim holding this device);
what cannot be tied to a holder's pod is unattributed. Then:

- SM: when NVML has per-process samples, each holder gets the device's
  utilization times its processes' share of all sampled SM time, so the
  shares (with the unattributed part) add up to the device's figure and an
  exclusive claim's equals it. Without samples (no kernel ran in the window,
  or a device that does not sample processes: MIG), the device's utilization
  is split evenly between the holders that have processes (all holders when
  none has): exact for one holder, a guess for several.
- Memory: each holder's processes' framebuffer memory as NVML lists it. When
  no process reports any (MIG without privileges, fake GPUs without a
  process file), the device's used memory is split like SM above.

Every prepared claim on the device gets at least one series (one per
reserved pod, `pod=""` before any is reserved), so a claim shows up as soon as
it is prepared; a pod whose processes are known per container gets one
series per container instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draplugin.usage.attribution import PodProcess
from draplugin.usage.holders import Holder
from draplugin.usage.reading import DeviceReading

# (namespace, claim, pod, container)
HolderKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class HolderShare:
    namespace: str
    claim: str
    claim_uid: str
    pod: str
    container: str
    gpu_ratio: float | None
    memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class DeviceSplit:
    holders: tuple[HolderShare, ...]
    unattributed_gpu_ratio: float | None
    unattributed_memory_bytes: int | None
    # Pod UIDs and container IDs seen in processes that no holder knows (yet): re-read the claims.
    unknown_pods: frozenset[str] = frozenset()
    unknown_containers: frozenset[str] = frozenset()


@dataclass
class _Tally:
    uid: str
    sm: float = 0.0
    memory: int = 0
    processes: int = 0
    memory_known: bool = False


_UNATTRIBUTED: HolderKey = ("", "", "", "")


def split_device(
    device: str,
    reading: DeviceReading,
    holders: Sequence[Holder],
    locate: Callable[[int], PodProcess | None],
) -> DeviceSplit:
    """The shares of `device` for the `holders` that hold it; `locate` maps a PID to its pod."""
    mine = [h for h in holders if device in h.devices]
    by_pod = {pod.uid: (holder, pod.name) for holder in mine for pod in holder.pods}
    # Without pod cgroups a process names only its container: find the pod by its containers' IDs.
    pod_of_container = {c: uid for holder in mine for c, uid in holder.container_pods.items()}
    tallies: dict[HolderKey, _Tally] = {}
    for holder in mine:
        for pod_name in [p.name for p in holder.pods] or [""]:
            tallies[(holder.namespace, holder.name, pod_name, "")] = _Tally(holder.uid)
    unattributed = _Tally("")
    unknown_pods: set[str] = set()
    unknown_containers: set[str] = set()
    sampled = 0.0
    for process in reading.processes:
        where = locate(process.pid)
        if where is not None and not where.pod_uid:
            where = PodProcess(pod_of_container.get(where.container_id, ""), where.container_id)
        found = by_pod.get(where.pod_uid) if where is not None else None
        if where is not None and found is None:
            if where.pod_uid:
                unknown_pods.add(where.pod_uid)
            elif where.container_id:
                unknown_containers.add(where.container_id)
        if found is None or where is None:
            tally = unattributed
        else:
            holder, pod_name = found
            container = holder.containers.get(where.container_id, "")
            if where.container_id and not container:
                unknown_containers.add(where.container_id)
            key = (holder.namespace, holder.name, pod_name, container)
            tally = tallies.setdefault(key, _Tally(holder.uid))
        tally.processes += 1
        if process.sm_ratio is not None:
            tally.sm += process.sm_ratio
            sampled += process.sm_ratio
        if process.memory_bytes is not None:
            tally.memory += process.memory_bytes
            tally.memory_known = True
    # A pod's catch-all series goes once its processes are known per container.
    for key in [k for k, t in tallies.items() if k[3] == "" and t.processes == 0]:
        if any(k[:3] == key[:3] and k[3] for k in tallies):
            del tallies[key]

    everyone = {**tallies, _UNATTRIBUTED: unattributed}
    busy = [k for k, t in everyone.items() if t.processes] or list(tallies)
    gpu = _split_gpu(reading.gpu_ratio, everyone, busy, sampled)
    memory = _split_memory(reading.memory_used_bytes, everyone, busy)
    shares = tuple(
        HolderShare(k[0], k[1], t.uid, k[2], k[3], gpu.get(k), memory.get(k)) for k, t in tallies.items()
    )
    return DeviceSplit(
        shares,
        gpu.get(_UNATTRIBUTED, 0.0 if reading.gpu_ratio is not None else None),
        memory.get(_UNATTRIBUTED, 0 if reading.memory_used_bytes is not None or not tallies else None),
        frozenset(unknown_pods),
        frozenset(unknown_containers),
    )


def _split_gpu(
    device_ratio: float | None, tallies: dict[HolderKey, _Tally], busy: list[HolderKey], sampled: float
) -> dict[HolderKey, float | None]:
    if sampled > 0:
        if device_ratio is None:  # no device figure: the processes' own samples are the best there is
            return {k: min(1.0, t.sm) for k, t in tallies.items()}
        return {k: device_ratio * (t.sm / sampled) for k, t in tallies.items()}
    if device_ratio is None:
        return dict.fromkeys(tallies)
    return {k: (device_ratio / len(busy) if k in busy else 0.0) for k in tallies}


def _split_memory(
    device_used: int | None, tallies: dict[HolderKey, _Tally], busy: list[HolderKey]
) -> dict[HolderKey, int | None]:
    if any(t.memory_known for t in tallies.values()):
        return {k: t.memory for k, t in tallies.items()}
    if device_used is None:
        return dict.fromkeys(tallies)
    return {k: (device_used // len(busy) if k in busy else 0) for k in tallies}
