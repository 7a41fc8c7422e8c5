"""What the NVIDIA driver's `nvidia-smi` says, read for gpu-check: its `-q -x` document and its `-L` list."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

_LISTED_UUID = re.compile(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)")


@dataclass(frozen=True, slots=True)
class SmiMig:
    gpu_instance: int
    compute_instance: int
    multiprocessors: int | None
    memory_mib: int | None


@dataclass(frozen=True, slots=True)
class SmiGpu:
    uuid: str
    name: str
    bus_id: str  # sysfs form: 0000:18:00.0
    memory_mib: int | None
    mig_enabled: bool
    migs: tuple[SmiMig, ...] = field(default=())
    # MIG mode reads Enabled or Disabled on a GPU that has MIG at all, N/A on one that has not.
    mig_capable: bool = False


# --- nvidia-smi -q -x -----------------------------------------------------------------------------


def parse_smi_xml(text: str) -> list[SmiGpu]:
    """The GPUs of an `nvidia-smi -q -x` document."""
    root = ET.fromstring(text)
    gpus = []
    for gpu in root.iter("gpu"):
        migs = tuple(
            SmiMig(
                gpu_instance=int(_text(mig, "gpu_instance_id") or -1),
                compute_instance=int(_text(mig, "compute_instance_id") or -1),
                multiprocessors=_int(_text(mig, "device_attributes/shared/multiprocessor_count")),
                memory_mib=_mib(_text(mig, "fb_memory_usage/total")),
            )
            for mig in gpu.iter("mig_device")
        )
        gpus.append(
            SmiGpu(
                uuid=_text(gpu, "uuid"),
                name=_text(gpu, "product_name"),
                bus_id=_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id", "")),
                memory_mib=_mib(_text(gpu, "fb_memory_usage/total")),
                mig_enabled=_text(gpu, "mig_mode/current_mig") == "Enabled",
                migs=migs,
                mig_capable=_text(gpu, "mig_mode/current_mig") in ("Enabled", "Disabled"),
            )
        )
    return gpus


def _text(element: ET.Element, path: str) -> str:
    found = element.find(path)
    return (found.text or "").strip() if found is not None else ""


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _mib(text: str) -> int | None:
    number, _, unit = text.partition(" ")
    return int(number) if number.isdigit() and unit == "MiB" else None


def _bus_id(text: str) -> str:
    """nvidia-smi's '00000000:18:00.0' → sysfs's '0000:18:00.0', as our attribute has it."""
    domain, _, rest = text.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest and domain else text.lower()


# --- nvidia-smi -L --------------------------------------------------------------------------------


def listed_uuids(output: str) -> list[str]:
    """UUIDs of the GPUs and MIG devices `nvidia-smi -L` lists."""
    return _LISTED_UUID.findall(output)
