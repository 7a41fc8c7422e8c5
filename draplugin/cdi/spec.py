"""Container Device Interface: a typed spec model and an atomic, per-claim spec store.

There is no Python CDI library, so this is ours. The model covers the fields
we emit (device nodes, env, mounts, hooks) and computes the lowest `cdiVersion`
that covers them: runtimes bundle a CDI library of some age and refuse
versions newer than they know, so asking for more than needed only breaks
older nodes.

Each prepared claim gets one transient spec file named after the claim UID,
and every device in it is named `<claim uid>-<device>`: runtimes cache specs,
so a name must never come back meaning something else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dracommon.drivername import DEFAULT_DRIVER_NAME, cdi_kind, cdi_vendor
from dracommon.kubenames import uid_problem

# The one atomic writer and temp-file sweep of every state the plugin keeps; named here too because
# the CDI store was their first user and callers still import them from this module.
from draplugin.statefile import atomic_write as atomic_write
from draplugin.statefile import fsync_dir, remove_stale_temp_files

log = logging.getLogger(__name__)

DEFAULT_CDI_ROOT = Path("/var/run/cdi")
# The default driver's kind: only the default of the pure planning functions (their tests). The
# node plugin takes its kind from its SpecStore, which follows the configured driver name.
KIND = cdi_kind(DEFAULT_DRIVER_NAME)

# Versions in order; the minimum for each feature follows the CDI spec's version table.
BASE_VERSION = "0.3.0"
_VERSION_ORDER = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# Wall-clock time this module was loaded, about when the process started: a temp file of ours older
# than that belongs to a write that a dead process never finished.
PROCESS_STARTED = time.time()


class CdiError(ValueError):
    """A spec or name that a CDI consumer would reject."""


_NODE_TYPES = ("c", "b", "u", "p")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node. With `type` and `major`/`minor` the runtime makes the node from the numbers
    and never looks at the host path: the only way to hand out a node that exists in no host
    `/dev` (a MIG access node made inside the plugin's container)."""

    path: str
    host_path: str | None = None
    permissions: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None  # permission bits of the node made in the container

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None:
            out["hostPath"] = self.host_path
        if self.type is not None:
            out["type"] = self.type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        if self.permissions is not None:
            out["permissions"] = self.permissions
        return out

    def min_version(self) -> str:
        return "0.5.0" if self.host_path is not None else BASE_VERSION


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type is not None:
            out["type"] = self.type
        return out

    def min_version(self) -> str:
        return "0.4.0" if self.type is not None else BASE_VERSION


# OCI hook points a CDI hook may name (the CDI spec's `hookName`).
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")


@dataclass(frozen=True, slots=True)
class Hook:
    """An OCI hook the runtime runs for a container (`args[0]` is the program's argv[0])."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        return out


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [node.to_json() for node in self.device_nodes]
        if self.mounts:
            out["mounts"] = [mount.to_json() for mount in self.mounts]
        if self.hooks:
            out["hooks"] = [hook.to_json() for hook in self.hooks]
        return out

    def min_version(self) -> str:
        versions = [BASE_VERSION]
        versions += [node.min_version() for node in self.device_nodes]
        versions += [mount.min_version() for mount in self.mounts]
        return _highest(versions)

    def validate(self, where: str) -> None:
        for entry in self.env:
            name, sep, _ = entry.partition("=")
            if not sep or not _ENV_NAME.match(name):
                raise CdiError(f"{where}: env entry {entry!r} is not NAME=value")
        for node in self.device_nodes:
            if not node.path.startswith("/"):
                raise CdiError(f"{where}: device node path {node.path!r} must be absolute")
            if node.permissions is not None and not re.fullmatch(r"[rwm]{1,3}", node.permissions):
                raise CdiError(
                    f"{where}: device node permissions {node.permissions!r} must be a subset of 'rwm'"
                )
            if node.type is not None and node.type not in _NODE_TYPES:
                raise CdiError(
                    f"{where}: device node type {node.type!r} is not one of {', '.join(_NODE_TYPES)}"
                )
            if (node.major is None) != (node.minor is None) or (node.major is not None and node.type is None):
                # A runtime given half of the numbers, or numbers without a type, stats the host path.
                raise CdiError(
                    f"{where}: device node {node.path}: major and minor need each other and a type"
                )
            if node.file_mode is not None and not 0 <= node.file_mode <= 0o7777:
                raise CdiError(f"{where}: device node {node.path}: fileMode {node.file_mode:o} is not a mode")
        for mount in self.mounts:
            if not mount.container_path.startswith("/"):
                raise CdiError(f"{where}: mount containerPath {mount.container_path!r} must be absolute")
        for hook in self.hooks:
            if hook.hook_name not in HOOK_NAMES:
                raise CdiError(
                    f"{where}: hook {hook.path}: hookName {hook.hook_name!r} is not one of "
                    f"{', '.join(HOOK_NAMES)}"
                )
            if not hook.path.startswith("/"):
                raise CdiError(f"{where}: hook path {hook.path!r} must be absolute")


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str
    edits: ContainerEdits

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "containerEdits": self.edits.to_json()}

    def min_version(self) -> str:
        # A name that starts with a digit needs 0.5.0 (claim UIDs often do).
        by_name = "0.5.0" if self.name[:1].isdigit() else BASE_VERSION
        return _highest([by_name, self.edits.min_version()])


@dataclass(frozen=True, slots=True)
class Spec:
    """One CDI spec file. `cdi_version` is derived from the content, never chosen by hand."""

    kind: str
    devices: tuple[CdiDevice, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)

    @property
    def cdi_version(self) -> str:
        versions = [self.edits.min_version()] + [device.min_version() for device in self.devices]
        # A '.' in the class part of the kind needs 0.6.0.
        if "." in self.kind.partition("/")[2]:
            versions.append("0.6.0")
        return _highest(versions)

    def validate(self) -> None:
        vendor, sep, cls = self.kind.partition("/")
        if not sep or not _VENDOR_OR_CLASS.match(vendor) or not _VENDOR_OR_CLASS.match(cls):
            raise CdiError(f"kind {self.kind!r} is not <vendor>/<class>")
        if not self.devices:
            raise CdiError("a spec needs at least one device")
        seen: set[str] = set()
        for device in self.devices:
            if not _DEVICE_NAME.match(device.name):
                raise CdiError(f"device name {device.name!r} is not a valid CDI device name")
            if device.name in seen:
                raise CdiError(f"device name {device.name!r} appears twice")
            seen.add(device.name)
            device.edits.validate(f"device {device.name}")
        self.edits.validate("spec")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cdiVersion": self.cdi_version,
            "kind": self.kind,
            "devices": [device.to_json() for device in self.devices],
        }
        if not self.edits.is_empty():
            out["containerEdits"] = self.edits.to_json()
        return out

    def render(self) -> bytes:
        """The file content: stable key order so an unchanged spec is byte-identical. Compact: only
        runtimes read it (every CDI library parses JSON; `jq` shows it to a person), and json's C
        encoder serves only the compact form: indented, every prepare's spec went through the
        pure-Python encoder at about three times the cost."""
        self.validate()
        return (json.dumps(self.to_json(), separators=(",", ":")) + "\n").encode()


def qualified_name(name: str, kind: str = KIND) -> str:
    """The fully-qualified device ID the kubelet hands the runtime: `vendor/class=name`."""
    if not _DEVICE_NAME.match(name):
        raise CdiError(f"device name {name!r} is not a valid CDI device name")
    return f"{kind}={name}"


def claim_device_name(claim_uid: str, device: str) -> str:
    """`<claim uid>-<device>`: unique for the life of the claim, never reused afterwards."""
    return f"{claim_uid}-{device}"


def _highest(versions: Sequence[str]) -> str:
    return max(versions, key=_VERSION_ORDER.index)


# --- the on-disk store ---------------------------------------------------------------------------------


class SpecStore:
    """Per-claim spec files in one CDI directory, written so a runtime never sees a partial file.

    The runtime watches the directory and only reads `*.json`/`*.yaml`, so the
    temporary file is a dot-file ending in `.tmp` that it ignores.

    Vendor and kind follow the driver name (`dracommon.drivername`): the files
    are `<driver>-claim_<uid>.json` and their devices `<driver>/gpu=<name>`.
    """

    def __init__(self, root: Path, driver_name: str) -> None:
        self.root = root
        # The kind of every spec written here, and so of every CDI device ID handed out for one.
        self.kind = cdi_kind(driver_name)
        self._prefix = f"{cdi_vendor(driver_name)}-claim_"

    def path_for(self, claim_uid: str) -> Path:
        problem = uid_problem(claim_uid)
        if problem is not None:
            # The UID becomes part of a file name: refuse anything that could escape the directory.
            raise CdiError(f"claim UID {claim_uid!r} cannot be used in a file name: it {problem}")
        return self.root / f"{self._prefix}{claim_uid}.json"

    def remove_stale_temp_files(self, before: float) -> list[Path]:
        """Our temp files (`.<prefix><uid>.json.*.tmp`) last changed before `before`: interrupted writes."""
        return remove_stale_temp_files(self.root, before, prefix=self._prefix, suffix=".json")

    def write(self, claim_uid: str, spec: Spec) -> bool:
        """Write the claim's spec unless an identical file is already there. Returns True if written.

        Atomic but not fsynced (two fsyncs off every prepare): the spec is never the record that
        must survive. The kubelet is answered only after the claim's checkpoint record is durable,
        and from that record the spec is rebuilt whenever it is missing or differs: by start-up
        (`GpuDriver.recover`) when the boot is the same, by the kubelet's prepare after a reboot
        (power loss is always one; its records are demoted and redone). A spec whose record never
        became durable is removed by start-up as leaked, so none is orphaned. `/var/run/cdi` is a
        tmpfs besides, where an fsync does nothing.
        """
        content = spec.render()
        path = self.path_for(claim_uid)
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == content:
                return False
        atomic_write(path, content, durable=False)
        return True

    def read(self, claim_uid: str) -> bytes | None:
        try:
            return self.path_for(claim_uid).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, claim_uid: str) -> bool:
        """Delete the claim's spec; a missing file is fine. Returns True if a file was removed."""
        path = self.path_for(claim_uid)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        fsync_dir(self.root)
        return True

    def claim_uids(self) -> Iterator[str]:
        """UIDs of every claim that has a spec of ours in the directory."""
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith(self._prefix) and entry.name.endswith(".json"):
                yield entry.name[len(self._prefix) : -len(".json")]
