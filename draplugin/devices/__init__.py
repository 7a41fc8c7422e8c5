"""GPU discovery behind one interface: NVML on real hardware, fake GPUs elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draplugin.devices.naming import DeviceNaming
from draplugin.devices.shared import SharedGpus, UnlimitedShares

if TYPE_CHECKING:
    from draplugin.devices.model import (
        AttributeValue,
        CounterConsumption,
        CounterSet,
        Device,
        DeviceBackend,
        DeviceTaint,
        DeviceValidationError,
        Version,
    )

# The device model's names, given from here on first use: the settings import submodules of this
# package (naming, shared, the health and coexistence policies) before the kubelet plugin's
# sockets open, and the model is not needed to check them (tests/unit/test_plugin_start_imports.py).
_MODEL_NAMES = frozenset(
    {
        "AttributeValue",
        "CounterConsumption",
        "CounterSet",
        "Device",
        "DeviceBackend",
        "DeviceTaint",
        "DeviceValidationError",
        "Version",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        from draplugin.devices import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AttributeValue",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceBackend",
    "DeviceTaint",
    "DeviceValidationError",
    "Version",
    "load_backend",
]

BACKENDS = ("fake", "nvml")


def load_backend(kind: str, node_name: str, **options: Any) -> DeviceBackend:
    """Build the named backend.

    fake: `config_file` (YAML path) or `gpus` + `model` (+ `partitionable`), `dev_root` or
    `device_dir` (where to create the fake device nodes).
    nvml: `lib_path` (libnvidia-ml.so.1 or a driver root), `partitionable`, `sysfs_root`, `proc_root`,
    and for shared GPUs `nvidia_cdi_hook_path` and `unlimited_shares` (`draplugin.devices.shared`).
    Both: `shared_gpus` (a `SharedGpus` mode; whole GPUs several claims may share), `naming` (a
    `DeviceNaming`: the device name scheme, `draplugin.devices.naming`).
    Raises ValueError (a subclass naming the problem) for bad options or a missing NVML library.
    """
    shared_gpus = SharedGpus(options.pop("shared_gpus", SharedGpus.OFF))
    naming = DeviceNaming(options.pop("naming", DeviceNaming.DRAPLUGIN))
    if kind == "fake":
        import draplugin.devices.fake as fake

        config_file = options.pop("config_file", None)
        dev_root = options.pop("dev_root", None)
        device_dir = options.pop("device_dir", None)
        partitionable = bool(options.pop("partitionable", False))
        if config_file is not None:
            config = fake.load_config(config_file)
            if partitionable:
                from dataclasses import replace

                config = replace(config, partitionable=True)
            options.pop("gpus", None)
            options.pop("model", None)
        else:
            config = fake.config_from_flags(
                int(options.pop("gpus", 1)),
                str(options.pop("model", fake.DEFAULT_MODEL)),
                partitionable=partitionable,
            )
        _reject_unknown(kind, options)
        return fake.FakeBackend(
            node_name,
            config,
            dev_root=dev_root,
            device_dir=None if device_dir is None else Path(device_dir),
            # The file is read again when it changes: fake devices can come and go like real ones.
            config_file=None if config_file is None else Path(config_file),
            force_partitionable=partitionable,
            shared_gpus=shared_gpus,
            naming=naming,
        )
    if kind == "nvml":
        from draplugin.devices.nvml import NvmlBackend

        backend = NvmlBackend(
            node_name,
            lib_path=options.pop("lib_path", None),
            partitionable=bool(options.pop("partitionable", False)),
            shared_gpus=shared_gpus,
            naming=naming,
            sysfs_root=options.pop("sysfs_root", "/sys"),
            proc_root=options.pop("proc_root", "/proc"),
            nvidia_cdi_hook_path=options.pop("nvidia_cdi_hook_path", None),
            unlimited_shares=UnlimitedShares(options.pop("unlimited_shares", UnlimitedShares.SKIP)),
        )
        _reject_unknown(kind, options)
        return backend
    raise ValueError(f"unknown device backend {kind!r}; choose one of: {', '.join(BACKENDS)}")


def _reject_unknown(kind: str, options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"{kind} backend: unknown options: {', '.join(sorted(options))}")
