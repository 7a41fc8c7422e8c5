"""`draplugin devices`: print the ResourceSlices this node would publish, without touching the API.

Useful to check discovery on a node (`--backend nvml`) or to preview a fake
layout. Slices are shown as written except for the Node owner reference,
which needs the Node's UID from the API server.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from dracommon.drivername import DEFAULT_DRIVER_NAME, check_driver_name
from draplugin.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from draplugin.devices import DeviceBackend, load_backend
from draplugin.devices.fake import FakeConfigError
from draplugin.devices.model import DeviceValidationError
from draplugin.devices.naming import NVIDIA_DRIVER_NAME, DeviceNaming
from draplugin.devices.nvml import NvmlUnavailableError
from draplugin.devices.shared import SharedGpus
from draplugin.slices.render import NodeRef, render_pool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", required=True, help="node whose pool to render (pool name, fake UUID seed)"
    )
    parser.add_argument(
        "--driver-name",
        help=f"driver name (default {DEFAULT_DRIVER_NAME}; with --device-naming=nvidia {NVIDIA_DRIVER_NAME})",
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    parser.add_argument(
        "--expect-taints", action="store_true", help="use the 64-device slice limit (health on)"
    )
    add_backend_arguments(parser)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The backend choice and its options, shared with `draplugin cdi-spec`."""
    parser.add_argument(
        "--backend", choices=("nvml", "fake"), default="nvml", help="device discovery backend"
    )
    # Spelled as `draplugin run` spells it; --partitionable is the older name, still taken.
    parser.add_argument(
        "--partitionable-mig",
        "--partitionable",
        dest="partitionable",
        action="store_true",
        help="publish MIG-capable GPUs as partitionable (MIG profiles with shared counters)",
    )
    parser.add_argument(
        "--shared-gpus",
        choices=tuple(SharedGpus),
        default=SharedGpus.OFF.value,
        help="publish whole GPUs for several claims at once (consumable memory, and compute)",
    )
    parser.add_argument(
        "--device-naming",
        choices=tuple(DeviceNaming),
        default=DeviceNaming.DRAPLUGIN.value,
        help="device names: draplugin (ours) or nvidia (NVIDIA's DRA driver's), as `draplugin run` has them",
    )
    nvml = parser.add_argument_group("nvml backend")
    nvml.add_argument("--nvml-lib-path", help="libnvidia-ml.so.1 file or NVIDIA driver root directory")
    nvml.add_argument(
        "--sysfs-root",
        default="/sys",
        help="where sysfs is mounted: pcieRoot and numaNode come from its PCI devices (default /sys)",
    )
    fake = parser.add_argument_group("fake backend")
    fake.add_argument("--fake-config", help="YAML file describing fake GPUs")
    fake.add_argument("--fake-gpus", type=int, default=1, help="number of fake GPUs (without --fake-config)")
    fake.add_argument("--fake-model", default="A100-SXM4-40GB", help="fake GPU model (without --fake-config)")
    fake.add_argument("--fake-dev-root", help="render NVIDIA-shaped device node paths under this directory")


def backend_from_args(args: argparse.Namespace) -> DeviceBackend:
    """The backend `add_backend_arguments` describes; raises like `load_backend`."""
    options: dict[str, Any] = {
        "partitionable": args.partitionable,
        "shared_gpus": SharedGpus(args.shared_gpus),
        "naming": DeviceNaming(args.device_naming),
    }
    if args.backend == "fake":
        options.update(config_file=args.fake_config, gpus=args.fake_gpus, model=args.fake_model)
        options["dev_root"] = args.fake_dev_root
    else:
        options["lib_path"] = args.nvml_lib_path
        options["sysfs_root"] = args.sysfs_root
    return load_backend(args.backend, args.node_name, **options)


def _default_driver(naming: DeviceNaming) -> str:
    return NVIDIA_DRIVER_NAME if naming is DeviceNaming.NVIDIA else DEFAULT_DRIVER_NAME


def run(args: argparse.Namespace) -> int:
    try:
        backend = backend_from_args(args)
        slices = render_pool(
            backend.discover(),
            backend.shared_counters(),
            node=NodeRef(args.node_name, None),
            driver=check_driver_name(args.driver_name or _default_driver(DeviceNaming(args.device_naming))),
            expect_taints=args.expect_taints,
        )
    except (FakeConfigError, DeviceValidationError) as err:
        print(f"draplugin devices: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except NvmlUnavailableError as err:
        print(f"draplugin devices: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except ValueError as err:
        print(f"draplugin devices: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": slices}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all(slices, sys.stdout, sort_keys=False)
    return EXIT_OK


register_subcommand(
    Subcommand(
        name="devices",
        help="print the ResourceSlices this node would publish (no API access)",
        add_arguments=add_arguments,
        handler=run,
    )
)
