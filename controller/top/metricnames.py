"""The node plugin's usage metric and label names that `top` reads.

They are the plugin's usage metrics contract (docs/metrics.md; the plugin defines them in
draplugin/usage/names.py). The controller may not import the node plugin's package, so the
names it consumes are repeated here, and tests/unit/test_top_names.py fails when the two
drift apart.
"""

from __future__ import annotations

from typing import Final

DEVICE_GPU_UTILIZATION: Final = "draplugin_device_gpu_utilization_ratio"
DEVICE_MEMORY_USED: Final = "draplugin_device_memory_used_bytes"
DEVICE_MEMORY_TOTAL: Final = "draplugin_device_memory_total_bytes"
CLAIM_GPU_UTILIZATION: Final = "draplugin_claim_gpu_utilization_ratio"
CLAIM_MEMORY_USED: Final = "draplugin_claim_memory_used_bytes"
CLAIM_IDLE_SECONDS: Final = "draplugin_claim_idle_seconds"
CLAIM_IDLE: Final = "draplugin_claim_idle"

# Labels of every device series, of every holder (claim) series, and of the per-claim idle series.
DEVICE_LABELS: Final = ("node", "device", "uuid", "model")
HOLDER_LABELS: Final = ("namespace", "claim", "pod", "container")
CLAIM_LABELS: Final = ("node", "namespace", "claim")

# Every usage series `top` reads, and the labels each carries.
CONSUMED: Final[dict[str, tuple[str, ...]]] = {
    DEVICE_GPU_UTILIZATION: DEVICE_LABELS,
    DEVICE_MEMORY_USED: DEVICE_LABELS,
    DEVICE_MEMORY_TOTAL: DEVICE_LABELS,
    CLAIM_GPU_UTILIZATION: DEVICE_LABELS + HOLDER_LABELS,
    CLAIM_MEMORY_USED: DEVICE_LABELS + HOLDER_LABELS,
    CLAIM_IDLE_SECONDS: CLAIM_LABELS,
    CLAIM_IDLE: CLAIM_LABELS,
}
