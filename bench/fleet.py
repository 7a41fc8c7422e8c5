"""Fleet-sized fixtures: the ResourceSlices of many fake GPU nodes, DeviceClasses and claims.

Shared by the offline measurements of `dra-controller explain` / `simulate` and by the
kube-scheduler scale harness (bench/scale), so both see the same shape (issue 34).

Slices are what `draplugin devices --backend fake` prints for each node (the fake backend and
`draplugin.slices.render.render_pool`, no owner reference), so every device carries the real
attribute schema and per-node UUIDs. Node `i` gets the GPU model `MODELS[i % len(MODELS)]`
(all GPUs of a node alike, as in real servers); with `mig_fraction`, that share of the nodes
(spread evenly, MIG-capable models only) has each GPU split into two 3g MIG devices.

The DeviceClasses are the chart's (`examples/deviceclasses.yaml`, which a chart test keeps equal
to the rendered template). Claims are standalone ResourceClaims for one whole GPU chosen by
model (`productName`) or by memory (a quantity comparison), like examples/04.

API:
    fleet_objects(nodes, gpus_per_node, mig_fraction=..., claims=[...]) -> list[dict]
    write_fleet(directory, nodes=1000, gpus_per_node=8, fmt="yaml", ...) -> FleetFiles
    whole_gpu_claims(count, by="mixed") -> list[dict]
    unfittable_claim() -> dict   (fits nowhere: what `explain` has to explain at full length)
    node_objects(nodes) -> list[dict]   (Node objects, for a cluster that needs them)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dracommon.drivername import DEFAULT_DRIVER_NAME
from draplugin.devices.fake import MODELS as FAKE_MODELS
from draplugin.devices.fake import FakeBackend, FakeConfig, FakeGpuSpec
from draplugin.slices.render import NodeRef, render_pool

JSON = dict[str, Any]
Format = Literal["yaml", "json"]
ClaimSelector = Literal["model", "memory", "mixed"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEVICE_CLASSES_FILE = REPO_ROOT / "examples" / "deviceclasses.yaml"
GPU_CLASS = DEFAULT_DRIVER_NAME  # the chart's class of whole GPUs is named after the driver

# The models nodes cycle through: the data-centre GPUs schedulers see most, MIG-capable first.
MODELS: tuple[str, ...] = ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-80GB-HBM3", "H200", "L40S")
# Memory thresholds for memory-based claims; every one is met by some model above.
MEMORY_THRESHOLDS: tuple[str, ...] = ("40Gi", "64Gi", "80Gi", "128Gi")


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def node_model(index: int) -> str:
    return MODELS[index % len(MODELS)]


def is_mig_node(index: int, mig_fraction: float) -> bool:
    """Evenly spread: node i is a MIG node when floor((i+1)*f) steps past floor(i*f)."""
    if not 0.0 <= mig_fraction <= 1.0:
        raise ValueError(f"mig_fraction must be within [0, 1], got {mig_fraction}")
    return int((index + 1) * mig_fraction) > int(index * mig_fraction)


def _mig_layout(model: str) -> tuple[tuple[str, int | None], ...]:
    """Two 3g instances (every MIG-capable fake model has a 3g profile placed at 0 and 4)."""
    profiles = [p.name for p in FAKE_MODELS[model].mig_profiles if p.name.startswith("3g.")]
    return ((profiles[0], None), (profiles[0], None)) if profiles else ()


def node_slices(
    index: int, gpus_per_node: int = 8, *, mig: bool = False, driver: str = DEFAULT_DRIVER_NAME
) -> list[JSON]:
    """The ResourceSlices `draplugin devices --backend fake` renders for fleet node `index`."""
    model = node_model(index)
    spec = FakeGpuSpec(model=model, count=gpus_per_node, mig=_mig_layout(model) if mig else ())
    name = node_name(index)
    backend = FakeBackend(name, FakeConfig(gpus=(spec,)))
    return render_pool(backend.discover(), backend.shared_counters(), node=NodeRef(name, None), driver=driver)


def device_classes() -> list[JSON]:
    """The chart's DeviceClasses, as installed."""
    with DEVICE_CLASSES_FILE.open(encoding="utf-8") as handle:
        return [d for d in yaml.safe_load_all(handle) if d]


def _claim(name: str, selector: str, namespace: str, index: int) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"00000000-0000-0000-0034-{index:012d}",
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": GPU_CLASS,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def model_selector(model: str, driver: str = DEFAULT_DRIVER_NAME) -> str:
    return f'device.attributes["{driver}"].productName == "{FAKE_MODELS[model].product_name}"'


def memory_selector(threshold: str, driver: str = DEFAULT_DRIVER_NAME) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{threshold}")) >= 0'


def whole_gpu_claims(
    count: int, *, by: ClaimSelector = "mixed", namespace: str = "default", prefix: str = "claim"
) -> list[JSON]:
    """`count` claims of one whole GPU each; claim i selects by model (cycling MODELS), by memory
    (cycling MEMORY_THRESHOLDS), or, with "mixed", alternately by model and by memory."""
    claims = []
    for i in range(count):
        kind = by if by != "mixed" else ("model", "memory")[i % 2]
        turn = i // 2 if by == "mixed" else i
        if kind == "model":
            selector = model_selector(MODELS[turn % len(MODELS)])
        else:
            selector = memory_selector(MEMORY_THRESHOLDS[turn % len(MEMORY_THRESHOLDS)])
        claims.append(_claim(f"{prefix}-{i:05d}", selector, namespace, i))
    return claims


def unfittable_claim(name: str = "unfittable", namespace: str = "default") -> JSON:
    """One whole GPU with more memory than any model has: it fits on no node, so `explain`
    has every node and device to account for."""
    return _claim(name, memory_selector("1Ti"), namespace, 999_999)


def node_objects(nodes: int) -> list[JSON]:
    """Node objects for the fleet's nodes (labels a scheduler or node selector can use)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name(i),
                "labels": {"kubernetes.io/hostname": node_name(i), "gpu.draplugin.dev/model": node_model(i)},
            },
        }
        for i in range(nodes)
    ]


def iter_fleet_slices(
    nodes: int, gpus_per_node: int = 8, *, mig_fraction: float = 0.0, driver: str = DEFAULT_DRIVER_NAME
) -> Iterator[list[JSON]]:
    """Each node's slices in node order (one list per node)."""
    for i in range(nodes):
        yield node_slices(i, gpus_per_node, mig=is_mig_node(i, mig_fraction), driver=driver)


def fleet_objects(
    nodes: int = 1000,
    gpus_per_node: int = 8,
    *,
    mig_fraction: float = 0.0,
    claims: Sequence[JSON] = (),
    with_classes: bool = True,
    with_nodes: bool = False,
) -> list[JSON]:
    """Every object of the fleet in one list: DeviceClasses, slices, (Nodes,) then `claims`."""
    objects: list[JSON] = device_classes() if with_classes else []
    for per_node in iter_fleet_slices(nodes, gpus_per_node, mig_fraction=mig_fraction):
        objects.extend(per_node)
    if with_nodes:
        objects.extend(node_objects(nodes))
    objects.extend(claims)
    return objects


@dataclass(frozen=True)
class FleetFiles:
    """What `write_fleet` wrote: pass `paths` (or `directory`) to `--objects`."""

    directory: Path
    fmt: Format
    class_file: Path
    slice_files: list[Path]
    claim_file: Path | None
    nodes: int
    devices: int
    bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def paths(self) -> list[Path]:
        claims = [self.claim_file] if self.claim_file is not None else []
        return [self.class_file, *self.slice_files, *claims]


def _write(path: Path, documents: Sequence[JSON], fmt: Format) -> int:
    """One file: YAML documents as `draplugin devices` prints them, or one JSON List."""
    if fmt == "json":
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}, indent=2) + "\n"
    else:
        text = yaml.dump_all(documents, Dumper=_DUMPER, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


# libyaml's emitter where the wheel has it (same YAML, several times faster for 1,000 files).
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def write_fleet(
    directory: str | Path,
    *,
    nodes: int = 1000,
    gpus_per_node: int = 8,
    fmt: Format = "yaml",
    mig_fraction: float = 0.0,
    claims: Sequence[JSON] = (),
) -> FleetFiles:
    """One file per node (`<node>.<fmt>`, its slices), `deviceclasses.<fmt>`, and `claims.<fmt>`
    when `claims` are given, all in `directory` (created)."""
    root = Path(directory)
    slice_dir = root / "slices"
    slice_dir.mkdir(parents=True, exist_ok=True)
    class_file = root / f"deviceclasses.{fmt}"
    size = _write(class_file, device_classes(), fmt)
    files, devices = [], 0
    for i, per_node in enumerate(iter_fleet_slices(nodes, gpus_per_node, mig_fraction=mig_fraction)):
        path = slice_dir / f"{node_name(i)}.{fmt}"
        size += _write(path, per_node, fmt)
        files.append(path)
        devices += sum(len(s["spec"].get("devices") or ()) for s in per_node)
    claim_file = None
    if claims:
        claim_file = root / f"claims.{fmt}"
        size += _write(claim_file, claims, fmt)
    return FleetFiles(root, fmt, class_file, files, claim_file, nodes, devices, size)
