"""The usage metric names `dra-controller top` reads are the ones the node plugin defines.

The controller may not import the node plugin, so controller/top/metricnames.py repeats the names
it consumes; this fails when a name or a label set there drifts from draplugin/usage/names.py.
"""

from __future__ import annotations

from controller.top import metricnames
from draplugin.usage import names


def test_every_series_top_reads_is_exported_by_the_plugin_with_the_same_labels() -> None:
    exported = {m.exposed: m.labels for m in names.USAGE_METRICS}
    for metric, labels in metricnames.CONSUMED.items():
        assert metric in exported, f"{metric}: the plugin exports no such metric"
        assert labels == exported[metric], (
            f"{metric}: top expects labels {labels}, the plugin has {exported[metric]}"
        )


def test_label_groups_match() -> None:
    assert metricnames.DEVICE_LABELS == names.DEVICE_LABELS
    assert metricnames.HOLDER_LABELS == names.HOLDER_LABELS
    assert metricnames.CLAIM_LABELS == names.CLAIM_LABELS
