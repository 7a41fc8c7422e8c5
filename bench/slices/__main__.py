"""`python -m bench.slices`: cost of publishing 1,024 fake devices, and API writes while idle.

Runs against the real kube-apiserver started by `tests.kube` (the same
control plane the integration tests use). Baseline, measured in the same run:
a naive publisher that rewrites every slice on every resync, which is what a
controller without change detection does. Figures printed:

- first publish: wall time and peak Python memory (tracemalloc) for 1,024 devices;
- resync with nothing changed: writes and wall time, ours vs. the naive one;
- idle: writes over a window with the watch running.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from typing import Any

from prometheus_client import CollectorRegistry

from bench.controlplane import start_control_plane
from devcluster.objects import create_fake_node
from dracommon.kubeapi import KubeApi
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.model import Device
from draplugin.slices.api import KubeSliceApi
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.plan import plan_slices
from draplugin.slices.publisher import SlicePublisher
from draplugin.slices.render import NodeRef, render_slice, slice_name

DRIVER = "gpu.draplugin.dev"


class NaivePublisher:
    """Baseline: every resync replaces every slice with a freshly rendered one."""

    def __init__(self, api: KubeSliceApi, node: str, node_uid: str, devices: list[Device]) -> None:
        self.api, self.node, self.node_uid, self.devices = api, node, node_uid, devices
        self.writes = 0

    def resync(self) -> None:
        planned = plan_slices(self.devices)
        existing = {o["metadata"]["name"]: o for o in self.api.list_slices(self._selector())[0]}
        for i, p in enumerate(planned):
            body = render_slice(
                p,
                node=NodeRef(self.node, self.node_uid),
                driver=DRIVER,
                index=i,
                generation=1,
                count=len(planned),
            )
            name = slice_name(self.node, DRIVER, i)
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                self.api.replace_slice(name, body)
            else:
                self.api.create_slice(body)
            self.writes += 1

    def _selector(self) -> str:
        return f"spec.driver={DRIVER},spec.nodeName={self.node}"


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slices", description=__doc__)
    parser.add_argument("--devices", type=int, default=1024)
    parser.add_argument("--resyncs", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)

    cluster = start_control_plane("bench-slices-")
    if cluster is None:
        return 1
    try:
        with cluster.api_client() as api:
            raw = KubeSliceApi(KubeApi(api))
            ours_node, naive_node = "bench-ours", "bench-naive"
            create_fake_node(api, ours_node)
            create_fake_node(api, naive_node)
            ours_devices = FakeBackend(
                ours_node, config_from_flags(args.devices, "H100-80GB-HBM3")
            ).discover()
            naive_devices = FakeBackend(
                naive_node, config_from_flags(args.devices, "H100-80GB-HBM3")
            ).discover()
            pub = SlicePublisher(
                raw,
                node_name=ours_node,
                driver=DRIVER,
                source=lambda: (ours_devices, []),
                metrics=SliceMetrics(CollectorRegistry()),
                settle_s=0.1,
            )
            naive = NaivePublisher(raw, naive_node, raw.get_node_uid(naive_node), naive_devices)

            tracemalloc.start()
            first_ours = timed(pub.sync)
            _, peak_ours = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            first_naive = timed(naive.resync)
            _, peak_naive = tracemalloc.get_traced_memory()
            tracemalloc.stop()

            writes_before = sum(pub.writes.values())
            naive_before = naive.writes
            resync_ours = sum(timed(pub.sync) for _ in range(args.resyncs)) / args.resyncs
            resync_naive = sum(timed(naive.resync) for _ in range(args.resyncs)) / args.resyncs
            resync_writes_ours = sum(pub.writes.values()) - writes_before
            resync_writes_naive = naive.writes - naive_before

            pub.start()
            time.sleep(1.0)
            idle_before = sum(pub.writes.values())
            time.sleep(args.idle_seconds)
            idle_writes = sum(pub.writes.values()) - idle_before
            pub.stop()
    finally:
        cluster.stop()

    slices = len(plan_slices(ours_devices))
    print(f"ResourceSlice publishing, {args.devices} devices in {slices} slices, real kube-apiserver")
    print(f"  first publish   ours {first_ours * 1000:8.1f} ms  naive {first_naive * 1000:8.1f} ms")
    print(f"  peak memory     ours {peak_ours / 2**20:8.2f} MiB naive {peak_naive / 2**20:8.2f} MiB")
    ratio = resync_naive / resync_ours if resync_ours else float("inf")
    print(
        f"  resync (no change), mean of {args.resyncs}: ours {resync_ours * 1000:.1f} ms, "
        f"{resync_writes_ours} writes; naive {resync_naive * 1000:.1f} ms, {resync_writes_naive} writes; "
        f"naive/ours time ratio {ratio:.1f}x"
    )
    print(
        f"  idle {args.idle_seconds:.0f} s with watch running: {idle_writes} writes "
        f"(naive: {slices} per resync)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
