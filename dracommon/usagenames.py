"""The usage metrics' names, types, labels and help: the one source of truth.

The exporter builds its series from these constants, `dra-controller top` and
the Grafana dashboard read them, and `docs/metrics.md` is generated from them
(`python -m draplugin.usage.docs`). It lives in dracommon because the node
plugin exports these series and the controller reads them. The names are an
API: they never change across releases; new metrics may be added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

MetricType = Literal["gauge", "counter", "histogram", "summary"]

# Labels of every per-device series: the ResourceSlice device name, the GPU or MIG UUID and the model.
NODE: Final = "node"
DEVICE: Final = "device"
UUID: Final = "uuid"
MODEL: Final = "model"
DEVICE_LABELS: Final = (NODE, DEVICE, UUID, MODEL)

# Labels of a holder: the claim and, where known, the pod and container whose processes use the device.
NAMESPACE: Final = "namespace"
CLAIM: Final = "claim"
POD: Final = "pod"
CONTAINER: Final = "container"
HOLDER_LABELS: Final = (NAMESPACE, CLAIM, POD, CONTAINER)
CLAIM_LABELS: Final = (NODE, NAMESPACE, CLAIM)


@dataclass(frozen=True, slots=True)
class MetricName:
    """One metric: its full name (without a counter's `_total`, as prometheus_client wants it)."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str

    @property
    def exposed(self) -> str:
        """The name as scraped: counters carry `_total`."""
        return f"{self.name}_total" if self.type == "counter" else self.name


DEVICE_GPU_UTILIZATION = MetricName(
    "draplugin_device_gpu_utilization_ratio",
    "gauge",
    DEVICE_LABELS,
    "Fraction of the last sample period during which one or more kernels ran on the device, 0..1 "
    "(NVML's utilization.gpu, as DCGM_FI_DEV_GPU_UTIL; not how many SMs were busy).",
)
DEVICE_MEMORY_UTILIZATION = MetricName(
    "draplugin_device_memory_utilization_ratio",
    "gauge",
    DEVICE_LABELS,
    "Fraction of the last sample period during which device memory was read or written, 0..1 "
    "(NVML's utilization.memory, as DCGM_FI_DEV_MEM_COPY_UTIL).",
)
DEVICE_MEMORY_USED = MetricName(
    "draplugin_device_memory_used_bytes",
    "gauge",
    DEVICE_LABELS,
    "Framebuffer memory in use on the device (a MIG device: its own instance).",
)
DEVICE_MEMORY_TOTAL = MetricName(
    "draplugin_device_memory_total_bytes",
    "gauge",
    DEVICE_LABELS,
    "Framebuffer memory size of the device (a MIG device: its own instance).",
)
DEVICE_POWER = MetricName("draplugin_device_power_watts", "gauge", DEVICE_LABELS, "Power draw of the GPU.")
DEVICE_TEMPERATURE = MetricName(
    "draplugin_device_temperature_celsius", "gauge", DEVICE_LABELS, "GPU core temperature."
)
DEVICE_ECC_ERRORS = MetricName(
    "draplugin_device_ecc_errors",
    "counter",
    (*DEVICE_LABELS, "type"),
    "Volatile ECC error count since the driver loaded, by type (corrected, uncorrected).",
)
DEVICE_XID_ERRORS = MetricName(
    "draplugin_device_xid_errors",
    "counter",
    (*DEVICE_LABELS, "xid"),
    "XID error events seen by this plugin process, by XID.",
)
DEVICE_THROTTLE = MetricName(
    "draplugin_device_clock_throttle_active",
    "gauge",
    (*DEVICE_LABELS, "reason"),
    "1 while the GPU's clocks are held down for this reason (NVML clock event reasons), else 0.",
)
CLAIM_GPU_UTILIZATION = MetricName(
    "draplugin_claim_gpu_utilization_ratio",
    "gauge",
    (*DEVICE_LABELS, *HOLDER_LABELS),
    "The holder's share of the device's utilization (time a kernel ran), 0..1 "
    "(an exclusive claim: the device's).",
)
CLAIM_MEMORY_USED = MetricName(
    "draplugin_claim_memory_used_bytes",
    "gauge",
    (*DEVICE_LABELS, *HOLDER_LABELS),
    "Framebuffer memory used by the holder's processes on the device.",
)
CLAIM_IDLE_SECONDS = MetricName(
    "draplugin_claim_idle_seconds",
    "gauge",
    CLAIM_LABELS,
    "How long all of the claim's devices have been below the idle threshold (0 when busy).",
)
CLAIM_IDLE = MetricName(
    "draplugin_claim_idle",
    "gauge",
    CLAIM_LABELS,
    "1 when the claim has been idle for at least the idle duration, else 0.",
)
DEVICE_UNATTRIBUTED_GPU_UTILIZATION = MetricName(
    "draplugin_device_unattributed_gpu_utilization_ratio",
    "gauge",
    DEVICE_LABELS,
    "Utilization (time a kernel ran) of processes on the device that could not be mapped to a pod "
    "of a holder, 0..1.",
)
DEVICE_UNATTRIBUTED_MEMORY_USED = MetricName(
    "draplugin_device_unattributed_memory_used_bytes",
    "gauge",
    DEVICE_LABELS,
    "Framebuffer memory of processes on the device that could not be mapped to a pod of a holder.",
)
SAMPLE_DURATION = MetricName(
    "draplugin_usage_sample_duration_seconds",
    "histogram",
    (),
    "Wall time of one sampling pass over all devices.",
)
SAMPLE_ERRORS = MetricName(
    "draplugin_usage_sample_errors",
    "counter",
    (DEVICE, "reason"),
    "NVML calls that failed or timed out, by device and reason.",
)

# Every usage metric, in the order the docs list them.
USAGE_METRICS: Final = (
    DEVICE_GPU_UTILIZATION,
    DEVICE_MEMORY_UTILIZATION,
    DEVICE_MEMORY_USED,
    DEVICE_MEMORY_TOTAL,
    DEVICE_POWER,
    DEVICE_TEMPERATURE,
    DEVICE_ECC_ERRORS,
    DEVICE_XID_ERRORS,
    DEVICE_THROTTLE,
    CLAIM_GPU_UTILIZATION,
    CLAIM_MEMORY_USED,
    CLAIM_IDLE_SECONDS,
    CLAIM_IDLE,
    DEVICE_UNATTRIBUTED_GPU_UTILIZATION,
    DEVICE_UNATTRIBUTED_MEMORY_USED,
    SAMPLE_DURATION,
    SAMPLE_ERRORS,
)

# Wall-time buckets of one pass: well under 10 ms per device normally; the tail shows a hung device.
SAMPLE_DURATION_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# The reason label of sample errors that are not NVML return codes.
REASON_TIMEOUT: Final = "Timeout"
REASON_BUSY: Final = "StillHung"
