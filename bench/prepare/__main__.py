"""`python -m bench.prepare`: prepare latency (1 and 64 concurrent claims) and RSS over 1,000 cycles.

Runs the driver in-process against the real test API server (claims are
created and their allocation written through the status subresource, as the
scheduler would). The baseline is the one API round trip prepare cannot avoid:
a raw GET of the same claim, measured the same way in the same run, so the
ratio shows what our own work (planning, CDI spec, checkpoint with fsync)
adds on top of it.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from devcluster.controlplane import ControlPlane
from devcluster.objects import create_namespace
from dracommon.kubeapi import AsyncKubeApi, KubeApi
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore
from draplugin.devices import load_backend
from draplugin.events import NullEvents
from draplugin.kubelet.interface import ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.api import DEFAULT_WORKERS, KubeClaimReader
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.sharing import SharingState

DRIVER = "gpu.draplugin.dev"
NODE = "bench-node"
CONCURRENT = 64
SEQUENTIAL_ROUNDS = 200
RSS_CYCLES = 1000


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def make_claims(rest: KubeApi, namespace: str, count: int) -> list[ClaimRef]:
    refs = []
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    for i in range(count):
        claim = rest.create(base, {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{i}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        })  # fmt: skip
        status = {"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{i}"},
        ]}}}}  # fmt: skip
        rest.patch_status(f"{base}/claim-{i}", status)
        refs.append(ClaimRef(namespace, claim["metadata"]["uid"], f"claim-{i}"))
    return refs


# The bare GETs the prepare timings are compared with: the same reader, its deadline never reached.
BASELINE_DEADLINE_S = 60.0


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def measure(driver: GpuDriver, raw: KubeClaimReader, refs: list[ClaimRef]) -> None:
    one = refs[0]
    # Warm-up: connections, imports, first file creation.
    for _ in range(5):
        await driver.prepare_claim(one)
        await driver.unprepare_claim(one)
        await raw.get_claim(one.namespace, one.name, time.monotonic() + BASELINE_DEADLINE_S)

    prepare: list[float] = []
    baseline: list[float] = []
    for _ in range(SEQUENTIAL_ROUNDS):
        prepare.append(await timed(lambda: driver.prepare_claim(one)))
        await driver.unprepare_claim(one)
        baseline.append(
            await timed(
                lambda: raw.get_claim(one.namespace, one.name, time.monotonic() + BASELINE_DEADLINE_S)
            )
        )
    report("1 claim", prepare, baseline)

    start = time.perf_counter()
    prepare = list(await asyncio.gather(*(timed(partial(driver.prepare_claim, r)) for r in refs)))
    wall = time.perf_counter() - start
    start = time.perf_counter()
    soon = time.monotonic() + BASELINE_DEADLINE_S
    baseline = list(
        await asyncio.gather(*(timed(partial(raw.get_claim, r.namespace, r.name, soon)) for r in refs))
    )
    base_wall = time.perf_counter() - start
    report(f"{len(refs)} concurrent claims", prepare, baseline)
    print(f"  wall for all {len(refs)}: prepare {wall * 1e3:.1f} ms, GET {base_wall * 1e3:.1f} ms "
          f"(ratio {wall / base_wall:.2f}); {len(refs) / wall:.0f} claims/s")  # fmt: skip
    await asyncio.gather(*(driver.unprepare_claim(r) for r in refs))

    before = rss_mib()
    start = time.perf_counter()
    for _ in range(RSS_CYCLES):
        await driver.prepare_claim(one)
        await driver.unprepare_claim(one)
    elapsed = time.perf_counter() - start
    after = rss_mib()
    print(f"{RSS_CYCLES} prepare/unprepare cycles: {elapsed:.1f} s "
          f"({elapsed / RSS_CYCLES * 1e3:.2f} ms/cycle); "
          f"RSS {before:.1f} MiB -> {after:.1f} MiB (growth {after - before:+.1f} MiB, "
          f"ratio {after / before:.3f})")  # fmt: skip


def report(label: str, prepare: list[float], baseline: list[float]) -> None:
    p50, p99 = percentile(prepare, 0.5), percentile(prepare, 0.99)
    b50, b99 = percentile(baseline, 0.5), percentile(baseline, 0.99)
    print(f"{label}: prepare p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms | "
          f"baseline GET p50 {b50 * 1e3:.2f} ms, "
          f"p99 {b99 * 1e3:.2f} ms | ratio p50 {p50 / b50:.2f}x, p99 {p99 / b99:.2f}x "
          f"(mean {statistics.mean(prepare) * 1e3:.2f} ms over {len(prepare)})")  # fmt: skip


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        root = Path(tmp)
        cluster = ControlPlane(root / "cluster")
        print("starting the control plane ...", flush=True)
        cluster.start()
        try:
            with cluster.api_client() as api:
                rest = KubeApi(api)
                namespace = create_namespace(api, prefix="bench-")
                refs = make_claims(rest, namespace, CONCURRENT)
                raw = KubeClaimReader(AsyncKubeApi(rest, DEFAULT_WORKERS))
                backend = load_backend("fake", NODE, gpus=CONCURRENT)
                driver = GpuDriver(
                    driver_name=DRIVER,
                    node_name=NODE,
                    devices=backend.discover(),
                    claims=raw,
                    cdi_store=SpecStore(root / "cdi", DRIVER),
                    checkpoint=CheckpointStore(root / "state" / "checkpoint.json", "bench-boot"),
                    sharing=SharingState(root / "state"),
                    events=NullEvents(),
                    metrics=ClaimMetrics(CollectorRegistry()),
                )
                driver.recover()
                print(
                    f"driver ready: {len(driver.devices)} fake GPUs, {len(refs)} allocated claims", flush=True
                )
                asyncio.run(measure(driver, raw, refs))
                raw.close()
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
