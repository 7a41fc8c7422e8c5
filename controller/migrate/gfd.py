"""GPU Feature Discovery node labels as CEL device selectors: the one table.

GPU Feature Discovery (GFD, part of NVIDIA's k8s-device-plugin) labels a node
with what it found on the node's GPUs; device-plugin-era pods pick GPUs by
selecting nodes on those labels. A claim selects devices instead, so each label
with a device equivalent becomes a CEL expression on the attributes and
capacity this driver publishes (`draplugin.devices.schema`). The encodings are
GFD's (internal/lm in k8s-device-plugin):

* `gpu.product` is NVML's product name with spaces turned into `-` (after GFD
  drops characters outside `[A-Za-z0-9-_. ]`), `<product>-MIG-<profile>` for a
  MIG device under the `single` strategy, and `-SHARED` appended when the
  device plugin time-slices the GPU without renaming the resource.
* `gpu.memory` is the total memory in MiB, rounded down; we publish bytes as a
  quantity, so one label value is the byte range `[v Mi, v+1 Mi)`.
* `gpu.family` is derived from the compute capability, not from NVML's
  architecture name (an Ada Lovelace L4, 8.9, was "ampere" before GFD learned
  "ada-lovelace"), so it becomes a compute-capability range.
* Driver and CUDA versions are split into parts (`cuda.driver.rev` keeps the
  leading zero of "06"); we publish semver attributes (580.65.6).

`migrate`, `docs/migration.md` and `docs/deviceclasses.md` (`markdown_table`)
and the tests read this table; nothing else lists the labels.

Size: a data table of labels with its translators, kept as the one source of the docs' table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.cel.semver import Semver, SemverError
from dracommon.drivername import DEFAULT_DRIVER_NAME

ATTRIBUTES = f'device.attributes["{DEFAULT_DRIVER_NAME}"]'
CAPACITY = f'device.capacity["{DEFAULT_DRIVER_NAME}"]'
GFD_PREFIX = "nvidia.com/"

# Node selector operators (core/v1 NodeSelectorRequirement); "=" is a nodeSelector entry.
EQUALS = "="
ORDERED_OPERATORS = ("Gt", "Lt")

_MIG_SUFFIX = "-MIG-"
_SHARED_SUFFIX = "-SHARED"


class LabelError(ValueError):
    """A GFD label requirement with no device equivalent; the message says why."""


@dataclass(frozen=True, slots=True)
class DeviceTerm:
    """One label requirement as a CEL expression over a device of this driver."""

    cel: str
    # Only MIG devices can match (a `<product>-MIG-<profile>` product): request from the MIG class.
    mig: bool = False
    # Something the report must say besides "translated" (a dropped suffix, an always-true term).
    note: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One GFD label (or a family of labels) and its device equivalent, if any."""

    label: str
    device: str  # the attribute or capacity it becomes, in words for the docs; "" when none
    encoding: str  # how the label value relates to the device value (docs)
    example: str  # a value GFD writes, for the docs and the tests
    equals: Callable[[str], DeviceTerm] | None = None
    # Gt/Lt against an integer label value: (operator, number) -> CEL.
    ordered: Callable[[str, int], str] | None = None
    aliases: tuple[str, ...] = ()  # GFD's newer names for the same label
    why_not: str = ""  # for rows without a device equivalent: why they stay node selection

    @property
    def translatable(self) -> bool:
        return self.equals is not None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.label, *self.aliases)


def _quote(text: str) -> str:
    """A CEL string literal (JSON escapes are CEL escapes for these characters)."""
    return json.dumps(text)


def _integer(value: str, what: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", value.strip()):
        raise LabelError(f"{what} value {value!r} is not an integer")
    return int(value)


def _compare(lhs: str, op: str, rhs: str) -> str:
    return f"{lhs}.compareTo({rhs}) {op} 0"


# ----- gpu.product -------------------------------------------------------------------------------


def _product(value: str) -> DeviceTerm:
    if not value:
        raise LabelError("an empty product matches no GPU")
    note = ""
    if value.endswith(_SHARED_SUFFIX):
        value = value[: -len(_SHARED_SUFFIX)]
        note = (
            "the -SHARED suffix (device-plugin time-slicing) was dropped: with claims, sharing is the "
            "claim's config (see docs/deviceclasses.md), not a property of the node"
        )
    model, mig, profile = value.rpartition(_MIG_SUFFIX)
    if mig and model and profile:
        cel = (
            f'{ATTRIBUTES}.productName.replace(" ", "-") == {_quote(model)}'
            f' && {ATTRIBUTES}.type == "mig" && {ATTRIBUTES}.profile == {_quote(profile)}'
        )
        return DeviceTerm(cel, mig=True, note=note)
    return DeviceTerm(f'{ATTRIBUTES}.productName.replace(" ", "-") == {_quote(value)}', note=note)


# ----- gpu.memory (MiB, rounded down) -----------------------------------------------------------


def _mib(n: int) -> str:
    return f'quantity("{max(n, 0)}Mi")'


def _memory(value: str) -> DeviceTerm:
    mib = _integer(value, "memory (MiB)")
    memory = f"{CAPACITY}.memory"
    return DeviceTerm(f"{_compare(memory, '>=', _mib(mib))} && {_compare(memory, '<', _mib(mib + 1))}")


def _memory_ordered(op: str, mib: int) -> str:
    memory = f"{CAPACITY}.memory"
    # label > n  <=>  floor(bytes / MiB) > n  <=>  bytes >= (n+1) MiB; label < n <=> bytes < n MiB.
    return _compare(memory, ">=", _mib(mib + 1)) if op == "Gt" else _compare(memory, "<", _mib(mib))


# ----- gpu.family (from the compute capability) ------------------------------------------------

# GFD's getArchFamily: family -> [lowest, highest) compute capability.
FAMILIES: dict[str, tuple[str, str]] = {
    "tesla": ("1.0.0", "2.0.0"),
    "fermi": ("2.0.0", "3.0.0"),
    "kepler": ("3.0.0", "4.0.0"),
    "maxwell": ("5.0.0", "6.0.0"),
    "pascal": ("6.0.0", "7.0.0"),
    "volta": ("7.0.0", "7.5.0"),
    "turing": ("7.5.0", "8.0.0"),
    "ampere": ("8.0.0", "8.9.0"),
    "ada-lovelace": ("8.9.0", "9.0.0"),
    "hopper": ("9.0.0", "10.0.0"),
}


def _family(value: str) -> DeviceTerm:
    if value not in FAMILIES:
        raise LabelError(
            f"GPU family {value!r} is not one GFD derives from a compute capability "
            f"({', '.join(FAMILIES)}); no device attribute says it"
        )
    low, high = FAMILIES[value]
    cc = f"{ATTRIBUTES}.cudaComputeCapability"
    return DeviceTerm(
        f"{_compare(cc, '>=', f'semver({_quote(low)})')} && {_compare(cc, '<', f'semver({_quote(high)})')}"
    )


# ----- versions: one part, or the whole version -------------------------------------------------


def _version_part(
    attribute: str, part: str, what: str
) -> tuple[Callable[[str], DeviceTerm], Callable[[str, int], str]]:
    def equals(value: str) -> DeviceTerm:
        # GFD writes "" for the revision of a two-part driver version; we publish it as .0.
        number = 0 if value == "" and part == "patch" else _integer(value, what)
        return DeviceTerm(f"{ATTRIBUTES}.{attribute}.{part}() == {number}")

    def ordered(op: str, number: int) -> str:
        return f"{ATTRIBUTES}.{attribute}.{part}() {'>' if op == 'Gt' else '<'} {number}"

    return equals, ordered


def _full_version(attribute: str, what: str) -> Callable[[str], DeviceTerm]:
    def equals(value: str) -> DeviceTerm:
        try:
            version = Semver.parse(value, normalize=True)
        except SemverError as err:
            raise LabelError(f"{what} value {value!r} is not a version: {err}") from None
        return DeviceTerm(
            _compare(f"{ATTRIBUTES}.{attribute}", "==", f"semver({_quote(version.canonical())})")
        )

    return equals


def _row_version_part(label: str, aliases: tuple[str, ...], attribute: str, part: str, example: str) -> Row:
    equals, ordered = _version_part(attribute, part, label)
    return Row(
        label,
        f"`{attribute}` (version), {part}",
        f"one part of the version as a decimal; the attribute is semver (`.{part}()`)"
        + ("; GFD keeps leading zeros (06 = 6)" if part == "patch" else ""),
        example,
        equals,
        ordered,
        aliases,
    )


def _none(label: str, example: str, why: str) -> Row:
    return Row(label, "", "", example, why_not=why)


_NODE_FACT = "a fact about the node, not about one GPU; it stays in the pod's node selection"

ROWS: tuple[Row, ...] = (
    Row(
        "nvidia.com/gpu.product",
        "`productName` (string); MIG: also `type` and `profile`",
        "the product name with spaces as `-`; `<product>-MIG-<profile>` for a MIG device (`single` "
        "strategy, needs the MIG class); a `-SHARED` suffix is dropped",
        "NVIDIA-H100-80GB-HBM3",
        _product,
    ),
    Row(
        "nvidia.com/gpu.memory",
        "capacity `memory` (quantity, bytes)",
        "MiB, rounded down: value v is the range [v Mi, v+1 Mi); Gt/Lt compare the same way",
        "81559",
        _memory,
        _memory_ordered,
    ),
    Row(
        "nvidia.com/gpu.family",
        "`cudaComputeCapability` (version), as a range",
        "GFD derives the family from the compute capability ("
        + ", ".join(
            f"{name} {low.removesuffix('.0')}-{high.removesuffix('.0')}"
            for name, (low, high) in FAMILIES.items()
        )
        + "); not our `architecture`, which is NVML's name",
        "hopper",
        _family,
    ),
    _row_version_part("nvidia.com/gpu.compute.major", (), "cudaComputeCapability", "major", "9"),
    _row_version_part("nvidia.com/gpu.compute.minor", (), "cudaComputeCapability", "minor", "0"),
    _row_version_part(
        "nvidia.com/cuda.driver.major",
        ("nvidia.com/cuda.driver-version.major",),
        "driverVersion",
        "major",
        "580",
    ),
    _row_version_part(
        "nvidia.com/cuda.driver.minor",
        ("nvidia.com/cuda.driver-version.minor",),
        "driverVersion",
        "minor",
        "65",
    ),
    _row_version_part(
        "nvidia.com/cuda.driver.rev",
        ("nvidia.com/cuda.driver-version.revision",),
        "driverVersion",
        "patch",
        "06",
    ),
    Row(
        "nvidia.com/cuda.driver-version.full",
        "`driverVersion` (version)",
        "the whole driver version; leading zeros dropped (580.65.06 = 580.65.6)",
        "580.65.06",
        _full_version("driverVersion", "nvidia.com/cuda.driver-version.full"),
    ),
    _row_version_part(
        "nvidia.com/cuda.runtime.major",
        ("nvidia.com/cuda.runtime-version.major",),
        "cudaDriverVersion",
        "major",
        "13",
    ),
    _row_version_part(
        "nvidia.com/cuda.runtime.minor",
        ("nvidia.com/cuda.runtime-version.minor",),
        "cudaDriverVersion",
        "minor",
        "0",
    ),
    Row(
        "nvidia.com/cuda.runtime-version.full",
        "`cudaDriverVersion` (version)",
        "the CUDA version the driver supports (NVML's CUDA driver version, which GFD calls runtime)",
        "13.0",
        _full_version("cudaDriverVersion", "nvidia.com/cuda.runtime-version.full"),
    ),
    _none(
        "nvidia.com/gpu.count",
        "8",
        f"how many GPUs the node has: {_NODE_FACT}; the claim's `count` asks for GPUs",
    ),
    _none(
        "nvidia.com/mig.strategy",
        "mixed",
        f"how the device plugin exposes MIG: {_NODE_FACT}; with claims the DeviceClass chooses "
        "(MIG class or not)",
    ),
    _none("nvidia.com/mig.capable", "true", f"whether any GPU of the node can do MIG: {_NODE_FACT}"),
    _none("nvidia.com/mig.config", "all-1g.10gb", f"the MIG manager's layout: {_NODE_FACT}"),
    _none(
        "nvidia.com/mig-<profile>.*",
        "nvidia.com/mig-1g.10gb.count=7",
        f"the node's MIG devices of one profile (`mixed` strategy): {_NODE_FACT}; the resource "
        "`nvidia.com/mig-<profile>` itself becomes a request for that profile",
    ),
    _none(
        "nvidia.com/gpu.replicas",
        "4",
        f"device-plugin sharing: {_NODE_FACT}; with claims, sharing is the claim's config",
    ),
    _none(
        "nvidia.com/gpu.sharing-strategy",
        "time-slicing",
        "device-plugin sharing; with claims, the claim's config",
    ),
    _none("nvidia.com/mps.capable", "true", "device-plugin MPS sharing; with claims, the claim's config"),
    _none("nvidia.com/gpu.mode", "compute", f"the PCI class of the node's GPUs: {_NODE_FACT}"),
    _none("nvidia.com/gpu.machine", "DGX-H100", f"the machine type: {_NODE_FACT}"),
    _none("nvidia.com/gpu.present", "true", f"set by the GPU operator: {_NODE_FACT}"),
)

_BY_KEY: dict[str, Row] = {key: row for row in ROWS for key in row.keys}
_MIG_RESOURCE_LABEL = re.compile(r"^nvidia\.com/mig-[^/]+\.[a-z.]+$")


def row_for(key: str) -> Row | None:
    """The table's row for a label key (a `mig-<profile>.*` key matches its pattern row)."""
    row = _BY_KEY.get(key)
    if row is None and _MIG_RESOURCE_LABEL.match(key):
        row = _BY_KEY["nvidia.com/mig-<profile>.*"]
    return row


def is_gfd_label(key: str) -> bool:
    """Labels in NVIDIA's namespace: those GFD (and the GPU operator) write."""
    return key.startswith(GFD_PREFIX)


def translate(key: str, operator: str, values: Sequence[str]) -> DeviceTerm | None:
    """One node-selector requirement on a GFD label as a device term.

    None when the requirement holds for every device of this driver (Exists on a label every GPU
    has), so it can simply go. LabelError when the label or this use of it has no device equivalent.
    """
    row = row_for(key)
    if row is None:
        raise LabelError(f"{key} is not a GPU Feature Discovery label that migrate knows")
    if row.equals is None:
        raise LabelError(f"{key} has no device equivalent: {row.why_not}")
    if operator == "Exists":
        return None
    if operator == "DoesNotExist":
        raise LabelError(f"{key} DoesNotExist selects nodes without GPUs that GFD saw; no device matches it")
    if operator in ORDERED_OPERATORS:
        if row.ordered is None or len(values) != 1:
            raise LabelError(f"{key} {operator} {list(values)}: only an integer label can be compared")
        number = _integer(values[0], key)
        return DeviceTerm(row.ordered(operator, number))
    if operator in (EQUALS, "In", "NotIn"):
        if not values:
            raise LabelError(f"{key} {operator} needs at least one value")
        terms = [row.equals(value) for value in values]
        mig = {term.mig for term in terms}
        if len(mig) > 1:
            raise LabelError(
                f"{key} {operator} {list(values)} mixes MIG and whole-GPU products; split the workload"
            )
        cel = terms[0].cel if len(terms) == 1 else " || ".join(f"({term.cel})" for term in terms)
        note = "; ".join(sorted({term.note for term in terms if term.note}))
        if operator == "NotIn":
            return DeviceTerm(f"!({cel})", note=note)
        return DeviceTerm(cel, mig=mig.pop(), note=note)
    raise LabelError(f"{key}: {operator!r} is not a node selector operator")


def markdown_table() -> str:
    """The table for the docs: every row, translatable or not (generated; do not edit the copy)."""
    lines = [
        "| GFD label | device attribute | encoding / why it stays node selection | example "
        "| CEL for the example |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in ROWS:
        label = " ".join(f"`{key}`" for key in row.keys).replace(" `", ", `")
        if row.equals is not None:
            cel = f"`{row.equals(row.example).cel}`".replace("|", "\\|")
            lines.append(f"| {label} | {row.device} | {row.encoding} | `{row.example}` | {cel} |")
        else:
            lines.append(f"| {label} | none (kept) | {row.why_not} | `{row.example}` | |")
    return "\n".join(lines) + "\n"


TABLE_BEGIN = "<!-- gfd-table:begin (generated: python -m controller.migrate.gfd docs/migration.md) -->"
TABLE_END = "<!-- gfd-table:end -->"


def with_current_table(text: str) -> str:
    """`text` with the generated table between its markers replaced by the current one."""
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError(f"no {TABLE_BEGIN} ... {TABLE_END} markers")
    return text[: begin + len(TABLE_BEGIN)] + "\n" + markdown_table() + text[end:]


def main(paths: Sequence[str]) -> int:
    """Rewrite the table in each Markdown file named (the docs test fails while one is stale)."""
    from pathlib import Path

    for path in paths:
        file = Path(path)
        file.write_text(with_current_table(file.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


__all__ = [
    "ATTRIBUTES",
    "CAPACITY",
    "EQUALS",
    "FAMILIES",
    "ROWS",
    "DeviceTerm",
    "LabelError",
    "Row",
    "is_gfd_label",
    "markdown_table",
    "row_for",
    "translate",
    "with_current_table",
]

if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
