"""Every examples/NN-*/ simulated offline on the examples' fake node gives the outcome its README states.

Inputs are what a user passes to `dra-controller simulate --objects`: the
DeviceClasses, the ResourceSlices published for `examples/fake-gpus.yaml`, and
the example's manifests (pods referencing ResourceClaimTemplates or standalone
claims). What happens after allocation (CDI devices, environment, prepare-time
errors) is checked by tests/e2e/test_examples.py; where a README states such an
outcome, the test asserts the part that allocation decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli import main
from controller.objects import load_manifests
from controller.options import build_allocator, cluster_nodes
from controller.simulate.command import ClaimResult, simulate
from dracommon.drivername import DEFAULT_DRIVER_NAME, config_api_version
from draplugin.devices import load_backend
from draplugin.devices.shared import SharedGpus
from draplugin.prepare.claimconfig import validate_opaque_config
from draplugin.prepare.gpuconfig import ConfigError
from draplugin.slices.render import NodeRef, render_pool

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = [EXAMPLES / "deviceclasses.yaml", EXAMPLES / "resourceslices" / "fake-node.yaml"]
NODE = "gpu-node-1"
WHOLE_GPUS = {"gpu-0", "gpu-1", "gpu-2"}  # gpu-3 is split into MIG devices


def run(*examples: str | Path) -> list[ClaimResult]:
    paths = [p if isinstance(p, Path) else EXAMPLES / p for p in examples]
    objects = load_manifests([*BASE, *paths])
    allocator = build_allocator(objects)
    return simulate(objects, allocator, cluster_nodes(objects, allocator))


def devices(result: ClaimResult) -> list[str]:
    return [r["device"] for r in result.results]


def only(results: list[ClaimResult]) -> ClaimResult:
    assert len(results) == 1, [r.to_json() for r in results]
    return results[0]


def opaque_parameters(result: ClaimResult) -> dict[str, Any]:
    assert result.allocation is not None
    [config] = result.allocation["devices"]["config"]
    parameters: dict[str, Any] = config["opaque"]["parameters"]
    return parameters


def test_every_example_is_covered() -> None:
    tested = {name.split("_")[2] for name in globals() if name.startswith("test_example_")}
    folders = {p.name[:2] for p in EXAMPLES.glob("[0-9][0-9]-*") if p.is_dir()}
    assert folders and folders <= tested, f"examples without an offline test: {sorted(folders - tested)}"


def test_example_01_one_gpu_for_the_pods_generated_claim() -> None:
    result = only(run("01-single-gpu"))
    assert (result.namespace, result.name, result.pod) == ("default", "single-gpu-gpu", "single-gpu")
    assert result.template == "single-gpu"
    assert result.allocated and result.node_name == NODE
    assert len(devices(result)) == 1 and set(devices(result)) <= WHOLE_GPUS


def test_example_02_two_containers_one_claim_one_gpu() -> None:
    result = only(run("02-shared-claim-two-containers"))
    assert result.allocated and result.pod == "two-containers"
    assert len(devices(result)) == 1


def test_example_03_preallocated_claim_is_allocated_before_and_for_both_pods() -> None:
    # README: the controller allocates team-gpu before any pod; both pods then use that claim.
    # Offline, simulate shows the pre-allocation (no pod) and no further claim for the pods; that
    # both pods land on the claim's node and in status.reservedFor is the scheduler's and
    # kube-controller-manager's work, which tests/e2e/test_examples.py checks on a real cluster.
    result = only(run("03-preallocated-shared-claim"))
    assert (result.name, result.pod, result.allocated) == ("team-gpu", None, True)
    assert result.node_name == NODE and len(devices(result)) == 1


def test_example_03_without_the_annotation_the_first_pod_allocates_the_claim(tmp_path: Path) -> None:
    docs = list(
        yaml.safe_load_all((EXAMPLES / "03-preallocated-shared-claim" / "shared-claim.yaml").read_text())
    )
    del docs[0]["metadata"]["annotations"]
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump_all(docs))
    result = only(run(tmp_path))
    assert (result.name, result.pod, result.allocated) == ("team-gpu", "notebook", True)


def test_example_04_by_model_and_by_memory() -> None:
    by_model, by_memory = run("04-select-by-model-and-memory")
    assert by_model.pod == "a100-pod" and by_model.allocated
    assert devices(by_model)[0] in {"gpu-1", "gpu-2"}
    assert by_memory.pod == "big-memory-pod" and devices(by_memory) == ["gpu-0"]


def test_example_04_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(p) for p in (*BASE, EXAMPLES / "04-select-by-model-and-memory")]
    assert main(["simulate", "--objects", *args, "-o", "json"]) == 0
    claims = json.loads(capsys.readouterr().out)["claims"]
    assert [(c["name"], c["pod"], c["allocated"], c["nodeName"]) for c in claims] == [
        ("a100-pod-gpu", "a100-pod", True, NODE),
        ("big-memory-pod-gpu", "big-memory-pod", True, NODE),
    ]
    assert set(claims[0]) == {"namespace", "name", "allocated", "results", "nodeName", "reason", "pod"}
    assert set(claims[0]["results"][0]) == {"request", "driver", "pool", "device"}


def test_example_05_the_pair_on_one_pcie_root() -> None:
    result = only(run("05-same-pcie-root"))
    assert result.allocated and sorted(devices(result)) == ["gpu-0", "gpu-1"]


def test_example_05_pending_when_one_of_the_pair_is_taken() -> None:
    taken, pair = run("01-single-gpu", "05-same-pcie-root")
    assert devices(taken) == ["gpu-0"]
    assert not pair.allocated
    assert "matchAttribute resource.kubernetes.io/pcieRoot" in (pair.reason or "")


def test_example_06_h100_when_free() -> None:
    result = only(run("06-first-available-fallback"))
    assert [(r["request"], r["device"]) for r in result.results] == [("gpu/h100", "gpu-0")]


def test_example_06_two_a100_when_the_h100_is_taken() -> None:
    taken, fallback = run("01-single-gpu", "06-first-available-fallback")
    assert devices(taken) == ["gpu-0"]
    assert {r["request"] for r in fallback.results} == {"gpu/two-a100"}
    assert sorted(devices(fallback)) == ["gpu-1", "gpu-2"]


def test_example_07_every_whole_gpu() -> None:
    result = only(run("07-all-gpus-on-node"))
    assert sorted(devices(result)) == sorted(WHOLE_GPUS)


def test_example_08_one_mig_device_of_the_profile() -> None:
    result = only(run("08-mig-device"))
    assert devices(result)[0] in {"gpu-3-mig-1g10gb-0", "gpu-3-mig-1g10gb-1"}


def test_example_09_time_slicing_config_travels_with_the_allocation() -> None:
    result = only(run("09-time-slicing"))
    assert len(devices(result)) == 1
    sharing = opaque_parameters(result)["sharing"]
    assert sharing == {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}


def test_example_10_mps_config_travels_with_the_allocation() -> None:
    result = only(run("10-mps"))
    assert len(devices(result)) == 1
    assert opaque_parameters(result)["sharing"]["strategy"] == "MPS"


def test_example_11_admin_access_gets_every_gpu_even_while_in_use() -> None:
    # The namespace label is checked by the API server at admission, not by allocation; offline
    # manifests without a namespace land in "default" and allocate there.
    workload, monitor = run("07-all-gpus-on-node", "11-admin-access-monitoring")
    assert sorted(devices(workload)) == sorted(WHOLE_GPUS)
    assert monitor.allocated and sorted(devices(monitor)) == sorted(WHOLE_GPUS)
    assert monitor.allocation is not None
    assert all(r.get("adminAccess") is True for r in monitor.allocation["devices"]["results"])


def test_example_12_bad_config_allocates_and_fails_at_prepare() -> None:
    result = only(run("12-bad-opaque-config"))
    assert result.allocated and len(devices(result)) == 1
    # The error the README shows comes from the plugin's validation at prepare time.
    with pytest.raises(ConfigError, match="must be one of Exclusive, TimeSlicing, MPS, got 'TimeSlice'"):
        validate_opaque_config(
            opaque_parameters(result),
            "spec.devices.config[0].opaque.parameters",
            api_version=config_api_version(DEFAULT_DRIVER_NAME),
        )


def shared_gpu_slices(tmp_path: Path) -> Path:
    """What the plugin publishes for the examples' inventory with `--shared-gpus memory`."""
    backend = load_backend(
        "fake", NODE, config_file=str(EXAMPLES / "fake-gpus.yaml"), shared_gpus=SharedGpus.MEMORY
    )
    slices = render_pool(
        backend.discover(), backend.shared_counters(), node=NodeRef(NODE, None), driver=DEFAULT_DRIVER_NAME
    )
    path = tmp_path / "fake-node-shared-gpus.yaml"
    path.write_text(yaml.safe_dump_all(slices))
    return path


def test_example_13_two_claims_share_the_h100_each_consuming_its_memory(tmp_path: Path) -> None:
    slices = shared_gpu_slices(tmp_path)
    objects = load_manifests([EXAMPLES / "deviceclasses.yaml", slices, EXAMPLES / "13-shared-gpu"])
    allocator = build_allocator(objects)
    small, large = simulate(objects, allocator, cluster_nodes(objects, allocator))
    consumed = {}
    for result in (small, large):
        assert result.allocated and devices(result) == ["gpu-0"], result.to_json()
        assert result.allocation is not None
        (allocated,) = result.allocation["devices"]["results"]
        consumed[result.pod] = allocated["consumedCapacity"]["memory"]
        assert allocated["shareID"]
    assert consumed == {"small-inference": "10Gi", "large-inference": "30Gi"}


def test_example_13_on_unshared_gpus_the_second_claim_waits_for_the_h100() -> None:
    # Without --shared-gpus (or with the feature gate off) each claim takes the whole GPU.
    small, large = run("13-shared-gpu")
    assert small.allocated and devices(small) == ["gpu-0"]
    assert not large.allocated


def test_example_14_shared_claim_and_template_claim_each_get_a_gpu() -> None:
    # README: reader-a and reader-b share shared-gpu (the first pod allocates it), template-reader
    # gets its own. What the containers read from their metadata files is tests/e2e's to check.
    shared, template = run("14-device-metadata")
    assert (shared.name, shared.pod, shared.allocated) == ("shared-gpu", "reader-a", True)
    assert (template.pod, template.template, template.allocated) == ("template-reader", "one-gpu", True)
    assert len(devices(shared)) == len(devices(template)) == 1
    assert set(devices(shared) + devices(template)) <= WHOLE_GPUS and devices(shared) != devices(template)
