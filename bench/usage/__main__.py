"""`python -m bench.usage`: CPU time of one usage sampling pass at 8 and 64 fake GPUs.

Each device is held by a claim shared by two pods, each pod running one
process on the device (a fake process file and a fake /proc tree of
cgroup files), so a pass does everything it does on a busy node: read every
device on its worker thread, map each PID through /proc/<pid>/cgroup to a pod
and a claim, split the device, update idle state. Baseline, measured in the
same run: the same device reads done inline, one after another, with no
attribution, split or threads: what the sampler costs on top of reading.
Also printed: the share of one core at the default 10 s interval, and the
CPU time of one scrape (rendering every series as Prometheus text).

CPU time is the whole process's (`time.process_time`, all threads). Fake
reads stand in for NVML's: on real GPUs each read adds the driver's own time
for about ten NVML calls, measured by `make gpu-check`, not here.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from bench.summary import Row, record
from draplugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.usage.attribution import pod_process
from draplugin.usage.exporter import UsageCollector
from draplugin.usage.fakesource import FakeUsageSource
from draplugin.usage.holders import HolderDirectory
from draplugin.usage.idle import IdleTracker
from draplugin.usage.sampler import SampleMetrics, UsageSampler

NODE = "bench-node"
PASSES = 200
INTERVAL_S = 10.0


class CannedApi:
    """The claims' and pods' documents, as the API server would return them."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs

    def get(self, path: str) -> Any:
        return self.docs[path]


def build(root: Path, gpus: int) -> tuple[UsageSampler, FakeUsageSource, FakeBackend]:
    backend = FakeBackend(NODE, config_from_flags(gpus, "H100-80GB-HBM3"))
    proc = root / "proc"
    processes: dict[str, list[dict[str, object]]] = {}
    records: list[ClaimRecord] = []
    docs: dict[str, Any] = {}
    pid = 1000
    for device in backend.discover():
        claim_uid, claim = str(uuid.uuid4()), f"claim-{device.name}"
        reserved = []
        for p in range(2):
            pod_uid, pod, container = str(uuid.uuid4()), f"{claim}-pod-{p}", uuid.uuid4().hex * 2
            pid += 1
            (proc / str(pid)).mkdir(parents=True)
            systemd_uid = pod_uid.replace("-", "_")
            (proc / str(pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice/"
                f"cri-containerd-{container}.scope\n"
            )
            processes.setdefault(device.name, []).append(
                {"pid": pid, "smPercent": 20 + 10 * p, "memory": "4Gi"}
            )
            reserved.append({"resource": "pods", "name": pod, "uid": pod_uid})
            docs[f"/api/v1/namespaces/bench/pods/{pod}"] = {
                "metadata": {"uid": pod_uid},
                "status": {
                    "containerStatuses": [{"name": "app", "containerID": f"containerd://{container}"}]
                },
            }
        docs[f"/apis/resource.k8s.io/v1/namespaces/bench/resourceclaims/{claim}"] = {
            "metadata": {"uid": claim_uid},
            "status": {"reservedFor": reserved},
        }
        device_record = DeviceRecord(("gpu",), NODE, device.name, ("cdi",))
        records.append(ClaimRecord(claim_uid, "bench", claim, ClaimState.PREPARE_COMPLETED, (device_record,)))
    process_file = root / "fake-processes.yaml"
    process_file.write_text(yaml.safe_dump(processes))
    source = FakeUsageSource(backend, process_file)
    sampler = UsageSampler(
        node=NODE,
        devices=backend.discover,
        source=source,
        holders=HolderDirectory(lambda: records, CannedApi(docs)),
        locate=lambda p: pod_process(proc, p),
        idle=IdleTracker(0.05, 1800.0, None),
        interval_s=INTERVAL_S,
        metrics=SampleMetrics(CollectorRegistry()),
    )
    return sampler, source, backend


def cpu_per_call(call: Callable[[], object], rounds: int) -> float:
    call()  # warm-up: first reads of the files, the API cache, imports
    start = time.process_time()
    for _ in range(rounds):
        call()
    return (time.process_time() - start) / rounds


def measure(gpus: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        sampler, source, backend = build(Path(tmp), gpus)
        devices = backend.discover()
        snapshot = sampler.sample_once()
        split = sum(len(d.split.holders) for d in snapshot.devices)
        assert split == 2 * gpus, f"expected every device split between 2 pods, got {split} shares"
        ours = cpu_per_call(sampler.sample_once, PASSES)
        bare = cpu_per_call(lambda: [source.read(d) for d in devices], PASSES)
        registry = CollectorRegistry()
        registry.register(UsageCollector(lambda: sampler.latest))
        scrape = cpu_per_call(lambda: generate_latest(registry), 50)
        sampler.stop()
    record(
        Row(
            "usage",
            f"CPU per sample, {gpus} GPUs",
            "ms",
            ours * 1e3,
            bare * 1e3,
            "the bare device reads inline",
        )
    )
    return (
        f"{gpus} GPUs: CPU per sample {ours * 1e3:.2f} ms "
        f"({ours / gpus * 1e6:.0f} us per device; {ours / INTERVAL_S * 100:.3f}% of a core at "
        f"{INTERVAL_S:.0f} s) | baseline bare reads {bare * 1e3:.2f} ms | ratio {ours / bare:.2f}x | "
        f"scrape {scrape * 1e3:.2f} ms CPU ({split} claim series per metric)"
    )


def main() -> None:
    for gpus in (8, 64):
        print(measure(gpus), flush=True)


if __name__ == "__main__":
    main()
