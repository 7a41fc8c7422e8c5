"""`python -m bench.slices`: publishing one node's ResourceSlices, ours against upstream's controller.

Both publishers run against the same real kube-apiserver (bench.controlplane), each for its
own node, with the same devices (default 1,024 fake GPUs, rendered by our device model and
split into slices the way ours splits them; the peer gets exactly those device lists):

- ours: draplugin.slices.SlicePublisher (`sync`, and `start` for the watch while idle);
- upstream: the slicepeer harness (tests/cluster/peers) around
  k8s.io/dynamic-resource-allocation/resourceslice v0.37.2, the controller that
  kubeletplugin.Helper publishes through.

Phases, each timed from its trigger until the publisher is done: first publish (ours: the
first `sync`, with its version, node and list reads; upstream: StartController, with its
informer's list and watch and the node read, until the worker has finished the pool), one
device changed, a resync with nothing changed (mean of --resyncs), and idle (writes over
--idle-seconds with each publisher's watch running). API writes are each side's own
counters (creates + updates + deletes). Neither client rate-limits. The peer's process start
and JSON decoding of its job are outside its timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from bench.controlplane import start_control_plane
from bench.peers import PeerError, run_peer
from bench.summary import Row, record
from devcluster.objects import create_fake_node
from dracommon.kubeapi import KubeApi
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.model import Device
from draplugin.slices.api import KubeSliceApi
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.plan import plan_slices
from draplugin.slices.publisher import SlicePublisher

DRIVER = "gpu.draplugin.dev"
PEER = "resourceslice controller (k8s.io/dynamic-resource-allocation v0.37.2)"
CHANGED = 5  # the index of the device whose memory changes


def changed_devices(devices: Sequence[Device]) -> list[Device]:
    """The same devices with one device's memory capacity changed."""
    out = list(devices)
    out[CHANGED] = dataclasses.replace(out[CHANGED], capacity={**out[CHANGED].capacity, "memory": "79Gi"})
    return out


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def ours(
    api: Any, node: str, devices: list[Device], resyncs: int, idle_s: float
) -> dict[str, tuple[float, int]]:
    """Each phase's (seconds, API writes) for our publisher."""
    current = {"devices": devices}
    pub = SlicePublisher(
        KubeSliceApi(KubeApi(api)),
        node_name=node,
        driver=DRIVER,
        source=lambda: (current["devices"], []),
        metrics=SliceMetrics(CollectorRegistry()),
        settle_s=0.1,
    )

    def writes() -> int:
        return sum(pub.writes.values())

    phases: dict[str, tuple[float, int]] = {}
    phases["first publish"] = (timed(pub.sync), writes())
    current["devices"] = changed_devices(devices)
    before = writes()
    phases["change of one device"] = (timed(pub.sync), writes() - before)
    before = writes()
    seconds = sum(timed(pub.sync) for _ in range(resyncs)) / max(resyncs, 1)
    phases["resync, no change"] = (seconds, writes() - before)
    pub.start()
    time.sleep(1.0)  # the loop's own first pass and the watch's start
    before = writes()
    time.sleep(idle_s)
    phases["idle"] = (idle_s, writes() - before)
    pub.stop()
    return phases


def upstream(
    kubeconfig: str, node: str, devices: list[Device], resyncs: int, idle_s: float
) -> dict[str, tuple[float, int]]:
    planned = plan_slices(devices)
    slices = [list(p.devices) for p in planned]
    name = devices[CHANGED].name
    slice_index, index = next(
        (si, di) for si, devs in enumerate(slices) for di, d in enumerate(devs) if d["name"] == name
    )
    job = {
        "kubeconfig": kubeconfig,
        "driver": DRIVER,
        "node": node,
        "slices": slices,
        "changed": {
            "slice": slice_index,
            "index": index,
            "device": changed_devices(devices)[CHANGED].to_api(),
        },
        "resyncs": resyncs,
        "idle_seconds": idle_s,
    }
    result = run_peer("slicepeer", job)
    names = {
        "first publish": "first_publish",
        "change of one device": "change_one_device",
        "resync, no change": "resync_no_change",
        "idle": "idle",
    }
    return {label: (result[key]["seconds"], result[key]["writes"]) for label, key in names.items()}


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
            ours_node, peer_node = "bench-ours", "bench-upstream"
            create_fake_node(api, ours_node)
            create_fake_node(api, peer_node)
            devices = FakeBackend(ours_node, config_from_flags(args.devices, "H100-80GB-HBM3")).discover()
            devices = list(devices)
            try:
                theirs = upstream(
                    str(cluster.kubeconfig), peer_node, devices, args.resyncs, args.idle_seconds
                )
            except PeerError as err:
                print(f"bench.slices: {err}", file=sys.stderr)
                return 1
            mine = ours(api, ours_node, devices, args.resyncs, args.idle_seconds)
    finally:
        cluster.stop()

    slices = len(plan_slices(devices))
    print(f"ResourceSlice publishing, {len(devices)} devices in {slices} slices, one real kube-apiserver")
    print(
        f"{'phase':<24} {'ours ms':>10} {'writes':>7} {'upstream ms':>12} {'writes':>7} {'ours/upstream':>14}"
    )
    for phase, (seconds, writes) in mine.items():
        p_seconds, p_writes = theirs[phase]
        if phase == "idle":
            print(f"{phase:<24} {'':>10} {writes:>7} {'':>12} {p_writes:>7}   (writes over {seconds:.0f} s)")
            record(Row("slices", f"{phase} {seconds:.0f}s, API writes", "writes", writes, p_writes, PEER))
            continue
        ratio = seconds / p_seconds if p_seconds else float("inf")
        print(
            f"{phase:<24} {seconds * 1000:>10.1f} {writes:>7} "
            f"{p_seconds * 1000:>12.1f} {p_writes:>7} {ratio:>13.2f}x"
        )
        record(Row("slices", f"{phase}, latency", "ms", seconds * 1000, p_seconds * 1000, PEER))
        record(Row("slices", f"{phase}, API writes", "writes", writes, p_writes, PEER))
    return 0


if __name__ == "__main__":
    sys.exit(main())
