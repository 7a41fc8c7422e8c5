"""`draplugin cdi-spec`: print the CDI spec prepare would write for a claim, without an API server.

The claim is made up (it holds the named devices, or all of the node's, under
one request with the default config), then goes through prepare's own
functions (`draplugin.cdi.preview`): `plan_claim`, the driver files of
`--driver-root`, `render_spec`.
So what this prints is what a container of such a claim gets: device nodes,
environment, and the driver's libraries and binaries. Run inside the plugin
pod it picks up the pod's DRIVER_ROOT and DRIVER_ROOT_MOUNT, as `run` does.
"""

from __future__ import annotations

import argparse
import os
import sys

import yaml

from dracommon.drivername import DEFAULT_DRIVER_NAME, DriverNameError, check_driver_name
from draplugin import config
from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot, DriverRootError
from draplugin.cdi.preview import preview_spec
from draplugin.cdi.spec import Spec
from draplugin.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from draplugin.devices.cli import add_backend_arguments, backend_from_args
from draplugin.devices.model import DeviceBackend
from draplugin.devices.nvml import NvmlUnavailableError
from draplugin.prepare.plan import PlanError


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", required=True, help="node whose devices to use (pool name, fake UUID seed)"
    )
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    parser.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="NAME",
        help="a device the claim holds (repeatable; default: every device of the node)",
    )
    parser.add_argument("-o", "--output", choices=("json", "yaml"), default="json", help="output format")
    parser.add_argument(
        "--driver-root",
        help="host directory of the NVIDIA driver install "
        "[env DRIVER_ROOT; default / for nvml, none for fake]",
    )
    parser.add_argument(
        "--driver-root-mount",
        help="where this process sees --driver-root [env DRIVER_ROOT_MOUNT; default: the same path]",
    )
    parser.add_argument(
        "--driver-capabilities",
        help="which driver files containers get: compute, utility, video, graphics, all "
        "[env DRIVER_CAPABILITIES; default compute,utility,video]",
    )
    add_backend_arguments(parser)


def render(args: argparse.Namespace, backend: DeviceBackend, environ: dict[str, str]) -> Spec:
    """The spec for `args`, through prepare's planning and rendering; raises `_Refused`."""
    try:
        driver = check_driver_name(args.driver_name)
    except DriverNameError as err:
        raise _Refused(EXIT_USAGE, str(err)) from None
    devices = {device.name: device for device in backend.discover()}
    names = list(dict.fromkeys(args.device)) or list(devices)
    if not names:
        raise _Refused(EXIT_FAILURE, f"node {args.node_name} has no devices")
    unknown = [name for name in names if name not in devices]
    if unknown:
        raise _Refused(
            EXIT_USAGE,
            f"no device {', '.join(unknown)} on node {args.node_name}; it has: {', '.join(devices)}",
        )
    try:
        values = config.resolve(
            {
                "driver_root": args.driver_root,
                "driver_root_mount": args.driver_root_mount,
                "driver_capabilities": args.driver_capabilities,
            },
            environ,
        )
        host_root, mount = config.driver_root_setting(values, args.backend)
        capabilities = config.driver_capabilities_setting(values.get("driver_capabilities"))
    except config.ConfigError as err:
        raise _Refused(EXIT_USAGE, str(err)) from None
    files = None
    if host_root is not None:
        root = DriverRoot.at(host_root, str(mount) if mount else None)
        files = driverfiles.for_backend(
            root, backend, report=lambda reason, message: None, capabilities=capabilities
        )
    try:
        spec = preview_spec(devices, names, driver=driver, node=args.node_name, driver_files=files)
    except PlanError as err:
        raise _Refused(EXIT_USAGE, str(err)) from None
    except DriverRootError as err:
        raise _Refused(EXIT_FAILURE, f"prepare would fail this claim: {err}") from None
    for finding in files.findings() if files is not None else ():
        print(f"draplugin cdi-spec: warning: {finding.message} ({finding.reason})", file=sys.stderr)
    return spec


def run(args: argparse.Namespace) -> int:
    try:
        backend = backend_from_args(args)
        spec = render(args, backend, dict(os.environ))
        content = spec.render()
    except _Refused as err:
        print(f"draplugin cdi-spec: error: {err}", file=sys.stderr)
        return err.code
    except NvmlUnavailableError as err:
        print(f"draplugin cdi-spec: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except ValueError as err:  # a bad fake config or device description, or a spec CDI would refuse
        print(f"draplugin cdi-spec: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.output == "json":
        sys.stdout.write(content.decode())
    else:
        yaml.safe_dump(spec.to_json(), sys.stdout, sort_keys=False)
    return EXIT_OK


register_subcommand(
    Subcommand(
        name="cdi-spec",
        help="print the CDI spec prepare would write for a claim holding these devices (no API access)",
        add_arguments=add_arguments,
        handler=run,
    )
)
