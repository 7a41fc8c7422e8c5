"""A fake kubelet device plugin (API v1beta1) for the end-to-end tests: it advertises an extended
resource such as `nvidia.com/gpu` the way NVIDIA's device plugin does, without any GPU.

Run as `python -m tests.fakedeviceplugin --device-plugin-dir <kubelet-root>/device-plugins
--resource nvidia.com/gpu --devices dp-gpu-0,dp-gpu-1 --record FILE`. It serves the DevicePlugin
service on its own socket in that directory, then registers with the kubelet on `kubelet.sock`
there, so the Node gets `nvidia.com/gpu` in its capacity and allocatable. The kubelet calls
Allocate while it creates a container that was given some of the devices; the answer puts the
device IDs into the container's environment (`FAKE_DEVICE_PLUGIN_DEVICES`), and every call is
recorded as one JSON line in the record file, so a test sees from both ends which devices the
device plugin handed out.

Health: the device IDs listed in the `--unhealthy-file` (one per line, or `*` for all) are
reported Unhealthy; the file is watched, and ListAndWatch sends the new list when it changes, as a
real plugin does when a GPU fails. The kubelet counts only healthy devices as allocatable.

Ours rather than upstream's sample device plugin (k8s.io/kubernetes test/images): that one is a
Go program with its own image; this runs as a host process from the stubs of
proto/deviceplugin/v1beta1, which tests/wirecontract.py checks against upstream's api.proto.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from draplugin.kubelet._proto.deviceplugin.v1beta1 import api_pb2 as pb
from draplugin.kubelet._proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DEVICES_ENV = "FAKE_DEVICE_PLUGIN_DEVICES"
# NVIDIA's plugin's socket name, one of the signs our node plugin's guard looks for: run it in a device
# plugin directory of the test's own (devcluster.kubelet private_device_plugin_dir), never the machine's.
ENDPOINT = "nvidia-gpu.sock"
WATCH_SECONDS = 0.2

log = logging.getLogger("fakedeviceplugin")


class FakeDevicePlugin(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service over a fixed list of device IDs."""

    def __init__(self, devices: Sequence[str], record: Path, unhealthy_file: Path | None) -> None:
        self.devices = list(devices)
        self.record = record
        self.unhealthy_file = unhealthy_file
        self.stopping = threading.Event()
        self._record_lock = threading.Lock()

    def unhealthy(self) -> set[str]:
        if self.unhealthy_file is None or not self.unhealthy_file.exists():
            return set()
        names = {line.strip() for line in self.unhealthy_file.read_text().splitlines() if line.strip()}
        return set(self.devices) if "*" in names else names & set(self.devices)

    def device_list(self) -> pb.ListAndWatchResponse:
        bad = self.unhealthy()
        return pb.ListAndWatchResponse(
            devices=[pb.Device(ID=d, health=UNHEALTHY if d in bad else HEALTHY) for d in self.devices]
        )

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        sent = self.device_list()
        log.info("ListAndWatch: %s", [(d.ID, d.health) for d in sent.devices])
        yield sent
        while context.is_active() and not self.stopping.wait(WATCH_SECONDS):
            current = self.device_list()
            if current != sent:
                log.info("ListAndWatch: %s", [(d.ID, d.health) for d in current.devices])
                yield current
                sent = current

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse()

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        answers = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            with self._record_lock, self.record.open("a") as out:
                out.write(json.dumps({"allocate": ids}) + "\n")
            log.info("Allocate: %s", ids)
            answers.append(pb.ContainerAllocateResponse(envs={DEVICES_ENV: ",".join(ids)}))
        return pb.AllocateResponse(container_responses=answers)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def register(directory: Path, endpoint: str, resource: str) -> None:
    """Tell the kubelet about our socket; it dials back and opens ListAndWatch."""
    with grpc.insecure_channel(f"unix://{directory / KUBELET_SOCKET}") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource), timeout=30
        )


def serve(args: argparse.Namespace) -> int:
    directory: Path = args.device_plugin_dir
    socket = directory / args.endpoint
    socket.unlink(missing_ok=True)
    plugin = FakeDevicePlugin(args.devices.split(","), args.record, args.unhealthy_file)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        register(directory, args.endpoint, args.resource)
        log.info("registered resource=%s endpoint=%s devices=%s", args.resource, socket, plugin.devices)
        stop.wait()
    finally:
        plugin.stopping.set()
        server.stop(grace=1).wait()
        socket.unlink(missing_ok=True)
    return 0


@dataclass
class DevicePluginProcess:
    """The fake device plugin as a child process of the test, with its record and health files."""

    process: subprocess.Popen[bytes]
    record: Path
    unhealthy_file: Path
    log_path: Path

    def allocations(self) -> list[list[str]]:
        """The device IDs of each container the kubelet called Allocate for, oldest first."""
        if not self.record.exists():
            return []
        return [json.loads(line)["allocate"] for line in self.record.read_text().splitlines() if line]

    def set_unhealthy(self, devices: Sequence[str]) -> None:
        """Report these device IDs (or `*`: all) Unhealthy from now on; empty: all healthy."""
        self.unhealthy_file.write_text("".join(f"{d}\n" for d in devices))

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def running_device_plugin(
    device_plugin_dir: Path, devices: Sequence[str], state_dir: Path, resource: str = "nvidia.com/gpu"
) -> Iterator[DevicePluginProcess]:
    """`python -m tests.fakedeviceplugin` registered with the kubelet that serves `device_plugin_dir`."""
    state_dir.mkdir(parents=True, exist_ok=True)
    record, unhealthy, log_path = (
        state_dir / "allocations.jsonl",
        state_dir / "unhealthy",
        state_dir / "dp.log",
    )
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "tests.fakedeviceplugin",
                "--device-plugin-dir", str(device_plugin_dir), "--resource", resource,
                "--devices", ",".join(devices), "--record", str(record), "--unhealthy-file", str(unhealthy),
            ],
            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    plugin = DevicePluginProcess(process, record, unhealthy, log_path)
    try:
        yield plugin
    finally:
        plugin.process.terminate()
        try:
            plugin.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            plugin.process.kill()
            plugin.process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device-plugin-dir", type=Path, required=True, help="<kubelet-root>/device-plugins")
    parser.add_argument("--resource", default="nvidia.com/gpu")
    parser.add_argument("--endpoint", default=ENDPOINT, help="our socket's name in that directory")
    parser.add_argument("--devices", required=True, help="comma-separated device IDs")
    parser.add_argument("--record", type=Path, required=True, help="JSON line per Allocate, appended")
    parser.add_argument("--unhealthy-file", type=Path, help="device IDs reported Unhealthy (or *)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
