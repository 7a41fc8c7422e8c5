"""The Helm chart, live, for the tests: devcluster/chart.py is the one implementation.

The tests install the chart exactly as `make demo` and `make cluster` do
(devcluster.chart: the fake-GPU values, the node's paths, our image imported
into the node's containerd, host networking); this module only names what the
tests use. Helm, our image and the containerd node fail the tests with the
command that provides them (MissingBinariesError, ImageError, ChartError);
they never skip.
"""

from __future__ import annotations

from devcluster.chart import (
    CHART,
    FAKE_GPU_VALUES,
    ChartError,
    ChartRelease,
    HelmError,
    deep_merge,
    import_our_image,
    installed,
    is_ready,
    live_values,
    run_helm,
)

__all__ = [
    "CHART",
    "FAKE_GPU_VALUES",
    "ChartError",
    "ChartRelease",
    "HelmError",
    "deep_merge",
    "import_our_image",
    "installed",
    "is_ready",
    "live_values",
    "run_helm",
]
