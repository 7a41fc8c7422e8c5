"""The DCGM-compatible recording rules, checked by promtool and evaluated on a real scrape.

Our usage exporter (the sampler over the fake backend, its collector, the plugin's metrics
endpoint) serves /metrics over HTTP; the scrape becomes promtool's input series with the labels
a ServiceMonitor scrape adds (`job`, `instance`, and no `namespace`/`pod`/`container` of the
plugin pod: the chart drops them), and `promtool test rules` evaluates the rules file on it.
The expected DCGM series are built from the scraped values in DCGM's units (% and MiB) and
labels (`gpu`, `UUID`, `device` = `nvidia<index>`, `modelName`, `Hostname`, and `namespace`,
`pod`, `container` of the pod using the GPU), so a wrong unit, a lost label or a held GPU
without its pod fails the evaluation. promtool comes from tests/cluster/build_promtool.sh.
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dracommon import usagenames as names
from draplugin.devices.fake import FakeBackend, parse_config
from draplugin.metrics import serve_metrics
from draplugin.usage import dcgmrules
from draplugin.usage.attribution import PodProcess
from draplugin.usage.exporter import UsageCollector
from draplugin.usage.fakesource import FakeUsageSource
from draplugin.usage.holders import Holder, PodRef
from draplugin.usage.idle import IdleTracker
from draplugin.usage.sampler import SampleMetrics, UsageSampler

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
POD = PodRef("team-a", "train-0", "uid-pod-a")
CLAIM = Holder(
    "team-a",
    "train",
    "uid-claim",
    ("gpu-0",),
    (POD,),
    containers={"cid-worker": "worker"},
    container_pods={"cid-worker": POD.uid},
)
PID = 4242
# What a Prometheus scrape of the plugin adds (the chart's ServiceMonitor drops the plugin pod's
# namespace, pod and container target labels).
TARGET = {"job": "draplugin-kubelet-plugin-metrics", "instance": "10.0.0.7:8080"}


@pytest.fixture(scope="module")
def promtool() -> Path:
    out = subprocess.run(
        [str(REPO / "tests/cluster/build_promtool.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1]) / "promtool"


class StaticHolders:
    """Stands in for draplugin.usage.holders.HolderDirectory (which reads claims and pods from the
    API server): the one prepared claim above, whose pod is known, so nothing is missing."""

    def holders(self) -> list[Holder]:
        return [CLAIM]

    def refresh_missing(self, holders: Sequence[Holder], pods: set[str], containers: set[str]) -> None:
        raise AssertionError(f"every process here belongs to a known pod: {pods} {containers}")


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Sample]]:
    """One scrape of the exporter over HTTP: two whole GPUs (gpu-0 held, gpu-1 not) and a MIG GPU."""
    tmp = tmp_path_factory.mktemp("dcgm")
    gpus = [
        {"model": "H100-80GB-HBM3", "count": 2},
        {"model": "A100-SXM4-40GB", "mig": ["3g.20gb"]},
    ]
    backend = FakeBackend(NODE, parse_config({"gpus": gpus}))
    processes = tmp / "processes.yaml"
    processes.write_text(f"gpu-0:\n  - {{pid: {PID}, smPercent: 30, memory: 2Gi}}\n")
    registry = CollectorRegistry()
    sampler = UsageSampler(
        node=NODE,
        devices=backend.discover,
        source=FakeUsageSource(backend, processes),
        holders=StaticHolders(),  # type: ignore[arg-type]
        locate={PID: PodProcess(POD.uid, "cid-worker")}.get,
        idle=IdleTracker(0.05, 1800.0, None),
        interval_s=10.0,
        metrics=SampleMetrics(registry),
    )
    registry.register(UsageCollector(lambda: sampler.latest))
    sampler.sample_once()
    endpoint = serve_metrics("127.0.0.1", 0, registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        endpoint.close()
        sampler.stop()
    yield [s for family in text_string_to_metric_families(text) for s in family.samples]


def _series(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v != "")
    return f"{name}{{{inner}}}"


def _find(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and labels.items() <= s.labels.items()]


def _dcgm_labels(device: Sample, holder: Mapping[str, str] | None) -> dict[str, str]:
    index = device.labels["device"].removeprefix("gpu-")
    labels = {
        "gpu": index,
        "UUID": device.labels["uuid"],
        "device": f"nvidia{index}",
        "modelName": device.labels["model"],
        "Hostname": NODE,
    }
    if holder is not None:
        labels.update({k: holder[k] for k in ("namespace", "pod", "container")})
    return labels


def _expected(samples: list[Sample]) -> list[dict[str, object]]:
    """DCGM's series, computed from the scraped values: per GPU, its holder's labels or none."""
    holders = {s.labels["device"]: s.labels for s in _find(samples, names.CLAIM_GPU_UTILIZATION.exposed)}
    whole = [s for s in _find(samples, names.DEVICE_MEMORY_USED.exposed) if "-mig-" not in s.labels["device"]]
    assert sorted(s.labels["device"] for s in whole) == ["gpu-0", "gpu-1"]

    def value(metric: str, device: str, **extra: str) -> float:
        (sample,) = _find(samples, metric, device=device, **extra)
        return float(sample.value)

    tests: list[dict[str, object]] = []
    conversions: dict[str, Callable[[str], float]] = {
        "DCGM_FI_DEV_GPU_UTIL": lambda d: 100 * value(names.DEVICE_GPU_UTILIZATION.exposed, d),
        "DCGM_FI_DEV_MEM_COPY_UTIL": lambda d: 100 * value(names.DEVICE_MEMORY_UTILIZATION.exposed, d),
        "DCGM_FI_DEV_FB_USED": lambda d: value(names.DEVICE_MEMORY_USED.exposed, d) / (1 << 20),
        "DCGM_FI_DEV_FB_FREE": lambda d: (
            (value(names.DEVICE_MEMORY_TOTAL.exposed, d) - value(names.DEVICE_MEMORY_USED.exposed, d))
            / (1 << 20)
        ),
        "DCGM_FI_DEV_POWER_USAGE": lambda d: value(names.DEVICE_POWER.exposed, d),
        "DCGM_FI_DEV_GPU_TEMP": lambda d: value(names.DEVICE_TEMPERATURE.exposed, d),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda d: value(
            names.DEVICE_ECC_ERRORS.exposed, d, type="corrected"
        ),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda d: value(
            names.DEVICE_ECC_ERRORS.exposed, d, type="uncorrected"
        ),
    }
    assert set(conversions) == {s.name for s in dcgmrules.SERIES}
    for dcgm, convert in conversions.items():
        exp = [
            {
                "labels": _series(dcgm, _dcgm_labels(d, holders.get(d.labels["device"]))),
                "value": convert(d.labels["device"]),
            }
            for d in sorted(whole, key=lambda s: s.labels["device"])
        ]
        tests.append({"expr": dcgm, "eval_time": "1m", "exp_samples": exp})
    return tests


def test_the_rules_files_are_generated_from_the_code() -> None:
    assert dcgmrules.main(["--check"]) == 0, "run python -m draplugin.usage.dcgmrules"


def test_promtool_accepts_the_rules_file(promtool: Path) -> None:
    out = subprocess.run([promtool, "check", "rules", dcgmrules.RULES_PATH], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(dcgmrules.SERIES) + 1} rules found" in out.stdout


def test_the_scrape_is_what_the_rules_expect(scrape: list[Sample]) -> None:
    """The facts the rules rest on, from our exporter itself: the held GPU's pod and container,
    gpu-0's 30% SM and 2 GiB from its process, MIG devices without utilization."""
    (holder,) = _find(scrape, names.CLAIM_GPU_UTILIZATION.exposed)
    assert {k: holder.labels[k] for k in ("device", "namespace", "pod", "container")} == {
        "device": "gpu-0",
        "namespace": "team-a",
        "pod": "train-0",
        "container": "worker",
    }
    assert _find(scrape, names.DEVICE_GPU_UTILIZATION.exposed, device="gpu-0")[0].value == pytest.approx(0.3)
    assert _find(scrape, names.DEVICE_MEMORY_USED.exposed, device="gpu-0")[0].value == 2 << 30
    mig = [s for s in _find(scrape, names.DEVICE_MEMORY_USED.exposed) if "-mig-" in s.labels["device"]]
    assert mig and not [
        s for s in _find(scrape, names.DEVICE_GPU_UTILIZATION.exposed) if "-mig-" in s.labels["device"]
    ]


def test_the_rules_give_dcgm_names_units_and_labels_on_a_scrape_of_our_exporter(
    promtool: Path, scrape: list[Sample], tmp_path: Path
) -> None:
    series = [
        {"series": _series(s.name, {**s.labels, **TARGET}), "values": f"{float(s.value)!r}x2"} for s in scrape
    ]
    tests = _expected(scrape)
    # Units on known inputs, not only derived ones: gpu-0's process uses 30% SM and 2 GiB.
    by_expr = {t["expr"]: t["exp_samples"] for t in tests}
    held = [s for s in by_expr["DCGM_FI_DEV_FB_USED"] if 'pod="train-0"' in s["labels"]]  # type: ignore[attr-defined]
    assert [s["value"] for s in held] == [2048.0]
    util = [s for s in by_expr["DCGM_FI_DEV_GPU_UTIL"] if 'gpu="0"' in s["labels"]]  # type: ignore[attr-defined]
    assert [s["value"] for s in util] == [pytest.approx(30.0)]
    spec = {
        "rule_files": [str(dcgmrules.RULES_PATH)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    test_file = tmp_path / "dcgm-test.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", test_file], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
