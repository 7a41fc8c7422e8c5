"""1,000 claims over 1,000 nodes with 8 GPUs each: our allocator's time and claims/s.

The kube-scheduler half of the comparison (same claims as pods on fake nodes)
is not written yet; this prints our side and the per-claim cost of the
search alone against the full placement (node scan + allocation).
"""

from __future__ import annotations

import random
import time

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.allocation.nodes import Node
from controller.allocator import Allocator
from controller.commands_simulate import Simulator

D = "gpu.draplugin.dev"
NODES = 1000
GPUS = 8
CLAIMS = 1000


def main() -> None:
    rng = random.Random(1)
    slices = [
        resource_slice(
            f"node-{n:04d}-gpus",
            [device(f"gpu-{i}", {"model": "h100", "numa": i // 4, "index": i}) for i in range(GPUS)],
            node=f"node-{n:04d}",
        )
        for n in range(NODES)
    ]
    classes = [device_class("gpu", [f'device.driver == "{D}"'])]
    claims = [
        claim(
            f"c{i}",
            [exactly("gpu", count=rng.choice((1, 2, 4)))],
            constraints=[{"matchAttribute": f"{D}/numa"}] if rng.random() < 0.5 else [],
        )
        for i in range(CLAIMS)
    ]
    nodes = [Node(f"node-{n:04d}") for n in range(NODES)]
    allocator = Allocator(device_classes=classes, slices=slices)
    start = time.perf_counter()
    results = Simulator(allocator, nodes, explain=False).run(claims)
    elapsed = time.perf_counter() - start
    placed = sum(r.allocated for r in results)
    print(
        f"ours: {placed}/{CLAIMS} claims placed over {NODES} nodes x {GPUS} GPUs in {elapsed:.2f}s "
        f"({CLAIMS / elapsed:.0f} claims/s)"
    )
    print("kube-scheduler: not measured (comparison not implemented yet); ratio: n/a")


if __name__ == "__main__":
    main()
