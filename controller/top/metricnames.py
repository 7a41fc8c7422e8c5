"""The node plugin's usage series that `top` reads, as scraped names with their labels.

They come from the one definition of the usage metrics contract, dracommon/usagenames.py,
which the plugin's exporter uses too, so the two sides cannot drift apart.
"""

from __future__ import annotations

from typing import Final

from dracommon import usagenames

DEVICE_GPU_UTILIZATION: Final = usagenames.DEVICE_GPU_UTILIZATION.exposed
DEVICE_MEMORY_USED: Final = usagenames.DEVICE_MEMORY_USED.exposed
DEVICE_MEMORY_TOTAL: Final = usagenames.DEVICE_MEMORY_TOTAL.exposed
CLAIM_GPU_UTILIZATION: Final = usagenames.CLAIM_GPU_UTILIZATION.exposed
CLAIM_MEMORY_USED: Final = usagenames.CLAIM_MEMORY_USED.exposed
CLAIM_IDLE_SECONDS: Final = usagenames.CLAIM_IDLE_SECONDS.exposed
CLAIM_IDLE: Final = usagenames.CLAIM_IDLE.exposed

DEVICE_LABELS: Final = usagenames.DEVICE_LABELS
HOLDER_LABELS: Final = usagenames.HOLDER_LABELS
CLAIM_LABELS: Final = usagenames.CLAIM_LABELS

# Every usage series `top` reads, and the labels each carries.
CONSUMED: Final[dict[str, tuple[str, ...]]] = {
    metric.exposed: metric.labels
    for metric in (
        usagenames.DEVICE_GPU_UTILIZATION,
        usagenames.DEVICE_MEMORY_USED,
        usagenames.DEVICE_MEMORY_TOTAL,
        usagenames.CLAIM_GPU_UTILIZATION,
        usagenames.CLAIM_MEMORY_USED,
        usagenames.CLAIM_IDLE_SECONDS,
        usagenames.CLAIM_IDLE,
    )
}
