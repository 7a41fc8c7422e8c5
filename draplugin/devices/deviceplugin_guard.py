"""Two allocators, one GPU: hold back the GPUs that an NVIDIA device plugin on this node may hand out.

The device plugin and this driver do not know of each other: both would hand
the same GPU to different pods. So the node plugin looks for the device plugin
and, while it sees one, applies `--device-plugin-coexistence`:

* `refuse` (default): publish no GPU (and no MIG device) at all; the device
  plugin may hand out any of them, since it serves every GPU it finds.
* `publish-tainted`: publish them with a `NoSchedule` device taint
  `<driver>/device-plugin=present`, so only claims that tolerate it get them
  (a planned migration where the admin keeps the two apart by hand). Needs
  device taints on the API server (DRADeviceTaints, on by default from 1.36):
  a server that drops the taint offers the GPUs to every claim.
* `split:<indexes>`: publish only the GPUs with those indexes (and their MIG
  devices); the device plugin is expected to be limited to the others.

Signs of a device plugin, either is enough: a socket the NVIDIA device plugin
serves in the kubelet's device plugin directory (it names them
`nvidia-<resource>.sock`: `nvidia-gpu.sock`, `nvidia-mig-1g.10gb.sock`). That
directory is `/var/lib/kubelet/device-plugins` whatever the kubelet's
`--root-dir` (`DevicePluginPath`, a constant of the kubelet's device plugin
API that the kubelet and NVIDIA's plugin both use), hence a setting of its own;
or the Node advertising an NVIDIA GPU resource (`nvidia.com/gpu`,
`nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`) with a non-zero count in
`status.allocatable` or `status.capacity`. The Node keeps the count during a
device plugin restart (its socket is briefly gone), so a restart does not make
the GPUs flap into DRA.

The check runs before the first publish and then periodically: removing the
device plugin makes the GPUs appear, adding one withdraws them, without a
restart. Each change is a log line and an Event on the Node that say what was
seen, what is held back, and the setting that changes it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from dracommon.drivername import annotation_key
from dracommon.kubeapi import ApiError
from dracommon.quantity import Quantity, QuantityError

# The setting's policy lives on its own so that the settings check it without this module (and
# the device model) before the kubelet plugin's sockets; its names stay importable from here.
from draplugin.devices.coexistence import DEFAULT_DEVICE_PLUGIN_DIR, MODES, CoexistencePolicy, Mode
from draplugin.devices.model import CounterSet, Device, DeviceTaint

if TYPE_CHECKING:  # the settings import this module; the API client stays out of their imports
    from draplugin.events import EventSink

__all__ = [
    "DEFAULT_DEVICE_PLUGIN_DIR",
    "DETECTED_REASON",
    "GONE_REASON",
    "MODES",
    "NVIDIA_RESOURCE",
    "NVIDIA_SOCKET",
    "SETTING_HINT",
    "TAINT_NAME",
    "TAINT_VALUE",
    "CoexistencePolicy",
    "DevicePluginGuard",
    "DevicesSource",
    "Mode",
    "NodeReader",
    "Sighting",
    "advertised_gpu_resources",
    "device_plugin_sockets",
]

log = logging.getLogger(__name__)

# The NVIDIA device plugin's socket: pluginapi.DevicePluginPath + "nvidia-" + <resource name> + ".sock".
NVIDIA_SOCKET: Final = re.compile(r"^nvidia-.+\.sock$")
# Resources it registers: whole GPUs, renamed shared GPUs (time-slicing, MPS) and MIG profiles.
NVIDIA_RESOURCE: Final = re.compile(r"^nvidia\.com/(gpu(\..+)?|mig-.+)$")
TAINT_NAME: Final = "device-plugin"
TAINT_VALUE: Final = "present"
# How to change the choice, named in every log line and Event (the flag, its variable, the chart value).
SETTING_HINT: Final = (
    "--device-plugin-coexistence (DEVICE_PLUGIN_COEXISTENCE; "
    "chart value kubeletPlugin.devicePluginCoexistence)"
)
DETECTED_REASON: Final = "DevicePluginDetected"
GONE_REASON: Final = "DevicePluginGone"

NodeReader = Callable[[], Mapping[str, Any]]
DevicesSource = Callable[[], tuple[Sequence[Device], Sequence[CounterSet]]]


@dataclass(frozen=True, slots=True)
class Sighting:
    """What says a device plugin serves this node; empty when nothing does."""

    sockets: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()  # "nvidia.com/gpu=4"

    @property
    def present(self) -> bool:
        return bool(self.sockets or self.resources)

    def describe(self, socket_dir: Path) -> str:
        signs = [f"socket {socket_dir / name}" for name in self.sockets]
        signs += [f"Node resource {item}" for item in self.resources]
        return "; ".join(signs) or "no device plugin"


def device_plugin_sockets(socket_dir: Path) -> tuple[str, ...]:
    """Names of NVIDIA device plugin sockets in the kubelet's device plugin directory (sorted)."""
    try:
        entries = list(socket_dir.iterdir())
    except OSError:  # no directory (not mounted, no kubelet yet): no sign from here
        return ()
    return tuple(sorted(e.name for e in entries if NVIDIA_SOCKET.match(e.name) and not e.is_dir()))


def advertised_gpu_resources(node: Mapping[str, Any]) -> tuple[str, ...]:
    """`name=count` of the NVIDIA GPU resources with a non-zero count in the Node's status."""
    status = node.get("status") or {}
    found: dict[str, str] = {}
    # Allocatable first: capacity only adds what allocatable lacks (a count reserved away).
    for field in ("allocatable", "capacity"):
        values = status.get(field) or {}
        if not isinstance(values, Mapping):
            continue
        for name, raw in values.items():
            if name in found or not NVIDIA_RESOURCE.match(str(name)):
                continue
            try:
                count = Quantity.parse(str(raw))
            except QuantityError:
                continue  # not ours to judge; the kubelet writes these
            if count.sign() > 0:
                found[str(name)] = str(raw)
    return tuple(f"{name}={count}" for name, count in sorted(found.items()))


def _counter_sets_in_use(devices: Sequence[Device], counter_sets: Sequence[CounterSet]) -> list[CounterSet]:
    used = {c.counter_set for d in devices for c in d.consumes_counters}
    return [s for s in counter_sets if s.name in used]


class DevicePluginGuard:
    """Detects a device plugin on the node and filters the devices the publisher offers."""

    def __init__(
        self,
        policy: CoexistencePolicy,
        *,
        driver_name: str,
        socket_dir: Path,
        read_node: NodeReader | None,
        events: EventSink | None = None,
    ) -> None:
        self.policy = policy
        self._taint = DeviceTaint(
            key=annotation_key(driver_name, TAINT_NAME), value=TAINT_VALUE, effect="NoSchedule"
        )
        self._socket_dir = socket_dir
        self._read_node = read_node
        self._events = events
        self._lock = threading.Lock()
        self._sighting: Sighting | None = None  # None: not checked yet
        self._node_resources: tuple[str, ...] = ()
        # Until the Node has been read once, nothing is published (see `source`).
        self._node_read = read_node is None
        self._listeners: list[Callable[[], None]] = []

    @property
    def taint(self) -> DeviceTaint:
        return self._taint

    @property
    def sighting(self) -> Sighting:
        with self._lock:
            return self._sighting or Sighting()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after the verdict changed (the publisher republishes)."""
        self._listeners.append(listener)

    def check(self, *, strict: bool = False) -> bool:
        """Look again; True when the verdict changed. With `strict`, a failed Node read raises
        (the publisher's first sync retries it) instead of keeping the last Node verdict."""
        resources = self._node_resources
        node_read = False
        if self._read_node is not None:
            try:
                resources = advertised_gpu_resources(self._read_node())
                node_read = True
            except Exception as err:  # the API client raises several kinds; keep the last verdict
                if strict:  # as ApiError: the one error the publisher retries with backoff
                    if isinstance(err, ApiError):
                        raise
                    raise ApiError(0, f"reading the Node for the device plugin check: {err}") from err
                log.warning(
                    "device plugin check: Node not readable, keeping the last verdict",
                    extra={"error": str(err)},
                )
        sighting = Sighting(device_plugin_sockets(self._socket_dir), resources)
        with self._lock:
            before = self._sighting
            self._node_resources = resources
            self._node_read = self._node_read or node_read
            self._sighting = sighting
        # Never checked counts as "none seen": a first check that finds nothing has nothing to say.
        changed = (before is not None and before.present) != sighting.present
        if changed:
            self._report(sighting)
            for listener in list(self._listeners):
                listener()
        return changed

    def source(self, inner: DevicesSource) -> DevicesSource:
        """`inner` with the policy applied. Until a check has read the Node, each call checks first
        and fails as the Node read does: nothing is published on the sockets' word alone."""

        def guarded() -> tuple[Sequence[Device], Sequence[CounterSet]]:
            with self._lock:
                checked = self._sighting is not None and self._node_read
            if not checked:
                self.check(strict=True)
            devices, counter_sets = inner()
            kept = self.apply(devices)
            if len(kept) == len(devices):
                return kept, counter_sets
            return kept, _counter_sets_in_use(kept, counter_sets)

        return guarded

    def apply(self, devices: Iterable[Device]) -> list[Device]:
        """The devices to publish under the last verdict."""
        devices = list(devices)
        if not self.sighting.present:
            return devices
        if self.policy.mode == "refuse":
            return []
        if self.policy.mode == "split":
            return [d for d in devices if d.index in self.policy.indexes]
        return [replace(d, taints=(*d.taints, self._taint)) for d in devices]

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Until `stop`: check every `interval_s`."""
        while not stop.wait(interval_s):
            try:
                self.check()
            except Exception:  # a daemon thread must not die of one bad check
                log.exception("device plugin check failed")

    def _held_back(self) -> str:
        if self.policy.mode == "refuse":
            return "publishing no GPU to DRA, so that no GPU is handed out twice"
        if self.policy.mode == "split":
            listed = ",".join(map(str, sorted(self.policy.indexes))) or "none"
            return f"publishing only GPU indexes {listed} to DRA (the device plugin is to keep the others)"
        return (
            f"publishing the GPUs with the device taint {self._taint.key}={self._taint.value}:NoSchedule, "
            "so only claims that tolerate it get them"
        )

    def _report(self, sighting: Sighting) -> None:
        seen = sighting.describe(self._socket_dir)
        if sighting.present:
            note = (
                f"An NVIDIA device plugin serves this node ({seen}); policy {self.policy}: "
                f"{self._held_back()}. Set {SETTING_HINT} to refuse, publish-tainted or "
                "split:<GPU indexes> to change this."
            )
            log.warning(
                "device plugin detected on this node, GPUs held back from DRA",
                extra={
                    "policy": str(self.policy),
                    "sockets": list(sighting.sockets),
                    "resources": list(sighting.resources),
                    "setting": SETTING_HINT,
                    "detail": note,
                },
            )
            if self._events is not None:
                self._events.node_event(DETECTED_REASON, note)
            return
        note = (
            "No NVIDIA device plugin serves this node any more: "
            f"publishing every GPU to DRA (policy {self.policy})."
        )
        log.info("device plugin gone from this node", extra={"policy": str(self.policy), "detail": note})
        if self._events is not None:
            self._events.node_event(GONE_REASON, note, warning=False)
