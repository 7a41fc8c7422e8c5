"""The device model: what discovery produces and how it renders to `resource.k8s.io/v1`.

Backends (NVML, fake) build `Device` values; the slice publisher renders them
with `Device.to_api()`. Validation mirrors the API server's ResourceSlice
limits so a bad device is reported here, naming the device and the field,
instead of as a rejected write that would take the whole slice down with it.

Size: each field of the device shape sits next to the API server limit it is checked against.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from dracommon.kubenames import dns_label_problem, dns_subdomain_problem
from dracommon.quantity import Quantity

# --- Limits from resource.k8s.io/v1 validation (Kubernetes 1.34 floor) -------------------------------

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_STRING_LENGTH = 64
MAX_VERSION_LENGTH = 64
MAX_ID_LENGTH = 32
MAX_DOMAIN_LENGTH = 63
# 1.34 allows 4 taints per device (16 from 1.35); keep to the floor so every server accepts us.
MAX_TAINTS_PER_DEVICE = 4
# 1.35+: at most 2 consumesCounters entries per device, 32 counters each.
MAX_CONSUMES_COUNTERS = 2
MAX_COUNTERS_PER_SET = 32
MAX_LABEL_VALUE = 63

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

STANDARD_DOMAIN = "resource.kubernetes.io"

# Each ends in \Z, not $: `$` also matches before a final newline, which the API server's (Go)
# patterns refuse, so "gpu-0\n" would pass here and fail the slice's write. DNS names are
# dracommon.kubenames' rules.
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
# semver.org 2.0.0, as the API server checks version attributes.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?\Z"
)
# Kubernetes resource.Quantity serialization: sign, number, optional suffix or exponent.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?\Z")

TaintEffect = Literal["None", "NoSchedule", "NoExecute"]
TAINT_EFFECTS: tuple[str, ...] = ("None", "NoSchedule", "NoExecute")


class DeviceValidationError(ValueError):
    """A device would be rejected by the API server; names the device and the offending field."""

    def __init__(self, device: str, field_path: str, problem: str) -> None:
        super().__init__(f"device {device!r}: {field_path}: {problem}")
        self.device = device
        self.field_path = field_path
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version attribute value (rendered as `{"version": ...}`, compared with CEL semver)."""

    value: str

    @classmethod
    def coerce(cls, text: str) -> Version:
        """Turn vendor version strings into semver: "580.65.06" → 580.65.6, "9.0" → 9.0.0.

        Vendor tools print leading zeros and two-part versions that strict
        semver rejects; dropping the zeros and padding keeps ordering intact.
        """
        core, sep, rest = text.strip().partition("-")
        parts = core.split(".")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"not a numeric version: {text!r}")
        numbers = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
        return cls(".".join(numbers) + (sep + rest if sep else ""))

    def __str__(self) -> str:
        return self.value


AttributeValue = int | bool | str | Version


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A taint published on a device in its ResourceSlice (`spec.devices[].taints[]`)."""

    key: str
    effect: TaintEffect
    value: str = ""
    # RFC 3339 time; None lets the API server set it on first write.
    time_added: str | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added is not None:
            out["timeAdded"] = self.time_added
        return out


def _quantities(values: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Counters and capacity as the API writes them: each quantity under `value`, keys sorted."""
    return {key: {"value": value} for key, value in sorted(values.items())}


@dataclass(frozen=True, slots=True)
class CounterSet:
    """A shared counter set (`spec.sharedCounters[]`) that partitionable devices draw from."""

    name: str
    counters: Mapping[str, str] = field(hash=False)

    def to_api(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "counters": _quantities(self.counters),
        }

    def validate(self) -> None:
        where = f"counter set {self.name!r}"
        if not _is_dns_label(self.name):
            raise DeviceValidationError(
                where, "name", "must be a DNS label (lowercase alphanumerics and '-')"
            )
        if not self.counters:
            raise DeviceValidationError(where, "counters", "must not be empty")
        if len(self.counters) > MAX_COUNTERS_PER_SET:
            raise DeviceValidationError(
                where, "counters", f"{len(self.counters)} counters, at most {MAX_COUNTERS_PER_SET} allowed"
            )
        for key, value in self.counters.items():
            _check_counter(where, f"counters[{key}]", key, value)


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """What one device takes from a counter set (`spec.devices[].consumesCounters[]`)."""

    counter_set: str
    counters: Mapping[str, str] = field(hash=False)

    def to_api(self) -> dict[str, Any]:
        return {
            "counterSet": self.counter_set,
            "counters": _quantities(self.counters),
        }


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """`capacity.<name>.requestPolicy` of a device that several claims may share (KEP-5075).

    What one allocation takes from the capacity: `default` when the request
    names no amount, else the requested amount rounded up to `min + n * step`
    (at least `min`, at most `max` when set). Quantity strings, as the API
    writes them.
    """

    default: str
    min: str
    max: str | None = None
    step: str | None = None

    def to_api(self) -> dict[str, Any]:
        valid_range: dict[str, str] = {"min": self.min}
        if self.max is not None:
            valid_range["max"] = self.max
        if self.step is not None:
            valid_range["step"] = self.step
        return {"default": self.default, "validRange": valid_range}

    def validate(self, device: str, path: str, capacity: str) -> None:
        """The API server's rules for a validRange policy (`validateRequestPolicyRange`, 1.37)."""
        values: dict[str, int] = {}
        for name, text in (
            ("default", self.default),
            ("min", self.min),
            ("max", self.max),
            ("step", self.step),
        ):
            if text is None:
                continue
            where = f"{path}.{name}" if name == "default" else f"{path}.validRange.{name}"
            if not isinstance(text, str) or not _QUANTITY.match(text):
                raise DeviceValidationError(device, where, f"{text!r} is not a Kubernetes quantity")
            quantity = Quantity.parse(text)
            if not quantity.is_integer() or quantity.sign() < 0 or quantity.compare_int(INT64_MAX) > 0:
                raise DeviceValidationError(device, where, f"{text!r} must be a whole number in int64")
            values[name] = quantity.value()
        total = Quantity.parse(capacity).value()
        low, default, high, step = values["min"], values["default"], values.get("max"), values.get("step")
        problems = [
            (low > total, "validRange.min", f"min is larger than capacity value {capacity}"),
            (default < low, "default", f"default is less than min {self.min}"),
            (high is not None and high < low, "validRange.max", f"max is less than min {self.min}"),
            (
                high is not None and high > total,
                "validRange.max",
                f"max is larger than capacity value {capacity}",
            ),
            (high is not None and default > high, "default", f"default is more than max {self.max}"),
            (step is not None and step <= 0, "validRange.step", "must be greater than zero"),
        ]
        if step is not None and step > 0:
            problems += [
                (
                    low + step > total,
                    "validRange.step",
                    f"one step above min is larger than capacity {capacity}",
                ),
                ((default - low) % step != 0, "default", f"not min plus a multiple of step {self.step}"),
                (
                    high is not None and (high - low) % step != 0,
                    "validRange.max",
                    "not min plus a multiple of step",
                ),
            ]
        for failed, name, problem in problems:
            if failed:
                raise DeviceValidationError(device, f"{path}.{name}", problem)


@dataclass(frozen=True, slots=True)
class Device:
    """One allocatable device on this node: a full GPU or a MIG device.

    `attributes` keys without a domain belong to the driver's domain (the API
    server and CEL treat them that way); standard ones carry
    `resource.kubernetes.io/`. `capacity` values are Kubernetes quantity strings.
    `device_nodes` are the character devices a container needs for this device,
    at their paths inside the container; `host_dev_dir`, when set, is the host
    directory that holds them instead of /dev (`/dev/nvidia0` is
    `<host_dev_dir>/nvidia0`): the fake backend's own device nodes.
    """

    name: str
    kind: str
    uuid: str
    index: int
    minor: int
    parent_uuid: str | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict, hash=False)
    capacity: Mapping[str, str] = field(default_factory=dict, hash=False)
    device_nodes: tuple[str, ...] = ()
    host_dev_dir: str | None = None
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    # Consumable capacity (KEP-5075): several claims may hold the device at once, each taking
    # part of the capacities that have a policy here (`draplugin.devices.shared`).
    allow_multiple_allocations: bool = False
    capacity_policies: Mapping[str, CapacityPolicy] = field(default_factory=dict, hash=False)

    @property
    def needs_small_slice(self) -> bool:
        """Taints and counters lower the per-slice device limit from 128 to 64."""
        return bool(self.taints or self.consumes_counters)

    def to_api(self) -> dict[str, Any]:
        """Render as a `resource.k8s.io/v1` Device (JSON-ready dict, keys in a stable order)."""
        out: dict[str, Any] = {"name": self.name}
        if self.attributes:
            out["attributes"] = {
                key: _render_attribute(value) for key, value in sorted(self.attributes.items())
            }
        if self.capacity:
            capacity: dict[str, dict[str, Any]] = dict(_quantities(self.capacity))
            for key, policy in self.capacity_policies.items():
                capacity[key] = {**capacity[key], "requestPolicy": policy.to_api()}
            out["capacity"] = capacity
        if self.allow_multiple_allocations:
            out["allowMultipleAllocations"] = True
        if self.consumes_counters:
            out["consumesCounters"] = [c.to_api() for c in self.consumes_counters]
        if self.taints:
            out["taints"] = [t.to_api() for t in self.taints]
        return out

    def validate(self) -> None:
        """Raise `DeviceValidationError` for anything the API server would reject."""
        if not _is_dns_label(self.name):
            raise DeviceValidationError(
                self.name, "name", "must be a DNS label (≤63 lowercase alphanumerics and '-')"
            )
        total = len(self.attributes) + len(self.capacity)
        if total > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise DeviceValidationError(
                self.name,
                "attributes+capacity",
                f"{total} entries, at most {MAX_ATTRIBUTES_AND_CAPACITIES} allowed",
            )
        for key, value in self.attributes.items():
            path = f"attributes[{key}]"
            _check_qualified_name(self.name, path, key)
            _check_attribute_value(self.name, path, value)
        for key, quantity in self.capacity.items():
            path = f"capacity[{key}]"
            _check_qualified_name(self.name, path, key)
            if not isinstance(quantity, str) or not _QUANTITY.match(quantity):
                raise DeviceValidationError(self.name, path, f"{quantity!r} is not a Kubernetes quantity")
        for key, policy in self.capacity_policies.items():
            path = f"capacity[{key}].requestPolicy"
            if not self.allow_multiple_allocations:
                raise DeviceValidationError(self.name, path, "allowMultipleAllocations must be true")
            if key not in self.capacity:
                raise DeviceValidationError(self.name, path, "the device has no such capacity")
            policy.validate(self.name, path, self.capacity[key])
        if len(self.consumes_counters) > MAX_CONSUMES_COUNTERS:
            raise DeviceValidationError(
                self.name,
                "consumesCounters",
                f"{len(self.consumes_counters)} entries, at most {MAX_CONSUMES_COUNTERS} allowed",
            )
        for i, consumption in enumerate(self.consumes_counters):
            path = f"consumesCounters[{i}]"
            if not _is_dns_label(consumption.counter_set):
                raise DeviceValidationError(self.name, f"{path}.counterSet", "must be a DNS label")
            if len(consumption.counters) > MAX_COUNTERS_PER_SET:
                raise DeviceValidationError(
                    self.name, f"{path}.counters", f"at most {MAX_COUNTERS_PER_SET} counters allowed"
                )
            for key, value in consumption.counters.items():
                _check_counter(self.name, f"{path}.counters[{key}]", key, value)
        if len(self.taints) > MAX_TAINTS_PER_DEVICE:
            raise DeviceValidationError(
                self.name, "taints", f"{len(self.taints)} taints, at most {MAX_TAINTS_PER_DEVICE} allowed"
            )
        for i, taint in enumerate(self.taints):
            _check_taint(self.name, f"taints[{i}]", taint)


@runtime_checkable
class DeviceBackend(Protocol):
    """Where devices come from. `discover()` returns the same order for the same hardware."""

    @property
    def name(self) -> str:
        """Short backend name for logs and metrics ("nvml", "fake")."""
        ...

    def discover(self) -> list[Device]:
        """All devices on this node, in a stable order."""
        ...

    def shared_counters(self) -> list[CounterSet]:
        """Counter sets the devices consume from (empty unless partitionable MIG is on)."""
        ...


@runtime_checkable
class DriverVersionSource(Protocol):
    """A backend that knows the driver's own version string (NVML's `nvmlSystemGetDriverVersion`)."""

    def driver_version(self) -> str | None:
        """ "550.135", "580.95.05": as the driver's files are named; None before the first read."""
        ...


# --- helpers -----------------------------------------------------------------------------------------


def validate_devices(devices: Sequence[Device], counter_sets: Iterable[CounterSet] = ()) -> None:
    """Check each device, unique names in the pool and that counter references resolve."""
    sets = {s.name: s for s in counter_sets}
    for counter_set in sets.values():
        counter_set.validate()
    seen: set[str] = set()
    for device in devices:
        device.validate()
        if device.name in seen:
            raise DeviceValidationError(device.name, "name", "duplicate device name in the pool")
        seen.add(device.name)
        for i, consumption in enumerate(device.consumes_counters):
            known = sets.get(consumption.counter_set)
            if known is None:
                raise DeviceValidationError(
                    device.name,
                    f"consumesCounters[{i}].counterSet",
                    f"unknown counter set {consumption.counter_set!r}",
                )
            for key in consumption.counters:
                if key not in known.counters:
                    raise DeviceValidationError(
                        device.name,
                        f"consumesCounters[{i}].counters[{key}]",
                        f"counter not defined in set {known.name!r}",
                    )


def format_bytes(n: int) -> str:
    """Bytes as the API server's canonical binary quantity: the largest exact suffix (80Gi, 81559Mi)."""
    if n < 0:
        raise ValueError(f"negative byte count: {n}")
    if n == 0:
        return "0"
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n % (1 << power) == 0:
            return f"{n >> power}{suffix}"
    return str(n)


def dns_label_from(text: str) -> str:
    """Lower-case `text` and replace anything outside [a-z0-9-] so it can be part of a DNS label."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", label)


def _is_dns_label(text: str) -> bool:
    return dns_label_problem(text) is None


def _is_dns_subdomain(text: str) -> bool:
    return dns_subdomain_problem(text) is None


def _render_attribute(value: AttributeValue) -> dict[str, Any]:
    # bool before int: bool is a subclass of int in Python.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def _check_qualified_name(device: str, path: str, key: str) -> None:
    domain, sep, ident = key.rpartition("/")
    if sep and (not domain or len(domain) > MAX_DOMAIN_LENGTH or not _is_dns_subdomain(domain)):
        raise DeviceValidationError(
            device,
            path,
            f"domain {domain!r} must be a DNS subdomain of ≤{MAX_DOMAIN_LENGTH} characters",
        )
    if "/" in domain:
        raise DeviceValidationError(device, path, "a qualified name has at most one '/'")
    if not _C_IDENTIFIER.match(ident) or len(ident) > MAX_ID_LENGTH:
        raise DeviceValidationError(
            device, path, f"name {ident!r} must be a C identifier of at most {MAX_ID_LENGTH} characters"
        )


def _check_attribute_value(device: str, path: str, value: object) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise DeviceValidationError(device, path, f"{value} does not fit in int64")
        return
    if isinstance(value, Version):
        if len(value.value) > MAX_VERSION_LENGTH:
            raise DeviceValidationError(
                device,
                path,
                f"version is {len(value.value)} characters, at most {MAX_VERSION_LENGTH}",
            )
        if not _SEMVER.match(value.value):
            raise DeviceValidationError(
                device, path, f"{value.value!r} is not a semantic version (semver 2.0.0)"
            )
        return
    if isinstance(value, str):
        if len(value) > MAX_ATTRIBUTE_STRING_LENGTH:
            raise DeviceValidationError(
                device,
                path,
                f"string is {len(value)} characters, at most {MAX_ATTRIBUTE_STRING_LENGTH} allowed",
            )
        return
    raise DeviceValidationError(
        device, path, f"unsupported attribute type {type(value).__name__} (want int, bool, str or Version)"
    )


def _check_counter(device: str, path: str, key: str, value: str) -> None:
    if not _is_dns_label(key):
        raise DeviceValidationError(device, path, "counter name must be a DNS label")
    if not isinstance(value, str) or not _QUANTITY.match(value):
        raise DeviceValidationError(device, path, f"{value!r} is not a Kubernetes quantity")


def _check_taint(device: str, path: str, taint: DeviceTaint) -> None:
    prefix, sep, name = taint.key.rpartition("/")
    if (
        (sep and (not prefix or not _is_dns_subdomain(prefix)))
        or len(name) > MAX_LABEL_VALUE
        or not _LABEL_NAME.match(name)
    ):
        raise DeviceValidationError(device, f"{path}.key", f"{taint.key!r} is not a qualified label name")
    if len(taint.value) > MAX_LABEL_VALUE or not _LABEL_VALUE.match(taint.value):
        raise DeviceValidationError(device, f"{path}.value", f"{taint.value!r} is not a valid label value")
    if taint.effect not in TAINT_EFFECTS:
        raise DeviceValidationError(device, f"{path}.effect", f"must be one of {', '.join(TAINT_EFFECTS)}")
