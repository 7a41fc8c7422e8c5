"""The prepared-claim checkpoint: a small, versioned, atomically written JSON marker.

It records, per claim, what the kubelet cannot tell us again and what we
cannot recompute: which devices we handed out (so unprepare works after the
claim is deleted, and so a second claim cannot take a device that is in use)
and the validated config applied to each device (so CDI specs can be
re-created at start-up without asking the API server).

A claim is recorded as `PrepareStarted` before anything is changed on the node
(in memory, where it takes the devices; a redo of a known claim also writes it
to the file first) and written as `PrepareCompleted`, durably, once its CDI spec
exists and before the kubelet is answered: a crash at any point leaves either
that record or nothing the kubelet was told about, and start-up removes what a
claim without a completed record left behind (`draplugin.prepare.driver`).

Formats:
  v1 (older releases): `preparedClaims` keyed by UID, every claim completed,
     no per-device config. Read as "needs a fresh prepare".
  v2 (current): `claims` list with state, devices and per-device config; a claim
     rebuilt from its CDI spec alone carries `rebuiltFromSpec: true` (older v2
     readers ignore the key and read it as an ordinary `PrepareStarted`).
  v3+ (newer releases): read as v2 when the v2 core is present, with a warning.

The boot ID ties the record to one boot of the node: after a reboot the
devices' runtime state (and `/var/run/cdi`, a tmpfs) is gone, so completed
claims are demoted to `PrepareStarted` and redone on the next prepare, while
still being known so that unprepare succeeds.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draplugin.statefile import StateFormatError, atomic_write, read_state, remove_stale_temp_files

log = logging.getLogger(__name__)

CURRENT_VERSION = 2
DEFAULT_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One allocation result as we prepared it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    # The validated GpuConfig document applied to this device; None when unknown (v1 records).
    config: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiIds": list(self.cdi_ids),
        }
        if self.share_id is not None:
            out["shareId"] = self.share_id
        if self.admin_access:
            out["adminAccess"] = True
        if self.config is not None:
            out["config"] = dict(self.config)
        return out


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[DeviceRecord, ...] = ()
    # Rebuilt at start-up from the claim's surviving CDI spec alone (checkpoint lost, API server
    # unreachable): `PrepareStarted`, since we cannot say how it was prepared, but its pod may be
    # running, so start-up keeps its sharing state (MIG instance, MPS daemon, time-slice) until the
    # kubelet prepares or unprepares it. Stored as an extra key, which older v2 readers ignore.
    from_spec: bool = False

    @property
    def completed(self) -> bool:
        return self.state is ClaimState.PREPARE_COMPLETED

    @property
    def holds_sharing_state(self) -> bool:
        """Start-up keeps this claim's sharing state: it is prepared, or may be in use by a pod."""
        return self.completed or self.from_spec

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state.value,
            "devices": [device.to_json() for device in self.devices],
        }
        if self.from_spec:
            out["rebuiltFromSpec"] = True
        return out


class CheckpointFormatError(StateFormatError):
    """The file exists but cannot be understood."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What `CheckpointStore.load` found, for the caller to log and report."""

    version: int | None = None
    claims: int = 0
    new_boot: bool = False
    corrupt_reason: str | None = None
    moved_to: Path | None = None
    newer_version: bool = False


def read_boot_id(path: Path = DEFAULT_BOOT_ID_PATH) -> str:
    """This boot's ID; '' when the kernel does not expose one (then reboots cannot be detected)."""
    try:
        return path.read_text().strip()
    except OSError as err:
        log.warning(
            "boot ID unreadable: reboots cannot be detected", extra={"path": str(path), "error": str(err)}
        )
        return ""


class CheckpointStore:
    """In-memory view of the prepared claims, persisted to one file.

    Mutations are synchronous (callers on the event loop can check and claim a
    device with no await in between); `commit()` persists them, by group commit:
    one write is in flight at a time, and every change made while it is in flight
    goes into the next one, so 64 claims completing together cost a few writes
    instead of 64, and no caller returns before a write that holds its change has
    been fsynced: the file, and the directory too for a write that forgets a claim
    (`_forgets_unwritten` says why the others need one sync only).
    """

    def __init__(self, path: Path, boot_id: str, *, fsync: Callable[[int], None] | None = None) -> None:
        self.path = path
        self.boot_id = boot_id
        self._claims: dict[str, ClaimRecord] = {}
        self._version = 0
        self._written = 0
        # The write in flight and the version it holds; None when the file is idle.
        self._flight: asyncio.Future[None] | None = None
        self._flight_version = 0
        # Its own thread: a write never queues behind the prepares' spec writes in the loop's
        # default executor (a handful of threads on a small node, shared by 64 claims).
        self._writer: ThreadPoolExecutor | None = None
        # `fsync` replaces os.fsync in our writes (the tests count and hold the syncs with it).
        self._write_options: dict[str, Any] = {} if fsync is None else {"fsync": fsync}
        # Our changes the file does not hold yet (uid -> (version of the change, record or None
        # for a forget)). `load()` re-applies them over what it reads, so re-reading the file
        # (another plugin process may have written it) never drops a claim of ours that is held
        # in memory only, such as a new claim's PrepareStarted or one still running after the
        # kubelet's deadline.
        self._unwritten: dict[str, tuple[int, ClaimRecord | None]] = {}
        # Each record's JSON as the last render made it (`_render`).
        self._encoded: dict[str, tuple[ClaimRecord, str]] = {}

    # --- queries and mutations --------------------------------------------------------------------

    def get(self, uid: str) -> ClaimRecord | None:
        return self._claims.get(uid)

    def records(self) -> Iterator[ClaimRecord]:
        return iter(list(self._claims.values()))

    def __len__(self) -> int:
        return len(self._claims)

    def durable(self, uid: str) -> bool:
        """Whether the file holds what memory says of the claim (no change of it is unwritten)."""
        return uid not in self._unwritten

    def put(self, record: ClaimRecord) -> None:
        self._claims[record.uid] = record
        self._version += 1
        self._unwritten[record.uid] = (self._version, record)

    def forget(self, uid: str) -> bool:
        if self._claims.pop(uid, None) is None:
            return False
        self._version += 1
        self._unwritten[uid] = (self._version, None)
        return True

    def _mark_written(self, version: int) -> None:
        self._written = max(self._written, version)
        self._unwritten = {uid: change for uid, change in self._unwritten.items() if change[0] > version}

    # --- persistence ------------------------------------------------------------------------------

    async def commit(self) -> None:
        """Make every change made so far durable. Raises OSError when the write that was to hold
        them fails: the changes stay unwritten (the next commit of anyone writes them) and the
        caller decides what memory must say meanwhile.

        A caller whose change came after the write in flight began waits for that write and then
        for the next, which it starts if no one has: that next write holds every change made
        meanwhile, so the callers waiting on it share its fsyncs. Cancelling a caller never
        cancels a write that others wait on."""
        target = self._version
        while self._written < target:
            flight = self._flight
            if flight is None:
                flight = self._start_write()
            holds_ours = self._flight_version >= target
            try:
                await asyncio.shield(flight)
            except OSError:
                if holds_ours:
                    raise
                # A write begun before our change failed: ours goes into the next one.

    def _start_write(self) -> asyncio.Future[None]:
        version = self._version
        task = asyncio.get_running_loop().create_task(
            self._write(version, self._render(), sync_dir=self._forgets_unwritten())
        )
        self._flight, self._flight_version = task, version
        return task

    def _forgets_unwritten(self) -> bool:
        """Whether a write of the unwritten changes must make its rename durable too (the directory's
        fsync after the file's): only when it forgets a claim.

        What a power loss may undo without the directory's sync is the rename: the file then holds
        the write before, whole (every write syncs its file before its rename). A power loss is a
        reboot, and after a reboot every completed record is demoted and redone by the kubelet's
        next prepare (nothing a prepare made outlives a reboot but CDI specs in a CDI root on disk
        and sharing state, and start-up removes both for a claim without a record). So a record
        added or changed by the lost write costs nothing: the kubelet prepares its claim again after
        the reboot, afresh or as a redo, and an unprepare of it finds nothing to undo, which is
        true. A lost forget is not harmless: the claim would come back, demoted, holding its
        devices, and the kubelet never unprepares a claim it was told is unprepared. Such a write
        takes both syncs, as every write did before."""
        return any(change is None for _, change in self._unwritten.values())

    async def _write(self, version: int, content: bytes, *, sync_dir: bool) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        write = functools.partial(
            atomic_write, self.path, content, 0o600, sync_dir=sync_dir, **self._write_options
        )
        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, write)
        finally:
            # Here, inside the task, before anyone awaiting it resumes: a caller that sees the
            # write done sees the file idle and its version written (a done-callback may run
            # after a caller woken in the same loop turn, which would then wait on a write that
            # is over and never yield).
            self._flight = None
        self._mark_written(version)

    def save(self) -> None:
        """Synchronous commit, for start-up before the event loop serves requests. Both syncs: it
        may hold what start-up recovery forgot or rebuilt."""
        atomic_write(self.path, self._render(), 0o600, **self._write_options)
        self._mark_written(self._version)

    def remove_stale_temp_files(self, before: float) -> list[Path]:
        """Temp files of our interrupted writes (`.checkpoint.json.*.tmp`) older than `before`."""
        return remove_stale_temp_files(self.path.parent, before, names=(self.path.name,))

    def _render(self) -> bytes:
        """The file's content: what `json.dumps` makes of {version, bootId, claims sorted by UID},
        compact (json's C encoder serves only indent=None; indent=1 made it ~10 ms at 64 claims).
        Each record's JSON is kept from the write before, as long as the record is the same
        object: a commit runs this on the event loop over every prepared claim, and re-encoding
        64 unchanged records cost ~0.45 ms a write."""
        encoded: dict[str, tuple[ClaimRecord, str]] = {}
        parts = []
        for uid in sorted(self._claims):
            record = self._claims[uid]
            known = self._encoded.get(uid)
            text = known[1] if known is not None and known[0] is record else json.dumps(record.to_json())
            encoded[uid] = (record, text)
            parts.append(text)
        self._encoded = encoded
        head = json.dumps({"version": CURRENT_VERSION, "bootId": self.boot_id})[:-1]
        return f'{head}, "claims": [{", ".join(parts)}]}}\n'.encode()

    def load(self) -> LoadResult:
        """Read the file. A missing file is an empty checkpoint; a corrupt one (any content, or
        something else in its place: `draplugin.statefile.read_state`) is moved aside."""
        found = read_state(self.path, parse, what="checkpoint")
        if found.problem is not None:
            self._claims = {}
            self._version += 1
            return LoadResult(corrupt_reason=found.problem, moved_to=found.moved_to)
        if found.value is None:
            return LoadResult()
        version, boot_id, records = found.value
        newer = version > CURRENT_VERSION
        if newer:
            log.warning(
                "checkpoint written by a newer release: reading its v2 core; "
                "fields it added are dropped on the next write",
                extra={"path": str(self.path), "version": version, "understood": CURRENT_VERSION},
            )
        new_boot = bool(boot_id) and bool(self.boot_id) and boot_id != self.boot_id
        self._claims = {}
        for record in records:
            if new_boot or version == 1:
                # After a reboot nothing we did survives; v1 lacks the config to redo it offline.
                record = replace(record, state=ClaimState.PREPARE_STARTED, from_spec=False)
            self._claims[record.uid] = record
        for uid, (_, change) in self._unwritten.items():
            if change is None:
                self._claims.pop(uid, None)
            else:
                self._claims[uid] = change
        self._version += 1
        return LoadResult(version=version, claims=len(records), new_boot=new_boot, newer_version=newer)


# --- parsing (pure) -----------------------------------------------------------------------------------


def parse(raw: bytes) -> tuple[int, str, list[ClaimRecord]]:
    """Decode any known checkpoint format into (version, boot ID, records)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as err:
        # ValueError covers decode errors, bad UTF-8 and integers past the digit limit; deep
        # nesting ends in RecursionError. All of them are a corrupt file, never a crash loop.
        raise CheckpointFormatError(f"not JSON: {type(err).__name__}: {err}") from None
    if not isinstance(doc, dict):
        raise CheckpointFormatError("top level is not an object")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointFormatError(f"missing or invalid version {version!r}")
    boot_id = doc.get("bootId", "")
    if not isinstance(boot_id, str):
        raise CheckpointFormatError("bootId is not a string")
    if version == 1:
        return version, boot_id, _parse_v1(doc)
    return version, boot_id, _parse_v2(doc)


def _parse_v1(doc: Mapping[str, Any]) -> list[ClaimRecord]:
    claims = doc.get("preparedClaims", {})
    if not isinstance(claims, dict):
        raise CheckpointFormatError("v1 preparedClaims is not an object")
    records = []
    for uid, entry in claims.items():
        where = f"preparedClaims[{uid}]"
        entry = _obj(entry, where)
        devices = []
        for i, dev in enumerate(_list(entry.get("devices", []), f"{where}.devices")):
            dev = _obj(dev, f"{where}.devices[{i}]")
            devices.append(
                DeviceRecord(
                    request_names=_strings(dev.get("requestNames", []), f"{where}.devices[{i}].requestNames"),
                    pool=_str(dev.get("poolName"), f"{where}.devices[{i}].poolName"),
                    device=_str(dev.get("deviceName"), f"{where}.devices[{i}].deviceName"),
                    cdi_ids=_strings(dev.get("cdiDeviceIds", []), f"{where}.devices[{i}].cdiDeviceIds"),
                )
            )
        records.append(
            ClaimRecord(
                uid=uid,
                namespace=_str(entry.get("namespace"), f"{where}.namespace"),
                name=_str(entry.get("name"), f"{where}.name"),
                state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(devices),
            )
        )
    return records


def _parse_v2(doc: Mapping[str, Any]) -> list[ClaimRecord]:
    # Unknown keys are ignored on purpose: a newer release may add fields around the v2 core.
    records = []
    for i, entry in enumerate(_list(doc.get("claims"), "claims")):
        where = f"claims[{i}]"
        entry = _obj(entry, where)
        state_text = _str(entry.get("state"), f"{where}.state")
        try:
            state = ClaimState(state_text)
        except ValueError:
            raise CheckpointFormatError(f"{where}.state: unknown state {state_text!r}") from None
        devices = []
        for j, dev in enumerate(_list(entry.get("devices", []), f"{where}.devices")):
            at = f"{where}.devices[{j}]"
            dev = _obj(dev, at)
            share_id = dev.get("shareId")
            config = dev.get("config")
            admin = dev.get("adminAccess", False)
            if share_id is not None and not isinstance(share_id, str):
                raise CheckpointFormatError(f"{at}.shareId is not a string")
            if config is not None and not isinstance(config, dict):
                raise CheckpointFormatError(f"{at}.config is not an object")
            if not isinstance(admin, bool):
                raise CheckpointFormatError(f"{at}.adminAccess is not a boolean")
            devices.append(
                DeviceRecord(
                    request_names=_strings(dev.get("requestNames", []), f"{at}.requestNames"),
                    pool=_str(dev.get("pool"), f"{at}.pool"),
                    device=_str(dev.get("device"), f"{at}.device"),
                    cdi_ids=_strings(dev.get("cdiIds", []), f"{at}.cdiIds"),
                    share_id=share_id,
                    admin_access=admin,
                    config=config,
                )
            )
        from_spec = entry.get("rebuiltFromSpec", False)
        if not isinstance(from_spec, bool):
            raise CheckpointFormatError(f"{where}.rebuiltFromSpec is not a boolean")
        records.append(
            ClaimRecord(
                uid=_str(entry.get("uid"), f"{where}.uid"),
                namespace=_str(entry.get("namespace"), f"{where}.namespace"),
                name=_str(entry.get("name"), f"{where}.name"),
                state=state,
                devices=tuple(devices),
                from_spec=from_spec,
            )
        )
    return records


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointFormatError(f"{where} is not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise CheckpointFormatError(f"{where} is not a list")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise CheckpointFormatError(f"{where} is missing or not a string")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointFormatError(f"{where} is not a list of strings")
    return tuple(value)
