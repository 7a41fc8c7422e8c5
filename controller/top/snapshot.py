"""One row per claimed device, from the text a node plugin's /metrics endpoint serves.

The exposition is parsed with prometheus_client's own text parser. A claim's row on a
device sums the claim's holder series (one per pod and container) on that device, bounded
by the device's own figure: several holder series of one claim never make the claim busier
than the device it runs on. Devices no claim holds get no row: `top` lists claimed GPUs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.top import metricnames as names


class ExpositionError(ValueError):
    """The text is not Prometheus text exposition; the message says where it breaks."""


@dataclass(frozen=True, slots=True)
class ClaimedDevice:
    """How busy one device is for one claim that holds it (ratios 0..1, sizes in bytes)."""

    node: str
    device: str
    namespace: str
    claim: str
    model: str = ""
    uuid: str = ""
    pods: tuple[str, ...] = ()
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    idle_seconds: float | None = None
    idle: bool = False
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "device": self.device,
            "uuid": self.uuid,
            "model": self.model,
            "namespace": self.namespace,
            "claim": self.claim,
            "pods": list(self.pods),
            "gpuUtilizationRatio": self.utilization,
            "memoryUsedBytes": self.memory_used_bytes,
            "memoryTotalBytes": self.memory_total_bytes,
            "idleSeconds": self.idle_seconds,
            "idle": self.idle,
            "source": self.source,
        }


@dataclass(slots=True)
class _Holding:
    """What one claim's holder series on one device add up to."""

    uuid: str = ""
    model: str = ""
    pods: set[str] = field(default_factory=set)
    utilization: float | None = None
    memory_used: float | None = None


def _number(value: float) -> float | None:
    """A sample's value, None for NaN (a gauge the plugin could not read this period)."""
    return None if math.isnan(value) else float(value)


def _add(total: float | None, value: float | None) -> float | None:
    if value is None:
        return total
    return value if total is None else total + value


def _bounded(value: float | None, bound: float | None) -> float | None:
    return value if value is None or bound is None else min(value, bound)


def parse_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the usage series `top` reads, by sample name: (labels, value)."""
    # Imported here: prometheus_client is ~15 ms of every command's start-up (the parser
    # imports this module), and only `top` parses expositions.
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names.CONSUMED)
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as err:  # the parser's ways of refusing a line
        raise ExpositionError(f"not Prometheus text exposition: {err}") from err
    return dict(samples)


@dataclass(frozen=True, slots=True)
class EndpointUsage:
    """What one endpoint said: its claimed-device rows, and how many devices it samples at all
    (0: usage sampling is off there, or the node has no devices)."""

    rows: list[ClaimedDevice]
    sampled_devices: int


def read_exposition(text: str, source: str = "") -> EndpointUsage:
    """The rows one endpoint's exposition holds, in no particular order (see `table.by_waste`)."""
    samples = parse_samples(text)
    sampled = {
        (labels.get("node"), labels.get("device"))
        for labels, _ in samples.get(names.DEVICE_GPU_UTILIZATION, ())
    }
    return EndpointUsage(rows_from_samples(samples, source), len(sampled))


def rows_from_samples(
    samples: Mapping[str, Iterable[tuple[Mapping[str, str], float]]], source: str = ""
) -> list[ClaimedDevice]:
    device_values: dict[str, dict[tuple[str, str], float | None]] = defaultdict(dict)
    for metric in (names.DEVICE_GPU_UTILIZATION, names.DEVICE_MEMORY_USED, names.DEVICE_MEMORY_TOTAL):
        for labels, value in samples.get(metric, ()):
            device_values[metric][(labels.get("node", ""), labels.get("device", ""))] = _number(value)

    holdings: dict[tuple[str, str, str, str], _Holding] = defaultdict(_Holding)
    for metric in (names.CLAIM_GPU_UTILIZATION, names.CLAIM_MEMORY_USED):
        for labels, value in samples.get(metric, ()):
            key = tuple(labels.get(k, "") for k in ("node", "device", "namespace", "claim"))
            if not key[1] or not key[3]:  # no device or no claim: not a claimed device's series
                continue
            holding = holdings[key]  # type: ignore[index]
            holding.uuid = holding.uuid or labels.get("uuid", "")
            holding.model = holding.model or labels.get("model", "")
            if labels.get("pod"):
                holding.pods.add(labels["pod"])
            if metric == names.CLAIM_GPU_UTILIZATION:
                holding.utilization = _add(holding.utilization, _number(value))
            else:
                holding.memory_used = _add(holding.memory_used, _number(value))

    idle_seconds: dict[tuple[str, str, str], float | None] = {}
    idle: dict[tuple[str, str, str], bool] = {}
    for labels, value in samples.get(names.CLAIM_IDLE_SECONDS, ()):
        idle_seconds[_claim_key(labels)] = _number(value)
    for labels, value in samples.get(names.CLAIM_IDLE, ()):
        idle[_claim_key(labels)] = value == 1

    rows = []
    for (node, device, namespace, claim), holding in holdings.items():
        device_key = (node, device)
        claim_key = (node, namespace, claim)
        rows.append(
            ClaimedDevice(
                node=node,
                device=device,
                namespace=namespace,
                claim=claim,
                model=holding.model,
                uuid=holding.uuid,
                pods=tuple(sorted(holding.pods)),
                utilization=_bounded(
                    holding.utilization, device_values[names.DEVICE_GPU_UTILIZATION].get(device_key)
                ),
                memory_used_bytes=_bounded(
                    holding.memory_used, device_values[names.DEVICE_MEMORY_USED].get(device_key)
                ),
                memory_total_bytes=device_values[names.DEVICE_MEMORY_TOTAL].get(device_key),
                idle_seconds=idle_seconds.get(claim_key),
                idle=idle.get(claim_key, False),
                source=source,
            )
        )
    return rows


def _claim_key(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return labels.get("node", ""), labels.get("namespace", ""), labels.get("claim", "")
