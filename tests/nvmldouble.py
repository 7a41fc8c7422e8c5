"""The NVML test double (tests/cluster/nvmldouble) from Python tests.

The double is a real ``libnvidia-ml.so.1`` with NVML's C ABI over NVIDIA's go-nvml mock
machines. Anything that loads NVML can load it: the real ``pynvml``, NVIDIA's ``nvidia-smi``, Go
programs using go-nvml (nvidia-ctk). Its configuration is a JSON file named by
``NVML_DOUBLE_CONFIG``; MIG mode and instances live in a state file shared by every process.

    double = NvmlDouble.create(tmp_path, machine="dgxh100", gpus=2)
    subprocess.run([...], env={**os.environ, **double.env()})
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)

``DRA_NVML_DOUBLE_DIR`` names a directory holding a built library; otherwise
``tests/cluster/build_nvml_double.sh`` builds it (a cache check when warm).
NVIDIA's ``nvidia-smi`` comes from the Debian packages ``tests/nvidia_roots.py`` unpacks.

pynvml keeps one module-global library and init count: ``load_pynvml`` points it at the double,
sets ``NVML_DOUBLE_CONFIG`` (the double reads it with getenv(3) at every ``nvmlInit``) and puts
both back after, so tests run in-process, one configuration after another.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "tests" / "cluster" / "build_nvml_double.sh"
LIBRARY_NAME = "libnvidia-ml.so.1"
MACHINES = ("dgxa100", "dgxh100", "dgxh200", "dgxb200")

# NVML's GPU instance profile IDs (nvml.h NVML_GPU_INSTANCE_PROFILE_*), for MigDevice.gi_profile_id.
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4


class NvmlDoubleUnavailable(RuntimeError):
    """The double could not be found or built; the message says what is missing."""


@functools.cache
def library_dir() -> Path:
    """The directory holding the built double (``libnvidia-ml.so.1``, ``gonvmlcheck``)."""
    given = os.environ.get("DRA_NVML_DOUBLE_DIR")
    if given and (Path(given) / LIBRARY_NAME).is_file():
        return Path(given)
    try:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NvmlDoubleUnavailable(f"{BUILD_SCRIPT}: {err}") from err
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise NvmlDoubleUnavailable(
            f"{BUILD_SCRIPT} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    out = Path(lines[-1])
    if not (out / LIBRARY_NAME).is_file():
        raise NvmlDoubleUnavailable(f"{BUILD_SCRIPT} printed {out}, which holds no {LIBRARY_NAME}")
    return out


def lib_path() -> Path:
    return library_dir() / LIBRARY_NAME


def gonvmlcheck_path() -> Path:
    return library_dir() / "gonvmlcheck"


def nvidia_smi() -> Path:
    """NVIDIA's real nvidia-smi from the unpacked Debian packages (tests/nvidia_roots.py, which
    fetches them with tests/cluster/fetch_nvidia_debs.sh and raises when it cannot)."""
    from tests import nvidia_roots

    smi = nvidia_roots.unpacked_tree() / nvidia_roots.DEBIAN_BIN_DIR / "nvidia-smi"
    if not smi.is_file():
        raise nvidia_roots.NvidiaFilesUnavailable(
            f"{smi} is missing from the unpacked packages: rerun {nvidia_roots.FETCH_SCRIPT}"
        )
    return smi


@dataclasses.dataclass(frozen=True)
class ComputeInstance:
    ci_profile_id: int
    start: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ciProfileId": self.ci_profile_id}
        if self.start is not None:
            out["start"] = self.start
        return out


@dataclasses.dataclass(frozen=True)
class MigDevice:
    """A GPU instance present at start (static MIG); without compute instances, one spanning it."""

    gi_profile_id: int
    start: int
    compute_instances: tuple[ComputeInstance, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"giProfileId": self.gi_profile_id, "start": self.start}
        if self.compute_instances:
            out["computeInstances"] = [ci.to_json() for ci in self.compute_instances]
        return out


@dataclasses.dataclass(frozen=True)
class Process:
    pid: int
    used_memory: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mps: bool = False
    sm_util: int = 0
    mem_util: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "usedMemory": self.used_memory, "mps": self.mps}
        if self.gpu_instance_id is not None:
            out["gpuInstanceId"] = self.gpu_instance_id
        if self.compute_instance_id is not None:
            out["computeInstanceId"] = self.compute_instance_id
        if self.sm_util or self.mem_util:
            out["smUtil"], out["memUtil"] = self.sm_util, self.mem_util
        return out


@dataclasses.dataclass(frozen=True)
class MemoryLimitCall:
    """One nvmlDeviceSetMemoryLimits_v1 call as the double recorded it."""

    uuid: str
    cgroup: str
    soft: int
    hard: int
    result: int  # the nvmlReturn_t it answered


@dataclasses.dataclass(frozen=True)
class Gpu:
    """Overrides for the GPU at ``index`` (its position in the configured machine)."""

    index: int
    mig_mode: int | None = None
    mig_mode_pending: int | None = None
    lost: bool = False
    unified_memory: bool = False
    brand: int | None = None
    uuid: str | None = None
    minor: int | None = None
    pci_bus_id: str | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    processes: tuple[Process, ...] = ()
    gpu_utilization: int = 0
    memory_utilization: int = 0
    power_milliwatts: int | None = None
    temperature_celsius: int | None = None
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    throttle_reasons: int = 0
    # False: the per-cgroup memory limit calls answer NVML_ERROR_NOT_SUPPORTED (an older driver).
    memory_limits: bool = True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if not self.memory_limits:
            out["memoryLimits"] = False
        optional = {
            "migMode": self.mig_mode,
            "migModePending": self.mig_mode_pending,
            "brand": self.brand,
            "uuid": self.uuid,
            "minor": self.minor,
            "pciBusId": self.pci_bus_id,
            "powerMilliwatts": self.power_milliwatts,
            "temperatureCelsius": self.temperature_celsius,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        flags = {
            "lost": self.lost,
            "unifiedMemory": self.unified_memory,
            "gpuUtilization": self.gpu_utilization,
            "memoryUtilization": self.memory_utilization,
            "eccCorrected": self.ecc_corrected,
            "eccUncorrected": self.ecc_uncorrected,
            "throttleReasons": self.throttle_reasons,
        }
        out.update({k: v for k, v in flags.items() if v})
        if self.mig_devices:
            out["migDevices"] = [m.to_json() for m in self.mig_devices]
        if self.processes:
            out["processes"] = [p.to_json() for p in self.processes]
        return out


@dataclasses.dataclass
class NvmlDouble:
    """One configured machine: its config file, state file, events file and optional /proc root."""

    config_path: Path
    machine: str | None = "dgxh100"
    gpus: int | None = None
    models: Sequence[str] = ()
    name: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    nvml_version: str | None = None
    overrides: list[Gpu] = dataclasses.field(default_factory=list)
    proc_root: Path | None = None
    dev_root: Path | None = None
    events_path: Path | None = None
    # A GPU reset (reboot) at a process's first nvmlInit: pending MIG modes become current.
    reset_at_init: bool = False
    # The state file when a configuration written elsewhere names its own (else <config>.state).
    state_file: Path | None = None

    @classmethod
    def create(
        cls,
        directory: Path,
        machine: str | None = "dgxh100",
        gpus: int | None = None,
        *,
        overrides: Sequence[Gpu] = (),
        with_proc: bool = True,
        **fields: Any,
    ) -> NvmlDouble:
        directory.mkdir(parents=True, exist_ok=True)
        double = cls(
            config_path=directory / "nvml-double.json",
            machine=None if fields.get("models") else machine,
            gpus=gpus,
            overrides=list(overrides),
            proc_root=directory / "proc" if with_proc else None,
            events_path=directory / "nvml-events.jsonl",
            **fields,
        )
        double.write()
        return double

    # --- configuration ---------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.state_file or Path(str(self.config_path) + ".state")

    @property
    def lib_path(self) -> Path:
        return lib_path()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.machine is not None:
            out["machine"] = self.machine
        if self.models:
            out["models"] = list(self.models)
        optional: dict[str, Any] = {
            "name": self.name,
            "gpuCount": self.gpus,
            "driverVersion": self.driver_version,
            "cudaDriverVersion": self.cuda_driver_version,
            "nvmlVersion": self.nvml_version,
            "procRoot": str(self.proc_root) if self.proc_root else None,
            "devRoot": str(self.dev_root) if self.dev_root else None,
            "eventsFile": str(self.events_path) if self.events_path else None,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out["stateFile"] = str(self.state_path)
        if self.reset_at_init:
            out["resetAtInit"] = True
        if self.overrides:
            out["gpus"] = [g.to_json() for g in sorted(self.overrides, key=lambda g: g.index)]
        return out

    def write(self) -> None:
        """Write the configuration; a running process re-reads it when its mtime changes."""
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        before = self.config_path.stat().st_mtime_ns if self.config_path.exists() else 0
        tmp.replace(self.config_path)
        # The double notices a change by mtime and size: make sure the mtime moves.
        if self.config_path.stat().st_mtime_ns == before:
            os.utime(self.config_path, ns=(before + 1_000_000, before + 1_000_000))

    def override(self, index: int, **changes: Any) -> None:
        """Change one GPU's overrides (e.g. ``lost=True``) and rewrite the configuration."""
        old = next((g for g in self.overrides if g.index == index), Gpu(index=index))
        self.overrides = [g for g in self.overrides if g.index != index]
        self.overrides.append(dataclasses.replace(old, **changes))
        self.write()

    def mark_lost(self, index: int, lost: bool = True) -> None:
        self.override(index, lost=lost)

    def append_event(
        self,
        gpu: int,
        kind: str,
        data: int = 0,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> None:
        """Append one event (kind: xid, doubleBitEcc, migConfigChange, gpuUnavailable, recovery)."""
        if self.events_path is None:
            raise ValueError("this double has no events file")
        event: dict[str, Any] = {"gpu": gpu, "type": kind, "data": data}
        if gpu_instance_id is not None:
            event["gpuInstanceId"] = gpu_instance_id
        if compute_instance_id is not None:
            event["computeInstanceId"] = compute_instance_id
        with self.events_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(event) + "\n")

    def state(self) -> dict[str, Any]:
        """The shared state (MIG mode, instances, compute mode) by GPU UUID; {} before any init."""
        try:
            text = self.state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        loaded: dict[str, Any] = json.loads(text) if text.strip() else {}
        gpus: dict[str, Any] = loaded.get("gpus", {})
        return gpus

    def memory_limit_calls(self) -> list[MemoryLimitCall]:
        """Every nvmlDeviceSetMemoryLimits_v1 the double answered, in order per GPU."""
        return [
            MemoryLimitCall(uuid, call["cgroup"], call["soft"], call["hard"], call["result"])
            for uuid, gpu in sorted(self.state().items())
            for call in gpu.get("memoryLimitCalls", [])
        ]

    def memory_limits(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(GPU UUID, cgroup path) -> (soft, hard) for every limit the double still holds, each
        read back with nvmlDeviceGetMemoryLimits_v1: the double drops a limit whose cgroup is gone
        when it is asked for it, as the driver clears it when the cgroup goes."""
        held: dict[tuple[str, str], tuple[int, int]] = {}
        wanted = [(uuid, ns) for uuid, gpu in self.state().items() for ns in gpu.get("memoryLimits", {})]
        if not wanted:
            return held
        with self.pynvml() as nvml:
            for uuid, ns in sorted(wanted):
                handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
                got = nvml.c_nvmlGetMemoryLimits_v1_t()
                got.nameSpace = ns.encode()
                try:
                    nvml.nvmlDeviceGetMemoryLimits_v1(handle, got)
                except nvml.NVMLError:
                    continue
                held[(uuid, ns)] = (int(got.softLimit), int(got.hardLimit))
        return held

    def env(self) -> dict[str, str]:
        """What a subprocess needs to load the double as libnvidia-ml.so.1."""
        directory = str(library_dir())
        search = os.environ.get("LD_LIBRARY_PATH", "")
        return {
            "NVML_DOUBLE_CONFIG": str(self.config_path),
            "LD_LIBRARY_PATH": f"{directory}:{search}" if search else directory,
        }

    @contextlib.contextmanager
    def pynvml(self) -> Iterator[ModuleType]:
        """The real pynvml, loaded against the double and initialised with this configuration."""
        with load_pynvml(self.config_path) as nvml:
            yield nvml


@contextlib.contextmanager
def load_pynvml(config_path: Path | None = None) -> Iterator[ModuleType]:
    """The real pynvml on the double, initialised with ``config_path`` (else the current
    ``NVML_DOUBLE_CONFIG``), shut down after and the variable put back.

    pynvml keeps one module-global library: once it is the double it stays loaded (the plugin's
    ``NvmlBackend`` in the same test loads the same file, which ``dlopen`` hands back as the same
    library, so pynvml's cached function pointers stay right). The double reads
    ``NVML_DOUBLE_CONFIG`` with getenv(3) at each ``nvmlInit``, so one process runs one test's
    machine after another's.
    """
    import pynvml

    previous_env = os.environ.get("NVML_DOUBLE_CONFIG")
    if config_path is not None:
        os.environ["NVML_DOUBLE_CONFIG"] = str(config_path)
    library = str(lib_path())
    if getattr(pynvml.nvmlLib, "_name", None) != library:
        pynvml.nvmlLib = ctypes.CDLL(library)
        pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        pynvml.nvmlInit()
        try:
            yield pynvml
        finally:
            pynvml.nvmlShutdown()
    finally:
        if previous_env is None:
            os.environ.pop("NVML_DOUBLE_CONFIG", None)
        else:
            os.environ["NVML_DOUBLE_CONFIG"] = previous_env


def nvml_double_factory(tmp_path: Path) -> Callable[..., NvmlDouble]:
    """For a fixture: ``nvml_double(machine="dgxh100", gpus=2, overrides=[...])`` in tmp_path.

    Fails the test, with the build script's own words, when the double cannot be built: a missing
    test binary is a broken test environment, never a reason to skip.
    """
    import pytest

    try:
        library_dir()
    except NvmlDoubleUnavailable as err:
        pytest.fail(f"NVML double unavailable (build it with {BUILD_SCRIPT}): {err}")
    counter = iter(range(1_000_000))

    def make(machine: str | None = "dgxh100", gpus: int | None = None, **fields: Any) -> NvmlDouble:
        return NvmlDouble.create(tmp_path / f"nvml-double-{next(counter)}", machine, gpus, **fields)

    return make


def plugin_backend(double: NvmlDouble, request: Any, **options: Any) -> Any:
    """The plugin's ``NvmlBackend`` on ``double``, in this process (``request``: the test's
    ``pytest.FixtureRequest``).

    The double has one configuration per process, the one named by ``NVML_DOUBLE_CONFIG`` at the
    latest ``nvmlInit``: this sets it to ``double``'s, and after the test closes the backend
    (``nvmlShutdown``) and puts the variable back. Options go to ``NvmlBackend`` (``partitionable``
    ...); ``proc_root`` defaults to the double's.
    """
    from draplugin.devices.nvml import NvmlBackend

    previous = os.environ.get("NVML_DOUBLE_CONFIG")
    os.environ["NVML_DOUBLE_CONFIG"] = str(double.config_path)

    def restore() -> None:
        if previous is None:
            os.environ.pop("NVML_DOUBLE_CONFIG", None)
        else:
            os.environ["NVML_DOUBLE_CONFIG"] = previous

    request.addfinalizer(restore)
    if double.proc_root is not None:
        options.setdefault("proc_root", str(double.proc_root))
    backend = NvmlBackend(options.pop("node_name", "node-a"), lib_path=str(lib_path()), **options)
    request.addfinalizer(backend.close)
    return backend
